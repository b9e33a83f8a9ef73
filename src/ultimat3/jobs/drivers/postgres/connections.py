"""The connections of the PostgreSQL driver: psycopg_pool as it is, the bounds and the
watchdog around every call, the translation of psycopg's errors (``dialects.postgres``, shared
with the outbox store), and the lease renewals' connection of their own."""

from __future__ import annotations

import hashlib
import itertools
import json
import select
import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ultimat3.jobs import events
from ultimat3.jobs import sql as sql_files
from ultimat3.jobs.clock import Backoff, Clock, SystemClock
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
    in_savepoint,
    jobs_named,
    listed,
    masked_dsn,
    migration_plan,
    our_cursor,
    raise_translated,
    translate,
)
from ultimat3.jobs.dialects.postgres import first_line as _first_line
from ultimat3.jobs.driver import (
    DatabaseId,
    Joined,
    StallTracker,
    close_at_exit,
    renew_after_fork,
)
from ultimat3.jobs.drivers import pool_log
from ultimat3.jobs.drivers.postgres.watchdog import Watchdog, cut_off
from ultimat3.jobs.errors import ConfigurationError, DriverUnavailableError
from ultimat3.jobs.records import AttemptError, Job, JobState, NewJob, job_from_row

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq
    from psycopg import sql as pg_sql
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

    from ultimat3.jobs.drivers.postgres.listen import Finished, Listener

    _IDLE = pq.TransactionStatus.IDLE
    _INTRANS = pq.TransactionStatus.INTRANS
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    MISSING: ImportError | None = _exc
else:
    MISSING = None

if TYPE_CHECKING:
    Conn = psycopg.Connection[Any]
else:
    Conn = Any
Row = tuple[Any, ...]

_T = TypeVar("_T")
_SYSTEM = SystemClock()
_NAME = "postgres"
#: How long a call waits for a pooled connection before it checks that the server is up, and
#: then how much longer before it raises (the pool is exhausted).
_QUICK_WAIT = 0.5
_POOL_WAIT = 5.0
#: One reconnection attempt chain of the pool gives up after this long; the next call starts a
#: fresh chain (first attempt at once), which keeps the pool's exponential backoff short.
_RECONNECT_WINDOW = 5.0
#: How long one LISTEN wait lasts before ``wake`` and the deadline are checked again.
_WAIT_SLICE = 0.1
#: A statement of ours slower than this has the plans of its connection made again (``_attempts``).
_REPLAN_AFTER = 0.02
#: The listener checks that it still LISTENs after this much silence.
_PROBE_AFTER = 30.0
#: Polling without LISTEN: the longest gap between two looks while idle (``poll``).
_POLL = 0.5
#: How long the pooler check waits for its NOTIFY, then, when the server cannot tell that the
#: connection is direct, how much longer for that one or a second one (``_check_pooler``).
_PROBE_WAIT = 1.0
_PROBE_CONFIRM = 5.0
#: How long a presence beat waits for a lease renewal on their shared connection before it
#: takes a pooled one, and its timeouts there: a renewal waits no longer for a beat.
_BEAT_WAIT = 1.0
#: The LISTEN connection's reconnections: 0.25 s, doubling, at most 5 s apart.
_LISTEN_BACKOFF = Backoff(first=0.25, cap=5.0)
_STATES = {state.value: state for state in JobState}
_MICROSECOND = timedelta(microseconds=1)
MIGRATE_FIX = "run `ultimat3-jobs migrate` (or driver.migrate()) against this database"
ADOPT_FIX = (
    "pass a psycopg 3 Connection to the job database (or the executor that "
    "driver.transaction() yields); SQLAlchemy and Django connections go through their "
    "integrations"
)


class Connections(Migrations):
    """The settings (``PostgresDriver``'s) and connections of a ``PostgresDriver``, and the
    statements it runs on them (``_fetch``, ``_pipelined``, ``_exec``)."""

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
        clock: Clock = _SYSTEM,
        wait_slice: float = _WAIT_SLICE,
        probe_after: float = _PROBE_AFTER,
        probe_wait: float = _PROBE_WAIT,
        probe_confirm: float = _PROBE_CONFIRM,
        beat_wait: float = _BEAT_WAIT,
    ) -> None:
        check_setup(
            MISSING,
            what="postgres driver",
            needs="psycopg 3 and psycopg_pool",
            driver=_NAME,
            schema=schema,
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
            self._connect_kwargs = connect_settings(dsn, application_name)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(
                f"the PostgreSQL URL is not valid: {exc}",
                fix="write postgresql://user:password@host:5432/dbname or a libpq conninfo string",
            ) from None
        self.display_url = masked_dsn(dsn)
        self._clock = clock
        self._wait_slice = wait_slice
        self._probe_after = probe_after
        self._probe_wait, self._probe_confirm = probe_wait, probe_confirm
        self._beat_wait = beat_wait
        self._dsn = dsn
        self._schema = schema
        self._channel = schema
        #: Where completions, dead ends and cancels are announced (``listen.Finished``).
        self._finished_channel = f"{schema}:finished"
        self.pooler = pooler
        self._listen = listen if listen is not None else pooler != "transaction"
        #: Nothing of ours may outlive a transaction: no prepared statement (nor LISTEN).
        self._stateless = pooler == "transaction" or not self._listen
        self._prepare: bool | None = False if self._stateless else None
        #: Whether to check, once, that NOTIFY reaches LISTEN (``waiting._check_pooler``).
        self._probe_pooler = pooler == "none" and self._listen
        self._poll = poll
        self._pool_max = pool_max
        #: Seconds; the server cancels a statement of ours past these.
        self.statement_timeout = statement_timeout
        self.lock_timeout = lock_timeout
        self._bounds = bounds_sql(statement_timeout, lock_timeout, idle=statement_timeout)
        #: A presence beat on the renewals' connection: short, so a renewal never waits long.
        self._beat_bounds = bounds_sql(
            min(statement_timeout, beat_wait), min(lock_timeout, beat_wait), idle=None
        )
        #: On a direct connection the bounds are session settings of each pooled connection
        #: (``_configure``); behind a transaction pooler every transaction of ours sets them.
        self._session_bounds = not self._stateless
        self._bounds_session = bounds_sql(
            statement_timeout, lock_timeout, idle=statement_timeout, session=True
        )
        #: Pooled connections that served a caller's transaction, which may have changed the
        #: session's settings: the next statement of ours on each sets the bounds again.
        self._rebound: weakref.WeakSet[Conn] = weakref.WeakSet()
        #: A call without a reply this long after it was sent is cut off by the client.
        self.call_budget = statement_timeout + max(1.0, statement_timeout / 2)
        self._watch = Watchdog(self.call_budget, clock)
        quoted = pg_sql.Identifier(schema).as_string(None)
        self._jobs_table = f"{quoted}.x_jobs"
        self._q: dict[str, bytes] = {
            name: text.replace("{schema}", quoted).encode()
            for name, text in sql_files.queries(_NAME).items()
        }
        self._migrations, self._migrate_key = migration_plan(
            sql_files.migrations(_NAME),
            quoted_schema=quoted,
            ledger=f"{quoted}.x_migrations",
            lock_name=f"migrate:{schema}",
        )

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
        #: A call slower than this, or failing to reach the server, counts as a stall, timed
        #: and stamped on the driver's clock (real time when opened by URL).
        self.stalls = StallTracker(threshold=1.0, clock=self._clock)

        #: The lease renewals' connection, outside the pool (``_on_renewer``).
        self._renewer: Conn | None = None
        self._renewer_since = 0.0  # when it connected: replaced after the pool's max_lifetime
        self._renew_lock = threading.Lock()
        #: Held to close the renewals' connection and to shut its socket down (``close``):
        #: the socket is never shut down after its descriptor was freed (and perhaps reused).
        self._renewer_end = threading.Lock()
        #: The one LISTEN connection, for new jobs and finished ones (``listen.Listener``).
        self._listener = self._new_listener()
        self._finished = Finished(self._listener, self._finished_channel, clock, wait_slice)
        #: Wake-ups so far: an insert of ours (polling) or a notification (LISTEN). Each thread
        #: counts from its last claim or wait (``_counts.seen``), so a job committed between a
        #: claim that found nothing and the wait after it ends that wait.
        self._wake_seq = 0
        self._counts = threading.local()
        self._listen_lost = False
        #: Some thread counts wake-ups from before now: the first LISTEN after wakes waiters.
        self._counting = False
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

    if TYPE_CHECKING:  # given by ``PostgresDriver`` (``__init__.py``), which composes the parts

        def identity(self, *, refresh: bool = False) -> DatabaseId: ...
        def adopt(self, connection: Any) -> Joined: ...
        def close(self) -> None: ...
        def _after_fork(self) -> None: ...

    def _new_listener(self) -> Listener:
        return Listener(
            lambda: connect(self._dsn, self._connect_kwargs),
            clock=self._clock,
            backoff=_LISTEN_BACKOFF,
            probe_after=self._probe_after,
            ping=self._q["ping"],
            watch=self._watch,
        )

    def _closed_error(self) -> DriverUnavailableError:
        return DriverUnavailableError(
            f"the driver for {self.display_url} is closed",
            driver=_NAME,
            fix="open a new driver (or App) instead of using a closed one",
        )

    def _fetch(
        self, name: str | bytes, params: dict[str, Any], *, prepare: bool | None = None
    ) -> list[Row]:
        """Run one statement (a query name, or the text itself) on a pooled connection, as its
        own transaction (``_attempts``), and return its rows."""
        query = self._q[name] if isinstance(name, str) else name
        return self._attempts(
            lambda conn: self._exec(conn, query, params, bounded=True, prepare=prepare).fetchall()
        )

    def _write_only(self, name: str, params: dict[str, Any]) -> None:
        """Run one statement that returns no rows, as ``_fetch`` runs one that does."""
        query = self._q[name]
        self._attempts(lambda conn: self._exec(conn, query, params, bounded=True))

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
        time; retried whole after a deadlock (rolled back whole).

        A body slower than ``_REPLAN_AFTER`` drops the connection's prepared statements
        (``_replan``): a generic plan made while ``x_jobs`` was a few rows keeps scanning it
        after a burst of enqueues made it big, until an ANALYZE."""
        for attempt in range(3):
            started = self._clock.monotonic()
            conn = self._checkout()
            self._watch.arm(conn)
            try:
                began = self._clock.monotonic()
                result = body(conn)
                ended = self._clock.monotonic()
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
        """A new pooled connection: notifications ignored (behind a transaction-mode pooler a
        session some client once LISTENed on delivers to whoever holds it next, and psycopg
        would keep them all, unread); on a direct connection, our bounds as session settings."""
        conn.add_notify_handler(_drop)
        if self._session_bounds:
            conn.execute(self._bounds_session, prepare=False)

    def _connection(self, *, guard: bool = True) -> _Lent:
        """A pooled connection for a call of ours, cut off by the watchdog if it gets no
        reply in time (``guard``; not for a transaction handed to a caller)."""
        return _Lent(self, guard)

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
        if self._clock.monotonic() - self._reachable_at > 1.0:
            try:
                connect(self._dsn, self._connect_kwargs).close()
            except psycopg.OperationalError as exc:
                raise DriverUnavailableError(
                    f"cannot connect to PostgreSQL at {self.display_url}: {_first_line(exc)}",
                    driver=_NAME,
                    fix="check that the server is running and reachable with this URL and "
                    "its credentials; a running worker keeps retrying until it is back, a "
                    "command or a starting worker exits (run it again once it is back)",
                ) from exc
            self._reachable_at = self._clock.monotonic()
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
            check_joinable(conn, fix=ADOPT_FIX)  # closed, or failed: says so
        return conn

    def _joined(
        self, executor: Joined, jobs: Sequence[NewJob] = ()
    ) -> AbstractContextManager[Conn]:
        """Run inside the caller's transaction, in a SAVEPOINT
        (``dialects.postgres.in_savepoint``). ``jobs``: the jobs written, which an error names."""
        conn = self._joined_conn(executor)
        return in_savepoint(
            conn,
            driver=_NAME,
            describe=lambda: _described(jobs),
            translate=lambda exc: self._noted(exc, conn),
            prepare=self._prepare,
        )

    def _reraise(self, exc: psycopg.Error, conn: Conn) -> NoReturn:
        raise_translated(exc, lambda exc: self._noted(exc, conn))

    def _noted(self, exc: psycopg.Error, conn: Conn) -> Exception:
        """The ``JobsError`` for a psycopg error of ours (``dialects.postgres.translate``),
        noting an unavailable database in ``stalls``."""
        translated = translate(
            exc,
            url=self.display_url,
            driver=_NAME,
            missing="the job tables are missing",
            migrate_fix=MIGRATE_FIX,
            broken=conn.broken,
            recovers="calls are retried by the worker's loops, and the pool replaces broken "
            "connections",
            cut_off=self.call_budget if self._watch.fired(conn) else None,
        )
        if isinstance(translated, DriverUnavailableError):
            self.stalls.note_failure()
        return translated

    def _on_renewer(
        self,
        query: bytes,
        params: dict[str, Any],
        *,
        rows: bool = True,
        wait: float | None = None,
        bounds: bytes | None = None,
    ) -> list[Row] | None:
        """Run one statement on the lease renewals' connection, outside the pool, so that
        handlers holding every pooled connection cannot starve the heartbeat. ``rows=False``:
        no rows to read; ``wait``: None when another statement still holds the connection
        after that many seconds; ``bounds``: its own timeouts, for this statement only.
        Replaced after any error and after the pool's ``max_lifetime``."""
        if not self._renew_lock.acquire(timeout=-1 if wait is None else wait):
            return None
        try:
            if self._closed:
                self._drop_renewer()
                raise self._closed_error()
            conn = self._renewer
            if conn is not None and (
                _ended(conn)  # a restart, a terminated session
                or self._clock.monotonic() - self._renewer_since >= self._pool.max_lifetime
            ):
                self._drop_renewer()
                conn = None
            if conn is None:
                conn = self._connect_renewer()
            started = self._clock.monotonic()
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
            self.stalls.note_wait(self._clock.monotonic() - started)
            return got
        finally:
            if self._closed:  # closed during this call (``close`` did not get the lock)
                self._drop_renewer()
            self._renew_lock.release()

    def _connect_renewer(self) -> Conn:
        """Connect the renewals' connection (under ``_renew_lock``). Closed again on any
        failure after the connect, and when the driver was closed meanwhile."""
        try:
            conn: Conn = connect(self._dsn, self._connect_kwargs, stateless=self._stateless)
        except psycopg.Error as exc:
            raise self._renewer_unavailable(exc) from exc
        try:
            with self._watch.watching(conn):
                self._configure(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise self._renewer_unavailable(exc) from exc
            raise
        self._renewer, self._renewer_since = conn, self._clock.monotonic()
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
            if conn is not None and not conn.closed:
                cut_off(conn)


class _Lent:
    """``Connections._connection``: the connection checked out on entry (and armed on the
    watchdog when ``guard``); on exit a psycopg error of the block is translated, and the
    connection disarmed and given back to the pool. A class, not a generator: it is entered
    on every enqueue."""

    __slots__ = ("_conn", "_guard", "_owner")

    def __init__(self, owner: Connections, guard: bool) -> None:
        self._owner = owner
        self._guard = guard

    def __enter__(self) -> Conn:
        owner = self._owner
        conn = self._conn = owner._checkout()
        if self._guard:
            owner._watch.arm(conn)
        return conn

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: Any
    ) -> None:
        owner, conn = self._owner, self._conn
        try:
            if exc is None:
                if pool_log.OWNER.down:  # a statement went through: the outage is over
                    pool_log.OWNER.recovered()
            elif isinstance(exc, psycopg.Error):
                owner._reraise(exc, conn)
        finally:
            if self._guard:
                owner._watch.disarm(conn)
            owner._putconn(conn)


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


def _drop(notify: Any) -> None:
    pass


_replans = itertools.count()


def _replan(conn: Conn) -> None:
    """Drop ``conn``'s prepared statements, and psycopg forgets them: each is planned again.
    psycopg notices a ``DEALLOCATE ALL`` only in a text it has not counted yet, so each text
    is new. A connection this fails on is closed, and the pool replaces it."""
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


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_poll = getattr(select, "poll", None)


def _ended(conn: Conn) -> bool:
    """True when an idle pooled connection's session is over: the server (or a proxy) closed
    it or sent a FATAL error, which leaves the socket readable. Costs one poll(2), no round
    trip, unlike a ``SELECT 1`` check."""
    if conn.closed:  # a broken connection is closed too
        return True
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return True
    if _poll is not None:
        poller = _poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)
