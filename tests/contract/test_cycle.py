"""``job_cycle``: a worker's turn in one transaction (complete, fail, claim for free handlers),
each part fenced like its stand-alone counterpart, the claimed jobs marked started."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import ClaimParams, Cycle, ExpiredQuery, Failure, JobState

from .helpers import LEASE, at, claim, error, expire_and_reclaim, get, insert, new_job


def _params(limit: int, now: datetime | None = None, *, isolated: bool = False) -> ClaimParams:
    return ClaimParams(
        queues=("default",),
        limit=limit,
        lease_for=LEASE,
        worker_id="cycle",
        now=now,
        isolated=isolated,
    )


def test_a_cycle_settles_and_claims_in_one_turn(driver: Driver) -> None:
    first = insert(driver, new_job(), new_job())
    later = insert(driver, new_job(), new_job(), new_job())
    done, failing = claim(driver, at(1), limit=2)
    assert {done.id, failing.id} == set(first)
    result = driver.job_cycle(
        Cycle(
            completes=[done.lease],
            failures=[Failure(failing.lease, error(1, at(2)), retry_in=timedelta(seconds=58))],
            claim=_params(2, now=at(2)),
        ),
        now=at(2),
    )
    assert (result.completed, result.failed) == ({done.id}, {failing.id})
    assert [job.id for job in result.claimed] == later[:2], "in claim order"
    assert get(driver, done.id).state is JobState.COMPLETED
    assert get(driver, failing.id).state is JobState.SCHEDULED
    for job in result.claimed:
        assert (job.state, job.attempt, job.worker_id) == (JobState.RUNNING, 1, "cycle")
        assert job.lease_token and job.lease_expires_at == at(2) + LEASE
    assert get(driver, later[2]).state is JobState.AVAILABLE


def test_jobs_claimed_by_a_cycle_are_started(driver: Driver) -> None:
    """A cycle claims for handlers that are free now: its jobs count as started, so a worker
    that dies under them has them rescued as lost (listed expired once the lease ends)."""
    [by_cycle] = insert(driver, new_job())
    [cycled] = driver.job_cycle(Cycle(claim=_params(1, now=at(1))), now=at(1)).claimed
    assert cycled.id == by_cycle
    assert driver.job_list_expired(ExpiredQuery(10), now=at(1) + LEASE) == []
    after = at(1) + LEASE + timedelta(seconds=1)
    assert [job.id for job in driver.job_list_expired(ExpiredQuery(10), now=after)] == [by_cycle]


def test_each_write_of_a_cycle_is_fenced(driver: Driver) -> None:
    insert(driver, new_job(), new_job())
    [a] = claim(driver, at(1), limit=1)
    [b] = claim(driver, at(30), limit=1)
    stale_a, again_a = expire_and_reclaim(driver, a, at(1) + LEASE + timedelta(seconds=1))
    now = at(1) + LEASE + timedelta(seconds=2)
    result = driver.job_cycle(
        Cycle(
            completes=[stale_a, b.lease],
            failures=[Failure(stale_a, error(1, now), retry_in=None)],
        ),
        now=now,
    )
    assert (result.completed, result.failed, result.claimed) == ({b.id}, set(), [])
    assert get(driver, a.id).lease_token == again_a.lease_token, "the new holder keeps it"


def test_a_cycle_with_nothing_to_do_changes_nothing(driver: Driver) -> None:
    [waiting] = insert(driver, new_job())
    for cycle in (Cycle(), Cycle(claim=_params(0)), Cycle(claim=None)):
        result = driver.job_cycle(cycle, now=at(1))
        assert (result.completed, result.failed, result.claimed) == (set(), set(), [])
    assert get(driver, waiting).state is JobState.AVAILABLE


def test_a_cycle_claims_isolated_jobs_only_when_asked(driver: Driver) -> None:
    [job_id] = insert(driver, new_job())
    [job] = claim(driver, at(1), limit=1)
    isolate = Failure(job.lease, error(1, at(2)), retry_in=timedelta(0), isolate=True)
    result = driver.job_cycle(Cycle(failures=[isolate], claim=_params(5, now=at(3))), now=at(2))
    assert (result.failed, result.claimed) == ({job_id}, []), "not claimed with the others"
    alone = driver.job_cycle(Cycle(claim=_params(1, now=at(3), isolated=True)), now=at(3))
    assert [j.id for j in alone.claimed] == [job_id]
    assert alone.claimed[0].attempt == 2


def test_a_rescue_beside_others_gives_the_attempt_back_and_one_alone_keeps_it(
    driver: Driver,
) -> None:
    """``job_list_expired(isolated=...)`` tells a job claimed alone from one claimed beside
    others, and ``Failure.refund`` gives the attempt back: a crash beside other jobs costs
    nothing, a crash alone counts (the rescuer's two cases, ``maintenance.Maintenance``)."""
    [job_id, other] = insert(driver, new_job(), new_job())
    first, beside = claim(driver, at(1), limit=2)
    assert {first.id, beside.id} == {job_id, other}
    late = at(1) + LEASE + timedelta(seconds=1)
    assert driver.job_list_expired(ExpiredQuery(10, isolated=True), now=late) == []
    expired = driver.job_list_expired(ExpiredQuery(10, isolated=False), now=late)
    assert {j.id for j in expired} == {job_id, other}
    assert {j.id for j in driver.job_list_expired(ExpiredQuery(10), now=late)} == {job_id, other}
    refund = Failure(first.lease, error(1, late), retry_in=timedelta(0), isolate=True, refund=True)
    assert driver.job_fail_many([refund], now=late) == {first.id}
    back = get(driver, first.id)
    assert (back.state, back.attempt, [e.kind for e in back.errors]) == (
        JobState.AVAILABLE,
        0,
        ["ValueError"],
    )
    assert driver.job_fail_many([refund], now=late) == set(), "fenced: once only"
    alone = driver.job_cycle(Cycle(claim=_params(1, now=late, isolated=True)), now=late)
    [again] = alone.claimed
    assert (again.id, again.attempt) == (first.id, 1)
    later = late + LEASE + timedelta(seconds=1)
    assert [j.id for j in driver.job_list_expired(ExpiredQuery(10, isolated=True), now=later)] == [
        first.id
    ]
    assert {j.id for j in driver.job_list_expired(ExpiredQuery(10, isolated=False), now=later)} == {
        beside.id
    }
    charged = Failure(again.lease, error(1, later), retry_in=timedelta(0), isolate=True)
    assert driver.job_fail_many([charged], now=later) == {first.id}
    assert get(driver, first.id).attempt == 1, "a crash alone keeps its attempt"


def test_a_claim_passes_over_the_names_it_skips(driver: Driver) -> None:
    """``ClaimParams.skip``: a worker that lacks a job's name leaves it for a worker that knows
    it (a rolling deploy), by every claim of unlimited jobs: one queue or several, in a cycle or
    not, ordinary or isolated; an empty skip claims as before."""
    unknown, known, other_queue = (
        new_job(name="new.job", priority=9),
        new_job(name="old.job"),
        new_job(name="new.job", queue="other"),
    )
    insert(driver, unknown, known, other_queue)
    base = _params(5, now=at(1))
    skip = ("new.job", "gone.job")
    one = driver.job_cycle(Cycle(claim=replace(base, skip=skip)), now=at(1)).claimed
    assert [j.id for j in one] == [known.id]
    several = replace(base, queues=("default", "other"), skip=skip)
    assert driver.job_cycle(Cycle(claim=several), now=at(1)).claimed == []
    alone = driver.job_cycle(Cycle(claim=replace(base, isolated=True, skip=skip)), now=at(1))
    assert alone.claimed == []
    everything = driver.job_cycle(Cycle(claim=replace(base, queues=("default", "other"))))
    assert {j.id for j in everything.claimed} == {unknown.id, other_queue.id}
