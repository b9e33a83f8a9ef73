"""A worker waits for a full rate window on the database's clock, not the host's.

The limited claim tells the worker how long until a full rate window frees a start: a wait the
driver measured on its own clock (PostgreSQL's ``now()``), which the worker counts down on its
monotonic clock. Before, the driver returned the time the window reopens and the worker
subtracted its host clock's ``now()``: with the host 2 h ahead it polled every 10 ms while the
window stayed full (180 claims in the 2 s, against 6 now), and with it 2 h behind it started
the held job a whole poll interval late (30 s here, where the window freed after 2 s).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ultimat3.jobs import App, JobState, Rate, job

from .processes import wait_until
from .test_run_at_clock import SHIFTS, ShiftedClock

PERIOD = timedelta(seconds=2)


@job(rate=Rate(1, per="2s"))
def rated(input: Any) -> None:
    pass


@pytest.mark.postgres
@pytest.mark.parametrize("shift", SHIFTS, ids=["ahead", "behind"])
def test_a_rate_limited_job_starts_when_the_window_frees(
    shift: timedelta,
    pg_dsn: str,
    make_module: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two jobs under one start per 2 s, a worker whose host clock is 2 h off and whose poll
    interval is 30 s: the second starts about 2 s after the first (on the database's clock),
    after a handful of claims, neither 10 ms polling nor a poll interval late."""
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(pg_dsn)
    url = f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"
    module = make_module("rate_wake_jobs", rated=rated)
    app = App(url, modules=[module], clock=ShiftedClock(shift))
    try:
        cycles = 0
        real_cycle = app.driver.job_cycle

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal cycles
            cycles += 1
            return real_cycle(*args, **kwargs)

        monkeypatch.setattr(app.driver, "job_cycle", counted)
        made = [rated.enqueue({"n": n}) for n in range(2)]
        with app.worker(queues=["default"], concurrency=2, poll_interval="30s"):
            wait_until(
                lambda: all(app.get_job(m.id).state is JobState.COMPLETED for m in made),
                10,
                "both rate-limited jobs to run",
            )
        first, second = sorted(
            (app.get_job(m.id).attempted_at for m in made),
            key=lambda at: at.timestamp() if at is not None else 0.0,
        )
        assert first is not None and second is not None
        gap = (second - first).total_seconds()
        shifted = f"worker clock {shift.total_seconds():+.0f} s"
        print(f"{shifted}: second start {gap:.3f} s after the first, {cycles} claims")
        assert PERIOD.total_seconds() <= gap < PERIOD.total_seconds() + 1.0, gap
        # A claim, the first completion with an empty claim, the claim when the window
        # frees, the second completion: a few more under load, never one each 10 ms.
        assert cycles <= 12, f"{cycles} cycles while one rate window was full: polling"
    finally:
        app.close()
