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
  transaction: a rollback sends nothing. ``wait_for_jobs`` LISTENs on one dedicated
  connection outside the pool, shared by every waiting thread; once its LISTEN is in place
  after a claim (a worker's first wait), and again after any error on it, when it reconnects
  with backoff capped at 5 s, it returns early, so the caller claims what was inserted while
  nobody listened. A
  reader's ``job_await`` notifies a due job's queue again: it held the row's lock, which a
  claim woken by the insert passes over. Completions, dead ends and cancels of awaited jobs
  (``job_await``) notify another channel, ``<schema>:finished``, with the finished ids: ``job_wait`` (a reader waiting for a
  result) LISTENs there on a connection of its own (``pg_finished``), so workers never wake
  for them.
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

import hashlib
import ipaddress
import itertools
import json
import os
import random
import re
import select
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ultimat3.jobs import events, ids
from ultimat3.jobs import sql as sql_files
from ultimat3.jobs.clock import SystemClock
from ultimat3.jobs.dialects.postgres import (
    CONNECT_DEFAULTS,
    LOCK_TIMEOUT,
    STATEMENT_TIMEOUT,
    UNBOUNDED_SQL,
    applied_versions,
    apply_migrations,
    bounds_sql,
    check_bounds,
    check_joinable,
    identify,
    in_savepoint,
    jobs_named,
    listed,
    masked_dsn,
    migration_plan,
    our_cursor,
)
from ultimat3.jobs.dialects.postgres import first_line as _first_line
from ultimat3.jobs.dialects.postgres import refused as _refused
from ultimat3.jobs.driver import (
    DatabaseId,
    Driver,
    Executor,
    Joined,
    StallTracker,
    close_at_exit,
    renew_after_fork,
    wait_until_final,
)
from ultimat3.jobs.drivers import pool_log
from ultimat3.jobs.errors import (
    ConfigurationError,
    DriverUnavailableError,
    SerializationError,
)
from ultimat3.jobs.limits import keys_to_look
from ultimat3.jobs.records import (
    FINAL_STATES,
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
    QueueInfo,
    ScheduleState,
    WorkerInfo,
    ids_of,
    in_slices,
    job_from_row,
)
from ultimat3.jobs.wake import Wake

_SYSTEM = SystemClock()

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq
    from psycopg import sql as pg_sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

    from ultimat3.jobs.drivers.pg_finished import FinishedListener

    _IDLE = pq.TransactionStatus.IDLE
    _INTRANS = pq.TransactionStatus.INTRANS
    _INERROR = pq.TransactionStatus.INERROR
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    _MISSING: ImportError | None = _exc
else:
    _MISSING = None

_T = TypeVar("_T")

__all__ = ["PostgresDriver"]

_NAME = "postgres"
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: Jobs per INSERT statement; bigger batches run several statements in one transaction.
_CHUNK = 5000
#: From this many jobs, a batch first tries COPY (see ``_copy``), sent this many rows at a time.
_COPY_FROM = 200
_COPY_SLICE = 500
#: Seconds a batch that lost a deadlock waits (times its attempt, with jitter) to run again.
_DEADLOCK_PAUSE = 0.05
#: How long a call waits for a pooled connection before it checks that the server is up, and
#: then how much longer before it raises (the pool is exhausted).
_QUICK_WAIT = 0.5
_POOL_WAIT = 5.0
#: A queue_list that summed more count deltas than this folds them (see 0005).
_FOLD_AFTER = 5_000
#: One reconnection attempt chain of the pool gives up after this long; the next call starts a
#: fresh chain (first attempt at once), which keeps the pool's exponential backoff short.
_RECONNECT_WINDOW = 5.0
#: How long one LISTEN wait lasts before ``wake`` and the deadline are checked again.
_WAIT_SLICE = 0.1
#: A statement of ours slower than this has the plans of its connection made again (see
#: ``_attempts``): their cost is then a small share of the time that set it off.
_REPLAN_AFTER = 0.02
#: The listener checks that it still LISTENs after this much silence.
_PROBE_AFTER = 30.0
_LISTEN_BACKOFF_MAX = 5.0
#: Polling without LISTEN: the longest gap between two looks while idle (``poll``), the gap
#: just after activity, and how often a waiter checks ``wake`` and in-process inserts.
_POLL = 0.5
_POLL_FAST = 0.02
_POLL_SLICE = 0.05
#: How long the pooler check waits for its NOTIFY (a direct connection sees it in ~1 ms);
#: when none came and the server cannot tell that nothing sits in between, how much longer
#: it waits for that one or a second one before it decides that a pooler does.
_PROBE_WAIT = 1.0
_PROBE_CONFIRM = 5.0
#: How long a presence beat waits for a lease renewal on their shared connection before it
#: takes a pooled one instead, and the longest it may run there (its statement and lock
#: timeouts): a lease renewal waits no longer than this for a beat.
_BEAT_WAIT = 1.0
#: Intervals of this module's newer parts (the renewals' connection, the pooler check).
_monotonic = SystemClock().monotonic
#: SQLSTATE classes that mean "the server cannot serve us now": connection exception,
#: insufficient resources, operator intervention (admin shutdown, query cancelled), system
#: error, transaction rollback (serialization failure, deadlock).
_RETRYABLE_CLASSES = ("08", "53", "57", "58", "40")
#: Read-only transaction (a standby, a failover), lock not available (lock_timeout).
_RETRYABLE_STATES = frozenset({"25006", "55P03"})
_STATES = {state.value: state for state in JobState}
_MICROSECOND = timedelta(microseconds=1)
_MIGRATE_FIX = "run `ultimat3-jobs migrate` (or driver.migrate()) against this database"
_ADOPT_FIX = (
    "pass a psycopg 3 Connection to the job database (or the executor that "
    "driver.transaction() yields); SQLAlchemy and Django connections go through their "
    "integrations"
)

if TYPE_CHECKING:
    Conn = psycopg.Connection[Any]
    Row = tuple[Any, ...]


class PostgresDriver:
    """Jobs in PostgreSQL through psycopg 3 and a psycopg_pool connection pool.

    ``dsn`` is a libpq URL or conninfo string. ``pool_min``/``pool_max`` size the pool (the
    LISTEN connections are extra: the workers' one, and the one the first wait for a result
    opens; so is the one a worker's lease renewals use, which a busy pool cannot starve,
    replaced after the pool's ``max_lifetime``); ``pooler="transaction"`` (or
    ``listen=False``) turns LISTEN/NOTIFY and prepared statements off for transaction-mode
    poolers, and ``poll`` is then the longest gap between two looks for new jobs while idle;
    ``statement_timeout`` and ``lock_timeout`` (seconds) bound every statement of ours;
    ``application_name`` labels every session.
    """

    name = _NAME
    #: Writers do not block each other: a write beside an open transaction is fine.
    single_writer = False

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "ultimat3_jobs",
        pool_min: int = 1,
        pool_max: int = 10,
        listen: bool | None = None,
        pooler: str = "none",
        poll: float = _POLL,
        statement_timeout: float = STATEMENT_TIMEOUT,
        lock_timeout: float = LOCK_TIMEOUT,
        application_name: str = "ultimat3-jobs",
    ) -> None:
        if _MISSING is not None:
            raise DriverUnavailableError(
                f"the postgres driver needs psycopg 3 and psycopg_pool: {_MISSING}",
                driver=_NAME,
                fix='pip install "ultimat3-jobs[postgres]"',
            )
        if not _SCHEMA.match(schema):
            raise ConfigurationError(
                f"the schema name {schema!r} is not allowed",
                fix="use 1 to 63 lowercase letters, digits and underscores, not starting with "
                'a digit (default "ultimat3_jobs")',
            )
        if pooler not in ("none", "session", "transaction"):
            raise ConfigurationError(
                f"pooler={pooler!r} is not a pooler mode",
                fix='use pooler="transaction" behind PgBouncer in transaction mode (or a '
                'managed service\'s transaction pooler), "session" or "none"',
            )
        if pooler == "transaction" and listen:
            raise ConfigurationError(
                "pooler='transaction' with listen=True cannot work: a transaction-mode pooler "
                "delivers no notifications",
                fix="drop listen=True; the worker polls",
            )
        if not 0.01 <= poll <= 60:
            raise ConfigurationError(
                f"poll={poll:g}s is not a poll interval", fix="use a poll from 10ms to 60s"
            )
        check_bounds(statement_timeout, lock_timeout)
        if not 0 <= pool_min <= pool_max or pool_max < 1:
            raise ConfigurationError(
                f"pool_min={pool_min}, pool_max={pool_max} is not a pool size",
                fix="use 0 <= pool_min <= pool_max and pool_max >= 1",
            )
        try:
            given = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(
                f"the PostgreSQL URL is not valid: {exc}",
                fix="write postgresql://user:password@host:5432/dbname or a libpq conninfo string",
            ) from None
        self.display_url = masked_dsn(dsn)
        self._dsn = dsn
        self._schema = schema
        self._channel = schema
        #: Where completions, dead ends and cancels are announced (``pg_finished``).
        self._finished_channel = f"{schema}:finished"
        self.pooler = pooler
        self._listen = listen if listen is not None else pooler != "transaction"
        #: Nothing of ours may outlive a transaction: no prepared statement (nor LISTEN).
        self._stateless = pooler == "transaction" or not self._listen
        self._prepare: bool | None = False if self._stateless else None
        #: Whether to check, once, that NOTIFY reaches LISTEN (see the module docstring).
        self._probe_pooler = pooler == "none" and self._listen
        self._poll = poll
        self._pool_max = pool_max
        #: Seconds; the server cancels a statement of ours past these.
        self.statement_timeout = statement_timeout
        self.lock_timeout = lock_timeout
        self._bounds = bounds_sql(statement_timeout, lock_timeout, idle=statement_timeout)
        #: A presence beat on the renewals' connection: short, so a renewal never waits long.
        self._beat_bounds = bounds_sql(
            min(statement_timeout, _BEAT_WAIT), min(lock_timeout, _BEAT_WAIT), idle=None
        )
        #: On a direct connection the bounds are session settings of each pooled connection,
        #: set when the pool opens it (``_configure``), so a statement of ours needs no second
        #: one in front. Behind a transaction pooler a session is shared with other clients:
        #: there every transaction of ours sets them for itself (``set_config(..., true)``).
        self._session_bounds = not self._stateless
        self._bounds_session = bounds_sql(
            statement_timeout, lock_timeout, idle=statement_timeout, session=True
        )
        #: Pooled connections that served a caller's transaction (``transaction()``), in which
        #: the caller may have changed the session's settings: the next statement of ours on
        #: each sets the bounds again first.
        self._rebound: weakref.WeakSet[Conn] = weakref.WeakSet()
        #: A call without a reply this long after it was sent is cut off by the client.
        self.call_budget = statement_timeout + max(1.0, statement_timeout / 2)
        self._watch = _Watchdog(self.call_budget)
        quoted = pg_sql.Identifier(schema).as_string(None)
        self._jobs_table = f"{quoted}.x_jobs"
        self._ledger_table = f"{quoted}.x_migrations"
        self._q: dict[str, bytes] = {
            name: text.replace("{schema}", quoted).encode()
            for name, text in sql_files.queries(_NAME).items()
        }
        self._migrations, self._migrate_key = migration_plan(
            sql_files.migrations(_NAME),
            quoted_schema=quoted,
            ledger=self._ledger_table,
            lock_name=f"migrate:{schema}",
        )

        self._connect_kwargs: dict[str, Any] = {
            key: value for key, value in CONNECT_DEFAULTS.items() if key not in given
        }
        self._connect_kwargs["application_name"] = application_name
        pool_kwargs: dict[str, Any] = {**self._connect_kwargs, "autocommit": True}
        if self._stateless:
            pool_kwargs["prepare_threshold"] = None
        self._new_pool: Callable[[], ConnectionPool[Any]] = lambda: ConnectionPool(
            dsn,
            min_size=pool_min,
            max_size=pool_max,
            kwargs=pool_kwargs,
            open=False,
            configure=self._configure,
            timeout=_POOL_WAIT,
            reconnect_timeout=_RECONNECT_WINDOW,
            name=f"ultimat3-jobs:{schema}",
        )
        self._pool = self._new_pool()
        pool_log.install()  # psycopg_pool's records: one line per outage and recovery
        self._pool.open(wait=False)
        #: What a forked child inherited and must never use nor finish (``_after_fork``).
        self._inherited: list[Any] = []
        self._forked = False
        #: In a call (``_checkout``): a forked child disowns them (``_after_fork``).
        self._lent: set[Conn] = set()
        self._texts_by_limit: dict[tuple[str, int], bytes] = {}
        #: Limited claims: the last key looked at (``limits``, step 1), and the first half of
        #: the two-part advisory lock keys of this schema's limits.
        self._after = ""
        self._limit_lock_class = int.from_bytes(
            hashlib.blake2b(f"ultimat3-jobs:limits:{schema}".encode(), digest_size=4).digest(),
            "big",
            signed=True,
        )
        self._reachable_at = 0.0
        self._closed = False
        self._identity: DatabaseId | None = None
        #: A call slower than this, or failing to reach the server, counts as a stall.
        self.stalls = StallTracker(threshold=1.0)

        self._finished = self._new_finished()
        #: The lease renewals' connection, outside the pool (``_on_renewer``).
        self._renewer: Conn | None = None
        self._renewer_since = 0.0  # when it connected: replaced after the pool's max_lifetime
        self._renew_lock = threading.Lock()
        #: Held to close the renewals' connection and to shut its socket down (``close``):
        #: the socket is never shut down after its descriptor was freed (and perhaps reused).
        self._renewer_end = threading.Lock()
        self._listener: Conn | None = None
        self._listen_lock = threading.Lock()
        self._wake_cond = threading.Condition()
        self._wake_seq = 0
        self._listen_backoff = 0.0
        self._listen_retry_at = 0.0
        self._listen_lost = False
        #: A claim ran (and found what was due then): the first LISTEN after it wakes waiters.
        self._claimed = False
        self._probe_at = 0.0
        # Polling (no LISTEN): the newest job id seen, when new ones last appeared, and when
        # to look next; one thread looks at a time.
        self._newest: str | None = None
        self._looked = False
        self._active_at = 0.0
        self._look_at = 0.0
        self._look_lock = threading.Lock()
        self._probed = False
        self._probe_retry_at = 0.0
        renew_after_fork(self)
        close_at_exit(self)

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
            self._listener,
            self._renewer,
            self._finished._conn,
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
        self._listener = None
        self._renewer = None
        self._renew_lock = threading.Lock()
        self._renewer_end = threading.Lock()
        self._listen_lock = threading.Lock()  # a lock held by another thread stays held
        self._wake_cond = threading.Condition()
        self._look_lock = threading.Lock()
        self._rebound = weakref.WeakSet()
        self._watch = _Watchdog(self.call_budget)
        self._finished = self._new_finished()
        self._pool = self._new_pool()
        self._forked = True  # opened by the child's first call: a child may never make one

    def _new_finished(self) -> FinishedListener:
        return FinishedListener(
            lambda: psycopg.connect(self._dsn, autocommit=True, **self._connect_kwargs),
            self._finished_channel,
        )

    # -- lifecycle ---------------------------------------------------------------------------

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
        with self._wake_cond:
            self._wake_cond.notify_all()
        got = self._listen_lock.acquire(timeout=2 * _WAIT_SLICE + 1.0)
        try:
            self._drop_listener()
        finally:
            if got:
                self._listen_lock.release()
        self._finished.close()
        if self._renew_lock.acquire(timeout=1.0):
            try:
                self._drop_renewer()
            finally:
                self._renew_lock.release()
        else:  # a renewal still runs: it fails, and closes its connection itself
            self._cut_renewer()
        self._pool.close(timeout=5.0)
        self._watch.close()

    # -- transactions ------------------------------------------------------------------------

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
                check_joinable(connection.connection, fix=_ADOPT_FIX)
                return connection
            connection = connection.connection
        check_joinable(connection, fix=_ADOPT_FIX)
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
                fix=_MIGRATE_FIX,
            )
        return Joined(connection, self.identity())

    # -- jobs --------------------------------------------------------------------------------

    def job_insert_many(
        self,
        jobs: Sequence[NewJob],
        *,
        executor: Executor | None = None,
        now: datetime | None = None,
    ) -> list[InsertResult]:
        if not jobs:
            return []
        if executor is not None:
            # In a savepoint of the caller's transaction (``_joined``). A deadlock here is the
            # caller's to handle: their transaction holds other locks.
            with self._joined(executor, jobs) as conn:
                if len(jobs) == 1:  # the common case: one statement, look-ups on a conflict
                    rows = self._execute_insert(conn, jobs, now, bounded=False)
                    if rows:
                        return [InsertResult(rows[0][0], deduped=False)]
                return self._insert(conn, jobs, now, bounded=False)
        if len(jobs) == 1:
            # The common case, kept short: one statement; look-ups only on a conflict.
            conn = self._checkout()
            self._watch.arm(conn)
            try:
                rows = self._execute_insert(conn, jobs, now, bounded=True)
                if rows:
                    self._woke(jobs)
                    return [InsertResult(rows[0][0], deduped=False)]
                return self._insert(conn, jobs, now, bounded=True)
            except psycopg.Error as exc:
                self._reraise(exc, conn)
            finally:
                self._watch.disarm(conn)
                self._putconn(conn)
        for attempt in range(3):
            # Two batches sharing keys in different orders can deadlock on the unique index;
            # the loser's transaction was rolled back whole, so it can run again: after a
            # pause, which lets the winner's statement (it was waiting for ours) take the
            # keys first. At once, ours could take the first key back before the winner woke,
            # and the two would deadlock again, this time with either one losing.
            if attempt:
                time.sleep(_DEADLOCK_PAUSE * (attempt + random.random()))
            try:
                with self._connection() as conn:
                    if len(jobs) < _COPY_FROM:
                        # One statement, its own transaction (unless keys conflict).
                        results = self._insert(conn, jobs, now, bounded=True)
                    else:
                        with conn.transaction():
                            self._bound(conn)
                            results = self._insert(conn, jobs, now, bounded=False)
                self._woke(jobs)
                return results
            except DriverUnavailableError as exc:
                if attempt == 2 or not isinstance(exc.__cause__, pg_errors.DeadlockDetected):
                    raise
        raise AssertionError("unreachable")

    def _woke(self, jobs: Sequence[NewJob]) -> None:
        """Jobs of ours committed: wake this process's waiters at once when polling (with
        LISTEN, the NOTIFY does), and let the next look know they are not news."""
        if jobs and not self._listen:
            newest = max(ids_of(jobs))
            if self._looked and (self._newest is None or newest > self._newest):
                self._newest = newest
            self._signal()

    def job_claim(self, params: ClaimParams) -> list[Job]:
        if params.limit <= 0 or not params.queues:
            return []
        self._claimed = True
        steps = self._claim_steps(params, started=False)
        if len(steps) == 1:
            return [_job(row) for row in self._fetch(*steps[0])]
        rows = self._pipelined(steps)
        self._advance(params, rows[-2])
        return [_job(row) for row in rows[-1]]

    def _claim_steps(
        self, params: ClaimParams, *, started: bool
    ) -> list[tuple[bytes, dict[str, Any]]]:
        """The claim's statements: one without limits; with them (``params.limited``), the
        planner settings (``job_claim_limited_setup``), the key locks (``job_limit_lock``) then
        the claim (``job_claim_limited``), in one transaction (see ``limits``: the claim's
        snapshot must follow the locks)."""
        if not params.limited:
            return [self._claim_query(params, started=started)]
        queues = sorted(set(params.queues))
        lock = {
            "queues": queues,
            "now": params.now,
            "isolated": params.isolated,
            "after": self._after,
            "keys": keys_to_look(params.limit),
            "limit": params.limit,
            "lock_class": self._limit_lock_class,
        }
        claim = {
            "queues": queues,
            "now": params.now,
            "isolated": params.isolated,
            "limit": params.limit,
            "lease_for": params.lease_for,
            "worker_id": params.worker_id,
            "started": started,
            "token": params.token or ids.token(),
            "skip": sorted(params.skip),
        }
        return [
            (self._q["job_claim_limited_setup"], {}),
            (self._q["job_limit_lock"], lock),
            (self._q["job_claim_limited"], claim),
        ]

    def _advance(self, params: ClaimParams, lock_rows: list[Row]) -> timedelta | None:
        """Move the key cursor where a limited claim says (``job_limit_lock``: after the last
        key it got, round-robin); return how long after the statement's ``now`` a full rate
        window reopens."""
        if not (params.limited and lock_rows):
            return None
        _, cursor, wake_in = lock_rows[0]
        if cursor is not None:
            self._after = cursor
        return wake_in  # type: ignore[no-any-return]

    def _claim_query(
        self, params: ClaimParams, *, started: bool, relaxed: bool = False
    ) -> tuple[bytes, dict[str, Any]]:
        """The claim statement for ``params`` and its parameters: one queue has its own,
        cheaper statement (``job_claim_queue``). ``relaxed``: the statement is a transaction
        alone, and commits without waiting for the WAL flush (see job_claim in queries.sql)."""
        values: dict[str, Any] = {
            "lease_for": params.lease_for,
            "worker_id": params.worker_id,
            "now": params.now,
            "started": started,
            "token": params.token or ids.token(),
            "relaxed": relaxed,
        }
        queues = sorted(set(params.queues))
        if len(queues) == 1 and not (params.isolated or params.skip):
            values["queue"] = queues[0]
            return self._with_limit("job_claim_queue", params.limit), values
        values.update(queues=queues, limit=params.limit, skip=sorted(params.skip))
        return self._q["job_claim_isolated" if params.isolated else "job_claim"], values

    def _with_limit(self, name: str, limit: int) -> bytes:
        """Statement ``name`` with ``limit`` written into its text for ``{limit}`` (see
        job_claim_queue in queries.sql), each kept for the next use (a worker uses one or two)."""
        query = self._texts_by_limit.get((name, limit))
        if query is None:
            query = self._q[name].replace(b"{limit}", str(int(limit)).encode())
            if len(self._texts_by_limit) < 32:
                self._texts_by_limit[(name, limit)] = query
        return query

    def job_cycle(self, cycle: Cycle, *, now: datetime | None = None) -> CycleResult:
        claim = cycle.claims
        if not (cycle.writes or claim is not None):
            return CycleResult()
        self._claimed = True
        # One transaction, its statements pipelined: one round trip, each statement with its
        # own (generic, prepared) plan. A turn that only claims skips the WAL flush: the
        # claim of an unlimited job is then one statement, a transaction of its own.
        relaxed = not cycle.writes
        if claim is not None and not claim.limited:
            if relaxed:
                alone = self._fetch(*self._claim_query(claim, started=True, relaxed=True))
                return CycleResult(claimed=[_job(row) for row in alone])
            if (
                not cycle.failures
                and len(set(claim.queues)) == 1
                and not (claim.isolated or claim.skip)
            ):
                return self._cycle_queue(cycle, claim, now)
        steps: list[tuple[bytes, dict[str, Any]]] = []
        if relaxed:
            steps.append((self._q["commit_relaxed"], {}))
        if cycle.completes:
            steps.append((self._q["job_complete"], self._complete_params(cycle, now)))
        if cycle.failures:
            steps.append((self._q["job_fail"], self._failure_params(cycle.failures, now)))
        if claim is not None:
            steps.extend(self._claim_steps(claim, started=True))
        rows = self._pipelined(steps)
        result = CycleResult()
        wake_in = None
        at = 1 if relaxed else 0
        for changed, present in (
            (result.completed, cycle.completes),
            (result.failed, cycle.failures),
        ):
            if present:
                changed.update(row[0] for row in rows[at])
                at += 1
        if claim is not None:
            if claim.limited:
                wake_in = self._advance(claim, rows[at + 1])
                at += 2
            result.claimed.extend(_job(row) for row in rows[at])
        return replace(result, wake_in=wake_in) if wake_in is not None else result

    def _cycle_queue(self, cycle: Cycle, claim: ClaimParams, now: datetime | None) -> CycleResult:
        """The usual turn, completions and a claim of one queue, as one statement
        (``job_cycle_queue``): in psycopg a pipelined transaction costs the client about as
        much as the server's work, which one statement does not."""
        query = self._with_limit("job_cycle_queue", claim.limit)
        params = self._complete_params(cycle, now)
        params.update(
            queue=claim.queues[0],
            lease_for=claim.lease_for,
            worker_id=claim.worker_id,
            token=claim.token or ids.token(),
        )
        if claim.now is not None:
            params["now"] = claim.now
        rows = self._fetch(query, params)
        result = CycleResult(completed=set(rows[0][-2] or ()) if rows else set())
        result.claimed.extend(_job(row[:-2]) for row in rows if row[0] is not None)
        return result

    def job_release_unstarted(self, *, now: datetime | None = None) -> list[str]:
        rows = self._fetch("job_release_unstarted", {"now": now, "channel": self._channel})
        return sorted(row[0] for row in rows)

    def job_release_claim(self, token: str, *, now: datetime | None = None) -> list[str]:
        params = {"token": token, "now": now, "channel": self._channel}
        return sorted(row[0] for row in self._fetch("job_release_claim", params))

    def job_flow(self, job_id: str, *, now: datetime | None = None) -> FlowState | None:
        rows = self._fetch("job_flow", {"id": job_id, "now": now})
        if not rows:
            return None
        key, most, running, rate_max, period, starts, oldest = rows[0]
        return FlowState(
            key,
            most,
            running,
            rate_max,
            period * _MICROSECOND,
            starts,
            None if oldest is None else _utc(oldest),
        )

    def job_peek_isolated(self, queues: Sequence[str], *, now: datetime | None = None) -> bool:
        rows = self._fetch("job_peek_isolated", {"queues": sorted(set(queues)), "now": now})
        return bool(rows and rows[0][0])

    def lease_extend(
        self, leases: Sequence[Lease], lease_for: timedelta, *, now: datetime | None = None
    ) -> set[str]:
        if not leases:
            return set()
        params = {**_lease_arrays(leases), "lease_for": lease_for, "now": now}
        rows = self._on_renewer(self._q["lease_extend"], params)
        assert rows is not None  # it waited for the connection
        return {row[0] for row in rows}

    def _on_renewer(
        self,
        query: bytes,
        params: dict[str, Any],
        *,
        rows: bool = True,
        wait: float | None = None,
        bounds: bytes | None = None,
    ) -> list[Row] | None:
        """Run one statement on the lease renewals' connection of their own, outside the
        pool (and the worker's presence beat: ``rows=False``, no rows to read; ``wait``: None
        when another statement still holds the connection after that many seconds; ``bounds``:
        its own timeouts, for this statement only): handlers and enqueues that hold
        every pooled connection (``pool_max``) cannot starve the heartbeat. Opened on the
        first renewal, replaced after any error (the next renewal connects again) and after
        the pool's ``max_lifetime``; bounded like the pool's, and cut off by the watchdog."""
        if not self._renew_lock.acquire(timeout=-1 if wait is None else wait):
            return None
        try:
            if self._closed:
                self._drop_renewer()
                raise self._closed_error()
            conn = self._renewer
            if conn is not None and (
                _ended(conn)  # a restart, a terminated session
                or _monotonic() - self._renewer_since >= self._pool.max_lifetime
            ):
                self._drop_renewer()
                conn = None
            if conn is None:
                conn = self._connect_renewer()
            started = _monotonic()
            self._watch.arm(conn)
            try:
                if bounds is None:
                    cursor = self._exec(conn, query, params, bounded=True)
                else:  # one implicit transaction: set_config(..., true) ends with it
                    with conn.pipeline():
                        conn.execute(bounds, prepare=self._prepare)
                        cursor = conn.execute(query, params, prepare=self._prepare)
                got = cursor.fetchall() if rows else []
            except psycopg.Error as exc:
                self._renewer = None
                try:
                    self._reraise(exc, conn)
                finally:
                    with self._renewer_end:
                        conn.close()
            finally:
                self._watch.disarm(conn)
            self.stalls.note_wait(_monotonic() - started)
            return got
        finally:
            if self._closed:  # closed during this call (``close`` did not get the lock)
                self._drop_renewer()
            self._renew_lock.release()

    def _connect_renewer(self) -> Conn:
        """Connect the renewals' connection (under ``_renew_lock``). Closed again on any
        failure after the connect, and when the driver was closed meanwhile."""
        kwargs: dict[str, Any] = {**self._connect_kwargs, "autocommit": True}
        if self._stateless:
            kwargs["prepare_threshold"] = None
        try:
            conn: Conn = psycopg.connect(self._dsn, **kwargs)
        except psycopg.Error as exc:
            raise self._renewer_unavailable(exc) from exc
        try:
            self._watch.arm(conn)
            try:
                self._configure(conn)
            finally:
                self._watch.disarm(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise self._renewer_unavailable(exc) from exc
            raise
        self._renewer, self._renewer_since = conn, _monotonic()
        if self._closed:  # closed while this connected: ``close`` saw no connection to close
            self._drop_renewer()
            raise self._closed_error()
        return conn

    def _renewer_unavailable(self, exc: psycopg.Error) -> DriverUnavailableError:
        self.stalls.note_failure()
        return DriverUnavailableError(
            f"cannot connect to PostgreSQL at {self.display_url} to renew leases: "
            f"{_first_line(exc)}",
            driver=_NAME,
            fix="check that the server is running and reachable; the worker's renew loop "
            "retries by itself",
        )

    def _drop_renewer(self) -> None:
        """Close the renewals' connection; only under ``_renew_lock``, never under a statement."""
        conn, self._renewer = self._renewer, None
        if conn is not None:
            try:
                with self._renewer_end:
                    conn.close()
            except psycopg.Error:
                pass

    def _cut_renewer(self) -> None:
        """End the renewals' connection under a statement of another thread, without freeing
        it there: its socket is shut down, the statement fails, and that thread closes it."""
        with self._renewer_end:
            conn = self._renewer
            if conn is None or conn.closed:
                return
            try:
                with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except (psycopg.Error, OSError):  # closed already
                pass

    def _closed_error(self) -> DriverUnavailableError:
        return DriverUnavailableError(
            f"the driver for {self.display_url} is closed",
            driver=_NAME,
            fix="open a new driver (or App) instead of using a closed one",
        )

    def job_complete_many(
        self,
        leases: Sequence[Lease],
        *,
        executor: Executor | None = None,
        now: datetime | None = None,
    ) -> set[str]:
        if not leases:
            return set()
        params = self._complete_params(Cycle(completes=leases), now)
        if executor is not None:
            with self._joined(executor) as conn:
                rows = self._exec(conn, self._q["job_complete"], params).fetchall()
        else:
            rows = self._fetch("job_complete", params)
        return {row[0] for row in rows}

    def _complete_params(self, cycle: Cycle, now: datetime | None) -> dict[str, Any]:
        params: dict[str, Any] = {
            **_lease_arrays(cycle.completes),
            "now": now,
            "finished": self._finished_channel,
            "channel": self._channel,
            "results": None,
        }
        results = cycle.results
        if results:
            ordered = sorted(lease.id for lease in cycle.completes)  # as _lease_arrays
            params["results"] = [results.get(id_) for id_ in ordered]
        return params

    def job_fail_many(
        self, failures: Sequence[Failure], *, now: datetime | None = None
    ) -> set[str]:
        if not failures:
            return set()
        rows = self._fetch("job_fail", self._failure_params(failures, now))
        return {row[0] for row in rows}

    def _failure_params(self, failures: Sequence[Failure], now: datetime | None) -> dict[str, Any]:
        ordered = sorted(failures, key=lambda f: f.lease.id)  # lock order, as in _lease_arrays
        return {
            "failures": _json(
                [
                    {
                        "id": f.lease.id,
                        "token": f.lease.token,
                        "error": f.error.to_json(),
                        "retry_us": None if f.retry_in is None else f.retry_in // _MICROSECOND,
                        "isolate": f.isolate,
                        "refund": f.refund,
                    }
                    for f in ordered
                ]
            ),
            "ids": [f.lease.id for f in ordered],
            "now": now,
            "channel": self._channel,
            "finished": self._finished_channel,
        }

    def job_snooze(
        self, lease: Lease, delay: timedelta | None, *, now: datetime | None = None
    ) -> bool:
        rows = self._fetch(
            "job_snooze",
            {
                "id": lease.id,
                "token": lease.token,
                "delay_us": None if delay is None else delay // _MICROSECOND,
                "now": now,
                "channel": self._channel,
            },
        )
        return bool(rows and rows[0][0])

    def job_cancel(
        self,
        job_id: str,
        *,
        reason: str,
        lease: Lease | None = None,
        tenant_id: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        if lease is not None and lease.id != job_id:
            return False
        rows = self._fetch(
            "job_cancel",
            {
                "id": job_id,
                "reason": reason,
                "token": lease.token if lease is not None else None,
                "tenant_id": tenant_id,
                "now": now,
                "finished": self._finished_channel,
            },
        )
        return bool(rows)

    def job_list_expired(
        self, *, limit: int, now: datetime | None = None, isolated: bool | None = None
    ) -> list[Job]:
        if limit <= 0:
            return []
        params = {"limit": limit, "now": now, "isolated": isolated}
        rows = self._fetch("job_list_expired", params)
        return [_job(row) for row in rows]

    def job_list_running(self, *, limit: int) -> list[Job]:
        if limit <= 0:
            return []
        return [_job(row) for row in self._fetch("job_list_running", {"limit": limit})]

    def job_get(self, job_id: str, *, tenant_id: str | None = None) -> Job | None:
        rows = self._fetch("job_get", {"id": job_id, "tenant_id": tenant_id})
        return _job(rows[0]) if rows else None

    def job_wait(self, job_id: str, *, timeout: float, tenant_id: str | None = None) -> Job | None:
        """With LISTEN: marks the job awaited, then is woken by the NOTIFY of its completion,
        dead end or cancel (``pg_finished``; only awaited jobs notify). Without (``?pooler=transaction``, ``listen=False``, or a pooler
        found in between): one read every ``poll`` seconds (``?poll=``, default 0.5 s)."""
        if self._probe_pooler and not self._probed:
            self._check_pooler()
        listening = self._listen and not (self._probe_pooler and not self._probed)
        mark = self._finished.mark()
        if listening:  # its end notifies from now on (see job_await)
            self._fetch(
                "job_await", {"id": job_id, "tenant_id": tenant_id, "channel": self._channel}
            )

        def wait(remaining: float) -> None:
            nonlocal mark
            if listening:
                mark = self._finished.wait((job_id,), remaining, mark)
            else:
                _SYSTEM.sleep(min(remaining, self._poll))

        return wait_until_final(
            lambda: self.job_get(job_id, tenant_id=tenant_id),
            wait,
            timeout=timeout,
            clock=_SYSTEM,
            closed=lambda: self._closed,
        )

    def job_list(
        self, where: JobFilter, *, limit: int = 100, before_id: str | None = None
    ) -> list[Job]:
        if limit <= 0:
            return []
        params = {**_filter_params(where), "limit": limit, "before_id": before_id}
        return [_job(row) for row in self._fetch("job_list", params, prepare=False)]

    def job_id_below(self, before_id: str | None, offset: int) -> str | None:
        if offset < 0:
            return None
        params = {"before_id": before_id, "offset": offset}
        rows = self._fetch("job_id_below", params, prepare=False)
        return str(rows[0][0]) if rows else None

    def job_count(self, where: JobFilter) -> dict[tuple[str, JobState], int]:
        params = _filter_params(where)
        if where.by_queue_and_state:
            kept = {"states": params["states"], "queue": params["queue"]}
            rows = self._fetch("job_count_kept", kept, prepare=False)
        else:
            rows = self._fetch("job_count", params, prepare=False)
        return {(queue, _STATES[state]): count for queue, state, count in rows}

    def job_retry(
        self, ids: Sequence[str], *, tenant_id: str | None = None, now: datetime | None = None
    ) -> list[str]:
        if not ids:
            return []
        rows = self._fetch(
            "job_retry",
            {"ids": list(ids), "tenant_id": tenant_id, "now": now, "channel": self._channel},
        )
        changed = {row[0] for row in rows}
        return [job_id for job_id in dict.fromkeys(ids) if job_id in changed]

    def job_discard(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        if not ids:
            return []
        rows = self._fetch("job_discard", {"ids": list(ids), "tenant_id": tenant_id})
        deleted = {row[0] for row in rows}
        return [job_id for job_id in dict.fromkeys(ids) if job_id in deleted]

    def job_finished_counts(
        self, since: datetime, bucket: timedelta, *, tenant_id: str | None = None
    ) -> list[FinishedCount]:
        step = bucket.total_seconds()
        params = {"since": since, "bucket": step, "tenant_id": tenant_id}
        rows = self._fetch("job_finished_counts", params, prepare=False)
        return [
            FinishedCount(queue, _STATES[state], _utc(since) + k * bucket, n)
            for queue, state, k, n in sorted(rows)
        ]

    def job_prune(
        self, *, states: frozenset[JobState], finished_before: datetime, limit: int
    ) -> int:
        final = sorted(state.value for state in states & FINAL_STATES)
        if not final or limit <= 0:
            return 0
        params = {"states": list(final), "before": finished_before, "limit": limit}
        with self._connection() as conn:
            # The maintenance node prunes: it folds the count deltas too (see 0005).
            self._exec(conn, self._q["job_counts_fold"], {}, bounded=True)
            return self._exec(conn, self._q["job_prune"], params, bounded=True).rowcount

    # -- queues ------------------------------------------------------------------------------

    def queue_set_paused(self, queue: str, paused: bool) -> None:
        self._fetch("queue_set_paused", {"name": queue, "paused": paused, "channel": self._channel})

    def queue_list(self, *, now: datetime | None = None) -> list[QueueInfo]:
        paused: dict[str, bool] = {}
        counts: dict[str, dict[JobState, int]] = {}
        summed = 0
        rows, oldest_rows = self._pipelined(
            [(self._q["queue_list"], {}), (self._q["queue_oldest_ready"], {"now": now})]
        )
        for queue, is_paused, state, count, deltas in rows:
            paused[queue] = is_paused
            summed += deltas
            per_state = counts.setdefault(queue, {})
            if state is not None:
                per_state[_STATES[state]] = count
        oldest: dict[str, datetime] = {}
        for queue, at in oldest_rows:  # unlimited and limited jobs: a queue may have both
            if at is not None and (queue not in oldest or _utc(at) < oldest[queue]):
                oldest[queue] = _utc(at)
        for queue in oldest:  # a queue whose counts have not been read yet (a race)
            paused.setdefault(queue, False)
            counts.setdefault(queue, {})
        if summed > _FOLD_AFTER:  # no maintenance node has folded the deltas for a while
            self.job_counts_fold()
        return [
            QueueInfo(name, paused[name], counts[name], oldest.get(name)) for name in sorted(paused)
        ]

    def job_counts_fold(self) -> None:
        """Fold the count deltas the triggers append into one row per (queue, state) (the
        maintenance node does it as it prunes; a read that summed many does it too)."""
        with self._connection() as conn:
            self._exec(conn, self._q["job_counts_fold"], {}, bounded=True)

    # -- cron schedules and leadership -----------------------------------------------------

    def schedule_read(self, tasks: Sequence[str]) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        rows = self._fetch("schedule_read", {"tasks": sorted(set(tasks))})
        return {
            task: ScheduleState(task, _utc(first), _utc(last) if last is not None else None)
            for task, first, last in rows
        }

    def schedule_state(
        self, tasks: Sequence[str], *, now: datetime | None = None
    ) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        params = {"tasks": sorted(set(tasks)), "now": now}
        with self._connection() as conn:
            self._exec(conn, self._q["schedule_register"], params, bounded=True)
            rows = self._exec(conn, self._q["schedule_read"], params, bounded=True).fetchall()
        found = {
            task: ScheduleState(task, _utc(first), _utc(last) if last is not None else None)
            for task, first, last in rows
        }
        return {task: found[task] for task in tasks}

    def schedule_fire(
        self,
        task: str,
        occurrence: datetime,
        jobs: Sequence[NewJob],
        *,
        now: datetime | None = None,
    ) -> list[InsertResult] | None:
        with self._connection() as conn, conn.transaction():
            self._bound(conn)
            advanced = self._exec(
                conn,
                self._q["schedule_advance"],
                {"task": task, "occurrence": occurrence, "now": now},
            ).fetchall()
            if not advanced:
                return None
            results = self._insert(conn, jobs, now, bounded=False) if jobs else []
        self._woke(jobs)
        return results

    def schedule_rewind(self, task: str, was: datetime, to: datetime) -> bool:
        return bool(self._fetch("schedule_rewind", {"task": task, "was": was, "to": to}))

    def database_now(self, *, now: datetime | None = None) -> datetime:
        if now is not None:
            return _utc(now)
        return _utc(self._fetch("database_now", {})[0][0])

    def leader_elect(
        self, name: str, holder: str, ttl: timedelta, *, now: datetime | None = None
    ) -> bool:
        rows = self._fetch("leader_elect", {"name": name, "holder": holder, "ttl": ttl, "now": now})
        return bool(rows)

    def leader_resign(self, name: str, holder: str) -> None:
        with self._connection() as conn:
            self._exec(
                conn, self._q["leader_resign"], {"name": name, "holder": holder}, bounded=True
            )

    # -- live workers ------------------------------------------------------------------------

    def worker_beat(self, worker: WorkerInfo, *, now: datetime | None = None) -> None:
        params = {
            "id": worker.id,
            "host": worker.host,
            "pid": worker.pid,
            "queues": list(worker.queues),
            "concurrency": worker.concurrency,
            "started_at": worker.started_at,
            "now": now,
            "version": worker.version,
        }
        # On the renewals' connection (a busy pool cannot make a live worker look gone), unless
        # a renewal holds it for long: then pooled.
        beat = self._q["worker_beat"]
        if (
            self._on_renewer(beat, params, rows=False, wait=_BEAT_WAIT, bounds=self._beat_bounds)
            is None
        ):
            self._write_only("worker_beat", params)

    def worker_remove(self, worker_id: str) -> None:
        self._write_only("worker_remove", {"id": worker_id})

    def _write_only(self, name: str, params: dict[str, Any]) -> None:
        """Run one statement that returns no rows, as ``_fetch`` runs one that does."""
        query = self._q[name]
        self._attempts(lambda conn: self._exec(conn, query, params, bounded=True))

    def worker_prune(self, stale_after: timedelta, *, now: datetime | None = None) -> list[str]:
        rows = self._fetch("worker_prune", {"stale": stale_after, "now": now})
        return sorted(row[0] for row in rows)

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id_, host, pid, tuple(queues), concurrency, _utc(started), _utc(beat), version
            )
            for id_, host, pid, queues, concurrency, started, beat, version in self._fetch(
                "worker_list", {}
            )
        ]

    # -- wake-ups ----------------------------------------------------------------------------

    def wait_for_jobs(self, timeout: float, wake: threading.Event) -> None:
        timeout = max(0.0, timeout)
        if self._probe_pooler and not self._probed:
            self._check_pooler()
        if not self._listen or (self._probe_pooler and not self._probed):
            # Polling; or the pooler check could not run (the server is away): no LISTEN
            # until it has, as a LISTEN through a transaction pooler would stay behind on a
            # server session that other clients get next.
            self._poll_wait(timeout, wake)
            return
        deadline = time.monotonic() + timeout
        seen = self._wake_seq
        while not wake.is_set() and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._wake_seq != seen:
                return
            span = min(remaining, _WAIT_SLICE)
            # One thread LISTENs at a time; the others wait for it to signal.
            if self._listen_lock.acquire(blocking=False):
                try:
                    if self._listen_once(span, wake):
                        return
                finally:
                    self._listen_lock.release()
            else:
                with self._wake_cond:
                    if self._wake_seq == seen and not self._closed:
                        self._wake_cond.wait(span)

    def _poll_wait(self, timeout: float, wake: threading.Event) -> None:
        """Without LISTEN: return after an insert by this driver (``_signal``), or once the
        newest job id has changed (``_look``), or after ``timeout``."""
        deadline = time.monotonic() + timeout
        seen = self._wake_seq
        while not wake.is_set() and not self._closed:
            now = time.monotonic()
            if now >= deadline or self._wake_seq != seen:
                return
            if now >= self._look_at and self._look_lock.acquire(blocking=False):
                try:
                    if self._look(now):
                        return
                finally:
                    self._look_lock.release()
            pause = min(deadline, max(self._look_at, now + 0.001)) - time.monotonic()
            wake.wait(max(0.0, min(pause, _POLL_SLICE)))

    def _look(self, now: float) -> bool:
        """One look at the newest job id; True (and every waiter signalled) when it changed.
        Looks come every 20 ms just after a change, then further apart the longer nothing
        changes (a twentieth of the quiet time), at most ``poll`` apart."""
        quiet = now - self._active_at
        self._look_at = now + min(self._poll, max(_POLL_FAST, quiet / 20))
        try:
            rows = self._fetch("job_newest", {})
        except DriverUnavailableError:
            self._look_at = now + self._poll
            return True  # the caller's next call meets the error (and backs off)
        newest = rows[0][0] if rows else None
        if self._looked and (
            newest is None or (self._newest is not None and newest <= self._newest)
        ):
            return False
        first = not self._looked
        self._looked = True
        self._newest = newest
        if first:
            return False  # the first look only learns where things stand
        self._active_at = now
        self._look_at = now + _POLL_FAST
        self._signal()
        return True

    def _check_pooler(self) -> None:
        """Once: does a NOTIFY reach our LISTEN? Behind a transaction-mode pooler it does not
        (the LISTEN ran on a server session that went back to the pool); then warn with the
        fix, and poll without prepared statements from now on.

        A NOTIFY that is merely late (a loaded machine) must not turn anything off, so before
        deciding that a pooler sits in between the check asks the server: a session that sees
        our own socket's address and port as its client's is a direct connection. Only where
        the server cannot tell (a Unix socket, a proxy or NAT in between) does it wait longer,
        for that NOTIFY or a second one, before it decides."""
        if not self._probe_pooler or self._probed or time.monotonic() < self._probe_retry_at:
            return
        self._probed = True
        name = f"{self._channel}:probe"
        payloads = {uuid.uuid4().hex}
        try:
            with psycopg.connect(self._dsn, autocommit=True, **self._connect_kwargs) as probe:
                self._watch.arm(probe)
                try:
                    probe.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(name)))
                finally:
                    self._watch.disarm(probe)
                self._notify_probe(name, next(iter(payloads)))
                got = _heard(probe, payloads, _PROBE_WAIT) or self._direct(probe)
                if not got:  # late, or never: wait longer for it, or for a second one
                    second = uuid.uuid4().hex
                    payloads.add(second)
                    self._notify_probe(name, second)
                    got = _heard(probe, payloads, _PROBE_CONFIRM)
        except (psycopg.Error, DriverUnavailableError):
            # Cannot tell now; a later migrate or wait asks again (not sooner than in 5 s).
            self._probed = False
            self._probe_retry_at = time.monotonic() + 5.0
            return
        if got:
            return
        # The probe's LISTEN may stay registered on a pooled server session (until the pooler
        # closes it); only these probes ever notify that channel.
        self._listen = False
        self._stateless = True
        self._prepare = False
        self._drop_listener()
        events.warning(
            "jobs.postgres.pooler",
            url=self.display_url,
            cause="a NOTIFY sent to this database never reached its LISTEN: a "
            "transaction-mode pooler (PgBouncer pool_mode=transaction, a managed service's "
            "transaction pooler) is in between; prepared statements would fail there too",
            fix="add ?pooler=transaction to the URL (or connect past the pooler); until "
            "then this driver polls and prepares no statement",
        )

    def _notify_probe(self, channel: str, payload: str) -> None:
        self._fetch(
            self._q["notify_probe"], {"channel": channel, "payload": payload}, prepare=False
        )

    def _direct(self, probe: Conn) -> bool:
        """Whether the server's session of ``probe`` sees both ends of its socket as we do:
        its client is this end (address and port) and its own end is the one we connected
        to. Then nothing (no pooler, proxy or NAT) sits in between: a local pooler's own
        connection to the server may use our client port too, but never toward the same
        server end. False when it cannot tell (a Unix socket: no address to compare)."""
        try:
            with socket.socket(fileno=os.dup(probe.pgconn.socket)) as ours:
                here, there = ours.getsockname(), ours.getpeername()
        except OSError:
            return False
        if not (isinstance(here, tuple) and isinstance(there, tuple)):
            return False  # a Unix socket
        self._watch.arm(probe)
        try:
            row = probe.execute(self._q["session_ends"], prepare=False).fetchone()
        finally:
            self._watch.disarm(probe)
        if row is None or any(value is None for value in row):
            return False
        try:
            seen = (_ip(row[0]), int(row[1]), _ip(row[2]), int(row[3]))
            known = (_ip(here[0]), int(here[1]), _ip(there[0]), int(there[1]))
        except ValueError:
            return False
        direct = seen == known
        if direct:
            events.debug(
                "jobs.postgres.pooler",
                url=self.display_url,
                found="none",
                cause=f"the probe's NOTIFY took over {_PROBE_WAIT:g} s on a direct connection",
            )
        return direct

    def _listen_once(self, span: float, wake: threading.Event) -> bool:
        """Wait up to ``span`` on the LISTEN connection (opening it if needed); True when the
        caller should return early: a notification, a lost connection, or a fresh LISTEN."""
        if self._closed:
            return True
        conn = self._listener
        if conn is None:
            now = time.monotonic()
            if now < self._listen_retry_at:
                wake.wait(min(span, self._listen_retry_at - now))
                return False
            try:
                conn = psycopg.connect(self._dsn, autocommit=True, **self._connect_kwargs)
                self._watch.arm(conn)
                try:
                    conn.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(self._channel)))
                finally:
                    self._watch.disarm(conn)
            except psycopg.Error:
                self._listen_backoff = min(max(0.25, 2 * self._listen_backoff), _LISTEN_BACKOFF_MAX)
                self._listen_retry_at = time.monotonic() + self._listen_backoff
                return False
            self._listener = conn
            self._listen_backoff = 0.0
            self._probe_at = time.monotonic() + _PROBE_AFTER
            lost, self._listen_lost = self._listen_lost, False
            if lost or self._claimed:
                # Jobs inserted while nobody listened, after a claim (a worker's first wait
                # comes after its first claim, and its next poll may be a minute away): every
                # waiter claims once.
                self._signal()
                return True
            return False
        try:
            if isinstance(wake, Wake):  # sleep on the socket and on the wake-up at once
                ready, _, _ = select.select([conn.fileno(), wake.fileno()], [], [], span)
                if wake.is_set():
                    return True
                got = list(conn.notifies(timeout=0)) if ready else []
            else:
                got = list(conn.notifies(timeout=span, stop_after=1))
            if got:
                list(conn.notifies(timeout=0))  # what queued up meanwhile is covered by one poll
                self._probe_at = time.monotonic() + _PROBE_AFTER
                self._signal()
                return True
            if time.monotonic() >= self._probe_at:
                self._probe_at = time.monotonic() + _PROBE_AFTER
                self._watch.arm(conn)
                try:
                    conn.execute(self._q["ping"])
                finally:
                    self._watch.disarm(conn)
        except psycopg.Error:
            self._drop_listener()
            self._listen_lost = True
            self._signal()
            return True
        return False

    def _signal(self) -> None:
        with self._wake_cond:
            self._wake_seq += 1
            self._wake_cond.notify_all()

    def _drop_listener(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    # -- helpers -----------------------------------------------------------------------------

    def _insert(
        self, conn: Conn, jobs: Sequence[NewJob], now: datetime | None, *, bounded: bool
    ) -> list[InsertResult]:
        """Insert, then resolve the rows that conflicted to the stored ids. A conflicting row
        can vanish before the look-up (pruned, or its transaction rolled back): insert again.
        ``bounded``: each statement is its own transaction of ours (autocommit), so each
        carries the timeouts; otherwise a transaction is open (ours, bounded at its start, or
        the caller's) and nothing is set."""
        if len(jobs) >= _COPY_FROM and not bounded:
            copied = self._copy(conn, jobs, now)
            if copied is not None:
                return copied
        results: list[InsertResult | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        for _ in range(5):
            fresh: set[str] = set()
            for start in range(0, len(pending), _CHUNK):
                batch = [jobs[i] for i in pending[start : start + _CHUNK]]
                fresh.update(
                    row[0] for row in self._execute_insert(conn, batch, now, bounded=bounded)
                )
            conflicted: list[int] = []
            for i in pending:
                if jobs[i].id in fresh:
                    fresh.discard(jobs[i].id)  # a second copy of one id in the batch is a dupe
                    results[i] = InsertResult(jobs[i].id, deduped=False)
                else:
                    conflicted.append(i)
            if not conflicted:
                break
            stored = self._ids_by_key(conn, [jobs[i] for i in conflicted], bounded=bounded)
            pending = []
            for at, i in enumerate(conflicted):
                found = stored.get(at)
                if found is None:
                    pending.append(i)
                else:
                    results[i] = InsertResult(found, deduped=True)
            for i in [i for i in pending if jobs[i].unique_key is not None]:
                holder = self._unique_holder(conn, jobs[i], now, bounded=bounded)
                if holder is not None:
                    pending.remove(i)
                    results[i] = InsertResult(holder, deduped=True)
            if not pending:
                break
        if any(result is None for result in results):
            raise DriverUnavailableError(
                "inserted jobs kept conflicting with rows that vanished before they could be read",
                driver=_NAME,
                fix="retry the enqueue; if it persists, a pruner is deleting fresh rows",
            )
        return [result for result in results if result is not None]

    def _copy(
        self, conn: Conn, jobs: Sequence[NewJob], now: datetime | None
    ) -> list[InsertResult] | None:
        """The fast path of a big batch: COPY straight into the table (multi-row heap inserts,
        text parsed in C), betting that no key is stored yet. A key repeated in the batch, a
        job with a limit, a uniqueness key or a trace context (COPY carries none: the ON
        CONFLICT path does), or a row that conflicts returns None having written nothing,
        and the caller takes the ON CONFLICT path, which dedupes. Runs inside the caller's
        transaction, in a savepoint of its own. Jobs that are built as they are read
        (``NewJobs``) are built a slice at a time, while the server stores the last one; an
        input refused meanwhile rolls the savepoint back and raises."""
        rest = in_slices(jobs, _COPY_SLICE)
        head = next(rest)
        if not _copyable(head[0]):
            return None  # the usual case of a batch COPY cannot take: say so before any I/O
        slices = itertools.chain((head,), rest)
        row = self._exec(conn, self._q["clock"], {"now": now}).fetchone()
        assert row is not None
        at: datetime = row[0]
        due: set[str] = set()
        texts = _copy_lines(slices, at, due)
        encoding = conn.info.encoding
        try:
            with conn.transaction(), our_cursor(conn) as cur, cur.copy(self._q["job_copy"]) as copy:
                # Sent a slice at a time, so the server works while the next is built.
                for text in texts:
                    copy.write(text.encode(encoding))
        except (_NotCopyable, pg_errors.UniqueViolation):
            return None
        except psycopg.DataError as exc:
            raise _refused(exc) from None
        if due:
            self._exec(
                conn,
                self._q["notify_queues"],
                {"channel": self._channel, "queues": sorted(due)},
            )
        return [InsertResult(job_id, False) for job_id in ids_of(jobs)]

    def _execute_insert(
        self, conn: Conn, jobs: Sequence[NewJob], now: datetime | None, *, bounded: bool
    ) -> list[Row]:
        query: bytes
        params: dict[str, Any]
        if len(jobs) > 1 and any(j.unique_key is not None for j in jobs):
            # One by one: each unique key is resolved by its own statement.
            return [
                row for j in jobs for row in self._execute_insert(conn, [j], now, bounded=bounded)
            ]
        if len(jobs) == 1:
            [j] = jobs
            query = self._q["job_insert_one"]
            params = {
                "id": j.id,
                "name": j.name,
                "queue": j.queue,
                "input": j.input,
                "tenant_id": j.tenant_id,
                "key": j.idempotency_key,
                "priority": j.priority,
                "max_attempts": j.max_attempts,
                "trace_context": j.trace_context,
                "channel": self._channel,
                "run_at": j.run_at,
                "delay": j.delay,
                "now": now,
                "limit_key": j.limit_key,
                "limit_max": j.limit_max,
                "rate_max": j.rate_max,
                "rate_period": j.rate_period // _MICROSECOND,
                "unique_key": j.unique_key,
                "unique_states": j.unique_states,
            }
        else:
            rows = [
                [
                    j.id,
                    j.name,
                    j.queue,
                    j.input,
                    j.tenant_id,
                    j.idempotency_key,
                    j.priority,
                    j.max_attempts,
                    j.run_at.isoformat() if j.run_at is not None else None,
                    None if j.delay is None else f"{j.delay // _MICROSECOND} microseconds",
                    j.trace_context,
                    j.limit_key,
                    j.limit_max,
                    j.rate_max,
                    j.rate_period // _MICROSECOND,
                ]
                for j in jobs
            ]
            query = self._q["job_insert"]
            params = {"rows": _json(rows), "now": now, "channel": self._channel}
        try:
            return self._exec(conn, query, params, bounded=bounded).fetchall()
        except psycopg.DataError as exc:
            raise _refused(exc) from None

    def _unique_holder(
        self, conn: Conn, job: NewJob, now: datetime | None, *, bounded: bool
    ) -> str | None:
        """The job holding ``job``'s unique key, debounced to ``job`` first when it asks to
        replace (see ``job_debounce``); None when the key is free again (insert once more)."""
        row = self._exec(
            conn, self._q["job_unique_holder"], {"key": job.unique_key}, bounded=bounded
        ).fetchone()
        if row is None:
            return None
        holder: str = row[0]
        if job.unique_replace:
            params = {
                "id": holder,
                "input": job.input,
                "priority": job.priority,
                "run_at": job.run_at,
                "delay": job.delay,
                "now": now,
                "channel": self._channel,
            }
            self._exec(conn, self._q["job_debounce"], params, bounded=bounded)
        return holder

    def _ids_by_key(self, conn: Conn, jobs: Sequence[NewJob], *, bounded: bool) -> dict[int, str]:
        """The stored job each of ``jobs`` (which inserted nothing) duplicates, by position:
        the holder of its key, or the row of its id stored under that same key (a keyless
        job's key is its id). A row holding its id under another key is an error."""
        rows = self._exec(
            conn,
            self._q["job_ids_by_key"],
            {"keys": _json([{"t": j.tenant_id, "k": j.idempotency_key, "i": j.id} for j in jobs])},
            bounded=bounded,
        ).fetchall()
        found: dict[int, str] = {}
        for ord_, id_, key in sorted(rows, key=lambda row: row[2] is not None):
            at = ord_ - 1
            if key is None:  # the holder of a caller's key comes first
                found[at] = id_
            elif key == jobs[at].idempotency_key:
                found.setdefault(at, id_)
            elif at not in found:
                # In a caller's transaction, ``_joined`` rolls back to its savepoint.
                raise ValueError(f"job id {id_} is already stored under another key")
        return found

    def _fetch(
        self, name: str | bytes, params: dict[str, Any], *, prepare: bool | None = None
    ) -> list[Row]:
        """Run one statement (a query name, or the text itself) on a pooled connection
        (autocommit: it is its own transaction) and return its rows. A deadlock (two batches
        locking shared rows in different orders) rolled the statement back whole, so it is
        retried."""
        query = self._q[name] if isinstance(name, str) else name
        return self._attempts(
            lambda conn: self._exec(conn, query, params, bounded=True, prepare=prepare).fetchall()
        )

    def _pipelined(self, steps: list[tuple[bytes, dict[str, Any]]]) -> list[list[Row]]:
        """Run ``steps`` in one transaction of ours, pipelined (one round trip: the timeouts,
        then each step), and return each step's rows."""

        def run(conn: Conn) -> list[list[Row]]:
            with conn.pipeline(), conn.transaction():
                self._bound(conn)
                cursors = [self._exec(conn, query, params or None) for query, params in steps]
            return [cur.fetchall() if cur.description else [] for cur in cursors]

        return self._attempts(run)

    def _attempts(self, body: Callable[[Conn], _T]) -> _T:
        """Run ``body`` on a pooled connection, cut off by the watchdog if it gets no reply in
        time; retried whole after a deadlock (two batches locking shared rows in different
        orders: rolled back whole). Not ``with self._connection()``: on the hot path its
        generator costs a few µs.

        A body slower than ``_REPLAN_AFTER`` drops the connection's prepared statements
        (``DEALLOCATE ALL``, which psycopg follows), so each is planned again on its next
        uses. A generic plan is kept from when it was made: one made while ``x_jobs`` was a
        few rows scans it, and keeps scanning it after a burst of enqueues made it big, until
        an ANALYZE (autovacuum's, up to a minute later). The first slow claim ends that."""
        for attempt in range(3):
            started = time.monotonic()
            conn = self._checkout()
            self._watch.arm(conn)
            try:
                began = time.monotonic()
                result = body(conn)
                ended = time.monotonic()
                self.stalls.note_wait(ended - started)
                if ended - began > _REPLAN_AFTER and self._prepare is None:
                    _replan(conn)
                    events.debug("jobs.postgres.replanned", seconds=round(ended - began, 3))
                if pool_log.OWNER.down:  # a statement went through: the outage is over
                    pool_log.OWNER.recovered()
                return result
            except psycopg.Error as exc:
                if attempt < 2 and isinstance(exc, pg_errors.DeadlockDetected):
                    continue
                self._reraise(exc, conn)
            finally:
                self._watch.disarm(conn)
                self._putconn(conn)
        raise AssertionError("unreachable")

    def _exec(
        self,
        conn: Conn,
        query: bytes,
        params: dict[str, Any] | tuple[Any, ...] | None = None,
        *,
        bounded: bool = False,
        prepare: bool | None = None,
    ) -> psycopg.Cursor[Any]:
        """Execute one statement of ours. ``bounded``: it is its own transaction (autocommit),
        so the timeouts go first, in the same round trip (a pipeline: one implicit transaction
        until its sync, so ``set_config(..., true)`` ends with the statement). Nothing is ever
        prepared behind a transaction-mode pooler, on our connections or a caller's."""
        if prepare is None and self._stateless:
            prepare = False
        if not bounded:  # perhaps on a caller's connection, whatever cursors and rows it makes
            return our_cursor(conn).execute(query, params, prepare=prepare)
        if self._session_bounds:
            if conn not in self._rebound:  # the session's bounds: the statement goes alone
                return conn.execute(query, params, prepare=prepare)
            with conn.pipeline():
                conn.execute(self._bounds_session, prepare=self._prepare)
                cursor = conn.execute(query, params, prepare=prepare)
            self._rebound.discard(conn)
            return cursor
        with conn.pipeline():
            conn.execute(self._bounds, prepare=self._prepare)
            cursor = conn.execute(query, params, prepare=prepare)
        return cursor

    def _bound(self, conn: Conn) -> None:
        """In a transaction of ours: bound it, unless the session already is. (A connection
        that served a caller gets this transaction's bounds; its session is bounded again by
        the next statement of ours outside a transaction, in ``_exec``.)"""
        if not self._session_bounds or conn in self._rebound:
            self._exec(conn, self._bounds)

    def _configure(self, conn: Conn) -> None:
        """A new pooled connection: notifications ignored; on a direct connection, our bounds
        as its session settings."""
        _ignore_notifications(conn)
        if self._session_bounds:
            conn.execute(self._bounds_session, prepare=False)

    @contextmanager
    def _connection(self, *, guard: bool = True) -> Iterator[Conn]:
        """A pooled connection for a call of ours, cut off by the watchdog if it gets no
        reply in time (``guard``; not for a transaction handed to a caller)."""
        conn = self._checkout()
        if guard:
            self._watch.arm(conn)
        try:
            yield conn
            if pool_log.OWNER.down:  # a statement went through: the outage is over
                pool_log.OWNER.recovered()
        except psycopg.Error as exc:
            self._reraise(exc, conn)
        finally:
            if guard:
                self._watch.disarm(conn)
            self._putconn(conn)

    def _checkout(self) -> Conn:
        """A pooled connection, lent until ``_putconn``. One whose session ended while it sat
        in the pool (a server restart, ``pg_terminate_backend``) is closed, and the pool
        replaces it."""
        if self._closed:
            raise self._closed_error()
        if self._forked:  # the first call of a forked child: its own pool (_after_fork)
            self._forked = False
            self._pool.open(wait=False)  # safe to call twice, if two threads get here
        try:
            for _ in range(self._pool_max + 1):
                conn = self._getconn()
                if not _ended(conn):
                    break
                conn.close()
                self._pool.putconn(conn)
            else:
                conn = self._getconn()
        except PoolTimeout as exc:
            self.stalls.note_failure()
            raise DriverUnavailableError(
                f"no free connection to PostgreSQL at {self.display_url} within "
                f"{_POOL_WAIT:g} s, although the server accepts connections",
                driver=_NAME,
                fix="every pooled connection is busy: raise pool_max (and the server's "
                "max_connections), or lower the worker concurrency",
            ) from exc
        except PoolClosed as exc:
            raise self._closed_error() from exc
        except DriverUnavailableError:
            self.stalls.note_failure()
            raise
        self._lent.add(conn)
        return conn

    def _putconn(self, conn: Conn) -> None:
        self._lent.discard(conn)
        self._pool.putconn(conn)

    def _getconn(self) -> Conn:
        """A pooled connection. When none comes quickly, the server may be down, or the pool
        busy: one direct connection attempt (at most one a second) tells them apart, so an
        outage fails fast with libpq's own reason instead of after the whole wait."""
        try:
            conn: Conn = self._pool.getconn(timeout=_QUICK_WAIT)
            return conn
        except PoolTimeout:
            pass
        if time.monotonic() - self._reachable_at > 1.0:
            try:
                psycopg.connect(self._dsn, **self._connect_kwargs).close()
            except psycopg.OperationalError as exc:
                raise DriverUnavailableError(
                    f"cannot connect to PostgreSQL at {self.display_url}: {_first_line(exc)}",
                    driver=_NAME,
                    fix="check that the server is running and reachable with this URL and "
                    "its credentials; a running worker keeps retrying until it is back, a "
                    "command or a starting worker exits (run it again once it is back)",
                ) from exc
            self._reachable_at = time.monotonic()
        conn = self._pool.getconn(timeout=_POOL_WAIT)
        return conn

    def _joined_conn(self, executor: Joined) -> Conn:
        """The connection of a caller's transaction, joined by ``adopt`` (or already, with
        this database's identity), and still usable: closed or failed raise."""
        if isinstance(executor, Joined) and executor.database == self.identity():
            # Joined by ``adopt`` (the type checked there, the database again by the caller):
            # only the transaction's state can have changed since, and one read tells.
            conn: Conn = executor.connection
        else:
            conn = self.adopt(executor).connection
        status = conn.pgconn.transaction_status
        if status != _INTRANS and status != _IDLE:
            check_joinable(conn, fix=_ADOPT_FIX)  # closed, or failed: says so
        return conn

    def _joined(
        self, executor: Joined, jobs: Sequence[NewJob] = ()
    ) -> AbstractContextManager[Conn]:
        """Run inside the caller's transaction without ever ending it, in a SAVEPOINT
        (``dialects.postgres.in_savepoint``, shared with the outbox store): a failure of ours
        (a lock or statement timeout, a serialization failure, a row refused by a constraint)
        rolls back to it, so the caller's transaction stays usable and holds nothing of the
        call, and raises an ``EnqueueRefusedError`` that names the cause. ``jobs``: the jobs
        being written, which an error names."""
        conn = self._joined_conn(executor)
        return in_savepoint(
            conn,
            driver=_NAME,
            describe=lambda: _described(jobs),
            translate=lambda exc: self._noted(exc, conn),
            prepare=self._prepare,
        )

    def _reraise(self, exc: psycopg.Error, conn: Conn) -> NoReturn:
        translated = self._noted(exc, conn)
        if translated is exc:
            raise exc
        raise translated from exc

    def _noted(self, exc: psycopg.Error, conn: Conn) -> Exception:
        """``_translate``, noting an unavailable database in ``stalls``."""
        translated = self._translate(exc, conn)
        if isinstance(translated, DriverUnavailableError):
            self.stalls.note_failure()
        return translated

    def _translate(self, exc: psycopg.Error, conn: Conn) -> Exception:
        """The ``JobsError`` for any psycopg error of a statement of ours (the total error
        contract of the seam): a missing schema says to migrate; a server that is away, read
        only (a failover, a hot standby), out of resources, shutting down, or that cancelled
        the statement (a timeout), a serialization failure or a deadlock is retryable; anything
        else (a bug, a schema changed by hand) is not."""
        state = exc.sqlstate or ""
        if isinstance(exc, pg_errors.UndefinedTable | pg_errors.InvalidSchemaName):
            return DriverUnavailableError(
                f"the job tables are missing in {self.display_url}: {_first_line(exc)}",
                driver=_NAME,
                fix=_MIGRATE_FIX,
                retryable=False,
            )
        if isinstance(exc, psycopg.DataError):
            return SerializationError(
                f"PostgreSQL refused a value: {_first_line(exc)}",
                fix="pass JSON text the serializer made, and values within the documented bounds",
            )
        if self._watch.fired(conn):
            return DriverUnavailableError(
                f"PostgreSQL at {self.display_url} sent no reply within "
                f"{self.call_budget:g} s, so the connection was cut off (a stalled network, "
                "proxy or pooler; the server may or may not have run the statement)",
                driver=_NAME,
                fix="check the network path and any pooler in front of the server; the pool "
                "replaces the connection and the worker's loops retry by themselves",
                retryable=True,
            )
        if (
            conn.broken
            or isinstance(exc, psycopg.InterfaceError)
            or not state
            or state.startswith(_RETRYABLE_CLASSES)
            or state in _RETRYABLE_STATES
        ):
            if state == "25006":
                cause = f"PostgreSQL at {self.display_url} is read-only: {_first_line(exc)}"
                fix = (
                    "the server is a standby or in a failover; point the URL at the primary "
                    "(libpq's target_session_attrs=read-write); the worker retries by itself"
                )
            else:
                cause = f"PostgreSQL at {self.display_url} failed: {_first_line(exc)}"
                fix = (
                    "check that the server is running and reachable; calls are retried by "
                    "the worker's loops, and the pool replaces broken connections"
                )
            return DriverUnavailableError(cause, driver=_NAME, fix=fix, retryable=True)
        return DriverUnavailableError(
            f"PostgreSQL at {self.display_url} refused a statement of ultimat3-jobs "
            f"(SQLSTATE {state}): {_first_line(exc)}",
            driver=_NAME,
            fix="check that the schema is the one `ultimat3-jobs migrate` made; if it is, "
            "this is a bug: please report it with this message",
            retryable=False,
        )

    def _own_identity(self, *, refresh: bool) -> DatabaseId:
        if self._identity is None or refresh:
            with self._connection() as conn, conn.transaction():
                self._bound(conn)
                self._identity, _ = identify(conn, self._jobs_table, self.display_url)
        return self._identity


def _described(jobs: Sequence[NewJob]) -> tuple[str, str]:
    """A write of ours in a caller's transaction, for its error (``in_savepoint``): what it
    was, and who holds what a lock wait of it waited for (the keys of the jobs, or else a
    lock on the job table)."""
    if not jobs:
        return "a write of ultimat3-jobs", "another transaction holds a lock on a job it writes"
    keys = [j.idempotency_key for j in jobs if j.idempotency_key != j.id]
    keys += [j.unique_key for j in jobs if j.unique_key is not None]
    holder = (
        f"another transaction holds idempotency key {listed(keys)} and has not ended"
        if keys
        else "another transaction holds a lock on the job table (a migration, or a "
        "statement run by hand)"
    )
    return f"the enqueue of {jobs_named(jobs)}", holder


def _copyable(job: NewJob) -> bool:
    """Whether COPY can store ``job``: no limit, no uniqueness key, no trace context."""
    return job.limit_key is None and job.unique_key is None and job.trace_context is None


class _NotCopyable(Exception):
    """A batch that COPY cannot store as it is (see ``PostgresDriver._copy``)."""


class _Watchdog:
    """Bounds calls on the client side. ``arm(conn)`` before a call, ``disarm(conn)`` after;
    a connection still armed ``budget`` seconds later has its socket shut down, so the read
    blocked on it fails at once (the connection is then broken, and the pool replaces it).
    A stalled peer that still acknowledges at TCP level (a hung pooler or proxy) is noticed
    by nothing else: neither keepalives nor ``tcp_user_timeout`` fire while it acknowledges.

    Cheap on the hot path (a dict write under a lock, no wake-up): every call gets the same
    budget, so a new call's deadline is never earlier than those armed before it, and the
    thread only has to wake for the oldest one. Idle, it sleeps ``budget`` at a time."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        # arm/disarm take the lock itself: a Condition's own ``with`` adds two Python calls.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._armed: dict[int, tuple[float, Any]] = {}
        self._fired: set[int] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, conn: Any) -> None:
        with self._lock:
            self._armed[id(conn)] = (time.monotonic() + self.budget, conn)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="ultimat3-jobs-pg-watchdog", daemon=True
                )
                self._thread.start()

    def disarm(self, conn: Any) -> None:
        with self._lock:
            self._armed.pop(id(conn), None)
            self._fired.discard(id(conn))

    def fired(self, conn: Any) -> bool:
        """Whether the watchdog cut ``conn`` off during the call still armed on it."""
        with self._lock:
            return id(conn) in self._fired

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                soonest = min((d for d, _ in self._armed.values()), default=now + self.budget)
                if soonest > now:
                    self._cond.wait(soonest - now)
                    continue
                for key, (deadline, conn) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[key]
                        self._fired.add(key)
                        _cut_off(conn)


def _cut_off(conn: Any) -> None:
    """Shut the connection's socket down under the read that waits on it."""
    try:
        fd = conn.pgconn.socket
    except Exception:
        return  # already closed
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address, an IPv4-mapped IPv6 one as its IPv4 address."""
    address = ipaddress.ip_address(text.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _heard(probe: Any, payloads: set[str], timeout: float) -> bool:
    """Whether one of ``payloads`` reaches ``probe`` within ``timeout`` seconds."""
    deadline = _monotonic() + timeout
    while (remaining := deadline - _monotonic()) > 0:
        for note in probe.notifies(timeout=remaining, stop_after=1):
            if note.payload in payloads:
                return True
    return False


def _ignore_notifications(conn: Any) -> None:
    """Pooled connections never LISTEN, but behind a transaction-mode pooler a server session
    that some client once LISTENed on delivers its notifications to whichever client holds it
    next; without a handler psycopg would keep them all, unread, for the connection's life."""
    conn.add_notify_handler(_drop)


def _drop(notify: Any) -> None:
    pass


_replans = itertools.count()


def _replan(conn: Conn) -> None:
    """Drop ``conn``'s prepared statements, and psycopg forgets them: each is planned again.
    psycopg notices a ``DEALLOCATE ALL`` by its result, but only for a statement text it has
    not counted yet (one it counted is not looked at again), so each text is new. The
    statement before it succeeded; a connection this fails on is closed, and its plans with
    it, and the pool replaces it."""
    try:
        conn.execute(b"DEALLOCATE ALL /* %d */" % next(_replans), prepare=False)
    except psycopg.Error:
        conn.close()


def _job(row: Row) -> Job:
    return job_from_row(row, to_time=_utc, to_errors=_errors)


def _errors(text: str) -> tuple[AttemptError, ...]:
    # Read as text: most jobs have no errors, and "[]" needs no JSON decoding.
    if text == "[]":
        return ()
    return tuple(AttemptError.from_json(e) for e in json.loads(text))


def _utc(moment: datetime) -> datetime:
    # psycopg returns the session's zone; records carry UTC.
    return moment if moment.tzinfo is UTC else moment.astimezone(UTC)


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


#: Tabs in a COPY line of ``job_copy``'s eleven columns.
_COPY_TABS = 10


class _CopyShape:
    """What the COPY lines of jobs alike share (the same name, queue, tenant, priority,
    attempts, run_at and delay, as the jobs of one enqueue have): the text between the id
    and the input (name, queue), around the tenant, and after the key (priority, state,
    attempts, run_at, created_at: ``at`` is the database's clock, read in the transaction),
    each escaped for COPY; whether such a job is due now; and how many backslashes a line of
    theirs holds when the id, input and key need no escaping (the ``\\N`` of no tenant, and
    the escapes of the shape's own text)."""

    __slots__ = ("backslashes", "due", "middle", "tail", "tenant")

    def __init__(self, job: NewJob, at: datetime, at_text: str) -> None:
        run_at = job.run_at
        if run_at is None and job.delay is not None:
            run_at = at + job.delay
        self.due = run_at is None or run_at <= at
        self.middle = f"\t{_escaped(job.name)}\t{_escaped(job.queue)}\t"
        self.tenant = "\t\\N\t" if job.tenant_id is None else f"\t{_escaped(job.tenant_id)}\t"
        state = "available" if self.due else "scheduled"
        run_at_text = at_text if run_at is None else run_at.isoformat()
        self.tail = (
            f"\t{int(job.priority)}\t{state}\t{int(job.max_attempts)}\t{run_at_text}\t{at_text}"
        )
        self.backslashes = self.middle.count("\\") + self.tenant.count("\\")


def _copy_lines(slices: Iterable[Sequence[NewJob]], at: datetime, due: set[str]) -> Iterator[str]:
    """The COPY text of ``slices`` of jobs, one text a slice (each slice built as it is
    reached, when the jobs are a ``NewJobs``), adding the queue of each due job to ``due``.
    Raises ``_NotCopyable`` at a job COPY cannot take, or a key repeated in the batch.

    The jobs of one enqueue share all but their id, input and key: the rest of their line is
    made once for each run of jobs alike (``_CopyShape``), told apart from the job before by
    identity (a builder's jobs share the objects). This is cheaper than psycopg's
    ``write_row``, which dumps each datetime."""
    at_text = at.isoformat()
    keys: set[tuple[str | None, str]] = set()
    shape: _CopyShape | None = None
    last: NewJob | None = None
    for batch in slices:
        lines = []
        for j in batch:
            key = (j.tenant_id, j.idempotency_key)
            if key in keys or not _copyable(j):
                raise _NotCopyable
            keys.add(key)
            if (
                shape is None
                or last is None
                or j.name is not last.name
                or j.queue is not last.queue
                or j.tenant_id is not last.tenant_id
                or j.priority is not last.priority
                or j.max_attempts is not last.max_attempts
                or j.run_at is not last.run_at
                or j.delay is not last.delay
            ):
                shape = _CopyShape(j, at, at_text)
                if shape.due:
                    due.add(j.queue)
            last = j
            line = f"{j.id}{shape.middle}{j.input}{shape.tenant}{j.idempotency_key}{shape.tail}"
            if (
                line.count("\\") != shape.backslashes
                or line.count("\t") != _COPY_TABS
                or "\n" in line
                or "\r" in line
            ):
                line = _copy_escaped(j, shape)
            lines.append(line)
        lines.append("")
        yield "\n".join(lines)


def _copy_escaped(job: NewJob, shape: _CopyShape) -> str:
    """The COPY line of a job whose id, input or key needs backslash escapes (the slow path:
    translate is slow, so lines are escaped only when their text shows a special character);
    the shape's text is escaped already."""
    return (
        f"{_escaped(job.id)}{shape.middle}{_escaped(job.input)}{shape.tenant}"
        f"{_escaped(job.idempotency_key)}{shape.tail}"
    )


def _escaped(text: str) -> str:
    """``text`` as a COPY text value: backslashes, tabs and line ends escaped."""
    return text.translate(_COPY_ESCAPES)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _lease_arrays(leases: Sequence[Lease]) -> dict[str, list[str]]:
    # Sorted by id so that two batches over the same rows lock them in the same order.
    ordered = sorted(leases, key=lambda lease: lease.id)
    return {
        "ids": [lease.id for lease in ordered],
        "tokens": [lease.token for lease in ordered],
    }


def _filter_params(where: JobFilter) -> dict[str, Any]:
    return {
        "states": sorted(s.value for s in where.states) if where.states is not None else None,
        "queue": where.queue,
        "name": where.name,
        "tenant_id": where.tenant_id,
        "ids": list(where.ids) if where.ids is not None else None,
        "min_id": where.min_id,
    }


_poll = getattr(select, "poll", None)


def _ended(conn: Conn) -> bool:
    """True when an idle pooled connection's session is over: the server (or a proxy) closed
    it or sent a FATAL error, which leaves the socket readable. Costs one poll(2), no round
    trip, unlike a ``SELECT 1`` check."""
    if conn.closed or conn.broken:
        return True
    try:
        fd = conn.fileno()
    except psycopg.Error:
        return True
    if _poll is not None:
        poller = _poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


if TYPE_CHECKING:
    # mypy proves here that the class satisfies the protocol, signature by signature.
    _conforms: Driver = PostgresDriver("")
