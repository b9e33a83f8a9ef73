"""The execution core cannot die quietly, and bad settings or input are refused up front.

Each test is a defect once seen: a handler whose outcome could not be computed left its job
``running`` for ever; a bad cron task stopped every task after it; an unexpected error in a
loop killed it while the process lived on; a sync job past its timeout overlapped its retry;
``ctx.heartbeat()`` blocked the event loop; the rescuer took live jobs from workers whose
heartbeats were stuck behind a caller's SQLite write lock.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import (
    App,
    ConfigurationError,
    DurationError,
    JobContext,
    JobsError,
    JobState,
    Retry,
    Snooze,
    job,
    task,
)
from ultimat3.jobs.clock import Backoff
from ultimat3.jobs.testing import FakeClock
from ultimat3.jobs.worker import FATAL_EXIT

from . import faketime

EVENTS: list[tuple[str, float]] = []


def _wait(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@job(retry=Retry(attempts=2, delay="10ms", jitter=False))
def snooze_for_ever(value: Any) -> None:
    raise Snooze(timedelta(days=3_000_000))


@job
def noop(value: Any) -> None:
    EVENTS.append(("noop", time.monotonic()))


def test_a_handler_whose_outcome_cannot_be_built_fails_its_job_not_its_thread(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("exec_snooze", snooze_for_ever=snooze_for_ever, noop=noop))
    bad = snooze_for_ever.enqueue({}).id
    with app.worker(concurrency=1, poll_interval="50ms", lease="2s"):
        _wait(lambda: app.get_job(bad).state is JobState.DEAD, what="the job to end")
        done = noop.enqueue({}).id
        _wait(lambda: app.get_job(done).state is JobState.COMPLETED, what="the next job")
    errors = app.get_job(bad).errors
    assert [e.kind for e in errors] == ["DurationError", "DurationError"]
    assert "longer than 10 years" in errors[0].message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease": "99999999d"}, "lease='99999999d' is longer than 10 years"),
        ({"lease": "3s", "heartbeat": "10s"}, "heartbeat=10s is more than half the lease (3s)"),
        ({"concurrency": 0}, "concurrency=0 is not valid"),
        ({"stuck_limit": "11y"}, "stuck_limit"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_option(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    options: dict[str, Any],
    message: str,
) -> None:
    app = make_app(make_module("exec_settings", noop=noop))
    with pytest.raises(ConfigurationError) as raised:
        app.worker(**options)
    assert message in raised.value.cause
    assert raised.value.fix


def test_a_signal_before_the_worker_started_still_stops_it(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    """A SIGTERM that lands after run() installed its handler but before start() ran found
    nothing to stop; run() must honour it rather than run on for ever."""
    import signal

    app = make_app(make_module("exec_early_signal", noop=noop))
    worker = app.worker(poll_interval="50ms")
    worker._on_signal(signal.SIGTERM, None)
    returned = threading.Event()
    thread = threading.Thread(
        target=lambda: (worker.run(install_signals=False), returned.set()), daemon=True
    )
    thread.start()
    assert returned.wait(15), "the worker ignored a SIGTERM that came before it started"
    assert worker.exit_code == 0


@job(idempotency_key=lambda value: value["missing"])
def keyed(value: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("options", "input_", "fragment"),
    [
        ({"max_attempts": 2**70}, {}, "max_attempts"),
        ({"delay": 10**12}, {}, "longer than 10 years"),
        ({"run_at": "2030-01-01"}, {}, "not a datetime"),
        ({"tenant_id": "a\x00b"}, {}, "tenant_id"),
        ({"idempotency_key": "k\x00"}, {}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, {}, "idempotency_key"),
        ({}, {"other": 1}, "raised KeyError"),
    ],
)
def test_bad_enqueues_raise_a_jobs_error_and_write_nothing(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    options: dict[str, Any],
    input_: Any,
    fragment: str,
) -> None:
    app = make_app(make_module("exec_bad", noop=noop, keyed=keyed))
    handle = keyed if not options else noop
    with pytest.raises(JobsError) as raised:
        handle.enqueue(input_, **options)
    assert fragment in raised.value.cause
    assert raised.value.fix
    assert app.count_jobs() == 0


def test_the_same_values_are_stored_alike_on_every_driver(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("exec_bounds", noop=noop))
    far = datetime(9999, 12, 31, tzinfo=UTC)
    stored = app.get_job(
        noop.enqueue(
            {}, max_attempts=10_000, tenant_id="t" * 200, idempotency_key="k" * 255, run_at=far
        ).id
    )
    assert (stored.max_attempts, stored.tenant_id, stored.run_at) == (10_000, "t" * 200, far)


def test_a_bad_url_option_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="busy_timeout=abc"):
        App(f"sqlite:///{tmp_path / 'j.sqlite3'}?busy_timeout=abc").open()


# -- the scheduler -------------------------------------------------------------------------------


def _boom() -> list[Any]:
    raise RuntimeError("this task's enqueue is broken")


broken = task("* * * * *", tz="UTC", enqueue=_boom, catch_up="run-once")
healthy = task("* * * * *", tz="UTC", enqueue=lambda: [(noop, {})], catch_up="run-once")


def test_one_bad_cron_task_does_not_stop_the_others(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))
    app = make_app(
        make_module("exec_cron", a_broken=broken, b_healthy=healthy, noop=noop), clock=clock
    )
    scheduler = app.scheduler()
    scheduler.tick()  # first sight: nothing is owed yet
    clock.advance(timedelta(minutes=2))
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        fired = scheduler.tick()
    assert {f.task for f in fired} == {"b_healthy"}
    failed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.task-failed"]
    assert failed and failed[0].fields["task"] == "a_broken"


# -- loops that fail ---------------------------------------------------------------------------


def test_an_unexpected_claim_error_is_survived(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("exec_claim", noop=noop))
    ids = [noop.enqueue({}).id for _ in range(3)]
    worker = app.worker(poll_interval="50ms")
    worker.backoff = Backoff(first=0.01, cap=5.0)
    driver = worker.driver
    failures = [RuntimeError("a surprise"), OSError("another")]

    class Flaky:
        def __getattr__(self, name: str) -> Any:
            return getattr(driver, name)

        def job_cycle(self, cycle: Any, **kwargs: Any) -> Any:
            if failures:
                raise failures.pop(0)
            return driver.job_cycle(cycle, **kwargs)

    worker.driver = Flaky()  # type: ignore[assignment]
    with worker:
        _wait(lambda: all(app.get_job(i).state is JobState.COMPLETED for i in ids))
    assert not failures, "both failures were met, and survived"
    assert worker.exit_code == 0


def test_a_critical_loop_that_keeps_crashing_stops_the_worker_non_zero(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
) -> None:
    app = make_app(make_module("exec_fatal", noop=noop))
    worker = app.worker(poll_interval="50ms")
    driver = worker.driver

    class Broken:
        def __getattr__(self, name: str) -> Any:
            return getattr(driver, name)

        def job_cycle(self, cycle: Any, **kwargs: Any) -> Any:
            raise KeyError("a bug in the claim")

    worker.driver = Broken()  # type: ignore[assignment]
    worker.backoff = Backoff(first=0.01, cap=5.0)  # the setting of the worker's loops
    stats = worker.run(install_signals=False)
    assert worker.exit_code == FATAL_EXIT
    assert stats.claimed == 0


# -- timeouts, heartbeats and the event loop ---------------------------------------------------

RUNS: list[tuple[int, str]] = []
OVERRUNNING = threading.Event()
RETURN = threading.Event()


@job(timeout="200ms", retry=Retry(attempts=2, delay="0s", jitter=False))
def overruns(value: Any, ctx: JobContext) -> None:
    RUNS.append((ctx.attempt, "start"))
    if ctx.attempt == 1:
        OVERRUNNING.set()
        RETURN.wait(10)  # a sync function cannot be interrupted: it runs past its timeout
    RUNS.append((ctx.attempt, "end"))


def test_a_sync_job_past_its_timeout_keeps_its_lease_until_it_returns(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType], clock: FakeClock
) -> None:
    RUNS.clear()
    OVERRUNNING.clear()
    RETURN.clear()
    app = make_app(make_module("exec_timeout", overruns=overruns), clock=clock)
    made = overruns.enqueue({}).id
    worker = app.worker(concurrency=2, poll_interval="20ms", lease="1s", heartbeat="200ms")
    with faketime.running(worker, clock), faketime.seen("jobs.job.completed") as completed:
        assert OVERRUNNING.wait(10)
        faketime.pass_time(clock, "3s")  # fifteen timeouts, three leases
        assert RUNS == [(1, "start")], "the retry never overlaps the attempt still running"
        assert worker.stats.lost == 0 and app.get_job(made).state is JobState.RUNNING
        RETURN.set()
        assert completed.wait(10)  # the retry, at once: no time passes
    assert RUNS == [(1, "start"), (1, "end"), (2, "start"), (2, "end")]
    assert [e.kind for e in app.get_job(made).errors] == ["timeout"]


STUCK = threading.Event()
UNSTICK = threading.Event()


@job(timeout="100ms", retry=Retry(attempts=1))
def stuck(value: Any) -> None:
    STUCK.set()
    UNSTICK.wait(10)


def test_stuck_threads_holding_every_slot_stop_the_worker_for_a_restart(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    caplog: pytest.LogCaptureFixture,
    clock: FakeClock,
) -> None:
    STUCK.clear()
    UNSTICK.clear()
    app = make_app(make_module("exec_stuck", stuck=stuck), clock=clock)
    made = stuck.enqueue({}).id
    worker = app.worker(concurrency=1, poll_interval="20ms", stuck_limit="300ms")
    runner = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    try:
        with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
            runner.start()
            assert STUCK.wait(10)
            faketime.parked(clock)
            stuck_at = clock.monotonic()
            faketime.join(runner, clock)  # its timeout, then the stuck limit, then the exit
    finally:
        UNSTICK.set()
    assert clock.monotonic() - stuck_at >= 0.4, "timed out (100 ms), then stuck for 300 ms"
    assert worker.exit_code == FATAL_EXIT
    assert any(getattr(r, "event", "") == "jobs.worker.stuck" for r in caplog.records)
    assert app.get_job(made).state is JobState.DEAD  # its timeout was written before exiting


@job
async def beats_a_lot(value: Any, ctx: JobContext) -> None:
    started = time.monotonic()
    for _ in range(20):
        ctx.heartbeat()
    EVENTS.append(("beat", time.monotonic() - started))


def test_ctx_heartbeat_never_blocks_the_event_loop(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    EVENTS.clear()
    app = make_app(make_module("exec_beat", beats_a_lot=beats_a_lot))
    made = beats_a_lot.enqueue({}).id
    worker = app.worker(poll_interval="20ms")
    real = worker.driver.lease_extend

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        return real(*args, **kwargs)

    worker.driver.lease_extend = slow  # type: ignore[method-assign]
    try:
        with worker:
            _wait(lambda: app.get_job(made).state is JobState.COMPLETED)
    finally:
        del worker.driver.lease_extend
    [(_, spent)] = [e for e in EVENTS if e[0] == "beat"]
    assert spent < 0.05, f"20 heartbeats took {spent:.3f}s on the event loop"


BLOCKING = threading.Event()
UNBLOCK = threading.Event()


@job
async def blocks_the_loop(value: Any) -> None:
    BLOCKING.set()
    UNBLOCK.wait(10)  # a blocking call inside async def: every other async job waits


def test_a_blocked_event_loop_is_logged_with_the_job_that_blocked_it(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    caplog: pytest.LogCaptureFixture,
    clock: FakeClock,
) -> None:
    BLOCKING.clear()
    UNBLOCK.clear()
    app = make_app(make_module("exec_blocked", blocks_the_loop=blocks_the_loop), clock=clock)
    made = blocks_the_loop.enqueue({}).id
    worker = app.worker(poll_interval="20ms")

    def blocked() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.loop-blocked"]

    with (
        caplog.at_level(logging.WARNING, logger="ultimat3.jobs"),
        faketime.running(worker, clock),
        faketime.seen("jobs.job.completed") as completed,
    ):
        assert BLOCKING.wait(10)
        moved = clock.advance_until(blocked, "100ms", limit="5s")
        assert moved > worker.loop_blocked_after, "reported once blocked for longer than that"
        UNBLOCK.set()
        assert completed.wait(10)
    assert made in blocked()[0].fields["jobs"]


# -- a caller's SQLite write lock is not a dead worker -----------------------------------------


@job
def sleeps(value: Any, ctx: JobContext) -> None:
    EVENTS.append((f"run {ctx.attempt}", time.monotonic()))
    time.sleep(float(value["sleep"]))


def test_a_long_business_transaction_does_not_cost_live_jobs_their_lease(
    tmp_path: Path, make_module: Callable[..., types.ModuleType]
) -> None:
    """The caller holds SQLite's write lock for twice the lease: heartbeats cannot write, and
    the rescuer must not take that for a dead worker."""
    EVENTS.clear()
    path = tmp_path / "jobs.sqlite3"
    app = App(f"sqlite:///{path}", modules=[make_module("exec_lock", sleeps=sleeps)])
    ids = [sleeps.enqueue({"sleep": 3.0}).id for _ in range(3)]
    lease = 1.0
    worker = app.worker(
        concurrency=3, lease=lease, heartbeat="300ms", rescue_interval="100ms", poll_interval="50ms"
    )
    business = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        with worker:
            _wait(lambda: sum(1 for e in EVENTS if e[0] == "run 1") == 3, what="the jobs to start")
            business.execute("BEGIN IMMEDIATE")
            time.sleep(2 * lease)
            business.execute("COMMIT")
            _wait(
                lambda: all(app.get_job(i).state is JobState.COMPLETED for i in ids),
                what="the jobs to complete",
            )
    finally:
        business.close()
        app.close()
    reader = App(f"sqlite:///{path}")
    try:
        for job_id in ids:
            found = reader.get_job(job_id)
            assert (found.attempt, found.errors) == (1, ())
    finally:
        reader.close()
    assert [e[0] for e in EVENTS].count("run 1") == 3
    assert not any(e[0] == "run 2" for e in EVENTS)


# -- maintenance -------------------------------------------------------------------------------


def test_one_node_maintains_and_pruning_keeps_up(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType], clock: FakeClock
) -> None:
    app = make_app(make_module("exec_prune", noop=noop), clock=clock)
    first, second = app.worker(retention="1s"), app.worker(retention="1s")
    first.maintenance.config.prune_batch = 100
    assert first.maintenance.tick(rescue_every=60, prune_every=60) == 0
    assert first.maintenance.leading
    second.maintenance.tick(rescue_every=60, prune_every=60)
    assert not second.maintenance.leading, "one leader at a time"
    app.enqueue_many(noop, [{}] * 450)
    app.worker().drain()
    assert app.count_jobs(state="completed") == 450
    assert first.maintenance.prune() == 0, "kept for their retention"
    clock.advance("1100ms")
    assert first.maintenance.prune() == 450, "batch after batch until nothing is left"
    assert app.count_jobs() == 0
    first.maintenance.resign()
    second.maintenance.tick(rescue_every=60, prune_every=60)
    assert second.maintenance.leading


def test_a_standby_asks_for_the_leadership_at_its_rescue_cadence_not_in_a_busy_loop(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    """Each ask is an upsert of the leadership row, which waits on the leader's own renewal:
    standbys that asked every 50 ms made worker processes wait on one another."""
    app = make_app(make_module("exec_standby", noop=noop))
    leader, standby = app.worker(), app.worker()
    leader.maintenance.tick(rescue_every=60, prune_every=60)
    assert leader.maintenance.leading
    standby.maintenance.tick(rescue_every=60, prune_every=60)
    assert not standby.maintenance.leading
    assert standby.maintenance.next_in() == 5.0, "a third of the default 15 s leadership"
    standby.maintenance.tick(rescue_every=0.5, prune_every=60)
    assert standby.maintenance.next_in() == 0.5, "a faster rescue cadence, asked as often"
    leader.maintenance.resign()
    standby.maintenance.tick(rescue_every=60, prune_every=60)
    assert standby.maintenance.leading
    assert standby.maintenance.next_in() <= 5.0


def test_prune_stops_at_its_time_budget_and_comes_back_at_once(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("exec_budget", noop=noop))
    worker = app.worker(retention="0s")
    worker.maintenance.config.prune_batch = 10
    worker.maintenance.config.prune_budget = timedelta(0)
    app.enqueue_many(noop, [{}] * 35)
    app.worker().drain()
    assert worker.maintenance.prune() == 10
    assert worker.maintenance.next_in() <= 0.05
    while worker.maintenance.prune():
        pass
    assert app.count_jobs() == 0


def test_async_handlers_run_and_complete(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    @job
    async def quick(value: Any) -> None:
        await asyncio.sleep(0.01)

    app = make_app(make_module("exec_async", quick=quick))
    ids = [quick.enqueue({}).id for _ in range(10)]
    with app.worker(poll_interval="20ms"):
        _wait(lambda: all(app.get_job(i).state is JobState.COMPLETED for i in ids))


def test_snooze_of_a_sane_delay_still_works(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    calls: list[int] = []

    @job
    def once_more(value: Any, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise Snooze("10ms")

    app = make_app(make_module("exec_snooze_ok", once_more=once_more))
    made = once_more.enqueue({}).id
    with app.worker(poll_interval="20ms"):
        _wait(lambda: app.get_job(made).state is JobState.COMPLETED)
    assert calls == [1, 1], "a snooze gives the attempt back"


def test_duration_errors_are_configuration_errors() -> None:
    assert issubclass(DurationError, ConfigurationError)
    with pytest.raises(DurationError, match="Retry\\(delay\\)"):
        Retry(delay="3654d", max_delay="3654d")
    assert threading.active_count() >= 1


class _FailsOnce:
    """The worker's driver, whose ``method`` raises an unexpected error on its first call (for
    which ``when``, given the call's first argument, is true)."""

    def __init__(self, driver: Any, method: str, when: Callable[[Any], Any] | None = None) -> None:
        self._driver = driver
        self._method = method
        self._when = when
        self.raised = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._driver, name)
        if name != self._method:
            return real

        def once(*args: Any, **kwargs: Any) -> Any:
            if not self.raised and (self._when is None or self._when(args[0])):
                self.raised += 1
                raise RuntimeError(f"an unexpected error in {name}")
            return real(*args, **kwargs)

        return once


@pytest.mark.parametrize(
    ("loop", "method", "when"),
    [
        pytest.param("cycle", "job_cycle", None, id="cycle-claiming"),
        pytest.param("cycle", "job_cycle", lambda cycle: cycle.completes, id="cycle-settling"),
        pytest.param("renew", "lease_extend", None, id="renew"),
        pytest.param("maintenance", "leader_elect", None, id="maintenance"),
    ],
)
def test_each_loop_survives_an_unexpected_error(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    caplog: pytest.LogCaptureFixture,
    loop: str,
    method: str,
    when: Callable[[Any], Any] | None,
    clock: FakeClock,
) -> None:
    go = threading.Event()

    @job
    def held(value: Any) -> None:
        assert go.wait(30)  # held until the renew loop has had its turn, for ``renew``

    app = make_app(make_module(f"exec_loop_{method}_{when is None}", held=held), clock=clock)
    ids = [held.enqueue({}).id for _ in range(3)]
    worker = app.worker(poll_interval="20ms", lease="600ms", heartbeat="100ms")
    faulty = _FailsOnce(worker.driver, method, when)
    worker.driver = faulty  # type: ignore[assignment]
    worker.maintenance.driver = faulty  # type: ignore[assignment]
    done = lambda: all(app.get_job(i).state is JobState.COMPLETED for i in ids)  # noqa: E731
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"), faketime.running(worker, clock):
        if loop != "cycle":  # settling needs completions; claiming fails at once
            clock.advance_until(lambda: faulty.raised == 1, "50ms", limit="5s", settle=5)
        go.set()
        # The crashed loop comes back after its back-off, on the clock.
        clock.advance_until(lambda: done() and faulty.raised == 1, "50ms", limit="30s", settle=5)
    crashed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.loop.crashed"]
    assert [r.fields["loop"] for r in crashed] == [loop]
    assert worker.exit_code == 0


@pytest.mark.postgres
def test_a_read_only_postgres_window_is_retried_not_fatal(pg_dsn: str, make_module: Any) -> None:
    from ultimat3.jobs import DriverUnavailableError
    from ultimat3.jobs.drivers.postgres import PostgresDriver

    driver = PostgresDriver(pg_dsn, pool_min=1, pool_max=1)
    try:
        driver.migrate()
        with driver._connection() as conn:
            conn.execute("SET default_transaction_read_only = on")  # as on a hot standby
        with pytest.raises(DriverUnavailableError) as raised:
            driver.job_insert_many([_new(noop)])
        assert raised.value.retryable and "read-only" in raised.value.cause
        with driver._connection() as conn:
            conn.execute("SET default_transaction_read_only = off")  # the primary is back
        assert len(driver.job_insert_many([_new(noop)])) == 1
    finally:
        driver.close()


def _new(handle: Any) -> Any:
    from ultimat3.jobs.ids import uuid7
    from ultimat3.jobs.records import NewJob

    job_id = uuid7()
    return NewJob(
        id=job_id, name="noop", queue="default", input="{}", idempotency_key=job_id, max_attempts=3
    )


def test_the_scheduler_thread_survives_an_unexpected_error(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("exec_sched_loop", b_healthy=healthy, noop=noop))
    scheduler = app.scheduler(tick_interval="20ms")
    real = scheduler.tick
    calls: list[int] = []

    def flaky() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a surprise in the scheduler")
        return real()

    scheduler.tick = flaky  # type: ignore[method-assign]
    scheduler.backoff = Backoff(first=0.01, cap=5.0)
    scheduler.start()
    _wait(lambda: len(calls) >= 3, what="ticks after the error")
    scheduler.stop()


def test_completions_are_logged_at_info_and_an_unknown_job_at_warning(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`-v` shows every completion (with its attempt and how long it ran); an unknown job is a
    WARNING at the default level, naming the job, when it is given back and when it ends."""
    from ultimat3.jobs.ids import uuid7
    from ultimat3.jobs.records import NewJob

    app = make_app(make_module("exec_logs", noop=noop))
    done = noop.enqueue({}).id
    stray = uuid7()
    app.driver.job_insert_many([NewJob(stray, "gone.job", "default", "{}", stray, max_attempts=1)])
    worker = app.worker(poll_interval="20ms", unknown_grace="100ms")
    with caplog.at_level(logging.INFO, logger="ultimat3.jobs"), worker:
        _wait(lambda: app.get_job(done).state is JobState.COMPLETED, what="the job")
        _wait(lambda: app.get_job(stray).state is JobState.DEAD, what="the unknown job to end")
    waiting = [r for r in caplog.records if r.fields.get("dead") is False]
    assert waiting and waiting[0].levelno == logging.WARNING
    assert waiting[0].fields["job"] == "gone.job" and waiting[0].fields["registered"]
    by_event = {getattr(r, "event", ""): r for r in caplog.records}
    completed = by_event["jobs.job.completed"]
    assert completed.levelno == logging.INFO
    assert completed.fields["job_id"] == done and completed.fields["attempt"] == 1
    assert completed.fields["duration"] is not None and completed.fields["duration"] >= 0
    unknown = by_event["jobs.job.unknown"]
    assert unknown.levelno == logging.WARNING and unknown.fields["job"] == "gone.job"
    # It names what this worker can run, and says what to do.
    registered = sorted(app.registry.jobs)
    assert registered and unknown.fields["registered"] == ", ".join(registered)
    assert f"registered={', '.join(registered)}" in unknown.getMessage()
    assert "deploy the code" in unknown.fields["fix"]
    (error,) = app.get_job(stray).errors
    assert error.kind == "unknown_job" and f"(registered: {', '.join(registered)})" in error.message


def test_a_claim_whose_reply_was_lost_costs_no_lease_and_no_attempt(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    """The first claim commits but its caller sees a broken connection: the worker gives that
    claim back by its token before claiming again, so its jobs run at once, on their first
    attempt, instead of waiting out a 30 s lease and being rescued as lost."""
    from ultimat3.jobs import DriverUnavailableError

    app = make_app(make_module("exec_lost_reply", noop=noop))
    ids = [noop.enqueue({}).id for _ in range(3)]
    worker = app.worker(poll_interval="20ms", lease="30s")
    real = worker.driver

    class LosesOneReply:
        lost = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def job_cycle(self, cycle: Any, **kwargs: Any) -> Any:
            result = real.job_cycle(cycle, **kwargs)
            if not self.lost and result.claimed:
                self.lost = len(result.claimed)
                raise DriverUnavailableError("the connection broke", driver=real.name)
            return result

    worker.driver = LosesOneReply()  # type: ignore[assignment]
    started = time.monotonic()
    with worker:
        _wait(lambda: all(app.get_job(i).state is JobState.COMPLETED for i in ids), 10)
    assert worker.driver.lost == 3  # type: ignore[attr-defined]
    assert time.monotonic() - started < 10, "well within the 30 s lease"
    for job_id in ids:
        done = app.get_job(job_id)
        assert (done.attempt, done.errors) == (1, ())
