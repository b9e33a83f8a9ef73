"""Fixtures of the integration tests: the database layouts an application can have.

- ``sqlite-same``: your data and the jobs in one SQLite file (the job row joins directly).
- ``sqlite-outbox``: your data in one SQLite file, the jobs in another (outbox + relay).
- ``pg-same``: your data and the jobs in one PostgreSQL database.
- ``pg-outbox``: your data in PostgreSQL, the jobs in a SQLite file (outbox + relay).

Each layout gives the URL of your database and an App; ``deliver(app)`` runs the relay (when
there is an outbox) and then every due job, and returns what ran.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, job
from ultimat3.jobs.testing import drain

RUNS: list[Any] = []


@job
def record(value: Any) -> None:
    RUNS.append(value)


JOBS = types.ModuleType("integration_test_jobs")
JOBS.record = record  # type: ignore[attr-defined]


@dataclass
class Layout:
    name: str
    #: Your database, as a plain URL: sqlite:///path or postgresql://user@host:port/db.
    url: str
    app: App

    @property
    def outbox(self) -> bool:
        return self.name.endswith("outbox")

    @property
    def sqlite_path(self) -> str:
        return self.url[len("sqlite:///") :]


def pg_url(conninfo: str) -> str:
    if "://" in conninfo:
        return conninfo
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(conninfo)
    return (
        f"postgresql://{parts.get('user', '')}@{parts.get('host', '127.0.0.1')}:"
        f"{parts.get('port', 5432)}/{parts['dbname']}"
    )


def deliver(app: App) -> list[Any]:
    """Publish the outbox (if any), run every due job, and return what ran, in order."""
    if app._outbox is not None:
        app.relay().tick()
    drain(app)
    return list(RUNS)


@pytest.fixture(autouse=True)
def _jobs_module() -> Iterator[None]:
    RUNS.clear()
    sys.modules[JOBS.__name__] = JOBS
    yield
    sys.modules.pop(JOBS.__name__, None)
    RUNS.clear()


@pytest.fixture(
    params=[
        "sqlite-same",
        "sqlite-outbox",
        pytest.param("pg-same", marks=pytest.mark.postgres),
        pytest.param("pg-outbox", marks=pytest.mark.postgres),
    ]
)
def layout(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Layout]:
    name: str = request.param
    jobs_file = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    if name == "sqlite-same":
        url = jobs_file
        app = App(url, modules=[JOBS])
    elif name == "sqlite-outbox":
        url = f"sqlite:///{tmp_path / 'data.sqlite3'}"
        app = App(jobs_file, modules=[JOBS], outbox=url)
    else:
        url = pg_url(request.getfixturevalue("pg_dsn"))
        app = (
            App(url, modules=[JOBS])
            if name == "pg-same"
            else App(jobs_file, modules=[JOBS], outbox=url)
        )
    app.open()
    if app._outbox is not None:
        app.relay()  # opens and migrates the outbox before any transaction uses it
    yield Layout(name, url, app)
    app.close()
