"""Jobs for the fault tests, run by real worker processes (`--app faultjobs:app`)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ultimat3.jobs import App, JobContext, Retry, job

LEDGER = os.environ.get("FAULT_LEDGER", "")


@job(retry=Retry(attempts=3, delay="100ms", jitter=False))
def ledger(input: dict[str, Any], ctx: JobContext) -> None:
    """Appends `id attempt pid start` to the ledger (fsync'd), then sleeps."""
    with open(LEDGER, "a") as f:
        f.write(f"{ctx.id} {ctx.attempt} {os.getpid()} start\n")
        f.flush()
        os.fsync(f.fileno())
    time.sleep(float(input.get("sleep", 0)))
    with open(LEDGER, "a") as f:
        f.write(f"{ctx.id} {ctx.attempt} {os.getpid()} done\n")
        f.flush()
        os.fsync(f.fileno())


@job(retry=Retry(attempts=3, delay="100ms", jitter=False))
def suicide(input: dict[str, Any]) -> None:
    """Kills its own worker process on every attempt."""
    os._exit(137)


@job(retry=Retry(attempts=3, delay="100ms", jitter=False))
def aborts(input: dict[str, Any]) -> None:
    """Aborts its worker process (SIGABRT) on every attempt."""
    os.abort()


@job(retry=Retry(attempts=3, delay="100ms", jitter=False))
def segfaults(input: dict[str, Any]) -> None:
    """Crashes its worker process with a segmentation fault on every attempt."""
    import ctypes
    import faulthandler

    faulthandler.disable()  # no dump on stderr: the crash is the point
    ctypes.string_at(0)


@job(retry=Retry(attempts=2, delay="50ms", jitter=False))
def raises(input: dict[str, Any]) -> None:
    """Raises on every attempt: retried once, then dead."""
    raise ValueError("always")


@job
def stamped(input: dict[str, Any]) -> float:
    """Sleeps, then returns the wall time of its return (the outcome latency tests)."""
    time.sleep(float(input.get("sleep", 0)))
    return time.time()


app = App(os.environ["ULTIMAT3_JOBS_URL"], modules=[sys.modules[__name__]])
