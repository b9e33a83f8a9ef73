"""Jobs for ``test_run_at_clock.py``'s real worker processes (``--app runatjobs:app``), whose
wall clock the test shifts (``clockshift/sitecustomize.py``). Each start appends
``id attempt monotonic`` to the ledger: the monotonic clock is the machine's, shared by every
process and never shifted, so the gaps between starts are true time."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ultimat3.jobs import App, JobContext, Retry, Snooze, job

LEDGER = os.environ.get("RUNAT_LEDGER", "")


def _started(ctx: JobContext) -> int:
    """Note this start; returns how many starts of the job the ledger held before."""
    with open(LEDGER, "a+") as f:
        f.seek(0)
        before = sum(1 for line in f if line.split()[0] == ctx.id)
        f.write(f"{ctx.id} {ctx.attempt} {time.monotonic()}\n")
    return before


@job(retry=Retry(attempts=2, backoff="fixed", delay="2s", jitter=False))
def flaky(input: Any, ctx: JobContext) -> None:
    _started(ctx)
    raise ValueError("down")


@job
def sleepy(input: Any, ctx: JobContext) -> None:
    if _started(ctx) == 0:
        raise Snooze("2s")


app = App(os.environ["ULTIMAT3_JOBS_URL"], modules=[sys.modules[__name__]])
