"""Waiting for another connection's commit (``wait_for_jobs``): ``PRAGMA data_version`` on
a connection of the waiting thread's own says whether one happened, and between two looks
the thread sleeps on a watch of the ``-wal`` file (``wake.FileWatch``) or polls. It knows the
file and its connection, nothing of jobs."""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ultimat3.jobs.clock import Clock
from ultimat3.jobs.wake import FileWatch, Wake

_log = logging.getLogger("ultimat3.jobs.drivers.sqlite")

# wait_for_jobs without a file watch (not Linux): poll every millisecond for a second after the
# last change (jobs are flowing), then every _POLL_SLOW, so an idle waiter costs little CPU.
_POLL_FAST = 0.001
_POLL_FAST_FOR = 1.0
_POLL_SLOW = 0.004
# With a file watch: the -wal file is written before its commit is visible, so after a write
# the waiter looks again every _SETTLE_POLL until the commit shows or _SETTLE_FOR passes without
# another write (a write that was no commit). The window outlives one wait: a wait may have
# drained the events of the next commit, still in flight.
_SETTLE_POLL = 0.0005
_SETTLE_FOR = 0.25


@dataclass(slots=True, weakref_slot=True, eq=False)
class Slot:
    """Owns one thread's connection; when the thread ends, the slot is dropped and closes it."""

    conn: sqlite3.Connection
    depth: int = 0  # nesting of transaction() on this thread
    seen_version: int | None = None  # wait_for_jobs: last PRAGMA data_version
    changed_at: float = -math.inf  # wait_for_jobs: monotonic time of the last change
    watch: FileWatch | None = None  # wait_for_jobs: the file watch, once opened
    watched: bool = False  # whether it was opened (it stays None where there is none)
    written_at: float = -math.inf  # wait_for_jobs: monotonic time of the last write seen


def wait_for_jobs(
    slot: Slot,
    timeout: float,
    wake: threading.Event,
    *,
    path: str,
    clock: Clock,
    read_version: Callable[[sqlite3.Connection], int | None],
) -> None:
    """Return after a commit by another connection, in any process, or when ``wake`` is
    set. ``PRAGMA data_version`` on a connection of this thread's own says whether one
    happened: it changes whenever another connection commits, and a commit since this
    thread's last wait returns at once, so a change made between two waits is not missed.

    Between two looks the thread sleeps on a watch of the ``-wal`` file and on ``wake`` when
    it is a ``Wake``; without a watch (not Linux) or with a plain ``Event``, it polls."""
    if wake.is_set():
        return
    conn = slot.conn
    watch = _watch(slot, path) if isinstance(wake, Wake) else None
    # A write drained here, or seen by the last wait, may be a commit still in flight (its
    # frames are written before it is visible): look again soon, as after any write.
    if watch is not None and watch.drain():
        slot.written_at = clock.monotonic()
    now = clock.monotonic()
    deadline = now + timeout
    version = read_version(conn)
    if version is None:  # busy in recovery: report a possible change, the caller polls
        return
    if slot.seen_version is not None and version != slot.seen_version:
        slot.seen_version, slot.changed_at = version, now
        return
    slot.seen_version = version
    # A write seen, its commit not visible yet: look again soon.
    settle_until = slot.written_at + _SETTLE_FOR
    while True:
        left = deadline - now
        if left <= 0:
            return
        if watch is not None:
            assert isinstance(wake, Wake)
            settling = now < settle_until
            written = watch.wait(min(left, _SETTLE_POLL) if settling else left, wake)
            if written:
                slot.written_at = clock.monotonic()
                settle_until = slot.written_at + _SETTLE_FOR
            look = written or settling
        else:
            recent = now - slot.changed_at < _POLL_FAST_FOR
            clock.sleep(min(_POLL_FAST if recent else _POLL_SLOW, left), wake)
            look = True
        if wake.is_set():
            return
        now = clock.monotonic()
        if not look:
            continue
        current = read_version(conn)
        if current != version:
            slot.changed_at = now
            if current is not None:
                slot.seen_version = current
            return


def _watch(slot: Slot, path: str) -> FileWatch | None:
    """The slot's watch of the database's ``-wal`` file, which every commit writes (the
    driver keeps journal_mode=WAL); opened on first use, None where the platform gives none."""
    if not slot.watched:
        slot.watched = True
        real = os.path.realpath(path)
        name = os.path.basename(real)
        slot.watch = FileWatch.open(os.path.dirname(real), (name + "-wal",))
        if slot.watch is None:
            _log.debug("no file watch for %s: waiting for jobs by polling", real)
    return slot.watch
