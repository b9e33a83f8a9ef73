"""``wait_for_jobs``: a hint that returns early on an insert (from this process or another)
or when ``wake`` is set, and after about ``timeout`` otherwise. Timings are asserted loosely:
drivers may poll, and the machine may be busy. Every case runs with a plain ``threading.Event``
and with the selectable ``Wake`` the worker passes (drivers sleep on it in the kernel)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import JobFilter
from ultimat3.jobs.wake import Wake

from .helpers import (
    SPAWN,
    T0,
    DriverSpec,
    claim,
    new_job,
    proc_insert_until_stopped,
    run_processes,
)

LONG = 20.0  # the timeout a test waits with when it expects an early return
EARLY = 8.0  # what "early" means


@pytest.fixture(params=[threading.Event, Wake], ids=["event", "wake"])
def new_wake(request: pytest.FixtureRequest) -> Callable[[], threading.Event]:
    maker: Callable[[], threading.Event] = request.param
    return maker


def timed_wait(driver: Driver, timeout: float, wake: threading.Event) -> float:
    start = time.monotonic()
    driver.wait_for_jobs(timeout, wake)
    return time.monotonic() - start


@contextmanager
def inserting_every(driver: Driver, seconds: float) -> Iterator[list[str]]:
    """Insert a job every ``seconds`` on another thread while the block runs."""
    stop, inserted = threading.Event(), []

    def run() -> None:
        while not stop.wait(seconds):
            [result] = driver.job_insert_many([new_job(queue="wake")], now=T0)
            inserted.append(result.id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield inserted
    finally:
        stop.set()
        thread.join(30)


def test_times_out_without_changes(driver: Driver, new_wake: Callable[[], threading.Event]) -> None:
    elapsed = timed_wait(driver, 0.6, new_wake())
    assert 0.45 <= elapsed < EARLY


def test_returns_early_on_an_insert_from_another_thread(
    driver: Driver, new_wake: Callable[[], threading.Event]
) -> None:
    with inserting_every(driver, 0.2) as inserted:
        elapsed = timed_wait(driver, LONG, new_wake())
    assert elapsed < EARLY
    assert inserted, "returned before anything was inserted"


def insert_on_another_thread(driver: Driver, queue: str) -> None:
    thread = threading.Thread(
        target=lambda: driver.job_insert_many([new_job(queue=queue)], now=T0), daemon=True
    )
    thread.start()
    thread.join(30)


def test_an_insert_between_a_claim_and_the_wait_after_it_ends_the_wait(
    driver: Driver, new_wake: Callable[[], threading.Event]
) -> None:
    """A worker's race: its claim finds nothing, a job is committed, then it waits. The wait
    counts from the claim, not from its own start, or the job waits out a whole poll."""
    assert claim(driver, T0, queues=["between"]) == []
    insert_on_another_thread(driver, "between")
    assert timed_wait(driver, LONG, new_wake()) < EARLY
    assert len(claim(driver, T0, queues=["between"])) == 1
    # Nor does waiting return at once from now on: once seen, a change is not news again
    # (the first wait may still return for the claim's own commit, on SQLite).
    timed_wait(driver, 0.6, new_wake())
    assert timed_wait(driver, 0.6, new_wake()) >= 0.45


def test_an_insert_between_two_waits_ends_the_second(
    driver: Driver, new_wake: Callable[[], threading.Event]
) -> None:
    timed_wait(driver, 0.0, new_wake())
    insert_on_another_thread(driver, "between")
    assert timed_wait(driver, LONG, new_wake()) < EARLY


def test_returns_early_when_woken(driver: Driver, new_wake: Callable[[], threading.Event]) -> None:
    wake = new_wake()
    timer = threading.Timer(0.2, wake.set)
    timer.start()
    try:
        elapsed = timed_wait(driver, LONG, wake)
    finally:
        timer.cancel()
    assert 0.1 <= elapsed < EARLY


def test_returns_at_once_when_already_woken(
    driver: Driver, new_wake: Callable[[], threading.Event]
) -> None:
    wake = new_wake()
    wake.set()
    assert timed_wait(driver, LONG, wake) < 2.0


def test_returns_early_on_an_insert_from_another_process(
    shared_spec: DriverSpec, driver: Driver, new_wake: Callable[[], threading.Event]
) -> None:
    ready, go, stop = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    waited: list[float] = []

    def parent() -> None:
        assert ready.wait(30), "the child never started"
        go.set()
        waited.append(timed_wait(driver, LONG, new_wake()))
        stop.set()

    thread = threading.Thread(target=parent, daemon=True)
    thread.start()
    [inserted] = run_processes(proc_insert_until_stopped, [(shared_spec, ready, go, stop)])
    thread.join(30)
    assert waited, "the wait never returned"
    assert waited[0] < EARLY, waited
    assert inserted >= 1
    assert len(driver.job_list(JobFilter(queue="wake"))) == inserted
