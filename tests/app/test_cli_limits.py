"""The command line shows each job's limits (`schedule`) and why a job waits (`jobs show`)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from ultimat3.jobs.records import ClaimParams, Cycle

from .cliapp import app_module, run

APP_MODULE = """
from ultimat3.jobs import App, Limit, Rate, Unique, job

@job(concurrency=Limit(1, key=lambda o: o["account"]), rate=Rate(100, per="1m"))
def charge(input):
    pass

@job(unique=Unique(period="1h", on_conflict="replace"))
def digest(input):
    pass

@job
def plain(input):
    pass

app = App(URL, modules=[__import__(__name__)])
"""


@pytest.fixture
def app_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from app_module(tmp_path, monkeypatch, APP_MODULE, "clilimits")


def test_schedule_shows_each_jobs_limits(app_ref: str) -> None:
    code, out, _ = run("--app", app_ref, "schedule")
    assert code == 0
    charge = next(line for line in out.splitlines() if line.startswith("charge"))
    assert "concurrency 1 per job by key; rate 100 starts per 1m" in charge
    plain = next(line for line in out.splitlines() if line.startswith("plain"))
    assert plain.rstrip().endswith("-")
    _, out, _ = run("--app", app_ref, "schedule", "--json")
    limits = {j["job"]: j["limits"] for j in json.loads(out)["jobs"]}
    assert limits["digest"] == {
        "unique": "unique per 1h while scheduled/available/running/completed, on conflict replace"
    }
    assert limits["plain"] == {}


def test_jobs_show_says_why_a_job_waits(app_ref: str) -> None:
    module = importlib.import_module(app_ref.split(":")[0])
    app = module.app
    first = app.enqueue(module.charge, {"account": 7}).id
    second = app.enqueue(module.charge, {"account": 7}).id
    params = ClaimParams(("default",), 5, timedelta(seconds=30), "w", limited=True)
    assert [job.id for job in app.driver.job_cycle(Cycle(claim=params)).claimed] == [first]
    code, out, _ = run("--app", app_ref, "jobs", "show", second)
    assert code == 0
    assert "waiting_on: concurrency 1/1 on job:charge=7" in out
    assert "limits: 1/1 running, 1/100 starts in 0:01:00 on job:charge=7" in out
    _, out, _ = run("--app", app_ref, "jobs", "show", first, "--json")
    shown = json.loads(out)
    assert "waiting_on" not in shown, "a running job waits on nothing"
    plain = app.enqueue(module.plain, {}).id
    _, out, _ = run("--app", app_ref, "jobs", "show", plain, "--json")
    assert "limits" not in json.loads(out)
