"""Helpers for tests that run real worker processes (`--app faultjobs:app`)."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def ledger(env: dict[str, str]) -> list[tuple[str, int, int, str]]:
    """The fault jobs' fsync'd ledger: (job id, attempt, pid, "start" | "done") rows."""
    path = Path(env["FAULT_LEDGER"])
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        job_id, attempt, pid, what = line.split()
        rows.append((job_id, int(attempt), int(pid), what))
    return rows


def last_words(procs: list[subprocess.Popen[bytes]], lines: int = 15) -> str:
    """For a failure message: the exit code and the last lines of stderr of each process of
    ``procs`` (started by the ``spawn`` fixture) that has exited."""
    words = []
    for proc in procs:
        if proc.poll() is not None:
            log = getattr(proc, "log", None)
            tail = log.read_text(errors="replace").splitlines()[-lines:] if log else []
            words.append(f"pid {proc.pid} exited {proc.returncode}:\n" + "\n".join(tail))
    return "\n".join(words)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def poison_hurts_only_itself(
    fault_app: Any, env: dict[str, str], spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """One poison job of each kind (os._exit, os.abort, a segfault) among 200 normal jobs, on
    two workers that are restarted when they die: every normal job completes and starts at
    most twice, and is never charged an attempt (each is one attempt); each poison job ends
    dead after exactly max_attempts starts alone, each a worker_lost (a crash beside other
    jobs isolates it first, with its attempt given back)."""
    import faultjobs

    poison = [h.enqueue({}).id for h in (faultjobs.suicide, faultjobs.aborts, faultjobs.segfaults)]
    normal = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0.01}] * 200)]
    args = (
        "--concurrency",
        "4",
        "--lease",
        "1s",
        "--heartbeat",
        "300ms",
        "--rescue-interval",
        "200ms",
        "--poll-interval",
        "100ms",
    )
    procs = [spawn(*args), spawn(*args)]
    deadline = time.monotonic() + 120

    def finished() -> bool:
        dead = all(fault_app.get_job(i).state.value == "dead" for i in poison)
        return dead and fault_app.count_jobs(state="completed") == len(normal)

    while not finished():
        assert time.monotonic() < deadline, "the queue did not settle"
        for n, proc in enumerate(procs):
            if proc.poll() is not None:
                procs[n] = spawn(*args)
        time.sleep(0.05)
    starts = Counter(job_id for job_id, _, _, what in ledger(env) if what == "start")
    assert max(starts[i] for i in normal) <= 2, starts.most_common(3)
    normal_jobs = [fault_app.get_job(i) for i in normal]
    assert all(j.state.value == "completed" for j in normal_jobs)
    charged = [j.id for j in normal_jobs if j.attempt != 1]
    assert charged == [], "healthy jobs charged an attempt for a poison job's crash"
    for job_id in poison:
        found = fault_app.get_job(job_id)
        assert found.attempt == 3, found
        # Dead after three crashes alone; a first crash beside other jobs was not counted.
        assert {e.kind for e in found.errors} == {"worker_lost"}, found.errors
        assert sum("ran alone" in e.message for e in found.errors) == 3, found.errors
