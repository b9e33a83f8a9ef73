"""The clock a database's decisions use (``database_now``), the due times it computes from a
delay on that clock (a retry, a snooze), and the scheduler's repair of a last-fired time in
the future (``schedule_rewind``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ultimat3.jobs.clock import SystemClock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import ClaimParams, Cycle, Failure, Fire, Job, JobState, Rewind

from .helpers import LEASE, T0, error, get, insert, new_job

PAST = datetime(2020, 1, 1, tzinfo=UTC)
DELAY = timedelta(seconds=2)


def _claimed_on_the_databases_clock(driver: Driver) -> Job:
    insert(driver, new_job(run_at=PAST), now=PAST)
    [job] = driver.job_cycle(Cycle(claim=ClaimParams(("default",), 1, LEASE, "w"))).claimed
    return job


@pytest.mark.parametrize("how", ["fail_many", "cycle"])
def test_a_retry_is_due_its_delay_after_the_databases_clock(driver: Driver, how: str) -> None:
    """``now=None``: the driver adds ``Failure.retry_in`` to the database's own clock
    (PostgreSQL's ``now()``), so a worker whose clock is off cannot move a retry."""
    job = _claimed_on_the_databases_clock(driver)
    failure = Failure(job.lease, error(1, PAST), DELAY)
    before = driver.database_now()
    if how == "fail_many":
        assert driver.job_fail_many([failure]) == {job.id}
    else:
        assert driver.job_cycle(Cycle(failures=[failure])).failed == {job.id}
    after = driver.database_now()
    stored = get(driver, job.id)
    assert stored.state is JobState.SCHEDULED
    assert before + DELAY <= stored.run_at <= after + DELAY


def test_a_snooze_is_due_its_delay_after_the_databases_clock(driver: Driver) -> None:
    job = _claimed_on_the_databases_clock(driver)
    before = driver.database_now()
    assert driver.job_snooze(job.lease, DELAY)
    after = driver.database_now()
    stored = get(driver, job.id)
    assert (stored.state, stored.attempt) == (JobState.SCHEDULED, 0)
    assert before + DELAY <= stored.run_at <= after + DELAY


def test_a_pinned_now_is_the_time_a_delay_counts_from(driver: Driver) -> None:
    """A fake clock's time (``Clock.pinned()``) stands for the database's: tests keep it."""
    insert(driver, new_job(run_at=T0), new_job(run_at=T0))
    a, b = driver.job_cycle(
        Cycle(claim=ClaimParams(("default",), 2, LEASE, "w", now=T0)), now=T0
    ).claimed
    assert driver.job_fail_many([Failure(a.lease, error(1, T0), DELAY)], now=T0) == {a.id}
    assert driver.job_snooze(b.lease, DELAY, now=T0)
    assert get(driver, a.id).run_at == get(driver, b.id).run_at == T0 + DELAY


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
    assert driver.schedule_fire(Fire("t", ahead), now=T0) == []
    assert not driver.schedule_rewind(Rewind("t", ahead + timedelta(minutes=1), T0)), "a stale was"
    assert driver.schedule_read(["t"])["t"].last_fired_at == ahead
    assert driver.schedule_rewind(Rewind("t", ahead, T0))
    assert driver.schedule_read(["t"])["t"].last_fired_at == T0
    assert not driver.schedule_rewind(Rewind("t", ahead, T0)), "only once"
    assert not driver.schedule_rewind(Rewind("unknown", ahead, T0))
    # The next occurrence fires again after the rewind.
    assert driver.schedule_fire(Fire("t", T0 + timedelta(minutes=1)), now=T0) == []


def test_times_are_utc(driver: Driver) -> None:
    assert driver.database_now(now=datetime(2026, 1, 1, tzinfo=UTC)).tzinfo is not None
