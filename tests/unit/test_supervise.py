"""The supervised loop: nothing kills it; expected errors are retried for ever, and a
critical loop that keeps failing for unexpected reasons hands over to ``on_fatal``."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest

from ultimat3.jobs import DriverUnavailableError
from ultimat3.jobs.clock import Backoff
from ultimat3.jobs.supervise import BACKOFF, Loop
from ultimat3.jobs.testing import FakeClock

# The loops below run on a fake clock: each pause, backoff included, lasts until the test moves
# time (``advance_until``), so the times of the steps are exact.


def test_an_unexpected_exception_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    calls: list[float] = []

    def step() -> float:
        calls.append(clock.monotonic())
        if len(calls) == 1:
            raise RuntimeError("surprise")
        return 0.01

    loop = Loop("test", step, clock=clock)
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        loop.start()
        clock.advance_until(lambda: len(calls) >= 3, 0.01, limit=1)
        loop.stop()
    crashed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.loop.crashed"]
    assert len(crashed) == 1 and crashed[0].exc_info is not None
    assert not loop.alive
    # After the crash the loop backed off (BACKOFF.first), then took the step's own pause.
    assert calls[:3] == pytest.approx([0.0, BACKOFF.first, BACKOFF.first + 0.01])


def test_a_jobs_error_is_retried_for_ever_and_never_fatal() -> None:
    clock = FakeClock()
    calls: list[float] = []
    fatal: list[str] = []

    def step() -> float:
        calls.append(clock.monotonic())
        if len(calls) < 6:
            raise DriverUnavailableError("the database is away")
        return 1.0

    loop = Loop(
        "test",
        step,
        on_fatal=lambda name, exc: fatal.append(name),
        fatal_after=2,
        backoff=Backoff(first=0.001, cap=0.005),
        clock=clock,
    )
    loop.step = step
    loop.start()
    clock.advance_until(lambda: len(calls) >= 6, 0.001, limit=1)
    loop.stop()
    assert fatal == []
    assert loop.failures == 0
    waits = [round(b - a, 6) for a, b in itertools.pairwise(calls)]
    assert waits == [0.001, 0.002, 0.004, 0.005, 0.005], "doubling, up to the cap"


def test_a_critical_loop_that_keeps_crashing_calls_on_fatal_and_ends() -> None:
    fatal = threading.Event()
    seen: list[BaseException] = []

    def step() -> float:
        raise KeyError("bug")

    def on_fatal(name: str, exc: BaseException) -> None:
        seen.append(exc)
        fatal.set()

    clock = FakeClock()
    loop = Loop(
        "claim", step, on_fatal=on_fatal, fatal_after=3, backoff=Backoff(0.001, 5.0), clock=clock
    )
    loop.start()
    clock.advance_until(fatal.is_set, 0.001, limit=1)
    loop.join(5)
    assert not loop.alive
    assert isinstance(seen[0], KeyError)
