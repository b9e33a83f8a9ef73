"""Jobs and a cron task for the clock-step tests, run by real worker and scheduler processes
(`--app clockjobs:app`) whose wall clock the test shifts (``clockshift/sitecustomize.py``)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ultimat3.jobs import App, JobContext, job, task

LEDGER = os.environ.get("CLOCK_LEDGER", "")


@job
def hold(input: dict[str, Any], ctx: JobContext) -> None:
    """Appends `id attempt start` to the ledger, sleeps ``input["sleep"]`` s, appends done."""
    with open(LEDGER, "a") as f:
        f.write(f"{ctx.id} {ctx.attempt} start\n")
    time.sleep(float(input.get("sleep", 0)))
    with open(LEDGER, "a") as f:
        f.write(f"{ctx.id} {ctx.attempt} done\n")


@job
def beat(input: Any) -> None:
    return None


every_2s = task(
    "*/2 * * * * *", tz="UTC", enqueue=lambda: [(beat, {})], catch_up="run-all", max_catch_up=100
)

app = App(os.environ["ULTIMAT3_JOBS_URL"], modules=[sys.modules[__name__]])
