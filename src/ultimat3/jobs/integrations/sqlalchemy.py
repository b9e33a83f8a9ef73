"""SQLAlchemy 2: enqueues that join a ``Session``'s (or ``AsyncSession``'s) transaction.

Once, at start-up, ``install`` the App on your sessions (a ``sessionmaker``, an
``async_sessionmaker``, an ``Engine``, or one ``Session``)::

    install(app, sessions)                      # sessions = sessionmaker(engine)

    with sessions.begin() as session:
        session.add(Order(id=42))
        send_receipt.enqueue({"id": 42})        # in the session's transaction

    async with async_sessions.begin() as session:
        session.add(Order(id=42))
        await send_receipt.enqueue_async({"id": 42})

From then on an enqueue inside a transaction of those sessions joins it, with no ``using()``:
the session's events (``after_transaction_create`` and ``after_transaction_end`` of its root
transaction) keep, per thread or task (a context variable), which of its transactions the
code runs in, and the enqueue asks the innermost one for its connection
(``session.connection()``, which also emits a ``begin_nested()`` SAVEPOINT still pending).
A transaction on another database raises ``ConfigurationError`` (or, with ``App(outbox=...)``
there, stages its ``x_outbox`` row), as in ``app.using()``; with ``App(mode="required")`` an
enqueue outside any transaction raises. An ``AsyncSession``'s transaction is joined by
``await handle.enqueue_async()`` (or ``app.enqueue_async``), which reaches the connection on the
event loop; a plain ``handle.enqueue()`` inside one raises and says so.

Explicitly, for one block, without ``install``::

    with Session(engine) as session, session.begin(), using(app, session):
        session.add(Order(id=42))
        send_receipt.enqueue({"id": 42})       # in the session's transaction

    async with AsyncSession(engine) as session, session.begin():
        async with using_async(app, session):
            session.add(Order(id=42))
            await app.enqueue_async(send_receipt, {"id": 42})

Guarantee: the insert goes through the DBAPI connection the session's transaction runs on
(``session.connection()``), so the job (or, with ``App(outbox=...)``, its ``x_outbox`` row)
exists if and only if the session commits, and a ``begin_nested()`` savepoint that rolls back
takes the jobs enqueued inside it along (inside a ``using`` block, a ``begin_nested()`` emits
its SAVEPOINT at once rather than at the session's next statement). No session event writes
anything: committing needs no hook, because the rows are already in the transaction (workers
notice new jobs by themselves: SQLite's data version, PostgreSQL's NOTIFY at commit).

Supported DBAPIs: ``sqlite3`` (pysqlite), psycopg 3 (``postgresql+psycopg``), and for async
psycopg 3 (``postgresql+psycopg`` given to ``create_async_engine``, which picks psycopg's async
dialect) and ``sqlite+aiosqlite``. aiosqlite runs SQLite on a thread of
its own, so its engine needs ``connect_args={"check_same_thread": False}`` for the enqueue's
thread to use the connection (an error says so otherwise).

Limits: a transaction is found from the thread or task it began in (and the tasks and
threads started from there with a copy of its context), and from code that has used its
session since (``add``, ``execute``, a query, ``flush``: the session events ``after_attach``,
``do_orm_execute``, ``before_flush``, ``after_begin``), which covers a transaction begun in a
context that did not carry back (FastAPI's ``def`` dependency, run in a thread pool). An
enqueue in such code before any use of the session runs as outside any transaction;
``App(mode="required")`` makes it raise. A thread is no guide: a pool thread runs calls of
many requests, so keying transactions by thread would join another request's.

``install`` on an ``Engine`` or an ``async_sessionmaker`` follows the sessions bound to that
engine (``bind=``), not those routed to it through ``binds=``. Enqueue before you commit; inside a ``using`` block, after a
commit the next enqueue would reach a connection the session gave back. pysqlite's default
transaction handling breaks SAVEPOINT (SQLAlchemy's own documentation): for
``begin_nested()`` on SQLite, use its recipe (``isolation_level=None`` and a ``BEGIN`` in the
``begin`` event), or Python 3.12's ``autocommit=False``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_session,
    async_sessionmaker,
)
from sqlalchemy.orm import (
    Session,
    SessionTransaction,
    scoped_session,
    sessionmaker,
)

from ultimat3.jobs.driver import Joined
from ultimat3.jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from ultimat3.jobs.app import App

__all__ = ["Installed", "dbapi_connection", "install", "using", "using_async"]

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
    joined = await _join_raw_async(app, conn)
    owner = session.sync_session if isinstance(session, AsyncSession) else None
    with _eager_savepoints(owner), app._current(joined, session):
        yield session


async def _join_raw_async(app: App, conn: AsyncConnection) -> Joined:
    """``conn``'s DBAPI connection joined by ``app``, for enqueues off the event loop: the one
    way both ``using_async`` and an installed ``AsyncSession`` join. Its ``serial`` lock makes
    concurrent ``enqueue_async`` calls on it run one after the other."""
    raw: Any = (await conn.get_raw_connection()).driver_connection
    module = type(raw).__module__.split(".", 1)[0]
    if module == "psycopg":
        from ultimat3.jobs.integrations.psycopg import sync_view

        return app._join(sync_view(raw), serial=asyncio.Lock())
    if module == "aiosqlite":
        return app._join(_aiosqlite_connection(raw), serial=asyncio.Lock())
    raise ConfigurationError(
        f"the async DBAPI {type(raw).__module__}.{type(raw).__name__} is not supported",
        fix="create the engine with postgresql+psycopg:// (create_async_engine picks psycopg's "
        "async dialect) or sqlite+aiosqlite://",
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


# -- install: the ambient session transaction -----------------------------------------------


@dataclass(eq=False)
class _Open:
    """A root session transaction begun in this context, held weakly."""

    session: weakref.ref[Session]
    transaction: weakref.ref[SessionTransaction]
    #: Per app: the DBAPI connection it was joined on and the ``Joined`` (kept for the
    #: transaction, so async enqueues in it share one ``serial`` lock).
    joined: dict[int, tuple[Any, Joined]] = field(default_factory=dict)

    def live(self) -> Session | None:
        """The session, while this is still its transaction (ended ones, which another
        context's ``after_transaction_end`` could not remove from here, are skipped)."""
        session = self.session()
        transaction = self.transaction()
        if session is None or transaction is None or session.get_transaction() is not transaction:
            return None
        return session


#: The root transactions of installed sessions that the code here runs in, innermost last.
_open: ContextVar[tuple[_Open, ...]] = ContextVar("ultimat3_jobs_sqlalchemy_open", default=())


@dataclass(eq=False)
class Installed:
    """What ``install`` did; ``remove()`` undoes it (tests, a reloaded application)."""

    app: App
    target: Any
    matches: Callable[[Session], bool]

    def remove(self) -> None:
        """Undo ``install``: the sessions it hooked no longer join an enqueue ambiently."""
        with _lock:
            if self in _installs:
                _installs.remove(self)
            if not any(i.app is self.app for i in _installs):
                self.app._remove_ambient(_AMBIENT)
            if not _installs and _listening:
                for name, listener in _EVENTS:
                    event.remove(Session, name, listener)
                _listening.clear()


_installs: list[Installed] = []
_listening: list[bool] = []
_lock = threading.Lock()


def install(app: App, target: Any) -> Installed:
    """Make every enqueue inside a transaction of ``target``'s sessions join it, with no
    ``using()`` (see the module). ``target``: a ``sessionmaker`` (or ``scoped_session``), an
    ``async_sessionmaker`` bound to an engine, an ``Engine`` or ``AsyncEngine`` (the sessions
    bound to it), a ``Session`` or ``AsyncSession``, or a ``Session`` subclass. Call it once, at
    start-up; installing the same target again does nothing."""
    matches = _matcher(target)
    with _lock:
        for done in _installs:
            if done.app is app and done.target is target:
                return done
        installed = Installed(app, target, matches)
        _installs.append(installed)
        if not _listening:
            for name, listener in _EVENTS:
                event.listen(Session, name, listener)
            _listening.append(True)
        app._add_ambient(_AMBIENT)
    return installed


def _matcher(target: Any) -> Callable[[Session], bool]:
    if isinstance(target, scoped_session):
        target = target.session_factory
    if isinstance(target, sessionmaker):
        cls = target.class_
        return lambda session: isinstance(session, cls)
    if isinstance(target, async_sessionmaker):
        bind = target.kw.get("bind")
        if not isinstance(bind, AsyncEngine):
            raise ConfigurationError(
                "install() got an async_sessionmaker without an engine (bind=)",
                fix="create it as async_sessionmaker(engine, ...), or install the engine itself",
            )
        target = bind
    if isinstance(target, AsyncEngine):
        target = target.sync_engine
    if isinstance(target, Engine):
        engine = target
        return lambda session: session.bind is engine
    if isinstance(target, AsyncSession):
        target = target.sync_session
    if isinstance(target, Session):
        ref = weakref.ref(target)
        return lambda session: session is ref()
    if isinstance(target, type) and issubclass(target, Session):
        cls = target
        return lambda session: isinstance(session, cls)
    raise ConfigurationError(
        f"install() cannot follow the sessions of a {type(target).__name__}",
        fix="pass your sessionmaker (or async_sessionmaker), the Engine (or AsyncEngine) the "
        "sessions are bound to, or one Session",
    )


def _created(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return  # a savepoint: session.connection() at the enqueue emits it and writes in it
    if any(i.matches(session) for i in _installs):
        _push(session, transaction)


def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return
    opened = _open.get()
    if opened:
        _open.set(tuple(o for o in opened if o.transaction() is not transaction))


def _used(session: Session) -> None:
    """The code here uses ``session``: its open transaction is one this code runs in, even
    when it began in a context that did not carry back (FastAPI's ``def`` dependency runs in
    a thread pool, in a copy of the request's context)."""
    transaction = session.get_transaction()
    if transaction is None or any(o.transaction() is transaction for o in _open.get()):
        return
    if any(i.matches(session) for i in _installs):
        _push(session, transaction)


def _push(session: Session, transaction: SessionTransaction) -> None:
    """``transaction`` is the innermost this code runs in (ended ones are dropped)."""
    kept = tuple(o for o in _open.get() if o.live() is not None)
    _open.set((*kept, _Open(weakref.ref(session), weakref.ref(transaction))))


#: The session events an installed App listens to: a transaction's start and end, and the
#: uses of a session (``_used``).
_EVENTS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("after_transaction_create", _created),
    ("after_transaction_end", _ended),
    ("after_attach", lambda session, instance: _used(session)),
    ("do_orm_execute", lambda state: _used(state.session)),
    ("before_flush", lambda session, flush_context, instances: _used(session)),
    ("after_begin", lambda session, transaction, connection: _used(session)),
)


def _innermost() -> tuple[_Open, Session] | None:
    for opened in reversed(_open.get()):
        session = opened.live()
        if session is not None:
            return opened, session
    return None


class _Ambient:
    """The ``App``'s view of the installed sessions (``App._add_ambient``)."""

    def joined(self, app: App) -> Joined | None:
        found = _innermost()
        if found is None:
            return None
        opened, session = found
        if async_session(session) is not None:
            raise ConfigurationError(
                "an enqueue ran inside an AsyncSession's transaction through the sync "
                "enqueue(), which cannot reach the session's connection from here",
                fix="use `await handle.enqueue_async(...)` (or app.enqueue_async), which joins "
                "the transaction",
            )
        raw = dbapi_connection(session)  # emits a begin_nested() SAVEPOINT still pending
        kept = opened.joined.get(id(app))
        if kept is not None and kept[0] is raw:
            return kept[1]
        joined = app._join(raw)
        opened.joined[id(app)] = (raw, joined)
        return joined

    async def joined_async(self, app: App) -> Joined | None:
        found = _innermost()
        if found is None:
            return None
        opened, session = found
        wrapper = async_session(session)
        if wrapper is None:
            return self.joined(app)  # a sync Session used in async code: its own sync calls
        conn = await wrapper.connection()  # emits a begin_nested() SAVEPOINT still pending
        raw: Any = (await conn.get_raw_connection()).driver_connection
        kept = opened.joined.get(id(app))
        if kept is not None and kept[0] is raw:
            return kept[1]
        joined = await _join_raw_async(app, conn)
        opened.joined[id(app)] = (raw, joined)
        return joined


_AMBIENT = _Ambient()
