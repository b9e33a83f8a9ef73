"""``transaction()``: inserts and completions passed ``executor=`` are visible to others if
and only if the transaction commits. Visibility is checked from another thread, which reads
through the driver's own connections as any other worker would. Only reads run there: a write
from outside would wait for the open transaction (SQLite has one writer at a time)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import InsertResult, JobFilter, JobState

from .helpers import T0, Undo, at, claim, get, insert, new_job, roll_back

T = TypeVar("T")


def elsewhere(call: Callable[[], T]) -> T:
    """Run ``call`` on another thread (a reader outside the transaction)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=30)


def test_insert_is_visible_only_after_commit(driver: Driver) -> None:
    a, b = new_job(), new_job()
    with driver.transaction() as tx:
        results = driver.job_insert_many([a, b], executor=tx, now=T0)
        assert results == [InsertResult(a.id, False), InsertResult(b.id, False)]
        assert elsewhere(lambda: driver.job_get(a.id)) is None
        assert elsewhere(lambda: driver.job_list(JobFilter())) == []
    assert get(driver, a.id).state is JobState.AVAILABLE
    assert get(driver, b.id).created_at == T0
    assert {job.id for job in claim(driver, at(1))} == {a.id, b.id}


def test_rollback_leaves_nothing(driver: Driver) -> None:
    job = new_job(key="k")
    with pytest.raises(Undo):
        roll_back(driver, lambda tx: driver.job_insert_many([job], executor=tx, now=T0))
    assert driver.job_get(job.id) is None
    assert claim(driver, at(1)) == []
    again = new_job(key="k")
    assert driver.job_insert_many([again], now=T0) == [InsertResult(again.id, False)], (
        "the rolled-back key is free"
    )


def test_dedupe_inside_a_transaction(driver: Driver) -> None:
    committed = new_job(key="old")
    insert(driver, committed)
    staged, twin, dup = new_job(key="new"), new_job(key="new"), new_job(key="old")
    with driver.transaction() as tx:
        assert driver.job_insert_many([staged], executor=tx, now=T0) == [
            InsertResult(staged.id, False)
        ]
        assert driver.job_insert_many([twin, dup], executor=tx, now=T0) == [
            InsertResult(staged.id, True),
            InsertResult(committed.id, True),
        ]
    assert driver.job_get(twin.id) is None
    assert driver.job_get(dup.id) is None
    assert get(driver, staged.id).idempotency_key == "new"


def test_the_usual_enqueue_inside_a_transaction(driver: Driver) -> None:
    """One due job at a time on the database's clock (no ``now``): what an enqueue in a
    business transaction passes (PostgreSQL's flat path). A job published again and a stored
    key return the stored job; nothing is seen before the commit."""
    committed = new_job(key="old")
    insert(driver, committed)
    fresh, dup = new_job(), new_job(key="old")
    with driver.transaction() as tx:
        assert driver.job_insert_many([fresh], executor=tx) == [InsertResult(fresh.id, False)]
        assert driver.job_insert_many([fresh], executor=tx) == [InsertResult(fresh.id, True)]
        assert driver.job_insert_many([dup], executor=tx) == [InsertResult(committed.id, True)]
        assert elsewhere(lambda: driver.job_get(fresh.id)) is None
    assert get(driver, fresh.id).state is JobState.AVAILABLE
    assert driver.job_get(dup.id) is None
    assert len(driver.job_list(JobFilter())) == 2
