"""Helpers for tests that run real worker processes (`--app faultjobs:app`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

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


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
