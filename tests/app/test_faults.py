"""Crash and signal tests with real worker processes on one SQLite file.

Each worker is `python -m ultimat3.jobs --app faultjobs:app worker`; jobs append to an
fsync'd ledger so a run that happened is visible even if its process died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from ultimat3.jobs import App, JobState

from .processes import HERE, ledger, poison_hurts_only_itself, wait_until


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"sqlite:///{tmp_path / 'faults.sqlite3'}",
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def test_kill_9_mid_flight_rescues_the_killed_workers_jobs(
    fault_app: App, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    import faultjobs

    ids = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 1.0}] * 12)]
    a = spawn(
        "--concurrency", "4", "--lease", "1s", "--heartbeat", "200ms", "--poll-interval", "100ms"
    )
    wait_until(
        lambda: len({r[0] for r in ledger(env) if r[3] == "start"}) >= 4, 20, "A to start 4 jobs"
    )
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    killed = {r[0] for r in ledger(env) if r[2] == a.pid} - {
        r[0] for r in ledger(env) if r[3] == "done"
    }
    assert killed, "worker A had jobs in flight when it was killed"
    spawn(
        "--concurrency",
        "4",
        "--lease",
        "1s",
        "--heartbeat",
        "200ms",
        "--rescue-interval",
        "200ms",
        "--poll-interval",
        "100ms",
    )
    wait_until(lambda: fault_app.count_jobs(state="completed") == 12, 40, "every job to complete")
    for job_id in ids:
        got = fault_app.get_job(job_id)
        if job_id in killed:
            # Killed beside other jobs: rescued with the attempt given back, then run alone.
            assert got.attempt == 1, got
            assert [e.kind for e in got.errors] == ["worker_lost"]
        else:
            assert got.attempt == 1 and not got.errors, got
    starts = Counter(r[0] for r in ledger(env) if r[3] == "start")
    assert all(starts[i] == (2 if i in killed else 1) for i in ids)


def test_sigterm_drains_then_releases(
    fault_app: App, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    import faultjobs

    short = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0.5}] * 2)]
    long = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 30}] * 2)]
    waiting = [
        r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0}] * 3, delay="0s")
    ]
    proc = spawn("--concurrency", "4", "--shutdown-grace", "1500ms", "--poll-interval", "100ms")
    wait_until(
        lambda: len({r[0] for r in ledger(env) if r[3] == "start"}) >= 4, 20, "4 jobs running"
    )
    started = {r[0] for r in ledger(env)}
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - sent < 5
    for job_id in short:
        assert fault_app.get_job(job_id).state is JobState.COMPLETED
    for job_id in long:
        got = fault_app.get_job(job_id)
        assert got.state is JobState.AVAILABLE and got.attempt == 0, got
    for job_id in waiting:
        if job_id not in started:
            assert fault_app.get_job(job_id).state is JobState.AVAILABLE


def test_second_sigterm_stops_at_once(
    fault_app: App, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    import faultjobs

    long = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 30}] * 2)]
    proc = spawn("--concurrency", "2", "--shutdown-grace", "60s", "--poll-interval", "100ms")
    wait_until(lambda: len(ledger(env)) >= 2, 20, "2 jobs running")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.poll() is None  # waiting out its 60 s grace
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    for job_id in long:
        got = fault_app.get_job(job_id)
        assert got.state is JobState.AVAILABLE and got.attempt == 0, got


def test_a_job_that_kills_its_worker_ends_dead(
    fault_app: App, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    import faultjobs

    poison = faultjobs.suicide.enqueue({}).id
    others = [
        r.id
        for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0}] * 100, max_attempts=10)
    ]
    args = (
        "--concurrency",
        "4",
        "--lease",
        "1s",
        "--heartbeat",
        "200ms",
        "--rescue-interval",
        "200ms",
        "--poll-interval",
        "100ms",
    )
    restarts = 0
    deadline = time.monotonic() + 60
    proc = spawn(*args)
    while time.monotonic() < deadline:
        done = fault_app.count_jobs(state="completed")
        if fault_app.get_job(poison).state is JobState.DEAD and done == 100:
            break
        if proc.poll() is not None:
            restarts += 1
            proc = spawn(*args)
        time.sleep(0.05)
    dead = fault_app.get_job(poison)
    assert dead.state is JobState.DEAD and dead.attempt == 3
    # Three crashes alone count; a first one beside other jobs, if any, did not.
    assert {e.kind for e in dead.errors} == {"worker_lost"}
    assert sum("ran alone" in e.message for e in dead.errors) == 3
    assert len(dead.errors) <= 4
    assert restarts <= 4
    assert all(fault_app.get_job(i).state is JobState.COMPLETED for i in others)


def test_four_workers_never_run_a_job_twice(
    fault_app: App, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    import faultjobs

    ids = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0}] * 400)]
    procs = [spawn("--concurrency", "4", "--poll-interval", "100ms") for _ in range(4)]
    wait_until(lambda: fault_app.count_jobs(state="completed") == 400, 60, "400 completions")
    # A worker that starts slowly (a loaded machine) may not have installed its signal
    # handlers yet when the others have drained the queue; it has once its row is written.
    wait_until(lambda: len(fault_app.workers()) == 4, 60, "every worker to start")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=15) == 0
    starts = Counter(r[0] for r in ledger(env) if r[3] == "start")
    assert set(starts) == set(ids)
    assert max(starts.values()) == 1
    assert len({r[2] for r in ledger(env)}) >= 2, "the work was shared between processes"


def test_a_poison_job_hurts_only_itself(
    fault_app: App, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    poison_hurts_only_itself(fault_app, env, spawn)
