"""The clock a database's decisions use (``database_now``) and the scheduler's repair of a
last-fired time in the future (``schedule_rewind``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ultimat3.jobs.clock import SystemClock
from ultimat3.jobs.driver import Driver

from .helpers import T0


def test_database_now_is_the_pinned_time_or_the_databases_clock(driver: Driver) -> None:
    assert driver.database_now(now=T0) == T0
    before = SystemClock().now()
    read = driver.database_now()
    after = SystemClock().now()
    assert read.tzinfo is not None and read.utcoffset() == timedelta(0)
    # The test's PostgreSQL runs on this host: its clock agrees with ours within a second.
    assert before - timedelta(seconds=1) <= read <= after + timedelta(seconds=1)


def test_rewind_is_a_compare_and_set(driver: Driver) -> None:
    driver.schedule_state(["t"], now=T0)
    ahead = T0 + timedelta(hours=2)
    assert driver.schedule_fire("t", ahead, [], now=T0) == []
    assert not driver.schedule_rewind("t", ahead + timedelta(minutes=1), T0), "a stale was"
    assert driver.schedule_read(["t"])["t"].last_fired_at == ahead
    assert driver.schedule_rewind("t", ahead, T0)
    assert driver.schedule_read(["t"])["t"].last_fired_at == T0
    assert not driver.schedule_rewind("t", ahead, T0), "only once"
    assert not driver.schedule_rewind("unknown", ahead, T0)
    # The next occurrence fires again after the rewind.
    assert driver.schedule_fire("t", T0 + timedelta(minutes=1), [], now=T0) == []


def test_times_are_utc(driver: Driver) -> None:
    assert driver.database_now(now=datetime(2026, 1, 1, tzinfo=UTC)).tzinfo is not None
