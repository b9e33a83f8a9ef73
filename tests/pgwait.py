"""Helpers for tests that interrupt a PostgreSQL call at a chosen moment."""

from __future__ import annotations

import threading


def interrupt_when_waiting(url: str, backend_pid: int) -> tuple[threading.Thread, list[bool]]:
    """A started thread that sends SIGINT to this process once the backend ``backend_pid``
    waits for a lock (``pg_stat_activity``, read on a connection of its own), never before:
    a fixed delay could land before the wait on a loaded machine. The list holds True once
    the wait was seen and the signal sent; nothing is sent if it is not seen within 10 s."""
    import os
    import signal
    import time

    import psycopg

    sent: list[bool] = []

    def watch() -> None:
        with psycopg.connect(url, autocommit=True) as admin:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                row = admin.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                    [backend_pid],
                ).fetchone()
                if row is not None and row[0] == "Lock":
                    sent.append(True)
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.01)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread, sent
