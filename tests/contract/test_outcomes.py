"""What happens after a claim: complete, fail, snooze, cancel, lease extension, expiry; and
fencing, which makes every one of them a no-op for a lease that is no longer held."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.ids import token, uuid7
from ultimat3.jobs.records import (
    Cancellation,
    ClaimParams,
    Cycle,
    ExpiredQuery,
    Failure,
    Job,
    JobState,
    Lease,
)

from .helpers import (
    LEASE,
    T0,
    assert_utc,
    at,
    claim,
    claim_one,
    complete,
    error,
    expire_and_reclaim,
    fail,
    get,
    insert,
    new_job,
)

# -- complete ----------------------------------------------------------------------------------


def test_complete_finishes_and_clears_the_lease(driver: Driver) -> None:
    insert(driver, new_job(), new_job())
    a, b = claim(driver, at(1), limit=2)
    assert complete(driver, [a.lease, b.lease], now=at(2)) == {a.id, b.id}
    for job_id in (a.id, b.id):
        done = get(driver, job_id)
        assert done.state is JobState.COMPLETED
        assert done.finished_at == at(2)
        assert done.lease_token is None
        assert done.lease_expires_at is None
        assert done.attempt == 1
        assert_utc(done)
    assert complete(driver, [a.lease], now=at(3)) == set(), "completing twice"
    assert get(driver, a.id).finished_at == at(2)


def test_complete_nothing_and_unknown_leases(driver: Driver) -> None:
    assert complete(driver, [], now=T0) == set()
    [job_id] = insert(driver, new_job())
    assert complete(driver, [Lease(job_id, token())], now=T0) == set()
    assert get(driver, job_id).state is JobState.AVAILABLE


def test_an_expired_lease_still_completes_until_someone_else_takes_the_job(
    driver: Driver,
) -> None:
    # Fencing is by token, not by time: the rescuer and a late worker race fairly.
    insert(driver, new_job())
    job = claim_one(driver, at(0), lease_for=timedelta(seconds=10))
    assert complete(driver, [job.lease], now=at(60)) == {job.id}
    assert get(driver, job.id).state is JobState.COMPLETED


# -- fencing -----------------------------------------------------------------------------------


@pytest.fixture
def stale(driver: Driver) -> tuple[Lease, Job]:
    """A lease that expired and whose job was rescued and claimed again by another worker."""
    insert(driver, new_job())
    job = claim_one(driver, at(0), lease_for=timedelta(seconds=10))
    return expire_and_reclaim(driver, job, at(20))


def _unchanged(driver: Driver, current: Job) -> None:
    assert get(driver, current.id) == current


def test_stale_lease_cannot_complete(driver: Driver, stale: tuple[Lease, Job]) -> None:
    lease, current = stale
    assert complete(driver, [lease], now=at(21)) == set()
    _unchanged(driver, current)


def test_stale_lease_cannot_fail(driver: Driver, stale: tuple[Lease, Job]) -> None:
    lease, current = stale
    for retry_in in (None, timedelta(0), timedelta(seconds=78)):
        failure = Failure(lease, error(1, at(21)), retry_in)
        assert driver.job_fail_many([failure], now=at(21)) == set()
    _unchanged(driver, current)


def test_stale_lease_cannot_snooze(driver: Driver, stale: tuple[Lease, Job]) -> None:
    lease, current = stale
    assert driver.job_snooze(lease, timedelta(seconds=78), now=at(21)) is False
    assert driver.job_snooze(lease, None, now=at(21)) is False
    _unchanged(driver, current)


def test_stale_lease_cannot_cancel(driver: Driver, stale: tuple[Lease, Job]) -> None:
    lease, current = stale
    assert driver.job_cancel(Cancellation(current.id, "late", lease=lease), now=at(21)) is False
    _unchanged(driver, current)


def test_stale_lease_cannot_extend(driver: Driver, stale: tuple[Lease, Job]) -> None:
    lease, current = stale
    assert driver.lease_extend([lease], timedelta(hours=1), now=at(21)) == set()
    _unchanged(driver, current)


def test_the_new_lease_is_held(driver: Driver, stale: tuple[Lease, Job]) -> None:
    _, current = stale
    assert current.attempt == 2
    assert complete(driver, [current.lease], now=at(21)) == {current.id}


# -- lease_extend and list_expired -------------------------------------------------------------


def test_lease_extend_pushes_the_expiry_of_held_leases(driver: Driver) -> None:
    insert(driver, new_job(), new_job())
    a, b = claim(driver, at(0), limit=2, lease_for=timedelta(seconds=10))
    assert complete(driver, [b.lease], now=at(1)) == {b.id}
    bogus = Lease(a.id, token())
    held = driver.lease_extend([a.lease, b.lease, bogus], timedelta(seconds=30), now=at(5))
    assert held == {a.id}
    assert get(driver, a.id).lease_expires_at == at(35)
    assert get(driver, a.id).lease_token == a.lease_token
    assert driver.lease_extend([], timedelta(seconds=30), now=at(5)) == set()
    assert driver.job_list_expired(ExpiredQuery(10), now=at(20)) == []


def test_list_expired_only_running_rows_past_expiry_in_order(driver: Driver) -> None:
    insert(driver, *(new_job() for _ in range(5)))
    late = claim_one(driver, at(0), lease_for=timedelta(seconds=30))  # expires at 30
    early = claim_one(driver, at(0), lease_for=timedelta(seconds=10))  # expires at 10
    exact = claim_one(driver, at(0), lease_for=timedelta(seconds=40))  # expires at 40
    fresh = claim_one(driver, at(0), lease_for=timedelta(seconds=90))  # expires at 90
    finished = claim_one(driver, at(0), lease_for=timedelta(seconds=5))
    complete(driver, [finished.lease], now=at(1))

    expired = driver.job_list_expired(ExpiredQuery(10), now=at(40))
    assert [job.id for job in expired] == [early.id, late.id], "expiry equal to now is not past"
    assert all(job.state is JobState.RUNNING for job in expired)
    assert [job.lease_token for job in expired] == [early.lease_token, late.lease_token]
    assert [job.id for job in driver.job_list_expired(ExpiredQuery(1), now=at(40))] == [early.id]
    assert driver.job_list_expired(ExpiredQuery(10), now=at(5)) == []
    assert {job.id for job in driver.job_list_expired(ExpiredQuery(10), now=at(91))} == {
        early.id,
        late.id,
        exact.id,
        fresh.id,
    }


# -- fail --------------------------------------------------------------------------------------


def test_fail_with_future_retry_schedules(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    assert fail(driver, job, at(1), retry_in=timedelta(seconds=30)) == {job.id}
    stored = get(driver, job.id)
    assert (stored.state, stored.run_at, stored.attempt) == (JobState.SCHEDULED, at(31), 1)
    assert stored.lease_token is None
    assert stored.lease_expires_at is None
    assert stored.finished_at is None
    assert claim(driver, at(30)) == []
    assert claim_one(driver, at(31)).attempt == 2


def test_fail_with_due_retry_makes_available(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    assert fail(driver, job, at(5), retry_in=timedelta(0)) == {job.id}
    stored = get(driver, job.id)
    assert (stored.state, stored.run_at) == (JobState.AVAILABLE, at(5))


def test_fail_without_retry_parks_the_job_dead(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    assert fail(driver, job, at(1), retry_in=None) == {job.id}
    stored = get(driver, job.id)
    assert (stored.state, stored.finished_at) == (JobState.DEAD, at(1))
    assert stored.lease_token is None
    assert stored.lease_expires_at is None
    assert claim(driver, at(100)) == []


def test_error_history_accumulates_in_order(driver: Driver) -> None:
    insert(driver, new_job(max_attempts=3))
    expected = []
    for attempt, retry_in in ((1, timedelta(seconds=4)), (2, timedelta(0)), (3, None)):
        job = claim_one(driver, at(10 * attempt))
        assert job.attempt == attempt
        err = error(attempt, at(10 * attempt + 1), message=f"attempt {attempt} failed")
        expected.append(err)
        failure = Failure(job.lease, err, retry_in)
        assert driver.job_fail_many([failure], now=at(10 * attempt + 1)) == {job.id}
        assert get(driver, job.id).errors == tuple(expected)
    final = get(driver, job.id)
    assert (final.state, final.attempt, final.finished_at) == (JobState.DEAD, 3, at(31))
    assert [e.traceback for e in final.errors] == [e.traceback for e in expected]
    assert all(e.at.utcoffset() == timedelta(0) for e in final.errors)


def test_fail_many_reports_only_the_held(driver: Driver) -> None:
    insert(driver, new_job(), new_job())
    a, b = claim(driver, at(0), limit=2)
    bogus = Failure(Lease(b.id, token()), error(1, at(1)), None)
    real = Failure(a.lease, error(1, at(1)), timedelta(seconds=8))
    assert driver.job_fail_many([real, bogus], now=at(1)) == {a.id}
    assert get(driver, b.id) == b
    assert driver.job_fail_many([], now=at(1)) == set()


# -- snooze ------------------------------------------------------------------------------------


def test_snooze_gives_the_attempt_back_and_waits(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    assert driver.job_snooze(job.lease, timedelta(seconds=59), now=at(1)) is True
    stored = get(driver, job.id)
    assert (stored.state, stored.run_at, stored.attempt) == (JobState.SCHEDULED, at(60), 0)
    assert stored.lease_token is None
    assert stored.lease_expires_at is None
    assert driver.job_snooze(job.lease, timedelta(0), now=at(2)) is False, "the lease is gone"
    assert claim(driver, at(59)) == []
    assert claim_one(driver, at(60)).attempt == 1


def test_snooze_to_now_makes_available(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    assert driver.job_snooze(job.lease, timedelta(0), now=at(4)) is True
    stored = get(driver, job.id)
    assert (stored.state, stored.run_at, stored.attempt) == (JobState.AVAILABLE, at(4), 0)


def test_a_release_without_delay_keeps_the_due_time(driver: Driver) -> None:
    """``delay=None``: the job goes back with its stored ``run_at`` (a worker that lacks its
    name gives it back, and the grace for an unknown name counts from it)."""
    insert(driver, new_job(run_at=at(2)), now=at(0))
    job = claim_one(driver, at(5))
    assert driver.job_snooze(job.lease, None, now=at(6)) is True
    stored = get(driver, job.id)
    assert (stored.state, stored.run_at, stored.attempt) == (JobState.AVAILABLE, at(2), 0)
    assert claim_one(driver, at(7)).run_at == at(2)


def test_snooze_keeps_the_error_history(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    fail(driver, job, at(1), retry_in=timedelta(0))
    job = claim_one(driver, at(2))
    assert job.attempt == 2
    driver.job_snooze(job.lease, timedelta(0), now=at(3))
    stored = get(driver, job.id)
    assert stored.attempt == 1
    assert len(stored.errors) == 1


# -- cancel ------------------------------------------------------------------------------------


def _cancelled(driver: Driver, job_id: str, when: int, reason: str) -> None:
    stored = get(driver, job_id)
    assert stored.state is JobState.CANCELLED
    assert stored.cancel_reason == reason
    assert stored.finished_at == at(when)
    assert stored.lease_token is None
    assert stored.lease_expires_at is None


def test_cancel_waiting_jobs(driver: Driver) -> None:
    scheduled, available = new_job(run_at=at(60)), new_job()
    insert(driver, scheduled, available)
    assert driver.job_cancel(Cancellation(scheduled.id, "not needed"), now=at(1)) is True
    assert driver.job_cancel(Cancellation(available.id, "typo"), now=at(2)) is True
    _cancelled(driver, scheduled.id, 1, "not needed")
    _cancelled(driver, available.id, 2, "typo")
    assert claim(driver, at(100)) == []


def test_cancel_a_running_job_without_lease_fences_its_worker(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    assert driver.job_cancel(Cancellation(job.id, "operator"), now=at(1)) is True
    _cancelled(driver, job.id, 1, "operator")
    assert complete(driver, [job.lease], now=at(2)) == set()
    assert driver.lease_extend([job.lease], timedelta(seconds=30), now=at(2)) == set()
    _cancelled(driver, job.id, 1, "operator")


def test_cancel_with_the_held_lease(driver: Driver) -> None:
    insert(driver, new_job(), new_job())
    a, b = claim(driver, at(0), limit=2)
    assert driver.job_cancel(Cancellation(a.id, "handler", lease=b.lease), now=at(1)) is False
    assert driver.job_cancel(Cancellation(a.id, "handler", lease=a.lease), now=at(1)) is True
    _cancelled(driver, a.id, 1, "handler")
    assert get(driver, b.id) == b


def test_cancel_with_a_lease_needs_a_running_job(driver: Driver) -> None:
    insert(driver, new_job())
    job = claim_one(driver, at(0))
    driver.job_snooze(job.lease, timedelta(0), now=at(1))
    assert driver.job_cancel(Cancellation(job.id, "x", lease=job.lease), now=at(2)) is False
    assert get(driver, job.id).state is JobState.AVAILABLE


def test_final_states_cannot_be_cancelled(driver: Driver) -> None:
    insert(driver, new_job(), new_job(), new_job())
    done, dead, cancelled = claim(driver, at(0), limit=3)
    complete(driver, [done.lease], now=at(1))
    fail(driver, dead, at(1), retry_in=None)
    driver.job_cancel(Cancellation(cancelled.id, "first"), now=at(1))
    before = [get(driver, job.id) for job in (done, dead, cancelled)]
    for job in (done, dead, cancelled):
        assert driver.job_cancel(Cancellation(job.id, "again"), now=at(2)) is False
    assert [get(driver, job.id) for job in (done, dead, cancelled)] == before


def test_cancel_is_tenant_scoped(driver: Driver) -> None:
    job = new_job(tenant_id="acme")
    insert(driver, job)
    assert driver.job_cancel(Cancellation(job.id, "x", tenant_id="other"), now=at(1)) is False
    assert driver.job_cancel(Cancellation(job.id, "x", tenant_id=""), now=at(1)) is False
    assert get(driver, job.id).state is JobState.AVAILABLE
    assert driver.job_cancel(Cancellation(job.id, "x", tenant_id="acme"), now=at(1)) is True


def test_cancel_an_unknown_job(driver: Driver) -> None:
    assert driver.job_cancel(Cancellation(uuid7(), "x"), now=at(1)) is False


def test_a_claim_whose_reply_was_lost_is_released_at_once_with_its_attempt_back(
    driver: Driver,
) -> None:
    """A worker's claim committed but its reply was lost (the connection broke): the worker
    never saw those jobs, so it gives that claim back by its token, attempts refunded,
    although the claim marked them started; its other jobs and other workers' stay held."""
    held, lost_a, lost_b, other = (new_job(priority=p) for p in (5, 4, 3, 1))
    insert(driver, held, lost_a, lost_b, other)
    [kept] = claim(driver, at(0), limit=1)
    claim_token = token()
    params = ClaimParams(("default",), 2, LEASE, "worker-1", now=at(1), token=claim_token)
    lost = driver.job_cycle(Cycle(claim=params), now=at(1)).claimed  # the reply never came
    theirs = claim_one(driver, at(2), worker_id="worker-2")
    assert [kept.id, *(j.id for j in lost), theirs.id] == [held.id, lost_a.id, lost_b.id, other.id]
    assert all((j.lease_token or "").startswith(f"{claim_token}.") for j in lost)
    released = driver.job_release_claim(claim_token, now=at(3))
    assert released == sorted([lost_a.id, lost_b.id])
    for job_id in released:
        back = get(driver, job_id)
        assert (back.state, back.attempt, back.lease_token) == (JobState.AVAILABLE, 0, None)
    assert [get(driver, j.id).state for j in (kept, theirs)] == [JobState.RUNNING] * 2
    assert driver.job_release_claim(claim_token, now=at(4)) == []
    late = driver.job_cycle(Cycle(completes=[lost[0].lease]), now=at(5))
    assert late.completed == set(), "the lease is gone"
    again = claim(driver, at(5), limit=5)
    assert sorted(j.id for j in again) == released
    assert all(j.attempt == 1 for j in again)
