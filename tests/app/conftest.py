from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App
from ultimat3.jobs.testing import FakeClock

from .processes import HERE


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("pgbouncer", marks=pytest.mark.postgres),
    ]
)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same app-level behaviour on every driver (PostgreSQL: a fresh database per test;
    "pgbouncer": the same through PgBouncer in transaction mode, with ``?pooler=transaction``)."""
    if request.param == "memory":
        return "memory://"
    if request.param in ("postgres", "pgbouncer"):
        from psycopg.conninfo import conninfo_to_dict

        bounced = request.param == "pgbouncer"
        parts = conninfo_to_dict(request.getfixturevalue("pgb_dsn" if bounced else "pg_dsn"))
        url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
        return url + "?pooler=transaction" if bounced else url
    return f"sqlite:///{tmp_path / 'jobs.sqlite3'}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.sqlite3'}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_module() -> Iterator[Callable[..., types.ModuleType]]:
    """Build a throwaway module exporting the given handles, as `app.register` expects."""
    made: list[str] = []

    def make(name: str = "jobs_under_test", **exports: Any) -> types.ModuleType:
        module = types.ModuleType(name)
        for key, value in exports.items():
            setattr(module, key, value)
        sys.modules[name] = module
        made.append(name)
        return module

    yield make
    for name in made:
        sys.modules.pop(name, None)


@pytest.fixture
def make_app(url: str) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def make(*modules: Any, **kwargs: Any) -> App:
        app = App(url, modules=modules, **kwargs)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


# -- real worker processes: the environment of a spawned worker (the job database URL and the
# ledger files of faultjobs.py and limitjobs.py), on SQLite and PostgreSQL. A module that needs
# one database only, or more, defines its own ``env`` (test_faults.py, test_pg_faults.py).


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(request.getfixturevalue("pg_dsn"))
        url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    else:
        url = f"sqlite:///{tmp_path / 'workers.sqlite3'}"
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "LIMIT_LEDGER": str(tmp_path / "limit-ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


@pytest.fixture
def fault_app(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    """The fault jobs' App, in this process, on the same database as the spawned workers."""
    for key in ("ULTIMAT3_JOBS_URL", "FAULT_LEDGER"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("faultjobs", None)
    import faultjobs

    yield faultjobs.app
    faultjobs.app.close()
    sys.modules.pop("faultjobs", None)


@pytest.fixture
def spawn(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `ultimat3-jobs worker` processes; any still running at teardown are killed. Each
    one's stderr goes to a file (``processes.last_words`` reads it for a failure message)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"worker-{len(procs)}.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ultimat3.jobs", "--app", "faultjobs:app", "worker", *args],
                env=env,
                cwd=HERE,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        proc.log = log  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A PostgreSQL cluster of the test module's own, for tests that crash, stop or restart
    the server (the session's shared one must survive them)."""
    pgcluster = pytest.importorskip("pgcluster")
    try:
        own = pgcluster.Cluster.create()
    except pgcluster.ClusterError as exc:
        pytest.skip(str(exc))
    yield own
    own.close()
