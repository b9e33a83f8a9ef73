"""The heartbeat always has a connection: lease renewals cannot be starved by handlers or
enqueues that hold every pooled connection.

On PostgreSQL the renewals run on a connection of their own, outside the pool. Here the pool
has two connections and both handlers hold one each in an open ``app.transaction()`` for
three leases: every lease is renewed all along (its expiry in the database keeps moving), none
is given up, the renew loop and the presence beat never fail, and both jobs complete once. (SQLite needs nothing of
the kind: its connections are per thread, the renew loop's included.) The three leases pass on a
fake clock (``faketime``), moved while the worker's loops are parked on it.
"""

from __future__ import annotations

import logging
import threading
import types
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from ultimat3.jobs import App, JobState, job
from ultimat3.jobs.testing import FakeClock

from . import faketime
from .processes import wait_until

pytestmark = pytest.mark.postgres
#: The loops that wait for a pooled connection (5 s, in real time) and fail, over and over,
#: while the handlers hold the pool: fake time does not wait for them.
ON_THE_POOL = frozenset({"ultimat3-jobs-cycle", "ultimat3-jobs-maintenance"})


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == name]


def test_renewals_go_on_while_handlers_hold_every_pooled_connection(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    parts = conninfo_to_dict(pg_dsn)
    url = (
        f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}?pool_max=2"
    )
    holding = threading.Barrier(3)  # both handlers and the test
    release = threading.Event()
    app_ref: list[App] = []

    @job
    def hog(input: dict[str, Any]) -> None:
        with app_ref[0].transaction() as conn:  # a pooled connection, held
            conn.execute("SELECT 1")
            holding.wait(30)
            assert release.wait(60)

    module = types.ModuleType("heartbeat_jobs")
    module.hog = hog  # type: ignore[attr-defined]
    clock = FakeClock()
    app = App(url, modules=[module], clock=clock)
    app_ref.append(app)
    try:
        worker = app.worker(concurrency=2, lease="2s", heartbeat="300ms", poll_interval="1s")
        with (
            caplog.at_level(logging.INFO, logger="ultimat3.jobs"),
            faketime.running(worker, clock),  # its loops parked before the pool is taken
        ):
            ids = [r.id for r in app.enqueue_many(hog, [{}, {}])]
            holding.wait(30)  # both pooled connections are held from now on
            with psycopg.connect(pg_dsn, autocommit=True) as watch:

                def expiries() -> list[datetime]:
                    rows = watch.execute(
                        "SELECT lease_expires_at FROM ultimat3_jobs.x_jobs"
                        " WHERE id = ANY(%s) ORDER BY id",
                        (ids,),
                    ).fetchall()
                    return [row[0] for row in rows]

                first = expiries()
                for _ in range(12):  # three leases, in half seconds
                    faketime.pass_time(clock, "500ms", blocked=ON_THE_POOL)
                    assert not _events(caplog, "jobs.lease.lost"), "a lease was given up"
                latest = expiries()
            # Renewed until the end: each expiry is a lease past a time the clock reached.
            assert all(b > a + timedelta(seconds=5) for a, b in zip(first, latest, strict=True)), (
                first,
                latest,
            )
            release.set()
            # The completions' writes wait on the database, not on the clock: time stays.
            wait_until(
                lambda: all(app.get_job(i).state is JobState.COMPLETED for i in ids),
                30,
                "both jobs to complete",
            )
        renew_failures = [
            r for r in _events(caplog, "jobs.loop.failed") if r.fields.get("loop") == "renew"
        ]
        assert not renew_failures, [r.fields for r in renew_failures]
        # The presence beat shares that connection: the live worker never looked gone.
        assert not _events(caplog, "jobs.worker.beat-failed")
        assert not _events(caplog, "jobs.lease.lost")
        assert all(app.get_job(i).attempt == 1 for i in ids)
    finally:
        release.set()
        app.close()
