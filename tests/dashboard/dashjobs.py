"""The jobs the dashboard tests run, in real worker processes (`--app dashjobs:app`)."""

from __future__ import annotations

import sys
import time
from typing import Any

from ultimat3.jobs import App, JobContext, Retry, job, task


@job(queue="mail")
def send_mail(input: dict[str, Any]) -> None:
    """Completes at once."""


@job(queue="billing", retry=Retry(attempts=1))
def charge(input: dict[str, Any], ctx: JobContext) -> None:
    """Fails its first attempt (with no retry left, so it ends dead); a retry completes."""
    if ctx.attempt < 2:
        raise RuntimeError(f"card declined for {input.get('customer', '?')}")


@job(queue="reports", retry=Retry(attempts=5, backoff="exponential", delay="10s", max_delay="1h"))
def report(input: dict[str, Any]) -> None:
    """Always fails: its retry plan is what the job page shows."""
    raise ValueError("the warehouse is down")


@job(queue="slow")
def nap(input: dict[str, Any], ctx: JobContext) -> None:
    """Runs for ``seconds`` (or until cancelled), so a page can show it running."""
    end = time.monotonic() + float(input["seconds"])
    while time.monotonic() < end and not ctx.cancelled:
        time.sleep(0.05)


nightly = task(
    "30 2 * * *",
    tz="Europe/Paris",
    enqueue=lambda: [(report, {"day": "yesterday"})],
    catch_up="run-once",
)

app = App(modules=[sys.modules[__name__]])
