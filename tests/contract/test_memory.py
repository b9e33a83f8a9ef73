"""What the memory driver promises beyond the shared contract: its executor rules, the limits
its docstring admits, and the wake-ups it sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from ultimat3.jobs.clock import FakeClock
from ultimat3.jobs.drivers.memory import MemoryDriver
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.records import ClaimParams, Cycle, InsertResult, JobFilter, JobState

from .helpers import T0, at, claim_one, fail, get, insert, new_job


@pytest.fixture
def memory() -> MemoryDriver:
    return MemoryDriver()


def test_an_ended_transaction_is_no_executor(memory: MemoryDriver) -> None:
    with memory.transaction() as tx:
        pass
    with pytest.raises(ConfigurationError, match="already committed") as raised:
        memory.job_insert_many([new_job()], executor=tx, now=T0)
    assert raised.value.fix
    with pytest.raises(ConfigurationError):
        memory.adopt(tx)


def test_another_drivers_transaction_is_no_executor(memory: MemoryDriver) -> None:
    with MemoryDriver().transaction() as foreign, pytest.raises(ConfigurationError):
        memory.job_insert_many([new_job()], executor=foreign, now=T0)
    assert memory.job_list(JobFilter()) == []


def test_a_key_committed_meanwhile_wins_over_the_staged_row(memory: MemoryDriver) -> None:
    staged, direct = new_job(key="k"), new_job(key="k")
    with memory.transaction() as tx:
        memory.job_insert_many([staged], executor=tx, now=T0)
        assert memory.job_insert_many([direct], now=T0) == [InsertResult(direct.id, False)]
    assert memory.job_get(staged.id) is None
    assert get(memory, direct.id).idempotency_key == "k"


def test_naive_datetimes_are_refused(memory: MemoryDriver) -> None:
    with pytest.raises(ValueError, match="naive"):
        memory.job_insert_many([new_job()], now=datetime(2031, 1, 1))


def _wakes(memory: MemoryDriver, change: Callable[[], object]) -> bool:
    """Whether ``change``, made while a thread waits, ends that wait early."""
    started, woke = threading.Event(), []

    def wait() -> None:
        started.set()
        begin = time.monotonic()
        memory.wait_for_jobs(10.0, threading.Event())
        woke.append(time.monotonic() - begin < 5.0)

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait(5)
    time.sleep(0.1)  # let the waiter reach its condition
    change()
    thread.join(15)
    return woke == [True]


def test_wakes_when_jobs_become_claimable(memory: MemoryDriver) -> None:
    insert(memory, new_job(), new_job(), new_job(queue="paused"))
    memory.queue_set_paused("paused", True)
    first, second = claim_one(memory, at(1)), claim_one(memory, at(1))
    assert _wakes(memory, lambda: fail(memory, first, at(2), retry_in=timedelta(0)))
    assert _wakes(memory, lambda: memory.job_snooze(second.lease, timedelta(0), now=at(2)))
    dead = claim_one(memory, at(3))
    fail(memory, dead, at(3), retry_in=None)
    assert get(memory, dead.id).state is JobState.DEAD
    assert _wakes(memory, lambda: memory.job_retry([dead.id], now=at(4)))
    assert _wakes(memory, lambda: memory.queue_set_paused("paused", False))
    assert _wakes(memory, lambda: insert(memory, new_job(), now=at(5)))


def test_a_committed_transaction_wakes(memory: MemoryDriver) -> None:
    def commit() -> None:
        with memory.transaction() as tx:
            memory.job_insert_many([new_job()], executor=tx, now=T0)

    assert _wakes(memory, commit)


def test_its_clock_is_the_one_it_is_given() -> None:
    """``now=None`` reads the driver's clock, as a database reads its own: a fake one here."""
    clock = FakeClock(T0)
    memory = MemoryDriver(clock=clock)
    later = new_job(run_at=at(10))
    assert memory.job_insert_many([later]) == [InsertResult(later.id, False)]
    assert get(memory, later.id).created_at == T0
    assert memory.database_now() == T0
    params = ClaimParams(("default",), 1, timedelta(seconds=30), "w")  # now: the driver's
    assert memory.job_cycle(Cycle(claim=params)).claimed == []
    clock.advance(10)
    [claimed] = memory.job_cycle(Cycle(claim=params)).claimed
    assert (claimed.id, claimed.attempted_at) == (later.id, at(10))


def test_an_app_on_memory_gives_the_driver_its_clock() -> None:
    """``App("memory://", clock=...)``: the database's clock is the App's, as SQLite's frame
    is, so a read without ``now`` (the operator's, a dashboard's) sees the App's time."""
    from ultimat3.jobs import App

    clock = FakeClock(T0)
    app = App("memory://", clock=clock)
    assert app.driver.database_now() == T0
    clock.advance(60)
    assert app.driver.database_now() == at(60)
