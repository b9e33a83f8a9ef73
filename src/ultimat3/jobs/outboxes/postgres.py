"""The PostgreSQL outbox store: staged jobs in ``x_outbox`` inside your application's database.

What it guarantees:

- **Staged in your transaction**, in a SAVEPOINT of it (``dialects.postgres.in_savepoint``,
  the driver's too): the rows exist if and only if you commit, and a failed stage leaves your
  transaction usable and raises an ``EnqueueRefusedError`` naming the cause.
- **Relays split the work.** A claim takes rows ``FOR UPDATE SKIP LOCKED`` in a transaction
  held for the claim's ``with`` block, on the store's own connection; the marks commit with
  the claim, and a relay killed before that releases its rows unmarked (the job's
  idempotency key collapses the repeat).
- **Failures are errors with a fix**: a server that is down raises ``DriverUnavailableError``
  and the next call reconnects; a missing table says to migrate.
- **Bounded, and pooler-safe.** The driver's connect settings and per-transaction timeouts
  (``dialects.postgres``; the idle timeout is three statement timeouts: a claim stays open
  while the relay publishes); it never prepares, LISTENs or SETs a session, so a
  transaction-mode pooler is fine (``?pooler=transaction`` is accepted and changes nothing).

Schema: ``x_outbox`` in ``schema`` (validated, quoted); migrations are recorded in
``x_outbox_migrations`` and run under an advisory lock.

Limits: per-queue publish order holds within one relay. Sync connections only: an
``AsyncConnection`` goes through ``ultimat3.jobs.integrations.psycopg``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ultimat3.jobs.dialects.postgres import (
    LOCK_TIMEOUT,
    STATEMENT_TIMEOUT,
    Migrations,
    bounds_sql,
    check_bounds,
    check_joinable,
    check_setup,
    connect,
    connect_settings,
    identify,
    in_savepoint,
    jobs_named,
    listed,
    masked_dsn,
    migration_plan,
    our_cursor,
    translate,
)
from ultimat3.jobs.driver import DatabaseId, Joined, OneConnection
from ultimat3.jobs.errors import ConfigurationError, DriverUnavailableError, JobsError
from ultimat3.jobs.outbox_store import OutboxRecord
from ultimat3.jobs.records import NewJob
from ultimat3.jobs.sql import migrations, queries

try:
    import psycopg
    from psycopg import sql as pg_sql
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    _MISSING: ImportError | None = _exc
else:
    _MISSING = None

__all__ = ["PostgresOutboxStore"]

_PACKAGE = "ultimat3.jobs.outboxes"
_NAME = "postgres-outbox"
_MIGRATE_FIX = "run store.migrate() once (App(outbox=...) migrates it on first use)"
_ADOPT_FIX = (
    "pass a sync psycopg 3 Connection to the outbox's database; for an AsyncConnection use "
    "ultimat3.jobs.integrations.psycopg.using(app, conn); SQLAlchemy and Django connections "
    "go through their integrations"
)


def _record(row: Sequence[Any]) -> OutboxRecord:
    id_, job, queue, input_, key, attempts, priority, run_at, staged_at, tenant, published = row[
        :11
    ]
    return OutboxRecord(
        NewJob(
            id=id_,
            name=job,
            queue=queue,
            input=input_,
            idempotency_key=key,
            max_attempts=attempts,
            run_at=run_at,
            priority=priority,
            tenant_id=tenant,
            trace_context=row[11] if len(row) > 11 else None,
        ),
        staged_at=staged_at,
        published_at=published,
    )


@dataclass
class _Batch:
    store: PostgresOutboxStore
    conn: psycopg.Connection[Any]
    records: list[OutboxRecord]

    def mark_published(self, ids: Sequence[str], *, now: datetime | None = None) -> None:
        if ids:
            self.conn.execute(
                self.store._q["mark_published"], {"ids": list(ids), "now": now}, prepare=False
            )


class PostgresOutboxStore(OneConnection, Migrations):
    """``x_outbox`` in the PostgreSQL database ``dsn`` names (your data's database)."""

    name = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "ultimat3_jobs",
        statement_timeout: float = STATEMENT_TIMEOUT,
        lock_timeout: float = LOCK_TIMEOUT,
    ) -> None:
        check_setup(
            _MISSING, what="postgres outbox store", needs="psycopg 3", driver=_NAME, schema=schema
        )
        check_bounds(statement_timeout, lock_timeout)
        self.display_url = masked_dsn(dsn)
        self._dsn = dsn
        self._schema = schema
        self.statement_timeout = statement_timeout
        self.lock_timeout = lock_timeout
        self._bounds = bounds_sql(statement_timeout, lock_timeout, idle=3 * statement_timeout)
        quoted = pg_sql.Identifier(schema).as_string(None)
        self._table = f"{quoted}.x_outbox"
        self._ledger = f"{quoted}.x_outbox_migrations"
        self._q: dict[str, bytes] = {
            name: text.replace("{schema}", quoted).encode()
            for name, text in queries("postgres", _PACKAGE).items()
        }
        self._migrations, self._migrate_key = migration_plan(
            migrations("postgres", _PACKAGE),
            quoted_schema=quoted,
            ledger=self._ledger,
            lock_name=f"outbox:{schema}",
        )
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._identity: DatabaseId | None = None
        self._hold_one_connection()

    def __repr__(self) -> str:
        return f"PostgresOutboxStore({self.display_url!r})"

    # -- the store's own connection -----------------------------------------------------------

    def _own(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise DriverUnavailableError(
                f"the outbox store for {self.display_url} is closed",
                driver=_NAME,
                fix="stop using a store after close(); open a new one if you need it again",
            )
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn.close()
            self._conn = None
        if self._conn is None:
            try:
                self._conn = connect(self._dsn, connect_settings(self._dsn, "ultimat3-jobs-outbox"))
            except psycopg.Error as exc:
                raise self._translate(exc, None) from exc
            self._opened(self._conn)
        return self._conn

    @contextmanager
    def _transaction(self, *, bounded: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on the store's own connection, bounded unless told (DDL may take long)."""
        with self._lock:
            conn = self._own()
            try:
                with conn.transaction():
                    if bounded:
                        conn.execute(self._bounds, prepare=False)
                    yield conn
            except psycopg.Error as exc:
                raise self._translate(exc, conn) from exc

    def _translate(self, exc: psycopg.Error, conn: psycopg.Connection[Any] | None) -> JobsError:
        """``dialects.postgres.translate``; ``conn`` None: connecting failed."""
        return translate(
            exc,
            url=self.display_url,
            driver=_NAME,
            missing="the outbox table is missing",
            migrate_fix=_MIGRATE_FIX,
            broken=conn is None or conn.broken,
            recovers="the store reconnects by itself once it is back",
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- schema ------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        if self.schema_current():
            return []  # a read: no advisory lock, no wait for anyone
        with self._transaction(bounded=False) as conn:
            return self._migrate_on(conn)

    # -- staging on the caller's connection --------------------------------------------------

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        if self._identity is None or refresh:
            with self._transaction() as own:
                self._identity, _ = identify(own, self._table, self.display_url)
        return self._identity

    def schema_current(self) -> bool:
        with self._transaction() as conn:
            return self._current_on(conn)

    def adopt(self, connection: Any) -> Joined:
        if isinstance(connection, Joined):
            if connection.database == self.identity():
                check_joinable(connection.connection, fix=_ADOPT_FIX)
                return connection
            connection = connection.connection
        check_joinable(connection, fix=_ADOPT_FIX)
        theirs, has_table = identify(connection, self._table, self.display_url)
        if theirs != self.identity():
            self._identity = None  # the server may have restarted: look again, once
        if theirs != self.identity():
            raise ConfigurationError(
                f"the connection reaches database {theirs.key[0]!r}, not the outbox's database "
                f"({self.display_url})",
                fix="give the app an outbox on the database your connection writes to "
                "(App(..., outbox='postgresql://.../that-db'))",
            )
        if not has_table:
            raise ConfigurationError(
                f"the outbox table {self._table} is not in the connection's database",
                fix=_MIGRATE_FIX,
            )
        return Joined(connection, theirs)

    def stage(
        self, executor: Joined, jobs: Sequence[NewJob], *, now: datetime | None = None
    ) -> None:
        """Write the rows on the caller's connection, in their transaction, inside a savepoint
        (``dialects.postgres.in_savepoint``)."""
        if not jobs:
            return
        conn = self.adopt(executor).connection
        rows = [
            {
                "id": job.id,
                "job": job.name,
                "queue": job.queue,
                "input": job.input,
                "key": job.idempotency_key,
                "max_attempts": job.max_attempts,
                "priority": job.priority,
                "run_at": job.run_at,
                "delay": job.delay,
                "now": now,
                "tenant_id": job.tenant_id,
                "trace_context": job.trace_context,
            }
            for job in jobs
        ]
        with (
            in_savepoint(
                conn,
                driver=_NAME,
                describe=lambda: _described(jobs),
                translate=lambda exc: self._translate(exc, conn),
            ),
            our_cursor(conn) as cursor,
        ):
            cursor.executemany(self._q["stage"], rows)

    # -- the relay's side --------------------------------------------------------------------

    @contextmanager
    def claim(self, limit: int) -> Iterator[_Batch]:
        with self._transaction() as conn:
            rows = conn.execute(
                self._q["claim"], {"limit": max(0, limit)}, prepare=False
            ).fetchall()
            yield _Batch(self, conn, [_record(row) for row in rows])

    def pending_count(self) -> int:
        with self._transaction() as conn:
            row = conn.execute(self._q["pending_count"], prepare=False).fetchone()
        assert row is not None
        return int(row[0])

    def prune(self, *, published_before: datetime, limit: int) -> int:
        if limit <= 0:
            return 0
        with self._transaction() as conn:
            cur = conn.execute(
                self._q["prune"], {"before": published_before, "limit": limit}, prepare=False
            )
            return cur.rowcount


def _described(jobs: Sequence[NewJob]) -> tuple[str, str]:
    """A stage in a caller's transaction, for its error (``in_savepoint``): what it was, and
    who holds what a lock wait of it waited for (an id is the only unique column)."""
    return (
        f"staging {jobs_named(jobs)} in the outbox",
        f"another transaction staged job id {listed([job.id for job in jobs])} and has not ended",
    )
