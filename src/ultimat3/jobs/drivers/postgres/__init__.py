"""The PostgreSQL driver: many workers on many machines share one queue.

Guarantees beyond the ``Driver`` protocol's (the operator's side: docs/production-postgres.md):

- **One statement per operation** on an autocommit connection: a claim, a batch completion or
  failure, an insert of up to 5,000 jobs with its wake-up. Claims lock due rows ``FOR UPDATE
  SKIP LOCKED``; due-ness and lease expiry are judged on the database clock (``now()``)
  unless a caller pins ``now``, so host clock skew cannot expire a lease.
- **Dedupe is the unique index's**: ``ON CONFLICT DO NOTHING``, then a look-up of the stored
  ids; big batches try ``COPY`` first (``insert``).
- **Transactional enqueue.** With ``executor=`` the writes run in a SAVEPOINT of the
  caller's transaction, which the driver never commits; a failure rolls back to it and
  raises an ``EnqueueRefusedError`` naming the cause (``dialects.postgres.in_savepoint``).
- **Limits** (``ultimat3.jobs.limits``): a limited claim takes per-key
  ``pg_try_advisory_xact_lock`` then claims in the same transaction (``cycle``).
- **Wake-ups** are ``pg_notify`` in the writing transaction, heard by one LISTEN connection
  (``listen``); behind a transaction-mode pooler, or with ``listen=False``, waiters poll, and
  left at ``pooler="none"`` the driver checks once that a NOTIFY reaches its LISTEN
  (``waiting``).
- **Bounded calls.** Every transaction of ours carries ``statement_timeout``,
  ``lock_timeout`` and ``idle_in_transaction_session_timeout``, which never reach a caller's
  transaction; a client-side ``Watchdog`` cuts off a call with no reply in time
  (``connections``). Migrations are exempt from the statement timeout.
- **Failures are errors with a fix**: an unreachable server, a terminated session or an
  exhausted pool raise ``DriverUnavailableError``; a missing schema says to migrate; the pool
  replaces ended connections before use.
- **Migrations** run in one transaction under ``pg_advisory_xact_lock``.

Schema: every table lives in ``schema`` (validated against ``^[a-z_][a-z0-9_]{0,62}$``),
prefixed ``x_``, reached through a quoted identifier; every value is a bound parameter except
a claim's LIMIT, an ``int`` written into the text (``job_claim_queue`` in ``queries.sql``).

Limits: PostgreSQL 13 or newer; sync connections only. A half-open connection is found only
when used (TCP keepalives, ``tcp_user_timeout``, the watchdog). A call in flight when its
session dies raises (it is not retried: a write may have committed).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ultimat3.jobs.dialects.postgres import (
    UNBOUNDED_SQL,
    check_joinable,
    identify,
)
from ultimat3.jobs.driver import DatabaseId, Driver, Joined
from ultimat3.jobs.drivers.postgres.connections import _NAME, ADOPT_FIX, MIGRATE_FIX
from ultimat3.jobs.drivers.postgres.listen import Finished
from ultimat3.jobs.drivers.postgres.schedule import Schedules
from ultimat3.jobs.drivers.postgres.watchdog import Watchdog
from ultimat3.jobs.errors import ConfigurationError

__all__ = ["PostgresDriver"]

if TYPE_CHECKING:
    import psycopg


class PostgresDriver(Schedules):
    """Jobs in PostgreSQL through psycopg 3 and a psycopg_pool connection pool.

    ``dsn`` is a libpq URL or conninfo string. ``pool_min``/``pool_max`` size the pool (the
    LISTEN connection is extra, opened by the first wait; so is the one a worker's lease
    renewals use, which a busy pool cannot starve, replaced after the pool's
    ``max_lifetime``); ``pooler="transaction"`` (or ``listen=False``) turns LISTEN/NOTIFY and
    prepared statements off for transaction-mode poolers, and ``poll`` is then the longest gap
    between two looks for new jobs while idle; ``statement_timeout`` and ``lock_timeout``
    (seconds) bound every statement of ours; ``application_name`` labels every session.
    ``clock`` is where every time read, sleep and wait goes; ``wait_slice``, ``probe_after``,
    ``probe_wait``, ``probe_confirm`` and ``beat_wait`` are the waits' settings (seconds: a
    listening turn, the silence before the LISTEN is checked, the pooler check's two waits,
    how long a presence beat waits for the renewals' connection).

    Composed of its parts, each a module of this package: ``connections`` (the pool, bounded
    statements, errors, the renewals' connection), ``waiting`` (LISTEN or polling, the pooler
    check), ``insert``, ``cycle`` (claims and a running job's writes), ``reads`` (the
    operator's reads and actions), ``schedule`` (cron, leaders, live workers).
    """

    name = _NAME
    #: Writers do not block each other: a write beside an open transaction is fine.
    single_writer = False

    def _after_fork(self) -> None:
        """In a forked child: the inherited connections share their sockets with the parent's,
        so the child gets a pool, a LISTEN and a watchdog of its own. Each inherited
        descriptor is pointed at /dev/null first, so that finishing it (its ``Terminate``)
        cannot end the parent's session; the objects are kept, never used."""
        if self._closed:
            return
        old = self._pool
        inherited = [
            *getattr(old, "_pool", ()),  # idle in the pool
            *self._lent,  # in a call of another thread: it does not exist in the child
            self._listener.conn,
            self._renewer,
        ]
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            for conn in inherited:
                try:
                    if conn is not None and not conn.closed:
                        os.dup2(devnull, conn.pgconn.socket)
                except (psycopg.Error, OSError):  # no socket left: nothing to send on
                    pass
        finally:
            os.close(devnull)
        self._inherited.append((old, inherited))
        self._lent = set()
        self._renewer = None
        self._renew_lock = threading.Lock()
        self._renewer_end = threading.Lock()
        self._look_lock = threading.Lock()
        self._rebound = weakref.WeakSet()
        self._watch = Watchdog(self.call_budget, self._clock)
        # A lock held by another thread at the fork stays held: a listener of the child's own.
        self._listener = self._new_listener()
        self._finished = Finished(
            self._listener, self._finished_channel, self._clock, self._wait_slice
        )
        self._pool = self._new_pool()
        self._forked = True  # opened by the child's first call: a child may never make one

    def schema_current(self) -> bool:
        with self._connection() as conn, conn.transaction():
            self._bound(conn)
            return self._current_on(conn)

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        """The database of the jobs (its name, oid and the server's start time)."""
        if self._identity is None or refresh:
            with self._connection() as conn, conn.transaction():
                self._bound(conn)
                self._identity, _ = identify(conn, self._jobs_table, self.display_url)
        return self._identity

    def migrate(self) -> list[int]:
        self._check_pooler()
        if self.schema_current():
            return []  # a read: no advisory lock, no wait for anyone
        with self._connection(guard=False) as conn, conn.transaction():
            if self._session_bounds:  # no statement timeout: an index build may take long
                conn.execute(UNBOUNDED_SQL, prepare=False)
            return self._migrate_on(conn)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._listener.close(within=2 * self._wait_slice + 1.0)
        if self._renew_lock.acquire(timeout=1.0):
            try:
                self._drop_renewer()
            finally:
                self._renew_lock.release()
        else:  # a renewal still runs: it fails, and closes its connection itself
            self._cut_renewer()
        self._pool.close(timeout=5.0)
        self._watch.close()

    @contextmanager
    def transaction(self) -> Iterator[Joined]:
        identity = self.identity()
        # Unguarded and unbounded: the transaction is the caller's, and so are its settings.
        with self._connection(guard=False) as conn, conn.transaction():
            if self._session_bounds:
                conn.execute(UNBOUNDED_SQL, prepare=self._prepare)
                self._rebound.add(conn)
            yield Joined(conn, identity)

    def adopt(self, connection: Any) -> Joined:
        if isinstance(connection, Joined):
            if connection.database == self.identity() or (
                connection.database.kind == _NAME
                and connection.database == self.identity(refresh=True)
            ):
                check_joinable(connection.connection, fix=ADOPT_FIX)
                return connection
            connection = connection.connection
        check_joinable(connection, fix=ADOPT_FIX)
        theirs, has_table = identify(connection, self._jobs_table, self.display_url)
        if theirs != self.identity() and theirs != self.identity(refresh=True):
            raise ConfigurationError(
                f"the connection reaches database {theirs.key[0]!r} on another server or "
                f"database than the job database ({self.display_url})",
                fix="enqueue on a connection to the job database, or point the app at the "
                "database your connection uses",
            )
        if not has_table:
            raise ConfigurationError(
                f"the job tables ({self._jobs_table}) are not in the connection's database",
                fix=MIGRATE_FIX,
            )
        return Joined(connection, self.identity())


if TYPE_CHECKING:
    # mypy proves here that the class satisfies the protocol, signature by signature.
    _conforms: Driver = PostgresDriver("")
