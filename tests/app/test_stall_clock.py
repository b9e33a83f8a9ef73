"""A write stall defers the rescue for ``grace`` on the rescuer's clock: the driver stamps the
stall (``StallTracker``) on the clock it was given, the one the rescuer (the app's) reads.

Before, the SQLite and PostgreSQL drivers stamped it on the system clock whatever they were
given, while the rescuer measured ``grace`` on the app's: on a ``FakeClock`` a stall deferred
every rescue until ``grace`` of real time had passed, however far the test moved the clock.
(PostgreSQL opened by URL is given no clock, so real time there for both its waits and its
stalls: it waits on real time; a driver built with a clock stamps on that clock.)"""

from __future__ import annotations

import types
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, JobState, job
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.maintenance import Maintenance
from ultimat3.jobs.records import ClaimParams, Cycle
from ultimat3.jobs.testing import FakeClock


@job
def noop(input: dict[str, Any]) -> None:
    pass


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def driver(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Driver]:
    made: Driver
    if request.param == "memory":
        from ultimat3.jobs.drivers.memory import MemoryDriver

        made = MemoryDriver(clock=clock)
    elif request.param == "sqlite":
        from ultimat3.jobs.drivers.sqlite import SqliteDriver

        made = SqliteDriver(tmp_path / "jobs.sqlite3", clock=clock)
    else:
        from ultimat3.jobs.drivers.postgres import PostgresDriver

        made = PostgresDriver(request.getfixturevalue("pg_dsn"), clock=clock)
    yield made
    made.close()


def test_a_stall_defers_the_rescue_for_its_grace_on_the_apps_clock(
    driver: Driver, clock: FakeClock, make_module: Any
) -> None:
    module: types.ModuleType = make_module("stall_clock", noop=noop)
    app = App(driver=driver, modules=[module], clock=clock)
    made = app.enqueue(noop, {}).id
    lease = timedelta(seconds=3)
    params = ClaimParams(("default",), 1, lease, worker_id="gone", now=clock.pinned())
    [claimed] = app.driver.job_cycle(Cycle(claim=params), now=clock.pinned()).claimed
    assert claimed.id == made
    grace = timedelta(seconds=30)
    rescuer = Maintenance(app.driver, app.registry.job_named, clock, grace=grace)
    clock.advance(grace)  # past the rescuer's start, and the lease
    app.driver.stalls.note_failure()  # the database refused a write (a driver's own call)
    clock.advance("29s")
    assert rescuer.rescue() == [], "writes have flowed for less than the grace"
    clock.advance("1s")
    assert rescuer.rescue() == [made]
    assert app.get_job(made).state is JobState.AVAILABLE
