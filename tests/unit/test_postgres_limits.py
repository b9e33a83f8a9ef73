"""What only the PostgreSQL driver does for concurrency limits: the per-key advisory lock a
limited claim takes (a key another claim holds is skipped, not waited for), and the NOTIFY a
limited job's completion sends."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from ultimat3.jobs.drivers.postgres import PostgresDriver
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import ClaimParams, Cycle, NewJob

pytestmark = pytest.mark.postgres

NOW = datetime(2031, 1, 1, tzinfo=UTC)


@pytest.fixture
def driver(pg_dsn: str) -> Iterator[PostgresDriver]:
    drv = PostgresDriver(pg_dsn)
    drv.migrate()
    try:
        yield drv
    finally:
        drv.close()


def job(key: str | None, most: int = 5) -> NewJob:
    id_ = uuid7()
    new = NewJob(id_, "j", "default", "{}", id_, 3)
    return new._replace(limit_key=key, limit_max=most if key else 0)


def claim(driver: PostgresDriver, limit: int = 10) -> list[str]:
    params = ClaimParams(("default",), limit, timedelta(seconds=30), "w", now=NOW, limited=True)
    return [j.id for j in driver.job_cycle(Cycle(claim=params), now=NOW).claimed]


def test_a_key_another_claim_holds_is_skipped_not_waited_for(
    driver: PostgresDriver, pg_dsn: str
) -> None:
    a, b = job("a"), job("b")
    driver.job_insert_many([a, b], now=NOW)
    with psycopg.connect(pg_dsn) as other:
        other.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext('a'))", (driver._limit_lock_class,)
        )
        assert claim(driver) == [b.id]
    assert claim(driver) == [a.id], "once the other transaction ends, the key is free"


def test_a_limited_completion_wakes_waiters_an_unlimited_one_does_not(
    driver: PostgresDriver, pg_dsn: str
) -> None:
    lim, plain = job("k"), job(None)
    driver.job_insert_many([lim, plain], now=NOW)
    claimed = driver.job_cycle(
        Cycle(claim=ClaimParams(("default",), 5, timedelta(seconds=30), "w", NOW, limited=True)),
        now=NOW,
    ).claimed
    leases = {j.id: j.lease for j in claimed}
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute("LISTEN ultimat3_jobs")
        driver.job_cycle(Cycle(completes=[leases[plain.id]]), now=NOW)
        assert _payloads(listener) == []
        driver.job_cycle(Cycle(completes=[leases[lim.id]]), now=NOW)
        assert _payloads(listener) == ["default"]


def _payloads(conn: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5, stop_after=5)]
