"""The worker: retries, dead-letter, snooze, cancel, timeouts, leases, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from ultimat3.jobs import App, Cancel, JobContext, JobState, Retry, Snooze, events, job
from ultimat3.jobs.records import ClaimParams, Cycle
from ultimat3.jobs.testing import FakeClock, drain

from . import faketime
from .processes import wait_until

calls: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


@job
def record(input: dict[str, Any]) -> None:
    calls.append(input)


@job
async def record_async(input: dict[str, Any]) -> None:
    await asyncio.sleep(0)
    calls.append(input)


@job(retry=Retry(attempts=3, delay="10s", jitter=False))
def always_fails(input: dict[str, Any]) -> None:
    raise ValueError(f"bad input {input}")


@job(retry=Retry(attempts=2, delay="1s", jitter=False, dead_letter=False))
def dropped_when_exhausted(input: dict[str, Any]) -> None:
    raise ValueError("nope")


@job
def snoozes(input: dict[str, Any], ctx: JobContext) -> None:
    calls.append(ctx.attempt)
    if len(calls) == 1:
        raise Snooze("30s")


@job
def cancels(input: dict[str, Any]) -> None:
    raise Cancel("customer closed the account")


@dataclass
class Order:
    id: int
    total: float


@job
def typed(order: Order) -> None:
    calls.append(order)


@pytest.fixture
def app(url: str, clock: FakeClock, make_module: Any) -> App:
    module = make_module(
        record=record,
        record_async=record_async,
        always_fails=always_fails,
        dropped_when_exhausted=dropped_when_exhausted,
        snoozes=snoozes,
        cancels=cancels,
        typed=typed,
    )
    created = App(url, modules=[module], clock=clock)
    yield created
    created.close()


def test_drain_runs_sync_and_async_jobs(app: App) -> None:
    record.enqueue({"n": 1})
    record_async.enqueue({"n": 2})
    stats = drain(app)
    assert stats.completed == 2
    assert sorted(c["n"] for c in calls) == [1, 2]
    assert app.count_jobs(state="completed") == 2


def test_retries_follow_the_policy_then_park_the_job(app: App, clock: FakeClock) -> None:
    result = always_fails.enqueue({"x": 1})
    drain(app)
    first = app.get_job(result.id)
    assert first.state is JobState.SCHEDULED and first.attempt == 1
    assert first.run_at == clock.now() + timedelta(seconds=10)
    assert drain(app).claimed == 0  # not due yet
    clock.advance("10s")
    drain(app)
    second = app.get_job(result.id)
    assert second.attempt == 2 and second.run_at == clock.now() + timedelta(seconds=20)
    clock.advance("20s")
    drain(app)
    dead = app.get_job(result.id)
    assert dead.state is JobState.DEAD and dead.attempt == 3
    assert [e.attempt for e in dead.errors] == [1, 2, 3]
    assert all(e.kind == "ValueError" and "bad input" in e.message for e in dead.errors)
    assert "Traceback" in dead.errors[0].traceback
    # Retried through the API: one more attempt, history kept.
    assert app.retry_jobs([result.id]) == [result.id]
    again = app.get_job(result.id)
    assert again.state is JobState.AVAILABLE and again.max_attempts == 4
    drain(app)
    assert len(app.get_job(result.id).errors) == 4


def test_dead_letter_false_drops_the_exhausted_job(app: App, clock: FakeClock) -> None:
    result = dropped_when_exhausted.enqueue({})
    drain(app)
    clock.advance("1s")
    drain(app)
    assert app.driver.job_get(result.id) is None


def test_snooze_does_not_consume_an_attempt(app: App, clock: FakeClock) -> None:
    result = snoozes.enqueue({})
    drain(app)
    snoozed = app.get_job(result.id)
    assert snoozed.state is JobState.SCHEDULED and snoozed.attempt == 0
    clock.advance("30s")
    drain(app)
    assert calls == [1, 1]
    assert app.get_job(result.id).state is JobState.COMPLETED


def test_cancel_from_the_handler(app: App) -> None:
    result = cancels.enqueue({})
    drain(app)
    got = app.get_job(result.id)
    assert got.state is JobState.CANCELLED
    assert got.cancel_reason == "customer closed the account"


def test_typed_input_arrives_as_its_type(app: App) -> None:
    typed.enqueue(Order(id=3, total=9.5))
    drain(app)
    assert calls == [Order(id=3, total=9.5)]


def test_an_unknown_job_name_waits_for_a_worker_that_knows_it_then_ends_dead(
    app: App, clock: FakeClock
) -> None:
    """A worker that lacks the name gives the job back without charging an attempt and passes
    over it; once it has waited ``unknown_grace`` since it became due, it is dead-lettered."""
    from ultimat3.jobs.ids import uuid7
    from ultimat3.jobs.records import NewJob

    job_id = uuid7()
    app.driver.job_insert_many(
        [NewJob(job_id, "renamed_long_ago", "default", "{}", job_id, max_attempts=2)],
        now=app.clock.pinned(),
    )
    due = app.get_job(job_id).run_at
    worker = app.worker(unknown_grace="10m")
    stats = worker.drain()
    assert stats.claimed == 1, "claimed once, then passed over"
    found = app.get_job(job_id)
    assert (found.state, found.attempt, found.errors, found.run_at) == (
        JobState.AVAILABLE,
        0,
        (),
        due,
    )
    assert worker.drain().claimed == 1, "no second claim: this worker skips the name a while"
    clock.advance("61s")
    assert worker.drain().claimed == 2, "a minute later it looks again"
    assert (app.get_job(job_id).attempt, app.get_job(job_id).errors) == (0, ())
    clock.advance("9m")
    worker.drain()
    dead = app.get_job(job_id)
    assert (dead.state, dead.attempt) == (JobState.DEAD, 1)
    assert [e.kind for e in dead.errors] == ["unknown_job"]
    assert "no worker that knows it claimed it within 10m" in dead.errors[0].message


def test_corrupt_payload_is_parked_without_retry(app: App) -> None:
    from ultimat3.jobs.ids import uuid7
    from ultimat3.jobs.records import NewJob

    app.driver.job_insert_many(
        [
            NewJob(
                id=uuid7(),
                name="typed",
                queue="default",
                input='{"id": "x"}',
                idempotency_key=uuid7(),
                max_attempts=5,
            )
        ],
        now=app.clock.pinned(),
    )
    drain(app)
    (found,) = app.list_jobs(name="typed")
    assert found.state is JobState.DEAD and found.attempt == 1
    assert found.errors[0].kind == "DeserializationError"


def test_threaded_worker_runs_many_jobs(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(record=record, record_async=record_async))
    app.enqueue_many(record, [{"n": i} for i in range(150)])
    app.enqueue_many(record_async, [{"n": i} for i in range(150, 200)])
    completed: list[object] = []
    all_done = threading.Event()

    def on_completed(event: object) -> None:
        completed.append(event)
        if len(completed) == 200:
            all_done.set()

    with (
        events.subscribe(on_completed, names=["jobs.job.completed"]),
        app.worker(concurrency=8, poll_interval="50ms") as worker,
    ):
        assert all_done.wait(20), f"{len(completed)} of 200 jobs completed in 20 s"
    assert app.count_jobs(state="completed") == 200
    assert sorted(c["n"] for c in calls) == list(range(200))
    assert worker.stats.completed == 200


def test_worker_picks_up_jobs_enqueued_while_idle(
    make_app: Callable[..., App], make_module: Any
) -> None:
    app = make_app(make_module(record=record))
    with (
        app.worker(concurrency=2, poll_interval="5s") as worker,
        faketime.seen("jobs.job.completed") as ran,
    ):
        # The worker is idle: its cycle loop waits on the database's wake-ups (a 5 s poll).
        wait_until(lambda: worker._cycle_waiting, 10, "the cycle loop to wait for jobs")
        started = time.monotonic()
        record.enqueue({"n": 1})
        ran.wait(4)
        latency = time.monotonic() - started
    assert calls == [{"n": 1}]
    assert latency < 1.0, f"the wake-up hint did not fire (took {latency:.2f}s, poll is 5s)"


release = threading.Event()


@job(timeout="30s", retry=Retry(attempts=2, delay="0s", jitter=False))
def slow_sync(input: dict[str, Any], ctx: JobContext) -> None:
    while not ctx.cancelled and not release.is_set():
        release.wait(0.01)  # its work, in real time: it watches for its cancellation
    calls.append(("saw-cancel", ctx.cancelled))


@job(timeout="30s", retry=Retry(attempts=1))
async def slow_async(input: dict[str, Any]) -> None:
    await asyncio.sleep(3600)  # real time: only its cancellation ends it


@job(timeout="30s", retry=Retry(attempts=1))
async def swallows_cancel(input: dict[str, Any]) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        calls.append("swallowed")  # and returns as if done: still a timeout


class _Count:
    """How many times a library event was emitted, waited for on a condition (no polling)."""

    def __init__(self) -> None:
        self.seen = 0
        self._cond = threading.Condition()

    def __call__(self, event: object) -> None:
        with self._cond:
            self.seen += 1
            self._cond.notify_all()

    def reach(self, n: int, timeout: float = 10.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.seen >= n, timeout), (self.seen, n)


def test_timeouts_fail_the_attempt(
    make_app: Callable[..., App], make_module: Any, clock: FakeClock
) -> None:
    """Sync and async timeouts are both on the worker's clock (the heartbeat's): 30 s of fake
    time end them, while their work (an hour for the async ones) is in real time. An async job
    is cancelled at its await point; one that swallows the cancellation still timed out."""
    release.clear()
    module = make_module(slow_sync=slow_sync, slow_async=slow_async, swallows=swallows_cancel)
    app = make_app(module, clock=clock)
    sync_job = slow_sync.enqueue({})
    async_job = slow_async.enqueue({})
    swallowing = swallows_cancel.enqueue({})
    started, dead = _Count(), _Count()
    try:
        with (
            events.subscribe(started, names=["jobs.job.started"]),
            events.subscribe(dead, names=["jobs.job.dead"]),
            faketime.running(app.worker(concurrency=4, poll_interval="50ms"), clock),
        ):
            started.reach(3)
            faketime.pass_time(clock, "30s")
            dead.reach(2)  # the async jobs, written in real time; the sync one's retry:
            started.reach(4)
            faketime.pass_time(clock, "30s")
            dead.reach(3)
    finally:
        release.set()
    assert [e.kind for e in app.get_job(async_job.id).errors] == ["timeout"]
    assert [e.kind for e in app.get_job(swallowing.id).errors] == ["timeout"]
    assert [e.kind for e in app.get_job(sync_job.id).errors] == ["timeout", "timeout"]
    assert ("saw-cancel", True) in calls and "swallowed" in calls


def test_an_async_job_cancelled_at_its_timeout_is_not_stuck(
    make_app: Callable[..., App], make_module: Any, clock: FakeClock
) -> None:
    """A sync job past its timeout holds its slot (its thread runs on): stuck. An async one is
    cancelled and returns: its slot is free at once, and ``jobs.worker.stuck`` is not logged."""
    app = make_app(make_module(slow_async=slow_async), clock=clock)
    made = slow_async.enqueue({}).id
    started, dead, stuck = _Count(), _Count(), _Count()
    with (
        events.subscribe(started, names=["jobs.job.started"]),
        events.subscribe(dead, names=["jobs.job.dead"]),
        events.subscribe(stuck, names=["jobs.worker.stuck"]),
        faketime.running(app.worker(concurrency=1, poll_interval="50ms"), clock),
    ):
        started.reach(1)
        faketime.pass_time(clock, "30s")
        dead.reach(1)  # written after the beat that timed it out, which checks for stuck slots
    assert [e.kind for e in app.get_job(made).errors] == ["timeout"]
    assert stuck.seen == 0


gate = threading.Event()
started = threading.Event()
finished = threading.Event()


@job
def waits_for_gate(input: dict[str, Any]) -> None:
    started.set()
    # Longer than ``faketime.SETTLE`` waits for a busy loop: a job that gave up on its own
    # while the test still moved time would end a test about time as one about the gate.
    gate.wait(60)
    calls.append(input)
    finished.set()


@pytest.fixture
def gated(make_app: Callable[..., App], make_module: Any, clock: FakeClock) -> Iterator[App]:
    """An app on the fake clock with the gated job: its worker's heartbeats, renewals, rescues
    and shutdown grace wait for the test to move time (``faketime``). The gate opens at the
    end, whatever the test did, so no job waits on it past its test."""
    for event in (gate, started, finished):
        event.clear()
    yield make_app(make_module(waits_for_gate=waits_for_gate), clock=clock)
    gate.set()


def test_graceful_stop_finishes_or_releases(gated: App, clock: FakeClock) -> None:
    first = waits_for_gate.enqueue({"n": 1})
    worker = faketime.start(gated.worker(concurrency=1, poll_interval="50ms"), clock)
    assert started.wait(10)
    second = waits_for_gate.enqueue({"n": 2})
    # Grace shorter than the job: it is released without consuming its attempt.
    faketime.stop(worker, clock, grace="200ms")
    released = gated.get_job(first.id)
    assert released.state is JobState.AVAILABLE and released.attempt == 0
    assert gated.get_job(second.id).state is JobState.AVAILABLE  # never claimed after the stop
    gate.set()
    assert finished.wait(10)
    # The handler finished after its release: its completion is fenced out.
    assert gated.get_job(first.id).state is JobState.AVAILABLE


def test_graceful_stop_waits_for_short_jobs(gated: App, clock: FakeClock) -> None:
    first = waits_for_gate.enqueue({"n": 1})
    worker = faketime.start(gated.worker(concurrency=1, poll_interval="50ms"), clock)
    assert started.wait(10)
    stopper = faketime.stopping(worker, grace="5s")
    faketime.pass_time(clock, "4s")  # within the grace: the stop waits for the job
    assert stopper.is_alive()
    assert gated.get_job(first.id).state is JobState.RUNNING
    done = threading.Event()
    with events.subscribe(lambda event: done.set(), names=["jobs.job.completed"]):
        gate.set()
        assert done.wait(10)  # written by the stop's drain, in real time: the clock stays
    faketime.join(stopper, clock)
    assert gated.get_job(first.id).state is JobState.COMPLETED


def test_a_lost_lease_cancels_the_run_and_fences_its_write(gated: App, clock: FakeClock) -> None:
    result = waits_for_gate.enqueue({"n": 1})
    worker = gated.worker(concurrency=1, poll_interval="50ms", lease="1s", heartbeat="100ms")
    with faketime.running(worker, clock):
        assert started.wait(10)
        assert gated.cancel_job(result.id)
        # A heartbeat's renewal finds the lease gone: the run is told to stop.
        clock.advance_until(lambda: worker.stats.lost == 1, "100ms", limit="1s")
        gate.set()
        assert finished.wait(10)
    got = gated.get_job(result.id)
    assert got.state is JobState.CANCELLED


def test_heartbeats_keep_a_long_job_from_being_rescued(gated: App, clock: FakeClock) -> None:
    done = threading.Event()
    result = waits_for_gate.enqueue({"n": 1})
    worker = gated.worker(
        concurrency=1,
        poll_interval="50ms",
        lease="500ms",
        heartbeat="100ms",
        rescue_interval="100ms",
    )
    with faketime.running(worker, clock):
        assert started.wait(10)
        faketime.pass_time(clock, "1500ms")  # three leases long
        assert gated.get_job(result.id).attempt == 1
        assert (worker.stats.lost, worker.stats.rescued) == (0, 0)
        with events.subscribe(lambda event: done.set(), names=["jobs.job.completed"]):
            gate.set()
            # The completion's write waits on the database, not on the clock: time stays.
            assert done.wait(10)
    got = gated.get_job(result.id)
    assert got.state is JobState.COMPLETED and got.attempt == 1 and not got.errors


def test_expired_leases_are_rescued_and_the_attempt_counts_only_when_the_job_ran_alone(
    app: App, clock: FakeClock
) -> None:
    """A crash beside other jobs isolates the job and gives its attempt back; a crash while it
    ran alone (isolated) counts, so only a job that kills its worker alone ends dead."""
    result = record.enqueue({"n": 1})

    def params(isolated: bool) -> ClaimParams:
        return ClaimParams(
            queues=("default",),
            limit=1,
            lease_for=timedelta(seconds=30),
            worker_id="gone",
            now=clock.now(),
            isolated=isolated,
        )

    worker = app.worker()  # running before: a fresh one trusts no expiry for a lease
    # Claimed as a worker claims, for a free handler: marked started.
    [claimed] = app.driver.job_cycle(Cycle(claim=params(False)), now=clock.now()).claimed
    assert claimed.id == result.id
    clock.advance("31s")
    assert worker.maintenance.rescue() == [result.id]
    rescued = app.get_job(result.id)
    assert rescued.attempt == 0 and rescued.errors[0].kind == "worker_lost"
    assert rescued.state is JobState.AVAILABLE  # due at once, to run alone
    [alone] = app.driver.job_cycle(Cycle(claim=params(True)), now=clock.now()).claimed
    assert (alone.id, alone.attempt) == (result.id, 1)
    clock.advance("31s")
    assert worker.maintenance.rescue() == [result.id]
    rescued = app.get_job(result.id)
    assert rescued.attempt == 1 and [e.kind for e in rescued.errors] == ["worker_lost"] * 2
    assert rescued.state is JobState.SCHEDULED  # after the policy's backoff, like any failure
    clock.advance("1s")
    drain(app)
    assert app.get_job(result.id).state is JobState.COMPLETED
    assert app.get_job(result.id).attempt == 2


def test_a_worker_that_does_not_lead_maintenance_rescues_too(app: App, clock: FakeClock) -> None:
    """Rescue follows the lease, not the leadership: a frozen leader still holds it for its
    time to live, so every worker rescues (fenced: two racing change the job once)."""
    leader, standby = app.worker(lease="3s"), app.worker(lease="3s")
    assert leader.maintenance.leader_ttl == timedelta(seconds=3), "the leadership lasts a lease"
    leader.maintenance.tick(rescue_every=60, prune_every=60)
    assert leader.maintenance.leading
    record.enqueue({"n": 1})
    params = ClaimParams(("default",), 1, timedelta(seconds=3), worker_id="gone", now=clock.now())
    [claimed] = app.driver.job_cycle(Cycle(claim=params), now=clock.now()).claimed
    clock.advance("2s")
    leader.maintenance.tick(rescue_every=60, prune_every=60)  # renewed; its rescue not due
    clock.advance("2s")
    assert standby.maintenance.tick(rescue_every=60, prune_every=60) == 1
    assert not standby.maintenance.leading
    assert leader.maintenance.rescue() == [], "already rescued: fenced"
    rescued = app.get_job(claimed.id)
    assert (rescued.state, rescued.attempt) == (JobState.AVAILABLE, 0)
    assert [e.kind for e in rescued.errors] == ["worker_lost"]


def test_paused_queues_are_not_claimed(app: App) -> None:
    record.enqueue({"n": 1})
    app.pause_queue("default")
    assert drain(app).claimed == 0
    assert [q.paused for q in app.queues() if q.name == "default"] == [True]
    app.resume_queue("default")
    assert drain(app).completed == 1


def test_job_context(app: App) -> None:
    seen: list[JobContext] = []

    @job
    def ctx_job(input: dict[str, Any], ctx: JobContext) -> None:
        seen.append(ctx)
        assert ctx.heartbeat()

    app.registry.add_job(ctx_job, "ctx_job")
    ctx_job._bind_app(app)
    result = ctx_job.enqueue({}, tenant_id="t1")
    drain(app)
    (ctx,) = seen
    assert (ctx.id, ctx.name, ctx.attempt, ctx.tenant_id, ctx.cancelled) == (
        result.id,
        "ctx_job",
        1,
        "t1",
        False,
    )


def test_pruner_removes_old_finished_jobs(app: App, clock: FakeClock) -> None:
    first = record.enqueue({"n": 1})
    drain(app)
    clock.advance("2d")
    worker = app.worker(retention="1d")
    assert worker.maintenance.prune() == 1
    assert app.driver.job_get(first.id) is None


def test_a_worker_runs_its_handlers_and_four_loops(
    make_app: Callable[..., App], make_module: Any
) -> None:
    """A worker's threads: its handlers (which only run jobs) and the cycle, heartbeat, renew
    and maintenance loops; the worker's row is a step of the maintenance loop, not a thread of
    its own (before, a presence loop ran beside them)."""
    app = make_app(make_module(record=record))
    ids = [record.enqueue({"n": n}).id for n in range(30)]
    completed: list[object] = []
    all_done = threading.Event()

    def on_completed(event: object) -> None:
        completed.append(event)
        if len(completed) == len(ids):
            all_done.set()

    with (
        events.subscribe(on_completed, names=["jobs.job.completed"]),
        app.worker(concurrency=3, poll_interval="50ms"),
    ):
        assert all_done.wait(30), f"{len(completed)} of {len(ids)} jobs completed in 30 s"
        mine = sorted(t.name for t in threading.enumerate() if t.name.startswith("ultimat3-jobs-"))
    assert app.count_jobs(state="completed") == len(ids)
    handlers = [n for n in mine if n.startswith("ultimat3-jobs-handler-")]
    loops = {n for n in mine if n not in handlers} - {"ultimat3-jobs-stop"}
    worker_loops = {f"ultimat3-jobs-{n}" for n in ("cycle", "heartbeat", "renew", "maintenance")}
    assert len(handlers) == 3
    assert worker_loops <= loops
    assert "ultimat3-jobs-presence" not in loops
