"""SQLite plumbing shared by the job driver and the outbox store.

- Times are INTEGER microseconds since the epoch, UTC (``us``, ``now_us``, ``dt``).
- ``write_in`` runs a write as part of a caller's transaction on their own connection, with
  the rules of Python's ``sqlite3`` transaction modes (see its docstring).
- One of each for the driver and the outbox store: ``connect`` (the library's own
  connection: autocommit, SQLite's busy handler for ``INNER_BUSY_MS``), ``transaction`` (a
  ``BEGIN IMMEDIATE`` ... ``COMMIT``), ``savepoint``, ``snapshot`` (a read transaction),
  ``retry_busy`` and ``unavailable`` (a sqlite3 error as the library's error, by its result
  code).
- Migrations are numbered ``.sql`` files split into statements (``executescript`` would COMMIT
  the transaction they run in) and recorded in a ledger table; ``pending_versions`` is a read.
- A busy database is waited for by ``retry_busy``, with no lock of ours held.
- Who holds a file's write lock, and which file a path is: ``dialects.sqlite_locks``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qsl, urlsplit

from ultimat3.jobs.clock import Backoff, Clock, SystemClock, wall_ns
from ultimat3.jobs.dialects.sqlite_locks import write_lock_holders
from ultimat3.jobs.errors import (
    ConfigurationError,
    DriverUnavailableError,
    in_callers_transaction,
)
from ultimat3.jobs.sql import queries

_T = TypeVar("_T")
_U = TypeVar("_U")

_Q = queries("sqlite", "ultimat3.jobs.dialects")


class Retrier(Protocol):
    """Runs an attempt again while the database is busy (the driver's busy loop)."""

    def __call__(self, attempt: Callable[[], _U], /) -> _U: ...


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)

# SQLite primary result codes (extended code & 0xFF).
ERROR = 1
BUSY = 5
LOCKED = 6
CONSTRAINT = 19
READONLY = 8
IOERR = 10
CORRUPT = 11
FULL = 13
CANTOPEN = 14
NOTADB = 26
BUSY_SNAPSHOT = 517


def us(moment: datetime) -> int:
    """Microseconds since the epoch, exactly (no float rounding)."""
    if moment.tzinfo is None:
        raise ValueError(f"a naive datetime ({moment}) cannot be stored: pass an aware UTC time")
    return (moment - EPOCH) // MICROSECOND


def now_us(now: datetime | None) -> int:
    """``now`` in microseconds, or SQLite's clock: the host's, read through ``clock.wall_ns``
    (which notes a step of it for the services that repair one)."""
    return wall_ns() // 1000 if now is None else us(now)


@lru_cache(maxsize=4096)
def dt(micros: int) -> datetime:
    # Cached: a claimed batch shares its attempt and expiry times, a bulk insert its run_at.
    return EPOCH + timedelta(microseconds=micros)


def dt_or_none(micros: int | None) -> datetime | None:
    return None if micros is None else dt(micros)


def sqlite_path(url: str, *, fix: str) -> Path:
    """The file a ``sqlite://`` URL names (``sqlite:///rel`` relative, ``sqlite:////abs``):
    the one rule of the job drivers' and the outbox stores' URLs. ``fix`` says which URLs
    the caller takes."""
    rest = url[len("sqlite://") :]
    if not rest.startswith("/") or rest in ("/", ""):
        raise ConfigurationError(f"the SQLite URL {url!r} names no file", fix=fix)
    return Path(rest[1:].split("?", 1)[0]).expanduser()


def url_options(url: str, allowed: Collection[str], *, what: str, fix: str) -> dict[str, str]:
    """The ``?name=value`` options of a ``sqlite://`` URL (the job driver's, ``what``, or the
    outbox store's), each one of ``allowed`` (``fix`` says which), with ``busy_timeout``
    checked to be a number of seconds: the one reading of both URLs' options."""
    options = dict(parse_qsl(urlsplit(url).query))
    unknown = set(options) - set(allowed)
    if unknown:
        raise ConfigurationError(f"unknown {what} option(s): {', '.join(sorted(unknown))}", fix=fix)
    raw = options.setdefault("busy_timeout", "30")
    try:
        float(raw)
    except ValueError:
        raise ConfigurationError(
            f"?busy_timeout={raw} is not a number of seconds",
            fix="write ?busy_timeout=30, for example",
        ) from None
    return options


def file_path(path: str | os.PathLike[str], busy_timeout: float, *, owner: str, fix: str) -> str:
    """The absolute path of the file ``path`` names, for ``owner`` (the driver, the outbox
    store); a ``ConfigurationError`` (with ``fix``) for an in-memory or URI database, or for a
    ``busy_timeout`` that is not a number of seconds >= 0."""
    raw = os.fspath(path)
    if not raw or raw == ":memory:" or raw.startswith("file:"):
        raise ConfigurationError(f"{owner} needs a file path, not {raw!r}", fix=fix)
    if not busy_timeout >= 0:
        raise ConfigurationError(
            f"busy_timeout={busy_timeout!r} must be a number of seconds >= 0",
            fix="pass busy_timeout=30.0, or another number of seconds",
        )
    return os.path.abspath(raw)


def joined_file(
    connection: object, *, owner: str, fix: str, probe: str | None = None
) -> tuple[str, bool]:
    """The main database file of a caller's connection to be joined ('' for an in-memory or
    temporary one), and whether ``probe`` (a query) finds a row on it; a
    ``ConfigurationError`` when it is not a ``sqlite3.Connection`` (``fix``: what to pass) or
    cannot be read."""
    if not isinstance(connection, sqlite3.Connection):
        raise ConfigurationError(
            f"{owner} can only join a sqlite3.Connection, not {type(connection).__name__}",
            fix=fix,
        )
    try:
        with plain_rows(connection):
            rows = connection.execute(_Q["database_list"]).fetchall()
            found = probe is not None and connection.execute(probe).fetchone() is not None
    except sqlite3.Error as exc:
        raise uninspectable(exc) from exc
    return next((str(row[2]) for row in rows if row[1] == "main"), ""), found


def check_usable(connection: sqlite3.Connection) -> None:
    """Refuse a connection that is closed or not usable in this thread, and one that would
    read our columns through a converter: the checks every join runs, also when the
    connection's file is already known."""
    try:
        connection.cursor().close()
    except sqlite3.Error as exc:
        raise uninspectable(exc) from exc
    check_unconverted(connection)


def uninspectable(exc: sqlite3.Error) -> ConfigurationError:
    """A caller's connection that cannot be read to join it (closed, another thread's)."""
    return ConfigurationError(
        f"cannot inspect the connection to join it ({exc})",
        fix="pass an open sqlite3.Connection (made in this thread, or with "
        "check_same_thread=False)",
    )


#: The declared types of our columns, and a statement reading a column of each, to see whether
#: a connection reads it through a converter. ``sqlite_schema`` declares ``type`` as text;
#: ``x_migrations`` exists once the job file is migrated (before that, nothing of ours is read).
_CONVERTIBLE = (
    ("TEXT", _Q["probe_text"], str),
    ("INTEGER", _Q["probe_integer"], int),
)


def check_unconverted(conn: sqlite3.Connection) -> None:
    """Raise ``ConfigurationError`` when ``conn`` reads our columns through a converter: a
    converter registered for ``TEXT`` or ``INTEGER`` (``sqlite3.register_converter``) applies
    on a connection made with ``detect_types=PARSE_DECLTYPES``, to every column so declared,
    and it would hand the library a job id, a key or a count it does not know. ``detect_types``
    is fixed at connect and cannot be read, so a registered converter for one of our types
    is checked by reading a column of that type."""
    converters = getattr(sqlite3, "converters", {})
    for name, probe, kind in _CONVERTIBLE:
        if name not in converters:
            continue
        try:
            with plain_rows(conn):
                row = conn.execute(probe).fetchone()
        except sqlite3.OperationalError:  # no x_migrations yet: the job file is not migrated
            continue
        if row is not None and not isinstance(row[0], kind):
            raise ConfigurationError(
                f"the connection reads {name} columns through the converter registered for "
                f"{name!r} (detect_types=sqlite3.PARSE_DECLTYPES), and the job tables' columns "
                f"are {name}: the ids and keys the library reads back would be converted too",
                fix="register the converter under a type name of your own and declare your "
                "columns with it (sqlite3.register_converter('json', ...), then a JSON column), "
                "or join a connection made without detect_types=sqlite3.PARSE_DECLTYPES",
            )


class plain_rows:
    """Our statements on a caller's connection read tuples of ``str``, whatever
    ``row_factory`` or ``text_factory`` the caller gave it (``sqlite3.Row`` indexes like a
    tuple, a factory that makes dicts does not): the caller's are put back afterwards. A
    class, not a generator: it is entered on every joined write."""

    __slots__ = ("_conn", "_kept")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._kept: tuple[Any, Any] | None = None

    def __enter__(self) -> None:
        conn = self._conn
        rows, text = conn.row_factory, conn.text_factory
        if rows is not None or text is not str:
            self._kept = (rows, text)
            conn.row_factory, conn.text_factory = None, str

    def __exit__(self, *exc: object) -> None:
        if self._kept is not None:
            self._conn.row_factory, self._conn.text_factory = self._kept


def primary_code(exc: sqlite3.Error) -> int:
    """SQLite's primary result code of ``exc`` (0 for an error raised by Python's sqlite3
    itself, such as a closed connection: it carries none)."""
    return int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


def is_busy(exc: sqlite3.Error) -> bool:
    return primary_code(exc) in (BUSY, LOCKED)


def unavailable(
    exc: sqlite3.Error,
    *,
    path: str,
    driver: str,
    busy_timeout: float,
    tables: str,
    migrate: str,
    refused: str = "a constraint or trigger added to the tables refused it",
) -> DriverUnavailableError:
    """``exc`` as the library's ``DriverUnavailableError``, chosen by SQLite's result code
    (``sqlite_errorcode``, ``sqlite_errorname``): the one translation of the driver and the
    outbox store. ``tables`` names the missing tables ("the job tables"), ``migrate`` how to
    create them, ``refused`` why a row is refused. Busy, full and I/O errors can pass
    (``retryable``); a bad file, missing tables, a refused row or a bug cannot."""
    code = primary_code(exc)
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    folder = os.path.dirname(path)
    if code in (BUSY, LOCKED):
        others = sorted((write_lock_holders(path) or frozenset()) - {os.getpid()})
        by = f" (process {', '.join(map(str, others))})" if others else ""
        cause = (
            f"the SQLite database {path} stayed locked by another writer{by} for more than "
            f"{busy_timeout:g}s ({exc})"
        )
        fix = (
            "find what holds a long write transaction on that file (a stuck process, a "
            "database browser or `sqlite3` shell with an open BEGIN) and end it; or raise "
            "busy_timeout"
        )
    elif code == CANTOPEN:
        cause = f"SQLite cannot open {path} ({exc})"
        if not os.path.isdir(folder):
            fix = f"create the folder {folder} (SQLite creates the file, not its folders)"
        elif os.path.isdir(path):
            fix = f"{path} is a folder; point the driver at a file path inside it"
        else:
            fix = f"make {folder} readable and writable by this user"
    elif code == NOTADB:
        cause = f"{path} is not a SQLite database ({exc})"
        fix = "point the driver at a SQLite database, or at a path that does not exist yet"
    elif code == READONLY:
        cause = f"SQLite cannot write to {path} ({exc})"
        fix = (
            f"make the file and its folder {folder} writable by this user: SQLite also "
            "creates the -wal and -shm files next to it"
        )
    elif code == CORRUPT:
        cause = f"the SQLite database {path} is damaged ({exc})"
        fix = (
            "stop every process using it, run `sqlite3 FILE 'PRAGMA integrity_check'`, and "
            "restore from a backup if it reports errors"
        )
    elif code == FULL:
        cause = f"the disk holding {path} is full ({exc})"
        fix = "free disk space, or prune finished jobs sooner"
    elif code == IOERR:
        cause = f"SQLite hit an I/O error on {path} ({exc})"
        fix = "check the disk and the filesystem; network filesystems break SQLite locking"
    elif code == CONSTRAINT:
        cause = f"SQLite refused a row in {path}: {exc}"
        fix = refused
    elif code == ERROR and str(exc).startswith("no such table"):
        # SQLite gives a missing table no code of its own: SQLITE_ERROR, from the prepare.
        cause = f"{tables} do not exist in {path} ({exc})"
        fix = f"{migrate} once before using it"
    else:
        cause = f"SQLite failed on {path} ({name}): {exc}"
        fix = f"check the file and the error above; {migrate} if it is new"
    retryable = code in (BUSY, LOCKED, FULL, IOERR)
    return DriverUnavailableError(cause, driver=driver, fix=fix, retryable=retryable)


# -- waiting for a busy database ----------------------------------------------------------------

# SQLite's own busy handler sleeps up to 100 ms between polls, so a long waiter reacts late and
# newcomers overtake it: it absorbs only the first ms here, then ``retry_busy`` polls with jitter.
INNER_BUSY_MS = 2
BUSY_BACKOFF = Backoff(first=0.0005, cap=0.002, jitter=True)


_SYSTEM = SystemClock()


def retry_busy(
    attempt: Callable[[], _T],
    *,
    timeout: float,
    on_busy: Callable[[float], None] | None = None,
    clock: Clock | None = None,
) -> _T:
    """Run ``attempt`` until SQLite does not refuse it as busy, for up to ``timeout`` seconds,
    pausing 0.25-2 ms between tries (``BUSY_BACKOFF``); past the timeout the last refusal is raised.
    Any other error is raised at once. ``on_busy(waited)``, called after each refusal with the
    seconds waited so far, may raise to end the wait (a diagnosis of who holds the lock). An
    owner's own lock is taken inside ``attempt``, so none is held across a pause; the pauses
    are real ones by default: the other holder of the lock lives in real time."""
    clock = clock or _SYSTEM
    started = clock.monotonic()
    deadline = started + timeout
    delay = BUSY_BACKOFF.after(0)
    while True:
        try:
            return attempt()
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.IntegrityError) or not is_busy(exc):
                raise
            now = clock.monotonic()
            left = deadline - now
            if left <= 0:
                raise
            if on_busy is not None:
                on_busy(now - started)
        clock.sleep(min(left, BUSY_BACKOFF.pause(delay)))
        delay = BUSY_BACKOFF.after(delay)


def in_callers(
    exc: sqlite3.Error,
    conn: sqlite3.Connection,
    *,
    opened: bool,
    translated: DriverUnavailableError,
    path: str,
    driver: str,
) -> DriverUnavailableError:
    """The error of a write of ours made as part of the caller's transaction on ``conn``
    (``write_in``) that failed with ``exc`` (``translated``: as ``unavailable`` gives it).
    Outside a transaction the caller had open (``opened`` False) the write was a transaction of
    its own: ``translated``. Inside, our savepoint was rolled back and the transaction goes
    on, unless SQLite ended it (``errors.in_callers_transaction``: not retryable, the
    transaction is the caller's). A busy refusal means the caller's transaction could not take
    the write lock: it should begin with ``BEGIN IMMEDIATE``, and once SQLite refused the
    upgrade (``SQLITE_BUSY_SNAPSHOT``) it can no longer write at all."""
    if not (is_busy(exc) and conn.in_transaction):
        if not opened:
            return translated
        kept = conn.in_transaction
        return in_callers_transaction(
            translated.cause, driver=driver, fix=translated.fix, kept=kept
        )
    snapshot = getattr(exc, "sqlite_errorcode", 0) == BUSY_SNAPSHOT
    if snapshot:
        cause = (
            f"your transaction on {path} read before enqueueing, and another process "
            "wrote in between, so SQLite refused to let it write (SQLITE_BUSY_SNAPSHOT)"
        )
    else:
        cause = (
            f"your transaction on {path} could not take the write lock from another writer ({exc})"
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
    if snapshot:  # it can no longer write
        return DriverUnavailableError(cause, driver=driver, fix=fix, retryable=False)
    return in_callers_transaction(cause, driver=driver, fix=fix)


def connect(path: str, *, busy_timeout: float) -> sqlite3.Connection:
    """A connection of the library's own to ``path``: autocommit (every transaction is one
    of ours, begun by ``transaction``), usable from any thread (its owner serialises it),
    and SQLite's busy handler waiting only the first ``INNER_BUSY_MS`` (``retry_busy`` waits
    the rest, with no lock of ours held)."""
    return sqlite3.connect(
        path,
        timeout=min(INNER_BUSY_MS / 1000, busy_timeout),
        isolation_level=None,
        check_same_thread=False,
        cached_statements=256,
    )


#: The synchronous levels, each a statement of its own.
SYNCHRONOUS = {
    level: _Q[f"synchronous_{level.lower()}"] for level in ("OFF", "NORMAL", "FULL", "EXTRA")
}


def use_wal(conn: sqlite3.Connection, synchronous: str, *, path: str, driver: str) -> None:
    """Put ``conn``'s file in WAL mode (once per file; it needs every other connection out of
    it) with ``synchronous``; raise ``DriverUnavailableError`` when SQLite will not."""
    mode = conn.execute(_Q["journal_wal"]).fetchone()[0]
    if str(mode).lower() != "wal":
        raise DriverUnavailableError(
            f"SQLite would not put {path} in WAL mode (journal_mode is {mode})",
            driver=driver,
            fix="put the file on a local disk (WAL needs shared memory between processes) "
            "and let no other program force another journal mode",
        )
    conn.execute(SYNCHRONOUS[synchronous])
    conn.execute(_Q["journal_size_limit"])


BEGIN_IMMEDIATE = _Q["begin_immediate"]


def _run_once(attempt: Callable[[], _U]) -> _U:
    return attempt()


@contextmanager
def transaction(
    conn: sqlite3.Connection,
    *,
    retry: Retrier = _run_once,
    begin: Callable[[], object] | None = None,
) -> Iterator[sqlite3.Connection]:
    """A write transaction of ours on ``conn``: ``BEGIN IMMEDIATE`` (the write lock before any
    read; ``begin`` runs it instead, for an owner that takes a lock of its own per attempt),
    then ``COMMIT`` on normal exit, both run through ``retry`` while busy (a commit waits for
    readers in rollback-journal mode); ``ROLLBACK`` on an exception, or when the commit
    fails. A body that ended the transaction itself is left as it is."""
    retry(begin or (lambda: conn.execute(BEGIN_IMMEDIATE)))
    try:
        yield conn
        if conn.in_transaction:
            retry(lambda: conn.execute(_Q["commit"]))
    except BaseException:
        rollback_quietly(conn)
        raise


class savepoint:
    """A savepoint inside the open transaction on ``conn``: released on normal exit, rolled
    back to (and released) on an exception, so a failure undoes all of the block and nothing
    before it. When SQLite rolled the whole transaction back itself (a full disk, an I/O
    error), there is nothing left to undo. A class, not a generator: it is entered on every
    joined write."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._conn.execute(_Q["savepoint"])
        return self._conn

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        conn = self._conn
        if not conn.in_transaction:
            return
        if kind is None:
            conn.execute(_Q["savepoint_release"])
            return
        try:
            conn.execute(_Q["savepoint_rollback"])
            conn.execute(_Q["savepoint_release"])
        except sqlite3.Error:
            pass  # SQLite ended the transaction meanwhile


@contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One read transaction on ``conn`` (its reads agree with each other), unless one is open
    already; ended afterwards, having written nothing."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute(_Q["begin"])
    try:
        yield conn
    finally:
        rollback_quietly(conn)


def rollback_quietly(conn: sqlite3.Connection) -> None:
    # SQLite rolls back by itself after some errors (disk full, I/O); then there is nothing left.
    if conn.in_transaction:
        try:
            conn.execute(_Q["rollback"])
        except sqlite3.Error:
            pass


def close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:
        pass


def once(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], _T]) -> _T:
    """``body`` in its own ``BEGIN IMMEDIATE`` transaction: committed, or rolled back."""
    with transaction(conn):
        return body(conn)


def autocommits(conn: sqlite3.Connection) -> bool:
    """True when a statement outside a transaction commits at once on this connection."""
    legacy = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)
    autocommit = getattr(conn, "autocommit", legacy)
    return autocommit is True or (autocommit == legacy and conn.isolation_level is None)


def write_in(
    conn: sqlite3.Connection,
    body: Callable[[sqlite3.Connection], _T],
    *,
    retry: Retrier,
) -> _T:
    """Run ``body`` as part of the caller's transaction on their connection ``conn``.

    - Inside a transaction: always in a ``savepoint``, so a failure rolls back all of our
      part and nothing else, whatever failed: SQLite undoes a failed statement alone only for
      some errors (``RAISE(FAIL)`` in a trigger keeps what the statement did before it, and a
      body of two statements can fail at the second).
    - Legacy transaction mode (``isolation_level`` not None, ``sqlite3.connect``'s default)
      with no transaction open: the ``BEGIN`` the caller's own INSERT would have issued, as
      ``BEGIN IMMEDIATE``, left open for the caller's ``commit()`` or ``rollback()``.
    - Autocommit with no transaction open: the write is a transaction of its own, committed at
      once (as the caller's own INSERT would be), and so may be retried whole by ``retry``.

    Its statements read plain rows (``plain_rows``). sqlite3 errors are raised as they are;
    the caller translates them.
    """
    with plain_rows(conn):
        if conn.in_transaction:
            with savepoint(conn):
                return body(conn)
        if autocommits(conn):
            return retry(lambda: once(conn, body))
        retry(lambda: conn.execute(BEGIN_IMMEDIATE))
        try:
            return body(conn)
        except BaseException:
            rollback_quietly(conn)
            raise


def pending_versions(
    conn: sqlite3.Connection, known: Sequence[tuple[int, str]], named: Mapping[str, str]
) -> list[int]:
    """The versions of ``known`` not recorded yet. A read: it takes no write lock."""
    applied: set[int] = set()
    if conn.execute(named["migrations_table_exists"]).fetchone() is not None:
        applied = {row[0] for row in conn.execute(named["migration_versions"])}
    return [version for version, _ in known if version not in applied]


def apply_migrations(
    conn: sqlite3.Connection, known: Sequence[tuple[int, str]], named: Mapping[str, str]
) -> list[int]:
    """Apply the migrations of ``known`` not yet recorded, inside the caller's ``BEGIN
    IMMEDIATE``; ``named`` holds the ``migrations_table_exists``, ``migration_versions`` and
    ``migration_record`` queries of the schema at hand (the job tables, or an outbox)."""
    pending = set(pending_versions(conn, known, named))
    done = []
    for version, script in known:
        if version not in pending:
            continue
        for statement in _statements(script):
            conn.execute(statement)
        conn.execute(named["migration_record"], {"version": version})
        done.append(version)
    return done


def printable_migrations(
    known: Sequence[tuple[int, str]], named: Mapping[str, str]
) -> list[tuple[int, str]]:
    """Every migration of ``known`` followed by the ``migration_record`` of ``named`` that
    records it, for a tool of the caller's to apply (``migrate --sql``), so that ``migrate()``
    recognises the schema afterwards. That text is run by another tool, which binds nothing:
    the version, an int of ours, is written in as a literal, here only."""
    record = named["migration_record"].rstrip().rstrip(";")
    return [
        (version, f"{script.rstrip()}\n\n{record.replace(':version', str(int(version)))};\n")
        for version, script in known
    ]


def _statements(script: str) -> Iterator[str]:
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""
    rest = "".join(ln for ln in buffer.splitlines() if not ln.strip().startswith("--")).strip()
    if rest:
        raise ValueError(f"migration ends with an incomplete statement: {rest[:80]!r}")
