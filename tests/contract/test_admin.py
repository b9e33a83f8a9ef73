"""Operator actions: ``job_retry`` and ``job_discard`` (parked jobs only, tenant scoped) and
``job_prune`` (final states, by finish time, bounded)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import (
    Cancellation,
    ExpiredQuery,
    Fire,
    InsertResult,
    Job,
    JobState,
    Prune,
    Rewind,
)

from .helpers import T0, at, claim, claim_one, complete, fail, get, insert, new_job


@pytest.fixture
def parked(driver: Driver) -> dict[str, Job]:
    """One job in each state; the dead one exhausted its 2 attempts; tenants set per job."""
    jobs = {
        "dead": new_job(max_attempts=2, tenant_id="acme", priority=9),
        "cancelled": new_job(tenant_id="acme"),
        "completed": new_job(priority=5),
        "running": new_job(priority=1),
        "available": new_job(priority=-1),
        "scheduled": new_job(run_at=at(3600)),
    }
    insert(driver, *jobs.values())
    dead = claim_one(driver, at(1))
    fail(driver, dead, at(2), retry_in=timedelta(0))
    dead = claim_one(driver, at(3))
    fail(driver, dead, at(4), retry_in=None)
    completed = claim_one(driver, at(5))
    complete(driver, [completed.lease], now=at(6))
    claim_one(driver, at(7))
    driver.job_cancel(Cancellation(jobs["cancelled"].id, "mistake"), now=at(8))
    stored = {name: get(driver, job.id) for name, job in jobs.items()}
    assert {name: job.state.value for name, job in stored.items()} == {n: n for n in jobs}
    return stored


def test_retry_revives_dead_and_cancelled_jobs(driver: Driver, parked: dict[str, Job]) -> None:
    dead, cancelled = parked["dead"], parked["cancelled"]
    assert (dead.attempt, dead.max_attempts, len(dead.errors)) == (2, 2, 2)
    changed = driver.job_retry([dead.id, cancelled.id], now=at(100))
    assert sorted(changed) == sorted([dead.id, cancelled.id])

    revived = get(driver, dead.id)
    assert (revived.state, revived.run_at, revived.finished_at) == (
        JobState.AVAILABLE,
        at(100),
        None,
    )
    assert (revived.attempt, revived.max_attempts) == (2, 3), "one more attempt when exhausted"
    assert revived.errors == dead.errors, "history kept"
    again = get(driver, cancelled.id)
    assert (again.state, again.run_at, again.finished_at) == (JobState.AVAILABLE, at(100), None)
    assert (again.attempt, again.max_attempts) == (0, 3), "not exhausted: unchanged"

    claimed = claim(driver, at(100), limit=10)
    assert {job.id for job in claimed} == {dead.id, cancelled.id, parked["available"].id}
    assert {job.id: job.attempt for job in claimed}[dead.id] == 3


def test_retry_ignores_other_states_and_unknown_ids(driver: Driver, parked: dict[str, Job]) -> None:
    others = ["completed", "running", "available", "scheduled"]
    assert driver.job_retry([parked[n].id for n in others] + [uuid7()], now=at(100)) == []
    assert {n: get(driver, parked[n].id) for n in others} == {n: parked[n] for n in others}
    assert driver.job_retry([], now=at(100)) == []


def test_retry_is_tenant_scoped(driver: Driver, parked: dict[str, Job]) -> None:
    dead = parked["dead"]
    assert driver.job_retry([dead.id], tenant_id="other", now=at(100)) == []
    assert driver.job_retry([dead.id], tenant_id="", now=at(100)) == []
    assert get(driver, dead.id) == dead
    assert driver.job_retry([dead.id], tenant_id="acme", now=at(100)) == [dead.id]


def test_discard_deletes_parked_jobs_only(driver: Driver, parked: dict[str, Job]) -> None:
    ids = {name: job.id for name, job in parked.items()}
    deleted = driver.job_discard([*ids.values(), uuid7()])
    assert sorted(deleted) == sorted([ids["dead"], ids["cancelled"]])
    assert driver.job_get(ids["dead"]) is None
    assert driver.job_get(ids["cancelled"]) is None
    for name in ("completed", "running", "available", "scheduled"):
        assert get(driver, ids[name]) == parked[name]
    assert driver.job_discard([]) == []


def test_discard_is_tenant_scoped_and_frees_the_key(driver: Driver, parked: dict[str, Job]) -> None:
    dead = parked["dead"]
    assert driver.job_discard([dead.id], tenant_id="other") == []
    assert get(driver, dead.id) == dead
    assert driver.job_discard([dead.id], tenant_id="acme") == [dead.id]
    again = new_job(key=dead.idempotency_key, tenant_id="acme")
    assert driver.job_insert_many([again], now=at(200)) == [InsertResult(again.id, False)]


def _finish(driver: Driver, how: str, when: float) -> str:
    [job_id] = insert(driver, new_job(queue=f"prune-{how}"), now=T0)
    if how == "cancelled":
        assert driver.job_cancel(Cancellation(job_id, "x"), now=at(when))
        return job_id
    [job] = claim(driver, T0, queues=[f"prune-{how}"])
    if how == "completed":
        assert complete(driver, [job.lease], now=at(when))
    else:
        assert fail(driver, job, at(when), retry_in=None)
    return job_id


def test_prune_by_state_and_finish_time(driver: Driver) -> None:
    c1, c2, c3 = (_finish(driver, "completed", n) for n in (10, 20, 30))
    dead, cancelled = _finish(driver, "dead", 10), _finish(driver, "cancelled", 10)
    active = insert(driver, new_job(), new_job(run_at=at(5)), now=T0)

    completed_only = frozenset({JobState.COMPLETED})
    assert driver.job_prune(Prune(completed_only, at(30), 100)) == 2
    assert driver.job_get(c1) is None
    assert driver.job_get(c2) is None
    assert get(driver, c3).state is JobState.COMPLETED, "finished exactly at the cutoff"
    assert get(driver, dead).state is JobState.DEAD
    assert get(driver, cancelled).state is JobState.CANCELLED

    everything = frozenset(JobState)
    assert driver.job_prune(Prune(everything, at(10), 100)) == 0
    assert driver.job_prune(Prune(everything, at(999), 2)) == 2
    assert driver.job_prune(Prune(everything, at(999), 2)) == 1
    assert driver.job_prune(Prune(everything, at(999), 2)) == 0
    assert [driver.job_get(job_id) for job_id in (c3, dead, cancelled)] == [None, None, None]
    assert [get(driver, job_id).id for job_id in active] == active, "active jobs are never pruned"


def test_the_seam_records_check_their_arguments_once_for_every_driver(driver: Driver) -> None:
    """The records carry what every driver checked for itself: naive times are refused, a
    negative limit reads as none, a prune keeps to the final states, and a cancel through
    another job's lease matches nothing."""
    naive = at(10).replace(tzinfo=None)
    for build in (
        lambda: Prune(frozenset({JobState.COMPLETED}), naive, 10),
        lambda: Fire("t", naive),
        lambda: Rewind("t", naive, T0),
    ):
        with pytest.raises(ValueError, match="naive"):
            build()
    done = _finish(driver, "completed", 10)
    assert ExpiredQuery(-1).limit == 0 and driver.job_list_expired(ExpiredQuery(-1)) == []
    assert Prune(frozenset(JobState), at(999), -5).empty
    assert driver.job_prune(Prune(frozenset(JobState), at(999), -5)) == 0
    active = frozenset({JobState.RUNNING, JobState.AVAILABLE, JobState.SCHEDULED})
    assert Prune(active, at(999), 10).empty and driver.job_prune(Prune(active, at(999), 10)) == 0
    assert get(driver, done).state is JobState.COMPLETED
    insert(driver, new_job(), new_job(), now=T0)
    [a, b] = claim(driver, T0, limit=2)
    stray = Cancellation(a.id, "x", lease=b.lease)
    assert stray.stray and driver.job_cancel(stray, now=at(1)) is False
    assert get(driver, a.id).state is JobState.RUNNING
