"""Concurrency limits in the claim (``ultimat3.jobs.limits``): at most ``limit_max`` running
jobs per ``limit_key``, counted by the database in the claim's transaction."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import timedelta

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.limits import KEYS_PER_CLAIM, NO_LIMIT
from ultimat3.jobs.records import ClaimParams, Cycle, CycleResult, Job, JobState, NewJob

from .helpers import LEASE, at, claim_with, complete, fail, get, insert, max_overlap, new_job


def limited(key: str, most: int, **options: object) -> NewJob:
    return new_job(**options)._replace(limit_key=key, limit_max=most)  # type: ignore[arg-type]


def claim_limited(
    driver: Driver, seconds: float, *, limit: int = 10, queues: tuple[str, ...] = ("default",)
) -> list[Job]:
    params = ClaimParams(
        queues=queues,
        limit=limit,
        lease_for=LEASE,
        worker_id="w",
        now=at(seconds),
        limited=True,
    )
    return driver.job_cycle(Cycle(claim=params), now=at(seconds)).claimed


def keys_of(jobs: list[Job], stored: dict[str, str]) -> Counter[str]:
    return Counter(stored[job.id] for job in jobs)


def test_an_unlimited_claim_leaves_limited_jobs_alone(driver: Driver) -> None:
    [free] = insert(driver, new_job())
    insert(driver, limited("job:x", 5))
    params = ClaimParams(queues=("default",), limit=10, lease_for=LEASE, worker_id="w", now=at(1))
    assert [job.id for job in driver.job_cycle(Cycle(claim=params), now=at(1)).claimed] == [free]


def test_at_most_max_running_per_key(driver: Driver) -> None:
    a = [limited("acct=a", 2) for _ in range(5)]
    b = [limited("acct=b", 1) for _ in range(3)]
    plain = [new_job() for _ in range(2)]
    insert(driver, *a, *b, *plain)
    stored = {job.id: job.limit_key or "" for job in a + b + plain}
    first = claim_limited(driver, 1)
    assert keys_of(first, stored) == Counter({"acct=a": 2, "acct=b": 1, "": 2})
    assert claim_limited(driver, 2) == [], "every key is full, nothing else is due"
    done = next(job for job in first if stored[job.id] == "acct=a")
    assert complete(driver, [done.lease], now=at(3)) == {done.id}
    again = claim_limited(driver, 4)
    assert keys_of(again, stored) == Counter({"acct=a": 1}), "one slot freed, one job claimed"


def test_claim_order_holds_across_limited_and_unlimited_jobs(driver: Driver) -> None:
    low = new_job(priority=0)
    high = limited("k", 1, priority=5)
    second = limited("k", 1, priority=9)  # same key: only one of the two may run
    insert(driver, low, high, second)
    got = claim_limited(driver, 1, limit=2)
    assert [job.id for job in got] == [second.id, low.id]


def test_an_expired_lease_frees_its_slot(driver: Driver) -> None:
    jobs = [limited("k", 1) for _ in range(2)]
    insert(driver, *jobs)
    [held] = claim_limited(driver, 1)
    assert claim_limited(driver, 2) == []
    # The lease (30 s) ran out and no rescue has happened yet: the slot is free.
    [other] = claim_limited(driver, 1 + LEASE.total_seconds() + 1)
    assert other.id != held.id
    assert get(driver, held.id).state is JobState.RUNNING


def test_a_rescue_or_failure_frees_its_slot(driver: Driver) -> None:
    jobs = [limited("k", 1) for _ in range(2)]
    insert(driver, *jobs)
    [held] = claim_limited(driver, 1)
    assert fail(driver, held, at(2), retry_in=timedelta(seconds=98)) == {held.id}
    [other] = claim_limited(driver, 3)
    assert other.id != held.id


def test_a_full_key_does_not_hide_the_keys_behind_it(driver: Driver) -> None:
    count = KEYS_PER_CLAIM + 8
    jobs = [limited(f"k{n:03}", 1) for n in range(count) for _ in range(2)]
    insert(driver, *jobs)
    stored = {job.id: job.limit_key or "" for job in jobs}
    got = claim_limited(driver, 1, limit=100)
    got += claim_limited(driver, 2, limit=100)
    assert keys_of(got, stored) == Counter({f"k{n:03}": 1 for n in range(count)})


def test_limits_span_queues_and_paused_queues_stay_paused(driver: Driver) -> None:
    a = limited("shared", 1, queue="a")
    b = limited("shared", 1, queue="b")
    insert(driver, a, b)
    driver.queue_set_paused("a", True)
    [got] = claim_limited(driver, 1, queues=("a", "b"))
    assert got.id == b.id
    driver.queue_set_paused("a", False)
    assert claim_limited(driver, 2, queues=("a", "b")) == [], "the key is full across queues"


def test_eight_threads_never_exceed_the_limit(driver: Driver) -> None:
    """Claims racing from eight threads: the ledger of (start, end) per job says how many of a
    key ran at once, whatever the driver's own counts say."""
    most = 2
    jobs = [limited(f"acct={n % 2}", most) for n in range(160)]
    insert(driver, *jobs)
    stored = {job.id: job.limit_key or "" for job in jobs}
    ledger: list[tuple[str, float, float]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            idle = 0
            while idle < 50:
                got = claim_limited(driver, 1, limit=1)
                if not got:
                    idle += 1
                    time.sleep(0.002)
                    continue
                idle = 0
                started = time.monotonic()
                time.sleep(0.001)
                ended = time.monotonic()  # before the completion commits: the slot is held
                complete(driver, [job.lease for job in got], now=at(1))
                with lock:
                    ledger.extend((stored[job.id], started, ended) for job in got)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len(ledger) == 160, "every job ran once"
    for key in {k for k, _, _ in ledger}:
        assert max_overlap([(s, e) for k, s, e in ledger if k == key]) <= most, key


def test_max_overlap_counts_what_it_should() -> None:
    assert max_overlap([(0, 1), (2, 3)]) == 1
    assert max_overlap([(0, 2), (1, 3), (1.5, 1.6)]) == 3
    assert max_overlap([(0, 1), (1, 2)]) == 1, "an end before a start at the same instant"


def test_a_lease_for_longer_than_the_claim_is_still_counted(driver: Driver) -> None:
    insert(driver, limited("k", 1), limited("k", 1))
    params = ClaimParams(
        queues=("default",),
        limit=5,
        lease_for=timedelta(hours=1),
        worker_id="w",
        now=at(1),
        limited=True,
    )
    assert len(claim_with(driver, params)) == 1
    assert claim_with(driver, replace(params, now=at(600))) == []


def rated(key: str, most: int, per_seconds: float, **options: object) -> NewJob:
    return new_job(**options)._replace(  # type: ignore[arg-type]
        limit_key=key,
        limit_max=NO_LIMIT,
        rate_max=most,
        rate_period=timedelta(seconds=per_seconds),
    )


def cycle_limited(driver: Driver, seconds: float, limit: int = 10) -> CycleResult:
    params = ClaimParams(
        queues=("default",),
        limit=limit,
        lease_for=LEASE,
        worker_id="w",
        now=at(seconds),
        limited=True,
    )
    return driver.job_cycle(Cycle(claim=params), now=at(seconds))


def test_a_rate_limit_counts_starts_in_a_sliding_window(driver: Driver) -> None:
    jobs = [rated("api", 3, 10) for _ in range(8)]
    insert(driver, *jobs)
    first = cycle_limited(driver, 1)
    assert len(first.claimed) == 3
    assert first.wake_in is None or first.wake_in == timedelta(seconds=10)
    for job in first.claimed:
        complete(driver, [job.lease], now=at(2))
    held = cycle_limited(driver, 5)
    assert held.claimed == [], "completed jobs still count: they started in the window"
    assert held.wake_in == timedelta(seconds=6), (
        "the window reopens when its oldest start leaves it"
    )
    assert cycle_limited(driver, 10.5).claimed == []
    assert len(cycle_limited(driver, 11.5).claimed) == 3
    [job] = cycle_limited(driver, 30, limit=1).claimed
    assert job.attempt == 1, "no attempt was spent waiting"


def test_a_rate_and_a_concurrency_limit_together(driver: Driver) -> None:
    both = [rated("k", 2, 60)._replace(limit_max=1) for _ in range(4)]
    insert(driver, *both)
    [job] = cycle_limited(driver, 1).claimed
    blocked = cycle_limited(driver, 2)
    assert blocked.claimed == [] and blocked.wake_in is None, "held by concurrency, not rate"
    complete(driver, [job.lease], now=at(3))
    [second] = cycle_limited(driver, 4).claimed
    complete(driver, [second.lease], now=at(5))
    held = cycle_limited(driver, 6)
    assert held.claimed == [] and held.wake_in == timedelta(seconds=55)


@pytest.mark.parametrize("batch", [1, 4])
def test_keys_take_turns_so_a_backlog_cannot_starve_a_small_tenant(
    driver: Driver, batch: int
) -> None:
    """Fairness, measured as the claim position of the small tenant's jobs: 300 jobs of a big
    tenant enqueued first, then 10 of a small one, both under a limit that never binds."""
    big = [limited("job:x=big", NO_LIMIT) for _ in range(300)]
    small = [limited("job:x=small", NO_LIMIT) for _ in range(10)]
    insert(driver, *big)
    insert(driver, *small, now=at(1))
    small_ids = {job.id for job in small}
    claimed = 0
    positions: list[int] = []  # the claim position of each small job (its batch's first)
    while claimed < 40:
        got = claim_limited(driver, 2, limit=batch)
        assert got, "jobs are due"
        positions += [claimed + 1 for job in got if job.id in small_ids]
        claimed += len(got)
        complete(driver, [job.lease for job in got], now=at(2))
    assert len(positions) == 10, positions
    # Two keys take turns, a claim (of `batch`) at a time: the small tenant's j-th job is
    # claimed by the time 2j + batch jobs are (D keys: D*j + (D-1)*batch).
    assert all(p <= 2 * j + batch for j, p in enumerate(positions, start=1)), positions


def test_job_flow_says_why_a_job_waits(driver: Driver) -> None:
    held, waiting = limited("acct=42", 1), limited("acct=42", 1)
    plain = new_job()
    insert(driver, held, waiting, plain)
    assert driver.job_flow(plain.id, now=at(1)) is None
    assert driver.job_flow("no-such-job", now=at(1)) is None
    free = driver.job_flow(waiting.id, now=at(1))
    assert free is not None and (free.running, free.why_waiting()) == (0, None)
    assert len(claim_limited(driver, 1, limit=2)) == 2, "the plain job and one of acct=42"
    full = driver.job_flow(waiting.id, now=at(2))
    assert full is not None
    assert full.why_waiting() == "concurrency 1/1 on acct=42"
    rate = [rated("api", 2, 10) for _ in range(3)]
    insert(driver, *rate)
    cycle_limited(driver, 3)
    state = driver.job_flow(rate[2].id, now=at(4))
    assert state is not None and (state.starts, state.reopens_at) == (2, at(13))
    assert state.why_waiting() == (
        f"rate-limited until {at(13):%H:%M:%S} UTC (2/2 starts in 0:00:10 on api)"
    )


def test_a_limited_claim_passes_over_the_names_it_skips(driver: Driver) -> None:
    """``ClaimParams.skip`` holds for jobs with a limit and for the unlimited jobs a limited
    claim takes beside them: a worker that lacks a name never claims it in a loop."""
    new_limited = limited("acct=a", 5, name="new.job", priority=9)
    new_plain = new_job(name="new.job", priority=9)
    old_limited, old_plain = limited("acct=a", 5, name="old.job"), new_job(name="old.job")
    insert(driver, new_limited, new_plain, old_limited, old_plain)
    params = ClaimParams(
        queues=("default",),
        limit=10,
        lease_for=LEASE,
        worker_id="w",
        now=at(1),
        limited=True,
        skip=("new.job",),
    )
    claimed = driver.job_cycle(Cycle(claim=params), now=at(1)).claimed
    assert {job.id for job in claimed} == {old_limited.id, old_plain.id}
    rest = claim_limited(driver, 2)
    assert {job.id for job in rest} == {new_limited.id, new_plain.id}
