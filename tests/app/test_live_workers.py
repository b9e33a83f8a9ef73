"""The workers table with real worker processes: a row while a worker lives, gone on a
clean exit, pruned by the maintenance node after a kill -9; ``workers`` and ``jobs show``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from ultimat3.jobs import App

from .processes import HERE, wait_until

FAST = (
    "--concurrency",
    "3",
    "--lease",
    "1s",
    "--heartbeat",
    "300ms",
    "--rescue-interval",
    "200ms",
    "--poll-interval",
    "100ms",
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"sqlite:///{tmp_path / 'workers.sqlite3'}",
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ultimat3.jobs", "--app", "faultjobs:app", *args],
        env=env,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _pids(app: App) -> set[int]:
    return {w.pid for w in app.workers()}


def test_a_row_while_alive_gone_on_clean_exit(fault_app: App, env: dict[str, str], spawn) -> None:  # type: ignore[no-untyped-def]
    from ultimat3.jobs import __version__

    proc = spawn(*FAST, "--queue", "default")
    wait_until(lambda: proc.pid in _pids(fault_app), 30, "the worker's row")
    (row,) = fault_app.workers()
    assert row.queues == ("default",) and row.concurrency == 3
    assert row.version == __version__ and row.host and row.id.split(":")[1] == str(proc.pid)
    first = row.heartbeat_at
    wait_until(lambda: fault_app.workers()[0].heartbeat_at > first, 10, "a heartbeat")

    listed = _cli(env, "workers", "--json")
    assert listed.returncode == 0, listed.stderr
    (data,) = json.loads(listed.stdout)
    assert data["id"] == row.id and data["pid"] == proc.pid and data["queues"] == ["default"]
    text = _cli(env, "workers")
    assert text.stdout.splitlines()[0].split() == [
        "ID",
        "PID",
        "QUEUES",
        "CONCURRENCY",
        "STARTED",
        "HEARTBEAT",
        "VERSION",
    ]
    assert row.id in text.stdout and "s ago" in text.stdout

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert fault_app.workers() == []
    assert _cli(env, "workers").stdout.strip() == "no live workers"


def test_a_killed_workers_row_is_pruned_and_jobs_show_links_to_it(
    fault_app: App,
    env: dict[str, str],
    spawn,  # type: ignore[no-untyped-def]
) -> None:
    import faultjobs

    victim = spawn(*FAST)
    wait_until(lambda: victim.pid in _pids(fault_app), 30, "the first worker's row")
    long_job = faultjobs.ledger.enqueue({"sleep": 60}).id
    wait_until(
        lambda: fault_app.get_job(long_job).worker_id is not None, 30, "the job to be running"
    )
    worker_id = fault_app.get_job(long_job).worker_id
    assert worker_id == next(w.id for w in fault_app.workers() if w.pid == victim.pid)

    shown = _cli(env, "jobs", "show", long_job, "--json")
    assert json.loads(shown.stdout)["worker"]["pid"] == victim.pid
    shown = _cli(env, "jobs", "show", long_job)
    assert f"{worker_id} (live: pid {victim.pid} on " in shown.stdout

    survivor = spawn(*FAST)
    wait_until(lambda: survivor.pid in _pids(fault_app), 30, "the second worker's row")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert victim.pid in _pids(fault_app)  # no clean exit: the row stays until it is stale

    # Three leases of staleness, and the dead worker's maintenance leadership (15 s) to lapse
    # if it held it.
    wait_until(lambda: victim.pid not in _pids(fault_app), 40, "the killed row to be pruned")
    assert _pids(fault_app) == {survivor.pid}


def test_jobs_show_says_when_a_running_jobs_worker_has_no_row(
    fault_app: App, env: dict[str, str]
) -> None:
    import faultjobs

    from ultimat3.jobs.records import ClaimParams, Cycle

    job_id = faultjobs.ledger.enqueue({}).id
    (claimed,) = fault_app.driver.job_cycle(
        Cycle(claim=ClaimParams(("default",), 1, timedelta(minutes=5), "ghost:1:aaaaaa"))
    ).claimed
    assert claimed.id == job_id
    shown = _cli(env, "jobs", "show", job_id)
    assert "worker_id: ghost:1:aaaaaa (no live worker has this id: it exited or was killed" in (
        shown.stdout
    )
    assert json.loads(_cli(env, "jobs", "show", job_id, "--json").stdout)["worker"] is None
