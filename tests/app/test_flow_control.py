"""Limits and uniqueness windows through an App: what ``@job`` declares is what the database
enforces, on every driver."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ultimat3.jobs import App, Limit, job
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.limits import Unique


@job(unique=Unique(key=lambda o: o["user"], on_conflict="replace"))
def sync_user(input: dict[str, Any]) -> None:
    return None


@job(unique=Unique(key=lambda o: o["user"]))
def welcome(input: dict[str, Any]) -> None:
    return None


@job(concurrency=Limit(1, key=lambda o: o["account"]))
def charge(input: dict[str, Any]) -> None:
    return None


def _module(make_module: Callable[..., ModuleType]) -> ModuleType:
    return make_module("flow_jobs", sync_user=sync_user, welcome=welcome, charge=charge)


def test_unique_returns_or_debounces_the_waiting_job(
    make_app: Callable[..., App], make_module: Callable[..., ModuleType]
) -> None:
    app = make_app(_module(make_module))
    first = app.enqueue(welcome, {"user": 1, "v": 1})
    again = app.enqueue(welcome, {"user": 1, "v": 2})
    assert (again.id, again.deduped, first.deduped) == (first.id, True, False)
    assert app.enqueue(welcome, {"user": 2}).deduped is False
    synced = app.enqueue(sync_user, {"user": 1, "v": 1}, delay="1h")
    debounced = app.enqueue(sync_user, {"user": 1, "v": 2}, delay="2h")
    assert (debounced.id, debounced.deduped) == (synced.id, True)
    assert '"v":2' in app.get_job(synced.id).input.replace(" ", "")


def test_a_limited_job_is_claimed_by_a_worker_of_an_app_that_knows_it(
    make_app: Callable[..., App], make_module: Callable[..., ModuleType]
) -> None:
    app = make_app(_module(make_module))
    app.enqueue_many(charge, [{"account": 1}, {"account": 1}, {"account": 2}])
    worker = app.worker(concurrency=4)
    assert worker.limited
    worker.drain()
    assert app.count_jobs(state="completed") == 3


def test_an_outbox_on_another_database_refuses_flow_controlled_jobs(
    tmp_path: Path, make_module: Callable[..., ModuleType]
) -> None:
    business = tmp_path / "business.sqlite3"
    app = App(
        f"sqlite:///{tmp_path / 'jobs.sqlite3'}",
        modules=[_module(make_module)],
        outbox=f"sqlite:///{business}",
    )
    conn = sqlite3.connect(business)
    try:
        app.open()
        with pytest.raises(ConfigurationError) as caught, app.using(conn):
            app.enqueue(charge, {"account": 1})
        assert "concurrency limit or a uniqueness window" in str(caught.value)
        assert "job database" in caught.value.fix
    finally:
        conn.close()
        app.close()
