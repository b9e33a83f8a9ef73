"""``clock``: a step of the host's wall clock (wall time moving apart from monotonic time by
more than a second) is noticed by the first read after it, and only then; a test waits for
named threads to park on a fake clock (``FakeClock.wait_for_sleeping``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from ultimat3.jobs import clock as clock_module
from ultimat3.jobs.clock import STEP, FakeClock, SystemClock, utcnow


@pytest.fixture
def shifted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """This process's wall clock, moved by ``offset[0]`` nanoseconds (the machine's is not)."""
    offset = [0]
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + offset[0])
    monkeypatch.setattr(clock_module, "_anchor", clock_module._Anchor())
    return offset


def test_a_step_forward_is_seen_once(shifted: list[int]) -> None:
    system = SystemClock()
    assert system.stepped_at() == -float("inf")
    before = utcnow()
    shifted[0] = 2 * 3600 * 10**9
    assert utcnow() - before > timedelta(hours=1, minutes=59), "the new time is used at once"
    step = clock_module.last_step()
    assert step is not None and abs(step.by - timedelta(hours=2)) < timedelta(seconds=1)
    seen = system.stepped_at()
    assert seen == step.at and seen <= system.monotonic()
    utcnow()
    assert system.stepped_at() == seen, "time going on after the step is not another step"


def test_a_step_back_is_seen_and_drift_is_not(shifted: list[int]) -> None:
    system = SystemClock()
    shifted[0] = int(STEP * 0.9 * 10**9)  # under a second: a drift, not a step
    system.now()
    assert system.stepped_at() == -float("inf")
    shifted[0] = -3600 * 10**9
    system.now()
    step = clock_module.last_step()
    assert step is not None and step.by < -timedelta(minutes=59)


def test_the_fake_clock_steps_only_when_told() -> None:
    fake = FakeClock()
    fake.advance(3600)
    assert fake.stepped_at() == -float("inf"), "time passing is not a step"
    start = fake.now()
    fake.step(timedelta(hours=2))
    assert fake.now() == start + timedelta(hours=2)
    assert fake.stepped_at() == fake.monotonic()
    fake.advance(5)
    fake.set(start)  # back: wall time alone moved
    assert fake.stepped_at() == fake.monotonic()


def test_a_forked_child_reads_the_clock_though_a_thread_held_its_lock() -> None:
    import os
    import signal

    with clock_module._anchor.lock:  # as a thread reading the clock at the fork would
        pid = os.fork()
        if pid == 0:  # the child: a read must not wait for the parent's thread
            signal.alarm(5)  # (a child that hangs dies of it, and the test fails)
            utcnow()
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _sleeper(clock: FakeClock, name: str, seconds: float, go: threading.Event) -> threading.Thread:
    """A thread named ``name`` that sleeps ``seconds`` on ``clock`` once ``go`` is set."""

    def run() -> None:
        go.wait(5)
        clock.sleep(seconds)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def test_wait_for_sleeping_returns_once_every_named_thread_is_asleep() -> None:
    clock = FakeClock()
    go_a, go_b = threading.Event(), threading.Event()
    a = _sleeper(clock, "loop-a", 10, go_a)
    b = _sleeper(clock, "loop-b", 10, go_b)
    go_a.set()
    waited: list[BaseException | None] = []
    waiter = threading.Thread(
        target=lambda: waited.append(_raised(clock.wait_for_sleeping, {"loop-a", "loop-b"}, 5))
    )
    waiter.start()
    clock.wait_for_sleeping(["loop-a"], 5)
    waiter.join(0.1)
    assert waiter.is_alive(), "returned while loop-b was not asleep yet"
    go_b.set()
    waiter.join(5)
    assert waited == [None], "woken when loop-b fell asleep, not left to its timeout"
    clock.advance(10)
    a.join(5)
    b.join(5)


def test_wait_for_sleeping_times_out_naming_who_is_missing() -> None:
    clock = FakeClock()
    go = threading.Event()
    go.set()
    sleeper = _sleeper(clock, "loop-a", 1, go)
    clock.wait_for_sleeping(["loop-a"], 5)
    clock.advance(1)  # its time has come: not asleep any more, though it may not have left
    sleeper.join(5)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"not asleep on the fake clock after 0.2 s: loop-a"):
        clock.wait_for_sleeping(["loop-a"], 0.2)
    assert 0.2 <= time.monotonic() - started < 5, "waited its timeout in real time, not longer"


def test_wait_for_sleeping_does_not_count_a_sleeper_whose_wake_is_set() -> None:
    clock = FakeClock()
    wake = threading.Event()
    wake.set()
    token = threading.current_thread()
    with clock._cond:  # a sleeper woken, not yet gone: as ``sleep`` leaves it under the lock
        clock._sleeping[token] = (10**9, wake)
    try:
        with pytest.raises(TimeoutError, match=r"\(asleep: none\)"):
            clock.wait_for_sleeping([token.name], 0.05)
    finally:
        with clock._cond:
            del clock._sleeping[token]


def test_advance_until_does_not_wait_for_the_threads_named_blocked() -> None:
    clock = FakeClock()
    release = threading.Event()

    def run() -> None:
        clock.sleep(1)
        release.wait(30)  # blocked away from the clock (on a pool the test holds, say)

    thread = threading.Thread(target=run, name="on-the-pool", daemon=True)
    thread.start()
    try:
        clock.wait_for_sleeping(["on-the-pool"], 5)
        clock.advance(1)  # it wakes, and blocks elsewhere: away, and known to the clock
        started = time.monotonic()
        moved = clock.advance_until(
            lambda: clock.monotonic() >= 3,
            "500ms",
            limit="5s",
            sleepers=0,
            settle=10,
            blocked={"on-the-pool"},
        )
        assert moved == 2
        assert time.monotonic() - started < 5, "waited for a blocked thread (settle: 10 s)"
    finally:
        release.set()
        thread.join(5)


def _raised(fn: Callable[..., object], *args: object) -> BaseException | None:
    try:
        fn(*args)
    except BaseException as error:  # reported to the test's thread
        return error
    return None
