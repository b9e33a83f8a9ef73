"""Rescue follows the lease, with real worker processes on SQLite and PostgreSQL.

Worker A holds the maintenance leadership and runs a job; worker B stands by. A is killed
(SIGKILL) or frozen (SIGSTOP): B claims the job again within lease + rescue interval + 1 s,
and takes the leadership over within that bound too. (Before, only the leader
rescued: with a 3 s lease the job waited 15 s for the frozen or dead leader's leadership.)
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from contextlib import closing

import pytest

from ultimat3.jobs import App

from .processes import ledger, wait_until

LEASE, RESCUE = 3.0, 0.5
#: The issue's bound: a lease, a rescue interval and a second.
BOUND = LEASE + RESCUE + 1.0
#: What is asserted: 2 s more, for two real processes, SIGSTOP and a loaded 2-core CI
#: machine (the figure printed is the measure against BOUND).
HEADROOM = 2.0
ARGS = (
    "--concurrency",
    "2",
    "--lease",
    "3s",
    "--heartbeat",
    "1s",
    "--rescue-interval",
    "500ms",
    "--poll-interval",
    "100ms",
)


def _leader_pid(app: App, env: dict[str, str]) -> int | None:
    """The pid of the maintenance leadership's holder (a worker id is host:pid:token)."""
    driver: object = app.driver
    query = "SELECT holder FROM {}x_leaders WHERE name = 'maintenance'"
    if app.driver.name == "postgres":
        with driver._connection() as conn:  # type: ignore[attr-defined]
            schema = driver._schema  # type: ignore[attr-defined]
            row = conn.execute(query.format(f'"{schema}".')).fetchone()
    else:
        path = env["ULTIMAT3_JOBS_URL"][len("sqlite:///") :]
        with closing(sqlite3.connect(path, timeout=10)) as conn:
            row = conn.execute(query.format("")).fetchone()
    return None if row is None else int(row[0].split(":")[-2])


def _starts_by(env: dict[str, str], job_id: str, pid: int) -> bool:
    return any(r[0] == job_id and r[2] == pid and r[3] == "start" for r in ledger(env))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_a_dead_or_frozen_leaders_job_is_claimed_again_within_the_lease_and_a_rescue_interval(
    fault_app: App,
    env: dict[str, str],
    spawn: Callable[..., subprocess.Popen[bytes]],
    sig: signal.Signals,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import faultjobs

    job_id = faultjobs.ledger.enqueue({"sleep": 60}).id
    a = spawn(*ARGS)
    wait_until(lambda: _starts_by(env, job_id, a.pid), 30, "A to start the job")
    wait_until(lambda: _leader_pid(fault_app, env) == a.pid, 30, "A to lead maintenance")
    b = spawn(*ARGS)
    wait_until(lambda: any(w.pid == b.pid for w in fault_app.workers()), 30, "B to be up")
    sent = time.monotonic()
    os.kill(a.pid, sig)
    wait_until(lambda: _starts_by(env, job_id, b.pid), 30, "B to run the job again")
    took = time.monotonic() - sent
    wait_until(lambda: _leader_pid(fault_app, env) == b.pid, 30, "B to take the lead")
    led = time.monotonic() - sent
    with capsys.disabled():
        print(
            f"\n{fault_app.driver.name} {sig.name}: claimed again after {took:.2f} s, "
            f"leadership taken over after {led:.2f} s",
            end="",
        )
    assert took < BOUND + HEADROOM, (
        f"claimed again {took:.2f} s after A's {sig.name} (the bound: {BOUND:.1f} s)"
    )
    assert led < BOUND + HEADROOM, f"B led {led:.2f} s after A's {sig.name} (bound {BOUND:.1f} s)"
    got = fault_app.get_job(job_id)
    # It ran beside nothing but was not isolated: the crash is not charged, and it runs alone.
    assert got.attempt == 1, got
    assert [e.kind for e in got.errors] == ["worker_lost"]
