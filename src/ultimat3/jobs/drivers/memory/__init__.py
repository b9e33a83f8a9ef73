"""The memory driver: the reference semantics of the ``Driver`` protocol, in one process.

Everything lives in dicts guarded by one lock, so every method is atomic with respect to every
other: the contract suite (``tests/contract``) treats this driver as the oracle the SQL drivers
must agree with. Records are frozen ``Job`` values, replaced whole on every change.

Semantics this driver pins down (the SQL drivers follow them):

- **Tenants.** ``tenant_id=None`` means "no tenant": jobs without a tenant share one dedupe
  space, as if None were a value (unlike SQL's ``NULL``, which never equals itself). ``""`` is
  an ordinary tenant id, distinct from None. In ``JobFilter``, ``Cancellation`` and the
  ``tenant_id=`` arguments of ``job_get``/``job_retry``/``job_discard``, None means "any
  tenant" (no scoping); a string scopes to exactly that tenant.
- **Time.** ``now`` is used when given, else the host clock. A retry or snooze time that is
  not after ``now`` makes the job ``available`` with ``run_at`` kept as given.
- **Order.** Claims as ``driver`` says; ``job_list`` gives newest id first;
  ``job_list_expired`` oldest expiry first (then id); a bounded prune the oldest finished first.
- **Retry by hand** keeps ``attempt`` and the error history, clears ``finished_at`` and
  ``cancel_reason``, and raises ``max_attempts`` to ``attempt + 1`` only when exhausted.
- **Fencing** is by token, not by time: an expired lease still works until someone else changes
  the row (the rescuer fails it through that same lease; a new claim issues a new token).
- **Transactions.** ``transaction()`` yields a ``MemoryTransaction``: inserts passed
  ``executor=tx`` are staged on it and applied together, under the lock, at commit, or
  dropped when the ``with`` block raises. Dedupe inside the transaction sees committed rows and
  the rows this transaction staged.
- **Limits** (``ultimat3.jobs.limits``; ``rows.within_limits``). A claim without ``limited``
  never takes a job with a key. A unique key is held by a job in one of its
  ``unique_states``; a conflict returns the holder (debounced if ``unique_replace``).
- **Wake-ups.** ``wait_for_jobs`` returns early after an insert (a staged one at its commit), a
  failure, a snooze, a manual retry or a resumed queue: every change that can make a job
  claimable. ``job_wait`` returns at the change that finishes its job.

Limits (where it differs from a database, knowingly):

- Nothing is persisted and nothing is shared across processes.
- Staged rows are invisible to other transactions, and nothing blocks on them. If another
  writer commits the same (tenant, key) between staging and commit, the committed row wins and
  the staged insert is dropped at commit (PostgreSQL would instead make that writer wait and
  then dedupe onto the staged row).
- A claim scans every stored job and sorts the due ones (linear in the table): fine for tests
  and demos, not for a backlog of millions.
- ``wait_for_jobs`` notices a set ``wake`` event within about 50 ms (an ``Event`` cannot
  notify a ``Condition``), and a change at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import (
    DatabaseId,
    Driver,
    Executor,
    Inspection,
    Joined,
    StallTracker,
    wait_until_final,
)
from ultimat3.jobs.drivers.memory.reads import Key, Store
from ultimat3.jobs.drivers.memory.rows import (
    Flow,
    debounced,
    new_job,
    order,
    unleased,
    waiting_state,
    within_limits,
)
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.ids import token
from ultimat3.jobs.limits import STATE_BITS
from ultimat3.jobs.records import (
    ACTIVE_STATES,
    FINAL_STATES,
    Cancellation,
    ClaimParams,
    Cycle,
    CycleResult,
    ExpiredQuery,
    Failure,
    Fire,
    InsertResult,
    Job,
    JobState,
    Leadership,
    Lease,
    NewJob,
    Prune,
    Rewind,
    ScheduleState,
    WorkerInfo,
)

__all__ = ["MemoryDriver", "MemoryTransaction"]

#: How often a waiter re-checks its ``wake`` event, in seconds.
_WAKE_POLL = 0.05
#: Only dead and cancelled jobs can be retried or discarded by hand.
_PARKED = frozenset({JobState.DEAD, JobState.CANCELLED})
_WAITING = frozenset({JobState.SCHEDULED, JobState.AVAILABLE})
_ADOPT_FIX = (
    "with the memory driver, pass the executor that `driver.transaction()` yields; "
    "a database connection cannot join an in-memory job store (use the sqlite or postgres "
    "driver for transactional enqueue on your own connection)"
)


@dataclass(eq=False)
class MemoryTransaction:
    """A staging buffer for one memory transaction: the executor ``transaction()`` yields.

    Rows staged here become visible, all together, only when the transaction commits.
    """

    driver: MemoryDriver
    jobs: dict[str, Job] = field(default_factory=dict)  # in staging order
    keys: dict[Key, str] = field(default_factory=dict)
    limits: dict[str, Flow] = field(default_factory=dict)
    uniques: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: Debounces of committed jobs, applied at commit if the job still waits then.
    replaces: list[tuple[str, Job]] = field(default_factory=list)
    open: bool = True


class MemoryDriver(Store):
    """Jobs in dicts behind one lock; see the module docstring for the semantics it pins."""

    name = "memory"
    display_url = "memory://"
    # Writers never wait for an open transaction here: staged rows take no lock.
    single_writer = False

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self._identity = DatabaseId("memory", (id(self),), "memory://")
        self.stalls = StallTracker(clock=self._clock)

    # -- lifecycle ---------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        return []

    def migration_sql(self) -> list[tuple[int, str]]:
        return []

    def schema_current(self) -> bool:
        return True

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        return self._identity

    def close(self) -> None:
        with self._lock:
            self._notify()

    # -- transactions ------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Joined]:
        tx = MemoryTransaction(self)
        try:
            yield Joined(tx, self._identity)
        except BaseException:
            tx.open = False
            raise
        with self._lock:
            tx.open = False
            self._commit(tx)

    def adopt(self, connection: Any) -> Joined:
        return Joined(self._tx(connection), self._identity)

    def _tx(self, executor: Any) -> MemoryTransaction:
        if isinstance(executor, Joined):
            executor = executor.connection
        if not isinstance(executor, MemoryTransaction) or executor.driver is not self:
            raise ConfigurationError(
                f"the memory driver cannot join {type(executor).__name__} as a transaction",
                fix=_ADOPT_FIX,
            )
        if not executor.open:
            raise ConfigurationError(
                "this memory transaction has already committed or rolled back",
                fix="use the executor only inside its `with driver.transaction()` block",
            )
        return executor

    def _commit(self, tx: MemoryTransaction) -> None:
        inserted = False
        for job in tx.jobs.values():
            key = (job.tenant_id, job.idempotency_key)
            # Another writer committed the key or id since staging: the committed row wins.
            if key in self._keys or job.id in self._jobs:
                continue
            unique = tx.uniques.get(job.id)
            if unique is not None and self._unique_holder(unique[0], None) is not None:
                continue  # likewise a committed holder of its unique key
            if job.id in tx.limits:
                self._limits[job.id] = tx.limits[job.id]
            self._put(job)
            self._keys[key] = job.id
            if unique is not None:
                self._uniques[job.id] = unique
            inserted = True
        for holder, new in tx.replaces:
            inserted = self._debounce(holder, new) or inserted
        if inserted:
            self._notify()

    # -- jobs --------------------------------------------------------------------------------

    def job_insert_many(
        self,
        jobs: Sequence[NewJob],
        *,
        executor: Executor | None = None,
        now: datetime | None = None,
    ) -> list[InsertResult]:
        at = self._at(now)
        tx = self._tx(executor) if executor is not None else None
        # Where new rows go: the store, or the transaction's staging buffer.
        rows, keys, limits, uniques = (
            (self._jobs, self._keys, self._limits, self._uniques)
            if tx is None
            else (tx.jobs, tx.keys, tx.limits, tx.uniques)
        )
        with self._lock:
            results: list[InsertResult] = []
            for new in jobs:
                key = (new.tenant_id, new.idempotency_key)
                existing = self._keys.get(key) or keys.get(key)
                if existing is not None:
                    results.append(InsertResult(existing, deduped=True))
                    continue
                if new.id in self._jobs or new.id in rows:
                    raise ValueError(f"job id {new.id} is already stored under another key")
                job = new_job(new, at)
                if new.unique_key is not None:
                    holder = self._unique_holder(new.unique_key, tx)
                    if holder is not None:
                        if new.unique_replace:
                            self._replace_holder(holder, job, tx)
                        results.append(InsertResult(holder, deduped=True))
                        continue
                    uniques[job.id] = (new.unique_key, new.unique_states)
                if new.limit_key is not None:
                    limits[job.id] = Flow(
                        new.limit_key, new.limit_max, new.rate_max, new.rate_period
                    )
                rows[job.id] = job  # waiting: no job_wait to wake (``_put``)
                keys[key] = job.id
                results.append(InsertResult(job.id, deduped=False))
            if tx is None and any(not r.deduped for r in results):
                self._notify()
            return results

    def _unique_holder(self, key: str, tx: MemoryTransaction | None) -> str | None:
        """The job holding ``key`` (its state is among its unique states): committed, or
        staged in ``tx``."""
        places = [(self._jobs, self._uniques)] + ([(tx.jobs, tx.uniques)] if tx else [])
        for rows, uniques in places:
            for id_, (held, states) in uniques.items():
                if held == key and states & STATE_BITS[rows[id_].state.value]:
                    return id_
        return None

    def _replace_holder(self, holder: str, new: Job, tx: MemoryTransaction | None) -> None:
        """Debounce: the holder, if still waiting, takes ``new``'s input, run_at and priority."""
        if tx is None:
            if self._debounce(holder, new):
                self._notify()
            return
        if holder in tx.jobs:
            tx.jobs[holder] = debounced(tx.jobs[holder], new)
        else:
            tx.replaces.append((holder, new))

    def _debounce(self, holder: str, new: Job) -> bool:
        job = self._jobs.get(holder)
        if job is None or job.state not in _WAITING:
            return False
        self._put(debounced(job, new))
        return True

    def _claim_until(self, params: ClaimParams) -> tuple[list[Job], timedelta | None]:
        """The claimed jobs, and how long after ``now`` a job held back by a rate limit may be
        claimed."""
        at = self._at(params.now)
        queues = set(params.queues)
        wake_at = None
        skip = set(params.skip)
        due = [
            job
            for job in self._jobs.values()
            if job.state in _WAITING
            and job.run_at <= at
            and job.queue in queues
            and not self._paused.get(job.queue, False)
            and (job.id in self._isolated) is params.isolated
            and (params.limited or job.id not in self._limits)
            and job.name not in skip
        ]
        if params.limited:
            best, wake_at, self._after = within_limits(
                due,
                max(0, params.limit),
                at,
                flows=self._limits,
                jobs=self._jobs.values(),
                after=self._after,
            )
        else:
            best = sorted(due, key=order)[: max(0, params.limit)]
        claimed: list[Job] = []
        claim = params.token or token()
        for job in best:
            running = replace(
                job,
                state=JobState.RUNNING,
                attempt=job.attempt + 1,
                attempted_at=at,
                lease_token=f"{claim}.{job.id}",
                lease_expires_at=at + params.lease_for,
                worker_id=params.worker_id,
            )
            self._put(running)
            claimed.append(running)
        return claimed, (wake_at - at if wake_at is not None else None)

    def lease_extend(
        self, leases: Sequence[Lease], lease_for: timedelta, *, now: datetime | None = None
    ) -> set[str]:
        at = self._at(now)
        held: set[str] = set()
        with self._lock:
            for lease in leases:
                job = self._held(lease)
                if job is not None:
                    self._put(replace(job, lease_expires_at=at + lease_for))
                    held.add(job.id)
        return held

    def job_fail_many(
        self, failures: Sequence[Failure], *, now: datetime | None = None
    ) -> set[str]:
        with self._lock:
            return self._fail(failures, self._at(now))

    def _fail(self, failures: Sequence[Failure], at: datetime) -> set[str]:
        changed: set[str] = set()
        for failure in failures:
            job = self._held(failure.lease)
            if job is None:
                continue
            errors = (*job.errors, failure.error)
            if failure.refund:
                job = replace(job, attempt=max(job.attempt - 1, 0))
            if failure.retry_in is None:
                job = replace(job, state=JobState.DEAD, finished_at=at, errors=errors)
            else:
                retry_at = at + failure.retry_in
                job = replace(
                    job, state=waiting_state(retry_at, at), run_at=retry_at, errors=errors
                )
            self._put(unleased(job))
            if failure.isolate:
                self._isolated.add(job.id)
            else:
                self._isolated.discard(job.id)
            changed.add(job.id)
        if changed:
            self._notify()
        return changed

    def job_cycle(self, cycle: Cycle, *, now: datetime | None = None) -> CycleResult:
        at = self._at(now)
        with self._lock:  # one lock: no reader can tell the parts apart from one transaction
            results = cycle.results
            completed = {
                lease.id
                for lease in cycle.completes
                if self._complete(lease, at, results.get(lease.id))
            }
            failed = self._fail(cycle.failures, at)
            claimed: list[Job] = []
            wake_in = None
            if cycle.claims is not None:
                claimed, wake_in = self._claim_until(cycle.claims)
                self._counts.seen = self._generation  # this thread's next wait counts from here
        return CycleResult(completed, failed, claimed, wake_in)

    def job_release_claim(self, token: str, *, now: datetime | None = None) -> list[str]:
        at, prefix = self._at(now), f"{token}."
        released: list[str] = []
        with self._lock:
            for job in list(self._jobs.values()):
                if job.state is JobState.RUNNING and (job.lease_token or "").startswith(prefix):
                    self._put_back(job, at, at)
                    released.append(job.id)
            if released:
                self._notify()
        return sorted(released)

    def job_peek_isolated(self, queues: Sequence[str], *, now: datetime | None = None) -> bool:
        at = self._at(now)
        wanted = set(queues)
        with self._lock:
            return any(
                (job := self._jobs.get(id_)) is not None
                and job.state in _WAITING
                and job.run_at <= at
                and job.queue in wanted
                and not self._paused.get(job.queue, False)
                for id_ in self._isolated
            )

    def job_snooze(
        self, lease: Lease, delay: timedelta | None, *, now: datetime | None = None
    ) -> bool:
        at = self._at(now)
        with self._lock:
            job = self._held(lease)
            if job is None:
                return False
            self._put_back(job, job.run_at if delay is None else at + delay, at)
            self._notify()
            return True

    def job_cancel(self, cancel: Cancellation, *, now: datetime | None = None) -> bool:
        at = self._at(now)
        if cancel.stray:
            return False
        with self._lock:
            job = self._scoped(cancel.job_id, cancel.tenant_id)
            if job is None:
                return False
            if cancel.lease is not None:
                if self._held(cancel.lease) is None:
                    return False
            elif job.state not in ACTIVE_STATES:
                return False
            reason = cancel.reason
            cancelled = replace(job, state=JobState.CANCELLED, finished_at=at, cancel_reason=reason)
            self._put(unleased(cancelled))
            return True

    def job_list_expired(self, query: ExpiredQuery, *, now: datetime | None = None) -> list[Job]:
        at = self._at(now)
        with self._lock:
            expired = [
                job
                for job in self._jobs.values()
                if job.state is JobState.RUNNING
                and job.lease_expires_at is not None
                and job.lease_expires_at < at
                and (query.isolated is None or (job.id in self._isolated) is query.isolated)
            ]
        expired.sort(key=lambda job: (job.lease_expires_at, job.id))
        return expired[: query.limit]

    def job_get(self, job_id: str, *, tenant_id: str | None = None) -> Job | None:
        with self._lock:
            return self._scoped(job_id, tenant_id)

    def job_wait(self, job_id: str, *, timeout: float, tenant_id: str | None = None) -> Job | None:
        """Woken by the change that finishes the job (``_put`` notifies every final state)."""
        with self._changed:
            return wait_until_final(
                lambda: self._scoped(job_id, tenant_id),
                self._changed.wait,
                timeout=timeout,
                clock=self._clock,
            )

    def job_retry(
        self, ids: Sequence[str], *, tenant_id: str | None = None, now: datetime | None = None
    ) -> list[str]:
        at = self._at(now)
        changed: list[str] = []
        with self._lock:
            for job_id in dict.fromkeys(ids):
                job = self._scoped(job_id, tenant_id)
                if job is None or job.state not in _PARKED:
                    continue
                self._put(
                    replace(
                        job,
                        state=JobState.AVAILABLE,
                        run_at=at,
                        max_attempts=max(job.max_attempts, job.attempt + 1),
                        finished_at=None,
                        cancel_reason=None,
                    )
                )
                changed.append(job_id)
            if changed:
                self._notify()
        return changed

    def job_discard(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        deleted: list[str] = []
        with self._lock:
            for job_id in dict.fromkeys(ids):
                job = self._scoped(job_id, tenant_id)
                if job is not None and job.state in _PARKED:
                    self._delete(job)
                    deleted.append(job_id)
        return deleted

    def job_prune(self, prune: Prune) -> int:
        with self._lock:
            old = [
                job
                for job in self._jobs.values()
                if job.state in prune.states
                and job.finished_at is not None
                and job.finished_at < prune.finished_before
            ]
            old.sort(key=lambda job: (job.finished_at, job.id))
            for job in old[: prune.limit]:
                self._delete(job)
        return min(len(old), prune.limit)

    # -- queues ------------------------------------------------------------------------------

    def queue_set_paused(self, queue: str, paused: bool) -> None:
        with self._lock:
            self._paused[queue] = paused
            if not paused:
                self._notify()

    # -- cron schedules and leadership -----------------------------------------------------

    def schedule_state(
        self, tasks: Sequence[str], *, now: datetime | None = None
    ) -> dict[str, ScheduleState]:
        at = self._at(now)
        with self._lock:
            for task in tasks:
                self._schedules.setdefault(task, ScheduleState(task, at, None))
            return {task: self._schedules[task] for task in tasks}

    def schedule_fire(
        self, fire: Fire, *, now: datetime | None = None
    ) -> list[InsertResult] | None:
        at = self._at(now)
        with self._lock:
            state = self._schedules.get(fire.task) or ScheduleState(fire.task, at, None)
            if state.last_fired_at is not None and state.last_fired_at >= fire.occurrence:
                return None
            self._schedules[fire.task] = replace(state, last_fired_at=fire.occurrence)
        return self.job_insert_many(fire.jobs, now=now)

    def schedule_rewind(self, rewind: Rewind) -> bool:
        with self._lock:
            state = self._schedules.get(rewind.task)
            if state is None or state.last_fired_at != rewind.was:
                return False
            self._schedules[rewind.task] = replace(state, last_fired_at=rewind.to)
            return True

    def database_now(self, *, now: datetime | None = None) -> datetime:
        return self._at(now)

    def leader_elect(self, lead: Leadership, *, now: datetime | None = None) -> bool:
        at = self._at(now)
        with self._lock:
            current = self._leaders.get(lead.name)
            if current is not None and current[0] != lead.holder and current[1] > at:
                return False
            self._leaders[lead.name] = (lead.holder, at + lead.ttl)
            return True

    def leader_resign(self, lead: Leadership) -> None:
        with self._lock:
            current = self._leaders.get(lead.name)
            if current is not None and current[0] == lead.holder:
                del self._leaders[lead.name]

    # -- live workers ------------------------------------------------------------------------

    def worker_beat(self, worker: WorkerInfo, *, now: datetime | None = None) -> None:
        at = self._at(now)
        with self._lock:
            self._workers[worker.id] = replace(worker, heartbeat_at=at)

    def worker_remove(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    def worker_prune(self, stale_after: timedelta, *, now: datetime | None = None) -> list[str]:
        cutoff = self._at(now) - stale_after
        with self._lock:
            stale = sorted(w.id for w in self._workers.values() if w.heartbeat_at < cutoff)
            for worker_id in stale:
                del self._workers[worker_id]
        return stale

    def wait_for_jobs(self, timeout: float, wake: threading.Event) -> None:
        """Until a change counted since this thread's last claim or wait (``_counts``; its
        first wait counts from its start), ``wake``, or ``timeout``."""
        deadline = self._clock.monotonic() + timeout
        with self._changed:
            seen = getattr(self._counts, "seen", self._generation)
            while self._generation == seen and not wake.is_set():
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(min(remaining, _WAKE_POLL))
            if self._generation != seen:
                seen = self._generation
            self._counts.seen = seen

    # -- helpers (call with the lock held) ---------------------------------------------------

    def _notify(self) -> None:
        self._generation += 1
        self._changed.notify_all()

    def _held(self, lease: Lease) -> Job | None:
        job = self._jobs.get(lease.id)
        if job is None or job.state is not JobState.RUNNING or job.lease_token != lease.token:
            return None
        return job

    def _scoped(self, job_id: str, tenant_id: str | None) -> Job | None:
        job = self._jobs.get(job_id)
        if job is None or (tenant_id is not None and job.tenant_id != tenant_id):
            return None
        return job

    def _complete(self, lease: Lease, at: datetime, result: str | None = None) -> bool:
        job = self._held(lease)
        if job is None:
            return False
        self._put(unleased(replace(job, state=JobState.COMPLETED, finished_at=at, result=result)))
        if job.id in self._limits:
            self._notify()  # a slot is free: a worker waiting on a full limit may claim
        return True

    def _put_back(self, job: Job, run_at: datetime, at: datetime) -> None:
        """A held job back to waiting, due at ``run_at``, its attempt given back."""
        attempt = max(0, job.attempt - 1)
        self._put(
            unleased(replace(job, state=waiting_state(run_at, at), run_at=run_at, attempt=attempt))
        )

    def _put(self, job: Job) -> None:
        self._jobs[job.id] = job
        if job.state in FINAL_STATES:
            self._changed.notify_all()  # for job_wait (wait_for_jobs reads _generation)

    def _delete(self, job: Job) -> None:
        del self._jobs[job.id]
        self._isolated.discard(job.id)
        self._limits.pop(job.id, None)
        self._uniques.pop(job.id, None)
        self._keys.pop((job.tenant_id, job.idempotency_key), None)


if TYPE_CHECKING:
    # mypy proves here that the class satisfies the protocol, signature by signature.
    _conforms: Driver = MemoryDriver()
    _inspects: Inspection = MemoryDriver()
