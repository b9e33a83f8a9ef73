"""Maintenance: rescue jobs whose worker vanished (on every worker), and prune finished rows
(on one elected node).

Guarantees and limits:

- **Rescue follows the lease.** Every worker runs a rescue pass each ``rescue_interval``, leader
  or not, so a job whose worker died or froze is free again within its lease plus one rescue
  interval, whoever held the maintenance leadership (a frozen leader still holds it until its
  time to live ends). Rescues are fenced by the expired lease and idempotent: two workers that
  race change each job once, and only the one that changed it reports it.
- **One node prunes.** Only the holder of the ``maintenance`` leadership (a lease row in
  ``x_leaders``, renewed each tick) prunes finished rows and stale worker rows. The worker
  gives the leadership a time to live of one lease (1 s to 15 s), and a standby asks for it at
  least every rescue interval, so a dead leader's successor takes over within a lease and a
  rescue interval.
- **Rescue is by lease, not by age.** A running job is rescued only once its lease expired on
  the database's clock, i.e. no heartbeat renewed it for a whole lease. A job whose worker is
  alive keeps its lease however long it runs.
- **A step of the clock is not a death.** A lease renewed on time before the host's wall
  clock stepped forward looks expired after it. The rescuer trusts no expiry until a full
  lease (``grace``) has passed since this process saw the step (``Clock.stepped_at``), time
  in which the lease's worker renews it (at once: it saw the step too). A process started
  after a step cannot see it (a supervisor's restart, a pool's child, a deploy), so the start
  of ``Maintenance`` counts as a step: a fresh rescuer trusts no expiry for one ``grace``
  after it starts, time in which a live worker's next heartbeat renews its leases. The cost:
  a worker started just after another crashed rescues the dead one's jobs up to one lease
  later than a worker that was already running (which is why a standby, started before the
  crash, keeps the bound above). Workers' rows are pruned likewise only three leases after
  the start.
- **A stall is not a death.** When this process saw the database delay or refuse its writes
  (SQLite's write lock held by a long business transaction; a network stall), heartbeats may
  have been stuck behind the same stall. The rescuer then waits until writes have flowed for
  a full lease (``grace``) before it trusts an expiry, so a lease lapses only after a full
  lease in which its worker could have renewed it and did not.
- **Only a started job loses its attempt.** A worker claims only for handlers that are free,
  and its claim records that the jobs start (``job_cycle``); one a shutdown gives back before
  a handler took it goes back with its attempt refunded.
- **A crash costs only the job that caused it.** A started job whose worker died while it ran
  beside other jobs cannot be told from its neighbours: it is rescued as ``worker_lost`` with
  its attempt given back (``Failure.refund``), due at once, and marked *isolated*: it is
  claimed alone, with nothing else running in its worker, until it returns (see
  ``ultimat3.jobs.worker``). Only a crash while it ran alone counts the attempt (it was
  counted at claim), so a job that kills its worker on every attempt ends ``dead`` after
  ``max_attempts`` starts alone, and a healthy job killed beside it pays nothing.
- **Dead workers leave the list.** Each pass of the leader deletes the rows of workers whose
  heartbeat is older than ``worker_stale`` (default three leases): a worker killed with -9
  leaves the workers table within that, a clean exit at once.
- **Pruning keeps up.** Each pass deletes ``completed`` and ``cancelled`` rows finished longer
  ago than ``retention`` (default 1 day, on the database's clock: ``Driver.database_now``) in
  bounded batches until none is left or the pass's time budget is spent; the next pass follows
  at once while rows remain. ``dead`` rows are kept
  until retried or discarded unless ``dead_retention`` is set. Pruning a row ends the dedupe
  window of its idempotency key.
"""

from __future__ import annotations

import dataclasses
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.records import (
    AttemptError,
    ExpiredQuery,
    Failure,
    Job,
    JobState,
    Leadership,
    Prune,
)
from ultimat3.jobs.retry import DEFAULT_RETRY, next_retry

TRACEBACK_LIMIT = 16_000
MESSAGE_LIMIT = 4_000
LEADERSHIP = "maintenance"
#: The retry delay of a rescue that gives the attempt back: due again at once.
_AT_ONCE = timedelta(0)


def attempt_error(
    job: Job, kind: str, message: str, now: datetime, tb: str = "", exception_path: str = ""
) -> AttemptError:
    return AttemptError(
        attempt=job.attempt,
        at=now,
        kind=kind,
        message=message[:MESSAGE_LIMIT],
        traceback=tb[-TRACEBACK_LIMIT:],
        worker_id=job.worker_id or "",
        exception_path=exception_path,
    )


def error_from_exception(job: Job, exc: BaseException, now: datetime) -> AttemptError:
    tb = "".join(traceback.format_exception(exc))
    kind = type(exc)
    path = f"{kind.__module__}.{kind.__qualname__}"
    return attempt_error(job, kind.__qualname__, str(exc) or repr(exc), now, tb, path)


def decide_failure(
    job: Job,
    handle: JobHandle[Any] | None,
    error: AttemptError,
    rand: Callable[[], float] = random.random,
    *,
    isolate: bool = False,
) -> tuple[Failure, bool]:
    """The one place a failed attempt becomes a retry or a dead job (seed ``nextRetry``).

    ``job.max_attempts`` is the row's (an operator's retry may have raised it); backoff comes
    from the job's policy. The retry's delay is handed to the driver as it is
    (``Failure.retry_in``): the database adds it to its own clock, not this host's. Returns
    the failure and whether a dead job must be dropped (``dead_letter=False``).
    """
    policy = handle.retry if handle is not None else DEFAULT_RETRY
    decision = next_retry(dataclasses.replace(policy, attempts=job.max_attempts), job.attempt, rand)
    retry_in = decision.delay if decision.retry else None
    drop = not decision.retry and not decision.dead_letter
    return Failure(lease=job.lease, error=error, retry_in=retry_in, isolate=isolate), drop


@dataclass
class MaintenanceConfig:
    rescue_batch: int = 100
    retention: timedelta = timedelta(days=1)
    dead_retention: timedelta | None = None
    prune_batch: int = 5_000
    #: The most time one pass spends pruning before it lets the other loops write.
    prune_budget: timedelta = timedelta(seconds=1)
    #: A worker row whose heartbeat is older than this is deleted; None: three leases.
    worker_stale: timedelta | None = None


class Maintenance:
    """Rescuer and pruner. ``tick()`` renews leadership and, on the leader, runs what is due."""

    def __init__(
        self,
        driver: Driver,
        handles: Callable[[str], JobHandle[Any] | None],
        clock: Clock,
        config: MaintenanceConfig | None = None,
        *,
        holder: str = "",
        grace: timedelta = timedelta(seconds=30),
        leader_ttl: timedelta = timedelta(seconds=15),
    ) -> None:
        self.driver = driver
        self.handles = handles
        self.clock = clock
        self.config = config or MaintenanceConfig()
        self.holder = holder or f"maintenance:{id(self):x}"
        self.grace = grace
        self.leader_ttl = leader_ttl
        self.leading = False
        self._next_rescue = 0.0
        self._next_prune = 0.0
        self._backlog = False
        self._deferred = False
        #: A step this process could not see happened, at worst, just before it started.
        self._started = clock.monotonic()
        self._standby_every = leader_ttl.total_seconds() / 3

    def tick(self, *, rescue_every: float, prune_every: float) -> int:
        """One pass: keep or take leadership; rescue when due (on every node); on the leader,
        prune when due. Returns how many jobs were rescued."""
        self.leading = self.driver.leader_elect(self._leadership(), now=self.clock.pinned())
        # A standby asks again at the rescue cadence (at most a third of the leadership's
        # time to live): each ask is an upsert that waits on the leader's row.
        self._standby_every = min(rescue_every, self.leader_ttl.total_seconds() / 3)
        now = self.clock.monotonic()
        rescued = 0
        if now >= self._next_rescue:
            self._next_rescue = now + rescue_every
            rescued = len(self.rescue())
            if self.leading:
                self.prune_workers()
        if not self.leading:
            self._backlog = False  # the next leader's to find
            return rescued
        if now >= self._next_prune or self._backlog:
            self._next_prune = now + prune_every
            self.prune()
        return rescued

    def next_in(self) -> float:
        """Seconds until the next pass: at once while a prune backlog remains; else when the
        next rescue is due, and at least often enough to keep the leadership (on the leader)
        or to take it over within one cadence of its expiry (on a standby)."""
        if self._backlog:
            return 0.05
        due = self._next_rescue - self.clock.monotonic()
        if not self.leading:
            return max(0.05, min(due, self._standby_every))
        due = min(due, self._next_prune - self.clock.monotonic())
        return max(0.05, min(due, self.leader_ttl.total_seconds() / 3))

    def resign(self) -> None:
        if self.leading:
            try:
                self.driver.leader_resign(self._leadership())
            except Exception:
                pass
            self.leading = False

    def _leadership(self) -> Leadership:
        return Leadership(LEADERSHIP, self.holder, self.leader_ttl)

    def rescue(self) -> list[str]:
        """Fail every job whose lease expired; return the ids this call rescued. A job that ran
        alone (isolated) is charged its attempt (and may end dead); one that ran beside others
        gets it back and is isolated. Deferred (returns []) while this process saw a write
        stall, or a step of the host clock, or started, less than ``grace`` ago."""
        stepped = self.clock.stepped_at()
        steady = self._steady_for(stepped)
        healthy = min(self.driver.stalls.healthy_for(), steady)
        if healthy < self.grace.total_seconds():
            starting = steady <= healthy and stepped <= self._started  # ordinary: not warned
            if not self._deferred and not starting:
                self._deferred = True
                events.warning(
                    "jobs.maintenance.rescue-deferred",
                    reason="the wall clock stepped"
                    if steady <= healthy
                    else "the database stalled our writes",
                    healthy_for=round(healthy, 3),
                    grace=self.grace.total_seconds(),
                )
            return []
        self._deferred = False
        return self._rescue(isolated=True, stepped=stepped) + self._rescue(
            isolated=False, stepped=stepped
        )

    def _steady_for(self, stepped: float) -> float:
        """Seconds since this process saw the wall clock step, or started if that is later."""
        return self.clock.monotonic() - max(stepped, self._started)

    def _rescue(self, *, isolated: bool, stepped: float) -> list[str]:
        rescued: list[str] = []
        while True:
            query = ExpiredQuery(self.config.rescue_batch, isolated)
            expired = self.driver.job_list_expired(query, now=self.clock.pinned())
            if not expired or self.clock.stepped_at() != stepped:
                return rescued  # (a step seen meanwhile: the next pass defers)
            now = self.clock.now()
            failures: list[Failure] = []
            drops: list[str] = []
            for job in expired:
                if isolated:
                    error = attempt_error(
                        job,
                        "worker_lost",
                        "the lease expired while the job ran alone: the worker crashed, hung, "
                        "or lost the database",
                        now,
                    )
                    failure, drop = decide_failure(job, self.handles(job.name), error, isolate=True)
                    if drop:
                        drops.append(job.id)
                else:
                    error = attempt_error(
                        job,
                        "worker_lost",
                        "the lease expired while the job ran beside others: the worker crashed, "
                        "hung, or lost the database; the attempt is given back and the job "
                        "runs alone next",
                        now,
                    )
                    failure = Failure(job.lease, error, _AT_ONCE, isolate=True, refund=True)
                failures.append(failure)
            changed = self.driver.job_fail_many(failures, now=self.clock.pinned())
            for job, failure in zip(expired, failures, strict=True):
                if failure.lease.id in changed:
                    events.warning(
                        "jobs.job.rescued",
                        job,
                        **events.job_fields(job),
                        worker_id=job.worker_id,
                        dead=failure.retry_in is None,
                        charged=not failure.refund,
                    )
            if drops:
                self.driver.job_discard([i for i in drops if i in changed])
            rescued.extend(sorted(changed))
            if len(expired) < self.config.rescue_batch:
                return rescued

    def prune_workers(self) -> list[str]:
        """Delete the rows of workers whose heartbeat is stale; return their ids. None for a
        while after a step of the clock (or this process's start: see the module): a live
        worker's last beat was written in the old time."""
        stale = self.config.worker_stale or self.grace * 3
        if self._steady_for(self.clock.stepped_at()) < stale.total_seconds():
            return []
        gone = self.driver.worker_prune(stale, now=self.clock.pinned())
        for worker_id in gone:
            events.warning("jobs.worker.pruned", worker_id=worker_id, stale_after=str(stale))
        return gone

    def prune(self) -> int:
        """Delete finished rows past their retention, batch after batch, within the pass's time
        budget; returns how many. ``next_in()`` is 0 while rows remain."""
        budget_end = self.clock.monotonic() + self.config.prune_budget.total_seconds()
        # Finished times are the database's (PostgreSQL's now()): retention counts on its
        # clock, so a leader whose clock is ahead cannot prune rows (and end their dedupe
        # window, lose their results) before their time.
        now = self.driver.database_now(now=self.clock.pinned())
        total = 0
        more = False
        plans = [(frozenset({JobState.COMPLETED, JobState.CANCELLED}), self.config.retention)]
        if self.config.dead_retention is not None:
            plans.append((frozenset({JobState.DEAD}), self.config.dead_retention))
        for states, keep in plans:
            while True:
                deleted = self.driver.job_prune(Prune(states, now - keep, self.config.prune_batch))
                total += deleted
                if deleted < self.config.prune_batch:
                    break
                if self.clock.monotonic() >= budget_end:
                    more = True
                    break
        self._backlog = more
        if total:
            events.info("jobs.pruned", count=total, more=more)
        return total
