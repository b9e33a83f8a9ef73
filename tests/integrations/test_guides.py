"""The SQLAlchemy, FastAPI and Django guides, run as written (their files, their commands, a
real worker subprocess each: ``tests/docs/examples.py`` says how), here too so that CI's
Django 6 environment (Python 3.12, ``tests/integrations`` only) runs the Django guide. The
Django project's CLI then lists each task under its own name, with the attempts Django gives."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from docs import test_examples
from docs.examples import ROOT
from docs.test_examples import Project, blocks, django_6

#: The docs tests' fixture: a fresh project folder as the working directory, on sys.path.
project_env = test_examples.project_env

GUIDES = ROOT / "docs" / "guides"


@pytest.mark.parametrize("name", ["sqlalchemy", "fastapi"])
def test_the_sqlalchemy_guides_run_as_written(
    name: str, tmp_path: Path, project_env: dict[str, str]
) -> None:
    project = Project(GUIDES / f"{name}.md", tmp_path, project_env)
    try:
        for block in blocks(project.page):
            project.run(block)
    finally:
        project.close()


@pytest.mark.skipif(not django_6(), reason="the guide's project needs Django 6 (Python 3.12+)")
def test_the_django_guide_runs_as_written(tmp_path: Path, project_env: dict[str, str]) -> None:
    project = Project(GUIDES / "django.md", tmp_path, project_env)
    try:
        for block in blocks(project.page):
            project.run(block)
            if "manage.py migrate" in block.code:  # before any worker or App opened the file
                with sqlite3.connect(tmp_path / "db.sqlite3") as db:
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
