"""The PostgreSQL driver: many workers on many machines share one queue.

Guarantees (beyond the ``Driver`` protocol's rules, which this driver keeps):

- **One statement per operation.** A claim, a batch completion, a batch failure, an insert of
  up to 5,000 jobs with its wake-up: each is one SQL statement on an autocommit connection, so
  each is atomic and costs one round trip. Claims lock due rows with ``FOR UPDATE SKIP
  LOCKED``: claimers on any number of machines never wait for each other and never receive
  the same (job, token); a partial index holds only waiting jobs, so a large backlog of
  finished rows costs a claim nothing. Due-ness and lease expiry are judged on the database
  clock (``now()``) unless a caller pins ``now``, so host clock skew cannot expire a lease.
- **Dedupe is the unique index's.** ``INSERT ... ON CONFLICT DO NOTHING``, then a look-up of
  the stored ids for the rows that conflicted; an insert racing a concurrent one of the same
  key waits for the other transaction, then dedupes onto its row. Batches of 200 jobs or more
  first try ``COPY`` (several times faster) and fall back to that path when any key is taken.
  A batch without ``executor`` that loses a deadlock to another writer is run again.
- **Transactional enqueue.** With ``executor=`` (a caller's psycopg ``Connection``, or the one
  ``transaction()`` yields) inserts and completions run on that connection inside a
  SAVEPOINT, and the driver never commits it. Any failure (a lock or statement timeout under
  the caller's own settings, a serialization failure, a deadlock, a row refused by a
  constraint or trigger of the caller's) rolls back to the savepoint, so the caller's
  transaction stays usable and holds nothing of the call, and raises an
  ``EnqueueRefusedError`` (``retryable=False``) that names the cause ("another transaction
  holds idempotency key ... : waited past lock_timeout 2s") and says to retry the whole
  transaction, not the call inside it (``dialects.postgres.in_savepoint``, shared with the
  outbox store). The savepoint costs two round trips (``SAVEPOINT``, ``RELEASE``). A
  connection in autocommit mode with no transaction open is accepted: the insert then
  commits on its own. A connection in pipeline mode is synced before and after. A
  non-autocommit connection with no transaction yet gets the implicit one psycopg opens,
  left open for the caller to commit.
- **Limits** (``ultimat3.jobs.limits``): a limited claim is two pipelined statements in one
  transaction, per-key ``pg_try_advisory_xact_lock`` then the claim, whose fresh snapshot makes
  its counts exact; the completion or failure of a limited job NOTIFYs its queue (a slot
  freed). A unique key is a partial unique index (``x_jobs_unique_idx``): ``ON CONFLICT DO
  NOTHING``, then a look-up of the holder (and a conditional debounce).
- **Wake-ups.** Inserts (of due jobs), retries, snoozes and resumed queues ``pg_notify`` the
  channel named like the schema, with the queue name as the only payload, in the same
  transaction: a rollback sends nothing. Completions, dead ends and cancels of awaited jobs
  (``job_await``) notify another channel, ``<schema>:finished``, with the finished ids. One
  LISTEN connection outside the pool (``listen.Listener``), shared by every waiting thread,
  LISTENs on the channels its waiters asked for: ``wait_for_jobs`` the first, ``job_wait``
  (a reader waiting for a result) the second, so a worker that never waits for a result
  never hears of finished jobs. Once its LISTEN is in place after a claim (a worker's first
  wait), and again after any error on it, when it reconnects with backoff capped at 5 s,
  ``wait_for_jobs`` returns early, so the caller claims what was inserted while nobody
  listened. A reader's ``job_await`` notifies a due job's queue again: it held the row's
  lock, which a claim woken by the insert passes over.
- **Behind a transaction-mode pooler** (``pooler="transaction"``: PgBouncer's
  ``pool_mode = transaction``, the transaction poolers of managed services), where every
  transaction may run on another server session, nothing of ours lives in a session: no
  LISTEN, no prepared statements (``prepare_threshold=None``, and ``prepare=False`` on a
  caller's connection), no ``SET`` (settings are ``set_config(..., true)``, per
  transaction), no session advisory lock (migrations take ``pg_advisory_xact_lock``), no
  temporary table. ``wait_for_jobs`` then polls: it returns at once after an insert by this
  driver, and otherwise reads the newest job id (``max(id)``, one index probe) every 20 ms
  after activity, backing off to every ``poll`` seconds when idle. ``listen=False`` does the
  same without a pooler. Left at ``pooler="none"``, the driver checks once, when it migrates
  or first listens, that a NOTIFY reaches its LISTEN connection (PgBouncer in transaction mode
  accepts LISTEN and delivers nothing). When none arrives within a second it does not decide
  yet: it asks the server whether the session's client is this very socket (its address and
  port in ``pg_stat_activity``), which makes a connection direct, however late the NOTIFY.
  Where the server cannot tell (a Unix socket, a proxy or NAT in between) it waits up to 5 s
  more, for that NOTIFY or a second one. Only then does it log ``jobs.postgres.pooler`` with
  the fix, and poll without prepared statements from then on: a loaded machine never changes
  what a direct connection does.
- **Bounded calls.** Each transaction of ours starts with ``set_config(..., true)`` of
  ``statement_timeout``, ``lock_timeout`` and ``idle_in_transaction_session_timeout`` (sent
  in the same round trip, in a pipeline, for one-statement calls), so the server cancels a
  statement of ours that runs or waits too long, and the settings end with the transaction:
  they never reach a caller's transaction (``transaction()``, ``executor=``), nor, behind a
  pooler, another client's. A client-side watchdog bounds every call too: a call without a
  reply after ``statement_timeout`` plus a margin (a stalled network or pooler, which TCP
  keepalives do not notice while the peer acknowledges) has its socket shut down; the call
  raises a retryable ``DriverUnavailableError`` and the pool replaces the connection.
  Migrations are exempt from the statement timeout (an index build may take long) but take
  table locks with ``lock_timeout``.
- **Failures are errors with a fix.** A server that is down, a terminated session or an
  exhausted pool raise ``DriverUnavailableError``; a missing schema says to migrate. The pool
  heals by itself: a pooled connection whose session ended (its socket turned readable while
  idle: a restart, ``pg_terminate_backend``) is replaced before use, at the cost of one
  ``poll(2)``, and new connections are made as soon as the server is back.
- **Migrations** run in one transaction under ``pg_advisory_xact_lock``: any number of
  processes may migrate at once; one applies, the others find the work done.

Schema: every table lives in ``schema`` (default ``ultimat3_jobs``, validated against
``^[a-z_][a-z0-9_]{0,62}$``), is prefixed ``x_`` and is reached through a quoted identifier;
every value is a bound parameter (the one exception, a claim's LIMIT, is an ``int`` written
into the text; see ``job_claim_queue`` in ``queries.sql``). ``input`` is stored as ``json``,
the exact text byte for byte; errors as a ``jsonb`` array; times as ``timestamptz``; ids and
lease tokens (fresh random UUIDs) as text; ``tenant_id`` NULL for "no tenant".

Limits: PostgreSQL 13 or newer (``gen_random_uuid()``). Sync connections only: an
``AsyncConnection`` cannot be adopted yet. A connection that went half-open (a network cut
without a reset) is found only when used, by TCP keepalives and ``tcp_user_timeout`` (~30 s
by default), or by the watchdog when a call is in flight (a peer that still acknowledges).
The pooler check runs at ``migrate()`` and at the first wait: a process that does neither (an
App opened with ``migrate=False`` that only enqueues) relies on ``?pooler=transaction`` being
in its URL. While the server is down a call fails after about half a second (when no pooled
connection comes, one direct attempt tells an outage from a busy pool, at most once a
second); an exhausted pool makes a call wait up to 5 s more. A call in flight when its session
dies raises (it is not retried: the driver cannot know whether a write committed); the next
call gets a fresh connection.
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
    applied_versions,
    apply_migrations,
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
        """In a forked child (a pre-fork web server's worker): the connections it inherited
        share their sockets with the parent's, so a statement of either process could read
        the other's reply. The child gets a pool, a LISTEN and a watchdog of its own. Each
        inherited connection's descriptor is pointed at /dev/null first, so that finishing it
        (its ``Terminate`` message, when it is collected) cannot end the parent's session; the
        objects are kept, never used. A connection in a call of another thread at the fork is
        disowned too (the call itself goes on in the parent only)."""
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
            done = applied_versions(conn, self._q, self._schema)
        return all(version in done for version, _ in self._migrations)

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        """The database of the jobs (its name, oid and the server's start time)."""
        known = self._identity
        if known is not None and not refresh:  # every enqueue in a transaction asks
            return known
        return self._own_identity(refresh=refresh)

    def migrate(self) -> list[int]:
        self._check_pooler()
        if self.schema_current():
            return []  # a read: no advisory lock, no wait for anyone
        with self._connection(guard=False) as conn, conn.transaction():
            if self._session_bounds:  # no statement timeout: an index build may take long
                conn.execute(UNBOUNDED_SQL, prepare=False)
            return apply_migrations(
                conn,
                self._q,
                self._schema,
                self._migrate_key,
                self._migrations,
                lock_timeout=self.lock_timeout,
            )

    def migration_sql(self) -> list[tuple[int, str]]:
        return list(self._migrations)

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
                and connection.database == self._own_identity(refresh=True)
            ):
                check_joinable(connection.connection, fix=ADOPT_FIX)
                return connection
            connection = connection.connection
        check_joinable(connection, fix=ADOPT_FIX)
        theirs, has_table = identify(connection, self._jobs_table, self.display_url)
        if theirs != self.identity() and theirs != self._own_identity(refresh=True):
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

    def _own_identity(self, *, refresh: bool) -> DatabaseId:
        if self._identity is None or refresh:
            with self._connection() as conn, conn.transaction():
                self._bound(conn)
                self._identity, _ = identify(conn, self._jobs_table, self.display_url)
        return self._identity


if TYPE_CHECKING:
    # mypy proves here that the class satisfies the protocol, signature by signature.
    _conforms: Driver = PostgresDriver("")
