"""The lease renewals' connection of the PostgreSQL driver, outside the pool: never left open
(a failed set-up, a driver closed while it connects or runs a statement), replaced after the
pool's connection lifetime, and never held by a presence beat while a renewal needs it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from ultimat3.jobs.drivers.postgres import PostgresDriver
from ultimat3.jobs.errors import DriverUnavailableError
from ultimat3.jobs.records import WorkerInfo

PID = b"SELECT pg_backend_pid()"


@pytest.fixture
def driver(pg_dsn: str) -> Iterator[Any]:
    drv = PostgresDriver(pg_dsn)
    try:
        yield drv
    finally:
        drv.close()


def _run(action: Any) -> tuple[threading.Thread, list[BaseException]]:
    failed: list[BaseException] = []

    def body() -> None:
        try:
            action()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, failed


def test_a_renewal_connection_whose_set_up_fails_is_closed(driver: Any) -> None:
    opened: list[psycopg.Connection[Any]] = []

    def configure(conn: psycopg.Connection[Any]) -> None:
        opened.append(conn)
        raise psycopg.OperationalError("the server is shutting down")

    driver._configure = configure
    for _ in range(3):
        with pytest.raises(DriverUnavailableError, match="to renew leases"):
            driver._on_renewer(PID, {})
    assert len(opened) == 3
    assert all(conn.closed for conn in opened)


def test_a_renewal_still_connecting_when_the_driver_closes_closes_its_connection(
    driver: Any,
) -> None:
    entered, go_on = threading.Event(), threading.Event()
    opened: list[psycopg.Connection[Any]] = []
    configure = driver._configure

    def slow_configure(conn: psycopg.Connection[Any]) -> None:
        opened.append(conn)
        entered.set()
        go_on.wait(30)
        configure(conn)

    driver._configure = slow_configure
    thread, failed = _run(lambda: driver._on_renewer(PID, {}))
    assert entered.wait(30)
    driver.close()  # cannot get the renewal's lock: it goes on without it
    go_on.set()
    thread.join(30)
    assert not thread.is_alive()
    assert [type(exc) for exc in failed] == [DriverUnavailableError]
    assert "is closed" in str(failed[0])
    assert opened[0].closed
    assert driver._renewer is None


def test_close_under_a_running_renewal_cuts_it_off_and_the_renewal_closes_it(
    driver: Any, pg_dsn: str
) -> None:
    driver._on_renewer(PID, {})
    conn = driver._renewer
    pid = conn.pgconn.backend_pid
    thread, failed = _run(lambda: driver._on_renewer(b"SELECT pg_sleep(60)", {}))
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        for _ in range(300):
            row = admin.execute(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            if row is not None and row[0] == "PgSleep":
                break
            threading.Event().wait(0.01)
        else:
            raise AssertionError("the renewal never started its statement")
    driver.close()
    thread.join(10)  # far less than the statement's 60 s: the socket was shut down
    assert not thread.is_alive()
    assert [type(exc) for exc in failed] == [DriverUnavailableError]
    assert conn.closed
    assert driver._renewer is None


def test_the_renewal_connection_is_replaced_after_the_pools_connection_lifetime(
    driver: Any,
) -> None:
    [(first,)] = driver._on_renewer(PID, {})
    old = driver._renewer
    assert driver._on_renewer(PID, {}) == [(first,)]  # kept while young
    driver._renewer_since -= driver._pool.max_lifetime
    [(second,)] = driver._on_renewer(PID, {})
    assert second != first
    assert old.closed


def test_a_beat_while_a_renewal_holds_its_connection_takes_a_pooled_one(driver: Any) -> None:
    now = datetime.now(UTC)
    worker = WorkerInfo("h:1:beat", "h", 1, ("default",), 2, now, now, "0")
    with driver._renew_lock:  # a renewal in progress
        thread, failed = _run(lambda: driver.worker_beat(worker))
        thread.join(10)
        assert not thread.is_alive()  # it did not wait for the renewal
    assert not failed
    assert [w.id for w in driver.worker_list()] == [worker.id]


def test_a_beat_stuck_on_its_row_lock_holds_the_renewals_connection_one_second_at_most(
    pg_dsn: str,
) -> None:
    driver = PostgresDriver(pg_dsn, statement_timeout=60.0, lock_timeout=30.0)
    now = datetime.now(UTC)
    worker = WorkerInfo("h:1:stuck", "h", 1, ("default",), 2, now, now, "0")
    try:
        driver.worker_beat(worker)
        with psycopg.connect(pg_dsn) as holder:  # holds the worker's row past any renewal
            holder.execute(
                "SELECT 1 FROM ultimat3_jobs.x_workers WHERE id = %s FOR UPDATE", [worker.id]
            )
            thread, failed = _run(lambda: driver.worker_beat(worker))
            for _ in range(500):
                if driver._renew_lock.locked():
                    break
                threading.Event().wait(0.01)
            # The renewal that comes while the beat waits for the row gets the connection
            # once the beat's own lock timeout (1 s) ends it, not the driver's 30 s.
            started = time.monotonic()
            assert driver._on_renewer(PID, {})
            assert time.monotonic() - started < 10.0
            thread.join(10)
            assert not thread.is_alive()
            assert [type(exc) for exc in failed] == [DriverUnavailableError]
            holder.rollback()
    finally:
        driver.close()
