"""SQLAlchemy 2 sessions, sync and async, on every layout: commit runs the job once, rollback
never, and a rolled-back ``begin_nested()`` savepoint drops only the jobs enqueued inside it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from ultimat3.jobs.integrations.sqlalchemy import using, using_async

from .conftest import Layout, deliver, record


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
