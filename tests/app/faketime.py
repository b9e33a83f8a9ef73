"""Driving a threaded worker on a ``FakeClock``: its heartbeats, renewals, rescues, back-offs and
shutdown grace wait on the clock, so the test moves time instead of sleeping.

Waits that are not on the clock stay real: the database's own waits (``wait_for_jobs``) and a
job's work. A test waits for those on events (``started``), never on the clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ultimat3.jobs import events
from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.testing import FakeClock
from ultimat3.jobs.worker import Worker

#: The worker's loops that keep and take leases, by thread name: each waits on its clock
#: between steps. (The cycle loop does too while no handler is free; otherwise it waits for
#: jobs on the database, in real time.)
LOOPS = frozenset({"ultimat3-jobs-heartbeat", "ultimat3-jobs-renew", "ultimat3-jobs-maintenance"})
#: How long (real seconds) ``pass_time`` waits for a loop busy with the database.
SETTLE = 15.0


def start(worker: Worker, clock: FakeClock) -> Worker:
    """Start ``worker`` and wait until its loops are parked on the clock: from then on
    ``advance_until`` moves time only while each of them is parked, never while one is busy.
    By name, not by count: a count was met by three of the four loops that sleep on the
    clock, and time could then run ahead of a renew loop not started yet, so the lease of a
    running job ran out (its rescue is what the tests check never happens)."""
    worker.start()
    parked(clock)
    return worker


def parked(clock: FakeClock, timeout: float = 10.0) -> None:
    """Wait, up to ``timeout`` real seconds, until every loop of ``LOOPS`` sleeps on ``clock``
    (``FakeClock.wait_for_sleeping``: woken as each starts to sleep, no polling)."""
    clock.wait_for_sleeping(LOOPS, timeout)


def pass_time(
    clock: FakeClock,
    span: DurationInput,
    step: DurationInput = "50ms",
    blocked: frozenset[str] = frozenset(),
) -> None:
    """Let ``span`` of fake time pass in steps of ``step``, each taken once the worker's loops
    are parked on the clock again (``FakeClock.advance_until``). A loop away from the clock
    is writing to the database (a renewal, a turn), which on a loaded machine (three test
    processes on two cores, each with its own PostgreSQL) has taken over a second: it is
    waited for up to ``SETTLE`` real seconds before time moves on without it. The loops named
    in ``blocked`` are not waited for: the test blocks them (on a pool it holds, say)."""
    end = clock.monotonic() + to_timedelta(span).total_seconds()
    clock.advance_until(
        lambda: clock.monotonic() >= end,
        step,
        limit=to_timedelta(span) + to_timedelta(step),
        settle=SETTLE,
        blocked=blocked,
    )


def stopping(worker: Worker, grace: DurationInput | None = None) -> threading.Thread:
    """Begin ``worker.stop(grace)`` on a thread of its own; ``join`` it to move time meanwhile."""
    grace_s = None if grace is None else to_timedelta(grace).total_seconds()
    stopper = threading.Thread(target=worker.stop, args=(grace_s,), daemon=True)
    stopper.start()
    return stopper


def join(stopper: threading.Thread, clock: FakeClock, step: DurationInput = "50ms") -> None:
    """Wait for a worker's stop (``stopping``), moving fake time: by ``step`` after each
    ``step`` of real time the stop has not ended in, about as fast as real time. The stop also
    waits, with timeouts on the clock, for threads doing real work (the event loop's exit, the
    loops' joins), which a faster clock would cut short. Fails after ten minutes of fake time."""
    slice_ = to_timedelta(step)
    end = clock.monotonic() + 600
    while True:
        stopper.join(slice_.total_seconds())
        if not stopper.is_alive():
            return
        assert clock.monotonic() < end, "the worker did not stop"
        clock.advance(slice_)


def stop(worker: Worker, clock: FakeClock, grace: DurationInput | None = None) -> None:
    """Stop ``worker`` (``Worker.stop``), moving fake time while it drains (``join``)."""
    join(stopping(worker, grace), clock)


@contextmanager
def running(worker: Worker, clock: FakeClock) -> Iterator[Worker]:
    """``with worker:`` for a worker on a fake clock: ``start``, then ``stop``."""
    start(worker, clock)
    try:
        yield worker
    finally:
        stop(worker, clock)


@contextmanager
def seen(name: str) -> Iterator[threading.Event]:
    """An event set once ``name`` (a library event, such as ``jobs.job.completed``) is emitted:
    how a test waits for real work (a job, a write) without polling or moving time."""
    emitted = threading.Event()
    with events.subscribe(lambda event: emitted.set(), names=[name]):
        yield emitted
