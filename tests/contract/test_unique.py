"""Uniqueness windows (``ultimat3.jobs.limits.Unique``): one job per unique key while it is in
the key's states, enforced by the database's unique partial index, with ``replace`` (debounce)
as the other answer to a conflict."""

from __future__ import annotations

import threading
from collections import Counter

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.limits import STATE_BITS
from ultimat3.jobs.records import InsertResult, JobFilter, JobState, NewJob

from .helpers import T0, at, claim_one, complete, get, new_job

WAITING_OR_RUNNING = STATE_BITS["scheduled"] | STATE_BITS["available"] | STATE_BITS["running"]


def unique(
    unique_key: str, states: int = WAITING_OR_RUNNING, *, debounce: bool = False, **options: object
) -> NewJob:
    return new_job(**options)._replace(  # type: ignore[arg-type]
        unique_key=unique_key,
        unique_states=states,
        unique_replace=debounce,
    )


def test_a_second_job_with_the_key_returns_the_first(driver: Driver) -> None:
    first, second = unique("u"), unique("u")
    assert driver.job_insert_many([first], now=T0) == [InsertResult(first.id, False)]
    assert driver.job_insert_many([second], now=T0) == [InsertResult(first.id, True)]
    assert driver.job_get(second.id) is None
    other = unique("v")
    assert driver.job_insert_many([other], now=T0) == [InsertResult(other.id, False)]


def test_within_one_batch_too(driver: Driver) -> None:
    a, b, plain = unique("u"), unique("u"), new_job()
    got = driver.job_insert_many([a, b, plain], now=T0)
    assert got == [
        InsertResult(a.id, False),
        InsertResult(a.id, True),
        InsertResult(plain.id, False),
    ]


def test_a_job_that_leaves_the_states_frees_the_key(driver: Driver) -> None:
    first = unique("u")
    driver.job_insert_many([first], now=T0)
    job = claim_one(driver, at(1))
    assert driver.job_insert_many([unique("u")], now=at(2))[0].id == first.id, "running holds"
    assert complete(driver, [job.lease], now=at(3)) == {job.id}
    again = unique("u")
    assert driver.job_insert_many([again], now=at(4)) == [InsertResult(again.id, False)]


def test_states_decide_what_holds_the_key(driver: Driver) -> None:
    waiting_only = STATE_BITS["scheduled"] | STATE_BITS["available"]
    first = unique("u", waiting_only)
    driver.job_insert_many([first], now=T0)
    claim_one(driver, at(1))
    second = unique("u", waiting_only)
    assert driver.job_insert_many([second], now=at(2)) == [InsertResult(second.id, False)], (
        "a running job does not hold a key unique only while waiting"
    )
    held_after = unique("done", STATE_BITS["completed"] | waiting_only)
    driver.job_insert_many([held_after], now=at(3))
    job = claim_one(driver, at(4))
    complete(driver, [job.lease], now=at(5))
    assert get(driver, job.id).state is JobState.COMPLETED
    assert driver.job_insert_many(
        [unique("done", STATE_BITS["completed"] | waiting_only)], now=at(6)
    )[0] == InsertResult(held_after.id, True)


def test_replace_debounces_a_waiting_job(driver: Driver) -> None:
    first = unique("u", debounce=True, input='{"v":1}', run_at=at(60))
    driver.job_insert_many([first], now=T0)
    later = unique("u", debounce=True, input='{"v":2}', run_at=at(120), priority=5)
    assert driver.job_insert_many([later], now=at(1)) == [InsertResult(first.id, True)]
    got = get(driver, first.id)
    assert (got.input, got.run_at, got.priority, got.state) == (
        '{"v":2}',
        at(120),
        5,
        JobState.SCHEDULED,
    )
    now_due = unique("u", debounce=True, input='{"v":3}')
    driver.job_insert_many([now_due], now=at(2))
    got = get(driver, first.id)
    assert (got.input, got.run_at, got.state) == ('{"v":3}', at(2), JobState.AVAILABLE)


def test_replace_leaves_a_running_job_alone(driver: Driver) -> None:
    first = unique("u", debounce=True, input='{"v":1}')
    driver.job_insert_many([first], now=T0)
    running = claim_one(driver, at(1))
    assert driver.job_insert_many([unique("u", debounce=True, input='{"v":2}')], now=at(2)) == [
        InsertResult(first.id, True)
    ]
    assert get(driver, first.id) == running


def test_the_idempotency_key_still_dedupes_first(driver: Driver) -> None:
    first = unique("u", key="idem")
    driver.job_insert_many([first], now=T0)
    assert driver.job_insert_many([unique("other", key="idem")], now=T0)[0] == InsertResult(
        first.id, True
    )


def test_a_rolled_back_insert_holds_nothing(driver: Driver) -> None:
    class Undo(Exception):
        pass

    try:
        with driver.transaction() as tx:
            driver.job_insert_many([unique("u")], executor=tx, now=T0)
            raise Undo
    except Undo:
        pass
    fresh = unique("u")
    assert driver.job_insert_many([fresh], now=T0) == [InsertResult(fresh.id, False)]


def test_eight_threads_racing_for_one_key_make_one_job(driver: Driver) -> None:
    results: list[InsertResult] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        got = driver.job_insert_many([unique("race")], now=T0)
        with lock:
            results.extend(got)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 8
    assert Counter(r.deduped for r in results) == {True: 7, False: 1}
    assert len({r.id for r in results}) == 1
    assert sum(driver.job_count(JobFilter()).values()) == 1
