"""The client-side bound of every PostgreSQL call."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ultimat3.jobs.clock import Clock


class Watchdog:
    """Bounds calls on the client side. ``arm(conn)`` before a call, ``disarm(conn)`` after;
    a connection still armed ``budget`` seconds later has its socket shut down, so the read
    blocked on it fails at once (the connection is then broken, and the pool replaces it).
    A stalled peer that still acknowledges at TCP level (a hung pooler or proxy) is noticed
    by nothing else: neither keepalives nor ``tcp_user_timeout`` fire while it acknowledges.
    Every call gets the same budget, so the thread only wakes for the oldest deadline."""

    def __init__(self, budget: float, clock: Clock) -> None:
        self.budget = budget
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._armed: dict[int, tuple[float, Any]] = {}
        self._fired: set[int] = set()
        self._thread: threading.Thread | None = None

    def arm(self, conn: Any) -> None:
        with self._lock:
            self._armed[id(conn)] = (self._clock.monotonic() + self.budget, conn)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="ultimat3-jobs-pg-watchdog", daemon=True
                )
                self._thread.start()

    def disarm(self, conn: Any) -> None:
        with self._lock:
            self._armed.pop(id(conn), None)
            self._fired.discard(id(conn))

    @contextmanager
    def watching(self, conn: Any) -> Iterator[None]:
        """``arm(conn)`` for the body, ``disarm(conn)`` after it."""
        self.arm(conn)
        try:
            yield
        finally:
            self.disarm(conn)

    def fired(self, conn: Any) -> bool:
        """Whether the watchdog cut ``conn`` off during the call still armed on it."""
        with self._lock:
            return id(conn) in self._fired

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self._clock.monotonic()
            with self._lock:
                soonest = min((d for d, _ in self._armed.values()), default=now + self.budget)
                for key, (deadline, conn) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[key]
                        self._fired.add(key)
                        cut_off(conn)
            if soonest > now:
                self._clock.sleep(soonest - now, self._stop)


def cut_off(conn: Any) -> None:
    """Shut the connection's socket down under the read that waits on it."""
    try:
        fd = conn.pgconn.socket
    except Exception:
        return  # already closed
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
