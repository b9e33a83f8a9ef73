"""Jobs with concurrency limits, run by real worker processes (`--app limitjobs:app`).

Each handler appends one line to the ledger, `partition pid start end` (wall-clock seconds,
fsync'd), after it ran: the test computes the largest overlap from these lines alone."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ultimat3.jobs import App, Limit, Rate, job

LEDGER = os.environ.get("LIMIT_LEDGER", "")


def _ran(partition: str, started: float, sleep: float) -> None:
    time.sleep(sleep)
    ended = time.time()
    with open(LEDGER, "a") as f:
        f.write(f"{partition} {os.getpid()} {started!r} {ended!r}\n")
        f.flush()
        os.fsync(f.fileno())


@job(concurrency=Limit(2, key=lambda o: o["account"]))
def per_account(input: dict[str, Any]) -> None:
    _ran(f"account={input['account']}", time.time(), float(input["sleep"]))


@job(concurrency=Limit(3))
def whole_job(input: dict[str, Any]) -> None:
    _ran("whole_job", time.time(), float(input["sleep"]))


@job(rate=Rate(5, per="1s"))
def rated(input: dict[str, Any]) -> None:
    _ran("rated", time.time(), float(input["sleep"]))


@job
def unlimited(input: dict[str, Any]) -> None:
    _ran("unlimited", time.time(), float(input["sleep"]))


app = App(os.environ["ULTIMAT3_JOBS_URL"], modules=[sys.modules[__name__]])
