"""One LISTEN connection per driver, for every channel: the wake-up of workers (new jobs on
``<schema>``) and of readers waiting for results (``<schema>:finished``).

``Listener`` has no thread of its own: the waiting threads take turns, one listening while
the others wait for what it hands on. A new connection and a lost one are events too (a
notification sent while nobody listened reached nobody), so each consumer makes its waiters
read again. A lost connection is opened again after a ``clock.Backoff``; after
``probe_after`` seconds of silence one statement checks that the connection still answers.

``Finished`` is the consumer of the results' channel: completions, dead ends and cancels of
awaited jobs (``job_await``) notify it with the finished ids (comma-separated; ``''``: any
job may have finished). Each waiter checks the notifications since its mark, so none is lost
between reading a job and waiting for it.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

from ultimat3.jobs.clock import Backoff, Clock
from ultimat3.jobs.wake import Wake

with contextlib.suppress(ImportError):  # the driver names the extra to install
    import psycopg
    from psycopg import sql as pg_sql

#: What a consumer hears: a notification (with its payload), or the connection new or lost.
NOTE, CONNECTED, LOST = "note", "connected", "lost"
#: Notifications remembered for result waiters that were not listening when they came; a
#: waiter whose mark is older than these reads its job again.
_KEPT = 1024


class Listener:
    """LISTEN on one connection for every channel of a driver, shared by the waiting threads.

    ``consume(channel, handler)`` asks for a channel; ``handler(event, payload)`` runs under
    ``cond`` (which is then notified), so a waiter that checks its state under ``cond`` and
    waits on it misses nothing. ``turn(span, wake, changed)``: listen for up to ``span``
    seconds, or, while another thread listens, wait on ``cond`` unless ``changed()``."""

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        clock: Clock,
        backoff: Backoff,
        probe_after: float,
        ping: bytes,
        watch: Any,
    ) -> None:
        self._connect = connect
        self._clock = clock
        self._backoff = backoff
        self._probe_after = probe_after
        self._ping = ping
        self._watch = watch
        self.cond = threading.Condition()
        self._lock = threading.Lock()  # held by the thread that listens
        self._handlers: dict[str, Callable[[str, str | None], None]] = {}
        self.conn: Any = None
        self._listening: set[str] = set()
        self._wait = 0.0
        self._retry_at = 0.0
        self._probe_at = 0.0
        self.closed = False

    def consume(self, channel: str, handler: Callable[[str, str | None], None]) -> None:
        with self.cond:
            self._handlers.setdefault(channel, handler)

    def turn(
        self,
        span: float,
        wake: threading.Event | None = None,
        changed: Callable[[], bool] = lambda: False,
    ) -> None:
        if self._lock.acquire(blocking=False):
            try:
                if not self.closed:
                    self._listen_once(span, wake)
            finally:
                self._lock.release()
            return
        with self.cond:
            if not changed() and not self.closed:
                self.cond.wait(span)

    def _hand(self, channels: Collection[str], event: str, payload: str | None = None) -> None:
        with self.cond:
            for channel in channels:
                handler = self._handlers.get(channel)
                if handler is not None:
                    handler(event, payload)
            self.cond.notify_all()

    def _listen(self, conn: Any, channels: Collection[str]) -> None:
        with self._watch.watching(conn):
            for channel in sorted(channels):
                conn.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(channel)))

    def _listen_once(self, span: float, wake: threading.Event | None) -> None:
        """One turn: open the connection (or LISTEN on channels asked for since), or wait up
        to ``span`` for notifications and hand them on."""
        with self.cond:
            wanted = set(self._handlers)
        conn = self.conn
        if conn is None:
            now = self._clock.monotonic()
            if now < self._retry_at:
                self._clock.sleep(min(span, self._retry_at - now), wake)
                return
            try:
                conn = self._connect()
                self._listen(conn, wanted)
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                self._wait = self._backoff.after(self._wait)
                self._retry_at = self._clock.monotonic() + self._backoff.pause(self._wait)
                return
            self.conn, self._listening, self._wait = conn, wanted, 0.0
            self._probe_at = self._clock.monotonic() + self._probe_after
            self._hand(wanted, CONNECTED)
            return
        try:
            new = wanted - self._listening
            if new:
                self._listen(conn, new)
                self._listening |= new
                self._hand(new, CONNECTED)
                return
            if isinstance(wake, Wake):  # sleep on the socket and on the wake-up at once
                ready, _, _ = select.select([conn.fileno(), wake.fileno()], [], [], span)
                if wake.is_set():
                    return
                got = list(conn.notifies(timeout=0)) if ready else []
            else:
                # Back as soon as one arrives (with those that came in the same read), so
                # that this thread's own waiter sees it at once, not at the end of the span.
                got = list(conn.notifies(timeout=span, stop_after=1))
                if got:
                    got.extend(conn.notifies(timeout=0))
            if got:
                self._probe_at = self._clock.monotonic() + self._probe_after
                for note in got:
                    self._hand((note.channel,), NOTE, note.payload)
            elif self._clock.monotonic() >= self._probe_at:
                self._probe_at = self._clock.monotonic() + self._probe_after
                with self._watch.watching(conn):
                    conn.execute(self._ping)
        except psycopg.Error:
            self.drop()
            self._hand(self._listening, LOST)

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def close(self, within: float) -> None:
        """Stop: wake every waiter, and close the connection once its turn ended (or after
        ``within`` seconds)."""
        self.closed = True
        with self.cond:
            self.cond.notify_all()
        got = self._lock.acquire(timeout=within)
        try:
            self.drop()
        finally:
            if got:
                self._lock.release()


class Finished:
    """The readers' side of the results' channel: marks and waits for finished job ids."""

    def __init__(self, listener: Listener, channel: str, clock: Clock, span: float) -> None:
        self._listener = listener
        self._channel = channel
        self._clock = clock
        self._span = span
        self._seq = 0
        #: (seq, ids or None for "any"), newest last.
        self._seen: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=_KEPT)

    def mark(self) -> int:
        """Where the notifications stand now: take it before reading the jobs you wait for.
        Asks for the channel (LISTENed from the next turn on)."""
        self._listener.consume(self._channel, self._heard)
        with self._listener.cond:
            return self._seq

    def _heard(self, event: str, payload: str | None) -> None:
        """Under the listener's ``cond``: a new or lost connection means "any job"."""
        self._seq += 1
        self._seen.append((self._seq, frozenset(payload.split(",")) if payload else None))

    def wait(self, ids: Collection[str], timeout: float, since: int) -> int:
        """Block up to ``timeout`` seconds, returning early once a notification since
        ``since`` may concern ``ids`` (or the connection was opened or lost: read again).
        Returns the new mark."""
        deadline = self._clock.monotonic() + timeout
        mark = since
        while not self._listener.closed:
            with self._listener.cond:
                hit, mark = self._hit(ids, mark)
            if hit:
                return mark
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return mark
            self._listener.turn(min(remaining, self._span), changed=self._changed(mark))
        return mark

    def _changed(self, mark: int) -> Callable[[], bool]:
        return lambda: self._seq != mark

    def _hit(self, ids: Collection[str], mark: int) -> tuple[bool, int]:
        """Under ``cond``: whether a notification after ``mark`` may concern ``ids``."""
        if self._seq == mark:
            return False, mark
        if not self._seen or self._seen[0][0] > mark + 1:
            return True, self._seq  # some were forgotten: read again
        for seq, finished in reversed(self._seen):
            if seq <= mark:
                break
            if finished is None or not finished.isdisjoint(ids):
                return True, self._seq
        return False, self._seq
