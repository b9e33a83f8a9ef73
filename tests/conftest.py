"""Root fixtures: a real PostgreSQL server for the tests that ask for one.

- ``pg_server`` (session): the server of ``ULTIMAT3_JOBS_TEST_DSN`` when that is set (its
  role must be allowed to create databases), otherwise a throwaway cluster that
  ``tests/pgcluster.py`` initdb's into a temp dir and starts on a free loopback port (fsync on,
  ``max_connections=200``). As root, the server runs as the ``postgres`` system user through
  ``runuser`` (created when missing). Without PostgreSQL binaries (``initdb``/``pg_ctl`` on
  PATH or in /usr/lib/postgresql/*/bin) and without the variable, every test that needs the
  server is skipped with that reason.
- ``pg_template`` (session): a database migrated once by ``PostgresDriver.migrate()``.
- ``pg_dsn``: a fresh database per test, cloned from the template with ``CREATE DATABASE ...
  TEMPLATE`` and dropped afterwards (together 0.1 to 0.3 s here: the drop checkpoints). A test that asks for the contract
  suite's ``unmigrated_driver`` but not ``driver``, or for ``pg_empty_dsn``, gets a database
  without the schema instead, since migrating it is what such a test checks.
- ``pg_cluster`` (session): the throwaway ``Cluster`` itself, for tests that terminate
  sessions; skipped against an external server. Tests that stop the server should start their
  own ``Cluster.create()`` so a failure cannot take the shared one down.

- ``pg_bouncer`` (session): PgBouncer in transaction-pooling mode in front of the throwaway
  cluster (``pgcluster.Bouncer``); ``pgb_dsn``: the test's fresh database (``pg_dsn``) reached
  through it. Skipped without the ``pgbouncer`` binary, except under ``CI=true``, where a
  missing binary is a failure (``.ci/run`` installs it).

Tests that use any of these are marked ``postgres`` automatically (``-m "not postgres"``).

The suite runs on worker processes (pytest-xdist, ``-n 3`` in pyproject.toml), each with its
own session fixtures (its own throwaway cluster). A test marked ``alone`` (a bound on latency
that the other workers' load could break) runs while no other test runs: it takes a lock that
every test shares (``_turn``), exclusively.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pgcluster import Bouncer, Cluster

ENV_DSN = "ULTIMAT3_JOBS_TEST_DSN"
_PG_FIXTURES = frozenset(
    {"pg_server", "pg_template", "pg_dsn", "pg_empty_dsn", "pg_cluster", "pg_bouncer", "pgb_dsn"}
)
_counter = itertools.count()


class PgServer:
    """A server the tests may create and drop databases on."""

    def __init__(self, admin_dsn: str, cluster: Cluster | None) -> None:
        self.admin_dsn = admin_dsn
        self.cluster = cluster

    def dsn(self, dbname: str) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(self.admin_dsn, dbname=dbname)

    def create_database(self, name: str, template: str | None = None) -> None:
        import psycopg
        from psycopg import sql

        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(query)

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(query)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _PG_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    with _turn(item):
        return (yield)


@contextlib.contextmanager
def _turn(item: pytest.Item) -> Iterator[None]:
    """Under ``-n``, hold the run's lock around the test (setup to teardown): shared, or
    exclusive for an ``alone`` test. An ``alone`` test first holds a gate, which every test
    passes before it takes its share, so that the workers' tests cannot keep it waiting."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    folder: Path = item.config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]
    alone = item.get_closest_marker("alone") is not None
    with open(folder / "gate.lock", "a") as gate, open(folder / "run.lock", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    external = os.environ.get(ENV_DSN)
    if external:
        yield PgServer(external, None)
        return
    from pgcluster import Cluster, find_bindir

    bindir = find_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL is not installed: no initdb/pg_ctl on PATH or in "
            f"/usr/lib/postgresql/*/bin, and {ENV_DSN} is not set"
        )
    cluster = Cluster.create(bindir)
    try:
        yield PgServer(cluster.dsn("postgres"), cluster)
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer) -> Iterator[str]:
    from ultimat3.jobs.drivers.postgres import PostgresDriver

    name = f"u3j_template_{os.getpid()}"
    pg_server.drop_database(name)
    pg_server.create_database(name)
    driver = PostgresDriver(pg_server.dsn(name), pool_min=0, pool_max=1, listen=False)
    try:
        driver.migrate()
    finally:
        driver.close()
    yield name
    pg_server.drop_database(name)


def _fresh_database(pg_server: PgServer, template: str | None) -> Iterator[str]:
    # Made and dropped in line: dropping checkpoints, and a database made ahead of time would
    # be among the dirty pages that checkpoint writes.
    name = f"u3j_test_{os.getpid()}_{next(_counter)}"
    pg_server.create_database(name, template=template)
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def pg_empty_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh database without the job schema."""
    yield from _fresh_database(pg_server, None)


@pytest.fixture
def pg_dsn(request: pytest.FixtureRequest, pg_server: PgServer) -> Iterator[str]:
    """A fresh, migrated database (empty for tests that migrate it themselves)."""
    names = set(request.fixturenames)
    if "unmigrated_driver" in names and "driver" not in names:
        yield request.getfixturevalue("pg_empty_dsn")
        return
    yield from _fresh_database(pg_server, request.getfixturevalue("pg_template"))


@pytest.fixture(scope="session")
def pg_cluster(pg_server: PgServer) -> Cluster:
    if pg_server.cluster is None:
        pytest.skip(f"{ENV_DSN} points at an external server: this test needs its own cluster")
    return pg_server.cluster


@pytest.fixture(scope="session")
def pg_bouncer(pg_cluster: Cluster) -> Iterator[Bouncer]:
    from pgcluster import Bouncer, find_pgbouncer

    if find_pgbouncer() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("pgbouncer is not installed, and CI must run the suite through it")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    bouncer = Bouncer.start(pg_cluster)
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture
def pgb_dsn(pg_dsn: str, pg_bouncer: Bouncer) -> str:
    """The test's fresh database (``pg_dsn``) through PgBouncer in transaction mode."""
    from psycopg.conninfo import conninfo_to_dict

    return pg_bouncer.dsn(conninfo_to_dict(pg_dsn)["dbname"])
