"""The SQLite driver's connections: one per thread (and one more per waiting thread), opened
in WAL mode, closed when the thread ends or by ``close()``; its write and read transactions,
retried while busy with the diagnosis of who holds the lock; joining a caller's connection
and transaction; its schema. A mixin of ``SqliteDriver``: it knows files, locks and
transactions, nothing of jobs."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ultimat3.jobs.clock import Clock, Frame
from ultimat3.jobs.dialects.sqlite import (
    apply_migrations,
    check_unconverted,
    check_usable,
    close_quietly,
    connect,
    in_callers,
    is_busy,
    joined_file,
    once,
    pending_versions,
    plain_rows,
    printable_migrations,
    retry_busy,
    savepoint,
    transaction,
    unavailable,
    use_wal,
    write_in,
)
from ultimat3.jobs.dialects.sqlite_locks import (
    HolderWatch,
    LockWatch,
    disown,
    file_identity,
    hold_own,
)
from ultimat3.jobs.driver import DatabaseId, Joined, StallTracker, current_tx
from ultimat3.jobs.drivers.sqlite.frame import align
from ultimat3.jobs.drivers.sqlite.wait import Slot
from ultimat3.jobs.errors import (
    ConfigurationError,
    DriverUnavailableError,
    in_callers_transaction,
)
from ultimat3.jobs.sql import migrations, queries

_T = TypeVar("_T")
_log = logging.getLogger("ultimat3.jobs.drivers.sqlite")
_Q = queries("sqlite")
_DATA_VERSION = _Q["data_version"]

_SETUP_FIX = (
    "run `ultimat3-jobs migrate` once, or call app.open() at start-up, before any request "
    "opens a transaction"
)

_NETWORK_FILESYSTEMS = frozenset((
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre", "gpfs",
    "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse",
))  # fmt: skip


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


class Connections:
    """What ``SqliteDriver`` is made of below the jobs (see the module docstring)."""

    path: str
    stalls: StallTracker
    _synchronous: str
    _busy_timeout: float
    _wait_clock: Clock
    _lock_watch: LockWatch
    _frame: Callable[[], Frame | None]
    _lock: threading.Lock
    _conns: dict[int, sqlite3.Connection]
    _local: threading.local
    _closed: bool
    _checked_filesystem: bool
    _identity: DatabaseId | None

    # -- connections -------------------------------------------------------------------------

    def _slot(self, attr: str = "slot") -> Slot:
        slot: Slot | None = getattr(self._local, attr, None)
        if slot is None:
            slot = Slot(self._open())
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

    def _pragma(self, conn: sqlite3.Connection, text: str) -> None:
        """Set a connection's pragma, its failure translated like any statement's."""
        try:
            conn.execute(text)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    # -- retry loops -------------------------------------------------------------------------

    def _retry(
        self,
        attempt: Callable[[], _T],
        held_here: Callable[[], ConfigurationError] | None = None,
    ) -> _T:
        """Run ``attempt`` until it is not refused as busy, up to ``busy_timeout`` seconds
        (``dialects.sqlite.retry_busy``), noting a long wait in ``stalls``. ``held_here``: the
        error of a wait for this process's own connection (``dialects.sqlite.HolderWatch``)."""
        watch = None
        if held_here is not None:
            joined = current_tx.get()
            in_tx = joined is not None and bool(getattr(joined.connection, "in_transaction", 0))
            watch = HolderWatch(
                self.path, held_here, in_callers_tx=in_tx, settings=self._lock_watch
            )
        started = self._wait_clock.monotonic()
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
        """Run ``body`` as part of the caller's transaction on ``executor``
        (``dialects.sqlite.write_in``); a failure inside it raises
        ``errors.in_callers_transaction``, which says so and names the cause."""
        conn = self.adopt(executor).connection
        opened = conn.in_transaction
        try:
            return write_in(conn, self._aligned(body), retry=self._retry)
        except sqlite3.Error as exc:
            if not _translatable(exc):
                raise
            raise in_callers(
                exc,
                conn,
                opened=opened,
                translated=self._unavailable(exc),
                path=self.path,
                driver="sqlite",
            ) from exc
        except DriverUnavailableError as exc:  # a row refused (``_insert_one``)
            if not opened:
                raise
            raise in_callers_transaction(exc.cause, driver="sqlite", fix=exc.fix) from exc

    # -- steps of the host clock -------------------------------------------------------------

    def _aligned(
        self, body: Callable[[sqlite3.Connection], _T]
    ) -> Callable[[sqlite3.Connection], _T]:
        """``body`` after ``frame.align``: first thing in every write transaction."""

        def aligned(conn: sqlite3.Connection) -> _T:
            align(conn, self._frame(), self.path)
            return body(conn)

        return aligned

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
        doing = "driver.transaction() (app.transaction())"
        slot.depth = 1
        try:
            with transaction(
                conn, retry=lambda attempt: self._retry(attempt, lambda: self._held_here(doing))
            ):
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
                check_usable(connection.connection)
                return connection
            connection = connection.connection
        main, _ = joined_file(
            connection,
            owner="the SQLite driver",
            fix=f"open the connection with sqlite3.connect({self.path!r}); a connection to "
            "another database cannot share a transaction with the job file, so enqueue "
            "through the outbox instead",
        )
        if not main or file_identity(main) != self.identity():
            where = main or "an in-memory or temporary database"
            raise ConfigurationError(
                f"the connection opens {where}, but the jobs live in {self.path}",
                fix=f"connect to {self.path} (the job tables must be in the same file to share "
                "a transaction), or enqueue through the outbox when your data lives elsewhere",
            )
        check_unconverted(connection)
        return Joined(connection, self.identity())

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
