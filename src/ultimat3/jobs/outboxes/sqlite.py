"""The SQLite outbox store: staged jobs in ``x_outbox`` inside your application's SQLite file.

What it guarantees:

- **Staged in your transaction.** ``stage`` writes on your own ``sqlite3.Connection`` as part
  of your transaction, by the job driver's rules (``dialects.sqlite.write_in``), so the rows
  exist if and only if you commit, and a failed stage rolls back only its own part.
- **One relay at a time per batch.** A claim runs in ``BEGIN IMMEDIATE`` on the store's own
  connection and holds SQLite's write lock until its ``with`` block ends, so two relays never
  claim the same row; the second waits (up to ``busy_timeout``) and then sees the rows
  published. Marks commit with the claim; a relay killed before that commit leaves its rows
  unpublished, and the next claim publishes them again (the job's idempotency key collapses
  the repeat).
- **No lock of ours across a wait on your database.** The store's one connection is shared
  behind a Python lock taken for one attempt at a time (``dialects.sqlite.retry_busy``), and
  its identity is computed once, so a business transaction that holds the write lock never
  waits for the relay that waits for it (but for a ``COMMIT`` in rollback-journal mode, which
  waits for the file's readers).

Limits: the claim holds the write lock of your database while it publishes (one insert
transaction on the job database per queue in the batch: milliseconds), so your writers wait
that long. WAL mode (``PRAGMA journal_mode=WAL``) is recommended for your file so readers never
wait; the store does not change your file's journal mode. SQLite 3.37 or newer.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ultimat3.jobs.clock import Clock, SystemClock
from ultimat3.jobs.dialects.sqlite import (
    BEGIN_IMMEDIATE,
    apply_migrations,
    close_quietly,
    connect,
    dt,
    dt_or_none,
    file_path,
    in_callers,
    is_busy,
    joined_file,
    now_us,
    pending_versions,
    printable_migrations,
    retry_busy,
    transaction,
    unavailable,
    us,
    write_in,
)
from ultimat3.jobs.dialects.sqlite_locks import (
    HolderWatch,
    LockWatch,
    disown,
    file_identity,
    hold_own,
)
from ultimat3.jobs.driver import (
    DatabaseId,
    Joined,
    OneConnection,
)
from ultimat3.jobs.errors import (
    ConfigurationError,
    DriverUnavailableError,
)
from ultimat3.jobs.outbox_store import OutboxRecord
from ultimat3.jobs.records import NewJob
from ultimat3.jobs.sql import migrations, queries

__all__ = ["SqliteOutboxStore"]

_PACKAGE = "ultimat3.jobs.outboxes"
_Q = queries("sqlite", _PACKAGE)
_NAME = "sqlite-outbox"
_T = TypeVar("_T")


def _record(row: Sequence[Any]) -> OutboxRecord:
    (id_, job, queue, input_, key, attempts, priority, run_at, staged_at, tenant, published) = row[
        :11
    ]
    trace = row[11] if len(row) > 11 else None
    run = dt_or_none(run_at)
    new = NewJob(id_, job, queue, input_, key, attempts, run, priority, tenant, trace_context=trace)
    return OutboxRecord(new, staged_at=dt(staged_at), published_at=dt_or_none(published))


def _row(job: NewJob, at_us: int) -> tuple[Any, ...]:
    run_at = None if job.run_at is None else us(job.run_at)
    if job.delay is not None:
        run_at = at_us + job.delay // timedelta(microseconds=1)
    return (
        job.id,
        job.name,
        job.queue,
        job.input,
        job.idempotency_key,
        job.max_attempts,
        job.priority,
        run_at,
        at_us,
        job.tenant_id,
        job.trace_context,
    )


@dataclass
class _Batch:
    conn: sqlite3.Connection
    records: list[OutboxRecord]

    def mark_published(self, ids: Sequence[str], *, now: datetime | None = None) -> None:
        if ids:
            args = {"ids": json.dumps(list(ids)), "now": now_us(now)}
            self.conn.execute(_Q["mark_published"], args)


class SqliteOutboxStore(OneConnection):
    """``x_outbox`` in the SQLite file at ``path`` (your data's file, not the job file).

    ``busy_timeout`` is how many seconds the store's own statements wait for another writer
    before raising ``DriverUnavailableError``; ``wait_clock`` the clock they wait with (real
    time by default: the other writer lives in real time); ``lock_watch`` how a wait for the
    write lock looks at who holds it (``dialects.sqlite.LockWatch``).
    """

    name = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        wait_clock: Clock | None = None,
        lock_watch: LockWatch | None = None,
    ) -> None:
        self.path = file_path(
            path,
            busy_timeout,
            owner="the SQLite outbox store",
            fix="pass the path of the SQLite file your business transactions write to",
        )
        self.display_url = f"sqlite:///{self.path}"
        self._busy_timeout = float(busy_timeout)
        self._wait_clock = wait_clock or SystemClock()
        self._lock_watch = lock_watch or LockWatch()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._identity: DatabaseId | None = None
        self._closed = False
        self._hold_one_connection()

    def __repr__(self) -> str:
        return f"SqliteOutboxStore({self.path!r})"

    # -- the store's own connection -----------------------------------------------------------

    def _own(self) -> sqlite3.Connection:
        if self._closed:
            raise DriverUnavailableError(
                f"the outbox store for {self.path} is closed",
                driver=_NAME,
                fix="stop using a store after close(); open a new one if you need it again",
            )
        if self._conn is None:
            try:
                # SQLite's busy handler waits only a moment, with our lock held; the
                # longer wait is retry_busy's, with it released.
                self._conn = connect(self.path, busy_timeout=self._busy_timeout)
            except sqlite3.Error as exc:
                raise self._unavailable(exc) from exc
            self._opened(self._conn)
            hold_own(self._conn, self.path, self)  # the library's own (blocked_here)
        return self._conn

    def _begin(self) -> None:
        """One try at ``BEGIN IMMEDIATE``: on success the store's lock stays held (the
        transaction is this thread's until ``_write`` releases it); on a refusal it is
        released, so nothing waits on it while ``retry_busy`` pauses."""
        self._lock.acquire()
        try:
            self._own().execute(BEGIN_IMMEDIATE)
        except BaseException:
            self._lock.release()
            raise

    @contextmanager
    def _write(
        self, held_here: Callable[[], Exception] | None = None
    ) -> Iterator[sqlite3.Connection]:
        """A ``transaction`` (``BEGIN IMMEDIATE``) on the store's connection, waited for with no
        lock of ours held (``_begin``); ``held_here``: see ``dialects.sqlite.HolderWatch``."""
        watch = (
            None
            if held_here is None
            else HolderWatch(self.path, held_here, settings=self._lock_watch)
        )
        began = False

        def begin() -> None:
            nonlocal began
            self._begin()
            began = True

        def retry(attempt: Callable[[], _T]) -> _T:
            on_busy = None if began else watch
            return retry_busy(
                attempt, timeout=self._busy_timeout, on_busy=on_busy, clock=self._wait_clock
            )

        with self._lock:
            conn = self._own()
        try:
            with transaction(conn, retry=retry, begin=begin):
                yield conn
        except sqlite3.Error as exc:
            held = None if began or watch is None or not is_busy(exc) else watch.verdict()
            if held is not None:
                raise held from exc
            if not began or isinstance(exc, sqlite3.OperationalError):
                raise self._unavailable(exc) from exc
            raise
        finally:
            if began:
                self._lock.release()

    def _read(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """``body`` on the store's connection, the lock held for each try only."""

        def attempt() -> _T:
            with self._lock:
                return body(self._own())

        try:
            return retry_busy(attempt, timeout=self._busy_timeout, clock=self._wait_clock)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: sqlite3.Error) -> DriverUnavailableError:
        return unavailable(
            exc,
            path=self.path,
            driver=_NAME,
            busy_timeout=self._busy_timeout,
            tables="the outbox table x_outbox",
            migrate="run store.migrate() (App(outbox=...) migrates it on first use)",
            refused="stage each job once: its id is the outbox row's key",
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                disown(self._conn)
                close_quietly(self._conn)
                self._conn = None

    # -- schema ------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations in one ``BEGIN IMMEDIATE`` transaction. An up-to-date file
        is only read, so migrating on first use inside a caller's open write transaction on
        the same file (which holds the write lock) does not wait for it."""
        known = migrations("sqlite", _PACKAGE)
        if self.schema_current():
            return []
        with self._write(self._migrate_held_here) as conn:
            return apply_migrations(conn, known, _Q)

    def _migrate_held_here(self) -> ConfigurationError:
        return ConfigurationError(
            f"the outbox table x_outbox in {self.path} needs creating, and this process holds "
            "the write lock that creating it needs on a connection of its own (the transaction "
            "around this call, once it has written)",
            fix="run `ultimat3-jobs migrate` once (it creates x_outbox too), or call the "
            "store's migrate() at start-up, before any request opens a transaction",
        )

    def schema_current(self) -> bool:
        known = migrations("sqlite", _PACKAGE)
        return not self._read(lambda conn: pending_versions(conn, known, _Q))

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        """The file, by device and inode: computed once (again on ``refresh``), without the
        store's lock, which a claim may hold while the caller's transaction asks for it."""
        found = self._identity
        if found is None or refresh:
            if not os.path.exists(self.path):
                with self._lock:
                    self._own()  # the file exists once opened
            found = self._identity = file_identity(self.path)
        return found

    def migration_sql(self) -> list[tuple[int, str]]:
        return printable_migrations(migrations("sqlite", _PACKAGE), _Q)

    # -- staging on the caller's connection --------------------------------------------------

    def adopt(self, connection: Any) -> Joined:
        """Accept a caller's ``sqlite3.Connection`` (or a ``Joined``) whose main database is
        the store's file."""
        if isinstance(connection, Joined):
            if connection.database == self.identity() and isinstance(
                connection.connection, sqlite3.Connection
            ):
                return connection
            connection = connection.connection
        main, has_table = joined_file(
            connection,
            owner="the SQLite outbox store",
            fix=f"open the connection with sqlite3.connect({self.path!r})",
            probe=_Q["table_exists"],
        )
        if not main or file_identity(main) != self.identity():
            raise ConfigurationError(
                f"the connection opens {main or 'an in-memory database'}, but the outbox "
                f"lives in {self.path}",
                fix="give the app an outbox on the database your connection writes to: "
                f"App(..., outbox='sqlite:///{main}')"
                if main
                else "connect to a database file",
            )
        if not has_table:
            raise ConfigurationError(
                f"the outbox table x_outbox does not exist in {self.path}",
                fix="run store.migrate() once (App(outbox=...) migrates it on first use)",
            )
        return Joined(connection, self.identity())

    def stage(
        self, executor: Joined, jobs: Sequence[NewJob], *, now: datetime | None = None
    ) -> None:
        if not jobs:
            return
        conn = self.adopt(executor).connection
        at_us = now_us(now)
        rows = [_row(job, at_us) for job in jobs]

        def body(c: sqlite3.Connection) -> None:
            c.executemany(_Q["stage"], rows)

        opened = conn.in_transaction
        try:
            write_in(conn, body, retry=lambda attempt: attempt())
        except sqlite3.Error as exc:
            translated = self._unavailable(exc)
            raise in_callers(
                exc, conn, opened=opened, translated=translated, path=self.path, driver=_NAME
            ) from exc

    # -- the relay's side --------------------------------------------------------------------

    @contextmanager
    def claim(self, limit: int) -> Iterator[_Batch]:
        with self._write() as conn:
            rows = conn.execute(_Q["claim"], {"limit": max(0, limit)}).fetchall()
            yield _Batch(conn, [_record(row) for row in rows])

    def pending_count(self) -> int:
        return int(self._read(lambda conn: conn.execute(_Q["pending_count"]).fetchone()[0]))

    def prune(self, *, published_before: datetime, limit: int) -> int:
        if limit <= 0:
            return 0
        with self._write() as conn:
            args = {"before": us(published_before), "limit": limit}
            return conn.execute(_Q["prune"], args).rowcount
