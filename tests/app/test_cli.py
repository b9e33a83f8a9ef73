"""The command line: every command, --json, and errors as cause + fix with exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ultimat3.jobs.cli import cli

APP_MODULE = """
from ultimat3.jobs import App, Retry, job, task

@job(retry=Retry(attempts=6, delay="1s", max_delay="10s", jitter=False))
def resize(input):
    pass

@job(queue="mail")
def poison(input):
    raise ValueError("always")

nightly = task("30 2 * * *", tz="America/New_York", enqueue=lambda: [(resize, {})])

app = App(URL, modules=[__import__(__name__)])
"""


@pytest.fixture
def app_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"cliapp_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(
        APP_MODULE.replace("URL", repr(f"sqlite:///{tmp_path / 'cli.sqlite3'}"))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:app"
    sys.modules.pop(name, None)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_schedule_text_and_json(app_ref: str) -> None:
    code, out, _ = run("--app", app_ref, "schedule")
    assert code == 0
    assert "resize" in out and "1s, 2s, 4s, 8s, 10s" in out
    assert "nightly" in out
    code, out, _ = run("--app", app_ref, "schedule", "--json")
    data = json.loads(out)
    resize = next(j for j in data["jobs"] if j["job"] == "resize")
    assert resize["schedule_ms"] == [1000, 2000, 4000, 8000, 10000]
    (nightly,) = data["tasks"]
    assert len(nightly["next"]) == 5 and nightly["tz"] == "America/New_York"


def test_jobs_commands(app_ref: str) -> None:
    import importlib

    module = importlib.import_module(app_ref.split(":")[0])
    app = module.app
    job_id = module.poison.enqueue({"n": 1}, max_attempts=1).id
    app.worker().drain()
    code, out, _ = run("--app", app_ref, "jobs", "list", "--state", "dead", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["id"] == job_id and row["last_error"].startswith("ValueError")
    _, out, _ = run("--app", app_ref, "jobs", "show", job_id, "--json")
    shown = json.loads(out)
    assert shown["input"] == {"n": 1} and shown["errors"][0]["kind"] == "ValueError"
    code, out, _ = run("--app", app_ref, "jobs", "show", job_id)
    assert code == 0 and "Traceback" in out
    code, out, _ = run("--app", app_ref, "jobs", "retry", job_id)
    assert code == 0 and f"retry: {job_id}" in out
    code, _, err = run("--app", app_ref, "jobs", "discard", job_id)
    assert code == 1 and "unchanged" in err  # it is available again, not dead
    code, out, _ = run("--app", app_ref, "jobs", "cancel", job_id)
    assert code == 0
    code, out, _ = run("--app", app_ref, "jobs", "discard", job_id, "--json")
    assert json.loads(out) == {"discard": [job_id], "unchanged": []}


def test_queue_commands(app_ref: str) -> None:
    assert run("--app", app_ref, "queues", "pause", "mail")[0] == 0
    code, out, _ = run("--app", app_ref, "queues", "list", "--json")
    assert code == 0
    assert {"queue": "mail", "paused": True, "counts": {}} in json.loads(out)
    assert run("--app", app_ref, "queues", "resume", "mail")[0] == 0


def test_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    code, out, _ = run("--url", url, "migrate", "--sql")
    assert code == 0 and "create table" in out.lower() and "x_jobs" in out
    code, out, _ = run("--url", url, "migrate")
    assert code == 0 and "migrated" in out


def test_library_errors_print_cause_and_fix(tmp_path: Path) -> None:
    code, _, err = run("--url", "mysql://nope", "jobs", "list")
    assert code == 1
    assert "error:" in err and "fix:" in err and "Traceback" not in err
    code, _, err = run("--app", "no_such_module_xyz:app", "worker")
    assert code == 1 and "fix:" in err
    code, _, err = run("--url", f"sqlite:///{tmp_path / 'x.sqlite3'}", "jobs", "show", "nope")
    assert code == 1 and "no job" in err


def test_usage_errors_exit_2() -> None:
    assert run("jobs", "list", "--state", "bogus")[0] == 2
    assert run("no-such-command")[0] == 2


def test_worker_without_jobs_explains(tmp_path: Path) -> None:
    code, _, err = run("--url", f"sqlite:///{tmp_path / 'w.sqlite3'}", "worker")
    assert code == 1 and "no queue" in err


def test_demo_module_importable() -> None:
    from ultimat3.jobs import demo

    assert callable(demo.run_demo)


def test_migrate_covers_the_outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "outboxapp_cli.py"
    module.write_text(
        "from ultimat3.jobs import App\n"
        f"app = App({str('sqlite:///' + str(tmp_path / 'jobs.sqlite3'))!r}, "
        f"outbox={str('sqlite:///' + str(tmp_path / 'business.sqlite3'))!r})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = run("--app", "outboxapp_cli:app", "migrate", "--sql")
    assert code == 0 and "x_outbox" in out and "outbox migration 1" in out
    code, out, _ = run("--app", "outboxapp_cli:app", "migrate")
    assert code == 0 and "migrated the outbox" in out
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(tmp_path / "business.sqlite3")) as conn:
        assert conn.execute("select count(*) from x_outbox").fetchone()[0] == 0
    sys.modules.pop("outboxapp_cli", None)
