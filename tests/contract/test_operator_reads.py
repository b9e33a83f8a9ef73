"""The reads operators make at scale: kept counts (``queue_list``, ``job_count`` by state and
queue) follow every change, and each queue's oldest ready job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import ClaimParams, JobFilter, JobState, Prune

from .helpers import claim_with, complete, new_job

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_oldest_ready_per_queue(driver: Driver) -> None:
    driver.job_insert_many(
        [
            new_job(queue="mail", run_at=T0 - timedelta(minutes=3)),
            new_job(queue="mail", run_at=T0 - timedelta(minutes=1)),
            new_job(queue="mail", run_at=T0 + timedelta(minutes=5)),
            new_job(queue="later", run_at=T0 + timedelta(hours=1)),
        ],
        now=T0 - timedelta(minutes=10),
    )
    found = {q.name: q for q in driver.queue_list(now=T0)}
    assert found["mail"].oldest_ready_at == T0 - timedelta(minutes=3)
    assert found["later"].oldest_ready_at is None  # waiting, but not due
    assert found["later"].counts == {JobState.SCHEDULED: 1}
    later = {q.name: q for q in driver.queue_list(now=T0 + timedelta(hours=2))}
    assert later["later"].oldest_ready_at == T0 + timedelta(hours=1)


def test_kept_counts_follow_claims_completions_and_prunes(driver: Driver) -> None:
    driver.job_insert_many([new_job(queue="q1") for _ in range(5)], now=T0)
    driver.job_insert_many([new_job(queue="q2") for _ in range(2)], now=T0)
    available = JobFilter(states=frozenset({JobState.AVAILABLE}))
    assert driver.job_count(available) == {
        ("q1", JobState.AVAILABLE): 5,
        ("q2", JobState.AVAILABLE): 2,
    }
    claimed = claim_with(driver, ClaimParams(("q1",), 3, timedelta(minutes=1), "w", now=T0))
    assert len(claimed) == 3
    complete(driver, [j.lease for j in claimed[:2]], now=T0)
    counts = driver.job_count(JobFilter(queue="q1"))
    assert {k: n for k, n in counts.items() if n} == {
        ("q1", JobState.AVAILABLE): 2,
        ("q1", JobState.RUNNING): 1,
        ("q1", JobState.COMPLETED): 2,
    }
    pruned = driver.job_prune(Prune(frozenset({JobState.COMPLETED}), T0 + timedelta(days=1), 10))
    assert pruned == 2
    q1 = next(q for q in driver.queue_list(now=T0) if q.name == "q1")
    assert {s: n for s, n in q1.counts.items() if n} == {
        JobState.AVAILABLE: 2,
        JobState.RUNNING: 1,
    }
    # Counts are ints (PostgreSQL's sum of bigints is numeric: a Decimal, unless cast).
    assert {type(n) for n in [*q1.counts.values(), *driver.job_count(available).values()]} == {int}
    # A filter the kept counts cannot answer (a name) still counts the rows.
    assert driver.job_count(JobFilter(name="contract.job", queue="q2")) == {
        ("q2", JobState.AVAILABLE): 2
    }
