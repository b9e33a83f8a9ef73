from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App
from ultimat3.jobs.testing import FakeClock


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same app-level behaviour on every driver (PostgreSQL: a fresh database per test)."""
    if request.param == "memory":
        return "memory://"
    if request.param == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(request.getfixturevalue("pg_dsn"))
        return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
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
