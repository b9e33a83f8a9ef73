"""A step of the wall clock under the scheduler, with a fake clock (``FakeClock.step`` moves
wall time alone, as ``date -s`` would): it fires no occurrence ahead of the true time, none
twice, and no task stays silent for more than one period once the clock is corrected. The
same with real processes whose wall clock is shifted: ``test_clock_step_processes.py``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ultimat3.jobs import App, job, task
from ultimat3.jobs.scheduler import Scheduler
from ultimat3.jobs.testing import FakeClock

START = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
PERIOD = timedelta(minutes=1)


@job
def beat(input: Any) -> None:
    return None


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def scheduled(
    request: pytest.FixtureRequest, make_module: Callable[..., Any], tmp_path: Any
) -> Iterator[tuple[App, Scheduler, FakeClock]]:
    if request.param == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(request.getfixturevalue("pg_dsn"))
        url = f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'step.sqlite3'}"
    else:
        url = "memory://"
    clock = FakeClock(START)
    every = task(
        "* * * * *", tz="UTC", enqueue=lambda: [(beat, {})], catch_up="run-all", max_catch_up=10
    )
    app = App(url, modules=[make_module("clock_step_tasks", beat=beat, every=every)], clock=clock)
    try:
        yield app, app.scheduler(), clock
    finally:
        app.close()


class Run:
    """Ticks the scheduler each second of true time (the monotonic clock) and records, for
    each occurrence fired, how early it was on the true clock."""

    def __init__(self, scheduler: Scheduler, clock: FakeClock) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.fired: list[tuple[datetime, datetime]] = []  # (occurrence, true time of the fire)
        self.scheduler.tick()

    def true(self) -> datetime:
        return START + timedelta(seconds=self.clock.monotonic())

    def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.clock.advance(1)
            for d in self.scheduler.tick():
                self.fired.append((d.occurrence, self.true()))

    def earliest(self) -> timedelta:
        return max(occurrence - at for occurrence, at in self.fired)

    def silence_after(self, corrected: datetime) -> timedelta:
        """The longest time without a fire from ``corrected`` (true time) on."""
        times = [corrected] + [at for _, at in self.fired if at > corrected] + [self.true()]
        return max(b - a for a, b in itertools.pairwise(times))


@pytest.mark.parametrize(("step", "hold"), [(timedelta(hours=2), 150), (-timedelta(hours=1), 150)])
def test_a_step_corrected_later_fires_nothing_early_and_leaves_no_silence(
    scheduled: tuple[App, Scheduler, FakeClock], step: timedelta, hold: int
) -> None:
    app, scheduler, clock = scheduled
    run = Run(scheduler, clock)
    run.run(125)
    clock.step(step)  # the fault
    run.run(hold)
    clock.step(-step)  # the correction
    corrected = run.true()
    run.run(185)
    occurrences = [o for o, _ in run.fired]
    assert len(occurrences) == len(set(occurrences)), "an occurrence fired twice"
    assert run.earliest() <= timedelta(seconds=1), f"fired {run.earliest()} early"
    assert run.silence_after(corrected) <= PERIOD + timedelta(seconds=1)
    # Every minute of true time fired, on time, across the fault and its correction.
    assert occurrences == [START + m * PERIOD for m in range(1, 8)]
    assert app.count_jobs() == len(occurrences)


def test_a_step_held_past_step_hold_is_followed(
    scheduled: tuple[App, Scheduler, FakeClock],
) -> None:
    """A step that lasts is a correction: forward, the jumped time counts as downtime (the
    catch-up policy); back, the last-fired time in the future is brought back."""
    app, scheduler, clock = scheduled
    scheduler.step_hold = timedelta(seconds=30)
    run = Run(scheduler, clock)
    run.run(65)
    clock.step(timedelta(hours=2))
    run.run(29)
    assert [o for o, _ in run.fired] == [START + PERIOD], "held: nothing fires early"
    run.run(2)
    caught_up = [o for o, _ in run.fired[1:]]  # max_catch_up=10 missed, then the current one
    assert len(caught_up) == 11 and caught_up[-1] == START + timedelta(hours=2, minutes=1)
    run.run(60)
    clock.step(-timedelta(hours=2))
    run.run(31)
    corrected = run.true()
    run.run(130)
    occurrences = [o for o, _ in run.fired]
    assert len(occurrences) == len(set(occurrences)), "an occurrence fired twice"
    assert run.silence_after(corrected) <= PERIOD + timedelta(seconds=1)
    last = app.driver.schedule_read(["every"])["every"].last_fired_at
    assert last is not None and last <= clock.now()


@pytest.mark.parametrize("by", [timedelta(hours=2), -timedelta(hours=1)])
def test_the_rescuer_trusts_no_expiry_for_a_lease_after_a_step(
    scheduled: tuple[App, Scheduler, FakeClock], by: timedelta
) -> None:
    """A lease renewed on time before a step looks expired after a step forward; the rescuer
    waits a full lease (its ``grace``) from the step, in which a live worker renews it. A lease
    nobody renews is rescued once that has passed, as usual."""
    from ultimat3.jobs.records import ClaimParams, Cycle

    app, _, clock = scheduled
    made = beat.enqueue({})
    lease = timedelta(seconds=30)
    params = ClaimParams(("default",), 1, lease, worker_id="w", now=clock.now())
    [claimed] = app.driver.job_cycle(Cycle(claim=params), now=clock.now()).claimed
    assert claimed.id == made.id
    clock.advance(20)
    app.driver.lease_extend([claimed.lease], lease, now=clock.now())  # renewed on time
    maintenance = app.worker(lease=lease).maintenance
    clock.step(by)
    assert maintenance.rescue() == [], "a live job's lease is not rescued because of a step"
    clock.advance(29)
    assert maintenance.rescue() == []
    clock.advance(2)  # a full lease since the step, and still no renewal: rescued
    if by > timedelta(0) or app.driver.name == "sqlite":
        # SQLite moves a stored lease expiry with a step of the host clock: the lease lapsed
        # a lease after its renewal, in true time, whichever way the clock stepped.
        assert maintenance.rescue() == [made.id]
    else:  # the lease was renewed in the old, later time: it lapses a lease after that
        assert maintenance.rescue() == []
        clock.advance(-by + lease)
        assert maintenance.rescue() == [made.id]


def test_live_workers_are_not_pruned_after_a_step(
    scheduled: tuple[App, Scheduler, FakeClock],
) -> None:
    """A live worker's last beat, written before a step forward, looks stale after it: its row
    stays until a beat could have been written in the new time, then a dead one's goes."""
    from ultimat3.jobs.presence import Presence

    app, _, clock = scheduled
    presence = Presence(
        app.driver, clock, worker_id="w1", queues=("default",), concurrency=1, every=1.0
    )
    presence.beat()
    maintenance = app.worker(lease="10s").maintenance  # stale after three leases: 30 s
    clock.step(timedelta(hours=2))
    assert maintenance.prune_workers() == []
    assert [w.id for w in app.workers()] == ["w1"]
    clock.advance(31)  # no beat since: it is gone
    assert maintenance.prune_workers() == ["w1"]


def test_a_clock_without_stepped_at_is_refused() -> None:
    from ultimat3.jobs.errors import ConfigurationError

    class OldClock:
        def now(self) -> datetime:
            return START

        def pinned(self) -> datetime | None:
            return START

        def monotonic(self) -> float:
            return 0.0

        def sleep(self, seconds: float, wake: Any = None) -> bool:
            return False

    with pytest.raises(ConfigurationError) as caught:
        App("memory://", clock=OldClock())  # type: ignore[arg-type]
    assert str(caught.value.cause) == "clock=OldClock lacks stepped_at of the Clock protocol"
