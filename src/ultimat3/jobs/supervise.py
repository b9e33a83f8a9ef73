"""One supervised-loop primitive for every background loop (claim, flush, heartbeat,
maintenance, scheduler, relay): none can die unnoticed.

A ``Loop`` calls its ``step`` again and again on a thread of its own until stopped. ``step``
returns how long to sleep before the next call (0: at once). Whatever it raises is caught:

- a ``JobsError`` (the database is away, read-only, refusing) is expected: logged as
  ``jobs.loop.failed`` with the loop's name and the error, then the loop backs off (0.1 s,
  doubling, at most 5 s) and goes on, for as long as it takes;
- anything else is a bug or a surprise: logged with its traceback, backed off the same way;
  after ``fatal_after`` of those in a row, a critical loop gives up and calls ``on_fatal``,
  whose job is to release what the process holds and make it exit non-zero, so that its
  supervisor (systemd, Kubernetes, ``worker --processes``) restarts it. A process never sits
  alive with a dead loop.

``stop()`` asks the loop to end after its current step and waits for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ultimat3.jobs import events
from ultimat3.jobs.clock import Backoff, Clock, SystemClock
from ultimat3.jobs.errors import JobsError

__all__ = ["Loop"]

#: After a failed step: 0.1 s, doubling up to 5 s.
BACKOFF = Backoff(first=0.1, cap=5.0)


class Loop:
    """Run ``step`` on a thread until stopped; see the module docstring."""

    def __init__(
        self,
        name: str,
        step: Callable[[], float],
        *,
        on_fatal: Callable[[str, BaseException], None] | None = None,
        fatal_after: int = 3,
        stop: threading.Event | None = None,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.step = step
        self.on_fatal = on_fatal
        self.fatal_after = fatal_after
        self.failures = 0  # consecutive
        self._unexpected = 0  # consecutive, of the unexpected kind
        self.backoff = backoff or BACKOFF
        self._backoff = 0.0
        self.stopping = stop or threading.Event()
        #: Where the loop waits between steps (the system's clock by default).
        self.clock = clock or SystemClock()
        #: Set when ``run`` returns.
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self.run, name=f"ultimat3-jobs-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        self.stopping.set()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the loop to end (``timeout`` seconds at most, on the loop's clock: on a
        ``FakeClock`` the timeout passes only as the test moves time)."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        if timeout is None:
            self.done.wait()
        else:
            self.clock.sleep(timeout, self.done)
        if self.done.is_set():
            thread.join()  # ``run`` has returned: only the thread's exit is left, so not alive

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """The loop itself (``start()`` runs it on a thread; call it to run it here)."""
        pause: float | None = 0.0
        try:
            while pause is not None and not self.clock.sleep(pause, self.stopping):
                pause = self.once()
        finally:
            self.done.set()

    def once(self) -> float | None:
        """One step under the loop's policy, on the caller's thread: the pause before the next
        step (a backoff after a failure), or None once ``on_fatal`` was called. A service whose
        steps run on threads of their own (the worker's cycle) uses this instead of ``run``."""
        try:
            pause = max(0.0, self.step())
        except JobsError as exc:
            self._backoff = self.backoff.after(self._backoff)
            self.failures += 1
            self._unexpected = 0
            events.warning(
                "jobs.loop.failed",
                loop=self.name,
                error=type(exc).__name__,
                cause=exc.cause,
                retry_in=self._backoff,
            )
            return self._backoff
        except BaseException as exc:  # the point of a supervisor: nothing kills the loop
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            self._backoff = self.backoff.after(self._backoff)
            self.failures += 1
            self._unexpected += 1
            events.error(
                "jobs.loop.crashed",
                exc=exc,
                loop=self.name,
                error=type(exc).__name__,
                cause=str(exc) or repr(exc),
                retry_in=self._backoff,
                in_a_row=self._unexpected,
            )
            if self.on_fatal is not None and self._unexpected >= self.fatal_after:
                events.error("jobs.loop.fatal", loop=self.name, error=type(exc).__name__)
                self.on_fatal(self.name, exc)
                return None
            return self._backoff
        self._backoff = 0.0
        self._unexpected = 0
        self.failures = 0
        return pause
