"""Differential test: random histories of every write and read, run on the memory driver (the
reference) and on the driver under test side by side, must give the same answers step by
step. Job ids are fixed by the caller, so both stores hold the same ids; lease tokens are
random, so each store keeps its own and records are compared with the token reduced to "held".

Where the protocol leaves an order open (ties in ``job_list_expired``, the ids returned by
``job_retry``/``job_discard``, which rows a bounded prune picks), the comparison is made
order-free, and prunes are unbounded, so the two stores cannot drift apart legitimately.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.drivers.memory import MemoryDriver
from ultimat3.jobs.records import (
    FINAL_STATES,
    Cancellation,
    ClaimParams,
    ExpiredQuery,
    Failure,
    Job,
    JobFilter,
    JobState,
    Lease,
    Prune,
    QueueInfo,
)

from .helpers import T0, DriverSpec, claim_with, complete, error, new_job

QUEUES = ["q1", "q2", "q3"]
TENANTS = [None, "a", ""]
KEYS = [f"k{n}" for n in range(14)]


def _norm(job: Job | None) -> Job | None:
    return None if job is None else replace(job, lease_token="held" if job.lease_token else None)


def _norm_all(jobs: list[Job]) -> list[Job | None]:
    return [_norm(job) for job in jobs]


@dataclass
class Pair:
    """The reference and the driver under test, with the leases each has issued per job."""

    ref: MemoryDriver
    sut: Driver
    rng: random.Random
    now: datetime = T0
    ids: list[str] = field(default_factory=list)
    leases: dict[str, list[tuple[Lease, Lease]]] = field(default_factory=dict)

    def both(self, call: Callable[[Driver, int], Any]) -> tuple[Any, Any]:
        """``call(driver, side)`` on the reference (side 0), then on the driver under test."""
        return call(self.ref, 0), call(self.sut, 1)

    def some_leases(self, most: int) -> list[tuple[Lease, Lease]]:
        found = []
        for _ in range(self.rng.randint(1, most) if self.leases else 0):
            history = self.leases[self.rng.choice(sorted(self.leases))]
            # Mostly the newest lease of a job, sometimes a stale one.
            found.append(history[-1] if self.rng.random() < 0.8 else self.rng.choice(history))
        return found

    def some_ids(self) -> list[str]:
        return self.rng.sample(self.ids, k=min(len(self.ids), self.rng.randint(1, 3)))

    def some_tenant(self) -> str | None:
        return self.rng.choice([None, None, *TENANTS])

    def later(self, low: int, high: int) -> datetime:
        return self.now + timedelta(seconds=self.rng.randint(low, high))


OPS = (
    ["insert"] * 4
    + ["claim"] * 4
    + ["complete", "fail", "fail", "snooze", "cancel", "extend", "expired", "retry"]
    + ["discard", "prune", "pause", "get", "count", "queues"]
)


def _step(pair: Pair, op: str) -> None:
    rng, now = pair.rng, pair.now
    if op == "insert":
        jobs = [
            new_job(
                key=rng.choice(KEYS),
                queue=rng.choice(QUEUES),
                priority=rng.choice([-1, 0, 0, 5]),
                tenant_id=rng.choice(TENANTS),
                max_attempts=rng.randint(1, 3),
                run_at=rng.choice([None, pair.later(-30, 30)]),
            )
            for _ in range(rng.randint(1, 3))
        ]
        expected, actual = pair.both(lambda d, _: d.job_insert_many(jobs, now=now))
        assert actual == expected
        pair.ids.extend(r.id for r in expected if not r.deduped and r.id not in pair.ids)
    elif op == "claim":
        params = ClaimParams(
            queues=tuple(rng.sample(QUEUES, k=rng.randint(1, 3))),
            limit=rng.randint(1, 3),
            lease_for=timedelta(seconds=rng.randint(5, 30)),
            worker_id=rng.choice(["w1", "w2"]),
            now=now,
        )
        expected, actual = pair.both(lambda d, _: claim_with(d, params))
        assert _norm_all(actual) == _norm_all(expected)
        for ref_job, sut_job in zip(expected, actual, strict=True):
            pair.leases.setdefault(ref_job.id, []).append((ref_job.lease, sut_job.lease))
    elif op == "complete":
        chosen = pair.some_leases(2)
        expected, actual = pair.both(
            lambda d, side: complete(d, [lease[side] for lease in chosen], now=now)
        )
        assert actual == expected
    elif op == "extend":
        chosen, lease_for = pair.some_leases(2), timedelta(seconds=rng.randint(5, 30))
        expected, actual = pair.both(
            lambda d, side: d.lease_extend([lease[side] for lease in chosen], lease_for, now=now)
        )
        assert actual == expected
    elif op == "fail":
        chosen = pair.some_leases(2)
        retry_in = rng.choice([None, timedelta(0), timedelta(seconds=rng.randint(0, 30))])
        err = error(rng.randint(1, 3), now, message=f"failed at {now.isoformat()}")
        expected, actual = pair.both(
            lambda d, side: d.job_fail_many(
                [Failure(lease[side], err, retry_in) for lease in chosen], now=now
            )
        )
        assert actual == expected
    elif op == "snooze":
        chosen, delay = (
            pair.some_leases(1),
            rng.choice([None, timedelta(seconds=rng.randint(0, 40))]),
        )
        if chosen:
            expected, actual = pair.both(
                lambda d, side: d.job_snooze(chosen[0][side], delay, now=now)
            )
            assert actual == expected
    elif op == "cancel" and pair.ids:
        job_id, tenant = rng.choice(pair.ids), pair.some_tenant()
        chosen = pair.some_leases(1) if rng.random() < 0.4 else []
        expected, actual = pair.both(
            lambda d, side: d.job_cancel(
                Cancellation(
                    job_id, "r", lease=chosen[0][side] if chosen else None, tenant_id=tenant
                ),
                now=now,
            )
        )
        assert actual == expected
    elif op == "expired":
        expected, actual = pair.both(lambda d, _: d.job_list_expired(ExpiredQuery(1000), now=now))
        # Ties in expiry may come in any order.
        assert _norm_all(sorted(actual, key=_by_id)) == _norm_all(sorted(expected, key=_by_id))
        assert [j.lease_expires_at for j in actual] == [j.lease_expires_at for j in expected]
    elif op == "retry" and pair.ids:
        ids, tenant = pair.some_ids(), pair.some_tenant()
        expected, actual = pair.both(lambda d, _: d.job_retry(ids, tenant_id=tenant, now=now))
        assert sorted(actual) == sorted(expected)
    elif op == "discard" and pair.ids:
        ids, tenant = pair.some_ids(), pair.some_tenant()
        expected, actual = pair.both(lambda d, _: d.job_discard(ids, tenant_id=tenant))
        assert sorted(actual) == sorted(expected)
    elif op == "prune":
        states = frozenset(rng.sample(sorted(FINAL_STATES), k=rng.randint(1, 3)))
        before = pair.later(-60, 0)
        expected, actual = pair.both(lambda d, _: d.job_prune(Prune(states, before, 100_000)))
        assert actual == expected
    elif op == "pause":
        queue, paused = rng.choice(QUEUES), rng.random() < 0.5
        pair.both(lambda d, _: d.queue_set_paused(queue, paused))
    elif op == "get" and pair.ids:
        job_id, tenant = rng.choice(pair.ids), pair.some_tenant()
        expected, actual = pair.both(lambda d, _: d.job_get(job_id, tenant_id=tenant))
        assert _norm(actual) == _norm(expected)
    elif op == "count":
        where = JobFilter(
            states=rng.choice([None, frozenset(rng.sample(list(JobState), k=2))]),
            queue=rng.choice([None, *QUEUES]),
            tenant_id=pair.some_tenant(),
        )
        expected, actual = pair.both(lambda d, _: d.job_count(where))
        assert {k: n for k, n in actual.items() if n} == {k: n for k, n in expected.items() if n}
    elif op == "queues":
        expected, actual = pair.both(lambda d, _: d.queue_list())
        assert _queues(actual) == _queues(expected)


def _by_id(job: Job) -> str:
    return job.id


def _queues(queues: list[QueueInfo]) -> list[tuple[str, bool, dict[JobState, int]]]:
    # A resumed queue without jobs may or may not keep its setting row: leave those out.
    return [
        (q.name, q.paused, {s: n for s, n in q.counts.items() if n})
        for q in queues
        if q.paused or any(q.counts.values())
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_histories_match_the_memory_driver(
    driver: Driver, driver_spec: DriverSpec, seed: int
) -> None:
    if driver_spec.kind == "memory":
        pytest.skip("the memory driver is the reference")
    pair = Pair(MemoryDriver(), driver, random.Random(seed))
    done: list[str] = []
    for _ in range(200):
        pair.now += timedelta(seconds=pair.rng.choice([0, 1, 3, 10]))
        op = pair.rng.choice(OPS)
        try:
            _step(pair, op)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, step {len(done)}: {op} after {done[-4:]}") from exc
        done.append(op)
    full = JobFilter()
    expected = pair.ref.job_list(full, limit=100_000)
    assert _norm_all(driver.job_list(full, limit=100_000)) == _norm_all(expected)
    assert len(set(done)) >= 12, "the history exercised most operations"
