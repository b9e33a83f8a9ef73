"""A small shop's jobs and cron tasks, as a user would write them.

ultimat3-jobs --app examples.shop:app schedule
ultimat3-jobs --app examples.shop:app run
"""

from __future__ import annotations

import sys
from typing import Any

from ultimat3.jobs import App, JobContext, Retry, job, task


@job(queue="mail", idempotency_key=lambda order: f"order-{order['id']}")
def send_receipt(order: dict[str, Any]) -> None:
    """Email the receipt once per order."""


@job(retry=Retry(attempts=6, backoff="exponential", delay="2s", max_delay="1m"), timeout="30s")
def sync_inventory(order: dict[str, Any], ctx: JobContext) -> None:
    """Push stock changes to the warehouse; retried with backoff when it is down."""


@job(queue="reports", retry=Retry(attempts=1))
def nightly_report(input: dict[str, Any]) -> None:
    """Build yesterday's sales report."""


nightly = task(
    "30 2 * * *",
    tz="America/New_York",
    enqueue=lambda: [(nightly_report, {})],
    catch_up="run-once",
)

app = App(modules=[sys.modules[__name__]])
