"""A real worker process and the enqueuing test process, all on one SQLite file, whose wall
clock steps together (``clockshift/sitecustomize.py`` in the worker, ``time.time_ns`` patched
here; the machine's clock and the monotonic clocks are left alone): a delayed job still runs
its delay after its enqueue, in true time, whichever way the clock stepped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .processes import HERE, wait_until

DELAY = 6.0


@pytest.mark.parametrize("step", [2 * 3600, -3600])
def test_a_delayed_job_keeps_its_delay_when_the_host_clock_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    url = f"sqlite:///{tmp_path / 'step.sqlite3'}"
    shift, ledger = tmp_path / "shift", tmp_path / "ledger.txt"
    shift.write_text("0")
    env = {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "CLOCK_LEDGER": str(ledger),
        "CLOCKSHIFT_FILE": str(shift),
        "PYTHONPATH": os.pathsep.join(
            [str(HERE / "clockshift"), str(HERE), os.environ.get("PYTHONPATH", "")]
        ),
    }
    run = [sys.executable, "-m", "ultimat3.jobs", "--app", "clockjobs:app"]
    subprocess.run([*run, "migrate"], env=env, cwd=HERE, check=True, capture_output=True)
    with (tmp_path / "worker.log").open("w") as log:
        worker = subprocess.Popen(
            [*run, "-v", "worker", "-c", "2", "--poll-interval", "100ms"],
            env=env,
            cwd=HERE,
            stdout=log,
            stderr=log,
        )
    # This process enqueues as a process of the same host: its wall clock moves with the
    # worker's. time.time stays true: the test measures with it.
    real_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(shift.read_text()))
    monkeypatch.setenv("ULTIMAT3_JOBS_URL", url)
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("clockjobs", None)
    import clockjobs

    started: float | None = None
    try:
        warm = clockjobs.hold.enqueue({"sleep": 0}).id  # the worker is up and has written
        wait_until(lambda: warm in ledger.read_text() if ledger.exists() else False, 30, "start")
        delayed = clockjobs.hold.enqueue({"sleep": 0}, delay=f"{DELAY}s").id
        enqueued = time.time()
        shift.write_text(str(step * 10**9))  # the host's clock steps

        def ran() -> bool:
            nonlocal started
            if started is None and f"{delayed} 1 start" in ledger.read_text():
                started = time.time()
            return started is not None

        wait_until(ran, DELAY + 20, "the delayed job to run")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
        clockjobs.app.close()
        sys.modules.pop("clockjobs", None)
    assert started is not None
    after = started - enqueued
    print(f"\nstep {step:+d} s: the job delayed {DELAY} s ran after {after:.2f} s")
    assert after >= DELAY - 0.5, f"a job delayed {DELAY} s ran after {after:.2f} s"
    assert after <= DELAY + 3, f"a job delayed {DELAY} s ran after {after:.2f} s"
