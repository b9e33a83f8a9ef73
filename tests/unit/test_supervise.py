"""The supervised loop: nothing kills it; expected errors are retried for ever, and a
critical loop that keeps failing for unexpected reasons hands over to ``on_fatal``."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from ultimat3.jobs import DriverUnavailableError
from ultimat3.jobs.clock import Backoff
from ultimat3.jobs.supervise import Loop


def _wait(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_unexpected_exception_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def step() -> float:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("surprise")
        return 0.01

    loop = Loop("test", step)
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        loop.start()
        _wait(lambda: len(calls) >= 3)
        loop.stop()
    crashed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.loop.crashed"]
    assert len(crashed) == 1 and crashed[0].exc_info is not None
    assert not loop.alive


def test_a_jobs_error_is_retried_for_ever_and_never_fatal() -> None:
    calls: list[int] = []
    fatal: list[str] = []

    def step() -> float:
        calls.append(1)
        if len(calls) < 6:
            raise DriverUnavailableError("the database is away")
        return 1.0

    loop = Loop(
        "test",
        step,
        on_fatal=lambda name, exc: fatal.append(name),
        fatal_after=2,
        backoff=Backoff(first=0.001, cap=0.005),
    )
    loop.step = step
    loop.start()
    _wait(lambda: len(calls) >= 6)
    loop.stop()
    assert fatal == []
    assert loop.failures == 0


def test_a_critical_loop_that_keeps_crashing_calls_on_fatal_and_ends() -> None:
    fatal = threading.Event()
    seen: list[BaseException] = []

    def step() -> float:
        raise KeyError("bug")

    def on_fatal(name: str, exc: BaseException) -> None:
        seen.append(exc)
        fatal.set()

    loop = Loop("claim", step, on_fatal=on_fatal, fatal_after=3, backoff=Backoff(0.001, 5.0))
    loop.start()
    assert fatal.wait(5)
    loop.join(5)
    assert not loop.alive
    assert isinstance(seen[0], KeyError)
