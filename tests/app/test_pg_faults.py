"""Fault tests on PostgreSQL with real worker processes: kill -9 mid-drain, a server crash
(`pg_ctl stop -m immediate`) and restart during a drain, terminated sessions, and two workers
never running one job twice. The server is a cluster of this module's own, since a test stops
it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ultimat3.jobs import App, JobState

from .processes import HERE, last_words, ledger, poison_hurts_only_itself, wait_until

pytestmark = pytest.mark.postgres

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def env(cluster: Any, tmp_path: Path) -> dict[str, str]:
    if not cluster.is_running():
        cluster.start()
    name = f"faults_{tmp_path.name.replace('-', '_').lower()}"[:60]
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"postgresql://postgres@127.0.0.1:{cluster.port}/{name}",
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


FAST = (
    "--lease",
    "2s",
    "--heartbeat",
    "300ms",
    "--rescue-interval",
    "300ms",
    "--poll-interval",
    "200ms",
)


def test_kill_9_mid_drain(fault_app: App, env: dict[str, str], spawn: Spawn) -> None:
    import faultjobs

    ids = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0.5}] * 16)]
    a = spawn("--concurrency", "4", *FAST)
    wait_until(lambda: len({r[0] for r in ledger(env)}) >= 4, 30, "A to start 4 jobs")
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    spawn("--concurrency", "4", *FAST)
    wait_until(lambda: fault_app.count_jobs(state="completed") == 16, 60, "every job to complete")
    rescued = [i for i in ids if fault_app.get_job(i).errors]
    assert rescued, "the killed worker's jobs were rescued"
    for job_id in rescued:
        # Killed beside other jobs: rescued with the attempt given back, then run alone.
        got = fault_app.get_job(job_id)
        assert [e.kind for e in got.errors] == ["worker_lost"] and got.attempt == 1, got


def test_server_crash_and_restart_during_a_drain(
    fault_app: App, env: dict[str, str], spawn: Spawn, cluster: Any
) -> None:
    import faultjobs

    ids = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0.05}] * 300)]
    procs = [spawn("--concurrency", "4", *FAST) for _ in range(2)]
    # Both running (each has its row) before the crash: a worker still starting when the
    # server goes away exits, as documented (its supervisor starts it again), and on a loaded
    # machine the first one alone can run the 40 jobs while the second still starts.
    wait_until(lambda: len(fault_app.workers()) == 2, 30, "both workers to start")
    wait_until(lambda: len(ledger(env)) >= 40, 30, "the drain to be under way")
    cluster.stop("immediate")
    time.sleep(2)
    assert all(p.poll() is None for p in procs), (
        f"a worker died with the server: {last_words(procs)}"
    )
    cluster.start()
    wait_until(lambda: fault_app.count_jobs(state="completed") == 300, 90, "every job to complete")
    assert all(p.poll() is None for p in procs), f"a worker died: {last_words(procs)}"
    starts = Counter(r[0] for r in ledger(env) if r[3] == "start")
    assert set(starts) == set(ids)
    for job_id in ids:
        assert fault_app.get_job(job_id).state is JobState.COMPLETED


def test_terminated_sessions_heal(
    fault_app: App, env: dict[str, str], spawn: Spawn, cluster: Any
) -> None:
    import faultjobs

    spawn("--concurrency", "2", *FAST)
    first = faultjobs.ledger.enqueue({"sleep": 0})
    wait_until(lambda: fault_app.get_job(first.id).state is JobState.COMPLETED, 30, "a first job")
    assert cluster.terminate_backends("ultimat3-jobs%") > 0
    time.sleep(0.5)
    later = [faultjobs.ledger.enqueue({"sleep": 0}).id for _ in range(20)]
    wait_until(
        lambda: all(fault_app.get_job(i).state is JobState.COMPLETED for i in later),
        30,
        "jobs enqueued after the sessions were terminated",
    )


def test_two_workers_never_run_a_job_twice(
    fault_app: App, env: dict[str, str], spawn: Spawn
) -> None:
    import faultjobs

    ids = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0}] * 400)]
    procs = [spawn("--concurrency", "4", "--poll-interval", "200ms") for _ in range(2)]
    wait_until(lambda: fault_app.count_jobs(state="completed") == 400, 60, "400 completions")
    # As on SQLite: a worker has its signal handlers once its row is written.
    wait_until(lambda: len(fault_app.workers()) == 2, 60, "both workers to start")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=15) == 0
    starts = Counter(r[0] for r in ledger(env) if r[3] == "start")
    assert set(starts) == set(ids)
    assert max(starts.values()) == 1
    assert len({r[2] for r in ledger(env)}) == 2, "both processes took work"


def test_a_poison_job_hurts_only_itself(
    fault_app: App, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """As on SQLite (tests/app/test_faults.py), against PostgreSQL."""
    poison_hurts_only_itself(fault_app, env, spawn)
