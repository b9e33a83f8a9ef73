"""Time, read in one place.

Everything else takes a ``Clock``. ``SystemClock`` reads the host's clocks; the fake clock in
``ultimat3.jobs.testing`` moves only when told. ``Clock.pinned()`` is what a service passes to a
driver as ``now``: ``None`` for the system clock, meaning "use the database's own clock" (so a
host whose clock is skewed cannot expire a PostgreSQL lease), and the fake time under test.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable


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


def utcnow() -> datetime:
    return datetime.now(UTC)


class SystemClock:
    """The real clock: the system's time (``pinned()`` is None: a driver uses its database's
    clock where it can, as PostgreSQL's ``now()``)."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        return datetime.now(UTC)

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


class FakeClock:
    """A clock that moves only when ``advance()`` or ``set()`` is called.

    ``sleep()`` returns at once (advancing nothing), so loops driven by it spin only as fast as
    the test calls ``tick()`` on them.
    """

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2026, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError(
                "FakeClock needs a timezone-aware start, e.g. datetime(..., tzinfo=UTC)"
            )
        self._now = start.astimezone(UTC)
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The fake time, timezone-aware, in UTC."""
        with self._lock:
            return self._now

    def pinned(self) -> datetime | None:
        """The fake time: drivers use it instead of the database's clock."""
        return self.now()

    def monotonic(self) -> float:
        """Seconds moved forward so far (``advance``, and ``set`` forward)."""
        with self._lock:
            return self._mono

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> bool:
        """Return at once, advancing nothing: True when ``wake`` is set."""
        return wake.is_set() if wake is not None else False

    def advance(self, by: timedelta | float) -> datetime:
        """Move forward by a timedelta or a number of seconds; returns the new time.

        ``ultimat3.jobs.testing.FakeClock`` also takes text such as "5m".
        """
        delta = by if isinstance(by, timedelta) else timedelta(seconds=by)
        with self._lock:
            self._now += delta
            self._mono += delta.total_seconds()
            return self._now

    def set(self, to: datetime) -> None:
        """Jump to ``to`` (timezone-aware), forward or back; ``monotonic()`` only moves
        forward."""
        if to.tzinfo is None:
            raise ValueError("FakeClock.set needs a timezone-aware datetime")
        with self._lock:
            delta = (to - self._now).total_seconds()
            self._now = to.astimezone(UTC)
            self._mono += max(0.0, delta)
