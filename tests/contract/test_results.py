"""Stored results: a cycle's completion writes its job's result in the same fenced write, the
text comes back byte for byte, is pruned with the row, and ``job_wait`` is woken by the write
that finishes a job (completion, dead end, cancel) rather than by its timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import FINAL_STATES, Cancellation, Cycle, Failure, JobState, Prune

from .helpers import at, claim, claim_one, error, expire_and_reclaim, get, insert, new_job

#: Key order, unicode, escapes and a big integer: text a re-encoding would change.
RESULT = '{"z":1,"a":[true,null,"ünï ✓ \\"q\\" \\\\"],"big":123456789012345678901234567890}'


def test_a_cycle_stores_each_completions_result(driver: Driver) -> None:
    ids = insert(driver, new_job(), new_job(), new_job())
    jobs = claim(driver, at(1))
    done = driver.job_cycle(
        Cycle(completes=[j.lease for j in jobs], results={ids[0]: RESULT, ids[2]: "42"}),
        now=at(2),
    )
    assert done.completed == set(ids)
    assert [get(driver, i).result for i in ids] == [RESULT, None, "42"]
    assert all(get(driver, i).state is JobState.COMPLETED for i in ids)


def test_a_result_is_fenced_by_the_lease(driver: Driver) -> None:
    [job_id] = insert(driver, new_job())
    first = claim_one(driver, at(1))
    stale, second = expire_and_reclaim(driver, first, at(100))
    late = driver.job_cycle(Cycle(completes=[stale], results={job_id: '"late"'}), now=at(101))
    assert late.completed == set()
    assert get(driver, job_id).result is None, "a refused write stores nothing"
    driver.job_cycle(Cycle(completes=[second.lease], results={job_id: '"kept"'}), now=at(102))
    assert get(driver, job_id).result == '"kept"'


def test_no_result_before_completion_nor_after_a_failure(driver: Driver) -> None:
    [job_id] = insert(driver, new_job(max_attempts=1))
    running = claim_one(driver, at(1))
    assert running.result is None and get(driver, job_id).result is None
    driver.job_cycle(Cycle(failures=[Failure(running.lease, error(1, at(2)), None)]), now=at(2))
    dead = get(driver, job_id)
    assert (dead.state, dead.result) == (JobState.DEAD, None)


def test_a_result_is_pruned_with_its_row(driver: Driver) -> None:
    [job_id] = insert(driver, new_job())
    job = claim_one(driver, at(1))
    driver.job_cycle(Cycle(completes=[job.lease], results={job_id: RESULT}), now=at(2))
    assert driver.job_prune(Prune(frozenset({JobState.COMPLETED}), at(3), 10)) == 1
    assert driver.job_get(job_id) is None
    assert driver.job_wait(job_id, timeout=0.0) is None


def test_wait_returns_a_finished_job_at_once_and_a_running_one_at_its_timeout(
    driver: Driver,
) -> None:
    [done_id, running_id] = insert(driver, new_job(), new_job())
    done, _ = claim(driver, at(1), limit=2)
    driver.job_cycle(Cycle(completes=[done.lease], results={done_id: "7"}), now=at(2))
    started = time.monotonic()
    finished = driver.job_wait(done_id, timeout=30.0)
    assert finished is not None and (finished.state, finished.result) == (JobState.COMPLETED, "7")
    assert time.monotonic() - started < 5.0
    started = time.monotonic()
    still = driver.job_wait(running_id, timeout=0.3)
    waited = time.monotonic() - started
    assert still is not None and still.state is JobState.RUNNING
    assert 0.3 <= waited < 5.0
    assert driver.job_wait("no-such-job", timeout=5.0) is None


def _woken_by(driver: Driver, job_id: str, finish: Callable[[], object]) -> tuple[float, object]:
    """Wait (up to 30 s) in this thread while another finishes the job after 0.3 s; return how
    long the wait took and what it returned."""

    def later() -> None:
        time.sleep(0.3)
        finish()

    thread = threading.Thread(target=later)
    started = time.monotonic()
    thread.start()
    try:
        found = driver.job_wait(job_id, timeout=30.0)
    finally:
        thread.join()
    return time.monotonic() - started, found


@pytest.mark.parametrize("how", ["complete", "dead", "cancel"])
def test_wait_is_woken_by_the_write_that_finishes_the_job(driver: Driver, how: str) -> None:
    [job_id, other_id] = insert(driver, new_job(), new_job())
    job, other = claim(driver, at(1), limit=2)
    assert job.id == job_id

    def finish() -> None:
        # Another job finishing first must not end the wait.
        driver.job_cycle(Cycle(completes=[other.lease]), now=at(2))
        if how == "complete":
            driver.job_cycle(Cycle(completes=[job.lease], results={job_id: RESULT}), now=at(2))
        elif how == "dead":
            driver.job_cycle(Cycle(failures=[Failure(job.lease, error(1, at(2)), None)]), now=at(2))
        else:
            assert driver.job_cancel(Cancellation(job_id, "by hand"), now=at(2))

    waited, found = _woken_by(driver, job_id, finish)
    assert found is not None and found.state in FINAL_STATES  # type: ignore[attr-defined]
    assert waited < 10.0, f"woken by the write, not by the 30 s timeout ({waited:.2f}s)"
    if how == "complete":
        assert found.result == RESULT  # type: ignore[attr-defined]
    assert get(driver, other_id).state is JobState.COMPLETED


def test_wait_is_woken_by_a_batch_too_large_to_name_its_jobs(driver: Driver) -> None:
    """Hundreds of completions in one write (more ids than a PostgreSQL NOTIFY can carry) still
    wake a waiter on one of them."""
    ids = insert(driver, *(new_job() for _ in range(400)))
    jobs = claim(driver, at(1), limit=400)
    assert len(jobs) == 400
    target = ids[123]

    def finish() -> None:
        driver.job_cycle(Cycle(completes=[j.lease for j in jobs], results={target: "1"}), now=at(2))

    waited, found = _woken_by(driver, target, finish)
    assert found is not None and found.result == "1"  # type: ignore[attr-defined]
    assert waited < 10.0


def test_a_wait_on_a_quiet_database_does_not_spin(driver: Driver) -> None:
    """While nothing changes, a wait reads its job a handful of times at most (once, plus once
    after the first LISTEN; a poll every 500 ms behind a transaction pooler), not in a loop."""
    [job_id] = insert(driver, new_job())
    claim_one(driver, at(1))
    reads = 0
    read = driver.job_get

    def counted(job_id: str, *, tenant_id: str | None = None) -> object:
        nonlocal reads
        reads += 1
        return read(job_id, tenant_id=tenant_id)

    driver.job_get = counted  # type: ignore[method-assign,assignment]
    started = time.monotonic()
    still = driver.job_wait(job_id, timeout=1.0)
    assert time.monotonic() - started >= 1.0
    assert still is not None and still.state is JobState.RUNNING
    assert reads <= 5, f"{reads} reads in one second of waiting"
