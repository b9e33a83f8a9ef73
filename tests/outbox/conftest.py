"""Fixtures of the outbox tests: one outbox store per kind ("memory", "sqlite", "postgres"),
each with a way to open a business transaction on the store's database, and an App whose jobs
live in a SQLite file of their own (another database than the store's, as in production)."""

from __future__ import annotations

import sqlite3
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, job
from ultimat3.jobs.outbox_store import OutboxStore
from ultimat3.jobs.outboxes import open_store
from ultimat3.jobs.outboxes.memory import MemoryOutboxStore

RUNS: list[Any] = []


@job(queue="a")
def job_a(value: Any) -> None:
    RUNS.append(("a", value))


@job(queue="b")
def job_b(value: Any) -> None:
    RUNS.append(("b", value))


@job(idempotency_key=lambda value: str(value["key"]))
def keyed(value: Any) -> None:
    RUNS.append(("keyed", value))


JOBS = types.ModuleType("outbox_test_jobs")
JOBS.job_a = job_a  # type: ignore[attr-defined]
JOBS.job_b = job_b  # type: ignore[attr-defined]
JOBS.keyed = keyed  # type: ignore[attr-defined]


@dataclass
class StoreSpec:
    """A store kind: its URL and how to open a transaction on the business database."""

    kind: str
    url: str
    store: OutboxStore
    #: ``with spec.begin() as conn:`` — a caller's transaction on the store's database,
    #: committed on normal exit and rolled back on an exception.
    begin: Callable[[], AbstractContextManager[Any]]


@pytest.fixture(autouse=True)
def _clear_runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreSpec]:
    kind: str = request.param
    if kind == "memory":
        memory = MemoryOutboxStore()
        yield StoreSpec(kind, "memory://", memory, memory.transaction)
        return
    if kind == "sqlite":
        path = tmp_path / "business.sqlite3"
        url = f"sqlite:///{path}"
        store = open_store(url)
        store.migrate()
        conns: list[sqlite3.Connection] = []

        @contextmanager
        def begin_sqlite() -> Iterator[sqlite3.Connection]:
            conn = sqlite3.connect(path, isolation_level=None)
            conns.append(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")
            finally:
                conn.close()

        yield StoreSpec(kind, url, store, begin_sqlite)
        store.close()
        return
    import psycopg

    dsn: str = request.getfixturevalue("pg_dsn")
    url = dsn if "://" in dsn else _url(dsn)
    store = open_store(url)
    store.migrate()

    @contextmanager
    def begin_pg() -> Iterator[Any]:
        with psycopg.connect(dsn) as conn, conn.transaction():
            yield conn

    yield StoreSpec(kind, url, store, begin_pg)
    store.close()


def _url(conninfo: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(conninfo)
    return (
        f"postgresql://{parts.get('user', '')}@{parts.get('host', '127.0.0.1')}:"
        f"{parts.get('port', 5432)}/{parts['dbname']}"
    )


@pytest.fixture
def jobs_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.sqlite3'}"


@pytest.fixture
def app(spec: StoreSpec, jobs_url: str) -> Iterator[App]:
    sys.modules[JOBS.__name__] = JOBS
    made = App(jobs_url, modules=[JOBS], outbox=spec.store)
    yield made
    made.close()
    sys.modules.pop(JOBS.__name__, None)
