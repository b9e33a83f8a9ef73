"""Stored results, end to end on every driver: what a handler returns is kept as JSON with its
job, read back with ``app.result`` / ``handle.result`` (and their async variants) after a
wait on the database's wake-ups; a value that cannot be stored fails the job at once, with a
clear error; a dead or cancelled job, a timeout and an unknown id each raise their own error."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from ultimat3.jobs import (
    DATETIME,
    App,
    JobFailedError,
    JobNotFoundError,
    JobState,
    ResultTimeoutError,
    Retry,
    job,
)
from ultimat3.jobs.testing import drain


@dataclass
class Receipt:
    order: int
    lines: list[str]


@job
def total(input: dict[str, Any]) -> dict[str, Any]:
    return {"order": input["order"], "total": sum(input["prices"]), "ünï": "✓"}


@job
def nothing(input: Any) -> None:
    return None


@job
def receipt(input: dict[str, Any]) -> Receipt:
    return Receipt(input["order"], ["a", "b"])


@job
def stamped(input: Any) -> datetime:
    return datetime(2031, 3, 14, 9, 26, 53, tzinfo=UTC)


@job(retry=Retry(attempts=3))
def huge(input: Any) -> str:
    return "x" * 2_000


@job(retry=Retry(attempts=2, delay=0))
def broken(input: Any) -> int:
    raise ValueError(f"cannot total order {input['order']}")


@job
async def doubled(input: int) -> int:
    await asyncio.sleep(0)
    return input * 2


JOBS = types.ModuleType("result_jobs")
for _handle in (total, nothing, receipt, stamped, huge, broken, doubled):
    setattr(JOBS, _handle.bound_name or _handle.fn.__name__, _handle)


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    return make_app(JOBS, payload_limit=1_000)


def test_a_return_value_is_kept_and_read_back(app: App) -> None:
    done = total.enqueue({"order": 7, "prices": [1, 2, 3]})
    empty = nothing.enqueue({})
    as_dict = receipt.enqueue({"order": 8})
    drain(app)
    assert app.result(done.id, timeout=0) == {"order": 7, "total": 6, "ünï": "✓"}
    assert total.result(done, timeout="1s") == {"order": 7, "total": 6, "ünï": "✓"}
    assert app.get_job(done.id).result == '{"order":7,"total":6,"ünï":"✓"}'
    assert app.result(empty.id, timeout=0) is None
    assert app.get_job(empty.id).result is None
    assert app.result(as_dict.id) == {"order": 8, "lines": ["a", "b"]}, "dataclasses as dicts"


def test_codecs_apply_to_results(make_app: Callable[..., App]) -> None:
    app = make_app(JOBS, codecs=[DATETIME])
    done = stamped.enqueue({})
    drain(app)
    assert app.result(done.id) == datetime(2031, 3, 14, 9, 26, 53, tzinfo=UTC)


def test_a_value_that_is_not_json_fails_the_job_at_once(app: App) -> None:
    done = stamped.enqueue({})  # a datetime, and no codec for it
    drain(app)
    dead = app.get_job(done.id)
    assert (dead.state, dead.attempt, dead.result) == (JobState.DEAD, 1, None)
    [error] = dead.errors
    assert error.kind == "SerializationError"
    assert error.exception_path == "ultimat3.jobs.errors.SerializationError"
    assert "result has type datetime.datetime, which JSON cannot store" in error.message
    with pytest.raises(JobFailedError) as info:
        app.result(done.id)
    assert info.value.last_error == error
    assert "dead after 1 attempt(s)" in info.value.cause
    assert "SerializationError: result has type datetime.datetime" in info.value.cause
    assert "jobs show" in info.value.fix


def test_a_value_over_the_payload_limit_fails_the_job_at_once(app: App) -> None:
    done = huge.enqueue({})
    drain(app)
    dead = app.get_job(done.id)
    assert (dead.state, dead.attempt) == (JobState.DEAD, 1), "not retried: it ran to its end"
    assert dead.errors[-1].kind == "PayloadTooLargeError"
    assert (
        "result is 2,002 bytes of JSON, above the limit of 1,000 bytes" in dead.errors[-1].message
    )


def test_a_dead_job_raises_with_its_last_error(app: App) -> None:
    done = broken.enqueue({"order": 9})
    drain(app)
    drain(app)
    assert app.get_job(done.id).state is JobState.DEAD
    with pytest.raises(JobFailedError) as info:
        broken.result(done.id, timeout=5)
    assert info.value.job.attempt == 2
    assert info.value.last_error is not None
    assert info.value.last_error.exception_path == "builtins.ValueError"
    assert "ValueError: cannot total order 9" in str(info.value)


def test_a_cancelled_job_raises(app: App) -> None:
    done = total.enqueue({"order": 1, "prices": []}, delay="1h")
    assert app.cancel_job(done.id, reason="customer left")
    with pytest.raises(JobFailedError, match=r"was cancelled \(customer left\)"):
        app.result(done.id, timeout=5)


def test_an_unfinished_job_times_out_with_a_clear_error(app: App) -> None:
    done = total.enqueue({"order": 1, "prices": []})
    started = time.monotonic()
    with pytest.raises(ResultTimeoutError) as info:
        app.result(done.id, timeout="300ms")
    assert time.monotonic() - started >= 0.3
    assert isinstance(info.value, TimeoutError)
    assert info.value.job.state is JobState.AVAILABLE
    assert "is still available after 300ms" in info.value.cause
    assert "'default'" in info.value.fix


def test_the_deadline_of_a_result_wait_is_on_the_clock_it_is_given(app: App) -> None:
    """``results.wait_result`` reads the time through a ``Clock`` (the system's by default):
    on a fake clock whose monotonic time moves 5 s at each read, a 5 s timeout has passed by
    the first wait, which is then no real wait."""
    from ultimat3.jobs.results import wait_result
    from ultimat3.jobs.testing import FakeClock

    class Hurried(FakeClock):
        def monotonic(self) -> float:
            self.advance(5)
            return super().monotonic()

    done = total.enqueue({"order": 1, "prices": []})
    started = time.monotonic()
    with pytest.raises(ResultTimeoutError, match="still available after 5s"):
        wait_result(app.driver, app.serializer, done.id, timeout="5s", clock=Hurried())
    assert time.monotonic() - started < 2


def test_an_unknown_job_is_not_found(app: App) -> None:
    with pytest.raises(JobNotFoundError, match="pruned after"):
        app.result("no-such-job", timeout=5)


def test_a_waiting_reader_is_woken_by_the_worker(app: App) -> None:
    """``result`` with a long timeout returns as soon as a worker in the background completes
    the job, not at the timeout: the database's wake-up reached it."""
    with app.worker(concurrency=2, poll_interval="100ms"):
        done = total.enqueue({"order": 3, "prices": [4]})
        started = time.monotonic()
        assert app.result(done.id, timeout=60) == {"order": 3, "total": 4, "ünï": "✓"}
        assert time.monotonic() - started < 20


def test_async_results_and_async_handlers(app: App) -> None:
    async def scenario() -> tuple[Any, Any]:
        done = await doubled.enqueue_async(21)
        with app.worker(concurrency=2, poll_interval="100ms"):
            first = await app.result_async(done.id, timeout=60)
            second = await doubled.result_async(done, timeout=0)
        return first, second

    assert asyncio.run(scenario()) == (42, 42)


def test_an_async_wait_does_not_block_the_event_loop(app: App) -> None:
    done = total.enqueue({"order": 1, "prices": []})

    async def scenario() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        with pytest.raises(ResultTimeoutError):
            await app.result_async(done.id, timeout="500ms")
        ticker.cancel()
        return ticks

    assert asyncio.run(scenario()) >= 10
