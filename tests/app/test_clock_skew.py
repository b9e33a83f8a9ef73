"""A worker and a scheduler say once, at their start, when the host's clock is far from the
database's.

On PostgreSQL every due time, lease and cron occurrence is decided on the server's clock, so a
host clock that is off changes none of them; what it does change is what is read on the host
(log times, the times the dashboard shows). A WARNING (``jobs.clock.skewed``) names both times
and the difference when they differ by more than 5 s, and nothing is said for a smaller skew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from ultimat3.jobs import App, events, job, task

from .processes import wait_until
from .test_run_at_clock import ShiftedClock

SKEWED = "jobs.clock.skewed"


@job
def noop(input: Any) -> None:
    return None


hourly = task("0 * * * *", tz="UTC", enqueue=lambda: [(noop, {})])


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(pg_dsn)
    return f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"


@pytest.fixture
def seen() -> Iterator[list[events.Event]]:
    got: list[events.Event] = []
    with events.subscribe(got.append, names=[SKEWED]):
        yield got


def _check(seen: list[events.Event], shift: timedelta, service: str) -> None:
    if abs(shift) <= timedelta(seconds=5):
        assert seen == [], f"a skew of {shift} is within 5 s: {seen}"
        return
    [event] = seen
    assert event.level == events.WARNING
    fields = event.fields
    assert fields["service"] == service
    host = datetime.fromisoformat(fields["host_time"])
    database = datetime.fromisoformat(fields["database_time"])
    assert abs((host - database) - shift) < timedelta(seconds=1)
    assert abs(fields["skew"] - shift.total_seconds()) < 1.0
    assert ("ahead of" if shift > timedelta(0) else "behind") in fields["cause"]
    assert "database's clock" in fields["effect"]


SHIFTS = [timedelta(hours=2), -timedelta(hours=2), timedelta(seconds=10), timedelta(seconds=2)]
IDS = ["2h-ahead", "2h-behind", "10s-ahead", "2s-ahead"]


@pytest.mark.parametrize("shift", SHIFTS, ids=IDS)
def test_a_worker_warns_at_its_start_of_a_skewed_host_clock(
    shift: timedelta, pg_url: str, seen: list[events.Event], make_module: Callable[..., Any]
) -> None:
    app = App(pg_url, modules=[make_module("clock_skew_jobs")], clock=ShiftedClock(shift))
    try:
        worker = app.worker(queues=["default"], poll_interval="30s")
        with worker:
            wait_until(lambda: worker._clock_checked, 10, "the worker to compare the clocks")
        _check(seen, shift, "worker")
    finally:
        app.close()


@pytest.mark.parametrize("shift", SHIFTS, ids=IDS)
def test_a_scheduler_warns_at_its_first_tick_of_a_skewed_host_clock(
    shift: timedelta, pg_url: str, seen: list[events.Event], make_module: Callable[..., Any]
) -> None:
    module = make_module("clock_skew_tasks", noop=noop, hourly=hourly)
    app = App(pg_url, modules=[module], clock=ShiftedClock(shift))
    try:
        scheduler = app.scheduler()
        scheduler.tick()
        scheduler.tick()  # once: not at every tick
        _check(seen, shift, "scheduler")
    finally:
        app.close()
