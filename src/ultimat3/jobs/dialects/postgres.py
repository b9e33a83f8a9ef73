"""PostgreSQL plumbing shared by the job driver and the outbox store, so their connections,
timeouts, savepoints and errors cannot drift apart: connecting (``connect``,
``CONNECT_DEFAULTS``), a caller's connection (``identify``, ``check_joinable``,
``our_cursor``), writes in a caller's transaction (``in_savepoint``), timeouts
(``bounds_sql``), migrations and error translation (``translate``).

psycopg is imported by the callers (which need the ``[postgres]`` extra); this module only
touches the objects they pass.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

from ultimat3.jobs.driver import DatabaseId
from ultimat3.jobs.errors import (
    ConfigurationError,
    DriverUnavailableError,
    EnqueueRefusedError,
    JobsError,
    SerializationError,
    in_callers_transaction,
)
from ultimat3.jobs.records import NewJob

if TYPE_CHECKING:
    import psycopg


__all__ = [
    "CONNECT_DEFAULTS",
    "UNBOUNDED_SQL",
    "Migrations",
    "applied_versions",
    "apply_migrations",
    "bounds_sql",
    "check_bounds",
    "check_joinable",
    "check_setup",
    "connect",
    "connect_settings",
    "first_line",
    "identify",
    "in_savepoint",
    "jobs_named",
    "listed",
    "masked_dsn",
    "migration_plan",
    "our_adapters",
    "our_cursor",
    "raise_translated",
    "refused",
    "translate",
]


@functools.cache
def _psycopg() -> Any:
    """psycopg (with ``pq``, ``rows`` and ``adapt``), imported on first use: this module is
    imported without the ``[postgres]`` extra too."""
    import psycopg
    import psycopg.adapt
    import psycopg.rows

    return psycopg


#: libpq settings applied unless the DSN sets them: detect dead peers within about 30 s.
CONNECT_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}

#: Which database a connection reaches; the last column says whether %(table)s is there.
IDENTITY_SQL = b"""
SELECT current_database(),
       (SELECT oid FROM pg_database WHERE datname = current_database()),
       pg_postmaster_start_time(),
       to_regclass(%(table)s) IS NOT NULL
"""


def applied_versions(conn: Any, queries: dict[str, bytes], schema: str) -> set[int]:
    """The migration versions recorded in ``schema``'s ledger (none when it has no ledger yet),
    read with the ``migrate_has_ledger`` and ``migrate_applied`` queries of the caller."""
    row = conn.execute(queries["migrate_has_ledger"], {"schema": schema}, prepare=False).fetchone()
    if not (row and row[0]):
        return set()
    return {r[0] for r in conn.execute(queries["migrate_applied"], prepare=False)}


def migration_plan(
    migrations: Sequence[tuple[int, str]], *, quoted_schema: str, ledger: str, lock_name: str
) -> tuple[list[tuple[int, str]], int]:
    """The steps of a set of migrations for one schema (each also records its version in the
    ``ledger`` table) and the key of the advisory lock that serialises them."""
    steps = [
        (
            version,
            text.replace("{schema}", quoted_schema).rstrip()
            + f"\n\nINSERT INTO {ledger} (version) VALUES ({version})"
            " ON CONFLICT (version) DO NOTHING;\n",
        )
        for version, text in migrations
    ]
    digest = hashlib.blake2b(f"ultimat3-jobs:{lock_name}".encode(), digest_size=8)
    return steps, int.from_bytes(digest.digest(), "big", signed=True)


def apply_migrations(
    conn: Any,
    queries: dict[str, bytes],
    schema: str,
    lock_key: int,
    known: list[tuple[int, str]],
    *,
    lock_timeout: float | None = None,
) -> list[int]:
    """Apply the migrations of ``known`` not yet recorded, in the caller's transaction, under
    ``pg_advisory_xact_lock(lock_key)`` (racers queue, then find the work done); DDL waits for
    a table lock at most ``lock_timeout``. Returns the versions applied."""
    conn.execute(queries["migrate_lock"], {"key": lock_key}, prepare=False)
    if lock_timeout is not None:
        conn.execute(
            f"SELECT set_config('lock_timeout', '{max(1, round(lock_timeout * 1000))}', true)",
            prepare=False,
        )
    done = applied_versions(conn, queries, schema)
    applied = []
    for version, text in known:
        if version not in done:
            conn.execute(text.encode(), prepare=False)
            applied.append(version)
    return applied


class Migrations:
    """The schema of a store of ours (the driver's, the outbox store's): its migration plan
    (``migration_plan``), whether it is applied, and applying the rest."""

    _q: dict[str, bytes]
    _schema: str
    _migrations: list[tuple[int, str]]
    _migrate_key: int
    lock_timeout: float

    def migration_sql(self) -> list[tuple[int, str]]:
        return list(self._migrations)

    def _current_on(self, conn: Any) -> bool:
        done = applied_versions(conn, self._q, self._schema)
        return all(version in done for version, _ in self._migrations)

    def _migrate_on(self, conn: Any) -> list[int]:
        """``apply_migrations`` in ``conn``'s open transaction."""
        return apply_migrations(
            conn,
            self._q,
            self._schema,
            self._migrate_key,
            self._migrations,
            lock_timeout=self.lock_timeout,
        )


def connect_settings(dsn: str, application_name: str) -> dict[str, Any]:
    """The keyword arguments of every connection of ours to ``dsn``: ``CONNECT_DEFAULTS``
    where the DSN does not set them, and the session's ``application_name``."""
    given = _psycopg().conninfo.conninfo_to_dict(dsn)
    settings: dict[str, Any] = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in given}
    settings["application_name"] = application_name
    return settings


def connect(dsn: str, settings: dict[str, Any], *, stateless: bool = False) -> Any:
    """A connection of our own (autocommit), for the driver's LISTEN, lease renewals and
    pooler check and for the outbox store. ``stateless``: nothing prepared (a transaction-
    mode pooler in between)."""
    extra: dict[str, Any] = {"prepare_threshold": None} if stateless else {}
    return _psycopg().connect(dsn, autocommit=True, **settings, **extra)


#: SQLSTATE classes that mean "the server cannot serve us now": connection exception,
#: insufficient resources, operator intervention (admin shutdown, query cancelled), system
#: error, transaction rollback (serialization failure, deadlock).
_RETRYABLE_CLASSES = ("08", "53", "57", "58", "40")
#: Read-only transaction (a standby, a failover), lock not available (lock_timeout).
_RETRYABLE_STATES = frozenset({"25006", "55P03"})


def translate(
    exc: Any,
    *,
    url: str,
    driver: str,
    missing: str,
    migrate_fix: str,
    broken: bool,
    recovers: str,
    cut_off: float | None = None,
) -> JobsError:
    """The ``JobsError`` for a psycopg error of a statement of ours (the driver's and the
    outbox store's). ``missing``: what a missing schema lacks; ``recovers``: what retries or
    heals by itself; ``broken``: the connection is broken; ``cut_off``: the watchdog's budget,
    when it cut the call off."""
    pg = _psycopg()
    state = exc.sqlstate or ""
    message = first_line(exc)
    if isinstance(exc, _missing_schema()):
        return DriverUnavailableError(
            f"{missing} in {url}: {message}",
            driver=driver,
            fix=migrate_fix,
            retryable=False,
        )
    if isinstance(exc, pg.DataError):
        return SerializationError(
            f"PostgreSQL refused a value: {message}",
            fix="pass JSON text the serializer made, and values within the documented bounds",
        )
    if cut_off is not None:
        return DriverUnavailableError(
            f"PostgreSQL at {url} sent no reply within {cut_off:g} s, so the connection was "
            "cut off (a stalled network, proxy or pooler; the server may or may not have run "
            "the statement)",
            driver=driver,
            fix="check the network path and any pooler in front of the server; the pool "
            "replaces the connection and the worker's loops retry by themselves",
            retryable=True,
        )
    if (
        broken
        or isinstance(exc, pg.InterfaceError)
        or not state
        or state.startswith(_RETRYABLE_CLASSES)
        or state in _RETRYABLE_STATES
    ):
        if state == "25006":
            cause = f"PostgreSQL at {url} is read-only: {message}"
            fix = (
                "the server is a standby or in a failover; point the URL at the primary "
                f"(libpq's target_session_attrs=read-write); {recovers}"
            )
        else:
            cause = f"PostgreSQL at {url} failed: {message}"
            fix = f"check that the server is running and reachable; {recovers}"
        return DriverUnavailableError(cause, driver=driver, fix=fix, retryable=True)
    return DriverUnavailableError(
        f"PostgreSQL at {url} refused a statement of ultimat3-jobs (SQLSTATE {state}): {message}",
        driver=driver,
        fix="check that the schema is the one `ultimat3-jobs migrate` made; if it is, "
        "this is a bug: please report it with this message",
        retryable=False,
    )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def masked_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***``."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostinfo = netloc.rpartition("@")
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{hostinfo}"
        query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    return re.sub(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def check_joinable(conn: Any, *, fix: str) -> None:
    """Raise ``ConfigurationError`` unless we may write in ``conn``'s transaction."""
    pg = _psycopg()
    if isinstance(conn, pg.AsyncConnection):
        raise ConfigurationError(
            "an async psycopg connection cannot be joined directly",
            fix="use `async with ultimat3.jobs.integrations.psycopg.using(app, conn):` and "
            "`await app.enqueue_async(...)`",
        )
    if not isinstance(conn, pg.Connection):
        raise ConfigurationError(f"cannot join a {type(conn).__name__}", fix=fix)
    if conn.closed:
        raise ConfigurationError(
            "the connection is closed", fix="enqueue on an open connection, inside its transaction"
        )
    if conn.pgconn.transaction_status == pg.pq.TransactionStatus.INERROR:
        raise ConfigurationError(
            "the connection's transaction has failed and can only be rolled back, so a job "
            "written in it could never commit",
            fix="roll the transaction back (or fix the statement that failed), then enqueue in "
            "a new one",
        )


def identify(conn: Any, table: str, label: str) -> tuple[DatabaseId, bool]:
    """The database ``conn`` reaches and whether ``table`` exists there; an idle
    non-autocommit connection is rolled back afterwards. A positive answer is kept per
    connection object (psycopg never reconnects one); a missing table is asked again."""
    try:
        known = _IDENTIFIED.get(conn)
    except TypeError:  # not weakly referenceable: not a psycopg connection, asked below
        known = None
    if known is not None and table in known:
        return DatabaseId("postgres", known[table], label), True
    pg = _psycopg()
    idle = conn.pgconn.transaction_status == pg.pq.TransactionStatus.IDLE and not conn.autocommit
    try:
        row = our_cursor(conn).execute(IDENTITY_SQL, {"table": table}, prepare=False).fetchone()
    except pg.Error as exc:
        raise ConfigurationError(
            f"cannot check where the connection points: {first_line(exc)}",
            fix="pass an open psycopg 3 Connection",
        ) from None
    finally:
        if idle:
            conn.rollback()
    assert row is not None
    name, oid, started, has_table = row
    if has_table:
        with _IDENTIFIED_LOCK:
            _IDENTIFIED.setdefault(conn, {})[table] = (name, oid, started)
    return DatabaseId("postgres", (name, oid, started), label), bool(has_table)


def our_cursor(conn: Any) -> psycopg.Cursor[Any]:
    """A cursor for one statement of ours on ``conn``, which may be a caller's: tuple rows,
    ``%s`` placeholders and psycopg's process-wide adapters (``our_adapters``), whatever
    cursor class, row factory, loaders or dumpers the connection was given."""
    pg = _psycopg()
    cursor: psycopg.Cursor[Any]
    if issubclass(conn.cursor_factory, pg.RawCursor):  # $1 placeholders
        cursor = pg.Cursor(conn, row_factory=pg.rows.tuple_row)
    else:
        cursor = conn.cursor(row_factory=pg.rows.tuple_row)
    for register, key, adapter in our_adapters(conn):
        getattr(cursor.adapters, register)(key, adapter)
    return cursor


def our_adapters(conn: Any) -> list[tuple[str, Any, Any]]:
    """The registrations (``register_loader``/``register_dumper``, key, class) that put
    psycopg's process-wide adapters back on a cursor of ``conn`` for the types our statements
    read and send, where ``conn`` registered others: none for most connections. Worked out
    once per connection object (a registration made on it later is not seen)."""
    try:
        known = _ADAPTERS.get(conn)
    except TypeError:  # not weakly referenceable: ask each time
        known = None
    if known is not None:
        return known
    pg = _psycopg()
    pq, PyFormat = pg.pq, pg.adapt.PyFormat
    ours, theirs = pg.adapters, conn.adapters
    found: list[tuple[str, Any, Any]] = []
    for name in _READ_TYPES:
        oid = ours.types[name].oid
        for fmt in (pq.Format.TEXT, pq.Format.BINARY):
            loader = ours.get_loader(oid, fmt)
            if loader is not None and theirs.get_loader(oid, fmt) is not loader:
                found.append(("register_loader", oid, loader))
    for cls in _SENT_TYPES:
        # AUTO (a %s) last: registering a dumper also makes it its type's AUTO choice.
        for py_fmt in (PyFormat.TEXT, PyFormat.BINARY, PyFormat.AUTO):
            dumper = ours.get_dumper(cls, py_fmt)
            if theirs.get_dumper(cls, py_fmt) is not dumper:
                found.append(("register_dumper", cls, dumper))
    try:
        _ADAPTERS[conn] = found
    except TypeError:
        pass
    return found


#: The types our statements read, by name, and the Python types they send.
_READ_TYPES = (
    "text", "varchar", "name", "bool", "int2", "int4", "int8", "oid", "timestamptz",
    "interval", "uuid", "json", "jsonb",
)  # fmt: skip
_SENT_TYPES: tuple[type, ...] = (str, int, bool, datetime, timedelta)
#: our_adapters' answers, per connection object (weakly).
_ADAPTERS: weakref.WeakKeyDictionary[Any, list[tuple[str, Any, Any]]] = weakref.WeakKeyDictionary()


#: identify's answers, per connection (weakly: a closed, dropped connection goes) and table:
#: the database key of the connection where that table exists. Not ``outbox.KnownDatabases``
#: (which database a caller's connection was joined as, SQLite's too): this one also answers
#: ``identity(refresh=True)`` on the driver's and the store's own pooled connections.
_IDENTIFIED: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, ...]]] = (
    weakref.WeakKeyDictionary()
)
_IDENTIFIED_LOCK = threading.Lock()


#: Defaults: a statement of ours that runs (or waits for a row lock) longer than this is
#: cancelled by the server; both are well under the shortest sensible lease.
STATEMENT_TIMEOUT = 10.0
LOCK_TIMEOUT = 5.0

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_setup(
    missing: ImportError | None, *, what: str, needs: str, driver: str, schema: str
) -> None:
    """Refuse a driver or store (``what``) without psycopg (``missing``: the import's error;
    ``needs``: what it needs), or with a schema name we would not quote safely."""
    if missing is not None:
        raise DriverUnavailableError(
            f"the {what} needs {needs}: {missing}",
            driver=driver,
            fix='pip install "ultimat3-jobs[postgres]"',
        )
    if not _SCHEMA.match(schema):
        raise ConfigurationError(
            f"the schema name {schema!r} is not allowed",
            fix="use 1 to 63 lowercase letters, digits and underscores, not starting with "
            'a digit (default "ultimat3_jobs")',
        )


def check_bounds(statement_timeout: float, lock_timeout: float) -> None:
    """Refuse timeouts that cannot work, naming the option."""
    for name, value in (("statement_timeout", statement_timeout), ("lock_timeout", lock_timeout)):
        if not 0.001 <= value <= 3600:
            raise ConfigurationError(
                f"{name}={value:g}s is not a timeout for one statement of ours",
                fix=f"use a {name} from 1ms to 1h (default {STATEMENT_TIMEOUT if name == 'statement_timeout' else LOCK_TIMEOUT:g}s)",
            )
    if lock_timeout > statement_timeout:
        raise ConfigurationError(
            f"lock_timeout={lock_timeout:g}s is longer than statement_timeout="
            f"{statement_timeout:g}s, so it could never fire",
            fix="use a lock_timeout shorter than the statement_timeout",
        )


def bounds_sql(
    statement_timeout: float, lock_timeout: float, idle: float | None, *, session: bool = False
) -> bytes:
    """One statement setting the timeouts of the current transaction only
    (``set_config(..., true)`` is ``SET LOCAL``), or with ``session`` those of the session
    (``SET``). Values are whole milliseconds written into the text, so the statement is a
    constant (prepared once where statements may be)."""
    settings = [("statement_timeout", statement_timeout), ("lock_timeout", lock_timeout)]
    if idle is not None:
        settings.append(("idle_in_transaction_session_timeout", idle))
    local = "false" if session else "true"
    calls = ", ".join(
        f"set_config('{name}', '{max(1, round(value * 1000))}', {local})"
        for name, value in settings
    )
    return f"SELECT {calls}".encode()


#: In a transaction on a connection whose session carries our bounds: the timeouts the session
#: had before we set them (its server, role, database and connect-time settings), for this
#: transaction only, so a caller's statements (or a migration's) run as on their own connection.
UNBOUNDED_SQL = (
    b"SELECT set_config(name, reset_val, true) FROM pg_settings WHERE name IN "
    b"('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout')"
)


# -- writes of ours in a caller's transaction ----------------------------------------------------

#: The savepoint around every write of ours in a caller's transaction (``in_savepoint``).
SAVEPOINT_SQL = b"SAVEPOINT ultimat3_jobs"
RELEASE_SQL = b"RELEASE SAVEPOINT ultimat3_jobs"
#: One statement per execute: a connection in pipeline mode refuses two in one.
ROLLBACK_TO_SQL = b"ROLLBACK TO SAVEPOINT ultimat3_jobs"
#: The caller's own timeouts, which an error of ours in their transaction names.
TIMEOUTS_SQL = b"SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"


@contextmanager
def in_savepoint(
    conn: Any,
    *,
    driver: str,
    describe: Callable[[], tuple[str, str]],
    translate: Callable[[Any], BaseException],
    prepare: bool | None = False,
) -> Iterator[Any]:
    """Run the body (which writes on ``conn``, a caller's connection) inside their
    transaction without ever ending it, in a SAVEPOINT; yields ``conn``.

    A failure rolls back to the savepoint, so the transaction stays usable and holds nothing
    of the call, and raises an ``EnqueueRefusedError`` that names it (``caller_error``); an
    interrupt rolls back the same way and goes on as it is. A lost connection, a missing
    table, or any failure on an idle autocommit connection (which gets a BEGIN/COMMIT of its
    own) raise ``translate(exc)``. A non-autocommit connection with no transaction yet gets
    the one psycopg opens, left open for the caller. A connection in pipeline mode is synced
    before and after, so an error is raised here, never at the caller's next statement.

    ``describe()``, called on a failure only: what the write was and who holds what it may
    wait for. ``prepare``: psycopg's ``prepare`` for SAVEPOINT and RELEASE."""
    pg = _psycopg()
    if conn.pgconn.transaction_status == pg.pq.TransactionStatus.IDLE and conn.autocommit:
        try:
            with conn.transaction():
                yield conn
        except pg.Error as exc:
            raise_translated(exc, translate)
        return
    cursor = our_cursor(conn)
    try:
        _sync(conn)
    except pg.Error as exc:  # a statement of the caller's, queued in their pipeline, failed
        _read_to_sync(conn)
        if conn.broken:
            raise_translated(exc, translate)
        check_joinable(conn, fix="")  # their transaction has failed: says so
        # Or it had none to fail: an autocommit pipeline ran that statement in an implicit
        # transaction of its own, ended by the sync. Their error, said as every driver error.
        raise_translated(exc, translate)
    try:
        cursor.execute(SAVEPOINT_SQL, prepare=prepare)
    except BaseException as exc:  # nothing of ours to undo
        _failed(exc, conn, driver, describe, translate, savepoint=False)
    try:
        yield conn
        cursor.execute(RELEASE_SQL, prepare=prepare)
        _sync(conn)
    except BaseException as exc:
        _failed(exc, conn, driver, describe, translate, savepoint=True)


def _sync(conn: Any) -> None:
    """On a connection in pipeline mode, send a Sync and process every result: an error of a
    statement queued so far is raised now (psycopg raises the first)."""
    if conn.pgconn.pipeline_status:  # PipelineStatus.OFF is 0
        with conn.pipeline() as pipeline:
            pipeline.sync()


def _read_to_sync(conn: Any) -> None:
    """After a sync that raised: psycopg raises the first error as soon as it reads it, at
    times before the Sync's own reply, which says whether a transaction has failed; until it
    is read the status is ACTIVE. Sync once more to read it: what was
    queued has been aborted, so this one raises nothing of the caller's."""
    pg = _psycopg()
    if conn.pgconn.transaction_status == pg.pq.TransactionStatus.ACTIVE:
        try:
            _sync(conn)
        except pg.Error:  # that aborted pipeline again, or a broken connection: the caller
            pass  # looks at the connection next and raises the first error


def raise_translated(exc: Any, translate: Callable[[Any], BaseException]) -> NoReturn:
    translated = translate(exc)
    if translated is exc:
        raise exc
    raise translated from exc


def _failed(
    exc: BaseException,
    conn: Any,
    driver: str,
    describe: Callable[[], tuple[str, str]],
    translate: Callable[[Any], BaseException],
    *,
    savepoint: bool,
) -> NoReturn:
    """A write of ours in the caller's transaction failed with ``exc``: roll back to our
    savepoint (when it was sent: ``savepoint``), then raise (``in_savepoint``)."""
    pg = _psycopg()
    status = pg.pq.TransactionStatus
    try:  # in pipeline mode: the results up to here, ``exc`` among them, so it runs ours again
        _sync(conn)
    except pg.Error:
        pass
    alive = not conn.broken and conn.pgconn.transaction_status in (status.INTRANS, status.INERROR)
    timeouts = ("", "")
    undo_failed: BaseException | None = None
    if alive and savepoint:
        try:
            cursor = our_cursor(conn)
            cursor.execute(ROLLBACK_TO_SQL, prepare=False)
            cursor.execute(RELEASE_SQL, prepare=False)
            _sync(conn)
            if isinstance(exc, pg.Error) and exc.sqlstate in ("55P03", "57014"):
                row = cursor.execute(TIMEOUTS_SQL, prepare=False).fetchone()
                timeouts = (str(row[0]), str(row[1])) if row else timeouts
        except pg.Error as failure:  # said in the error below, which is about ``exc``
            undo_failed = failure
    if not isinstance(exc, pg.Error):
        if undo_failed is not None:
            exc.add_note(
                "ultimat3-jobs: rolling back to its savepoint failed too "
                f"({first_line(undo_failed)}), so the transaction may be aborted and keep what "
                "the call wrote until it is rolled back"
            )
        raise exc
    if not alive or conn.broken or isinstance(exc, _missing_schema()):
        raise_translated(exc, translate)
    kept = conn.pgconn.transaction_status == status.INTRANS
    if kept and isinstance(exc, pg.DataError):
        raise refused(exc) from exc  # a value of the job: nothing to do with the caller
    what, holder = describe()
    raise caller_error(
        exc,
        driver=driver,
        what=what,
        holder=holder,
        timeouts=timeouts,
        kept=kept,
        undo_failed=undo_failed,
    ) from exc


def _missing_schema() -> tuple[type, ...]:
    errors = _psycopg().errors
    return (errors.UndefinedTable, errors.InvalidSchemaName)


def jobs_named(jobs: Sequence[NewJob]) -> str:
    """The jobs of a call, for an error: ``job send_email``, ``3 jobs of send_email``."""
    if not jobs:
        return "a job"
    names = sorted({job.name for job in jobs})
    named = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"job {named}" if len(jobs) == 1 else f"{len(jobs)} jobs of {named}"


def listed(values: Sequence[str]) -> str:
    """Keys or ids for an error: the first three, quoted."""
    return ", ".join(repr(v) for v in values[:3]) + (", ..." if len(values) > 3 else "")


def refused(exc: Any) -> SerializationError:
    """What to raise when PostgreSQL refuses a job's values (a ``DataError``)."""
    return SerializationError(
        f"PostgreSQL refused the job: {first_line(exc)}",
        fix="pass the JSON text the serializer made, and numbers that fit in 32 bits",
    )


def caller_error(
    exc: Any,
    *,
    driver: str,
    what: str,
    holder: str,
    timeouts: tuple[str, str] = ("", ""),
    kept: bool = True,
    undo_failed: BaseException | None = None,
) -> EnqueueRefusedError:
    """The ``EnqueueRefusedError`` for ``exc``, a psycopg error of ``what`` (a write of ours
    in a caller's transaction) that was rolled back to its savepoint (``kept``) or could not
    be (``undo_failed``, if that failed too). ``holder``: who holds what a lock wait waited
    for; ``timeouts``: the caller's lock_timeout and statement_timeout, named by a timeout."""
    state = exc.sqlstate or ""
    message = first_line(exc)
    lock_timeout, statement_timeout = timeouts
    if state == "55P03":
        cause = f"{holder}: {what} waited past lock_timeout {lock_timeout}".rstrip()
        fix = (
            "let that transaction end first (a key then dedupes onto its job), or raise "
            "lock_timeout"
        )
    elif state == "57014" and "statement timeout" in message:
        cause = (
            f"{what} ran past statement_timeout {statement_timeout}: perhaps {holder}, or the "
            "server is slow"
        )
        fix = "let a transaction holding the key end first, or raise statement_timeout"
    elif state == "57014":
        cause = f"{what} was cancelled: {message}"
        fix = "a client or an operator cancelled the statement (pg_cancel_backend)"
    elif state == "40001":
        cause = f"PostgreSQL could not serialize {what} with a concurrent transaction: {message}"
        fix = (
            "a REPEATABLE READ or SERIALIZABLE transaction fails so when another one commits "
            "the same key or rows meanwhile"
        )
    elif state == "40P01":
        cause = f"{what} deadlocked with another transaction: {message}"
        fix = "take locks (and enqueue keys) in one order in your transactions"
    elif state.startswith("23"):
        constraint = getattr(exc.diag, "constraint_name", None)
        cause = f"PostgreSQL refused the row of {what}: {message}" + (
            f" (constraint {constraint})" if constraint and constraint not in message else ""
        )
        if constraint and constraint.startswith("x_"):  # the library's own: a unique id
            fix = "the same job id was written twice: give each job an id of its own"
        else:
            fix = (
                "a constraint or trigger added to the library's tables refused it (the "
                "library's own schema refuses none of its rows)"
            )
    else:
        cause = f"PostgreSQL failed {what}: {message} (SQLSTATE {state or 'none'})"
        fix = (
            "check the statement PostgreSQL names (a trigger or rule of yours on the tables, "
            "the schema `ultimat3-jobs migrate` made)"
        )
    if undo_failed is not None:
        cause += f"; rolling back to the savepoint failed too: {first_line(undo_failed)}"
    return in_callers_transaction(cause, driver=driver, fix=fix, kept=kept)
