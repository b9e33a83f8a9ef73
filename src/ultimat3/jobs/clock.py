"""Time, read in one place.

Everything else takes a ``Clock``. ``SystemClock`` reads the host's clocks; the fake clock in
``ultimat3.jobs.testing`` moves only when told. ``Clock.pinned()`` is what a service passes to a
driver as ``now``: ``None`` for the system clock, meaning "use the database's own clock" (so a
host whose clock is skewed cannot expire a PostgreSQL lease), and the fake time under test.

Steps of the wall clock. The host's wall clock can jump (an operator's ``date -s``, NTP
stepping a clock that was far off, a VM resumed). This module is where a step of the *host's*
clock is noticed: every read of wall time (``wall_ns``, which the system clock, ``utcnow`` and SQLite's
"database clock" all go through) compares how far wall time moved with how far the monotonic
clock moved since the previous read, and when the two differ by more than ``STEP`` (1 s) it
*re-anchors*: it takes the new wall time as true from then on and records the step
(``last_step``). Nothing is guessed: the new time is used at once, by every process of the
host alike. What a step would otherwise break is repaired by the services that depend on
wall time, each asking ``Clock.stepped_at()``: the worker renews its leases at once, the
rescuer (``maintenance``) trusts no lease expiry until a full lease has passed, the SQLite
driver moves its stored times by the step (``Frame``), and the scheduler keeps its own
continuous time.

The scheduler detects steps of the *database's* clock with a policy of its own (``scheduler``).
A process started after a step sees none here (``stepped_at`` is ``-inf``); the rescuer
therefore also counts its own start as a step (``maintenance``).
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from ultimat3.jobs.duration import DurationInput, to_timedelta

#: A move of wall time apart from monotonic time larger than this is a step, not a drift.
STEP = 1.0
_STEP_NS = int(STEP * 1e9)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@runtime_checkable
class Clock(Protocol):
    """Where the library reads time: ``App(clock=...)``. ``SystemClock`` is the real one;
    ``ultimat3.jobs.testing.FakeClock`` moves only when told."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...

    def pinned(self) -> datetime | None:
        """The time a driver must use, or None to let the database read its own clock."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards, for intervals and deadlines."""
        ...

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> bool:
        """Wait ``seconds`` or until ``wake`` is set; True when woken."""
        ...

    def stepped_at(self) -> float:
        """When (on ``monotonic()``) this clock's wall time last stepped: moved apart from
        monotonic time by more than ``STEP``; ``-inf`` if it never did. Reading it checks."""
        ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before trying again after a failure: ``first``, then twice the last
    wait, never more than ``cap``. With ``jitter`` each wait actually paused is drawn between
    half and all of it (equal jitter), so processes that failed together do not retry
    together. The one back-off of the library's loops (supervised loops, the pool's
    restarts, SQLite's busy wait, reconnects); ``Retry`` is the policy of a job's attempts."""

    first: float
    cap: float
    jitter: bool = False

    def after(self, last: float) -> float:
        """The wait that follows one of ``last`` seconds (``0``: the first failure)."""
        return min(self.cap, last * 2 or self.first)

    def pause(self, wait: float) -> float:
        """What to actually pause for ``wait``: itself, or drawn in its upper half with
        ``jitter``."""
        return random.uniform(wait / 2, wait) if self.jitter else wait


@dataclass(frozen=True, slots=True)
class Step:
    """A step of the wall clock: when it was seen (monotonic seconds) and by how much."""

    at: float
    by: timedelta


class _Anchor:
    """The process's reading of the host clock: the wall and monotonic times of the last read,
    and the last step seen. One per process: the host has one wall clock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wall = time.time_ns()
        self.mono = time.monotonic_ns()
        self.step: Step | None = None

    def read(self) -> int:
        # time.* is looked up at each call, so a test can shift this process's wall clock
        # (tests/app/clockshift.py) without touching the machine's.
        wall = time.time_ns()
        mono = time.monotonic_ns()
        with self.lock:
            moved = (wall - self.wall) - (mono - self.mono)
            if moved > _STEP_NS or moved < -_STEP_NS:
                self.step = Step(at=mono / 1e9, by=timedelta(microseconds=moved // 1000))
            self.wall = wall
            self.mono = mono
        return wall


_anchor = _Anchor()


def _after_fork() -> None:
    # A thread of the parent may have held the lock at the fork: the child's copy stays locked.
    _anchor.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def wall_ns() -> int:
    """Nanoseconds since the epoch on the host's wall clock; notes a step (see the module)."""
    return _anchor.read()


def last_step() -> Step | None:
    """The last step of the host's wall clock this process saw (it checks first)."""
    _anchor.read()
    return _anchor.step


@dataclass(frozen=True, slots=True)
class Frame:
    """Where a clock's wall time stands against a time that never steps: ``offset`` is wall
    time minus that time, in microseconds, on the boot ``boot``. It changes only when the wall
    clock steps (by the step), or when ``boot`` changes (the time that never steps restarts).

    The host's frame is host-wide on Linux: ``CLOCK_BOOTTIME`` is one clock for every process
    (unlike ``CLOCK_MONOTONIC``, it keeps counting while the host is suspended, so a resume is
    no step: the time that passed asleep did pass), and ``boot`` is the kernel's boot id. The
    SQLite driver stores the last frame seen in its file and moves the stored future times by
    any change of it (``drivers.sqlite``)."""

    boot: str
    offset: int
    #: The wall time it was read at, microseconds since the epoch.
    at: int


def _read_boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


#: The kernel's boot id (Linux), read once: a process lives within one boot. None elsewhere.
_BOOT_ID = _read_boot_id() if hasattr(time, "CLOCK_BOOTTIME") else None


def host_frame() -> Frame | None:
    """The host's frame (``Frame``): its wall clock against ``CLOCK_BOOTTIME``. None where
    there is no boot id or boot time to read (not Linux): there, a step cannot be told apart
    from a reboot across processes, and times stored by SQLite follow the wall clock."""
    if _BOOT_ID is None:
        return None
    boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    wall = wall_ns()
    return Frame(_BOOT_ID, (wall - boot) // 1000, wall // 1000)


def _no_frame() -> Frame | None:
    return None


def frame_reader(clock: Clock | None) -> Callable[[], Frame | None]:
    """How to read the frame of the wall time a driver writes with ``clock``: the host's for
    the system clock (and any clock that pins None: the driver then reads the host's clock),
    a fake clock's own (``FakeClock.frame``), and none for another clock that pins its time
    (its steps cannot be seen)."""
    if clock is None or isinstance(clock, SystemClock):
        return host_frame
    own = getattr(clock, "frame", None)
    if callable(own):
        return own  # type: ignore[no-any-return]
    return host_frame if clock.pinned() is None else _no_frame


def utcnow() -> datetime:
    return _EPOCH + timedelta(microseconds=wall_ns() // 1000)


class SystemClock:
    """The real clock: the system's time (``pinned()`` is None: a driver uses its database's
    clock where it can, as PostgreSQL's ``now()``)."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        return utcnow()

    def pinned(self) -> datetime | None:
        """None: the database reads its own clock."""
        return None

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> bool:
        """Wait ``seconds`` or until ``wake`` is set; True when woken."""
        if wake is None:
            time.sleep(max(0.0, seconds))
            return False
        return wake.wait(max(0.0, seconds))

    def stepped_at(self) -> float:
        """When (on ``monotonic()``) this process last saw the host's wall clock step;
        ``-inf`` if it never did."""
        step = last_step()
        return -float("inf") if step is None else step.at


#: How often (in real seconds) a ``FakeClock.sleep`` given a ``wake`` event looks at it: an
#: ``Event`` cannot notify the clock's condition, so the sleeper looks in slices this long.
WAKE_SLICE = 0.005
#: While ``FakeClock.advance_until`` waits for threads to park, it asks its predicate this often.
_SETTLE_SLICE = 0.01


class FakeClock:
    """A clock that moves only when ``advance()``, ``set()`` or ``step()`` is called;
    ``advance`` and ``advance_until`` take a ``timedelta``, seconds, or text such as "90s".

    ``sleep(seconds, wake)`` blocks until fake monotonic time has moved by ``seconds``
    (``advance``, or ``set`` forward) or ``wake`` is set, and returns True when woken, as
    ``SystemClock.sleep`` does: a loop on a fake clock is parked until the test moves time. A
    ``wake`` event is looked at every ``WAKE_SLICE`` of real time (an ``Event`` cannot notify
    the clock); a sleep without one waits on the clock alone. ``advance()`` is time passing
    (wall and monotonic time move together); ``step()`` moves wall time alone, as an operator's
    ``date -s`` would, and wakes no sleeper.

    To move time exactly when the loops are parked: ``sleepers()`` counts the threads asleep on
    the clock, ``wait_for_sleepers(n)`` waits (in real time) until ``n`` are,
    ``wait_for_sleeping(names)`` until the threads of those names are, ``next_wake()``
    says when the soonest wakes, and ``advance_until(predicate, step, limit=...)`` moves time
    by ``step`` until ``predicate()`` holds, each time once every thread that sleeps on the
    clock is parked again (none is busy with the previous step meanwhile).
    """

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2026, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError(
                "FakeClock needs a timezone-aware start, e.g. datetime(..., tzinfo=UTC)"
            )
        self._now = start.astimezone(UTC)
        #: Monotonic time in integer nanoseconds: steps of time add up without rounding.
        self._mono = 0
        self._stepped_at = -float("inf")
        #: Guards the times; notified whenever time moves or a thread starts to sleep.
        self._cond = threading.Condition(threading.Lock())
        #: Each sleeping thread's deadline (monotonic nanoseconds) and wake event.
        self._sleeping: dict[threading.Thread, tuple[int, threading.Event | None]] = {}
        #: Every thread that has slept on this clock (``advance_until`` waits for them).
        self._known: set[threading.Thread] = set()
        #: Its "boot": two fake clocks are two hosts, whose monotonic times are unrelated.
        self._boot = f"fake:{uuid.uuid4().hex}"

    def now(self) -> datetime:
        """The fake time, timezone-aware, in UTC."""
        with self._cond:
            return self._now

    def pinned(self) -> datetime | None:
        """The fake time: drivers use it instead of the database's clock."""
        return self.now()

    def monotonic(self) -> float:
        """Seconds moved forward so far (``advance``, and ``set`` forward)."""
        with self._cond:
            return self._mono / 1e9

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> bool:
        """Block until fake monotonic time has moved by ``seconds`` or ``wake`` is set (looked
        at every ``WAKE_SLICE`` real seconds); True when ``wake`` is set at the end."""
        if wake is not None and wake.is_set():
            return True
        if seconds <= 0:
            return False
        token = threading.current_thread()
        with self._cond:
            # At least a nanosecond: a pause left over by float rounding (1e-17 s) still
            # waits for time to move, rather than returning at once for ever.
            deadline = self._mono + max(1, _ns(seconds))
            self._sleeping[token] = (deadline, wake)
            self._known.add(token)
            self._cond.notify_all()  # wait_for_sleepers, advance_until
            try:
                while self._mono < deadline:
                    if wake is None:
                        self._cond.wait()
                    elif wake.is_set():
                        break
                    else:
                        self._cond.wait(WAKE_SLICE)
            finally:
                del self._sleeping[token]
        return wake is not None and wake.is_set()

    def sleepers(self) -> int:
        """How many threads are asleep on this clock now."""
        with self._cond:
            return len(self._sleeping)

    def sleeping(self) -> list[threading.Thread]:
        """The threads asleep on this clock now."""
        with self._cond:
            return list(self._sleeping)

    def next_wake(self) -> float | None:
        """The soonest monotonic time a sleeper wakes at (None when nobody sleeps)."""
        with self._cond:
            soonest = min((at for at, _ in self._sleeping.values()), default=None)
            return None if soonest is None else soonest / 1e9

    def wait_for_sleepers(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait, up to ``timeout`` real seconds, until at least ``count`` threads sleep on this
        clock; ``TimeoutError`` otherwise."""
        end = time.monotonic() + timeout
        with self._cond:
            while len(self._sleeping) < count:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(self._sleeping)} thread(s) sleep on the fake clock, not {count}, "
                        f"after {timeout} s"
                    )
                self._cond.wait(left)

    def wait_for_sleeping(self, names: Iterable[str], timeout: float = 10.0) -> None:
        """Wait, up to ``timeout`` real seconds, until a thread of each of ``names`` (thread
        names) is asleep on this clock: parked, its time not yet come and its ``wake`` not set.
        ``TimeoutError`` otherwise, naming the threads not asleep and those that are."""
        wanted = frozenset(names)
        end = time.monotonic() + timeout
        with self._cond:
            while missing := wanted - self._parked_names():
                left = end - time.monotonic()
                if left <= 0:
                    asleep = sorted(self._parked_names()) or ["none"]
                    raise TimeoutError(
                        f"not asleep on the fake clock after {timeout} s: "
                        f"{', '.join(sorted(missing))} (asleep: {', '.join(asleep)})"
                    )
                # Woken when a thread starts to sleep (``sleep`` notifies) or time moves.
                self._cond.wait(left)

    def _parked_names(self) -> set[str]:
        """The names of the threads parked on the clock now, under the lock."""
        return {
            thread.name
            for thread, (at, wake) in self._sleeping.items()
            if at > self._mono and (wake is None or not wake.is_set())
        }

    def advance_until(
        self,
        predicate: Callable[[], object],
        step: DurationInput,
        *,
        limit: DurationInput,
        sleepers: int = 1,
        settle: float = 1.0,
        blocked: Iterable[str] = (),
    ) -> float:
        """Advance by ``step`` until ``predicate()`` holds; returns the seconds moved.

        Time moves only while the clock's threads are parked: before each advance this waits
        until every live thread that has slept on the clock (but the caller) sleeps on it
        again, its time not yet come and its ``wake`` not set, and at least ``sleepers`` do.
        A thread busy with real work between two sleeps (a write, say) is waited for, so fake
        time never runs ahead of it. The wait lasts ``settle`` real seconds at most, asking
        ``predicate`` meanwhile; a thread still away then is blocked elsewhere (a job, a pool,
        a lock) and is not waited for again until its next sleep on the clock. The threads named
        in ``blocked`` are never waited for: the test knows they are blocked elsewhere (on a
        pool whose connections it holds, say) and would cost ``settle`` at each return.
        ``AssertionError`` when ``predicate`` still fails after ``limit``."""
        span = to_timedelta(limit) // timedelta(microseconds=1) * 1000
        by = to_timedelta(step) // timedelta(microseconds=1) * 1000
        skip = frozenset(blocked)
        with self._cond:
            start = self._mono
        while True:
            end = time.monotonic() + settle
            while not self._settled(sleepers, end, skip):
                if predicate():  # the thread that made it true may have ended
                    return self._moved(start)
            if predicate():
                return self._moved(start)
            with self._cond:
                if self._mono - start >= span:
                    moved = (self._mono - start) / 1e9
                    raise AssertionError(f"still false after {moved:g} s of fake time")
            self.advance(timedelta(microseconds=by // 1000))

    def _away(self, skip: frozenset[str] = frozenset()) -> list[threading.Thread]:
        """The live threads that slept on the clock and are not parked on it now (but the
        caller and those named in ``skip``), under the lock."""
        me = threading.current_thread()
        self._known = {t for t in self._known if t.is_alive()}
        away = []
        for thread in self._known:
            if thread is me or thread.name in skip:
                continue
            at, wake = self._sleeping.get(thread, (-1, None))
            if at <= self._mono or (wake is not None and wake.is_set()):
                away.append(thread)
        return away

    def _settled(self, sleepers: int, end: float, skip: frozenset[str] = frozenset()) -> bool:
        """Whether every thread that slept on the clock is parked on it again, and at least
        ``sleepers`` are, waiting a slice for it. Once the real time ``end`` has passed, the
        threads still away are taken to be blocked elsewhere (a job, a pool, a lock): they are
        no longer waited for until they sleep on the clock again."""
        with self._cond:
            for _ in range(2):
                if not self._away(skip) and len(self._sleeping) >= sleepers:
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    self._known.difference_update(self._away(skip))
                    return True
                self._cond.wait(min(left, _SETTLE_SLICE))
            return False

    def _moved(self, start: int) -> float:
        with self._cond:
            return (self._mono - start) / 1e9

    def stepped_at(self) -> float:
        """When (on ``monotonic()``) ``step`` last moved wall time by more than ``STEP``;
        ``-inf`` if it never did."""
        with self._cond:
            return self._stepped_at

    def frame(self) -> Frame:
        """Its wall time against its monotonic time (``Frame``): changed by ``step`` and by
        ``set`` backwards, never by ``advance``."""
        with self._cond:
            wall = (self._now - _EPOCH) // timedelta(microseconds=1)
            return Frame(self._boot, wall - self._mono // 1000, wall)

    def advance(self, by: DurationInput) -> datetime:
        """Move forward by ``by`` (a ``timedelta``, seconds, or text such as "5m"), waking the
        sleepers whose time has come; returns the new time."""
        delta = to_timedelta(by)
        with self._cond:
            self._now += delta
            self._mono += delta // timedelta(microseconds=1) * 1000
            self._cond.notify_all()
            return self._now

    def step(self, by: timedelta | float) -> datetime:
        """Move wall time alone, forward or back (a step of the clock: ``stepped_at()`` tells
        it); monotonic time stays, so no sleeper wakes. Returns the new time."""
        delta = by if isinstance(by, timedelta) else timedelta(seconds=by)
        with self._cond:
            self._now += delta
            if abs(delta.total_seconds()) > STEP:
                self._stepped_at = self._mono / 1e9
            self._cond.notify_all()
            return self._now

    def set(self, to: datetime) -> None:
        """Jump to ``to`` (timezone-aware), forward or back; ``monotonic()`` only moves
        forward (waking the sleepers whose time has come)."""
        if to.tzinfo is None:
            raise ValueError("FakeClock.set needs a timezone-aware datetime")
        with self._cond:
            delta = to - self._now
            self._now = to.astimezone(UTC)
            self._mono += max(0, delta // timedelta(microseconds=1) * 1000)
            if delta.total_seconds() < -STEP:  # wall time went back, monotonic time did not
                self._stepped_at = self._mono / 1e9
            self._cond.notify_all()


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)
