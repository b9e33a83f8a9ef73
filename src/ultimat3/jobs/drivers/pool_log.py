"""psycopg_pool's log records, owned: at most one line per outage and one per recovery.

While PostgreSQL is away, psycopg_pool logs a warning for every failed reconnection of every
pooled connection (hundreds a minute). ``OWNER``, a filter on the ``psycopg.pool`` logger,
drops the records of our pools (on their threads or ours, named ``ultimat3-jobs...``, or
naming our pool or one of its connections): the first failed connection of an outage becomes
one ``jobs.database.unavailable`` event, the first statement of ours that goes through after
it one ``jobs.database.recovered``. Records of the application's own pools pass untouched.
"""

from __future__ import annotations

import logging
import threading

from ultimat3.jobs import events
from ultimat3.jobs.clock import SystemClock

__all__ = ["OWNER", "PoolLog", "install"]

_PREFIX = "ultimat3-jobs"
_CLOCK = SystemClock()
#: The records that mean the server cannot be reached; the rest (a broken connection
#: discarded, say) are symptoms of the same outage, or of none, and are dropped quietly.
_CANNOT_CONNECT = ("error connecting", "reconnection attempt")


def _ours(record: logging.LogRecord) -> bool:
    if (record.threadName or "").startswith(_PREFIX):
        return True
    args = record.args if isinstance(record.args, tuple) else ()
    for arg in args:
        if isinstance(arg, str) and arg.startswith(_PREFIX):
            return True
        pool = getattr(arg, "_pool", None)  # a connection, still its pool's while returned
        if pool is not None and str(getattr(pool, "name", "")).startswith(_PREFIX):
            return True
    return False


class PoolLog(logging.Filter):
    """The filter, and the one outage state of this process's pools."""

    def __init__(self) -> None:
        super().__init__("psycopg.pool")
        self._lock = threading.Lock()
        #: Whether an outage was reported and its recovery not yet (read unlocked, often).
        self.down = False
        self._since = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if not _ours(record):
            return True
        if record.levelno >= logging.WARNING and str(record.msg).startswith(_CANNOT_CONNECT):
            self.outage(record.getMessage())
        return False

    def outage(self, detail: str) -> None:
        with self._lock:
            if self.down:
                return
            self.down = True
            self._since = _CLOCK.monotonic()
        events.warning("jobs.database.unavailable", detail=" ".join(detail.split())[:300])

    def recovered(self) -> None:
        with self._lock:
            if not self.down:
                return
            self.down = False
            seconds = _CLOCK.monotonic() - self._since
        events.warning("jobs.database.recovered", down_for=round(seconds, 3))


OWNER = PoolLog()


def install() -> None:
    """Own the ``psycopg.pool`` records of our pools (idempotent: ``addFilter`` adds a filter
    once)."""
    logging.getLogger("psycopg.pool").addFilter(OWNER)
