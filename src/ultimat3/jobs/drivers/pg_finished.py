"""Waiting for jobs to finish on PostgreSQL: one LISTEN connection per driver, opened by the
first wait for a result, on a channel of its own (``<schema>:finished``), so the workers'
LISTEN for new jobs never hears about completions.

Completions, dead ends and cancels of jobs a reader marked awaited (``job_await``)
``pg_notify`` that channel in their own transaction, with the finished ids as payload
(comma-separated; ``''`` when they would not fit, meaning "any job may have finished"). One
thread listens at a time; every waiting thread checks the
notifications since its mark, so none is lost between reading a job and waiting for it. A new
or lost LISTEN connection makes every waiter read its job again (a notification sent before
the LISTEN reached nobody). Not used behind a transaction-mode pooler: the driver polls then.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

import psycopg
from psycopg import sql as pg_sql

#: How long one listening turn lasts before the deadline and the closing flag are looked at.
_SLICE = 0.1
_BACKOFF_MAX = 5.0
#: Notifications remembered for waiters that were not listening when they came; a waiter
#: whose mark is older than these reads its job again.
_KEPT = 1024

#: The payload meaning "any job may have finished".
ANY = None


class FinishedListener:
    """LISTEN on one channel for finished job ids, shared by every waiting thread."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], channel: str) -> None:
        self._connect = connect
        self._channel = channel
        self._listen_lock = threading.Lock()  # one thread listens at a time
        self._cond = threading.Condition()
        self._seq = 0
        #: (seq, ids or ANY), newest last.
        self._seen: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=_KEPT)
        self._conn: psycopg.Connection[Any] | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self._closed = False

    def mark(self) -> int:
        """Where the notifications stand now: take it before reading the jobs you wait for."""
        with self._cond:
            return self._seq

    def wait(self, ids: Collection[str], timeout: float, since: int) -> int:
        """Block up to ``timeout`` seconds, returning early once a notification since
        ``since`` may concern ``ids`` (or the connection was opened or lost: read again).
        Returns the new mark."""
        deadline = time.monotonic() + timeout
        mark = since
        while not self._closed:
            with self._cond:
                hit, mark = self._hit(ids, mark)
            if hit:
                return mark
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return mark
            span = min(remaining, _SLICE)
            if self._listen_lock.acquire(blocking=False):
                try:
                    self._listen_once(span)
                finally:
                    self._listen_lock.release()
            else:
                with self._cond:
                    if self._seq == mark and not self._closed:
                        self._cond.wait(span)
        return mark

    def _hit(self, ids: Collection[str], mark: int) -> tuple[bool, int]:
        """Under ``_cond``: whether a notification after ``mark`` may concern ``ids``."""
        if self._seq == mark:
            return False, mark
        if not self._seen or self._seen[0][0] > mark + 1:
            return True, self._seq  # some were forgotten: read again
        for seq, finished in reversed(self._seen):
            if seq <= mark:
                break
            if finished is ANY or not finished.isdisjoint(ids):
                return True, self._seq
        return False, self._seq

    def _note(self, finished: frozenset[str] | None) -> None:
        with self._cond:
            self._seq += 1
            self._seen.append((self._seq, finished))
            self._cond.notify_all()

    def _listen_once(self, span: float) -> None:
        conn = self._conn
        if conn is None:
            now = time.monotonic()
            if now < self._retry_at:
                time.sleep(min(span, self._retry_at - now))
                return
            try:
                conn = self._connect()
                conn.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(self._channel)))
            except psycopg.Error:
                self._backoff = min(max(0.25, 2 * self._backoff), _BACKOFF_MAX)
                self._retry_at = time.monotonic() + self._backoff
                return
            self._conn = conn
            self._backoff = 0.0
            self._note(ANY)  # sent before the LISTEN reached nobody: every waiter reads again
            return
        try:
            # Back as soon as one arrives (with those that came in the same read), so that
            # this thread's own waiter sees it at once, not at the end of the slice.
            got = list(conn.notifies(timeout=span, stop_after=1))
            if got:
                got.extend(conn.notifies(timeout=0))
            for note in got:
                payload = note.payload
                self._note(frozenset(payload.split(",")) if payload else ANY)
        except psycopg.Error:
            self._drop()
            self._note(ANY)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def close(self) -> None:
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        got = self._listen_lock.acquire(timeout=2 * _SLICE + 1.0)
        try:
            self._drop()
        finally:
            if got:
                self._listen_lock.release()
