"""The memory driver's rows: pure functions on ``Job`` records (a new job, its claim order, a
release, a filter) and the choice a claim with limits makes. No lock and no driver state:
the driver calls them with its lock held."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import NamedTuple

from ultimat3.jobs.limits import keys_to_look
from ultimat3.jobs.records import Job, JobFilter, JobState, NewJob, aware


class Flow(NamedTuple):
    """A job's limits: its partition, how many may run at once, and how many may start per
    ``rate_period`` (0: no rate limit)."""

    key: str
    most: int
    rate_max: int
    rate_period: timedelta


def debounced(job: Job, new: Job) -> Job:
    return replace(job, input=new.input, run_at=new.run_at, state=new.state, priority=new.priority)


def order(job: Job) -> tuple[int, datetime, str]:
    """The order claims take waiting jobs in: priority first, then run_at, then id."""
    return (-job.priority, job.run_at, job.id)


def waiting_state(run_at: datetime, now: datetime) -> JobState:
    return JobState.SCHEDULED if run_at > now else JobState.AVAILABLE


def unleased(job: Job) -> Job:
    return replace(job, lease_token=None, lease_expires_at=None)


def new_job(new: NewJob, now: datetime) -> Job:
    run_at = now if new.run_at is None else aware(new.run_at)
    if new.run_at is None and new.delay is not None:
        run_at = now + new.delay
    return Job(
        id=new.id,
        name=new.name,
        queue=new.queue,
        input=new.input,
        tenant_id=new.tenant_id,
        idempotency_key=new.idempotency_key,
        priority=new.priority,
        state=waiting_state(run_at, now),
        attempt=0,
        max_attempts=new.max_attempts,
        run_at=run_at,
        created_at=now,
        trace_context=new.trace_context,
    )


def matches(job: Job, where: JobFilter) -> bool:
    return (
        (where.states is None or job.state in where.states)
        and (where.queue is None or job.queue == where.queue)
        and (where.name is None or job.name == where.name)
        and (where.tenant_id is None or job.tenant_id == where.tenant_id)
        and (where.ids is None or job.id in where.ids)
        and (where.min_id is None or job.id >= where.min_id)
    )


def usage(
    jobs: Iterable[Job], flows: Mapping[str, Flow], keys: set[str], at: datetime
) -> tuple[Counter[str], dict[str, list[datetime]]]:
    """Per key of ``keys``: how many slots its running jobs hold (a running job whose lease
    has not expired holds one), and when its jobs last started."""
    running: Counter[str] = Counter()
    starts: dict[str, list[datetime]] = {}
    for job in jobs:
        flow = flows.get(job.id)
        if flow is None or flow.key not in keys:
            continue
        expires = job.lease_expires_at
        if job.state is JobState.RUNNING and expires is not None and expires > at:
            running[flow.key] += 1
        if job.attempted_at is not None:
            starts.setdefault(flow.key, []).append(job.attempted_at)
    return running, starts


def within_limits(
    due: Iterable[Job],
    limit: int,
    at: datetime,
    *,
    flows: Mapping[str, Flow],
    jobs: Iterable[Job],
    after: str,
) -> tuple[list[Job], datetime | None, str]:
    """The jobs a claim with limits takes (``limits``): the unlimited due jobs, and key by
    key from the one after the cursor, each key's first due jobs up to its free slots until
    the claim is full; of those, the first ``limit`` with keys taking turns within a
    priority (every key's first job, the unlimited jobs first as one key, then every key's
    second...). A slot is held by a running job of the key whose lease has not expired,
    and, under a rate limit, by each start within the window. Also returns when the first
    full window looked at reopens (its oldest start leaves it)."""
    ordered = sorted(due, key=order)
    plain: list[Job] = []
    by_key: dict[str, list[Job]] = {}
    for job in ordered:
        flow = flows.get(job.id)
        if flow is None:
            if len(plain) < limit:
                plain.append(job)
        else:
            by_key.setdefault(flow.key, []).append(job)
    running, starts = usage(jobs, flows, set(by_key), at)
    keys = sorted(by_key)
    rotated = [k for k in keys if k > after] + [k for k in keys if k <= after]
    places: list[tuple[int, int, int, datetime, str, Job]] = [
        (-job.priority, rank, -1, job.run_at, job.id, job) for rank, job in enumerate(plain)
    ]
    need, taken, wake_at = limit, 0, None
    looked = rotated[: keys_to_look(limit)]
    for key in looked:
        if need <= 0:
            break
        head = flows[by_key[key][0].id]
        free = head.most - running[key]
        if head.rate_max:
            recent = [t for t in starts.get(key, ()) if t > at - head.rate_period]
            if len(recent) >= head.rate_max and running[key] < head.most:
                opens = min(recent) + head.rate_period
                wake_at = opens if wake_at is None else min(wake_at, opens)
            free = min(free, head.rate_max - len(recent))
        if free <= 0:
            continue
        take = by_key[key][: min(free, need)]
        places += [
            (-job.priority, rank, taken, job.run_at, job.id, job) for rank, job in enumerate(take)
        ]
        taken += 1
        need -= len(take)
        after = key  # round-robin: the next claim starts after the last key taken
    if not taken and looked and len(looked) == keys_to_look(limit):
        after = looked[-1]  # past the full keys looked at
    places.sort(key=lambda place: place[:5])
    return [place[-1] for place in places[:limit]], wake_at, after
