"""SQLite plumbing shared by the job driver and the outbox store.

- Times are INTEGER microseconds since the epoch, UTC (``us``, ``now_us``, ``dt``).
- A database is identified by its file's device and inode (``file_identity``), so two paths
  to one file (a symlink, ``./jobs.db`` and ``/srv/app/jobs.db``) are one database.
- ``write_in`` runs a write as part of a caller's transaction on their own connection, with
  the rules of Python's ``sqlite3`` transaction modes (see its docstring).
- Migrations are numbered ``.sql`` files split into statements (``executescript`` would COMMIT
  the transaction they run in) and recorded in a ledger table; ``pending_versions`` is a read.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol, TypeVar

from ultimat3.jobs.clock import wall_ns
from ultimat3.jobs.driver import DatabaseId
from ultimat3.jobs.errors import ConfigurationError

__all__ = [
    "apply_migrations",
    "check_unconverted",
    "close_quietly",
    "connection_file",
    "dt",
    "file_identity",
    "is_busy",
    "now_us",
    "pending_versions",
    "plain_rows",
    "primary_code",
    "rollback_quietly",
    "same_file",
    "us",
    "write_in",
]

_T = TypeVar("_T")
_U = TypeVar("_U")


class Retrier(Protocol):
    """Runs an attempt again while the database is busy (the driver's busy loop)."""

    def __call__(self, attempt: Callable[[], _U], /) -> _U: ...


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)

# SQLite primary result codes (extended code & 0xFF).
BUSY = 5
LOCKED = 6
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


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def file_identity(path: str) -> DatabaseId:
    """The identity of the database file at ``path`` (device and inode once it exists)."""
    try:
        st = os.stat(path)
    except OSError:
        return DatabaseId("sqlite", ("path", os.path.realpath(path)), path)
    return DatabaseId("sqlite", (st.st_dev, st.st_ino), path)


def connection_file(conn: sqlite3.Connection) -> str:
    """The file of a connection's main database ('' for an in-memory or temporary one)."""
    with plain_rows(conn):
        rows = conn.execute("PRAGMA database_list").fetchall()
    return next((str(row[2]) for row in rows if row[1] == "main"), "")


#: The declared types of our columns, and a statement reading a column of each, to see whether
#: a connection reads it through a converter. ``sqlite_schema`` declares ``type`` as text;
#: ``x_migrations`` exists once the job file is migrated (before that, nothing of ours is read).
_CONVERTIBLE = (
    ("TEXT", "SELECT type FROM sqlite_schema LIMIT 1", str),
    ("INTEGER", "SELECT version FROM x_migrations LIMIT 1", int),
)


def check_unconverted(conn: sqlite3.Connection) -> None:
    """Raise ``ConfigurationError`` when ``conn`` reads our columns through a converter: a
    converter registered for ``TEXT`` or ``INTEGER`` (``sqlite3.register_converter``) applies
    on a connection made with ``detect_types=PARSE_DECLTYPES``, to every column so declared,
    and it would hand the library a job id, a key or a count it does not know. ``detect_types``
    is fixed at connect and cannot be read, so a registered converter for one of our types
    costs one read of a column of that type; none (the usual case) costs two dict look-ups."""
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


@contextmanager
def plain_rows(conn: sqlite3.Connection) -> Iterator[None]:
    """Our statements on a caller's connection read tuples of ``str``, whatever
    ``row_factory`` or ``text_factory`` the caller gave it (``sqlite3.Row`` indexes like a
    tuple, a factory that makes dicts does not): the caller's are put back afterwards."""
    rows, text = conn.row_factory, conn.text_factory
    if rows is None and text is str:
        yield
        return
    conn.row_factory, conn.text_factory = None, str
    try:
        yield
    finally:
        conn.row_factory, conn.text_factory = rows, text


def primary_code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


def is_busy(exc: sqlite3.Error) -> bool:
    if primary_code(exc) in (BUSY, LOCKED):
        return True
    # Some paths raise without an error code; the message is stable across versions.
    text = str(exc)
    return "database is locked" in text or "database table is locked" in text


def rollback_quietly(conn: sqlite3.Connection) -> None:
    # SQLite rolls back by itself after some errors (disk full, I/O); then there is nothing left.
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:
        pass


def once(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], _T]) -> _T:
    """``body`` in its own ``BEGIN IMMEDIATE`` transaction: committed, or rolled back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise
    return result


def autocommits(conn: sqlite3.Connection) -> bool:
    """True when a statement outside a transaction commits at once on this connection."""
    legacy = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)
    autocommit = getattr(conn, "autocommit", legacy)
    return autocommit is True or (autocommit == legacy and conn.isolation_level is None)


def write_in(
    conn: sqlite3.Connection,
    body: Callable[[sqlite3.Connection], _T],
    *,
    savepoint: str | None,
    retry: Retrier,
) -> _T:
    """Run ``body`` as part of the caller's transaction on their connection ``conn``.

    - Inside a transaction: in a ``SAVEPOINT`` (named ``savepoint``; None for bodies that are
      atomic on their own, since SQLite undoes a failed statement without touching the
      transaction around it), so a failure rolls back only our part.
    - Legacy transaction mode (``isolation_level`` not None, ``sqlite3.connect``'s default)
      with no transaction open: the ``BEGIN`` the caller's own INSERT would have issued, as
      ``BEGIN IMMEDIATE``, left open for the caller's ``commit()`` or ``rollback()``.
    - Autocommit with no transaction open: the write is a transaction of its own, committed at
      once (as the caller's own INSERT would be), and so may be retried whole by ``retry``.

    Its statements read plain rows (``plain_rows``). sqlite3 errors are raised as they are;
    the caller translates them.
    """
    if conn.row_factory is None and conn.text_factory is str:
        if savepoint is None and conn.in_transaction:
            return body(conn)  # the usual enqueue in a transaction: ``_write_in``'s shortest way
        return _write_in(conn, body, savepoint=savepoint, retry=retry)
    with plain_rows(conn):
        return _write_in(conn, body, savepoint=savepoint, retry=retry)


def _write_in(
    conn: sqlite3.Connection,
    body: Callable[[sqlite3.Connection], _T],
    *,
    savepoint: str | None,
    retry: Retrier,
) -> _T:
    if not conn.in_transaction:
        if autocommits(conn):
            return retry(lambda: once(conn, body))
        retry(lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            return body(conn)
        except BaseException:
            rollback_quietly(conn)
            raise
    if savepoint is None:
        return body(conn)
    conn.execute(f"SAVEPOINT {savepoint}")
    try:
        result = body(conn)
    except BaseException:
        try:
            conn.execute(f"ROLLBACK TO {savepoint}")
            conn.execute(f"RELEASE {savepoint}")
        except sqlite3.Error:
            pass  # SQLite already rolled the whole transaction back (disk full, I/O)
        raise
    conn.execute(f"RELEASE {savepoint}")
    return result


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
