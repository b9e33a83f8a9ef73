"""PostgreSQL as production runs it: behind PgBouncer, with every call bounded.

- A default URL that reaches PgBouncer in transaction mode is detected (a NOTIFY never reaches
  the LISTEN) and warned about with the fix; the driver then polls and prepares nothing. A
  direct connection is not mistaken for a pooler, nor is a NOTIFY that arrives late (a loaded
  machine), directly or through a TCP proxy.
- The timeouts of our statements are set per transaction: they hold for our statements and
  never reach a caller's transaction (``app.transaction()`` hands a pooled connection over),
  directly and through PgBouncer.
- A row-lock wait ends at ``lock_timeout``; a call without a reply (a stalled proxy) is cut
  off by the client-side watchdog, and the next call goes through once the path is back; so
  does the call after a connection reset.
- The outbox store's connection gets the same TCP settings and bounds.
- Behind a transaction pooler, notifications a once-LISTENed server session hands to our
  pooled connections are dropped, not kept unread for the connection's life.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tcpproxy import Proxy
from ultimat3.jobs import App, ConfigurationError, DriverUnavailableError
from ultimat3.jobs.drivers import open_driver
from ultimat3.jobs.drivers.postgres import PostgresDriver
from ultimat3.jobs.outboxes.postgres import PostgresOutboxStore
from ultimat3.jobs.records import Cancellation, ClaimParams, Cycle, NewJob

pytestmark = pytest.mark.postgres
_LEASE = timedelta(seconds=30)

_SETTINGS = (
    b"SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),"
    b" current_setting('idle_in_transaction_session_timeout')"
)


def _job() -> NewJob:
    from ultimat3.jobs.ids import uuid7

    job_id = uuid7()
    return NewJob(
        id=job_id,
        name="p.job",
        queue="default",
        input="{}",
        idempotency_key=f"k-{job_id}",
        max_attempts=3,
    )


def _url(dsn: str, query: str = "") -> str:
    parts = conninfo_to_dict(dsn)
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}{query}"


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == name]


def test_a_default_url_behind_pgbouncer_is_detected_and_warned(
    pgb_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = open_driver(_url(pgb_dsn))  # no ?pooler=: the mistake this guards against
    try:
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            driver.migrate()
        [warned] = _events(caplog, "jobs.postgres.pooler")
        assert "?pooler=transaction" in warned.fields["fix"]
        assert driver._listen is False and driver._prepare is False  # type: ignore[attr-defined]
        # Past psycopg's prepare threshold (5), on every pooled connection: nothing prepared,
        # so nothing lands on a server session that lacks it.
        for _ in range(12):
            driver.job_insert_many([_job()])
            params = ClaimParams(queues=("default",), limit=1, lease_for=_LEASE, worker_id="w")
            assert len(driver.job_cycle(Cycle(claim=params)).claimed) == 1
        started = time.monotonic()
        driver.wait_for_jobs(0.3, threading.Event())
        assert time.monotonic() - started >= 0.25, "polls; no LISTEN to return early"
    finally:
        driver.close()


def test_a_direct_connection_is_not_taken_for_a_pooler(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = open_driver(_url(pg_dsn))
    try:
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            driver.migrate()
        assert not _events(caplog, "jobs.postgres.pooler")
        assert driver._listen is True  # type: ignore[attr-defined]
    finally:
        driver.close()


def _late_probe(driver: Any, seconds: float) -> list[threading.Timer]:
    """Deliver the pooler check's first NOTIFY ``seconds`` late, as on a loaded machine: the
    driver's call that sends it returns at once and the NOTIFY is sent by a timer."""
    fetch = driver._fetch
    timers: list[threading.Timer] = []

    def send(query: bytes, params: dict[str, Any], **kwargs: Any) -> None:
        with contextlib.suppress(DriverUnavailableError):  # closed meanwhile: a failed test
            fetch(query, params, **kwargs)

    def late(query: bytes | str, params: dict[str, Any], **kwargs: Any) -> Any:
        probe = isinstance(query, bytes) and b"pg_notify" in query
        probe = probe and str(params.get("channel", "")).endswith(":probe")
        if probe and not timers:  # the first one only
            timers.append(threading.Timer(seconds, send, (query, params), kwargs))
            timers[0].start()
            return []
        return fetch(query, params, **kwargs)

    driver._fetch = late
    return timers


@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_a_late_notify_never_turns_listen_off(
    pg_dsn: str, via: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A NOTIFY that takes over a second (a loaded machine) is not a pooler. Directly, the
    server says so at once (the session's client is this socket); through a plain TCP proxy,
    which the server cannot see through, the check waits longer and hears it."""
    parts = conninfo_to_dict(pg_dsn)
    proxy = Proxy(int(parts["port"])) if via == "proxy" else None
    port = proxy.port if proxy is not None else parts["port"]
    driver: Any = open_driver(f"postgresql://{parts['user']}@127.0.0.1:{port}/{parts['dbname']}")
    try:
        timers = _late_probe(driver, 1.5)
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            started = time.monotonic()
            driver.wait_for_jobs(0.1, threading.Event())  # the first wait runs the check
            took = time.monotonic() - started
        assert timers, "the check sent its NOTIFY"
        assert not _events(caplog, "jobs.postgres.pooler")
        assert driver._listen is True and driver._prepare is None
        if via == "direct":
            assert took < 1.4, "the server's answer decided it; no wait for the NOTIFY"
        for timer in timers:
            timer.join()
    finally:
        driver.close()
        if proxy is not None:
            proxy.close()


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_our_timeouts_hold_for_our_statements_and_never_reach_a_callers_transaction(
    request: pytest.FixtureRequest, via: str
) -> None:
    dsn = request.getfixturevalue("pgb_dsn" if via == "pgbouncer" else "pg_dsn")
    query = "?statement_timeout=3s&lock_timeout=750ms"
    if via == "pgbouncer":
        query += "&pooler=transaction"
    app = App(_url(dsn, query))
    try:
        driver: Any = app.driver
        for _ in range(3):  # several pooled connections, several transactions
            assert driver._fetch(_SETTINGS, {}) == [("3s", "750ms", "3s")]
            with app.transaction() as conn:
                row = conn.execute(_SETTINGS).fetchone()
            assert row == ("0", "0", "0"), "a session-level SET would have leaked here"
        with psycopg.connect(dsn, autocommit=True) as other:
            assert other.execute(_SETTINGS).fetchone() == ("0", "0", "0")
    finally:
        app.close()


def test_a_callers_session_settings_never_unbound_our_next_statement(pg_dsn: str) -> None:
    # On a direct connection our bounds are session settings of each pooled connection; a
    # caller who changes the session inside app.transaction() leaves them changed, so the
    # connection's next statement of ours sets them again.
    app = App(_url(pg_dsn, "?statement_timeout=3s&lock_timeout=750ms&pool_max=1"))
    try:
        driver: Any = app.driver
        with app.transaction() as conn:
            conn.execute("SET statement_timeout = '42s'")
            conn.execute("SET lock_timeout = 0")
        for _ in range(2):  # the one pooled connection: set again, then as set
            assert driver._fetch(_SETTINGS, {}) == [("3s", "750ms", "3s")]
        with app.transaction() as conn:  # and the caller's own session value is back
            assert conn.execute(_SETTINGS).fetchone() == ("0", "0", "0")
    finally:
        app.close()


def test_a_migration_runs_without_our_statement_timeout(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An index build may take long: only the lock timeout (which the migration sets itself)
    # bounds a migration, although our bounds are the pooled connection's session settings.
    from ultimat3.jobs.dialects import postgres as module

    seen: list[Any] = []
    real = module.apply_migrations

    def spy(conn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(conn.execute(_SETTINGS).fetchone())
        return real(conn, *args, **kwargs)

    monkeypatch.setattr(module, "apply_migrations", spy)
    driver = open_driver(
        _url(pg_dsn, "?schema=u3_unbounded_migration&statement_timeout=1s&lock_timeout=500ms")
    )
    try:
        assert driver.migrate()
        assert seen == [("0", "0", "0")]
        assert driver._fetch(_SETTINGS, {}) == [("1s", "500ms", "1s")]  # type: ignore[attr-defined]
    finally:
        driver.close()


def test_a_row_lock_wait_ends_at_the_lock_timeout(pg_dsn: str) -> None:
    driver = open_driver(_url(pg_dsn, "?statement_timeout=5s&lock_timeout=300ms"))
    try:
        [result] = driver.job_insert_many([_job()])
        with psycopg.connect(pg_dsn) as holder:
            holder.execute(
                "SELECT 1 FROM ultimat3_jobs.x_jobs WHERE id = %s FOR UPDATE", (result.id,)
            )
            started = time.monotonic()
            with pytest.raises(DriverUnavailableError, match="lock timeout") as raised:
                driver.job_cancel(Cancellation(result.id, "operator"))
            waited = time.monotonic() - started
            holder.rollback()
        assert raised.value.retryable
        assert 0.25 <= waited < 3.0, waited
        assert driver.job_cancel(Cancellation(result.id, "operator")), "the next call goes through"
    finally:
        driver.close()


@pytest.fixture
def proxied_dsn(pg_dsn: str) -> Iterator[tuple[str, Any]]:
    port = int(conninfo_to_dict(pg_dsn)["port"])
    with Proxy(port) as proxy:
        yield make_conninfo(pg_dsn, port=str(proxy.port)), proxy


def test_a_call_without_a_reply_is_cut_off_by_the_watchdog(
    proxied_dsn: tuple[str, Any],
) -> None:
    dsn, proxy = proxied_dsn
    driver = PostgresDriver(dsn, statement_timeout=0.5, lock_timeout=0.25, pool_min=0)
    try:
        assert driver.call_budget == 1.5
        assert driver.job_get("nothing") is None
        proxy.stall()  # the peer acknowledges, nothing comes back: keepalives see no fault
        started = time.monotonic()
        with pytest.raises(DriverUnavailableError, match=r"no reply within 1\.5 s") as raised:
            driver.job_get("nothing")
        waited = time.monotonic() - started
        assert raised.value.retryable
        assert 1.4 <= waited < 4.0, waited
        proxy.resume()
        assert driver.job_get("nothing") is None, "a fresh connection once the path is back"
    finally:
        proxy.resume()
        driver.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?statement_timeout=soon", "not a duration"),
        ("?lock_timeout=20s", "could never fire"),
        ("?statement_timeout=2h", "not a timeout"),
        ("?poll=0", "not a poll interval"),
    ],
)
def test_bad_bounds_in_the_url_are_explained(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        open_driver("postgresql://nobody@127.0.0.1:1/none" + query)


def test_the_outbox_store_is_bounded_and_keeps_alive(pg_dsn: str) -> None:
    from ultimat3.jobs.outboxes import open_store

    store = open_store(_url(pg_dsn, "?statement_timeout=4s&lock_timeout=1s"))
    assert isinstance(store, PostgresOutboxStore)
    try:
        store.migrate()
        with store._transaction() as conn:
            assert conn.execute(_SETTINGS).fetchone() == ("4s", "1s", "12s")
        assert conn.execute(_SETTINGS).fetchone() == ("0", "0", "0"), "per transaction only"
        given = conn.info.get_parameters()
        assert (given["keepalives_idle"], given["tcp_user_timeout"]) == ("10", "30000")
    finally:
        store.close()


def test_a_reset_connection_fails_one_call_and_the_next_goes_through(
    proxied_dsn: tuple[str, Any],
) -> None:
    dsn, proxy = proxied_dsn
    driver = PostgresDriver(dsn, pool_min=0, pool_max=1)
    try:
        assert driver.job_get("nothing") is None
        accepted = proxy.accepted
        proxy.stall()  # the next call is sent, and its reply never comes: then the reset
        threading.Timer(0.3, proxy.reset).start()
        with pytest.raises(DriverUnavailableError) as raised:
            driver.job_get("nothing")
        assert raised.value.retryable
        proxy.resume()
        assert driver.job_get("nothing") is None
        assert proxy.accepted > accepted, "on a new connection"
    finally:
        proxy.resume()
        driver.close()


def test_stray_notifications_behind_a_transaction_pooler_are_not_kept(pgb_dsn: str) -> None:
    """A client that once LISTENed through the pooler leaves the registration on a server
    session, whose notifications then reach whichever client holds it next."""
    with psycopg.connect(pgb_dsn, autocommit=True) as stray:
        stray.execute("LISTEN ultimat3_jobs")  # stays on the server session it ran on
    driver: Any = open_driver(_url(pgb_dsn, "?pooler=transaction&pool_min=1&pool_max=1"))
    try:
        for _ in range(20):
            driver.job_insert_many([_job()])  # each NOTIFYs ultimat3_jobs
        with driver._connection() as conn:
            held = conn.execute(_SETTINGS)  # one more round trip, for what is in flight
            assert held.fetchone() is not None
            assert not conn._notifies_backlog, "nothing kept for a connection that never listens"
    finally:
        driver.close()


def test_a_joined_connection_is_identified_once_and_a_missing_table_asked_again(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where a caller's connection points is read once per connection (it never changes); a
    # missing job table is asked again, so migrating meanwhile is seen at the next join.
    app = App(_url(pg_dsn, "?schema=u3_joined_later"), migrate=False)
    try:
        with psycopg.connect(pg_dsn) as conn:
            missing = pytest.raises(ConfigurationError, match="not in the connection's database")
            with missing, app.using(conn):
                pass
            app.driver.migrate()
            asked: list[str] = []
            real_execute = psycopg.Cursor.execute

            def counting(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
                # The library's statements on a caller's connection go through a cursor of
                # its own (tuple rows, whatever the caller's row factory): count those on it.
                if cursor.connection is conn:
                    asked.append(query.decode() if isinstance(query, bytes) else str(query))
                return real_execute(cursor, query, *args, **kwargs)

            monkeypatch.setattr(psycopg.Cursor, "execute", counting)
            for _ in range(3):
                with app.using(conn):
                    pass
                conn.commit()
            identity = [q for q in asked if "pg_postmaster_start_time" in q]
            assert len(identity) == 1, asked  # three joins: one look
    finally:
        app.close()
