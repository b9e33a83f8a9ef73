"""Helpers for tests that interrupt a PostgreSQL call at a chosen moment."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import psycopg


@contextlib.contextmanager
def interrupt_when_blocked(url: str, backend_pid: int, blocker_pid: int) -> Iterator[list[bool]]:
    """Ctrl-C once the backend ``backend_pid`` is blocked by a lock that ``blocker_pid`` holds,
    never before: a thread of the block's own polls ``pg_blocking_pids`` on a connection of
    its own and then sends SIGINT to this process, which raises KeyboardInterrupt in the main
    thread. The yielded list holds True once the block was seen and the signal sent; the
    watch ends with the block (no time limit of its own: the statement's lock_timeout is the
    bound), so a statement that ended without being blocked leaves it empty.

    For the block, SIGINT raises KeyboardInterrupt whatever this process inherited: a suite
    started in the background by a non-interactive shell (``pytest ... &``) inherits SIGINT
    ignored, and the signal would be lost. Call it from the main thread."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sent: list[bool] = []
    done = threading.Event()
    try:
        with psycopg.connect(url, autocommit=True) as admin:

            def watch() -> None:
                while not done.is_set():
                    row = admin.execute(
                        "SELECT %s = ANY(pg_blocking_pids(%s))", [blocker_pid, backend_pid]
                    ).fetchone()
                    if row is not None and row[0]:
                        sent.append(True)
                        os.kill(os.getpid(), signal.SIGINT)
                        return
                    done.wait(0.01)

            thread = threading.Thread(target=watch)
            thread.start()
            try:
                yield sent
            finally:
                done.set()
                thread.join()
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGINT, previous)
