"""SQLAlchemy 2: enqueues that join a ``Session``'s (or ``AsyncSession``'s) transaction.

::

    with Session(engine) as session, session.begin(), using(app, session):
        session.add(Order(id=42))
        send_receipt.enqueue({"id": 42})       # in the session's transaction

    async with AsyncSession(engine) as session, session.begin():
        async with using_async(app, session):
            session.add(Order(id=42))
            await app.enqueue_async(send_receipt, {"id": 42})

Guarantee: the insert goes through the DBAPI connection the session's transaction runs on
(``session.connection()``), inside a savepoint of it, so the job (or, with ``App(outbox=...)``,
its ``x_outbox`` row) exists if and only if the session commits, and a ``begin_nested()``
savepoint that rolls back takes the jobs enqueued inside it along (inside the block, a
``begin_nested()`` emits its SAVEPOINT at once rather than at the session's next statement). No session event writes
anything: committing needs no hook, because the rows are already in the transaction (workers
notice new jobs by themselves: SQLite's data version, PostgreSQL's NOTIFY at commit).

Supported DBAPIs: ``sqlite3`` (pysqlite), psycopg 3 (``postgresql+psycopg``), and for async
``postgresql+psycopg_async`` and ``sqlite+aiosqlite``. aiosqlite runs SQLite on a thread of
its own, so its engine needs ``connect_args={"check_same_thread": False}`` for the enqueue's
thread to use the connection (an error says so otherwise).

Limits: the block covers the session's current transaction. Enqueue before you commit; after a
commit inside the block the next enqueue would reach a connection the session gave back.
pysqlite's default transaction handling breaks SAVEPOINT (SQLAlchemy's own documentation):
for ``begin_nested()`` on SQLite, use its recipe (``isolation_level=None`` and a ``BEGIN`` in
the ``begin`` event), or Python 3.12's ``autocommit=False``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

from ultimat3.jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from ultimat3.jobs.app import App

__all__ = ["dbapi_connection", "using", "using_async"]

_S = TypeVar("_S", Session, Connection)
_A = TypeVar("_A", AsyncSession, AsyncConnection)


def dbapi_connection(session: Session | Connection) -> Any:
    """The driver-level connection (``sqlite3.Connection``, ``psycopg.Connection``) that the
    session's current transaction runs on; begins that transaction when none is open."""
    conn = session.connection() if isinstance(session, Session) else session
    if not isinstance(conn, Connection):
        raise ConfigurationError(
            f"expected a SQLAlchemy Session or Connection, not {type(session).__name__}",
            fix="pass the Session (or Connection) whose transaction the jobs must join",
        )
    return conn.connection.driver_connection


@contextmanager
def _eager_savepoints(session: Session | None) -> Iterator[None]:
    """Make ``begin_nested()`` emit its SAVEPOINT at once while the block runs.

    A Session emits SAVEPOINT lazily, when it next uses the connection; an enqueue goes to the
    DBAPI connection directly, so without this its row would land in the outer transaction and
    survive the savepoint's rollback. The listener only asks the session for its connection,
    which is what any ORM statement in the savepoint would do first."""
    if session is None:
        yield
        return

    def created(sess: Session, transaction: SessionTransaction) -> None:
        if transaction.nested:
            sess.connection()

    event.listen(session, "after_transaction_create", created)
    try:
        yield
    finally:
        event.remove(session, "after_transaction_create", created)


@contextmanager
def using(app: App, session: _S) -> Iterator[_S]:
    """Enqueues in the block join ``session``'s current transaction (see the module)."""
    owner = session if isinstance(session, Session) else None
    with _eager_savepoints(owner), app.using(dbapi_connection(session)):
        yield session


@asynccontextmanager
async def using_async(app: App, session: _A) -> AsyncIterator[_A]:
    """``async with using_async(app, session):``: ``await app.enqueue_async(...)`` in the block
    joins ``session``'s current transaction (``AsyncSession`` or ``AsyncConnection``)."""
    if isinstance(session, AsyncSession):
        conn = await session.connection()
    elif isinstance(session, AsyncConnection):
        conn = session
    else:
        raise ConfigurationError(
            f"expected a SQLAlchemy AsyncSession or AsyncConnection, not {type(session).__name__}",
            fix="pass the AsyncSession whose transaction the jobs must join",
        )
    raw: Any = (await conn.get_raw_connection()).driver_connection
    module = type(raw).__module__.split(".", 1)[0]
    owner = session.sync_session if isinstance(session, AsyncSession) else None
    if module == "psycopg":
        from ultimat3.jobs.integrations.psycopg import using as psycopg_using

        with _eager_savepoints(owner):
            async with psycopg_using(app, raw):
                yield session
        return
    if module == "aiosqlite":
        with _eager_savepoints(owner), app.using(_aiosqlite_connection(raw)):
            yield session
        return
    raise ConfigurationError(
        f"the async DBAPI {type(raw).__module__}.{type(raw).__name__} is not supported",
        fix="use postgresql+psycopg_async:// or sqlite+aiosqlite:// for the engine",
    )


def _aiosqlite_connection(raw: Any) -> sqlite3.Connection:
    """The ``sqlite3.Connection`` inside an aiosqlite connection, checked usable from here."""
    inner = raw._conn  # aiosqlite keeps the sqlite3 connection there; no public accessor
    if not isinstance(inner, sqlite3.Connection):
        raise ConfigurationError(
            f"cannot reach the sqlite3 connection inside {type(raw).__name__}",
            fix="use aiosqlite 0.17 or newer",
        )
    try:
        inner.execute("SELECT 1").fetchone()
    except sqlite3.ProgrammingError as exc:
        raise ConfigurationError(
            f"the aiosqlite connection can only be used from its own thread ({exc})",
            fix='create the engine with connect_args={"check_same_thread": False}, so an '
            "enqueue can use the connection while aiosqlite's thread waits",
        ) from exc
    return inner
