"""Shared pieces of the driver contract suite.

A ``DriverSpec`` is picklable (a kind plus a file path or DSN), so a test can hand it to
processes started with the ``spawn`` method and each can ``open_driver(spec)`` on its own. The
functions at the bottom are the bodies those processes run; they report back through a queue
(``(index, "ok", result)`` or ``(index, "error", traceback)``) so a child's failure shows up in
the parent's assertion message instead of as a silent exit code.

Every test passes ``now=`` explicitly, starting from ``T0``, so no test depends on the host clock
or on which clock a driver reads. Times are whole seconds so that every storage precision
round-trips them exactly.
"""

from __future__ import annotations

import importlib
import multiprocessing
import random
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import (
    AttemptError,
    ClaimParams,
    Cycle,
    ExpiredQuery,
    Failure,
    InsertResult,
    Job,
    Lease,
    NewJob,
)

T0 = datetime(2031, 3, 14, 9, 26, 53, tzinfo=UTC)
LEASE = timedelta(seconds=30)
SPAWN = multiprocessing.get_context("spawn")

_CLASSES = {
    "memory": ("ultimat3.jobs.drivers.memory", "MemoryDriver"),
    "sqlite": ("ultimat3.jobs.drivers.sqlite", "SqliteDriver"),
    "postgres": ("ultimat3.jobs.drivers.postgres", "PostgresDriver"),
}


@dataclass(frozen=True)
class DriverSpec:
    """How to open one driver's database from any process."""

    kind: str  # "memory", "sqlite" or "postgres"
    #: The SQLite file, or the PostgreSQL DSN (a ``postgresql://`` URL with options of ours,
    #: such as ``?pooler=transaction``, is opened as an App opens its URL).
    target: str = ""


def driver_class(kind: str) -> Any:
    """The driver class for a kind; raises ImportError while its module is not written yet."""
    module_name, class_name = _CLASSES[kind]
    module = importlib.import_module(module_name)
    try:
        return getattr(module, class_name)
    except AttributeError as exc:
        raise ImportError(f"{module_name} has no {class_name} yet") from exc


def open_driver(spec: DriverSpec) -> Driver:
    """Open (not migrate) the driver a spec names."""
    if spec.target.startswith("postgresql://"):
        from ultimat3.jobs.drivers import open_driver as open_url

        return open_url(spec.target)
    cls = driver_class(spec.kind)
    driver: Driver = cls() if spec.kind == "memory" else cls(spec.target)
    return driver


# -- building and moving jobs ------------------------------------------------------------------


def at(seconds: float) -> datetime:
    """``T0`` plus some seconds: the suite's clock."""
    return T0 + timedelta(seconds=seconds)


def new_job(
    *,
    key: str | None = None,
    queue: str = "default",
    name: str = "contract.job",
    input: str = '{"n":1}',
    run_at: datetime | None = None,
    priority: int = 0,
    tenant_id: str | None = None,
    max_attempts: int = 3,
    job_id: str | None = None,
) -> NewJob:
    job_id = job_id or uuid7()
    return NewJob(
        id=job_id,
        name=name,
        queue=queue,
        input=input,
        idempotency_key=key if key is not None else f"key-{job_id}",
        max_attempts=max_attempts,
        run_at=run_at,
        priority=priority,
        tenant_id=tenant_id,
    )


def insert(driver: Driver, *jobs: NewJob, now: datetime = T0) -> list[str]:
    """Insert fresh jobs and return their ids, asserting none was deduplicated."""
    results = driver.job_insert_many(jobs, now=now)
    assert results == [InsertResult(job.id, deduped=False) for job in jobs]
    return [result.id for result in results]


def claim(
    driver: Driver,
    now: datetime,
    *,
    queues: Sequence[str] = ("default",),
    limit: int = 10,
    lease_for: timedelta = LEASE,
    worker_id: str = "worker-1",
) -> list[Job]:
    """Claim due jobs as a worker does: in a cycle, for free handlers."""
    params = ClaimParams(
        queues=tuple(queues), limit=limit, lease_for=lease_for, worker_id=worker_id, now=now
    )
    return claim_with(driver, params)


def claim_with(driver: Driver, params: ClaimParams) -> list[Job]:
    """Claim with ``params`` in a cycle that only claims."""
    result = driver.job_cycle(Cycle(claim=params), now=params.now)
    assert (result.completed, result.failed) == (set(), set())
    return result.claimed


def complete(driver: Driver, leases: Sequence[Lease], *, now: datetime) -> set[str]:
    """Complete held jobs, with no result, in a cycle that only completes; the ids changed."""
    result = driver.job_cycle(Cycle(completes=list(leases)), now=now)
    assert (result.failed, result.claimed) == (set(), [])
    return result.completed


def claim_one(driver: Driver, now: datetime, **options: Any) -> Job:
    jobs = claim(driver, now, limit=1, **options)
    assert len(jobs) == 1, f"expected one claimed job, got {jobs}"
    return jobs[0]


def get(driver: Driver, job_id: str) -> Job:
    job = driver.job_get(job_id)
    assert job is not None, f"job {job_id} is gone"
    return job


def error(attempt: int, when: datetime, message: str = "boom") -> AttemptError:
    return AttemptError(
        attempt=attempt,
        at=when,
        kind="ValueError",
        message=message,
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "handlers.py", line 7, in send\n'
            f"ValueError: {message} – ünïcode ✓ 'quotes' \"double\" \\backslash\n"
        ),
    )


def fail(
    driver: Driver, job: Job, now: datetime, retry_in: timedelta | None, message: str = "boom"
) -> set[str]:
    return driver.job_fail_many(
        [Failure(job.lease, error(job.attempt, now, message), retry_in)], now=now
    )


def expire_and_reclaim(driver: Driver, job: Job, now: datetime) -> tuple[Lease, Job]:
    """Let ``job``'s lease expire, rescue it as the maintenance service does (fail it through
    the expired lease, retrying at once), and claim it again: returns (stale lease, new job)."""
    stale = job.lease
    assert job.lease_expires_at is not None
    assert job.lease_expires_at < now
    assert [j.id for j in driver.job_list_expired(ExpiredQuery(10), now=now)] == [job.id]
    assert fail(driver, job, now, retry_in=timedelta(0), message="worker lost") == {job.id}
    again = claim_one(driver, now, worker_id="worker-2")
    assert again.id == job.id
    assert again.lease_token != stale.token
    return stale, again


def max_overlap(spans: Iterable[tuple[float, float]]) -> int:
    """How many of ``spans`` (start, end) were open at once, at most (an end before a start at
    the same instant): the concurrency a ledger of start and end times shows."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


class Undo(Exception):
    """Raised inside a transaction to roll it back."""


def roll_back(driver: Driver, work: Callable[[Any], object]) -> None:
    """Run ``work(executor)`` in a transaction, then raise ``Undo`` so it rolls back."""
    with driver.transaction() as tx:
        work(tx)
        raise Undo


def assert_utc(job: Job) -> None:
    """Every time on a job is timezone-aware UTC."""
    for name in ("run_at", "created_at", "attempted_at", "finished_at", "lease_expires_at"):
        value = getattr(job, name)
        if value is not None:
            assert value.utcoffset() == timedelta(0), f"{name}={value!r} is not aware UTC"


# -- processes ---------------------------------------------------------------------------------


def run_processes(
    target: Callable[..., Any], args: Iterable[tuple[Any, ...]], timeout: float = 60.0
) -> list[Any]:
    """Run ``target(index, results, *args)`` in one spawned process per args tuple and return
    their results in index order; a child's traceback becomes this process's AssertionError."""
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(target=target, args=(index, results, *arg), daemon=True)
        for index, arg in enumerate(args)
    ]
    for process in processes:
        process.start()
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(collected) < len(processes):
            index, status, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            assert status == "ok", f"process {index} failed:\n{value}"
            collected[index] = value
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
    return [collected[index] for index in range(len(processes))]


def _report(index: int, results: Any, body: Callable[[], Any]) -> None:
    try:
        results.put((index, "ok", body()))
    except BaseException:
        results.put((index, "error", traceback.format_exc()))


def proc_migrate(index: int, results: Any, spec: DriverSpec, barrier: Any) -> None:
    def body() -> list[int]:
        driver = open_driver(spec)
        try:
            barrier.wait(30)
            return driver.migrate()
        finally:
            driver.close()

    _report(index, results, body)


def proc_enqueue_keys(
    index: int, results: Any, spec: DriverSpec, keys: list[str], barrier: Any
) -> None:
    """Insert one job per key, keys shuffled; return ``{key: (id, deduped)}``."""

    def body() -> dict[str, tuple[str, bool]]:
        driver = open_driver(spec)
        try:
            order = list(keys)
            random.Random(index).shuffle(order)
            barrier.wait(30)
            out: dict[str, tuple[str, bool]] = {}
            for key in order:
                [result] = driver.job_insert_many([new_job(key=key)], now=T0)
                out[key] = (result.id, result.deduped)
            return out
        finally:
            driver.close()

    _report(index, results, body)


def proc_claim_all(index: int, results: Any, spec: DriverSpec, now: datetime, barrier: Any) -> None:
    """Claim and complete until nothing is left; return the ids this process claimed."""

    def body() -> list[str]:
        driver = open_driver(spec)
        try:
            barrier.wait(30)
            mine: list[str] = []
            while True:
                jobs = claim(driver, now, limit=25, worker_id=f"proc-{index}")
                if not jobs:
                    return mine
                mine.extend(job.id for job in jobs)
                done = complete(driver, [job.lease for job in jobs], now=now)
                assert done == {job.id for job in jobs}, "a fresh lease was not held"
        finally:
            driver.close()

    _report(index, results, body)


def proc_insert_until_stopped(
    index: int, results: Any, spec: DriverSpec, ready: Any, go: Any, stop: Any
) -> None:
    """After ``go``, insert one job every 0.3 s until ``stop`` (at most 40); return how many.
    Repeating makes the waiter's test immune to inserting before the parent started waiting."""

    def body() -> int:
        driver = open_driver(spec)
        try:
            ready.set()
            assert go.wait(30), "the parent never said go"
            count = 0
            while count < 40 and not stop.wait(0.3):
                driver.job_insert_many([new_job(queue="wake")], now=T0)
                count += 1
            return count
        finally:
            driver.close()

    _report(index, results, body)
