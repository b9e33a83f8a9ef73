"""Fixtures of the driver contract suite: every test that asks for ``driver`` runs once per
driver ("memory", "sqlite", "postgres") on a fresh, migrated database, and once more on
PostgreSQL through PgBouncer in transaction mode ("pgbouncer": a ``postgresql://`` URL with
``?pooler=transaction``, opened as an App would open it).

A driver whose module is not importable yet is skipped with the reason, and so is PostgreSQL
while ``tests/conftest.py`` has no ``pg_dsn`` fixture; ``pytest -ra`` lists every skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ultimat3.jobs.driver import Driver

from .helpers import DriverSpec, driver_class, open_driver


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("pgbouncer", marks=pytest.mark.postgres),
    ]
)
def driver_spec(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> DriverSpec:
    kind: str = request.param
    if kind == "pgbouncer":
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(request.getfixturevalue("pgb_dsn"))
        return DriverSpec(
            "postgres",
            f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
            "?pooler=transaction",
        )
    try:
        driver_class(kind)
    except ImportError as exc:
        pytest.skip(f"the {kind} driver is not importable yet: {exc}")
    if kind == "sqlite":
        return DriverSpec(kind, str(tmp_path_factory.mktemp("sqlite") / "jobs.sqlite3"))
    if kind == "postgres":
        try:
            dsn: str = request.getfixturevalue("pg_dsn")
        except pytest.FixtureLookupError:
            pytest.skip("tests/conftest.py has no pg_dsn fixture yet")
        return DriverSpec(kind, dsn)
    return DriverSpec(kind)


@pytest.fixture
def unmigrated_driver(driver_spec: DriverSpec) -> Iterator[Driver]:
    """A driver on a fresh database whose schema does not exist yet."""
    driver = open_driver(driver_spec)
    try:
        yield driver
    finally:
        driver.close()


@pytest.fixture
def driver(unmigrated_driver: Driver) -> Driver:
    unmigrated_driver.migrate()
    return unmigrated_driver


@pytest.fixture
def shared_spec(driver_spec: DriverSpec) -> DriverSpec:
    """A spec that several OS processes can open: SQLite and PostgreSQL only."""
    if driver_spec.kind == "memory":
        pytest.skip("the memory driver lives in one process")
    return driver_spec
