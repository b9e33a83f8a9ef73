"""``job_claim``: which jobs, in which order, and what a claim writes."""

from __future__ import annotations

from datetime import timedelta

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import JobState

from .helpers import T0, assert_utc, at, claim, claim_one, fail, get, insert, new_job


def test_claim_writes_state_attempt_lease_and_worker(driver: Driver) -> None:
    [job_id] = insert(driver, new_job())
    [job] = claim(driver, at(10), lease_for=timedelta(seconds=45), worker_id="host-1:123")
    assert job.id == job_id
    assert job.state is JobState.RUNNING
    assert job.attempt == 1
    assert job.attempted_at == at(10)
    assert job.lease_token
    assert job.lease_expires_at == at(55)
    assert job.worker_id == "host-1:123"
    assert_utc(job)
    assert get(driver, job_id) == job, "the returned record is what is stored"


def test_limit_and_no_job_is_claimed_twice(driver: Driver) -> None:
    ids = insert(driver, *(new_job() for _ in range(5)))
    first = claim(driver, at(1), limit=2)
    second = claim(driver, at(1), limit=2)
    third = claim(driver, at(1), limit=2)
    assert [len(first), len(second), len(third)] == [2, 2, 1]
    claimed = [job.id for job in first + second + third]
    assert sorted(claimed) == sorted(ids)
    assert claim(driver, at(1), limit=2) == []
    assert claim(driver, at(1000), limit=2) == [], "running jobs are not claimed again"


def test_zero_limit_and_no_queues_claim_nothing(driver: Driver) -> None:
    insert(driver, new_job())
    assert claim(driver, at(1), limit=0) == []
    assert claim(driver, at(1), queues=()) == []
    assert get(driver, claim(driver, at(1))[0].id).state is JobState.RUNNING


def test_only_the_named_queues(driver: Driver) -> None:
    a, b, c = new_job(queue="a"), new_job(queue="b"), new_job(queue="c")
    insert(driver, a, b, c)
    claimed = claim(driver, at(1), queues=["a", "c", "missing"])
    assert sorted(job.id for job in claimed) == sorted([a.id, c.id])
    assert get(driver, b.id).state is JobState.AVAILABLE


def test_paused_queues_are_skipped(driver: Driver) -> None:
    a, b = new_job(queue="a"), new_job(queue="b")
    insert(driver, a, b)
    driver.queue_set_paused("a", True)
    assert [job.id for job in claim(driver, at(1), queues=["a", "b"])] == [b.id]
    assert claim(driver, at(2), queues=["a", "b"]) == []
    driver.queue_set_paused("a", False)
    assert [job.id for job in claim(driver, at(3), queues=["a", "b"])] == [a.id]


def test_order_is_priority_then_run_at_then_id(driver: Driver) -> None:
    ids = sorted(uuid7() for _ in range(3))  # uuid7 text sorts by creation
    jobs = [
        new_job(priority=0, run_at=at(-30)),
        new_job(priority=10, run_at=at(-1)),
        new_job(priority=-5, run_at=at(-100)),
        new_job(priority=5, run_at=at(-10)),
        new_job(priority=5, run_at=at(-20)),
        # Same priority and run_at: the smaller id first, whatever the insertion order.
        new_job(priority=1, run_at=at(-5), job_id=ids[2]),
        new_job(priority=1, run_at=at(-5), job_id=ids[0]),
        new_job(priority=1, run_at=at(-5), job_id=ids[1]),
    ]
    insert(driver, *jobs)
    order = [claim_one(driver, T0).id for _ in jobs]
    expected = [jobs[1], jobs[4], jobs[3], jobs[6], jobs[7], jobs[5], jobs[0], jobs[2]]
    assert order == [job.id for job in expected]


def test_a_batch_claim_takes_the_best_jobs(driver: Driver) -> None:
    low = [new_job(priority=0) for _ in range(3)]
    high = [new_job(priority=3) for _ in range(2)]
    insert(driver, *low, *high)
    claimed = claim(driver, at(1), limit=3)
    assert {job.id for job in high} < {job.id for job in claimed}


def test_future_jobs_wait_until_due(driver: Driver) -> None:
    job = new_job(run_at=at(60))
    insert(driver, job)
    assert claim(driver, T0) == []
    assert claim(driver, at(59)) == []
    assert get(driver, job.id).state is JobState.SCHEDULED
    [claimed] = claim(driver, at(60))
    assert (claimed.id, claimed.state, claimed.attempt) == (job.id, JobState.RUNNING, 1)


def test_each_claim_counts_an_attempt_and_issues_a_new_token(driver: Driver) -> None:
    insert(driver, new_job())
    first = claim_one(driver, at(1))
    assert fail(driver, first, at(2), retry_in=timedelta(0)) == {first.id}
    second = claim_one(driver, at(3))
    assert second.id == first.id
    assert second.attempt == 2
    assert second.lease_token != first.lease_token
    assert second.attempted_at == at(3)
