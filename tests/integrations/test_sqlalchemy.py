"""SQLAlchemy 2 sessions, sync and async, on every layout: commit runs the job once, rollback
never, and a rolled-back ``begin_nested()`` savepoint drops only the jobs enqueued inside it."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from ultimat3.jobs import App
from ultimat3.jobs.errors import ConfigurationError, OutboxNoTxError
from ultimat3.jobs.integrations.sqlalchemy import install, using, using_async

from .conftest import JOBS, Layout, deliver, record


def _sqlite_savepoints(engine: Engine) -> None:
    """SQLAlchemy's documented recipe for SAVEPOINT on pysqlite: let SQLAlchemy emit BEGIN."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


@pytest.fixture
def engine(layout: Layout) -> Iterator[Engine]:
    if layout.url.startswith("sqlite"):
        made = create_engine(f"sqlite:///{layout.sqlite_path}")
        _sqlite_savepoints(made)
    else:
        made = create_engine(layout.url.replace("postgresql://", "postgresql+psycopg://", 1))
    with made.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS orders (id integer)"))
    yield made
    made.dispose()


@pytest.fixture
async def async_engine(layout: Layout) -> AsyncIterator[AsyncEngine]:
    if layout.url.startswith("sqlite"):
        made = create_async_engine(
            f"sqlite+aiosqlite:///{layout.sqlite_path}",
            connect_args={"check_same_thread": False},
        )
        _sqlite_savepoints(made.sync_engine)
    else:
        made = create_async_engine(
            layout.url.replace("postgresql://", "postgresql+psycopg_async://", 1)
        )
    async with made.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS orders (id integer)"))
    yield made
    await made.dispose()


def orders(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM orders")).scalar_one())


def test_commit_runs_the_job_once(layout: Layout, engine: Engine) -> None:
    with Session(engine) as session, session.begin(), using(layout.app, session):
        session.execute(text("INSERT INTO orders VALUES (1)"))
        record.enqueue({"order": 1})
    assert orders(engine) == 1
    assert deliver(layout.app) == [{"order": 1}]
    assert deliver(layout.app) == [{"order": 1}]  # once, not again


def test_rollback_never_runs_it(layout: Layout, engine: Engine) -> None:
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        with using(layout.app, session):
            session.execute(text("INSERT INTO orders VALUES (1)"))
            record.enqueue({"order": 1})
        raise RuntimeError("the request fails after enqueueing")
    assert orders(engine) == 0
    assert deliver(layout.app) == []
    assert layout.app.count_jobs() == 0


def test_a_rolled_back_savepoint_drops_only_its_own_jobs(layout: Layout, engine: Engine) -> None:
    with Session(engine) as session, session.begin(), using(layout.app, session):
        record.enqueue({"step": "outer"})
        with pytest.raises(RuntimeError), session.begin_nested():
            record.enqueue({"step": "inner"})
            raise RuntimeError("roll back the savepoint")
        with session.begin_nested():
            record.enqueue({"step": "kept"})
    assert sorted(r["step"] for r in deliver(layout.app)) == ["kept", "outer"]


async def test_an_async_session_enqueues_in_its_transaction(
    layout: Layout, async_engine: AsyncEngine
) -> None:
    app = layout.app
    async with AsyncSession(async_engine) as session:
        async with session.begin(), using_async(app, session):
            await session.execute(text("INSERT INTO orders VALUES (1)"))
            await app.enqueue_async(record, {"step": "outer"})
            nested = await session.begin_nested()
            await app.enqueue_async(record, {"step": "inner"})
            await nested.rollback()
        with pytest.raises(RuntimeError):
            async with session.begin(), using_async(app, session):
                await app.enqueue_async(record, {"step": "rolled back"})
                raise RuntimeError("the request fails")
    assert [r["step"] for r in deliver(app)] == ["outer"]


# -- install: every session transaction is joined, with no using() ---------------------------


@pytest.fixture
def sessions(layout: Layout, engine: Engine) -> Iterator[sessionmaker[Session]]:
    made = sessionmaker(engine)
    installed = install(layout.app, made)
    yield made
    installed.remove()


def test_installed_commit_keeps_the_job_and_rollback_drops_it(
    layout: Layout, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    with sessions.begin() as session:
        session.execute(text("INSERT INTO orders VALUES (1)"))
        record.enqueue({"order": 1})
    with pytest.raises(RuntimeError), sessions.begin() as session:
        session.execute(text("INSERT INTO orders VALUES (2)"))
        record.enqueue({"order": 2})
        raise RuntimeError("the request fails after enqueueing")
    # A transaction begun by the session's first statement (autobegin, no begin()).
    session = sessions()
    session.execute(text("SELECT 1"))
    record.enqueue({"order": 3})
    session.rollback()
    session.close()
    assert orders(engine) == 1
    assert deliver(layout.app) == [{"order": 1}]


def test_installed_savepoints_keep_only_their_committed_jobs(
    layout: Layout, sessions: sessionmaker[Session]
) -> None:
    with sessions.begin() as session:
        record.enqueue({"step": "outer"})
        with pytest.raises(RuntimeError), session.begin_nested():
            record.enqueue({"step": "inner"})
            raise RuntimeError("roll back the savepoint")
        with session.begin_nested():
            record.enqueue({"step": "kept"})
    assert sorted(r["step"] for r in deliver(layout.app)) == ["kept", "outer"]


def test_installed_required_mode_refuses_an_enqueue_outside_a_transaction(
    layout: Layout, sessions: sessionmaker[Session]
) -> None:
    layout.app.mode = "required"
    with pytest.raises(OutboxNoTxError):
        record.enqueue({"order": "outside"})
    with sessions.begin():
        record.enqueue({"order": "inside"})
    assert deliver(layout.app) == [{"order": "inside"}]


def test_sessions_not_installed_are_left_as_they_were(
    layout: Layout, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """Only the installed sessions are followed: another factory's session is no transaction
    to an enqueue (which commits on its own, as without install)."""
    other = sessionmaker(engine)
    with pytest.raises(RuntimeError), other.begin():
        record.enqueue({"order": "own commit"})
        raise RuntimeError("the other session rolls back")
    assert deliver(layout.app) == [{"order": "own commit"}]


async def test_installed_async_sessions_join_with_enqueue_async(
    layout: Layout, async_engine: AsyncEngine
) -> None:
    app = layout.app
    made = async_sessionmaker(async_engine)
    installed = install(app, made)
    try:
        async with made.begin() as session:
            await session.execute(text("INSERT INTO orders VALUES (1)"))
            await record.enqueue_async({"step": "outer"})
            nested = await session.begin_nested()
            await record.enqueue_async({"step": "inner"})
            await nested.rollback()
            # Concurrent enqueues on the one connection run one after the other.
            await asyncio.gather(*(record.enqueue_async({"step": f"many {i}"}) for i in range(3)))
            with pytest.raises(ConfigurationError, match="enqueue_async"):
                record.enqueue({"step": "sync"})
        with pytest.raises(RuntimeError):
            async with made.begin():
                await record.enqueue_async({"step": "rolled back"})
                raise RuntimeError("the request fails")
    finally:
        installed.remove()
    assert sorted(r["step"] for r in deliver(app)) == ["many 0", "many 1", "many 2", "outer"]


@pytest.mark.parametrize("kind", ["engine", "session", "scoped_session", "class"])
def test_install_follows_each_kind_of_target(tmp_path: Path, kind: str) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    app = App(url, modules=[JOBS])
    engine = create_engine(url)
    subclass = type("MySession", (Session,), {})
    scoped = scoped_session(sessionmaker(engine))
    session = {"scoped_session": scoped(), "class": subclass(engine)}.get(kind, Session(engine))
    target = {"engine": engine, "session": session, "scoped_session": scoped, "class": subclass}
    installed = install(app, target[kind])
    try:
        with pytest.raises(RuntimeError), session.begin():
            record.enqueue({"kind": kind})
            raise RuntimeError("roll back")
        assert app.count_jobs() == 0
        with session.begin():
            record.enqueue({"kind": kind})
        assert app.count_jobs() == 1
    finally:
        installed.remove()
        session.close()
        engine.dispose()
        app.close()


def test_install_joins_or_raises_for_a_session_on_another_database(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", modules=[JOBS])
    engine = create_engine(f"sqlite:///{tmp_path / 'data.sqlite3'}")
    installed = install(app, engine)
    try:
        with (
            Session(engine) as session,
            session.begin(),
            pytest.raises(ConfigurationError, match="outbox"),
        ):
            record.enqueue({"order": 1})
        assert app.count_jobs() == 0
    finally:
        installed.remove()
        engine.dispose()
        app.close()


def test_a_transaction_ended_in_another_thread_is_not_joined(tmp_path: Path) -> None:
    """The session's transaction began here and ended on another thread: the enqueue here
    must not write on the connection the session gave back."""
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    app = App(url, modules=[JOBS])
    engine = create_engine(url)
    installed = install(app, engine)
    try:
        session = Session(engine)
        session.execute(text("SELECT 1"))  # autobegin, here
        ender = threading.Thread(target=session.commit)
        ender.start()
        ender.join()
        record.enqueue({"order": "after"})  # outside any transaction: commits on its own
        session.close()
        assert app.count_jobs() == 1
    finally:
        installed.remove()
        engine.dispose()
        app.close()


def test_installed_enqueue_after_a_flush_joins_at_once_on_sqlite(tmp_path: Path) -> None:
    """The session's flush holds SQLite's write lock (pysqlite's own transaction handling, the
    engine as SQLAlchemy makes it): the enqueue writes through that same connection, rather
    than waiting out the busy timeout on one of its own."""
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    app = App(url, modules=[JOBS])
    app.open()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id integer)"))
    installed = install(app, engine)
    try:
        started = time.monotonic()
        with Session(engine) as session, session.begin():
            session.execute(text("INSERT INTO orders VALUES (1)"))
            session.flush()
            record.enqueue({"order": 1})
        assert time.monotonic() - started < 5.0, "the enqueue waited for its own session's lock"
        assert orders(engine) == 1
        assert app.count_jobs() == 1
    finally:
        installed.remove()
        engine.dispose()
        app.close()


async def test_using_async_serialises_concurrent_enqueues_on_the_connection(
    layout: Layout, async_engine: AsyncEngine
) -> None:
    """``using_async`` and an installed ``AsyncSession`` join the same way: concurrent
    ``enqueue_async`` calls in the block run one at a time on the connection, each whole."""
    app = layout.app
    async with (
        AsyncSession(async_engine) as session,
        session.begin(),
        using_async(app, session),
    ):
        await asyncio.gather(*(app.enqueue_async(record, {"n": i}) for i in range(20)))
    assert sorted(r["n"] for r in deliver(app)) == list(range(20))


# -- install: transactions begun where the context does not carry back ----------------------


def test_installed_fastapi_sync_dependency_joins_the_sessions_transaction(
    layout: Layout, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """FastAPI runs a ``def`` dependency's ``session.begin()`` and the ``def`` endpoint in
    thread-pool calls, each in its own copy of the request's context: the endpoint's use of
    the session tells the enqueue which transaction it runs in. An enqueue before any use
    cannot be told, and ``App(mode="required")`` refuses it rather than commit it alone."""
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.testclient import TestClient

    api = FastAPI()  # the test module's annotations are strings: the dependency is a default

    def get_session() -> Iterator[Session]:
        with sessions() as session, session.begin():
            yield session

    @api.post("/orders/{order}")
    def create(order: int, session: Session = Depends(get_session)) -> dict[str, int]:  # noqa: B008
        session.execute(text("INSERT INTO orders VALUES (:id)"), {"id": order})
        record.enqueue({"order": order})
        if order == 2:
            raise HTTPException(422, "refused")  # rolls back the order and its job
        return {"order": order}

    @api.post("/early/{order}")
    def early(order: int, session: Session = Depends(get_session)) -> dict[str, int]:  # noqa: B008
        record.enqueue({"order": order})  # before the endpoint used the session
        session.execute(text("INSERT INTO orders VALUES (:id)"), {"id": order})
        return {"order": order}

    with TestClient(api) as client:
        assert client.post("/orders/1").status_code == 200
        assert client.post("/orders/2").status_code == 422
        layout.app.mode = "required"
        with pytest.raises(OutboxNoTxError):
            client.post("/early/3")
    assert orders(engine) == 1
    assert deliver(layout.app) == [{"order": 1}]


def test_installed_thread_pool_calls_join_the_transaction_their_session_is_in(
    layout: Layout, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """Two sessions begun, one after the other, in ``copy_context().run`` calls on one pool
    thread, then used in later calls there: each enqueue joins the transaction of the session
    its call uses (not the last one the thread began: that would put the first request's job
    in the second's transaction)."""
    with ThreadPoolExecutor(1) as pool:

        def call(fn: Any, *args: Any) -> Any:
            return pool.submit(contextvars.copy_context().run, fn, *args).result()

        first, second = sessions(), sessions()
        first_tx = call(first.begin)
        second_tx = call(second.begin)

        def work(session: Session, order: int) -> None:
            session.execute(text("INSERT INTO orders VALUES (:id)"), {"id": order})
            record.enqueue({"order": order})

        call(work, first, 1)
        call(first_tx.commit)
        call(work, second, 2)
        call(second_tx.rollback)
        first.close()
        second.close()
    assert orders(engine) == 1
    assert deliver(layout.app) == [{"order": 1}]
