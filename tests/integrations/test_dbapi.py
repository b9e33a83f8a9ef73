"""Plain DBAPI connections: ``sqlite3`` and psycopg (sync, and async through
``integrations.psycopg``), on every layout of their database: commit runs the job once,
rollback never, and a rolled-back savepoint drops only the jobs enqueued inside it."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from ultimat3.jobs.integrations import psycopg as psycopg_integration

from .conftest import Layout, deliver, record

SQLITE = pytest.mark.parametrize("layout", ["sqlite-same", "sqlite-outbox"], indirect=True)
POSTGRES = pytest.mark.parametrize(
    "layout",
    [
        pytest.param("pg-same", marks=pytest.mark.postgres),
        pytest.param("pg-outbox", marks=pytest.mark.postgres),
    ],
    indirect=True,
)


@SQLITE
def test_sqlite3_commit_rollback_and_savepoint(layout: Layout) -> None:
    app = layout.app
    with closing(sqlite3.connect(layout.sqlite_path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        with app.using(conn):
            record.enqueue({"step": "outer"})
            conn.execute("SAVEPOINT inner")
            record.enqueue({"step": "inner"})
            conn.execute("ROLLBACK TO inner")
            conn.execute("RELEASE inner")
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        with app.using(conn):
            record.enqueue({"step": "rolled back"})
        conn.execute("ROLLBACK")
    assert [r["step"] for r in deliver(layout.app)] == ["outer"]
    assert [r["step"] for r in deliver(layout.app)] == ["outer"]


@SQLITE
def test_sqlite3_legacy_mode_joins_the_implicit_transaction(layout: Layout) -> None:
    app = layout.app
    with closing(sqlite3.connect(layout.sqlite_path)) as conn:  # Python's default mode
        with app.using(conn):
            record.enqueue({"step": "rolled back"})
        conn.rollback()
        with app.using(conn):
            record.enqueue({"step": "committed"})
        conn.commit()
    assert [r["step"] for r in deliver(layout.app)] == ["committed"]


@POSTGRES
def test_psycopg_commit_rollback_and_savepoint(layout: Layout) -> None:
    import psycopg

    app = layout.app
    with psycopg.connect(layout.url) as conn:
        with conn.transaction(), app.using(conn):
            record.enqueue({"step": "outer"})
            with pytest.raises(RuntimeError), conn.transaction():
                record.enqueue({"step": "inner"})
                raise RuntimeError("roll back the savepoint")
        with pytest.raises(RuntimeError), conn.transaction(), app.using(conn):
            record.enqueue({"step": "rolled back"})
            raise RuntimeError("the request fails")
    assert [r["step"] for r in deliver(layout.app)] == ["outer"]


@POSTGRES
async def test_psycopg_async_connection(layout: Layout) -> None:
    import psycopg

    app = layout.app
    async with await psycopg.AsyncConnection.connect(layout.url) as conn:
        async with conn.transaction(), psycopg_integration.using(app, conn):
            await app.enqueue_async(record, {"step": "outer"})
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await app.enqueue_async(record, {"step": "inner"})
                    raise RuntimeError("roll back the savepoint")
            record.enqueue({"step": "sync, on the loop"})  # blocks the loop, still joins
            await conn.execute("SELECT 1")  # the connection is still the caller's to use
        with pytest.raises(RuntimeError):
            async with conn.transaction(), psycopg_integration.using(app, conn):
                await app.enqueue_async(record, {"step": "rolled back"})
                raise RuntimeError("the request fails")
    assert sorted(r["step"] for r in deliver(layout.app)) == ["outer", "sync, on the loop"]
