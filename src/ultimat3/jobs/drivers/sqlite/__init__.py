"""The SQLite driver: the default backend, one file shared by several worker processes.

What it guarantees:

- **One writer at a time, never a read→write upgrade.** Every write transaction it runs starts
  with ``BEGIN IMMEDIATE``, so it takes the write lock before reading anything. Two claims can
  never see the same row as free (no double claim), and ``SQLITE_BUSY_SNAPSHOT``, which
  ``busy_timeout`` does not retry, cannot happen on its own connections.
- **"database is locked" never reaches the caller.** Each connection waits in SQLite's busy
  handler for a short while; around that, whole write transactions (``BEGIN IMMEDIATE``
  included) are retried with jittered backoff until ``busy_timeout`` seconds have passed, then
  ``DriverUnavailableError`` says who may hold the lock and what to do. The same goes for a file
  that cannot be opened: missing folder, not a database, read-only, full disk.
- **Durable commits.** WAL mode with ``synchronous=FULL`` by default: a commit that returned
  survives power loss. ``synchronous="NORMAL"`` trades the last commits for speed on request.
  A process killed in the middle of a transaction leaves the file intact; its uncommitted
  writes vanish, and jobs it had claimed come back once their lease expires.
- **One schema.** Migrations are numbered ``.sql`` files applied inside ``BEGIN IMMEDIATE``,
  recorded in ``x_migrations``; any number of processes may migrate an empty file at once.
- **Transactional enqueue on the caller's connection.** ``executor=`` runs the insert as part
  of the caller's transaction (``dialects.sqlite.write_in``), so the rows become visible if and
  only if the caller commits; a failure rolls back all of our part and nothing of the caller's.
- **Limits** (``ultimat3.jobs.limits``) are counted under the write lock the claim holds; a
  unique key is a partial unique index (``x_jobs_unique``), a second ``ON CONFLICT`` target.
- **Wake-ups across processes**: ``wait.wait_for_jobs``.

Storage: times are INTEGER microseconds since the epoch (UTC), ids and tokens TEXT, the error
history a JSON array, ``tenant_id`` NULL for "no tenant" (``''`` is a tenant like any other; a
unique expression index makes NULLs collide for dedupe). A job id reused under another key is a
``ValueError``, as in the memory driver.

Limits:

- SQLite 3.37 or newer (STRICT tables, ``RETURNING``). "The database clock" of SQLite is the
  clock of whichever host calls: every process sharing the file must agree on the time (a
  step of it: ``frame``), and so share ``CLOCK_BOOTTIME`` (no time namespace of its own).
- A caller's transaction that read before enqueueing (a deferred ``BEGIN`` then a SELECT) can
  be overtaken by another writer; SQLite then refuses the upgrade and the whole caller
  transaction must be retried. That surfaces as ``DriverUnavailableError`` telling the caller to
  start write transactions with ``BEGIN IMMEDIATE``; we cannot retry a transaction we do not own.
- A thread inside ``transaction()`` holds the write lock: a write without ``executor=`` from the
  same thread would wait for itself, so it fails at once with a clear error instead.
- The application's own connection in this process holding the write lock (a SQLAlchemy
  session after ``flush()``, a ``sqlite3`` connection in a transaction, not joined with
  ``using``) while an enqueue, ``transaction()``, a migration or the set-up of a new file waits
  for it: told by a ``ConfigurationError`` saying so, in about half a second when no other
  thread could release it, else at ``busy_timeout`` (``dialects.sqlite.HolderWatch``; Linux
  only, elsewhere the call waits as for any writer).
- Connections are per thread (``threading.local``), closed when the thread ends or by
  ``close()``; call ``close()`` only once the threads using the driver have stopped.
- WAL needs shared memory between processes: the file must be on a local filesystem (a network
  filesystem is detected on Linux and logged as a warning).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs.clock import Clock, SystemClock, frame_reader
from ultimat3.jobs.dialects.sqlite import MICROSECOND, SYNCHRONOUS, dt_or_none, file_path
from ultimat3.jobs.dialects.sqlite import dt as _dt
from ultimat3.jobs.dialects.sqlite import now_us as _now_us
from ultimat3.jobs.dialects.sqlite import us as _us
from ultimat3.jobs.dialects.sqlite_locks import LockWatch
from ultimat3.jobs.driver import (
    DatabaseId,
    Joined,
    StallTracker,
    close_at_exit,
    renew_after_fork,
    wait_until_final,
)
from ultimat3.jobs.drivers.sqlite import cycle as cycle_
from ultimat3.jobs.drivers.sqlite import insert, reads
from ultimat3.jobs.drivers.sqlite.connections import Connections
from ultimat3.jobs.drivers.sqlite.frame import unaligned_step
from ultimat3.jobs.drivers.sqlite.wait import wait_for_jobs
from ultimat3.jobs.errors import ConfigurationError, DriverUnavailableError
from ultimat3.jobs.records import (
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
from ultimat3.jobs.sql import queries
from ultimat3.jobs.wake import Wake

__all__ = ["SqliteDriver"]

_MIN_VERSION = (3, 37, 0)  # STRICT tables; RETURNING (3.35) comes with it
_Q = queries("sqlite")


class SqliteDriver(Connections):
    """Jobs in one SQLite file, shared by every thread and process that opens it.

    ``synchronous`` is the SQLite setting for every connection ("FULL": durable across power
    loss; "NORMAL": may lose the last commits on power loss, never corrupts). ``busy_timeout``
    is how many seconds an operation keeps waiting for another writer before it raises
    ``DriverUnavailableError``.

    ``clock`` is the app's: the frame of the wall time the driver writes (a step of it moves
    the stored due times, ``frame.align``). ``wait_clock`` is the one it waits on the database
    with (the busy waits, ``wait_for_jobs``, ``job_wait``): real time by default, since
    whoever holds the lock or commits next lives in real time. ``lock_watch``: how a wait for
    the write lock looks at who holds it (``dialects.sqlite.LockWatch``). ``batch_text``: at
    most about this much JSON text per ``job_insert_batch`` statement, so a big batch of big
    inputs goes as several, far below SQLite's limit on one value (1 GB by default).
    """

    name = "sqlite"
    #: One write lock per file: a write outside an open transaction, from the thread holding
    #: it, could only wait for itself (``_write`` refuses it at once).
    single_writer = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        clock: Clock | None = None,
        wait_clock: Clock | None = None,
        lock_watch: LockWatch | None = None,
        batch_text: int = 4 << 20,
    ) -> None:
        self.path = file_path(
            path,
            busy_timeout,
            owner="the SQLite driver",
            fix="pass a path such as 'jobs.db' (several processes share it); "
            "for jobs that live only in this process, use the memory driver",
        )
        level = synchronous.upper()
        if level not in SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={synchronous!r} is not a SQLite synchronous level",
                fix='use "FULL" (durable, the default) or "NORMAL" (faster, may lose the last '
                'commits on power loss); "OFF" and "EXTRA" also exist',
            )
        if sqlite3.sqlite_version_info < _MIN_VERSION:
            raise DriverUnavailableError(
                f"this Python uses SQLite {sqlite3.sqlite_version}; the driver needs 3.37 or newer",
                driver="sqlite",
                fix="use a Python built against a newer SQLite (python.org builds, "
                "Debian 12, Ubuntu 22.04 or later), or the PostgreSQL driver",
            )
        self.display_url = f"sqlite:///{self.path}"
        self._synchronous = level
        self._busy_timeout = float(busy_timeout)
        self._wait_clock = wait_clock or SystemClock()
        self._lock_watch = lock_watch or LockWatch()
        self._batch_text = batch_text
        self._lock = threading.Lock()
        self._conns: dict[int, sqlite3.Connection] = {}
        self._local = threading.local()
        self._closed = False
        self._checked_filesystem = False
        self._identity: DatabaseId | None = None
        #: Per queue, the last key a limited claim looked at (see ``limits``, step 1).
        self._after: dict[str, str] = {}
        #: A wait longer than this for the write lock counts as a stall (see StallTracker),
        #: stamped on the app's clock, which the rescuer's grace is measured on (the wait
        #: itself is timed on ``wait_clock``).
        self.stalls = StallTracker(threshold=0.5, clock=clock)
        #: The frame of the wall time this driver writes (``clock.Frame``; ``frame.align``).
        self._frame = frame_reader(clock)
        renew_after_fork(self)
        close_at_exit(self)

    def __repr__(self) -> str:
        return f"SqliteDriver({self.path!r})"

    # -- jobs --------------------------------------------------------------------------------

    def job_insert_many(
        self,
        jobs: Sequence[NewJob],
        *,
        executor: Joined | None = None,
        now: datetime | None = None,
    ) -> list[InsertResult]:
        if not jobs:
            return []
        now_us = _now_us(now)
        # Built here, before any write, so an input refused while a batch is built raises
        # before anything is written.
        batches = insert.batches(jobs, now_us, self._batch_text) if len(jobs) > 1 else None
        rows = None if batches is not None else [insert.job_row(job, now_us) for job in jobs]

        def body(conn: sqlite3.Connection) -> list[InsertResult]:
            return insert.insert(conn, jobs, now_us, rows, batches)

        if executor is None:
            return self._write(body, lambda: self._held_here("this enqueue"))
        return self._on_executor(executor, body)

    def job_cycle(self, cycle: Cycle, *, now: datetime | None = None) -> CycleResult:
        now_us = _now_us(now)
        results = cycle.results
        done_rows = [
            (now_us, results.get(lease.id), lease.id, lease.token) for lease in cycle.completes
        ]
        done_ids = [lease.id for lease in cycle.completes]
        fail_rows = cycle_.failure_rows(cycle.failures, now_us)
        fail_ids = [failure.lease.id for failure in cycle.failures]
        claim = cycle.claims

        def body(conn: sqlite3.Connection) -> CycleResult:
            completed: set[str] = set()
            failed: set[str] = set()
            if done_rows:
                completed = cycle_.apply_each(conn, _Q["job_complete"], done_rows, done_ids)
            if fail_rows:
                failed = cycle_.apply_each(conn, _Q["job_fail"], fail_rows, fail_ids)
            claimed: list[Job] = []
            wake_in = None
            if claim is not None:
                claimed, wake_in = cycle_.claim(conn, claim, after=self._after)
            return CycleResult(completed, failed, claimed, wake_in)

        if not (cycle.writes or claim is not None):
            return CycleResult()
        if claim is not None:
            self._count_from_here()
        if cycle.writes or self._synchronous not in ("FULL", "EXTRA"):
            return self._write(body)
        # A claim alone need not survive a power cut (losing it only gives the attempts back),
        # so it skips the fsync; WAL still makes it survive a killed process.
        conn = self._slot().conn
        self._pragma(conn, SYNCHRONOUS["NORMAL"])
        try:
            return self._write(body)
        finally:
            self._pragma(conn, SYNCHRONOUS[self._synchronous])

    def job_release_claim(self, token: str, *, now: datetime | None = None) -> list[str]:
        args = {"now": _now_us(now), "token": token}
        rows = self._write(lambda conn: conn.execute(_Q["job_release_claim"], args).fetchall())
        return sorted(row[0] for row in rows)

    def job_flow(self, job_id: str, *, now: datetime | None = None) -> FlowState | None:
        args = {"id": job_id, "now": _now_us(now)}
        row = self._read(lambda conn: conn.execute(_Q["job_flow"], args).fetchone())
        if row is None:
            return None
        key, most, running, rate_max, period, starts, oldest = row
        return FlowState(
            key, most, running, rate_max, period * MICROSECOND, starts, dt_or_none(oldest)
        )

    def job_peek_isolated(self, queues: Sequence[str], *, now: datetime | None = None) -> bool:
        args = {"queues": json.dumps(sorted(set(queues))), "now": _now_us(now)}
        row = self._read(lambda conn: conn.execute(_Q["job_peek_isolated"], args).fetchone())
        return row is not None

    def lease_extend(
        self, leases: Sequence[Lease], lease_for: timedelta, *, now: datetime | None = None
    ) -> set[str]:
        if not leases:
            return set()
        expires_at = _now_us(now) + lease_for // MICROSECOND
        rows = [(expires_at, lease.id, lease.token) for lease in leases]
        ids_ = [lease.id for lease in leases]
        return self._write(lambda conn: cycle_.apply_each(conn, _Q["lease_extend"], rows, ids_))

    def job_fail_many(
        self, failures: Sequence[Failure], *, now: datetime | None = None
    ) -> set[str]:
        if not failures:
            return set()
        rows = cycle_.failure_rows(failures, _now_us(now))
        ids_ = [failure.lease.id for failure in failures]
        return self._write(lambda conn: cycle_.apply_each(conn, _Q["job_fail"], rows, ids_))

    def job_snooze(
        self, lease: Lease, delay: timedelta | None, *, now: datetime | None = None
    ) -> bool:
        now_us = _now_us(now)
        args = {
            "id": lease.id,
            "token": lease.token,
            "now": now_us,
            "run_at": None if delay is None else now_us + delay // MICROSECOND,
        }
        return self._write(lambda conn: conn.execute(_Q["job_snooze"], args).rowcount == 1)

    def job_cancel(self, cancel: Cancellation, *, now: datetime | None = None) -> bool:
        if cancel.stray:
            return False
        args: dict[str, Any] = {
            "id": cancel.job_id,
            "reason": cancel.reason,
            "tenant_id": cancel.tenant_id,
            "now": _now_us(now),
        }
        query = _Q["job_cancel"]
        if cancel.lease is not None:
            args["token"] = cancel.lease.token
            query = _Q["job_cancel_leased"]
        return self._write(lambda conn: conn.execute(query, args).rowcount == 1)

    def job_list_expired(self, query: ExpiredQuery, *, now: datetime | None = None) -> list[Job]:
        now_us = _now_us(now)
        limit = query.limit  # never negative: SQLite reads LIMIT -1 as "all"
        flag = None if query.isolated is None else int(query.isolated)

        def body(conn: sqlite3.Connection) -> list[Any]:
            # The lease expiries are stored in the frame they were renewed in: judged there,
            # across a step of the host clock that no write has moved them by yet.
            at = now_us - unaligned_step(conn, self._frame())
            args = {"now": at, "limit": limit, "isolated": flag}
            return conn.execute(_Q["job_list_expired"], args).fetchall()

        return reads.jobs(self._read(body))

    def job_list_running(self, *, limit: int) -> list[Job]:
        args = {"limit": max(0, limit)}
        rows = self._read(lambda conn: conn.execute(_Q["job_list_running"], args).fetchall())
        return reads.jobs(rows)

    def job_get(self, job_id: str, *, tenant_id: str | None = None) -> Job | None:
        args = {"id": job_id, "tenant_id": tenant_id}
        row = self._read(lambda conn: conn.execute(_Q["job_get"], args).fetchone())
        return None if row is None else reads.job(row)

    def job_wait(self, job_id: str, *, timeout: float, tenant_id: str | None = None) -> Job | None:
        """Woken by any commit to the file, as a worker is (``wait_for_jobs``). The first wait,
        with no timeout, marks where the file stands before the read, so a completion between
        the read and the wait still wakes it."""
        never = Wake()  # never set: a Wake lets the wait sleep on the file watch
        self.wait_for_jobs(0.0, never)
        return wait_until_final(
            lambda: self.job_get(job_id, tenant_id=tenant_id),
            lambda remaining: self.wait_for_jobs(remaining, never),
            timeout=timeout,
            clock=self._wait_clock,
        )

    def job_list(
        self, where: JobFilter, *, limit: int = 100, before_id: str | None = None
    ) -> list[Job]:
        return self._read(lambda conn: reads.job_list(conn, where, limit, before_id))

    def job_id_below(self, before_id: str | None, offset: int) -> str | None:
        if offset < 0:
            return None
        args = {"before_id": before_id, "offset": offset}
        row = self._read(lambda conn: conn.execute(_Q["job_id_below"], args).fetchone())
        return None if row is None else str(row[0])

    def job_count(self, where: JobFilter) -> dict[tuple[str, JobState], int]:
        return self._read(lambda conn: reads.job_count(conn, where))

    def job_retry(
        self, ids: Sequence[str], *, tenant_id: str | None = None, now: datetime | None = None
    ) -> list[str]:
        if not ids:
            return []
        args = {"ids": json.dumps(list(ids)), "tenant_id": tenant_id, "now": _now_us(now)}
        rows = self._write(lambda conn: conn.execute(_Q["job_retry"], args).fetchall())
        return reads.in_order(ids, {row[0] for row in rows})

    def job_discard(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        if not ids:
            return []
        args = {"ids": json.dumps(list(ids)), "tenant_id": tenant_id}
        rows = self._write(lambda conn: conn.execute(_Q["job_discard"], args).fetchall())
        return reads.in_order(ids, {row[0] for row in rows})

    def job_finished_counts(
        self, since: datetime, bucket: timedelta, *, tenant_id: str | None = None
    ) -> list[FinishedCount]:
        since_us = _us(since)
        return self._read(lambda conn: reads.finished_counts(conn, since_us, bucket, tenant_id))

    def job_prune(self, prune: Prune) -> int:
        if prune.empty:
            return 0
        args = {
            "states": json.dumps(sorted(prune.states)),
            "finished_before": _us(prune.finished_before),
            "limit": prune.limit,
        }
        return self._write(lambda conn: conn.execute(_Q["job_prune"], args).rowcount)

    # -- queues ------------------------------------------------------------------------------

    def queue_set_paused(self, queue: str, paused: bool) -> None:
        args = {"name": queue, "paused": int(paused), "now": _now_us(None)}
        self._write(lambda conn: conn.execute(_Q["queue_set_paused"], args))

    def queue_list(self, *, now: datetime | None = None) -> list[QueueInfo]:
        now_us = _now_us(now)
        return self._read(lambda conn: reads.queue_list(conn, now_us))

    # -- cron schedules and leadership -----------------------------------------------------

    def schedule_read(self, tasks: Sequence[str]) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        args = {"tasks": json.dumps(list(tasks))}
        rows = self._read(lambda conn: conn.execute(_Q["schedule_get"], args).fetchall())
        return reads.schedules(rows)

    def schedule_state(
        self, tasks: Sequence[str], *, now: datetime | None = None
    ) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        now_us = _now_us(now)

        def body(conn: sqlite3.Connection) -> list[Any]:
            conn.executemany(_Q["schedule_touch"], [{"task": t, "now": now_us} for t in tasks])
            return conn.execute(_Q["schedule_get"], {"tasks": json.dumps(list(tasks))}).fetchall()

        return reads.schedules(self._write(body))

    def schedule_fire(
        self, fire: Fire, *, now: datetime | None = None
    ) -> list[InsertResult] | None:
        now_us = _now_us(now)
        jobs = fire.jobs
        rows = [insert.job_row(job, now_us) for job in jobs]
        args = {"task": fire.task, "now": now_us, "at": _us(fire.occurrence)}

        def body(conn: sqlite3.Connection) -> list[InsertResult] | None:
            if conn.execute(_Q["schedule_advance"], args).rowcount == 0:
                return None
            return insert.insert(conn, jobs, now_us, rows, None) if jobs else []

        return self._write(body)

    def schedule_rewind(self, rewind: Rewind) -> bool:
        args = {"task": rewind.task, "was": _us(rewind.was), "to": _us(rewind.to)}
        return bool(self._write(lambda conn: conn.execute(_Q["schedule_rewind"], args).rowcount))

    def database_now(self, *, now: datetime | None = None) -> datetime:
        return _dt(_now_us(now))

    def leader_elect(self, lead: Leadership, *, now: datetime | None = None) -> bool:
        now_us = _now_us(now)
        args = {
            "name": lead.name,
            "holder": lead.holder,
            "now": now_us,
            "expires_at": now_us + lead.ttl // MICROSECOND,
        }
        return bool(self._write(lambda conn: conn.execute(_Q["leader_elect"], args).rowcount))

    def leader_resign(self, lead: Leadership) -> None:
        args = {"name": lead.name, "holder": lead.holder}
        self._write(lambda conn: conn.execute(_Q["leader_resign"], args))

    # -- live workers ------------------------------------------------------------------------

    def worker_beat(self, worker: WorkerInfo, *, now: datetime | None = None) -> None:
        args = {
            "id": worker.id,
            "host": worker.host,
            "pid": worker.pid,
            "queues": json.dumps(list(worker.queues)),
            "concurrency": worker.concurrency,
            "started_at": _us(worker.started_at),
            "now": _now_us(now),
            "version": worker.version,
        }
        self._write(lambda conn: conn.execute(_Q["worker_beat"], args))

    def worker_remove(self, worker_id: str) -> None:
        self._write(lambda conn: conn.execute(_Q["worker_remove"], {"id": worker_id}))

    def worker_prune(self, stale_after: timedelta, *, now: datetime | None = None) -> list[str]:
        args = {"cutoff": _now_us(now) - stale_after // MICROSECOND}
        rows = self._write(lambda conn: conn.execute(_Q["worker_prune"], args).fetchall())
        return sorted(row[0] for row in rows)

    def worker_list(self) -> list[WorkerInfo]:
        return self._read(reads.worker_list)

    def _count_from_here(self) -> None:
        """Before a thread's first claim, if it has not waited yet: its first wait returns for
        a commit made since (its later waits count from the wait before)."""
        waiter = self._slot("waiter")
        if waiter.seen_version is None:
            waiter.seen_version = self._data_version(waiter.conn)

    def wait_for_jobs(self, timeout: float, wake: threading.Event) -> None:
        """Return after a commit by another connection since this thread's last wait (or its
        first claim), in any process, or when ``wake`` is set (``wait.wait_for_jobs``, on
        this thread's waiting connection)."""
        if wake.is_set():
            return
        wait_for_jobs(
            self._slot("waiter"),
            timeout,
            wake,
            path=self.path,
            clock=self._wait_clock,
            read_version=self._data_version,
        )
