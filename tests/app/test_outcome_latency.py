"""An outcome is written as soon as its job returns, whatever the poll interval.

The worker's leader sleeps until a job is due (a poll, a NOTIFY, a commit to the SQLite file);
the handler thread whose job returns wakes it to write the outcome. These tests use a poll
interval of a minute: a completion that waited for the next poll would miss every bound here
(and, with a 30 s lease, the job would be rescued as ``worker_lost`` and run again).

- In one process (the worker's own threads), on every driver: a lone job's completion is in
  the database well within a second of its handler's return, while the leader sleeps.
- With real worker processes (``ultimat3-jobs worker --poll-interval 60s``), on SQLite and
  PostgreSQL: the same, for jobs one after the other.
- A worker process killed (-9) 200 ms after a handler returned: the completion is already in
  the database, on SQLite and PostgreSQL; nothing runs again.
- PostgreSQL restarted under a drain (``pg_ctl stop -m immediate``, then start): the queue
  drains within a few seconds of the restart, not at the next poll.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ultimat3.jobs import App, JobState, job

from .processes import HERE, ledger, wait_until

Spawn = Callable[..., subprocess.Popen[bytes]]

#: Bounds of a second or less: measured while no other test loads the machine.
pytestmark = pytest.mark.alone

#: Far longer than any bound below: a write that waited for a poll shows.
LONG_POLL = "60s"


def test_a_lone_jobs_completion_is_written_while_the_cycle_loop_sleeps(
    make_app: Callable[..., App], make_module: Callable[..., Any]
) -> None:
    go = threading.Event()
    returned: list[float] = []

    @job
    def lone(input: dict[str, Any]) -> None:
        assert go.wait(30)
        returned.append(time.monotonic())

    app = make_app(make_module(lone=lone))
    worker = app.worker(concurrency=4, poll_interval=LONG_POLL)

    def one() -> float:
        go.clear()
        job_id = lone.enqueue({}).id
        wait_until(lambda: app.get_job(job_id).state is JobState.RUNNING, 10, "the start")
        # The handler runs; the cycle loop has nothing to write and nothing due: it sleeps.
        wait_until(lambda: worker._cycle_waiting, 10, "the cycle loop to sleep")
        go.set()
        wait_until(
            lambda: app.get_job(job_id).state is JobState.COMPLETED,
            10,
            "the completion (a 60 s poll would be the first to write it)",
        )
        latency = time.monotonic() - returned[-1]
        assert app.get_job(job_id).attempt == 1
        return latency

    with worker:
        for _ in range(3):
            latency = one()
            assert latency < 1.0, f"written {latency:.3f} s after the handler returned"


# -- real worker processes ---------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'latency.sqlite3'}"
    else:
        cluster = request.getfixturevalue("cluster")
        if not cluster.is_running():
            cluster.start()
        name = f"latency_{tmp_path.name.replace('-', '_').lower()}"[:60]
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql://postgres@127.0.0.1:{cluster.port}/{name}"
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _ready(app: App, proc: subprocess.Popen[bytes]) -> None:
    """The worker process is up: its row is in the workers table."""
    wait_until(lambda: proc.poll() is None and bool(app.workers()), 30, "the worker to start")


def test_a_worker_process_writes_each_completion_at_once(
    fault_app: App, env: dict[str, str], spawn: Spawn
) -> None:
    import faultjobs

    proc = spawn("--concurrency", "4", "--lease", "30s", "--poll-interval", LONG_POLL)
    _ready(fault_app, proc)
    for _ in range(3):
        # Long enough that the leader has claimed, found nothing else due, and gone to sleep.
        handle = faultjobs.stamped.enqueue({"sleep": 0.5})
        returned_at = fault_app.result(handle.id, timeout="10s")  # the handler's time.time()
        latency = time.time() - returned_at
        assert latency < 1.0, f"completion seen {latency:.3f} s after the handler returned"
        assert fault_app.get_job(handle.id).attempt == 1
    assert proc.poll() is None


def test_a_completion_survives_a_kill_right_after_the_handler_returns(
    fault_app: App, env: dict[str, str], spawn: Spawn
) -> None:
    """kill -9 200 ms after a job's handler returned (its ledger's ``done`` line, written just
    before it returns): its completion is already in the database, so it is not rescued as
    ``worker_lost`` and run again."""
    import faultjobs

    proc = spawn("--concurrency", "4", "--lease", "30s", "--poll-interval", LONG_POLL)
    _ready(fault_app, proc)
    job_id = faultjobs.ledger.enqueue({"sleep": 0.5}).id
    wait_until(
        lambda: any(r[0] == job_id and r[3] == "done" for r in ledger(env)), 30, "the return"
    )
    time.sleep(0.2)  # "right after": the scenario's delay, not a wait for a state
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    found = fault_app.get_job(job_id)
    assert found.state is JobState.COMPLETED, found
    assert found.attempt == 1


@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_a_queue_drains_soon_after_a_postgres_restart_whatever_the_poll_interval(
    fault_app: App, env: dict[str, str], spawn: Spawn, cluster: Any
) -> None:
    import faultjobs

    ids = [r.id for r in fault_app.enqueue_many(faultjobs.stamped, [{"sleep": 0.05}] * 300)]
    args = ("--concurrency", "4", "--lease", "30s", "--poll-interval", LONG_POLL)
    procs = [spawn(*args) for _ in range(2)]
    # Both running (each has its row) before the crash: a worker still starting when the
    # server goes away exits, as it should (its supervisor starts it again). On a loaded
    # machine the first one alone could complete the 40 while the second still started.
    wait_until(
        lambda: all(p.poll() is None for p in procs) and len(fault_app.workers()) == 2,
        30,
        "both workers to start",
    )
    wait_until(lambda: fault_app.count_jobs(state="completed") >= 40, 60, "the drain under way")
    cluster.stop("immediate")
    cluster.start()
    restarted = time.monotonic()
    wait_until(lambda: fault_app.count_jobs(state="completed") == 300, 60, "every job to complete")
    drained = time.monotonic() - restarted
    assert all(p.poll() is None for p in procs), "the workers survived the restart"
    assert drained < 10.0, f"the queue drained {drained:.1f} s after the restart"
    assert all(fault_app.get_job(i).state is JobState.COMPLETED for i in ids)


def test_outcomes_queued_before_a_long_job_on_the_same_thread_are_written_meanwhile(
    make_app: Callable[..., App], make_module: Callable[..., Any]
) -> None:
    """Short jobs run back to back on the thread that claimed them, which writes their
    outcomes when it next leads. A long job in the same batch must not hold the outcomes
    queued before it: they are written while it runs (the heartbeat hands the lead to a
    sleeping thread), so a crash during the long job does not run them again."""
    release = threading.Event()

    @job
    def tiny(input: dict[str, Any]) -> None:
        pass

    @job(priority=-1)
    def slow(input: dict[str, Any]) -> None:
        assert release.wait(60)

    app = make_app(make_module(tiny=tiny, slow=slow))
    worker = app.worker(concurrency=2, poll_interval=LONG_POLL, lease="30s")
    try:
        with worker:
            # Train the worker's average run time below its "short job" mark.
            app.enqueue_many(tiny, [{}] * 200)
            wait_until(lambda: app.count_jobs(state="completed") == 200, 60, "the warm-up")
            # One batch: the tiny job first (higher priority), then the slow one.
            with app.transaction():
                first = tiny.enqueue({}).id
                slow_id = slow.enqueue({}).id
            wait_until(lambda: app.get_job(slow_id).state is JobState.RUNNING, 10, "the slow job")
            wait_until(
                lambda: app.get_job(first).state is JobState.COMPLETED,
                5,
                "the tiny job's completion while the slow job runs",
            )
            assert app.get_job(slow_id).state is JobState.RUNNING
            release.set()
    finally:
        release.set()
