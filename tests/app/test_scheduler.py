"""The cron scheduler through its real loop (``Scheduler.tick``) under a fake clock: the DST
golden table, catch-up after downtime, exactly-once with several schedulers, and leadership."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ultimat3.jobs import App, job, task
from ultimat3.jobs.scheduler import DispatchedOccurrence, Scheduler
from ultimat3.jobs.testing import FakeClock


@job
def ping(input: Any) -> None:
    return None


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


@pytest.fixture
def make_scheduled_app(
    make_module: Callable[..., Any], tmp_path: Any
) -> Iterator[Callable[..., tuple[App, Scheduler, FakeClock]]]:
    apps: list[App] = []

    def make(
        cron: str,
        tz: str,
        *,
        start: datetime,
        url: str = "memory://",
        catch_up: str = "skip",
        max_catch_up: int = 10,
        leader: str = "sole",
    ) -> tuple[App, Scheduler, FakeClock]:
        clock = FakeClock(start)
        tick = task(
            cron, tz=tz, enqueue=lambda: [(ping, {})], catch_up=catch_up, max_catch_up=max_catch_up
        )  # type: ignore[arg-type]
        module = make_module(f"sched_{len(apps)}", ping=ping, tick=tick)
        app = App(url, modules=[module], clock=clock)
        apps.append(app)
        return app, app.scheduler(leader=leader), clock  # type: ignore[arg-type]

    yield make
    for app in apps:
        app.close()


def run_until(
    scheduler: Scheduler, clock: FakeClock, until: datetime, step: timedelta
) -> list[DispatchedOccurrence]:
    fired: list[DispatchedOccurrence] = []
    while clock.now() < until:
        clock.advance(step)
        fired.extend(scheduler.tick())
    return fired


GOLDEN = [
    ("America/New_York", "30 2 * * *", (2026, 3, 8), [utc(2026, 3, 8, 7, 0)]),
    ("America/New_York", "30 1 * * *", (2026, 11, 1), [utc(2026, 11, 1, 5, 30)]),
    ("Europe/London", "30 1 * * *", (2026, 3, 29), [utc(2026, 3, 29, 1, 0)]),
    ("Europe/London", "30 1 * * *", (2026, 10, 25), [utc(2026, 10, 25, 0, 30)]),
]


@pytest.mark.parametrize(("tz", "cron", "day", "expected"), GOLDEN)
def test_dst_golden_table_through_the_loop(
    make_scheduled_app: Callable[..., tuple[App, Scheduler, FakeClock]],
    tz: str,
    cron: str,
    day: tuple[int, int, int],
    expected: list[datetime],
) -> None:
    from zoneinfo import ZoneInfo

    local_midnight = datetime(*day, tzinfo=ZoneInfo(tz))
    start = local_midnight.astimezone(UTC) - timedelta(hours=1)
    app, scheduler, clock = make_scheduled_app(cron, tz, start=start)
    scheduler.tick()  # first seen: nothing is owed before now
    end = (local_midnight + timedelta(days=1)).astimezone(UTC)  # the next local midnight
    fired = run_until(scheduler, clock, end, timedelta(minutes=1))
    assert [f.occurrence for f in fired] == expected
    assert all(not f.catch_up for f in fired)
    assert app.count_jobs() == len(expected)


@pytest.mark.parametrize(("day", "count"), [((2026, 3, 8), 23), ((2026, 11, 1), 25)])
def test_hourly_follows_real_time_across_dst(
    make_scheduled_app: Callable[..., tuple[App, Scheduler, FakeClock]],
    day: tuple[int, int, int],
    count: int,
) -> None:
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("America/New_York")
    begin = datetime(*day, tzinfo=zone).astimezone(UTC)
    end = (datetime(*day, tzinfo=zone) + timedelta(days=1)).astimezone(UTC)
    _, scheduler, clock = make_scheduled_app(
        "0 * * * *", "America/New_York", start=begin - timedelta(seconds=30)
    )
    scheduler.tick()
    fired = run_until(scheduler, clock, end - timedelta(seconds=30), timedelta(minutes=1))
    assert len(fired) == count
    assert len({f.occurrence for f in fired}) == count


def test_golden_on_sqlite_too(
    make_scheduled_app: Callable[..., tuple[App, Scheduler, FakeClock]], tmp_path: Any
) -> None:
    start = utc(2026, 3, 8, 5, 0)
    _, scheduler, clock = make_scheduled_app(
        "30 2 * * *", "America/New_York", start=start, url=f"sqlite:///{tmp_path / 's.sqlite3'}"
    )
    scheduler.tick()
    fired = run_until(scheduler, clock, utc(2026, 3, 8, 9, 0), timedelta(minutes=5))
    assert [f.occurrence for f in fired] == [utc(2026, 3, 8, 7, 0)]


@pytest.mark.parametrize(
    ("policy", "expected_catch_up"),
    [("skip", 0), ("run-once", 1), ("run-all", 10)],
)
def test_catch_up_after_downtime(
    make_scheduled_app: Callable[..., tuple[App, Scheduler, FakeClock]],
    tmp_path: Any,
    policy: str,
    expected_catch_up: int,
) -> None:
    url = f"sqlite:///{tmp_path / 'c.sqlite3'}"
    start = utc(2026, 5, 1, 12, 0)
    app, scheduler, clock = make_scheduled_app(
        "* * * * *", "UTC", start=start, url=url, catch_up=policy, max_catch_up=50
    )
    scheduler.tick()
    clock.advance("1m")
    assert [f.occurrence for f in scheduler.tick()] == [utc(2026, 5, 1, 12, 1)]
    # Down for 10 occurrences (12:02 .. 12:11); back 90 s after 12:11, so 12:11 is late too.
    clock.set(utc(2026, 5, 1, 12, 12, 30))
    restarted = app.scheduler()
    fired = restarted.tick()
    catch_ups = [f for f in fired if f.catch_up]
    on_time = [f for f in fired if not f.catch_up]
    assert len(catch_ups) == expected_catch_up
    assert [f.occurrence for f in on_time] == [utc(2026, 5, 1, 12, 12)]
    if policy == "run-once":
        assert catch_ups[0].occurrence == utc(2026, 5, 1, 12, 11)
    if policy == "run-all":
        assert [f.occurrence for f in catch_ups] == [utc(2026, 5, 1, 12, m) for m in range(2, 12)]
    # Restarting again adds nothing.
    assert app.scheduler().tick() == []
    assert app.count_jobs() == 2 + expected_catch_up


def test_run_all_is_bounded(
    make_scheduled_app: Callable[..., tuple[App, Scheduler, FakeClock]],
) -> None:
    _app, scheduler, clock = make_scheduled_app(
        "* * * * *", "UTC", start=utc(2026, 5, 1), catch_up="run-all", max_catch_up=3
    )
    scheduler.tick()
    clock.advance("1m")
    scheduler.tick()
    clock.advance("2h")
    fired = scheduler.tick()
    assert [f.occurrence for f in fired if f.catch_up] == [
        utc(2026, 5, 1, 1, 58),
        utc(2026, 5, 1, 1, 59),
        utc(2026, 5, 1, 2, 0),
    ]
    assert scheduler.tick() == []


def test_two_schedulers_fire_each_occurrence_once(
    make_scheduled_app: Callable[..., tuple[App, Scheduler, FakeClock]], tmp_path: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'two.sqlite3'}"
    app, first, clock = make_scheduled_app("*/5 * * * *", "UTC", start=utc(2026, 6, 1), url=url)
    second = app.scheduler()  # a second sole leader: both act, the database keeps it once
    first.tick()
    fired: list[DispatchedOccurrence] = []
    for _ in range(60):
        clock.advance("1m")
        fired += first.tick() + second.tick()
    occurrences = [f.occurrence for f in fired]
    assert len(occurrences) == len(set(occurrences)) == 12
    assert app.count_jobs() == 12


def test_database_leader_elects_one(
    make_scheduled_app: Callable[..., tuple[App, Scheduler, FakeClock]], tmp_path: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'lead.sqlite3'}"
    app, first, clock = make_scheduled_app(
        "* * * * *", "UTC", start=utc(2026, 6, 1), url=url, leader="database"
    )
    second = app.scheduler(leader="database")
    first.tick()
    clock.advance("1m")
    assert len(first.tick()) == 1
    assert second.tick() == [], "the follower does nothing while the leader's lease holds"
    first.stop()  # resigns
    clock.advance("1m")
    assert len(second.tick()) == 1
    assert first.tick() == []
