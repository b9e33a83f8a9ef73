"""Many worker processes on one machine: ``ultimat3-jobs worker --processes N``.

A ``ProcessPool`` starts N copies of the same worker command (``python -m ultimat3.jobs ...``
without ``--processes``), each a process of its own with its own GIL, database connections and
threads; they share the queue through the database as workers on different machines do.

- **A child that exits is restarted**, whatever its exit code (70: a loop could not go on; a
  crash; a kill), after a back-off that doubles from ``backoff`` up to ``backoff_max`` while
  children keep dying young, and resets once one has run for ``healthy_after``. Every exit and
  restart is logged (``jobs.pool.exited``, ``jobs.pool.started``).
- **SIGTERM or SIGINT** stops the pool: forwarded to every child, which drains gracefully; a
  second one is forwarded too (children stop at once); a third kills them. The pool exits 0
  when every child stopped cleanly, else with the first non-zero exit code of the stop.
- A child never outlives its pool: each one is told the pool's pid
  (``ULTIMAT3_JOBS_POOL_PID``) and stops gracefully once its parent is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.clock import Backoff, Clock, SystemClock

__all__ = ["ProcessPool", "watch_parent"]

#: Set in each child's environment: the pid of the pool that started it.
POOL_PID = "ULTIMAT3_JOBS_POOL_PID"


@dataclass
class _Child:
    slot: int
    process: subprocess.Popen[bytes]
    #: On the pool's clock's monotonic time.
    started: float


class ProcessPool:
    """Run ``processes`` copies of ``argv`` (arguments of ``python -m ultimat3.jobs``) and keep
    them running until stopped; see the module docstring."""

    def __init__(
        self,
        argv: Sequence[str],
        processes: int,
        *,
        backoff: float = 1.0,
        backoff_max: float = 30.0,
        healthy_after: float = 60.0,
        executable: str = sys.executable,
        check_every: float = 0.1,
        clock: Clock | None = None,
    ) -> None:
        self.argv = list(argv)
        self.processes = processes
        self.backoff = Backoff(backoff, backoff_max)
        self.healthy_after = healthy_after
        self.executable = executable
        self.check_every = check_every
        self.clock: Clock = clock or SystemClock()
        self.restarts = 0
        self._children: dict[int, _Child] = {}
        self._signals = 0
        self._stop = threading.Event()
        self._backoff = 0.0

    def run(self, *, install_signals: bool = True) -> int:
        previous: dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            for slot in range(self.processes):
                self._spawn(slot)
            return self._supervise()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self) -> None:
        """Stop gracefully, as a first SIGTERM does."""
        self._on_signal(signal.SIGTERM, None)

    # -- internals ---------------------------------------------------------------------------

    def _spawn(self, slot: int) -> None:
        env = {**os.environ, POOL_PID: str(os.getpid())}
        process = subprocess.Popen([self.executable, "-m", "ultimat3.jobs", *self.argv], env=env)
        self._children[slot] = _Child(slot, process, self.clock.monotonic())
        events.info("jobs.pool.started", slot=slot, pid=process.pid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self._stop.set()
        for child in list(self._children.values()):
            if child.process.poll() is not None:
                continue
            try:
                if self._signals >= 3:
                    child.process.kill()
                else:
                    child.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _supervise(self) -> int:
        restart_at: dict[int, float] = {}
        while True:
            now = self.clock.monotonic()
            for slot, child in list(self._children.items()):
                code = child.process.poll()
                if code is None:
                    continue
                if self._stop.is_set():
                    continue  # stopping: collected below
                lived = now - child.started
                healthy = lived >= self.healthy_after
                self._backoff = 0.0 if healthy else self.backoff.after(self._backoff)
                events.warning(
                    "jobs.pool.exited",
                    slot=slot,
                    pid=child.process.pid,
                    code=code,
                    lived=round(lived, 3),
                    restart_in=self._backoff,
                )
                del self._children[slot]
                restart_at[slot] = now + self._backoff
            if self._stop.is_set():
                return self._collect()
            for slot, when in list(restart_at.items()):
                if now >= when:
                    del restart_at[slot]
                    self.restarts += 1
                    self._spawn(slot)
            self.clock.sleep(self.check_every, self._stop)

    def _collect(self) -> int:
        """Wait for every child to stop; the first non-zero exit code, else 0. A child that
        the forwarded SIGTERM ended before it had installed its handlers (still starting)
        stopped as asked, having claimed nothing."""
        result = 0
        for child in self._children.values():
            code = child.process.wait()
            if code == -signal.SIGTERM and self._signals < 3:
                code = 0
            if code != 0 and result == 0:
                result = code if code > 0 else 128 - code  # killed by a signal: 128 + signum
        self._children.clear()
        return result


def watch_parent(*, every: float = 1.0, clock: Clock | None = None) -> None:
    """In a child of a ``ProcessPool``: a daemon thread sends this process SIGTERM (a graceful
    stop) once its pool is gone, so a killed pool leaves no orphans. Does nothing outside a
    pool."""
    parent = int(os.environ.get(POOL_PID, "0") or 0)
    if not parent:
        return
    clock = clock or SystemClock()

    def watch() -> None:
        while os.getppid() == parent:
            clock.sleep(every)
        events.warning("jobs.pool.orphaned", pool_pid=parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="ultimat3-jobs-pool-watch", daemon=True).start()
