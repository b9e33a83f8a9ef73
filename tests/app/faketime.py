"""Driving a threaded worker on a ``FakeClock``: its heartbeats, renewals, rescues, back-offs and
shutdown grace wait on the clock, so the test moves time instead of sleeping.

Waits that are not on the clock stay real: the database's own waits (``wait_for_jobs``) and a
job's work. A test waits for those on events (``started``), never on the clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.testing import FakeClock
from ultimat3.jobs.worker import Worker

#: The worker's loops that wait on its clock between steps: heartbeat, renew and maintenance.
LOOPS = 3


def start(worker: Worker, clock: FakeClock) -> Worker:
    """Start ``worker`` and wait until its loops are parked on the clock: from then on
    ``advance_until`` moves time only while each of them is parked, never while one is busy."""
    worker.start()
    clock.wait_for_sleepers(LOOPS)
    return worker


def pass_time(clock: FakeClock, span: DurationInput, step: DurationInput = "50ms") -> None:
    """Let ``span`` of fake time pass in steps of ``step``, each taken once the worker's loops
    are parked on the clock again (``FakeClock.advance_until``)."""
    end = clock.monotonic() + to_timedelta(span).total_seconds()
    clock.advance_until(
        lambda: clock.monotonic() >= end, step, limit=to_timedelta(span) + to_timedelta(step)
    )


def stop(
    worker: Worker,
    clock: FakeClock,
    grace: DurationInput | None = None,
    *,
    step: DurationInput = "50ms",
) -> None:
    """Stop ``worker`` (``Worker.stop``), moving fake time while it drains: its grace and the
    joins of its loops are on the clock. Fails if it takes more than its grace and a minute."""
    grace_s = None if grace is None else to_timedelta(grace).total_seconds()
    stopper = threading.Thread(target=worker.stop, args=(grace_s,), daemon=True)
    stopper.start()
    limit = timedelta(seconds=grace_s or worker.config.shutdown_grace.total_seconds())
    clock.advance_until(
        lambda: not stopper.is_alive(), step, limit=limit + timedelta(minutes=1), sleepers=0
    )
    stopper.join()


@contextmanager
def running(worker: Worker, clock: FakeClock) -> Iterator[Worker]:
    """``with worker:`` for a worker on a fake clock: ``start``, then ``stop``."""
    start(worker, clock)
    try:
        yield worker
    finally:
        stop(worker, clock)
