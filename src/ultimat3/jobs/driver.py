"""The driver seam: what every storage backend does, in records.

A driver stores jobs and moves them between states. It never decides policy: whether a failed
job retries, and when, is decided above it (``retry.next_retry``) and handed down as a
``Failure.retry_in``, a delay the driver adds to its ``now``. Methods are noun-first and speak
the records of ``records.py``; no SQL, cursor or row crosses the seam. ``Driver`` is what
processing needs (enqueue, the worker's cycle, the scheduler, maintenance); the operator's
reads and hand actions are a second, optional protocol, ``Inspection``, reached through
``inspection(driver)``.

Rules every driver keeps (the contract suite in ``tests/contract`` checks each one):

- **Time.** Every method that reads the time takes ``now``: ``None`` means the database's own
  clock (PostgreSQL ``now()``; the host clock for SQLite and memory). Lease expiry and due-ness
  are compared against that one clock, and a due time that is "some time from now" (a
  retry, a snooze, an enqueue's ``delay``) reaches the driver as a delay it adds to it.
- **Dedupe.** ``(tenant_id, idempotency_key)`` is unique among stored rows, enforced by the
  database (a unique index), never by check-then-insert. A duplicate insert returns the stored
  row's id with ``deduped=True`` and changes nothing. Pruning a row frees its key.
- **Claim.** A claim takes due jobs (``state`` scheduled or available, ``run_at <= now``) from
  unpaused queues, highest ``priority`` first, then oldest ``run_at``, then id; sets them
  ``running``, adds one to ``attempt`` (the attempt is counted at claim time, so a job that kills
  its worker cannot loop forever), and gives each a fresh lease token expiring at
  ``now + lease_for``. No two claims ever return the same (job, token). Jobs marked isolated
  (rescued after their worker died) are claimed only by an ``isolated=True`` claim, and
  every failure write sets or clears that mark (``Failure.isolate``).
- **Fencing.** Every write after the claim names a ``Lease``; it changes a row only while the
  row is ``running`` with that token. A stale token matches nothing, and the method reports
  which ids it changed.
- **Transactions.** ``transaction()`` yields a ``Joined`` (a connection inside a write
  transaction on the job database, and the database it is on); passing it as ``executor=``
  makes an insert or a completion part of that transaction: visible if and only if it commits.
  ``adopt(conn)`` turns a caller's own connection into a ``Joined`` after checking where it
  points. Joining is decided by **database identity** (``DatabaseId``: the file's device and
  inode for SQLite; the server and database for PostgreSQL), never by driver object, so any
  number of drivers on one database write in each other's transactions.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, cast

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock, SystemClock
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.records import (
    FINAL_STATES,
    Cancellation,
    Cycle,
    CycleResult,
    ExpiredQuery,
    Failure,
    FinishedCount,
    Fire,
    FlowState,
    InsertResult,
    Job,
    JobFilter,
    JobState,
    Leadership,
    Lease,
    NewJob,
    Prune,
    QueueInfo,
    Rewind,
    ScheduleState,
    WorkerInfo,
)

__all__ = [
    "CLOCK_SKEW_WARN",
    "DatabaseId",
    "Driver",
    "Executor",
    "Inspection",
    "Joined",
    "StallTracker",
    "check_clock_skew",
    "current_tx",
    "inspection",
]


@dataclass(frozen=True, slots=True)
class DatabaseId:
    """Which database a connection reaches: equal ids are one database, whichever object (a
    driver, an outbox store, a caller's connection) found it. ``label`` is for messages only."""

    kind: str
    key: tuple[Any, ...]
    label: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True, eq=False)
class Joined:
    """A transaction that writes can join: a connection (``sqlite3.Connection``,
    ``psycopg.Connection``, or a memory driver's staging buffer) and the database it is on.

    ``serial`` is set for a connection shared with an event loop (an ``AsyncConnection``'s
    sync view): async enqueues in the block then run one at a time on it."""

    connection: Any
    database: DatabaseId
    serial: asyncio.Lock | None = None


#: Kept for the seam's parameter names (``executor=``): a joined transaction.
Executor = Joined

#: The transaction the current code runs in, set by ``app.transaction()`` / ``app.using()``.
#: Drivers read it to refuse, at once, a write that could only wait for the caller's own lock.
current_tx: ContextVar[Joined | None] = ContextVar("ultimat3_jobs_current_tx", default=None)


class ForkSafe(Protocol):
    def _after_fork(self) -> None: ...


_renewed: weakref.WeakSet[Any] = weakref.WeakSet()


def renew_after_fork(owner: ForkSafe) -> None:
    """Have ``owner._after_fork()`` run in every child this process forks while ``owner``
    lives (it is held weakly): a driver leaves the connections it inherited to the parent and
    opens its own."""
    _renewed.add(owner)


def _after_fork() -> None:
    for owner in list(_renewed):
        owner._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Closable(Protocol):
    def close(self) -> None: ...


_open_at_exit: weakref.WeakSet[Any] = weakref.WeakSet()


def close_at_exit(owner: Closable) -> None:
    """Have ``owner.close()`` run when the interpreter exits, if it is still alive then (it is
    held weakly). A script that never closes its app still exits at once: an open psycopg pool
    left to the interpreter's shutdown waits for its threads, and on Python 3.13 forever."""
    _open_at_exit.add(owner)


def close_if_opened_here(pid: int, conn: Any) -> None:
    """Close ``conn`` if this process (``pid``) opened it. A forked child leaves its parent's
    connections alone: closing one there would end the parent's session (libpq sends its
    Terminate message on the socket they share)."""
    if os.getpid() == pid:
        conn.close()


class OneConnection:
    """The rules of an object that holds one connection of its own in ``_conn`` behind
    ``_lock`` (the outbox stores): closed at exit (``close_at_exit``) and when dropped
    unclosed, and, in a forked child, the parent's kept unused and unclosed while the child
    opens its own. Call ``_hold_one_connection()`` in ``__init__`` and ``_opened(conn)`` on
    each new connection."""

    _conn: Any
    _lock: threading.RLock

    def close(self) -> None:
        raise NotImplementedError

    def _hold_one_connection(self) -> None:
        self._inherited: list[Any] = []  # a forked child's, never to be used
        close_at_exit(self)
        renew_after_fork(self)

    def _opened(self, conn: Any) -> None:
        weakref.finalize(self, close_if_opened_here, os.getpid(), conn)

    def _after_fork(self) -> None:
        if self._conn is not None:
            self._inherited.append(self._conn)
        self._conn = None
        self._lock = threading.RLock()


@atexit.register
def _close_at_exit() -> None:
    for owner in list(_open_at_exit):
        try:
            owner.close()
        except Exception as exc:  # the process is ending: say so, and close the others
            events.warning("jobs.close_at_exit_failed", owner=repr(owner), error=repr(exc))


class StallTracker:
    """When this process last saw the database refuse or delay its writes.

    A driver notes every call that waited longer than ``threshold`` seconds for the database
    (a lock, a slow network) or failed to reach it. The rescuer reads ``healthy_for()``: a lease
    that expired while writes stalled may have been renewed by a heartbeat stuck behind the same
    stall, so it is not rescued until writes have flowed again for a while."""

    __slots__ = ("_clock", "_stalled_at", "threshold")

    def __init__(self, threshold: float = 1.0, *, clock: Clock | None = None) -> None:
        self.threshold = threshold
        self._clock = clock or SystemClock()
        self._stalled_at = -float("inf")

    def note_wait(self, waited: float) -> None:
        if waited > self.threshold:
            self._stalled_at = self._clock.monotonic()

    def note_failure(self) -> None:
        self._stalled_at = self._clock.monotonic()

    def healthy_for(self) -> float:
        """Seconds since the last stall this process saw (infinite if none), on the
        ``clock``'s monotonic time."""
        return self._clock.monotonic() - self._stalled_at


#: A host clock further than this from the database's is reported once at a service's start.
CLOCK_SKEW_WARN = timedelta(seconds=5)


def check_clock_skew(driver: Driver, clock: Clock, *, service: str) -> datetime:
    """Read the database's clock (``database_now``) between two reads of ``clock``, warn with
    ``jobs.clock.skewed`` when they differ by more than ``CLOCK_SKEW_WARN``, and return the
    database's time. A worker and a scheduler call it once at their start: on PostgreSQL the
    library decides on the server's clock, so a host clock that is off changes no due time,
    lease or cron occurrence, only what is read on the host (log times, the times the
    dashboard shows); the warning says how far off it is. Raises what ``database_now`` raises
    (the database is away)."""
    before = clock.now()
    database = driver.database_now(now=clock.pinned())
    host = before + (clock.now() - before) / 2  # the host's time when the database read its own
    skew = (host - database).total_seconds()
    if abs(skew) > CLOCK_SKEW_WARN.total_seconds():
        events.warning(
            "jobs.clock.skewed",
            service=service,
            host_time=host.isoformat(),
            database_time=database.isoformat(),
            skew=round(skew, 3),
            cause=f"this host's clock is {abs(skew):.1f} s "
            f"{'ahead of' if skew > 0 else 'behind'} the database's",
            effect="due times, leases and cron use the database's clock; the skew shows only "
            "in log times and the times the dashboard displays",
            fix="synchronise this host's clock (NTP: chrony, systemd-timesyncd)",
        )
    return database


class Driver(Protocol):
    """The job-processing seam: what the enqueue path, the worker, the scheduler and the
    maintenance service need of a storage backend. The operator's reads are ``Inspection``.

    A method takes at most two loose domain arguments; more travel as one frozen record of
    ``records.py`` (``Cycle``, ``Cancellation``, ``ExpiredQuery``, ``Prune``, ``Fire``,
    ``Rewind``, ``Leadership``). ``now: datetime | None = None`` is not a domain argument but
    the clock's injection: the one keyword, beside the record, of every method that reads the
    time (None: the database's clock)."""

    #: "memory", "sqlite" or "postgres".
    name: str
    #: Where the jobs live, with any password masked; for messages and the CLI.
    display_url: str
    #: True when one open write transaction blocks every other writer (SQLite), so a write
    #: outside the caller's open transaction, from the same thread, could only deadlock.
    single_writer: bool
    #: Slow or failed writes seen by this process (see ``StallTracker``).
    stalls: StallTracker

    # -- lifecycle ---------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations (serialised across processes); return the versions applied."""
        ...

    def migration_sql(self) -> list[tuple[int, str]]:
        """Every migration as ``(version, sql)``, for teams that run their own tool."""
        ...

    def schema_current(self) -> bool:
        """True when every migration is applied. A read: it takes no write lock."""
        ...

    def close(self) -> None: ...

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        """The database this driver's jobs live in (a round trip the first time, and again
        with ``refresh``)."""
        ...

    # -- transactions ------------------------------------------------------------------------

    def transaction(self) -> AbstractContextManager[Executor]:
        """A write transaction on the job database: commits on normal exit, rolls back on error."""
        ...

    def adopt(self, connection: Any) -> Joined:
        """Check that a caller's own connection (or a ``Joined``) reaches this job database and
        can be written in, and return it as a ``Joined``. Raises ``ConfigurationError`` (with a
        fix) when it cannot join: another database, a closed connection, an aborted
        transaction."""
        ...

    # -- jobs --------------------------------------------------------------------------------

    def job_insert_many(
        self,
        jobs: Sequence[NewJob],
        *,
        executor: Executor | None = None,
        now: datetime | None = None,
    ) -> list[InsertResult]:
        """Insert jobs, in order, deduplicated on (tenant_id, idempotency_key), also within the
        batch. A job whose ``run_at`` is after ``now`` is stored ``scheduled``, else ``available``.
        Without ``executor`` the batch commits in its own transaction before returning."""
        ...

    def job_cycle(self, cycle: Cycle, *, now: datetime | None = None) -> CycleResult:
        """A worker's turn in one transaction (one commit): complete (storing
        ``cycle.results``) and fail what finished (each write fenced by its lease), and claim
        for the handlers that are free now (``cycle.claim``): their handlers are called at once,
        so a job whose worker dies after this is rescued as lost. A turn that only claims may commit without waiting for the disk (losing it to a crash
        only gives the attempt back)."""
        ...

    def job_release_claim(self, token: str, *, now: datetime | None = None) -> list[str]:
        """Put back, attempt refunded, every running job of the claim made with ``token``
        (``ClaimParams.token``) whose reply was lost: the connection broke after the claim
        committed, so its worker never saw those jobs and never ran them (a claim that did not
        commit leaves nothing to find). Return the ids released."""
        ...

    def job_peek_isolated(self, queues: Sequence[str], *, now: datetime | None = None) -> bool:
        """True when an isolated job (rescued after its worker died) is due in ``queues``. A
        read on an index that is empty unless something was rescued."""
        ...

    def lease_extend(
        self, leases: Sequence[Lease], lease_for: timedelta, *, now: datetime | None = None
    ) -> set[str]:
        """Push the expiry of held leases to ``now + lease_for``; return the ids still held."""
        ...

    def job_fail_many(
        self, failures: Sequence[Failure], *, now: datetime | None = None
    ) -> set[str]:
        """Record each failure in the job's error history; the job becomes due at ``now`` plus
        ``Failure.retry_in`` (``scheduled``, or ``available`` when that is not after now), or
        ``dead`` when ``retry_in`` is None; ``Failure.refund`` gives its attempt back. Return
        the ids changed."""
        ...

    def job_snooze(
        self, lease: Lease, delay: timedelta | None, *, now: datetime | None = None
    ) -> bool:
        """Put a held job back without consuming the attempt (``attempt`` goes back down by
        one), due ``delay`` after ``now``, or, when ``delay`` is None, at its due time as stored
        (a release that keeps its place and its ``run_at``). Used by ``Snooze``, by a worker
        that releases jobs at shutdown (``delay`` 0) and by one that gives back a job whose
        name it lacks (None)."""
        ...

    def job_cancel(self, cancel: Cancellation, *, now: datetime | None = None) -> bool:
        """Cancel an active job. With ``cancel.lease``, only while that lease is held (a
        handler cancelling itself); without, any scheduled, available or running job (a running
        one loses its lease, so its worker's later writes match nothing)."""
        ...

    def job_list_expired(self, query: ExpiredQuery, *, now: datetime | None = None) -> list[Job]:
        """Started running jobs whose lease expired before now, oldest expiry first, up to
        ``query.limit``, narrowed by ``query.isolated``. The caller fails them through their
        (expired) lease, so a worker that comes back races fairly."""
        ...

    def job_get(self, job_id: str, *, tenant_id: str | None = None) -> Job | None:
        """One job; with ``tenant_id``, only that tenant's."""
        ...

    def job_wait(self, job_id: str, *, timeout: float, tenant_id: str | None = None) -> Job | None:
        """The job once it is in a final state (completed, dead, cancelled), or as it is when
        ``timeout`` seconds have passed; None when there is no such job (or it was pruned).
        Waits on the database's wake-ups, never in a tight loop: each driver says how."""
        ...

    def job_discard(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        """Delete dead or cancelled jobs; return the ids deleted."""
        ...

    def job_prune(self, prune: Prune) -> int:
        """Delete up to ``prune.limit`` jobs in its final ``states`` that finished before
        ``prune.finished_before``; return how many."""
        ...

    # -- cron schedules and leadership -----------------------------------------------------

    def schedule_state(
        self, tasks: Sequence[str], *, now: datetime | None = None
    ) -> dict[str, ScheduleState]:
        """The state of each task, creating missing ones with ``first_seen_at = now``."""
        ...

    def schedule_fire(
        self, fire: Fire, *, now: datetime | None = None
    ) -> list[InsertResult] | None:
        """Dispatch one occurrence, exactly once: in ONE transaction, move the task's
        ``last_fired_at`` forward to ``fire.occurrence`` only if it is before it
        (compare-and-set; a task unknown to ``schedule_state`` counts as never fired), and
        insert ``fire.jobs``.
        Returns None, writing nothing, when the occurrence (or a later one) was already fired,
        so two schedulers racing cannot both fire it, and a crash between the two writes cannot
        happen."""
        ...

    def schedule_rewind(self, rewind: Rewind) -> bool:
        """Move a task's ``last_fired_at`` back from ``rewind.was`` to ``rewind.to``, only if it
        is still ``was`` (compare-and-set): the scheduler's repair of a last-fired time that lies in the
        future after its clock stepped back. True when it moved."""
        ...

    def database_now(self, *, now: datetime | None = None) -> datetime:
        """The time on the clock this database's decisions use: ``now`` when given (a fake
        clock's), else PostgreSQL's ``now()``, or the host's clock for SQLite and memory (read
        through ``clock.wall_ns``)."""
        ...

    def leader_elect(self, lead: Leadership, *, now: datetime | None = None) -> bool:
        """Become or stay the leader of ``lead.name`` until ``now + lead.ttl``: succeeds when
        nobody holds it, its lease expired, or ``lead.holder`` holds it already. Expiry is
        judged on the database's clock."""
        ...

    def leader_resign(self, lead: Leadership) -> None:
        """Give up leadership of ``lead.name`` if ``lead.holder`` has it."""
        ...

    # -- live workers ------------------------------------------------------------------------

    def worker_beat(self, worker: WorkerInfo, *, now: datetime | None = None) -> None:
        """Insert or refresh ``worker``'s row: its ``heartbeat_at`` becomes ``now`` (the
        database's clock when None); the other fields are written as given."""
        ...

    def worker_remove(self, worker_id: str) -> None:
        """Delete a worker's row (its clean exit); nothing when it has none."""
        ...

    def worker_prune(self, stale_after: timedelta, *, now: datetime | None = None) -> list[str]:
        """Delete the rows whose heartbeat is older than ``stale_after`` (on the database's
        clock when ``now`` is None); return their ids."""
        ...

    # -- wake-ups ----------------------------------------------------------------------------

    def wait_for_jobs(self, timeout: float, wake: threading.Event) -> None:
        """Block up to ``timeout`` seconds; return early when jobs may have been inserted or
        changed by any process, or when ``wake`` is set. A hint only: callers still poll.
        A change counts from the calling thread's last claim (``job_cycle``) or wait, not from
        this wait's start: a job committed between a claim that found nothing and the wait
        after it ends that wait (a thread's first wait may count from its own start)."""
        ...


class Inspection(Protocol):
    """What an operator reads and does by hand, beside the job-processing seam: the reads of
    the dashboard, the health checks and the ``jobs``/``queues``/``workers`` commands, and the
    retry and pause they offer. No worker, scheduler or maintenance service calls these.
    Optional: a driver that leaves them out still runs jobs, and ``inspection(driver)`` refuses
    it with a clear error. The shipped drivers (memory, SQLite, PostgreSQL) offer it all."""

    def job_list(
        self, where: JobFilter, *, limit: int = 100, before_id: str | None = None
    ) -> list[Job]:
        """Jobs matching ``where``, newest id first; ``before_id`` pages (keyset)."""
        ...

    def job_id_below(self, before_id: str | None, offset: int) -> str | None:
        """The id ``offset`` places below ``before_id`` (None: the newest) in newest-first id
        order, or None when there are not that many: the far end of a window for
        ``JobFilter.min_id``. A walk along the primary key, costing ``offset`` entries."""
        ...

    def job_count(self, where: JobFilter) -> dict[tuple[str, JobState], int]:
        """How many jobs match, per (queue, state); absent keys mean zero."""
        ...

    def job_finished_counts(
        self, since: datetime, bucket: timedelta, *, tenant_id: str | None = None
    ) -> list[FinishedCount]:
        """How many jobs ended (completed, dead, cancelled) per queue, state and time bucket
        since ``since``: bucket ``k`` starts at ``since + k * bucket``. A range read of the
        finished-time index: it costs what ended since then, not the whole table."""
        ...

    def job_list_running(self, *, limit: int) -> list[Job]:
        """Up to ``limit`` running jobs, earliest lease expiry first (then id), started or not:
        what the workers page shows each worker running. A read of the lease index."""
        ...

    def job_flow(self, job_id: str, *, now: datetime | None = None) -> FlowState | None:
        """Where the partition of the job's limits stands now (``limits``): None for a job
        without limits, or no such job."""
        ...

    def queue_list(self, *, now: datetime | None = None) -> list[QueueInfo]:
        """Every queue that has jobs or a pause setting, with per-state counts and the
        ``run_at`` of its oldest job due by ``now`` (the database's clock when None). Reads
        kept counts, not the jobs: fast at any size."""
        ...

    def worker_list(self) -> list[WorkerInfo]:
        """Every worker row, by id."""
        ...

    def schedule_read(self, tasks: Sequence[str]) -> dict[str, ScheduleState]:
        """The stored state of those ``tasks`` the database knows (absent ones are left out).
        A read: unlike ``schedule_state`` it creates nothing."""
        ...

    def job_retry(
        self, ids: Sequence[str], *, tenant_id: str | None = None, now: datetime | None = None
    ) -> list[str]:
        """Make dead or cancelled jobs available now with one more attempt allowed (history
        kept; ``max_attempts`` rises to ``attempt + 1`` when exhausted). Return the ids changed."""
        ...

    def queue_set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue; a paused queue is not claimed from (running jobs finish)."""
        ...


def inspection(driver: Driver) -> Inspection:
    """``driver`` as an ``Inspection``, or ``ConfigurationError`` when it lacks a method of
    it: the operator's views cannot work without them."""
    missing = [name for name in _INSPECTION if not callable(getattr(driver, name, None))]
    if missing:
        raise ConfigurationError(
            f"the {driver.name} driver offers no inspection (it lacks {', '.join(missing)}); "
            "the dashboard and the jobs/queues/workers commands need it",
            fix="use a driver that implements ultimat3.jobs.driver.Inspection "
            "(memory, sqlite or postgres)",
        )
    return cast(Inspection, driver)


_INSPECTION = tuple(name for name in vars(Inspection) if not name.startswith("_"))


def wait_until_final(
    read: Callable[[], Job | None],
    wait: Callable[[float], object],
    *,
    timeout: float,
    clock: Clock,
    closed: Callable[[], bool] = lambda: False,
) -> Job | None:
    """The one result-wait loop of every driver's ``job_wait``: read the job, and while it is
    not final (nor gone, nor the driver closed) wait for a change for at most the time left
    of ``timeout``, then read it again. ``wait`` is the driver's own way to sleep until a
    change may have happened (a NOTIFY, a file watch, a condition variable)."""
    deadline = clock.monotonic() + max(0.0, timeout)
    while True:
        job = read()
        remaining = deadline - clock.monotonic()
        if job is None or job.state in FINAL_STATES or remaining <= 0 or closed():
            return job
        wait(remaining)
