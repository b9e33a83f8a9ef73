"""Lifecycle: identity, migrations (idempotent, numbered, serialised across processes), close,
and ``adopt``."""

from __future__ import annotations

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import ConfigurationError

from .helpers import (
    SPAWN,
    DriverSpec,
    Undo,
    get,
    new_job,
    open_driver,
    proc_migrate,
    roll_back,
    run_processes,
)


def test_name_and_display_url(driver: Driver, driver_spec: DriverSpec) -> None:
    assert driver.name == driver_spec.kind
    assert isinstance(driver.display_url, str)
    assert driver.display_url
    if driver_spec.kind == "memory":
        assert driver.display_url == "memory://"


def test_single_writer_only_for_sqlite(driver: Driver, driver_spec: DriverSpec) -> None:
    # SQLite's one write lock makes a same-thread write outside an open transaction deadlock;
    # the enqueue path reads this flag to refuse such a write up front.
    assert driver.single_writer is (driver_spec.kind == "sqlite")


def test_migrate_applies_every_version_once(
    unmigrated_driver: Driver, driver_spec: DriverSpec
) -> None:
    migrations = unmigrated_driver.migration_sql()
    versions = [version for version, _ in migrations]
    # Increasing and unique; a number reserved by another branch may be missing for a while.
    assert versions == sorted(set(versions)) and (not versions or versions[0] == 1)
    assert all(isinstance(sql, str) and sql.strip() for _, sql in migrations)
    if driver_spec.kind != "memory":
        assert versions, "a SQL driver has at least one migration"

    assert unmigrated_driver.migrate() == versions
    assert unmigrated_driver.migrate() == []
    other = open_driver(driver_spec)
    try:
        if driver_spec.kind != "memory":  # a second memory driver is a second, empty store
            assert other.migrate() == []
    finally:
        other.close()


def test_concurrent_migrations_apply_each_version_once(
    shared_spec: DriverSpec, unmigrated_driver: Driver
) -> None:
    versions = [version for version, _ in unmigrated_driver.migration_sql()]
    barrier = SPAWN.Barrier(3)
    applied = run_processes(proc_migrate, [(shared_spec, barrier)] * 3)
    assert sorted(v for one in applied for v in one) == versions
    assert unmigrated_driver.migrate() == []


def test_close_twice_is_harmless(driver_spec: DriverSpec) -> None:
    other = open_driver(driver_spec)
    other.migrate()
    other.close()
    other.close()


def test_adopt_rejects_what_cannot_join(driver: Driver) -> None:
    with pytest.raises(ConfigurationError) as raised:
        driver.adopt(object())
    assert raised.value.fix, "the error says how to fix it"


def test_adopt_accepts_its_own_transaction(driver: Driver) -> None:
    committed, rolled_back = new_job(), new_job()
    with driver.transaction() as tx:
        driver.job_insert_many([committed], executor=driver.adopt(tx))
    with pytest.raises(Undo):
        roll_back(
            driver, lambda tx: driver.job_insert_many([rolled_back], executor=driver.adopt(tx))
        )
    assert get(driver, committed.id).id == committed.id
    assert driver.job_get(rolled_back.id) is None
