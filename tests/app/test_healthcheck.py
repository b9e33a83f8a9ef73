"""``ultimat3-jobs healthcheck``: each failing condition has its exit code, text and JSON."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from ultimat3.jobs import App
from ultimat3.jobs.cli import cli
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import NewJob, WorkerInfo


def _run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--url", url, "healthcheck", *args])
    return result.exit_code, result.stdout


def _worker(app: App, worker_id: str, *, beat: datetime | None = None) -> None:
    now = datetime.now(UTC)
    info = WorkerInfo(worker_id, "h", 1, ("default",), 2, now, now, "0")
    app.driver.worker_beat(info, now=beat)


def _waiting(app: App, queue: str, waited: timedelta) -> None:
    key = uuid7()
    due = datetime.now(UTC) - waited
    app.driver.job_insert_many([NewJob(key, "x", queue, "{}", key, 1, run_at=due)])


def test_an_unreachable_database_is_3(tmp_path: Path) -> None:
    code, out = _run(f"sqlite:///{tmp_path / 'absent.sqlite3'}")
    assert code == 3
    assert out.startswith("FAIL database: no job database at ")
    code, out = (
        CliRunner()
        .invoke(cli, ["--url", "postgresql://nobody@127.0.0.1:1/none", "healthcheck", "--json"])
        .exit_code,
        "",
    )
    assert code == 3


def test_pending_migrations_are_4(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite3"
    sqlite3.connect(path).close()
    code, out = _run(f"sqlite:///{path}")
    assert code == 4
    assert "FAIL migrations: the job tables are missing" in out
    assert "fix: run `ultimat3-jobs migrate`" in out
    with closing(sqlite3.connect(path)) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == [], "a health check never migrates"


def test_too_few_live_workers_is_5_and_a_stale_row_does_not_count(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    app = App(url)
    try:
        app.open()
        code, out = _run(url)
        assert code == 5 and "FAIL workers: 0 live worker(s)" in out
        _worker(app, "h:1:old", beat=datetime.now(UTC) - timedelta(minutes=5))
        assert _run(url)[0] == 5
        _worker(app, "h:2:new")
        code, out = _run(url)
        assert code == 0 and "ok   workers: 1 live worker(s)" in out
        assert _run(url, "--min-workers", "2")[0] == 5
        assert _run(url, "--min-workers", "2", "--worker-stale", "10m")[0] == 0
    finally:
        app.close()


def test_an_old_ready_job_is_6_unless_its_queue_is_paused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    app = App(url)
    try:
        app.open()
        _worker(app, "h:1:live")
        _waiting(app, "mail", timedelta(seconds=30))
        assert _run(url)[0] == 0
        _waiting(app, "mail", timedelta(minutes=10))
        code, out = _run(url)
        assert code == 6
        assert "FAIL ready_age: the oldest ready job waited 6" in out and "(queue 'mail')" in out
        assert _run(url, "--max-ready-age", "1h")[0] == 0
        assert _run(url, "--queue", "default")[0] == 0
        code, out = _run(url, "--json")
        data = json.loads(out)
        assert data["healthy"] is False and data["exit_code"] == 6
        names = [(c["name"], c["ok"], c["exit_code"]) for c in data["checks"]]
        assert names == [
            ("database", True, 0),
            ("migrations", True, 0),
            ("workers", True, 0),
            ("ready_age", False, 6),
        ]
        assert data["checks"][3]["value"] >= 600
        app.pause_queue("mail")
        assert _run(url)[0] == 0
    finally:
        app.close()


def test_a_bad_threshold_names_its_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["healthcheck", "--max-ready-age", "5 minutes"])
    assert result.exit_code == 2
    assert "Invalid value for '--max-ready-age': '5 minutes'" in result.stderr
    assert 'write "5m"' in result.stderr


def test_ages_are_measured_on_the_clock_it_is_given() -> None:
    """A worker's heartbeat counts as live while the given clock says it is recent."""
    from ultimat3.jobs.clock import FakeClock
    from ultimat3.jobs.drivers.memory import MemoryDriver
    from ultimat3.jobs.health import run_checks

    start = datetime(2031, 3, 14, 9, 0, tzinfo=UTC)
    clock, driver = FakeClock(start), MemoryDriver()
    driver.worker_beat(WorkerInfo("w", "h", 1, ("default",), 2, start, start, "0"), now=start)
    fresh = {c.name: c.ok for c in run_checks(driver, clock=clock)}
    clock.advance(timedelta(minutes=2))
    stale = {c.name: c.ok for c in run_checks(driver, clock=clock)}
    assert (fresh["workers"], stale["workers"]) == (True, False)
