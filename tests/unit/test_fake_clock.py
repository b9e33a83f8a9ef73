"""``FakeClock.sleep`` blocks until the test moves fake time (or the sleep's ``wake`` is set),
so a loop on a fake clock is parked between its steps and a test drives it by moving time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest

from ultimat3.jobs import testing
from ultimat3.jobs.clock import FakeClock
from ultimat3.jobs.supervise import Loop


def _sleep_in_thread(
    clock: FakeClock, seconds: float, wake: threading.Event | None = None
) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(clock.sleep(seconds, wake)))
    thread.start()
    return thread, result


def test_a_sleep_lasts_until_fake_time_has_moved_by_its_seconds() -> None:
    clock = FakeClock()
    thread, result = _sleep_in_thread(clock, 10)
    clock.wait_for_sleepers(1)
    assert clock.next_wake() == 10
    clock.advance(9.5)
    thread.join(0.05)
    assert thread.is_alive() and clock.sleepers() == 1, "woke before its time"
    clock.advance(timedelta(milliseconds=500))
    thread.join(5)
    assert not thread.is_alive() and result == [False]
    assert clock.sleepers() == 0 and clock.next_wake() is None


def test_set_forward_wakes_a_sleeper_and_a_step_does_not() -> None:
    clock = FakeClock()
    thread, result = _sleep_in_thread(clock, 60)
    clock.wait_for_sleepers(1)
    clock.step(timedelta(hours=2))  # wall time alone: monotonic time, which sleeps use, stays
    thread.join(0.05)
    assert thread.is_alive()
    clock.set(clock.now() + timedelta(minutes=1))
    thread.join(5)
    assert result == [False]


def test_a_sleep_ends_when_its_wake_is_set_and_says_so() -> None:
    clock = FakeClock()
    wake = threading.Event()
    thread, result = _sleep_in_thread(clock, 3600, wake)
    clock.wait_for_sleepers(1)
    wake.set()
    thread.join(5)
    assert result == [True] and clock.monotonic() == 0, "woken without time moving"
    assert clock.sleep(5, wake) is True, "a wake already set returns at once"
    assert clock.sleep(0) is False and clock.sleep(-1) is False, "nothing to wait for"


def test_wait_for_sleepers_times_out_in_real_time() -> None:
    with pytest.raises(TimeoutError, match="0 thread"):
        FakeClock().wait_for_sleepers(1, timeout=0.05)


def test_advance_until_moves_time_while_the_loop_is_parked_between_steps() -> None:
    """A loop that pauses 1 s between steps runs once per second of fake time, exactly: the
    clock moves only once the loop sleeps again, so no step is skipped or doubled."""
    clock = testing.FakeClock()
    seen: list[float] = []

    def step() -> float:
        seen.append(clock.monotonic())
        return 1.0

    loop = Loop("ticks", step, clock=clock)
    loop.start()
    try:
        moved = clock.advance_until(lambda: len(seen) >= 5, "250ms", limit="10s")
    finally:
        loop.stop()
    assert moved == 4.0
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert not loop.alive


def test_advance_until_gives_up_at_its_limit() -> None:
    clock = testing.FakeClock()
    never: Callable[[], bool] = lambda: False  # noqa: E731
    with pytest.raises(AssertionError, match="still false after 3 s of fake time"):
        clock.advance_until(never, "1s", limit="3s", sleepers=0)
    assert clock.monotonic() == 3.0


def test_a_pause_left_by_float_rounding_still_waits_for_time_to_move() -> None:
    """0.1 + 0.2 - 0.3 is 5.6e-17, not 0: such a pause waits for the next advance rather than
    returning at once, or a loop computing it would spin without end on the fake clock."""
    clock = FakeClock()
    thread, result = _sleep_in_thread(clock, 0.1 + 0.2 - 0.3)
    clock.wait_for_sleepers(1)
    thread.join(0.05)
    assert thread.is_alive()
    clock.advance(timedelta(microseconds=1))
    thread.join(5)
    assert result == [False]


def test_advance_until_waits_for_a_thread_busy_between_two_sleeps() -> None:
    """A thread that has slept on the clock and is now busy (a write to the database, say)
    holds time still until it sleeps again: fake time never runs ahead of it."""
    clock = FakeClock()
    busy = threading.Event()
    go_on = threading.Event()
    seen: list[float] = []

    def loop() -> None:
        clock.sleep(1)
        busy.set()
        go_on.wait(10)  # real work, not on the clock
        seen.append(clock.monotonic())
        clock.sleep(1)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    clock.wait_for_sleepers(1)
    clock.advance(1)
    assert busy.wait(5)
    threading.Timer(0.2, go_on.set).start()
    moved = clock.advance_until(lambda: not thread.is_alive(), 0.5, limit=10)
    assert seen == [1.0], "time stood still while the thread was busy"
    assert moved == 1.0
