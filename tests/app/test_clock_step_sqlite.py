"""A step of the host's wall clock under the SQLite driver, with a fake clock (``FakeClock.step``
moves wall time alone): the due times and lease expiries stored in the file move with it, once
per file, so a delayed job keeps its delay in true (monotonic) time. Real processes whose wall
clock steps: ``test_clock_step_processes.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, job
from ultimat3.jobs.drivers.sqlite import SqliteDriver
from ultimat3.jobs.records import ClaimParams, Cycle, ExpiredQuery, Leadership, NewJob
from ultimat3.jobs.testing import FakeClock

START = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@job
def later(input: Any) -> None:
    return None


@pytest.fixture
def stepped(
    make_module: Callable[..., Any], tmp_path: Path
) -> Iterator[tuple[App, FakeClock, str]]:
    url = f"sqlite:///{tmp_path / 'step.sqlite3'}"
    clock = FakeClock(START)
    app = App(url, modules=[make_module("clock_step_sqlite_jobs", later=later)], clock=clock)
    try:
        yield app, clock, url
    finally:
        app.close()


def _claim_on(driver: Any, clock: FakeClock, worker: str = "w") -> list[str]:
    params = ClaimParams(("default",), 10, timedelta(seconds=30), worker_id=worker, now=clock.now())
    return [j.id for j in driver.job_cycle(Cycle(claim=params), now=clock.now()).claimed]


def _claim(app: App, clock: FakeClock) -> list[str]:
    return _claim_on(app.driver, clock)


def test_a_job_delayed_90s_waits_90s_of_true_time_across_a_forward_step(
    stepped: tuple[App, FakeClock, str],
) -> None:
    app, clock, _ = stepped
    made = later.enqueue({}, delay="90s")
    clock.advance(10)
    clock.step(timedelta(hours=2))
    assert _claim(app, clock) == [], "due at once after the step"
    clock.advance(79)  # 89 s since the enqueue
    assert _claim(app, clock) == []
    clock.advance(2)
    assert _claim(app, clock) == [made.id]


def test_a_backward_step_delays_a_due_job_by_nothing(
    stepped: tuple[App, FakeClock, str],
) -> None:
    app, clock, _ = stepped
    made = later.enqueue({}, delay="10s")
    clock.step(-timedelta(hours=1))
    assert _claim(app, clock) == []
    clock.advance(11)
    assert _claim(app, clock) == [made.id], "an hour late"


def test_a_second_driver_after_the_step_moves_nothing_twice(
    stepped: tuple[App, FakeClock, str],
) -> None:
    """The stored frame makes the move once per file: a driver opened after the step (another
    process of the same host) finds it done."""
    app, clock, url = stepped
    made = later.enqueue({}, delay="90s")
    clock.step(timedelta(hours=2))
    assert _claim(app, clock) == []  # this write moved the due time
    other = SqliteDriver(url.removeprefix("sqlite:///"), clock=clock)
    try:
        assert _claim_on(other, clock, "w2") == []
        job = other.job_get(made.id)
        assert job is not None
        assert job.run_at == clock.now() + timedelta(seconds=90), "moved twice, or not at all"
        clock.advance(91)
        assert _claim_on(other, clock, "w2") == [made.id]
    finally:
        other.close()


def test_a_driver_started_after_the_step_catches_it(
    make_module: Callable[..., Any], tmp_path: Path
) -> None:
    """The step happened while no process ran: the first write of the next one moves the
    stored times (the file remembers the frame, not the process)."""
    path = tmp_path / "late.sqlite3"
    clock = FakeClock(START)
    first = SqliteDriver(path, clock=clock)
    first.migrate()
    app = App(driver=first, modules=[make_module("clock_step_late", later=later)], clock=clock)
    made = later.enqueue({}, delay="90s")
    app.close()
    clock.step(timedelta(hours=2))
    second = SqliteDriver(path, clock=clock)
    try:
        assert _claim_on(second, clock) == []
        clock.advance(91)
        assert _claim_on(second, clock) == [made.id]
    finally:
        second.close()


@pytest.mark.parametrize("by", [timedelta(hours=2), -timedelta(hours=1)])
def test_a_lease_keeps_its_true_length_across_a_step(
    stepped: tuple[App, FakeClock, str], by: timedelta
) -> None:
    """A lease expiry moves with a step: forward, a live lease is not expired; back, a dead
    worker's job is rescued a lease after its last renewal, not an hour later."""
    app, clock, _ = stepped
    made = later.enqueue({})
    assert _claim(app, clock) == [made.id]
    clock.step(by)
    assert _claim(app, clock) == []  # a write: the file follows the step
    assert app.driver.job_list_expired(ExpiredQuery(10), now=clock.now()) == []
    clock.advance(31)
    expired = app.driver.job_list_expired(ExpiredQuery(10), now=clock.now())
    assert [j.id for j in expired] == [made.id]


def test_a_reboot_moves_nothing(tmp_path: Path) -> None:
    """Another boot (here: another fake clock, whose monotonic time is unrelated to the first's)
    is stored without moving a time: what the wall clock did while the host was down is
    unknown, and its monotonic time restarted."""
    path = tmp_path / "boot.sqlite3"
    before, after = FakeClock(START), FakeClock(START + timedelta(seconds=40))
    before.advance(30)  # the first boot's wall time stands 30 s apart from the second's
    first = SqliteDriver(path, clock=before)
    first.migrate()
    [made] = first.job_insert_many(
        [
            NewJob(
                id="j1",
                name="later",
                queue="default",
                input="{}",
                idempotency_key="j1",
                max_attempts=3,
                delay=timedelta(seconds=90),
            )
        ],
        now=before.now(),
    )
    first.close()
    assert after.frame().boot != before.frame().boot
    assert after.frame().offset - before.frame().offset == 40_000_000
    second = SqliteDriver(path, clock=after)
    try:
        assert _claim_on(second, after) == []
        job = second.job_get(made.id)
        assert job is not None and job.run_at == START + timedelta(seconds=120)
    finally:
        second.close()


def test_history_stays_as_written(stepped: tuple[App, FakeClock, str]) -> None:
    app, clock, _ = stepped
    done = later.enqueue({})
    assert _claim(app, clock) == [done.id]
    job = app.driver.job_get(done.id)
    assert job is not None
    app.driver.job_cycle(Cycle(completes=[job.lease]), now=clock.now())
    before = app.driver.job_get(done.id)
    clock.step(timedelta(hours=2))
    later.enqueue({})  # a write
    after = app.driver.job_get(done.id)
    assert before is not None and after is not None
    assert (after.created_at, after.finished_at) == (before.created_at, before.finished_at)


def _new(job_id: str, **fields: Any) -> NewJob:
    return NewJob(
        id=job_id,
        name="later",
        queue="default",
        input="{}",
        idempotency_key=job_id,
        max_attempts=3,
        **fields,
    )


def test_writers_racing_after_a_step_move_the_times_once(tmp_path: Path) -> None:
    """Four drivers (four processes of one host) write at once after a step: the check and the
    move are in the write lock's transaction, so the due time moves by the step, once, and one
    of them says so."""
    import logging
    import threading

    path = tmp_path / "race.sqlite3"
    clock = FakeClock(START)
    drivers = [SqliteDriver(path, clock=clock) for _ in range(4)]
    drivers[0].migrate()
    [made] = drivers[0].job_insert_many([_new("j0", delay=timedelta(seconds=90))], now=clock.now())
    clock.step(timedelta(hours=2))
    steps: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "event", None) == "jobs.sqlite.clock-step":
                steps.append(record)

    log = logging.getLogger("ultimat3.jobs.drivers.sqlite")
    handler = Catch()
    log.addHandler(handler)
    go = threading.Barrier(len(drivers))

    def write(n: int, driver: SqliteDriver) -> None:
        go.wait()
        for k in range(20):
            driver.job_insert_many([_new(f"w{n}-{k}", delay=timedelta(hours=1))], now=clock.now())

    threads = [threading.Thread(target=write, args=(n, d)) for n, d in enumerate(drivers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        job = drivers[1].job_get(made.id)
        assert job is not None and job.run_at == START + timedelta(hours=2, seconds=90)
        assert len(steps) == 1
    finally:
        log.removeHandler(handler)
        for d in drivers:
            d.close()


def test_a_rate_window_keeps_its_length_across_a_backward_step(tmp_path: Path) -> None:
    """Starts inside their rate window move with a step: one start a minute, stepped back an
    hour, lets the next start a minute later, not an hour and a minute later."""
    clock = FakeClock(START)
    driver = SqliteDriver(tmp_path / "rate.sqlite3", clock=clock)
    try:
        driver.migrate()
        limit = {"limit_key": "k", "limit_max": 10, "rate_max": 1}
        jobs = [_new(f"r{n}", rate_period=timedelta(minutes=1), **limit) for n in range(2)]
        driver.job_insert_many(jobs, now=clock.now())

        def claim() -> list[str]:
            params = ClaimParams(
                ("default",), 5, timedelta(seconds=30), "w", now=clock.now(), limited=True
            )
            return [j.id for j in driver.job_cycle(Cycle(claim=params), now=clock.now()).claimed]

        assert len(claim()) == 1
        clock.step(-timedelta(hours=1))
        assert claim() == []  # the window is not over
        clock.advance(61)
        assert len(claim()) == 1, "the rate window lasted an hour longer"
    finally:
        driver.close()


def test_a_leader_lease_keeps_its_length_across_a_backward_step(tmp_path: Path) -> None:
    """A dead leader's lease lapses its length after its last renewal, not an hour later."""
    clock = FakeClock(START)
    driver = SqliteDriver(tmp_path / "leader.sqlite3", clock=clock)
    try:
        driver.migrate()
        ttl = timedelta(seconds=10)
        assert driver.leader_elect(Leadership("m", "a", ttl), now=clock.now())
        clock.step(-timedelta(hours=1))
        assert not driver.leader_elect(Leadership("m", "b", ttl), now=clock.now())
        clock.advance(11)
        assert driver.leader_elect(Leadership("m", "b", ttl), now=clock.now()), (
            "a lapsed lease held on"
        )
    finally:
        driver.close()


def test_the_host_frame_is_the_wall_clock_against_boot_time() -> None:
    """The kernel's boot id, and an offset that stays put while no step happens (a step of it
    is shimmed in real processes: ``test_clock_step_sqlite_processes.py``)."""
    from ultimat3.jobs.clock import host_frame

    first = host_frame()
    if first is None:
        pytest.skip("no boot id or CLOCK_BOOTTIME: not Linux")
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert first.boot == f.read().strip()
    second = host_frame()
    assert second is not None and abs(second.offset - first.offset) < 1000  # 1 ms
