"""The memory driver: the reference semantics of the ``Driver`` protocol, in one process.

Everything lives in dicts guarded by one lock, so every method is atomic with respect to every
other: the contract suite (``tests/contract``) treats this driver as the oracle the SQL drivers
must agree with. Records are frozen ``Job`` values, replaced whole on every change.

Semantics this driver pins down (the SQL drivers follow them):

- **Tenants.** ``tenant_id=None`` means "no tenant": jobs without a tenant share one dedupe
  space, as if None were a value (unlike SQL's ``NULL``, which never equals itself). ``""`` is
  an ordinary tenant id, distinct from None. In ``JobFilter`` and in the ``tenant_id=``
  arguments of ``job_get``/``job_cancel``/``job_retry``/``job_discard``, None means "any
  tenant" (no scoping); a string scopes to exactly that tenant.
- **Time.** ``now`` is used when given, else the host clock. A retry or snooze time that is
  not after ``now`` makes the job ``available`` with ``run_at`` kept as given.
- **Order.** Claims take highest priority, then oldest ``run_at``, then smallest id;
  ``job_list`` gives newest id first; ``job_list_expired`` oldest expiry first (then id); a
  bounded prune deletes the oldest finished first.
- **Retry by hand** keeps ``attempt`` and the error history, clears ``finished_at`` and
  ``cancel_reason``, and raises ``max_attempts`` to ``attempt + 1`` only when exhausted.
- **Fencing** is by token, not by time: an expired lease still works until someone else changes
  the row (the rescuer fails it through that same lease; a new claim issues a new token).
- **Transactions.** ``transaction()`` yields a ``MemoryTransaction``: inserts passed
  ``executor=tx`` are staged on it and applied together, under the lock, at commit, or
  dropped when the ``with`` block raises. Dedupe inside the transaction sees committed rows and
  the rows this transaction staged.
- **Limits** (``ultimat3.jobs.limits``). A claim with ``limited`` takes a job with a
  ``limit_key`` only while its key has fewer than ``limit_max`` running jobs with unexpired
  leases and, under a rate limit, fewer than ``rate_max`` starts (``attempted_at``) within
  ``rate_period``; within a priority, keys take turns (every key's first due job, then every
  key's second; the unlimited jobs first, as one key; keys in order after the last key the
  previous claim took). A claim without ``limited`` never takes a job with a key. A unique key
  is held by a job in one of its ``unique_states``; a conflict returns the holder, after
  giving it the new input, ``run_at`` and priority if ``unique_replace`` and it waits.
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
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from ultimat3.jobs.clock import SystemClock, utcnow
from ultimat3.jobs.driver import (
    DatabaseId,
    Driver,
    Executor,
    Inspection,
    Joined,
    StallTracker,
    wait_until_final,
)
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.ids import token
from ultimat3.jobs.limits import STATE_BITS, keys_to_look
from ultimat3.jobs.records import (
    ACTIVE_STATES,
    FINAL_STATES,
    ClaimParams,
    Cycle,
    CycleResult,
    Failure,
    FinishedCount,
    FlowState,
    InsertResult,
    Job,
    JobFilter,
    JobState,
    Lease,
    NewJob,
    QueueInfo,
    ScheduleState,
    WorkerInfo,
)

__all__ = ["MemoryDriver", "MemoryTransaction"]

_Key = tuple[str | None, str]
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


class _Flow(NamedTuple):
    """A job's limits: its partition, how many may run at once, and how many may start per
    ``rate_period`` (0: no rate limit)."""

    key: str
    most: int
    rate_max: int
    rate_period: timedelta


@dataclass(eq=False)
class MemoryTransaction:
    """A staging buffer for one memory transaction: the executor ``transaction()`` yields.

    Rows staged here become visible, all together, only when the transaction commits.
    """

    driver: MemoryDriver
    inserts: list[Job] = field(default_factory=list)
    keys: dict[_Key, str] = field(default_factory=dict)
    limits: dict[str, _Flow] = field(default_factory=dict)
    uniques: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: Debounces of committed jobs, applied at commit if the job still waits then.
    replaces: list[tuple[str, Job]] = field(default_factory=list)
    open: bool = True


class MemoryDriver:
    """Jobs in dicts behind one lock; see the module docstring for the semantics it pins."""

    name = "memory"
    display_url = "memory://"
    # Writers never wait for an open transaction here: staged rows take no lock.
    single_writer = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._generation = 0  # bumped on every change a waiter cares about
        self._jobs: dict[str, Job] = {}
        self._keys: dict[_Key, str] = {}
        self._paused: dict[str, bool] = {}
        self._schedules: dict[str, ScheduleState] = {}
        self._leaders: dict[str, tuple[str, datetime]] = {}  # name -> (holder, expires_at)
        self._workers: dict[str, WorkerInfo] = {}
        self._monotonic = SystemClock().monotonic
        self._identity = DatabaseId("memory", (id(self),), "memory://")
        self._isolated: set[str] = set()  # ids of jobs rescued after their worker died
        self._limits: dict[str, _Flow] = {}  # the jobs with a limit
        self._uniques: dict[str, tuple[str, int]] = {}  # id -> (unique_key, unique_states)
        self._after = ""  # limited claims: the last key taken (keys take turns after it)
        self.stalls = StallTracker()

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
        for job in tx.inserts:
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
                self._hold(job.id, unique)
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
        at = _now(now)
        tx = self._tx(executor) if executor is not None else None
        with self._lock:
            results: list[InsertResult] = []
            for new in jobs:
                key = (new.tenant_id, new.idempotency_key)
                existing = self._keys.get(key) or (tx.keys.get(key) if tx else None)
                if existing is not None:
                    results.append(InsertResult(existing, deduped=True))
                    continue
                if new.id in self._jobs or (tx is not None and new.id in tx.keys.values()):
                    raise ValueError(f"job id {new.id} is already stored under another key")
                job = _new_job(new, at)
                if new.unique_key is not None:
                    holder = self._unique_holder(new.unique_key, tx)
                    if holder is not None:
                        if new.unique_replace:
                            self._replace_holder(holder, job, tx)
                        results.append(InsertResult(holder, deduped=True))
                        continue
                    unique = (new.unique_key, new.unique_states)
                    if tx is None:
                        self._hold(job.id, unique)
                    else:
                        tx.uniques[job.id] = unique
                limits = self._limits if tx is None else tx.limits
                if new.limit_key is not None:
                    limits[job.id] = _Flow(
                        new.limit_key, new.limit_max, new.rate_max, new.rate_period
                    )
                if tx is None:
                    self._put(job)
                    self._keys[key] = job.id
                else:
                    tx.inserts.append(job)
                    tx.keys[key] = job.id
                results.append(InsertResult(job.id, deduped=False))
            if tx is None and any(not r.deduped for r in results):
                self._notify()
            return results

    def _unique_holder(self, key: str, tx: MemoryTransaction | None) -> str | None:
        """The job holding ``key`` (its state is among its unique states): committed, or
        staged in ``tx``."""
        for id_, (held, states) in self._uniques.items():
            if held == key and states & STATE_BITS[self._jobs[id_].state.value]:
                return id_
        if tx is not None:
            for job in tx.inserts:
                unique = tx.uniques.get(job.id)
                if (
                    unique is not None
                    and unique[0] == key
                    and unique[1] & STATE_BITS[job.state.value]
                ):
                    return job.id
        return None

    def _hold(self, job_id: str, unique: tuple[str, int]) -> None:
        self._uniques[job_id] = unique

    def _replace_holder(self, holder: str, new: Job, tx: MemoryTransaction | None) -> None:
        """Debounce: the holder, if still waiting, takes ``new``'s input, run_at and priority."""
        if tx is None:
            if self._debounce(holder, new):
                self._notify()
            return
        for i, job in enumerate(tx.inserts):
            if job.id == holder:
                tx.inserts[i] = _debounced(job, new)
                return
        tx.replaces.append((holder, new))

    def _debounce(self, holder: str, new: Job) -> bool:
        job = self._jobs.get(holder)
        if job is None or job.state not in _WAITING:
            return False
        self._put(_debounced(job, new))
        return True

    def _claim_until(self, params: ClaimParams) -> tuple[list[Job], timedelta | None]:
        """The claimed jobs, and how long after ``now`` a job held back by a rate limit may be
        claimed."""
        at = _now(params.now)
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
            best, wake_at = self._within_limits(due, max(0, params.limit), at)
        else:
            best = sorted(due, key=_order)[: max(0, params.limit)]
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

    def _within_limits(
        self, due: Iterable[Job], limit: int, at: datetime
    ) -> tuple[list[Job], datetime | None]:
        """The jobs a claim with limits takes (``limits``): the unlimited due jobs, and key by
        key from the one after the cursor, each key's first due jobs up to its free slots until
        the claim is full; of those, the first ``limit`` with keys taking turns within a
        priority (every key's first job, the unlimited jobs first as one key, then every key's
        second...). A slot is held by a running job of the key whose lease has not expired,
        and, under a rate limit, by each start within the window. Also returns when the first
        full window looked at reopens (its oldest start leaves it)."""
        ordered = sorted(due, key=_order)
        plain: list[Job] = []
        by_key: dict[str, list[Job]] = {}
        for job in ordered:
            flow = self._limits.get(job.id)
            if flow is None:
                if len(plain) < limit:
                    plain.append(job)
            else:
                by_key.setdefault(flow.key, []).append(job)
        running: Counter[str] = Counter()
        starts: dict[str, list[datetime]] = {}
        for job in self._jobs.values():
            flow = self._limits.get(job.id)
            if flow is None or flow.key not in by_key:
                continue
            if (
                job.state is JobState.RUNNING
                and job.lease_expires_at is not None
                and job.lease_expires_at > at
            ):
                running[flow.key] += 1
            if job.attempted_at is not None:
                starts.setdefault(flow.key, []).append(job.attempted_at)
        keys = sorted(by_key)
        rotated = [k for k in keys if k > self._after] + [k for k in keys if k <= self._after]
        places: list[tuple[int, int, int, datetime, str, Job]] = [
            (-job.priority, rank, -1, job.run_at, job.id, job) for rank, job in enumerate(plain)
        ]
        need, taken, wake_at = limit, 0, None
        looked = rotated[: keys_to_look(limit)]
        for key in looked:
            if need <= 0:
                break
            head = self._limits[by_key[key][0].id]
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
                (-job.priority, rank, taken, job.run_at, job.id, job)
                for rank, job in enumerate(take)
            ]
            taken += 1
            need -= len(take)
            self._after = key  # round-robin: the next claim starts after the last key taken
        if not taken and looked and len(looked) == keys_to_look(limit):
            self._after = looked[-1]  # past the full keys looked at
        places.sort(key=lambda place: place[:5])
        return [place[-1] for place in places[:limit]], wake_at

    def lease_extend(
        self, leases: Sequence[Lease], lease_for: timedelta, *, now: datetime | None = None
    ) -> set[str]:
        at = _now(now)
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
            return self._fail(failures, _now(now))

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
                job = replace(job, state=_waiting(retry_at, at), run_at=retry_at, errors=errors)
            self._put(_unleased(job))
            if failure.isolate:
                self._isolated.add(job.id)
            else:
                self._isolated.discard(job.id)
            changed.add(job.id)
        if changed:
            self._notify()
        return changed

    def job_cycle(self, cycle: Cycle, *, now: datetime | None = None) -> CycleResult:
        at = _now(now)
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
        return CycleResult(completed, failed, claimed, wake_in)

    def job_release_claim(self, token: str, *, now: datetime | None = None) -> list[str]:
        prefix = f"{token}."
        return self._release(lambda job: (job.lease_token or "").startswith(prefix), _now(now))

    def _release(self, which: Callable[[Job], bool], at: datetime) -> list[str]:
        """Put the running jobs ``which`` picks back, available at ``at``, attempt refunded."""
        released: list[str] = []
        with self._lock:
            for job in list(self._jobs.values()):
                if job.state is JobState.RUNNING and which(job):
                    self._put(
                        _unleased(
                            replace(
                                job,
                                state=JobState.AVAILABLE,
                                run_at=at,
                                attempt=max(0, job.attempt - 1),
                            )
                        )
                    )
                    released.append(job.id)
            if released:
                self._notify()
        return sorted(released)

    def job_flow(self, job_id: str, *, now: datetime | None = None) -> FlowState | None:
        at = _now(now)
        with self._lock:
            flow = self._limits.get(job_id)
            if flow is None or job_id not in self._jobs:
                return None
            running = 0
            starts: list[datetime] = []
            for job in self._jobs.values():
                other = self._limits.get(job.id)
                if other is None or other.key != flow.key:
                    continue
                if (
                    job.state is JobState.RUNNING
                    and job.lease_expires_at is not None
                    and job.lease_expires_at > at
                ):
                    running += 1
                if (
                    flow.rate_max
                    and job.attempted_at is not None
                    and job.attempted_at > at - flow.rate_period
                ):
                    starts.append(job.attempted_at)
        return FlowState(
            flow.key,
            flow.most,
            running,
            flow.rate_max,
            flow.rate_period,
            len(starts),
            min(starts, default=None),
        )

    def job_peek_isolated(self, queues: Sequence[str], *, now: datetime | None = None) -> bool:
        at = _now(now)
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
        at = _now(now)
        with self._lock:
            job = self._held(lease)
            if job is None:
                return False
            until = job.run_at if delay is None else at + delay
            self._put(
                _unleased(
                    replace(
                        job,
                        state=_waiting(until, at),
                        run_at=until,
                        attempt=max(0, job.attempt - 1),
                    )
                )
            )
            self._notify()
            return True

    def job_cancel(
        self,
        job_id: str,
        *,
        reason: str,
        lease: Lease | None = None,
        tenant_id: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        at = _now(now)
        with self._lock:
            job = self._scoped(job_id, tenant_id)
            if job is None:
                return False
            if lease is not None:
                if lease.id != job_id or self._held(lease) is None:
                    return False
            elif job.state not in ACTIVE_STATES:
                return False
            self._put(
                _unleased(
                    replace(job, state=JobState.CANCELLED, finished_at=at, cancel_reason=reason)
                )
            )
            return True

    def job_list_running(self, *, limit: int) -> list[Job]:
        with self._lock:
            running = [job for job in self._jobs.values() if job.state is JobState.RUNNING]
        # A running job always holds a lease (the records' invariant).
        running.sort(
            key=lambda job: (job.lease_expires_at or datetime.min.replace(tzinfo=UTC), job.id)
        )
        return running[: max(0, limit)]

    def job_list_expired(
        self, *, limit: int, now: datetime | None = None, isolated: bool | None = None
    ) -> list[Job]:
        at = _now(now)
        with self._lock:
            expired = [
                job
                for job in self._jobs.values()
                if job.state is JobState.RUNNING
                and job.lease_expires_at is not None
                and job.lease_expires_at < at
                and (isolated is None or (job.id in self._isolated) is isolated)
            ]
        expired.sort(key=lambda job: (job.lease_expires_at, job.id))
        return expired[: max(0, limit)]

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
                clock=SystemClock(),
            )

    def job_list(
        self, where: JobFilter, *, limit: int = 100, before_id: str | None = None
    ) -> list[Job]:
        with self._lock:
            found = [
                job
                for job in self._jobs.values()
                if _matches(job, where) and (before_id is None or job.id < before_id)
            ]
        found.sort(key=lambda job: job.id, reverse=True)
        return found[: max(0, limit)]

    def job_id_below(self, before_id: str | None, offset: int) -> str | None:
        with self._lock:
            ids = sorted(
                (i for i in self._jobs if before_id is None or i < before_id), reverse=True
            )
        return ids[offset] if 0 <= offset < len(ids) else None

    def job_count(self, where: JobFilter) -> dict[tuple[str, JobState], int]:
        with self._lock:
            counts = Counter(
                (job.queue, job.state) for job in self._jobs.values() if _matches(job, where)
            )
        return dict(counts)

    def job_finished_counts(
        self, since: datetime, bucket: timedelta, *, tenant_id: str | None = None
    ) -> list[FinishedCount]:
        since = _utc(since)
        with self._lock:
            counts = Counter(
                (job.queue, job.state, (job.finished_at - since) // bucket)
                for job in self._jobs.values()
                if job.finished_at is not None
                and job.finished_at >= since
                and job.state in FINAL_STATES
                and (tenant_id is None or job.tenant_id == tenant_id)
            )
        return [
            FinishedCount(queue, state, since + k * bucket, n)
            for (queue, state, k), n in sorted(counts.items())
        ]

    def job_retry(
        self, ids: Sequence[str], *, tenant_id: str | None = None, now: datetime | None = None
    ) -> list[str]:
        at = _now(now)
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

    def job_prune(
        self, *, states: frozenset[JobState], finished_before: datetime, limit: int
    ) -> int:
        cutoff = _utc(finished_before)
        with self._lock:
            old = [
                job
                for job in self._jobs.values()
                if job.state in states
                and job.state in FINAL_STATES
                and job.finished_at is not None
                and job.finished_at < cutoff
            ]
            old.sort(key=lambda job: (job.finished_at, job.id))
            for job in old[: max(0, limit)]:
                self._delete(job)
        return min(len(old), max(0, limit))

    # -- queues ------------------------------------------------------------------------------

    def queue_set_paused(self, queue: str, paused: bool) -> None:
        with self._lock:
            self._paused[queue] = paused
            if not paused:
                self._notify()

    def queue_list(self, *, now: datetime | None = None) -> list[QueueInfo]:
        at = _now(now)
        with self._lock:
            counts: dict[str, Counter[JobState]] = {name: Counter() for name in self._paused}
            oldest: dict[str, datetime] = {}
            for job in self._jobs.values():
                counts.setdefault(job.queue, Counter())[job.state] += 1
                due = job.state in (JobState.SCHEDULED, JobState.AVAILABLE) and job.run_at <= at
                if due and (job.queue not in oldest or job.run_at < oldest[job.queue]):
                    oldest[job.queue] = job.run_at
            return [
                QueueInfo(name, self._paused.get(name, False), dict(counts[name]), oldest.get(name))
                for name in sorted(counts)
            ]

    # -- wake-ups ----------------------------------------------------------------------------

    # -- cron schedules and leadership -----------------------------------------------------

    def schedule_read(self, tasks: Sequence[str]) -> dict[str, ScheduleState]:
        with self._lock:
            return {task: self._schedules[task] for task in tasks if task in self._schedules}

    def schedule_state(
        self, tasks: Sequence[str], *, now: datetime | None = None
    ) -> dict[str, ScheduleState]:
        at = _now(now)
        with self._lock:
            for task in tasks:
                self._schedules.setdefault(task, ScheduleState(task, at, None))
            return {task: self._schedules[task] for task in tasks}

    def schedule_fire(
        self,
        task: str,
        occurrence: datetime,
        jobs: Sequence[NewJob],
        *,
        now: datetime | None = None,
    ) -> list[InsertResult] | None:
        at = _now(now)
        occurrence = _utc(occurrence)
        with self._lock:
            state = self._schedules.get(task) or ScheduleState(task, at, None)
            if state.last_fired_at is not None and state.last_fired_at >= occurrence:
                return None
            self._schedules[task] = replace(state, last_fired_at=occurrence)
        return self.job_insert_many(jobs, now=now)

    def schedule_rewind(self, task: str, was: datetime, to: datetime) -> bool:
        with self._lock:
            state = self._schedules.get(task)
            if state is None or state.last_fired_at != _utc(was):
                return False
            self._schedules[task] = replace(state, last_fired_at=_utc(to))
            return True

    def database_now(self, *, now: datetime | None = None) -> datetime:
        return _now(now)

    def leader_elect(
        self, name: str, holder: str, ttl: timedelta, *, now: datetime | None = None
    ) -> bool:
        at = _now(now)
        with self._lock:
            current = self._leaders.get(name)
            if current is not None and current[0] != holder and current[1] > at:
                return False
            self._leaders[name] = (holder, at + ttl)
            return True

    def leader_resign(self, name: str, holder: str) -> None:
        with self._lock:
            current = self._leaders.get(name)
            if current is not None and current[0] == holder:
                del self._leaders[name]

    # -- live workers ------------------------------------------------------------------------

    def worker_beat(self, worker: WorkerInfo, *, now: datetime | None = None) -> None:
        at = _now(now)
        with self._lock:
            self._workers[worker.id] = replace(worker, heartbeat_at=at)

    def worker_remove(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    def worker_prune(self, stale_after: timedelta, *, now: datetime | None = None) -> list[str]:
        cutoff = _now(now) - stale_after
        with self._lock:
            stale = sorted(w.id for w in self._workers.values() if w.heartbeat_at < cutoff)
            for worker_id in stale:
                del self._workers[worker_id]
        return stale

    def worker_list(self) -> list[WorkerInfo]:
        with self._lock:
            return [self._workers[worker_id] for worker_id in sorted(self._workers)]

    def wait_for_jobs(self, timeout: float, wake: threading.Event) -> None:
        deadline = self._monotonic() + timeout
        with self._changed:
            seen = self._generation
            while self._generation == seen and not wake.is_set():
                remaining = deadline - self._monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(min(remaining, _WAKE_POLL))

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
        self._put(_unleased(replace(job, state=JobState.COMPLETED, finished_at=at, result=result)))
        if job.id in self._limits:
            self._notify()  # a slot is free: a worker waiting on a full limit may claim
        return True

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


def _now(now: datetime | None) -> datetime:
    return utcnow() if now is None else _utc(now)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} is naive; drivers take timezone-aware UTC datetimes")
    return moment.astimezone(UTC)


def _debounced(job: Job, new: Job) -> Job:
    return replace(job, input=new.input, run_at=new.run_at, state=new.state, priority=new.priority)


def _order(job: Job) -> tuple[int, datetime, str]:
    """The order claims take waiting jobs in: priority first, then run_at, then id."""
    return (-job.priority, job.run_at, job.id)


def _waiting(run_at: datetime, now: datetime) -> JobState:
    return JobState.SCHEDULED if run_at > now else JobState.AVAILABLE


def _unleased(job: Job) -> Job:
    return replace(job, lease_token=None, lease_expires_at=None)


def _new_job(new: NewJob, now: datetime) -> Job:
    run_at = now if new.run_at is None else _utc(new.run_at)
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
        state=_waiting(run_at, now),
        attempt=0,
        max_attempts=new.max_attempts,
        run_at=run_at,
        created_at=now,
        trace_context=new.trace_context,
    )


def _matches(job: Job, where: JobFilter) -> bool:
    return (
        (where.states is None or job.state in where.states)
        and (where.queue is None or job.queue == where.queue)
        and (where.name is None or job.name == where.name)
        and (where.tenant_id is None or job.tenant_id == where.tenant_id)
        and (where.ids is None or job.id in where.ids)
        and (where.min_id is None or job.id >= where.min_id)
    )


if TYPE_CHECKING:
    # mypy proves here that the class satisfies the protocol, signature by signature.
    _conforms: Driver = MemoryDriver()
    _inspects: Inspection = MemoryDriver()
