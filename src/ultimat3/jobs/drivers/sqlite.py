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
- **Transactional enqueue on the caller's connection.** ``executor=`` runs the insert (or the
  completion) inside a ``SAVEPOINT`` of the caller's transaction, always, so a failure rolls
  back all of our part and nothing of the caller's (a ``RAISE(FAIL)`` trigger keeps what its
  statement did; the insert and its count are two statements), and the rows become visible
  if and only if the caller commits. The error says so, and is not retryable inside that
  transaction (``errors.in_callers_transaction``), unless SQLite itself rolled the whole
  transaction back (a full disk, an I/O error), which it then says. An adopted
  connection in Python's legacy transaction mode (``isolation_level`` not None, the default of
  ``sqlite3.connect``) that has no transaction open gets the ``BEGIN`` its own INSERT would have
  issued (as ``BEGIN IMMEDIATE``) and the transaction is left open: the job is visible once the
  caller calls ``commit()``, and gone on ``rollback()`` or close. A connection in autocommit mode
  (``isolation_level=None``) outside a transaction commits our write at once, as its own INSERT
  would.
- **Limits** (``ultimat3.jobs.limits``): a limited claim counts each key's running jobs and
  recent starts under the write lock it already holds, so the counts are exact; a unique key is
  a partial unique index (``x_jobs_unique``) named as a second ``ON CONFLICT`` target.
- **Wake-ups across processes.** ``wait_for_jobs`` polls ``PRAGMA data_version`` on a
  connection of its own: every 1 ms for a second after the last change, then every 4 ms (an
  idle worker, all its threads together, used 1.5% of a core here; a commit is noticed within
  4 ms).

Storage: times are INTEGER microseconds since the epoch (UTC), ids and tokens TEXT, the error
history a JSON array, ``tenant_id`` NULL for "no tenant" (``''`` is a tenant like any other; a
unique expression index makes NULLs collide for dedupe). A job id reused under another key is a
``ValueError``, as in the memory driver.

Limits:

- SQLite 3.37 or newer (STRICT tables, ``RETURNING``). "The database clock" of SQLite is the
  clock of whichever host calls: every process sharing the file must agree on the time. A
  step of it is harmless on Linux: the file stores the host clock's frame (``clock.Frame``),
  and the first write after a step moves the stored due times and lease expiries by it
  (``_align``). Elsewhere nothing moves: a delayed job's due time is a time on the host's
  wall clock. Processes that do not share ``CLOCK_BOOTTIME`` (one in a time namespace of its
  own) would each take the other's frame for a step: they must not share a file.
- A caller's transaction that read before enqueueing (a deferred ``BEGIN`` then a SELECT) can
  be overtaken by another writer; SQLite then refuses the upgrade and the whole caller
  transaction must be retried. That surfaces as ``DriverUnavailableError`` telling the caller to
  start write transactions with ``BEGIN IMMEDIATE``; we cannot retry a transaction we do not own.
- A thread inside ``transaction()`` holds the write lock: a write without ``executor=`` from the
  same thread would wait for itself, so it fails at once with a clear error instead.
- The application's own connection in this process holding the write lock (a SQLAlchemy
  session after ``flush()``, a ``sqlite3`` connection in a transaction, not joined with
  ``using``) while an enqueue, ``transaction()``, a migration or the set-up of a new file waits
  for it: told by a ``ConfigurationError`` saying so (``dialects.sqlite.blocked_here``: the
  lock's owner is read from Linux's ``/proc/locks``, and none of the library's connections in
  this process is in a transaction on the file). In about half a second when the waiting
  thread is the process's only one (the lock can then only be its own, and never freed while
  it waits); with other threads running, the lock may be another thread's ordinary
  transaction: the call waits as for any writer, logs one WARNING, and raises that error
  instead of "busy" at ``busy_timeout``. Elsewhere than Linux the call waits as for any writer.
- Connections are per thread (``threading.local``), closed when the thread ends or by
  ``close()``; call ``close()`` only once the threads using the driver have stopped.
- WAL needs shared memory between processes: the file must be on a local filesystem (a network
  filesystem is detected on Linux and logged as a warning).
"""

from __future__ import annotations

import json
import logging
import math
import operator
import os
import sqlite3
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ultimat3.jobs import ids
from ultimat3.jobs.clock import STEP, Clock, SystemClock, frame_reader
from ultimat3.jobs.dialects.sqlite import (
    BUSY_SNAPSHOT,
    MICROSECOND,
    SYNCHRONOUS,
    LockWatch,
    apply_migrations,
    check_unconverted,
    close_quietly,
    connect,
    connection_file,
    disown,
    file_identity,
    hold_own,
    holder_watch,
    is_busy,
    once,
    pending_versions,
    plain_rows,
    printable_migrations,
    retry_busy,
    savepoint,
    snapshot,
    transaction,
    unavailable,
    use_wal,
    write_in,
)
from ultimat3.jobs.dialects.sqlite import dt as _dt
from ultimat3.jobs.dialects.sqlite import now_us as _now_us
from ultimat3.jobs.dialects.sqlite import us as _us
from ultimat3.jobs.driver import (
    DatabaseId,
    Joined,
    StallTracker,
    close_at_exit,
    current_tx,
    renew_after_fork,
    wait_until_final,
)
from ultimat3.jobs.errors import (
    ConfigurationError,
    DriverUnavailableError,
    in_callers_transaction,
)
from ultimat3.jobs.limits import keys_to_look
from ultimat3.jobs.records import (
    AttemptError,
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
    NewJobs,
    QueueInfo,
    ScheduleState,
    WorkerInfo,
    ids_of,
    job_from_row,
)
from ultimat3.jobs.sql import migrations, queries
from ultimat3.jobs.wake import FileWatch, Wake

__all__ = ["SqliteDriver"]

_T = TypeVar("_T")
_log = logging.getLogger("ultimat3.jobs.drivers.sqlite")

_STATES = {state.value: state for state in JobState}
_MIN_VERSION = (3, 37, 0)  # STRICT tables; RETURNING (3.35) comes with it

_SETUP_FIX = (
    "run `ultimat3-jobs migrate` once, or call app.open() at start-up, before any request "
    "opens a transaction"
)

# wait_for_jobs, where no file watch is to be had (not Linux): a poll costs a thread wake-up
# plus a read transaction, 50-150 us of CPU on a busy 2-core VM, so polling every millisecond
# forever would burn 5-15% of a core. Poll every millisecond for a second after the last change
# (jobs are flowing), then every _POLL_SLOW: an idle waiter stays under 2% of a core and
# notices the next commit within 4 ms.
_POLL_FAST = 0.001
_POLL_FAST_FOR = 1.0
_POLL_SLOW = 0.004
# With a file watch: the -wal file is written before its commit is visible (the frames, their
# fsync, then the index in shared memory), so after a write the waiter looks again every
# _SETTLE_POLL until the commit shows or _SETTLE_FOR passes without another write (a write
# that was no commit: a rolled-back transaction whose pages spilled, a WAL reset). The window
# outlives one wait: a wait that returned for one commit may have drained the events of the
# next one, still in flight, and the following wait must look for it.
_SETTLE_POLL = 0.0005
_SETTLE_FOR = 0.25

_STEP_US = int(STEP * 1e6)
_NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.gcsfuse",
    }
)

_Q = queries("sqlite")
_INSERT = _Q["job_insert"]
_INSERT_BATCH = _Q["job_insert_batch"]
_COUNTS_ADD = _Q["job_counts_add"]
_CLAIM_QUEUE = _Q["job_claim_queue"]
_COMPLETE = _Q["job_complete"]
_DATA_VERSION = _Q["data_version"]


def _errors(text: str) -> tuple[AttemptError, ...]:
    if text == "[]":
        return ()
    return tuple(AttemptError.from_json(item) for item in json.loads(text))


def _job(row: Sequence[Any]) -> Job:
    return job_from_row(row, to_time=_dt, to_errors=_errors)


def _claim_order(job: Job) -> tuple[int, datetime, str]:
    return (-job.priority, job.run_at, job.id)


def _json_or_none(values: Any) -> str | None:
    return None if values is None else json.dumps(sorted(values))


def _translatable(exc: BaseException) -> bool:
    """sqlite3 errors that become a ``JobsError``: all but a constraint violation, which the
    insert paths turn into a dedupe or a ``ValueError`` themselves (the total error contract)."""
    return isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError)


def _filesystem_type(path: str) -> str | None:
    """The filesystem type holding ``path`` on Linux (longest mount-point prefix), else None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return None
    best, fstype = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount_point = fields[4].replace("\\040", " ")
        inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, fstype = mount_point, right.split()[0]
    return fstype


class _Slot:
    """Owns one thread's connection; when the thread ends, the slot is dropped and closes it."""

    __slots__ = (
        "__weakref__",
        "changed_at",
        "conn",
        "depth",
        "seen_version",
        "watch",
        "watched",
        "written_at",
    )

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.depth = 0  # nesting of transaction() on this thread
        self.seen_version: int | None = None  # wait_for_jobs: last PRAGMA data_version
        self.changed_at = -math.inf  # wait_for_jobs: monotonic time of the last change
        self.watch: FileWatch | None = None  # wait_for_jobs: the file watch, once opened
        self.watched = False  # whether it was opened (it stays None where there is none)
        self.written_at = -math.inf  # wait_for_jobs: monotonic time of the last write seen


class SqliteDriver:
    """Jobs in one SQLite file, shared by every thread and process that opens it.

    ``synchronous`` is the SQLite setting for every connection ("FULL": durable across power
    loss; "NORMAL": may lose the last commits on power loss, never corrupts). ``busy_timeout``
    is how many seconds an operation keeps waiting for another writer before it raises
    ``DriverUnavailableError``.

    ``clock`` is the app's: the frame of the wall time the driver writes (a step of it moves
    the stored due times, ``_align``). ``wait_clock`` is the one it waits on the database
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
        raw = os.fspath(path)
        if not raw or raw == ":memory:" or raw.startswith("file:"):
            raise ConfigurationError(
                f"the SQLite driver needs a file path, not {raw!r}",
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
        if not busy_timeout >= 0:
            raise ConfigurationError(
                f"busy_timeout={busy_timeout!r} must be a number of seconds >= 0",
                fix="pass busy_timeout=30.0, or another number of seconds",
            )
        if sqlite3.sqlite_version_info < _MIN_VERSION:
            raise DriverUnavailableError(
                f"this Python uses SQLite {sqlite3.sqlite_version}; the driver needs 3.37 or newer",
                driver="sqlite",
                fix="use a Python built against a newer SQLite (python.org builds, "
                "Debian 12, Ubuntu 22.04 or later), or the PostgreSQL driver",
            )
        self.path = os.path.abspath(raw)
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
        #: A wait longer than this for the write lock counts as a stall (see StallTracker).
        self.stalls = StallTracker(threshold=0.5)
        #: The frame of the wall time this driver writes (``clock.Frame``; ``_align``).
        self._frame = frame_reader(clock)
        renew_after_fork(self)
        close_at_exit(self)

    def __repr__(self) -> str:
        return f"SqliteDriver({self.path!r})"

    # -- connections -------------------------------------------------------------------------

    def _slot(self, attr: str = "slot") -> _Slot:
        slot: _Slot | None = getattr(self._local, attr, None)
        if slot is None:
            slot = _Slot(self._open())
            setattr(self._local, attr, slot)
            if self._identity is None:
                self._identity = file_identity(self.path)
            key, pid = id(slot.conn), os.getpid()
            conns, lock = self._conns, self._lock
            with lock:
                conns[key] = slot.conn
            hold_own(slot.conn, self.path, slot)

            def drop(conn: sqlite3.Connection = slot.conn) -> None:
                if os.getpid() != pid:
                    return  # a forked child must not close (or touch) its parent's connections
                with lock:
                    conns.pop(key, None)
                disown(conn)
                close_quietly(conn)

            weakref.finalize(slot, drop)
        if self._closed:
            raise self._closed_error()
        return slot

    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise self._closed_error()
        if not self._checked_filesystem:
            self._checked_filesystem = True
            self._warn_network_filesystem()
        try:
            conn = connect(self.path, busy_timeout=self._busy_timeout)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        try:
            # Setting up a new file (WAL mode) needs every other connection out of it: one of
            # this process in a transaction that has read or written it could only be waited
            # for until the timeout.
            self._retry(
                lambda: use_wal(conn, self._synchronous, path=self.path, driver="sqlite"),
                self._setup_held_here,
            )
        except BaseException:
            close_quietly(conn)
            raise
        return conn

    def _warn_network_filesystem(self) -> None:
        fstype = _filesystem_type(os.path.realpath(os.path.dirname(self.path)))
        if fstype in _NETWORK_FILESYSTEMS:
            _log.warning(
                "jobs.sqlite.network-filesystem: %s is on %s; SQLite locking and WAL are not "
                "reliable there, use a local disk or the PostgreSQL driver",
                self.path,
                fstype,
                extra={
                    "event": "jobs.sqlite.network-filesystem",
                    "path": self.path,
                    "fstype": fstype,
                },
            )

    def _after_fork(self) -> None:
        """After fork: the child opens its own connections; the parent's stay untouched."""
        self._local = threading.local()
        self._conns = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close every connection this driver opened, in every thread. Idempotent."""
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            disown(conn)
            close_quietly(conn)

    # -- errors ------------------------------------------------------------------------------

    def _closed_error(self) -> DriverUnavailableError:
        return DriverUnavailableError(
            f"the SQLite driver for {self.path} is closed",
            driver="sqlite",
            fix="stop using a driver after close(); create a new one if you need it again",
        )

    def _unavailable(self, exc: sqlite3.Error) -> DriverUnavailableError:
        return unavailable(
            exc,
            path=self.path,
            driver="sqlite",
            busy_timeout=self._busy_timeout,
            tables="the job tables",
            migrate="run `ultimat3-jobs migrate` (or driver.migrate())",
        )

    def _caller_busy(self, exc: sqlite3.Error, conn: sqlite3.Connection) -> DriverUnavailableError:
        """The caller's own transaction could not take the write lock: only it can retry."""
        if getattr(exc, "sqlite_errorcode", 0) == BUSY_SNAPSHOT:
            cause = (
                f"your transaction on {self.path} read before enqueueing, and another process "
                "wrote in between, so SQLite refused to let it write (SQLITE_BUSY_SNAPSHOT)"
            )
        else:
            cause = (
                f"your transaction on {self.path} could not take the write lock "
                f"from another writer ({exc})"
            )
        fix = (
            "start write transactions with BEGIN IMMEDIATE (sqlite3.connect(..., "
            "isolation_level='IMMEDIATE')) so they hold the lock from the start, and retry the "
            "whole transaction"
        )
        if getattr(conn, "autocommit", None) is False:
            # Python 3.12's autocommit=False opens every transaction with a plain BEGIN, and
            # isolation_level is not used: that fix would change nothing.
            fix = (
                "with autocommit=False, sqlite3 opens each transaction with a plain BEGIN, "
                "which takes the write lock only at the first write: write before you read in "
                "the transaction, or connect with autocommit=sqlite3.LEGACY_TRANSACTION_CONTROL "
                "and isolation_level='IMMEDIATE'; and retry the whole transaction"
            )
        if getattr(exc, "sqlite_errorcode", 0) == BUSY_SNAPSHOT:  # it can no longer write
            return DriverUnavailableError(cause, driver="sqlite", fix=fix, retryable=False)
        return in_callers_transaction(cause, driver="sqlite", fix=fix)

    # -- retry loops -------------------------------------------------------------------------

    def _retry(
        self,
        attempt: Callable[[], _T],
        held_here: Callable[[], ConfigurationError] | None = None,
    ) -> _T:
        """Run ``attempt`` until it is not refused as busy, up to ``busy_timeout`` seconds
        (``dialects.sqlite.retry_busy``). A long wait is noted in ``stalls``: other writers
        could not write meanwhile either. With ``held_here``, a wait for a lock that this
        process holds on a connection of its own ends with the error it makes: at once when
        no other thread could release it, else at the timeout
        (``dialects.sqlite.HolderWatch``)."""
        try:
            return attempt()
        except sqlite3.Error as exc:
            if not _translatable(exc):
                raise
            if not is_busy(exc):
                raise self._unavailable(exc) from exc
        started = self._wait_clock.monotonic()
        joined = current_tx.get()
        in_callers_tx = joined is not None and bool(
            getattr(joined.connection, "in_transaction", False)
        )
        watch = (
            None
            if held_here is None
            else holder_watch(
                self.path, held_here, in_callers_tx=in_callers_tx, settings=self._lock_watch
            )
        )
        try:
            result = retry_busy(
                attempt, timeout=self._busy_timeout, on_busy=watch, clock=self._wait_clock
            )
        except sqlite3.Error as exc:
            if not _translatable(exc):
                raise
            if is_busy(exc):
                self.stalls.note_failure()
                held = None if watch is None else watch.verdict()
                if held is not None:
                    raise held from exc
            raise self._unavailable(exc) from exc
        self.stalls.note_wait(self._wait_clock.monotonic() - started)
        return result

    def _held_here(self, doing: str) -> ConfigurationError:
        return ConfigurationError(
            f"this process holds the write lock on a connection of its own to {self.path} "
            f"(not one of the library's), so {doing} could only wait for it, and for ever when "
            "it is this thread's: a SQLAlchemy session after flush(), a sqlite3 connection in a "
            "transaction",
            fix="enqueue through it with using(app, session) "
            "(ultimat3.jobs.integrations.sqlalchemy), or app.using(conn) for a sqlite3 "
            "connection, so the job is part of its transaction; or enqueue after it commits. "
            "If another thread of this process holds it, keep that transaction short",
        )

    def _enqueue_held_here(self) -> ConfigurationError:
        return self._held_here("this enqueue")

    def _migrate_held_here(self) -> ConfigurationError:
        return ConfigurationError(
            f"the job tables in {self.path} need migrating, and this process holds the write "
            "lock that migrating needs on a connection of its own (the transaction around this "
            "call, once it has written)",
            fix=_SETUP_FIX,
        )

    def _setup_held_here(self) -> ConfigurationError:
        return ConfigurationError(
            f"the job file {self.path} is new, and setting it up (WAL mode) needs every other "
            "connection out of it, but a connection of this process holds a lock on it (the "
            "transaction around this call, once it has read or written the file)",
            fix=_SETUP_FIX,
        )

    def _write(
        self,
        body: Callable[[sqlite3.Connection], _T],
        held_here: Callable[[], ConfigurationError] | None = None,
    ) -> _T:
        """Run ``body`` in its own ``BEGIN IMMEDIATE`` transaction on this thread's connection,
        retrying the whole transaction while the database is busy (``held_here``: see
        ``_retry``)."""
        slot = self._slot()
        if slot.depth or self._caller_holds_lock(slot.conn):
            raise ConfigurationError(
                f"this write would wait for your own open transaction on {self.path}: SQLite "
                "has one write lock per file, and the transaction around this call holds it",
                fix="make the write part of the transaction (enqueue without outbox=False, or "
                "pass executor=), or make it after the transaction ends",
            )
        return self._retry(lambda: once(slot.conn, self._aligned(body)), held_here)

    def _caller_holds_lock(self, own: sqlite3.Connection) -> bool:
        """True when the code calling us runs inside a transaction on this file (another App's,
        or the caller's own connection), whose write lock a separate write would wait for."""
        joined = current_tx.get()
        if joined is None or joined.connection is own:
            return False
        if self._identity is None:
            self._identity = file_identity(self.path)
        conn = joined.connection
        return (
            joined.database == self._identity
            and isinstance(conn, sqlite3.Connection)
            and conn.in_transaction
        )

    def _read(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        slot = self._slot()
        return self._retry(lambda: body(slot.conn))

    def _on_executor(
        self,
        executor: Joined,
        body: Callable[[sqlite3.Connection], _T],
    ) -> _T:
        """Run ``body`` as part of the caller's transaction on ``executor``, in a savepoint
        (see ``dialects.sqlite.write_in``, also for connections in legacy and autocommit
        modes). A failure inside the caller's open transaction was rolled back to the
        savepoint: it raises ``errors.in_callers_transaction``, which says so and names the
        cause."""
        conn = executor.connection
        if (
            type(executor) is not Joined
            or executor.database is not self._identity
            or not isinstance(conn, sqlite3.Connection)
        ):  # the usual one, a Joined this driver made, needs no look-ups: ``adopt`` decides
            conn = self.adopt(executor).connection
        opened = conn.in_transaction
        try:
            return write_in(conn, self._aligned(body), retry=self._retry)
        except sqlite3.Error as exc:
            if not _translatable(exc):
                raise
            if is_busy(exc) and conn.in_transaction:
                raise self._caller_busy(exc, conn) from exc
            translated = self._unavailable(exc)
            if not opened:
                raise translated from exc
            raise in_callers_transaction(
                translated.cause, driver="sqlite", fix=translated.fix, kept=conn.in_transaction
            ) from exc
        except DriverUnavailableError as exc:  # a row refused (``_insert_one``)
            if not opened:
                raise
            raise in_callers_transaction(exc.cause, driver="sqlite", fix=exc.fix) from exc

    # -- steps of the host clock -------------------------------------------------------------

    def _aligned(
        self, body: Callable[[sqlite3.Connection], _T]
    ) -> Callable[[sqlite3.Connection], _T]:
        def aligned(conn: sqlite3.Connection) -> _T:
            self._align(conn)
            return body(conn)

        return aligned

    def _align(self, conn: sqlite3.Connection) -> None:
        """First thing in every write transaction, under the write lock: compare the frame of
        the host's clock (``clock.Frame``) with the one stored in the file, and on a step (a
        change over ``STEP``) move the stored future times by it and store the new frame.
        Under the write lock, so exactly once per file, and no row is written in the new time
        before the move. A changed boot id (a reboot) is stored without moving anything."""
        frame = self._frame()
        if frame is None:
            return
        row = conn.execute(_Q["clock_frame"]).fetchone()
        if row is not None and row[0] == frame.boot:
            by = frame.offset - row[1]
            if -_STEP_US <= by <= _STEP_US:
                return
            args = {"by": by, "now": frame.at}
            jobs = conn.execute(_Q["clock_shift_jobs"], args).rowcount
            conn.execute(_Q["clock_shift_leaders"], args)
            conn.execute(_Q["clock_shift_workers"], args)
            _log.warning(
                "jobs.sqlite.clock-step: the host's wall clock stepped by %+.3f s; the due "
                "times and lease expiries of %d job(s) in %s moved with it",
                by / 1e6,
                jobs,
                self.path,
                extra={
                    "event": "jobs.sqlite.clock-step",
                    "path": self.path,
                    "by_seconds": by / 1e6,
                    "jobs": jobs,
                },
            )
        conn.execute(
            _Q["clock_frame_set"], {"boot": frame.boot, "offset": frame.offset, "now": frame.at}
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations in one ``BEGIN IMMEDIATE`` transaction; return the versions
        applied. Processes racing on an empty file queue on the write lock; the first applies
        everything and the rest find nothing left to do."""
        known = migrations("sqlite")
        if not self._read(lambda conn: pending_versions(conn, known, _Q)):
            return []
        # Inside a caller's transaction on this file (a first enqueue in app.using(conn)),
        # whether it holds the write lock is asked of SQLite's locks, not inferred from the
        # transaction being open: a deferred BEGIN that has written nothing holds none, and
        # the tables are created on our connection meanwhile.
        slot = self._slot()
        if slot.depth:
            raise ConfigurationError(
                f"the job tables in {self.path} need migrating, and this thread is inside "
                "driver.transaction() on it",
                fix=_SETUP_FIX,
            )
        done = self._retry(
            lambda: once(slot.conn, lambda conn: apply_migrations(conn, known, _Q)),
            self._migrate_held_here,
        )
        self._check_caller_sees_tables()
        if done:
            _log.info(
                "jobs.sqlite.migrated: %s to version %d",
                self.path,
                done[-1],
                extra={"event": "jobs.sqlite.migrated", "path": self.path, "versions": done},
            )
        return done

    def _check_caller_sees_tables(self) -> None:
        """After a migration inside a caller's transaction: a transaction that read the file
        before it holds a snapshot without the tables, and can never see them. Said now, with
        what to do, rather than as "no such table" from the insert."""
        joined = current_tx.get()
        if joined is None or joined.database != self._identity:
            return
        conn = joined.connection
        if not isinstance(conn, sqlite3.Connection) or not conn.in_transaction:
            return
        try:
            with plain_rows(conn):
                seen = conn.execute(_Q["migrations_table_exists"]).fetchone() is not None
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        if not seen:
            raise ConfigurationError(
                f"the job tables in {self.path} were created just now, but the transaction "
                "around this call had read the file before, and SQLite keeps showing it the "
                "file as it was then (its snapshot), without them",
                fix="roll the transaction back and run it again: the tables exist now. To spare "
                f"a request this, {_SETUP_FIX}",
            )

    def schema_current(self) -> bool:
        known = migrations("sqlite")
        return not self._read(lambda conn: pending_versions(conn, known, _Q))

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        """The job file, by device and inode (opening it first, so that it exists)."""
        if self._identity is None or refresh:
            if not os.path.exists(self.path):
                self._slot()
            self._identity = file_identity(self.path)
        return self._identity

    def migration_sql(self) -> list[tuple[int, str]]:
        """Every migration with the statement that records it in ``x_migrations``, so a schema
        applied by another tool is recognised by ``migrate()``."""
        return printable_migrations(migrations("sqlite"), _Q)

    # -- transactions ------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Joined]:
        """``BEGIN IMMEDIATE`` on this thread's connection; COMMIT on normal exit, ROLLBACK on
        an exception. Nested use on one thread becomes a SAVEPOINT: the inner block rolls back
        alone on an exception, and everything commits with the outermost block."""
        slot = self._slot()
        conn = slot.conn
        joined = Joined(conn, self.identity())
        if slot.depth:
            slot.depth += 1
            try:
                with savepoint(conn):
                    yield joined
            finally:
                slot.depth -= 1
            return
        if self._caller_holds_lock(conn):
            raise ConfigurationError(
                f"driver.transaction() would wait for your own open transaction on {self.path}",
                fix="use the transaction you are in (app.using(conn)), or open this one after "
                "it ends",
            )

        def held_here() -> ConfigurationError:
            return self._held_here("driver.transaction() (app.transaction())")

        slot.depth = 1
        try:
            with transaction(conn, retry=lambda attempt: self._retry(attempt, held_here)):
                yield joined
        finally:
            slot.depth = 0

    def adopt(self, connection: Any) -> Joined:
        """Accept a caller's ``sqlite3.Connection`` (or a ``Joined``) whose main database is
        this driver's file."""
        if isinstance(connection, Joined):
            if connection.database == self.identity():
                if not isinstance(connection.connection, sqlite3.Connection):
                    raise ConfigurationError(
                        f"cannot write to the SQLite job file through a "
                        f"{type(connection.connection).__name__}",
                        fix="join a sqlite3.Connection to the job file",
                    )
                return connection
            connection = connection.connection
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                f"the SQLite driver can only join a sqlite3.Connection, "
                f"not {type(connection).__name__}",
                fix=f"open the connection with sqlite3.connect({self.path!r}); a connection to "
                "another database cannot share a transaction with the job file, so enqueue "
                "through the outbox instead",
            )
        try:
            main = connection_file(connection)
        except sqlite3.Error as exc:
            raise ConfigurationError(
                f"cannot inspect the connection to join it ({exc})",
                fix="pass an open sqlite3.Connection (made in this thread, or with "
                "check_same_thread=False)",
            ) from exc
        if not main or file_identity(main) != self.identity():
            where = main or "an in-memory or temporary database"
            raise ConfigurationError(
                f"the connection opens {where}, but the jobs live in {self.path}",
                fix=f"connect to {self.path} (the job tables must be in the same file to share "
                "a transaction), or enqueue through the outbox when your data lives elsewhere",
            )
        check_unconverted(connection)
        return Joined(connection, self.identity())

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
        batches = _batches(jobs, now_us, self._batch_text) if len(jobs) > 1 else None
        rows = None if batches is not None else [_job_row(job, now_us) for job in jobs]

        def body(conn: sqlite3.Connection) -> list[InsertResult]:
            return _insert(conn, jobs, now_us, rows, batches)

        if executor is None:
            return self._write(body, self._enqueue_held_here)
        return self._on_executor(executor, body)

    def job_cycle(self, cycle: Cycle, *, now: datetime | None = None) -> CycleResult:
        now_us = _now_us(now)
        results = cycle.results
        done_rows = [
            (now_us, results.get(lease.id), lease.id, lease.token) for lease in cycle.completes
        ]
        done_ids = [lease.id for lease in cycle.completes]
        fail_rows = _failure_rows(cycle.failures, now_us)
        fail_ids = [failure.lease.id for failure in cycle.failures]
        claim = cycle.claims

        def body(conn: sqlite3.Connection) -> CycleResult:
            completed: set[str] = set()
            failed: set[str] = set()
            if done_rows:
                completed = _apply_each(conn, _COMPLETE, done_rows, done_ids)
            if fail_rows:
                failed = _apply_each(conn, _Q["job_fail"], fail_rows, fail_ids)
            claimed: list[Job] = []
            wake_in = None
            if claim is not None:
                claimed, wake_in = _claim(conn, claim, after=self._after)
            return CycleResult(completed, failed, claimed, wake_in)

        if not (cycle.writes or claim is not None):
            return CycleResult()
        if cycle.writes or self._synchronous not in ("FULL", "EXTRA"):
            return self._write(body)
        # A claim alone need not survive a power cut (losing it only gives the attempts back),
        # so it skips the fsync; WAL still makes it survive a killed process.
        conn = self._slot().conn
        conn.execute(SYNCHRONOUS["NORMAL"])
        try:
            return self._write(body)
        finally:
            conn.execute(SYNCHRONOUS[self._synchronous])

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
            key,
            most,
            running,
            rate_max,
            period * MICROSECOND,
            starts,
            None if oldest is None else _dt(oldest),
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
        return self._write(lambda conn: _apply_each(conn, _Q["lease_extend"], rows, ids_))

    def job_fail_many(
        self, failures: Sequence[Failure], *, now: datetime | None = None
    ) -> set[str]:
        if not failures:
            return set()
        rows = _failure_rows(failures, _now_us(now))
        ids_ = [failure.lease.id for failure in failures]
        return self._write(lambda conn: _apply_each(conn, _Q["job_fail"], rows, ids_))

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

    def job_cancel(
        self,
        job_id: str,
        *,
        reason: str,
        lease: Lease | None = None,
        tenant_id: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        args: dict[str, Any] = {
            "id": job_id,
            "reason": reason,
            "tenant_id": tenant_id,
            "now": _now_us(now),
        }
        query = _Q["job_cancel"]
        if lease is not None:
            if lease.id != job_id:
                return False
            args["token"] = lease.token
            query = _Q["job_cancel_leased"]
        return self._write(lambda conn: conn.execute(query, args).rowcount == 1)

    def job_list_expired(
        self, *, limit: int, now: datetime | None = None, isolated: bool | None = None
    ) -> list[Job]:
        args = {
            "now": _now_us(now),
            "limit": max(0, limit),  # SQLite reads LIMIT -1 as "all"
            "isolated": None if isolated is None else int(isolated),
        }
        rows = self._read(lambda conn: conn.execute(_Q["job_list_expired"], args).fetchall())
        return [_job(row) for row in rows]

    def job_list_running(self, *, limit: int) -> list[Job]:
        args = {"limit": max(0, limit)}
        rows = self._read(lambda conn: conn.execute(_Q["job_list_running"], args).fetchall())
        return [_job(row) for row in rows]

    def job_get(self, job_id: str, *, tenant_id: str | None = None) -> Job | None:
        args = {"id": job_id, "tenant_id": tenant_id}
        row = self._read(lambda conn: conn.execute(_Q["job_get"], args).fetchone())
        return None if row is None else _job(row)

    def job_wait(self, job_id: str, *, timeout: float, tenant_id: str | None = None) -> Job | None:
        """Woken by any commit to the file, as a worker is (``wait_for_jobs``: the file watch,
        then ``PRAGMA data_version`` on this thread's waiting connection), then one read of the
        job. The
        first wait, with no timeout, marks where the file stands before the read, so a
        completion between the read and the wait still wakes it."""
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
        args = _filter_args(where)
        args["before_id"] = before_id
        args["limit"] = max(0, limit)
        rows = self._read(lambda conn: conn.execute(_Q["job_list"], args).fetchall())
        return [_job(row) for row in rows]

    def job_id_below(self, before_id: str | None, offset: int) -> str | None:
        if offset < 0:
            return None
        args = {"before_id": before_id, "offset": offset}
        row = self._read(lambda conn: conn.execute(_Q["job_id_below"], args).fetchone())
        return None if row is None else str(row[0])

    def job_count(self, where: JobFilter) -> dict[tuple[str, JobState], int]:
        args = _filter_args(where)
        tenant_only = where.tenant_id is not None and where == JobFilter(tenant_id=where.tenant_id)
        kept = where.by_queue_and_state
        if tenant_only:
            query = _Q["job_count_tenant"]
        elif kept:
            query = _Q["job_count_kept"]
            args = {"states": args["states"], "queue": args["queue"]}
        else:
            query = _Q["job_count"]
        rows = self._read(lambda conn: conn.execute(query, args).fetchall())
        return {(queue, _STATES[state]): count for queue, state, count in rows}

    def job_retry(
        self, ids: Sequence[str], *, tenant_id: str | None = None, now: datetime | None = None
    ) -> list[str]:
        if not ids:
            return []
        args = {"ids": json.dumps(list(ids)), "tenant_id": tenant_id, "now": _now_us(now)}
        rows = self._write(lambda conn: conn.execute(_Q["job_retry"], args).fetchall())
        return _in_order(ids, {row[0] for row in rows})

    def job_discard(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        if not ids:
            return []
        args = {"ids": json.dumps(list(ids)), "tenant_id": tenant_id}
        rows = self._write(lambda conn: conn.execute(_Q["job_discard"], args).fetchall())
        return _in_order(ids, {row[0] for row in rows})

    def job_finished_counts(
        self, since: datetime, bucket: timedelta, *, tenant_id: str | None = None
    ) -> list[FinishedCount]:
        step = max(1, bucket // timedelta(microseconds=1))
        args = {"since": _us(since), "bucket": step, "tenant_id": tenant_id}
        rows = self._read(lambda conn: conn.execute(_Q["job_finished_counts"], args).fetchall())
        return [
            FinishedCount(queue, _STATES[state], _dt(args["since"] + k * step), n)
            for queue, state, k, n in sorted(rows)
        ]

    def job_prune(
        self, *, states: frozenset[JobState], finished_before: datetime, limit: int
    ) -> int:
        if not states or limit <= 0:
            return 0
        args = {
            "states": json.dumps(sorted(states)),
            "finished_before": _us(finished_before),
            "limit": limit,
        }
        return self._write(lambda conn: conn.execute(_Q["job_prune"], args).rowcount)

    # -- queues ------------------------------------------------------------------------------

    def queue_set_paused(self, queue: str, paused: bool) -> None:
        args = {"name": queue, "paused": int(paused), "now": _now_us(None)}
        self._write(lambda conn: conn.execute(_Q["queue_set_paused"], args))

    def queue_list(self, *, now: datetime | None = None) -> list[QueueInfo]:
        at = {"now": _now_us(now)}

        def body(conn: sqlite3.Connection) -> tuple[list[Any], list[Any], list[Any]]:
            with snapshot(conn):  # so the counts and the pause settings agree
                counts = conn.execute(_Q["queue_counts"]).fetchall()
                settings = conn.execute(_Q["queue_settings"]).fetchall()
                oldest = _oldest_ready(conn, at["now"])
            return counts, settings, oldest

        counts, settings, oldest_rows = self._read(body)
        oldest: dict[str, datetime] = {}
        for queue, run_at in oldest_rows:  # unlimited and limited jobs: a queue may have both
            if run_at is not None and (queue not in oldest or _dt(run_at) < oldest[queue]):
                oldest[queue] = _dt(run_at)
        paused = {name: bool(flag) for name, flag in settings}
        per_queue: dict[str, dict[JobState, int]] = {name: {} for name in paused}
        for queue, state, count in counts:
            per_queue.setdefault(queue, {})[_STATES[state]] = count
        return [
            QueueInfo(name, paused.get(name, False), per_queue[name], oldest.get(name))
            for name in sorted(per_queue)
        ]

    # -- wake-ups ----------------------------------------------------------------------------

    # -- cron schedules and leadership -----------------------------------------------------

    def schedule_read(self, tasks: Sequence[str]) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        args = {"tasks": json.dumps(list(tasks))}
        rows = self._read(lambda conn: conn.execute(_Q["schedule_get"], args).fetchall())
        return {
            task: ScheduleState(task, _dt(first), None if last is None else _dt(last))
            for task, first, last in rows
        }

    def schedule_state(
        self, tasks: Sequence[str], *, now: datetime | None = None
    ) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        now_us = _now_us(now)

        def body(conn: sqlite3.Connection) -> list[Any]:
            conn.executemany(_Q["schedule_touch"], [{"task": t, "now": now_us} for t in tasks])
            return conn.execute(_Q["schedule_get"], {"tasks": json.dumps(list(tasks))}).fetchall()

        return {
            task: ScheduleState(task, _dt(first), None if last is None else _dt(last))
            for task, first, last in self._write(body)
        }

    def schedule_fire(
        self,
        task: str,
        occurrence: datetime,
        jobs: Sequence[NewJob],
        *,
        now: datetime | None = None,
    ) -> list[InsertResult] | None:
        now_us = _now_us(now)
        rows = [_job_row(job, now_us) for job in jobs]
        args = {"task": task, "now": now_us, "at": _us(occurrence)}

        def body(conn: sqlite3.Connection) -> list[InsertResult] | None:
            if conn.execute(_Q["schedule_advance"], args).rowcount == 0:
                return None
            return _insert(conn, jobs, now_us, rows, None) if jobs else []

        return self._write(body)

    def schedule_rewind(self, task: str, was: datetime, to: datetime) -> bool:
        args = {"task": task, "was": _us(was), "to": _us(to)}
        return bool(self._write(lambda conn: conn.execute(_Q["schedule_rewind"], args).rowcount))

    def database_now(self, *, now: datetime | None = None) -> datetime:
        return _dt(_now_us(now))

    def leader_elect(
        self, name: str, holder: str, ttl: timedelta, *, now: datetime | None = None
    ) -> bool:
        now_us = _now_us(now)
        args = {
            "name": name,
            "holder": holder,
            "now": now_us,
            "expires_at": now_us + ttl // MICROSECOND,
        }
        return bool(self._write(lambda conn: conn.execute(_Q["leader_elect"], args).rowcount))

    def leader_resign(self, name: str, holder: str) -> None:
        args = {"name": name, "holder": holder}
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
        rows = self._read(lambda conn: conn.execute(_Q["worker_list"]).fetchall())
        return [
            WorkerInfo(
                id_,
                host,
                pid,
                tuple(json.loads(queues)),
                concurrency,
                _dt(started),
                _dt(beat),
                version,
            )
            for id_, host, pid, queues, concurrency, started, beat, version in rows
        ]

    def wait_for_jobs(self, timeout: float, wake: threading.Event) -> None:
        """Return after a commit by another connection, in any process, or when ``wake`` is
        set. ``PRAGMA data_version`` on a connection of this thread's own says whether one
        happened: it changes whenever another connection commits, and a commit since this
        thread's last wait returns at once, so a change made between two waits is not missed.

        Between two looks the thread sleeps in the kernel on a watch of the database's files
        (``FileWatch``: every commit writes the ``-wal`` file) and on ``wake`` when it is a
        ``Wake``: a commit is seen within a thread wake-up, and idle costs nothing. Without a
        watch (not Linux) or with a plain ``threading.Event``, it polls: every millisecond
        for a second after the last change, then every 4 ms."""
        if wake.is_set():
            return
        slot = self._slot("waiter")
        conn = slot.conn
        watch = self._watch(slot) if isinstance(wake, Wake) else None
        # A write drained here, or seen by the last wait, may be a commit still in flight (its
        # frames are written before it is visible): look again soon, as after any write.
        clock = self._wait_clock
        if watch is not None and watch.drain():
            slot.written_at = clock.monotonic()
        now = clock.monotonic()
        deadline = now + timeout
        version = self._data_version(conn)
        if version is None:  # busy in recovery: report a possible change, the caller polls
            return
        if slot.seen_version is not None and version != slot.seen_version:
            slot.seen_version, slot.changed_at = version, now
            return
        slot.seen_version = version
        # A write seen, its commit not visible yet: look again soon.
        settle_until = slot.written_at + _SETTLE_FOR
        while True:
            left = deadline - now
            if left <= 0:
                return
            if watch is not None:
                assert isinstance(wake, Wake)
                settling = now < settle_until
                written = watch.wait(min(left, _SETTLE_POLL) if settling else left, wake)
                if written:
                    slot.written_at = clock.monotonic()
                    settle_until = slot.written_at + _SETTLE_FOR
                look = written or settling
            else:
                recent = now - slot.changed_at < _POLL_FAST_FOR
                clock.sleep(min(_POLL_FAST if recent else _POLL_SLOW, left), wake)
                look = True
            if wake.is_set():
                return
            now = clock.monotonic()
            if not look:
                continue
            current = self._data_version(conn)
            if current != version:
                slot.changed_at = now
                if current is not None:
                    slot.seen_version = current
                return

    def _watch(self, slot: _Slot) -> FileWatch | None:
        """The slot's watch of the database's ``-wal`` file, which every commit writes (the
        driver keeps journal_mode=WAL); opened on first use, None where the platform gives none."""
        if not slot.watched:
            slot.watched = True
            real = os.path.realpath(self.path)
            name = os.path.basename(real)
            slot.watch = FileWatch.open(os.path.dirname(real), (name + "-wal",))
            if slot.watch is None:
                _log.debug("no file watch for %s: waiting for jobs by polling", real)
        return slot.watch

    def _data_version(self, conn: sqlite3.Connection) -> int | None:
        try:
            return int(conn.execute(_DATA_VERSION).fetchone()[0])
        except sqlite3.ProgrammingError:
            if self._closed:
                raise self._closed_error() from None
            raise
        except sqlite3.Error as exc:
            if _translatable(exc) and is_busy(exc):
                return None
            raise self._unavailable(exc) from exc


# -- statement bodies (run inside a transaction) ------------------------------------------------


def _job_row(job: NewJob, now_us: int) -> tuple[Any, ...]:
    """``job`` as the values of ``job_insert``, in its order."""
    if job.run_at is not None:
        run_at = _us(job.run_at)
    elif job.delay is not None:
        run_at = now_us + job.delay // MICROSECOND
    else:
        run_at = now_us
    return (
        job.id,
        job.tenant_id,
        job.name,
        job.queue,
        job.input,
        job.idempotency_key,
        job.priority,
        "scheduled" if run_at > now_us else "available",
        job.max_attempts,
        run_at,
        now_us,
        job.trace_context,
        job.limit_key,
        job.limit_max,
        job.rate_max,
        job.rate_period // MICROSECOND,
    )


def _insert(
    conn: sqlite3.Connection,
    jobs: Sequence[NewJob],
    now_us: int,
    rows: list[tuple[Any, ...]] | None,
    batches: list[dict[str, Any]] | None,
) -> list[InsertResult]:
    """Insert ``jobs``: as ``batches`` (``_batches``) when given, else as their ``rows``
    (made from the jobs when None) in one ``executemany``, else, when some key is taken,
    row by row to learn which."""
    if len(jobs) > 1 and (batches is not None or not any(j.unique_key is not None for j in jobs)):
        try:
            with savepoint(conn):
                if batches is not None:
                    inserted = sum(conn.execute(_INSERT_BATCH, b).rowcount for b in batches)
                    counted = [(batches[0]["queue"], batches[0]["state"], len(jobs))]
                else:
                    assert rows is not None
                    inserted = conn.executemany(_INSERT, rows).rowcount
                    counted = _counted(rows)
                if inserted != len(jobs):
                    raise _Redo
                conn.executemany(_COUNTS_ADD, counted)
            return [InsertResult(job_id, False) for job_id in ids_of(jobs)]
        except (_Redo, sqlite3.IntegrityError):
            # Some keys were already stored or repeat within the batch (an IntegrityError:
            # the row-by-row pass below names the offending job): the batch was rolled back,
            # and goes again row by row to learn which, so a re-published job with its
            # original id still reports deduped=True.
            pass
    if rows is None:
        rows = [_job_row(job, now_us) for job in jobs]
    results = [_insert_one(conn, job, row) for job, row in zip(jobs, rows, strict=True)]
    _count_inserted(conn, [row for row, r in zip(rows, results, strict=True) if not r.deduped])
    return results


#: What the jobs of one ``job_insert_batch`` share (``_batches``).
_SHARED = operator.attrgetter(
    "tenant_id", "name", "queue", "priority", "max_attempts", "run_at", "delay",
    "limit_max", "rate_max", "rate_period",
)  # fmt: skip
_encode_rows = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), check_circular=False
).encode


def _batches(jobs: Sequence[NewJob], now_us: int, batch_text: int) -> list[dict[str, Any]] | None:
    """``jobs`` as the parameters of ``job_insert_batch`` statements (one per
    ``batch_text`` characters of rows), when they share every field it binds once: the jobs of one
    ``enqueue_many``. None when two differ in one of those, or a job has a uniqueness key
    (each is resolved by a statement of its own). A plain batch (``NewJobs.template``) gives
    its columns, without a ``NewJob`` per row."""
    rows: list[tuple[Any, ...]]
    if isinstance(jobs, NewJobs) and jobs.template is not None:
        first = jobs.template
        ids, texts = next(jobs.columns(len(jobs)))
        rows = list(zip(ids, texts, strict=True))
    else:
        first = jobs[0]
        shared = _SHARED(first)
        rows = []
        for job in jobs:
            if job.unique_key is not None or _SHARED(job) != shared:
                return None
            job_id, key = job.id, job.idempotency_key
            if key == job_id and job.trace_context is None and job.limit_key is None:
                rows.append((job_id, job.input))
            else:
                rows.append(
                    (job_id, job.input, None if key == job_id else key, job.trace_context,
                     job.limit_key)
                )  # fmt: skip
    chunks: list[list[tuple[Any, ...]]] = []
    chunk: list[tuple[Any, ...]] = []
    size = 0
    for row in rows:  # (id, input, ...)
        chunk.append(row)
        size += len(row[1]) + 100
        if size > batch_text:
            chunks.append(chunk)
            chunk, size = [], 0
    if chunk:
        chunks.append(chunk)
    head = _job_row(first, now_us)
    shared_values = {
        "tenant_id": head[1],
        "name": head[2],
        "queue": head[3],
        "priority": head[6],
        "state": head[7],
        "max_attempts": head[8],
        "run_at": head[9],
        "created_at": head[10],
        "limit_max": head[13],
        "rate_max": head[14],
        "rate_period": head[15],
    }
    return [{**shared_values, "rows": _encode_rows(chunk)} for chunk in chunks]


def _count_inserted(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Add the inserted rows to the kept counts (migration 5), in the same transaction."""
    if len(rows) == 1:
        row = rows[0]
        conn.execute(_COUNTS_ADD, (row[3], row[7], 1))
        return
    conn.executemany(_COUNTS_ADD, _counted(rows))


def _counted(rows: Sequence[tuple[Any, ...]]) -> list[tuple[str, str, int]]:
    """``job_counts_add``'s values for ``rows`` of ``job_insert``: one per (queue, state)."""
    added = Counter((row[3], row[7]) for row in rows)
    return [(queue, state, n) for (queue, state), n in added.items()]


def _insert_one(conn: sqlite3.Connection, job: NewJob, row: tuple[Any, ...]) -> InsertResult:
    unique = job.unique_key is not None
    try:
        if unique:
            row = (*row, job.unique_key, job.unique_states)
            inserted = conn.execute(_Q["job_insert_unique"], row).rowcount == 1
        else:
            inserted = conn.execute(_INSERT, row).rowcount == 1
    except sqlite3.IntegrityError as exc:
        if "x_jobs.id" in str(exc):
            raise ValueError(f"job id {job.id} is already stored under another key") from exc
        raise DriverUnavailableError(
            f"SQLite refused the row of job {job.name} ({job.id}): {exc}",
            driver="sqlite",
            fix="a constraint or trigger added to the job tables refused it (the library's own "
            "schema refuses none of its rows)",
            retryable=False,
        ) from exc
    if inserted:
        return InsertResult(job.id, False)
    found = None
    if job.idempotency_key != job.id:  # a caller's key (a keyless job's key is its id)
        found = conn.execute(_Q["job_id_by_key"], {"tenant_id": row[1], "key": row[5]}).fetchone()
    if found is None:
        holder = conn.execute(_Q["job_key_by_id"], {"id": job.id}).fetchone()
        if holder is not None:
            if holder[0] != job.idempotency_key:
                raise ValueError(f"job id {job.id} is already stored under another key")
            found = (job.id,)  # this very job, stored before (a re-published one)
    if found is None and unique:
        # The unique key is held (the write lock is ours: the holder cannot move meanwhile).
        found = conn.execute(_Q["job_unique_holder"], {"key": job.unique_key}).fetchone()
        if found is not None and job.unique_replace:
            args = {"id": found[0], "input": row[4], "run_at": row[9], "priority": row[6]}
            conn.execute(_Q["job_debounce"], {**args, "now": row[10]})
    # The write lock is ours: whatever refused the row is still there to be found.
    assert found is not None, f"job {job.id} was refused, yet no stored job holds its key"
    return InsertResult(found[0], True)


def _failure_rows(failures: Sequence[Failure], now_us: int) -> list[dict[str, Any]]:
    return [
        {
            "retry_at": None
            if failure.retry_in is None
            else now_us + failure.retry_in // MICROSECOND,
            "now": now_us,
            "error": json.dumps(failure.error.to_json()),
            "id": failure.lease.id,
            "token": failure.lease.token,
            "isolated": int(failure.isolate),
            "refund": int(failure.refund),
        }
        for failure in failures
    ]


class _Redo(Exception):
    """A batch that did not go as one: rolled back (``savepoint``), to be done row by row."""


def _apply_each(
    conn: sqlite3.Connection, query: str, rows: Sequence[Any], ids_: list[str]
) -> set[str]:
    """Run a one-row fenced UPDATE per row; return the ids it changed. ``executemany`` does the
    whole batch at once; only when some row matched nothing (a stale lease, a repeated id) is
    the batch redone row by row to learn which."""
    if len(rows) == 1:
        return {ids_[0]} if conn.execute(query, rows[0]).rowcount == 1 else set()
    try:
        with savepoint(conn):
            if conn.executemany(query, rows).rowcount != len(rows):
                raise _Redo
        return set(ids_)
    except _Redo:
        return {
            id_ for id_, row in zip(ids_, rows, strict=True) if conn.execute(query, row).rowcount
        }


def _claim(
    conn: sqlite3.Connection, params: ClaimParams, *, after: dict[str, str]
) -> tuple[list[Job], timedelta | None]:
    """Claim for ``params`` in the open transaction, marking the jobs started; and
    how long after its ``now`` a job held back by a rate limit may be claimed. ``after`` holds the per-queue key
    cursor of limited claims, and is advanced."""
    now_us = _now_us(params.now)
    args: dict[str, Any] = {
        "now": now_us,
        "token": params.token or ids.token(),
        "expires_at": now_us + params.lease_for // MICROSECOND,
        "worker_id": params.worker_id,
        "limit": params.limit,
    }
    queues = sorted(set(params.queues))
    wake: list[int] = []
    if len(queues) == 1 and not (params.isolated or params.limited or params.skip):
        args["queue"] = queues[0]
        rows = conn.execute(_CLAIM_QUEUE, args).fetchall()
    else:
        args["isolated"] = int(params.isolated)
        args["skip"] = json.dumps(sorted(params.skip))
        rows = _claim_queues(conn, queues, args, after if params.limited else None, wake)
    jobs = [_job(row) for row in rows]
    jobs.sort(key=_claim_order)
    return jobs, (timedelta(microseconds=min(wake) - now_us) if wake else None)


def _claim_queues(
    conn: sqlite3.Connection,
    queues: list[str],
    args: dict[str, Any],
    after: dict[str, str] | None,
    wake: list[int],
) -> list[Any]:
    """Claim the best of several queues (or of one, with limits: ``after`` is not None; the
    times rate windows reopen go to ``wake``)."""
    # (-priority, rank within its key, the key's turn, run_at, id): with limits, keys take
    # turns within a priority (the unlimited jobs of a queue go first, as one key); without,
    # rank and turn are 0 and this is claim order.
    candidates: list[tuple[int, int, int, int, str]] = []
    for queue in queues:  # a paused queue yields nothing (the queries say so)
        query_args = {
            "queue": queue,
            "now": args["now"],
            "limit": args["limit"],
            "isolated": args["isolated"],
            "skip": args["skip"],
        }
        if after is None:
            rows = conn.execute(_Q["job_claim_candidates"], query_args)
            candidates.extend((-priority, 0, -1, run_at, id_) for id_, priority, run_at in rows)
        else:  # the unlimited ones come with the limited ones, in one statement
            candidates.extend(_limited_candidates(conn, query_args, after, wake))
    if not candidates:
        return []
    candidates.sort()
    chosen = [candidate[-1] for candidate in candidates[: args["limit"]]]
    return conn.execute(_Q["job_claim_ids"], {**args, "ids": json.dumps(chosen)}).fetchall()


def _oldest_ready(conn: sqlite3.Connection, now_us: int) -> list[tuple[str, int | None]]:
    """Per queue with a waiting job, the run_at of its oldest job due by ``now_us`` (None:
    none is due): a walk of the claim index's (queue, priority) groups, a seek a step, and the
    due limited jobs (rows of both kinds for a queue that has both)."""
    found: list[tuple[str, int | None]] = list(
        conn.execute(_Q["queue_oldest_limited"], {"now": now_us}).fetchall()
    )
    after = ""
    while True:
        row = conn.execute(_Q["queue_first"], {"after": after}).fetchone()
        if row is None or row[0] is None:
            return found
        queue, priority = row
        oldest: int | None = None
        while priority is not None:
            args = {"queue": queue, "priority": priority}
            first = conn.execute(_Q["queue_group_first_run_at"], args).fetchone()[0]
            if first is not None and first <= now_us and (oldest is None or first < oldest):
                oldest = first
            priority = conn.execute(_Q["queue_next_priority"], args).fetchone()[0]
        found.append((queue, oldest))
        after = queue


def _limited_candidates(
    conn: sqlite3.Connection, args: dict[str, Any], after: dict[str, str], wake: list[int]
) -> list[tuple[int, int, int, int, str]]:
    """The unlimited due jobs of one queue (the claim's first ``limit``), and those that fit
    their key's free slots (``limits``, steps 1 and 2):
    key by key from the one after the queue's cursor (wrapping around once, at most
    ``KEYS_PER_CLAIM`` keys), each key's first due jobs up to its free slots, until the claim's
    ``limit`` is met (at most ``keys_to_look(limit)`` keys); the cursor moves to the last key
    taken. The keys are read lazily, so the
    walk stops where the claim is full. The claim holds the write lock: the counts are exact."""
    queue = args["queue"]
    need = args["limit"]
    most_keys = keys_to_look(need)
    start = after.get(queue, "")
    taken: list[str] = []
    looked: list[str] = []
    found: list[tuple[int, int, int, int, str]] = []
    passes = [(start, None)] + ([("", start)] if start else [])
    for begin, upto in passes:
        keys = conn.execute(
            _Q["job_limit_keys"],
            {
                **args,
                "after": begin,
                "upto": upto,
                "keys": most_keys - len(looked),
                "plain": upto is None,  # the first pass also reads the unlimited jobs
            },
        )
        for key, most, running, rate_max, rate_period, starts, oldest, due in keys:
            if key is None:
                found.extend(
                    (-priority, rank, -1, run_at, id_)
                    for rank, (id_, priority, run_at) in enumerate(_by_claim_order(due))
                )
                continue
            looked.append(key)
            free = most - running
            if rate_max:
                if starts >= rate_max and running < most:
                    wake.append(oldest + rate_period)  # when the oldest start leaves the window
                free = min(free, rate_max - starts)
            if free <= 0 or due is None:
                continue
            rows = _by_claim_order(due)[: min(free, need)]
            turn = len(taken)
            found.extend(
                (-priority, rank, turn, run_at, id_)
                for rank, (id_, priority, run_at) in enumerate(rows)
            )
            taken.append(key)
            need -= len(rows)
            if need <= 0:
                break
        keys.close()  # ends the walk where it is
        if need <= 0 or len(looked) >= most_keys:
            break
    if taken:
        after[queue] = taken[-1]  # round-robin: the next claim starts after the last key taken
    elif len(looked) >= most_keys:
        after[queue] = looked[-1]  # past the full keys looked at
    return found


def _by_claim_order(rows: str) -> list[list[Any]]:
    """A JSON array of [id, priority, run_at] (``job_limit_keys``), in claim order."""
    return sorted(json.loads(rows), key=lambda r: (-r[1], r[2], r[0]))


def _filter_args(where: JobFilter) -> dict[str, Any]:
    return {
        "states": _json_or_none(where.states),
        "queue": where.queue,
        "name": where.name,
        "tenant_id": where.tenant_id,
        "ids": None if where.ids is None else json.dumps(list(where.ids)),
        "min_id": where.min_id,
    }


def _in_order(requested: Sequence[str], changed: set[str]) -> list[str]:
    seen: set[str] = set()
    ordered = []
    for id_ in requested:
        if id_ in changed and id_ not in seen:
            seen.add(id_)
            ordered.append(id_)
    return ordered
