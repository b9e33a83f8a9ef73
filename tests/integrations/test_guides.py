"""The SQLAlchemy, FastAPI and Django guides, run as written (their files, their commands, a
real worker subprocess each: ``tests/docs/examples.py`` says how), here too so that CI's
Django 6 environment (Python 3.12, ``tests/integrations`` only) runs the Django guide. The
SQLAlchemy and FastAPI guides run on SQLite, then on PostgreSQL with nothing changed but the
one URL they read (``DATABASE_URL``). The Django project's CLI then lists each task under its
own name, with the attempts Django gives."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from docs import test_examples
from docs.examples import ROOT
from docs.test_examples import Project, blocks, django_6

#: The docs tests' fixture: a fresh project folder as the working directory, on sys.path.
project_env = test_examples.project_env

GUIDES = ROOT / "docs" / "guides"


def run_guide(project: Project) -> int:
    """Runs the page's blocks; the pid of its one background worker, still running."""
    for block in blocks(project.page):
        project.run(block)
    (worker,) = [proc for block, proc in project.background if "worker" in block.code]
    assert worker.poll() is None, "the guide's worker ended early"
    return worker.pid


def settled(rows: Callable[[], list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """``rows()`` (state first) once every job the page enqueued is completed: the SQLAlchemy
    guide's last block enqueues after its check, for the worker still running."""
    deadline = time.monotonic() + 30
    found = rows()
    while any(row[0] != "completed" for row in found) and time.monotonic() < deadline:
        time.sleep(0.1)
        found = rows()
    return found


def ran_by(worker_ids: list[str]) -> set[int]:
    """The pids in workers' ids (``host:pid:token``)."""
    return {int(worker_id.split(":")[1]) for worker_id in worker_ids}


@pytest.mark.parametrize("name", ["sqlalchemy", "fastapi"])
def test_the_sqlalchemy_guides_run_as_written(
    name: str, tmp_path: Path, project_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)  # the guide's default: a SQLite file
    project_env.pop("DATABASE_URL", None)
    project = Project(GUIDES / f"{name}.md", tmp_path, project_env)
    try:
        worker = run_guide(project)
        with closing(sqlite3.connect(tmp_path / "shop.sqlite3")) as db:
            query = "SELECT state, worker_id FROM x_jobs"
            rows = settled(lambda: db.execute(query).fetchall())
    finally:
        project.close()
    assert [state for state, _ in rows] == ["completed"] * (1 if name == "fastapi" else 2)
    assert ran_by([worker_id for _, worker_id in rows]) == {worker}


@pytest.mark.parametrize("name", ["sqlalchemy", "fastapi"])
def test_the_sqlalchemy_guides_move_to_postgres_by_one_url(
    name: str,
    tmp_path: Path,
    project_env: dict[str, str],
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guide's files unchanged, ``DATABASE_URL`` set to SQLAlchemy's psycopg URL for the
    page's code and its worker subprocess: the orders, the job and the worker that ran it are
    all in PostgreSQL, and no SQLite file was made."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_dsn)
    url = f"postgresql+psycopg://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    monkeypatch.setenv("DATABASE_URL", url)  # the page's Python blocks, run in this process
    project_env["DATABASE_URL"] = url  # its commands: the worker
    project = Project(GUIDES / f"{name}.md", tmp_path, project_env)
    try:
        worker = run_guide(project)
        with psycopg.connect(pg_dsn) as db:
            query = "SELECT state, name, worker_id FROM ultimat3_jobs.x_jobs"
            jobs = settled(lambda: db.execute(query).fetchall())
            orders = [order for (order,) in db.execute("SELECT id FROM orders ORDER BY id")]
    finally:
        project.close()
    enqueued = 1 if name == "fastapi" else 2
    assert [(state, job) for state, job, _ in jobs] == [("completed", "send_receipt")] * enqueued
    assert ran_by([worker_id for _, _, worker_id in jobs]) == {worker}
    assert orders == ([1] if name == "fastapi" else [42, 44])  # the committed ones only
    assert list(tmp_path.glob("*.sqlite3*")) == [], "a SQLite file was made"


@pytest.mark.skipif(not django_6(), reason="the guide's project needs Django 6 (Python 3.12+)")
def test_the_django_guide_runs_as_written(tmp_path: Path, project_env: dict[str, str]) -> None:
    project = Project(GUIDES / "django.md", tmp_path, project_env)
    try:
        for block in blocks(project.page):
            project.run(block)
            if "manage.py migrate" in block.code:  # before any worker or App opened the file
                with closing(sqlite3.connect(tmp_path / "db.sqlite3")) as db:
                    versions = [v for (v,) in db.execute("SELECT version FROM x_migrations")]
                assert versions, "manage.py migrate created no job tables"
        env = {**project_env, "DJANGO_SETTINGS_MODULE": "myproject.settings"}
        cli = [sys.executable, "-m", "ultimat3.jobs", "--app", "ultimat3.jobs.integrations.django"]

        def run(*args: str) -> object:
            done = subprocess.run(
                [*cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        schedule = run("schedule", "--json")
        attempts = {j["job"]: j["attempts"] for j in schedule["jobs"]}  # type: ignore[index]
        assert attempts["shop.tasks.total"] == 1
        assert attempts["shop.tasks.welcome"] == 1
        listed = run("jobs", "list", "--json")
        by_name = {j["name"]: j["state"] for j in listed}  # type: ignore[attr-defined]
        assert by_name == {
            "send_receipt": "completed",
            "shop.tasks.welcome": "completed",
            "shop.tasks.total": "completed",
        }, by_name
    finally:
        project.close()
