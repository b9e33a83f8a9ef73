"""SQLAlchemy's URLs (``postgresql+psycopg://``, ``sqlite+aiosqlite:///``, ...) name the job
database too, so an app keeps one setting for its engine and its jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from ultimat3.jobs import App, ConfigurationError, JobState, job

from .cliapp import run


@job
def noop(input: dict[str, Any]) -> None:
    return None


@pytest.mark.parametrize("scheme", ["sqlite+pysqlite", "sqlite+aiosqlite"])
def test_a_sqlalchemy_sqlite_url_opens_the_sqlite_file(
    tmp_path: Path, make_module: Any, scheme: str
) -> None:
    path = tmp_path / "app.sqlite3"
    app = App(f"{scheme}:///{path}", modules=[make_module(noop=noop)])
    try:
        assert app.url == f"sqlite:///{path}"
        with app.transaction():
            job_id = noop.enqueue({}).id
        assert app.get_job(job_id).state is JobState.AVAILABLE
        assert app.driver.display_url == f"sqlite:///{path}"
    finally:
        app.close()
    assert path.exists()


@pytest.mark.parametrize("scheme", ["postgresql+psycopg", "postgresql+psycopg_async"])
def test_a_sqlalchemy_postgres_url_opens_the_postgres_database(
    pg_dsn: str, make_module: Any, scheme: str
) -> None:
    parts = conninfo_to_dict(pg_dsn)
    url = f"{scheme}://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    app = App(url, modules=[make_module(noop=noop)])
    try:
        with app.transaction():
            job_id = noop.enqueue({}).id
        assert app.get_job(job_id).state is JobState.AVAILABLE
        assert app.driver.display_url.startswith("postgresql://")
    finally:
        app.close()


def test_a_client_library_it_does_not_use_is_refused_with_the_schemes_it_takes() -> None:
    with pytest.raises(ConfigurationError) as raised:
        App("postgresql+asyncpg://u@localhost/db")
    assert raised.value.cause == (
        "the URL scheme postgresql+asyncpg:// names a client library this package does not use"
    )
    assert "postgresql+psycopg://" in (raised.value.fix or "")


def test_the_command_line_takes_a_sqlalchemy_url(tmp_path: Path) -> None:
    url = f"sqlite+pysqlite:///{tmp_path / 'cli.sqlite3'}"
    code, out, _ = run("--url", url, "migrate")
    assert code == 0 and f"migrated sqlite:///{tmp_path / 'cli.sqlite3'}" in out
    code, _, _ = run("--url", url, "queues", "list")
    assert code == 0
