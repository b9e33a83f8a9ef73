"""The total error contract of the seam: whatever the database raises under a driver call
reaches the services as a ``JobsError`` (a ``DriverUnavailableError`` saying whether a retry
can help), never as a sqlite3 or psycopg exception that a loop does not expect.

Faults are injected by a wrapper around the driver's connection, per error class: network
loss, read-only (a failover, a hot standby), serialization failure, deadlock, disk full,
I/O error, a damaged file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import DriverUnavailableError, JobsError
from ultimat3.jobs.records import ClaimParams, ExpiredQuery, Leadership, Lease

from .helpers import T0, claim_with, complete, new_job


class _Faulty:
    """A connection whose statements raise ``error``, on it or on a cursor of it (itself);
    everything else is the real one's."""

    def __init__(self, real: Any, error: BaseException) -> None:
        self._real = real
        self._error = error

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error

    executemany = execute
    # A transaction's BEGIN fails too: the pipelined statements of a PostgreSQL cycle run on a
    # cursor made straight from the connection, past ``cursor()``.
    transaction = execute

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _sqlite_error(cls: type[sqlite3.Error], message: str, code: int) -> sqlite3.Error:
    error = cls(message)
    error.sqlite_errorcode = code  # type: ignore[attr-defined]
    return error


SQLITE_FAULTS = [
    ("busy", lambda: _sqlite_error(sqlite3.OperationalError, "database is locked", 5), True),
    ("disk full", lambda: _sqlite_error(sqlite3.OperationalError, "disk is full", 13), True),
    ("I/O error", lambda: _sqlite_error(sqlite3.OperationalError, "disk I/O error", 10), True),
    ("read-only", lambda: _sqlite_error(sqlite3.OperationalError, "readonly", 8), False),
    ("damaged", lambda: _sqlite_error(sqlite3.DatabaseError, "malformed", 11), False),
    ("interface", lambda: sqlite3.InterfaceError("bad parameter"), False),
]


def _pg_faults() -> list[tuple[str, Callable[[], BaseException], bool]]:
    import psycopg
    from psycopg import errors

    return [
        ("network", lambda: psycopg.OperationalError("server closed the connection"), True),
        ("read-only", lambda: errors.ReadOnlySqlTransaction("read-only transaction"), True),
        ("serialization", lambda: errors.SerializationFailure("could not serialize"), True),
        ("deadlock", lambda: errors.DeadlockDetected("deadlock detected"), True),
        ("admin shutdown", lambda: errors.AdminShutdown("terminating"), True),
        ("disk full", lambda: errors.DiskFull("could not extend file"), True),
        ("syntax", lambda: errors.SyntaxError("a bug"), False),
    ]


@contextmanager
def _inject(driver: Driver, error: Callable[[], BaseException]) -> Iterator[None]:
    if driver.name == "sqlite":
        slot = driver._slot()  # type: ignore[attr-defined]
        real, timeout = slot.conn, driver._busy_timeout  # type: ignore[attr-defined]
        slot.conn = _Faulty(real, error())
        driver._busy_timeout = 0.05  # type: ignore[attr-defined]
        try:
            yield
        finally:
            slot.conn = real
            driver._busy_timeout = timeout  # type: ignore[attr-defined]
        return
    checkout, pool = driver._checkout, driver._pool  # type: ignore[attr-defined]
    putconn = pool.putconn
    # Lease renewals have a connection of their own, outside the pool: it fails the same way.
    connect_renewer = driver._connect_renewer  # type: ignore[attr-defined]

    def faulty() -> Any:
        return _Faulty(checkout(), error())

    def give_back(conn: Any) -> None:
        putconn(conn._real if isinstance(conn, _Faulty) else conn)

    driver._drop_renewer()  # type: ignore[attr-defined]
    driver._checkout = faulty  # type: ignore[attr-defined]
    driver._connect_renewer = lambda: _Faulty(connect_renewer(), error())  # type: ignore[attr-defined]
    pool.putconn = give_back
    try:
        yield
    finally:
        del driver._checkout  # type: ignore[attr-defined]
        del driver._connect_renewer  # type: ignore[attr-defined]
        driver._drop_renewer()  # type: ignore[attr-defined]
        pool.putconn = putconn


CALLS: list[tuple[str, Callable[[Driver], Any]]] = [
    (
        "claim",
        lambda d: claim_with(d, ClaimParams(("default",), 5, timedelta(seconds=30), "w", T0)),
    ),
    ("insert", lambda d: d.job_insert_many([new_job()], now=T0)),
    ("heartbeat", lambda d: d.lease_extend([Lease("x", "y")], timedelta(seconds=30), now=T0)),
    ("complete", lambda d: complete(d, [Lease("x", "y")], now=T0)),
    ("rescue", lambda d: d.job_list_expired(ExpiredQuery(5), now=T0)),
    (
        "leader",
        lambda d: d.leader_elect(Leadership("maintenance", "w", timedelta(seconds=15)), now=T0),
    ),
]


@pytest.mark.parametrize(("call", "invoke"), CALLS, ids=[c for c, _ in CALLS])
def test_every_database_error_reaches_the_services_as_a_jobs_error(
    driver: Driver, call: str, invoke: Callable[[Driver], Any]
) -> None:
    if driver.name == "memory":
        pytest.skip("the memory driver has no connection to fail")
    faults = SQLITE_FAULTS if driver.name == "sqlite" else _pg_faults()
    for label, error, retryable in faults:
        with _inject(driver, error), pytest.raises(JobsError) as raised:
            invoke(driver)
        found = raised.value
        assert isinstance(found, DriverUnavailableError), (label, found)
        assert found.retryable is retryable, (label, found)
        assert found.fix, label
    invoke(driver)  # and once the fault is gone, the same call works again (no raise)
