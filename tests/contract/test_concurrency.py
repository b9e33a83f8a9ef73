"""Concurrency: one idempotency key from many threads and processes gives one row and one id;
many claimers never take the same job twice. The process tests spawn fresh interpreters, so
they run against SQLite and PostgreSQL only."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import JobFilter, JobState, NewJob

from .helpers import (
    SPAWN,
    T0,
    DriverSpec,
    at,
    claim,
    complete,
    new_job,
    proc_claim_all,
    proc_enqueue_keys,
    run_processes,
)


def _agree(per_worker: list[dict[str, tuple[str, bool]]], keys: list[str]) -> None:
    """Every worker got the same id for a key, and exactly one of them created it."""
    for key in keys:
        seen = [results[key] for results in per_worker]
        assert len({job_id for job_id, _ in seen}) == 1, (key, seen)
        assert sum(not deduped for _, deduped in seen) == 1, (key, seen)


def test_one_key_from_eight_threads(driver: Driver) -> None:
    keys = [f"order:{n}" for n in range(10)]
    barrier = threading.Barrier(8)

    def enqueue(worker: int) -> dict[str, tuple[str, bool]]:
        barrier.wait(30)
        out = {}
        for key in keys if worker % 2 == 0 else keys[::-1]:
            [result] = driver.job_insert_many([new_job(key=key)], now=T0)
            out[key] = (result.id, result.deduped)
        return out

    with ThreadPoolExecutor(8) as pool:
        per_thread = list(pool.map(enqueue, range(8), timeout=60))
    _agree(per_thread, keys)
    stored = driver.job_list(JobFilter(), limit=1000)
    assert sorted(job.idempotency_key for job in stored) == sorted(keys)
    assert {job.id for job in stored} == {per_thread[0][key][0] for key in keys}


@pytest.mark.slow
def test_one_key_from_four_processes(shared_spec: DriverSpec, driver: Driver) -> None:
    keys = [f"order:{n}" for n in range(50)]
    barrier = SPAWN.Barrier(4)
    per_process = run_processes(proc_enqueue_keys, [(shared_spec, keys, barrier)] * 4)
    _agree(per_process, keys)
    stored = driver.job_list(JobFilter(), limit=1000)
    assert sorted(job.idempotency_key for job in stored) == sorted(keys)


def test_four_threads_claim_each_job_once(driver: Driver) -> None:
    ids = {job.id for job in _insert_many(driver, 400)}
    barrier = threading.Barrier(4)

    def claim_all(worker: int) -> list[str]:
        barrier.wait(30)
        mine: list[str] = []
        while jobs := claim(driver, at(1), limit=7, worker_id=f"thread-{worker}"):
            mine.extend(job.id for job in jobs)
            assert complete(driver, [job.lease for job in jobs], now=at(1)) == {
                job.id for job in jobs
            }
        return mine

    with ThreadPoolExecutor(4) as pool:
        per_thread = list(pool.map(claim_all, range(4), timeout=60))
    claimed = Counter(job_id for mine in per_thread for job_id in mine)
    assert set(claimed) == ids
    assert max(claimed.values()) == 1
    assert driver.job_count(JobFilter()) == {("default", JobState.COMPLETED): 400}


@pytest.mark.slow
def test_four_processes_claim_each_of_2000_jobs_once(
    shared_spec: DriverSpec, driver: Driver
) -> None:
    ids = {job.id for job in _insert_many(driver, 2000)}
    barrier = SPAWN.Barrier(4)
    per_process = run_processes(proc_claim_all, [(shared_spec, at(1), barrier)] * 4, timeout=90)
    claimed = Counter(job_id for mine in per_process for job_id in mine)
    assert set(claimed) == ids
    assert max(claimed.values()) == 1, [i for i, n in claimed.items() if n > 1][:5]
    assert driver.job_count(JobFilter()) == {("default", JobState.COMPLETED): 2000}
    workers = {job.worker_id for job in driver.job_list(JobFilter(), limit=2000)}
    assert workers <= {f"proc-{n}" for n in range(4)}


def _insert_many(driver: Driver, count: int) -> list[NewJob]:
    jobs = [new_job() for _ in range(count)]
    for start in range(0, count, 500):
        results = driver.job_insert_many(jobs[start : start + 500], now=T0)
        assert not any(result.deduped for result in results)
    return jobs
