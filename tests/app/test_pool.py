"""``ultimat3-jobs worker --processes N``: real processes, real signals, one SQLite file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ultimat3.jobs import App, events
from ultimat3.jobs.pool import ProcessPool
from ultimat3.jobs.testing import FakeClock

from .processes import HERE, ledger, wait_until

Spawn = Callable[..., subprocess.Popen[bytes]]
FAST = ("--concurrency", "2", "--poll-interval", "100ms", "--lease", "2s")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"sqlite:///{tmp_path / 'pool.sqlite3'}",
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


@pytest.fixture
def pool(spawn: Spawn) -> Iterator[Spawn]:
    """A pool of workers; its children are killed at teardown with it."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        proc = spawn(*args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        for child in _children(proc.pid):
            os.kill(child, signal.SIGKILL)


def test_a_pool_of_two_processes_drains_one_queue_and_stops_gracefully(
    fault_app: App, env: dict[str, str], pool: Spawn
) -> None:
    import faultjobs

    fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0.1}] * 80)
    proc = pool("--processes", "2", *FAST)
    wait_until(lambda: len(_children(proc.pid)) == 2, 30, "two worker processes")
    children = _children(proc.pid)
    wait_until(lambda: fault_app.count_jobs(state="completed") == 80, 90, "the queue to drain")
    ran_in = {pid for _, _, pid, what in ledger(env) if what == "start"}
    assert ran_in == set(children), "both processes ran jobs, the pool itself none"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    wait_until(lambda: not any(_alive(c) for c in children), 10, "the children to exit")


def test_a_child_that_dies_is_restarted(fault_app: App, env: dict[str, str], pool: Spawn) -> None:
    import faultjobs

    proc = pool("--processes", "2", *FAST)
    wait_until(lambda: len(_children(proc.pid)) == 2, 30, "two worker processes")
    killed = _children(proc.pid)[0]
    os.kill(killed, signal.SIGKILL)
    wait_until(
        lambda: len(_children(proc.pid)) == 2 and killed not in _children(proc.pid),
        30,
        "the pool to restart the killed child",
    )
    fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0.01}] * 10)
    wait_until(lambda: fault_app.count_jobs(state="completed") == 10, 60, "the jobs to run")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_children_stop_when_their_pool_is_killed(fault_app: App, pool: Spawn) -> None:
    proc = pool("--processes", "2", *FAST)
    wait_until(lambda: len(_children(proc.pid)) == 2, 30, "two worker processes")
    children = _children(proc.pid)
    proc.kill()
    proc.wait()
    wait_until(lambda: not any(_alive(c) for c in children), 20, "the orphans to stop")


class _Passing(FakeClock):
    """A fake clock on which every pause passes at once: the pool's waits cost no real time."""

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> bool:
        self.advance(seconds)
        return wake.is_set() if wake is not None else False


def test_restarts_back_off_on_the_pools_clock() -> None:
    """A child that keeps dying young waits 1 s, 2 s, 4 s, then 4 s (the cap) of the pool's
    clock before each restart: a fake clock here, so the waits take no real time."""
    false = shutil.which("false")
    assert false is not None
    clock = _Passing()
    pool = ProcessPool(
        [], 1, backoff=1.0, backoff_max=4.0, healthy_after=3600.0, executable=false, clock=clock
    )
    waits: list[float] = []

    def exited(event: events.Event) -> None:
        waits.append(float(event.fields["restart_in"]))
        if len(waits) == 4:
            pool.stop()

    sub = events.subscribe(exited, names=["jobs.pool.exited"])
    try:
        assert pool.run(install_signals=False) == 0
    finally:
        sub.close()
    assert waits == [1.0, 2.0, 4.0, 4.0]
    assert pool.restarts == 3
    assert clock.monotonic() >= 1.0 + 2.0 + 4.0
