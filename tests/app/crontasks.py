"""A task firing every 2 seconds, for the scheduler race test (`--app crontasks:app`)."""

from __future__ import annotations

import os
from typing import Any

from ultimat3.jobs import App, job, task


@job
def beat(input: Any) -> None:
    return None


every_2s = task(
    "*/2 * * * * *", tz="UTC", enqueue=lambda: [(beat, {})], catch_up="run-all", max_catch_up=100
)

app = App(os.environ["ULTIMAT3_JOBS_URL"], modules=[__import__(__name__)])
