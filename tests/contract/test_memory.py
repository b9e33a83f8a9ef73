"""What the memory driver promises beyond the shared contract: its executor rules, the limits
its docstring admits, and the wake-ups it sends."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from ultimat3.jobs.drivers.memory import MemoryDriver
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.records import ClaimParams, Failure, InsertResult, Job, JobFilter, JobState

from .helpers import T0, at, claim_one, claim_with, complete, error, fail, get, insert, new_job


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


def test_the_claim_index_agrees_with_a_scan_of_every_waiting_job() -> None:
    """The usual claim reads an index of the waiting jobs rather than sorting them all. Random
    histories (priorities, run_at in the past and future, retries, isolation, snoozes, cancels,
    paused queues, a clock that goes back): each claim takes exactly the jobs, in the order, that
    a scan of every waiting job picks."""
    rng = random.Random(20261201)
    queues = ("q1", "q2", "q3")
    for _history in range(30):
        memory = MemoryDriver()
        held: list[Job] = []
        clock = 0.0
        for _step in range(300):
            clock += rng.choice((0.0, 0.5, 2.0, -3.0))  # sometimes set back
            now = at(clock)
            op = rng.random()
            if op < 0.35:
                memory.job_insert_many(
                    [
                        new_job(
                            queue=rng.choice(queues),
                            priority=rng.randint(-1, 2),
                            run_at=at(clock + rng.choice((-5, 0, 0, 1, 4, 30))),
                        )
                        for _ in range(rng.randint(1, 4))
                    ],
                    now=now,
                )
            elif op < 0.65:
                names = tuple(rng.sample(queues, rng.randint(1, 3)))
                params = ClaimParams(names, rng.randint(1, 4), timedelta(seconds=60), "w", now)
                with memory._lock:
                    expected = [job.id for job in _scanned(memory, params)]
                claimed = claim_with(memory, params)
                assert [job.id for job in claimed] == expected
                held.extend(claimed)
            elif op < 0.85 and held:
                job = held.pop(rng.randrange(len(held)))
                kind = rng.random()
                if kind < 0.4:
                    complete(memory, [job.lease], now=now)
                elif kind < 0.8:
                    retry = timedelta(seconds=rng.choice((0, 1, 10)))
                    failure = Failure(
                        job.lease, error(job.attempt, now, "x"), retry, rng.random() < 0.3
                    )
                    memory.job_fail_many([failure], now=now)
                else:
                    memory.job_snooze(
                        job.lease, rng.choice((None, timedelta(0), timedelta(seconds=3))), now=now
                    )
            elif op < 0.93:
                memory.queue_set_paused(rng.choice(queues), rng.random() < 0.5)
            else:
                waiting = sorted(memory._waiting)
                if waiting:
                    memory.job_cancel(rng.choice(waiting), reason="test", now=now)


def _scanned(memory: MemoryDriver, params: ClaimParams) -> list[Job]:
    """The reference: every waiting job looked at, the due ones sorted (the claim before the
    index)."""
    assert params.now is not None
    due = [
        job
        for job in map(memory._jobs.__getitem__, memory._waiting)
        if job.run_at <= params.now
        and job.queue in params.queues
        and not memory._paused.get(job.queue, False)
        and job.id not in memory._isolated
        and job.id not in memory._limits
    ]
    return sorted(due, key=lambda job: (-job.priority, job.run_at, job.id))[: params.limit]
