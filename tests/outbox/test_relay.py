"""The relay and the App's outbox path, on every store, with the jobs in a SQLite file of their
own: commit runs the job once, rollback never; a re-publish collapses; a failed publish keeps
its queue's order and is logged; the relay runs on a thread."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, events
from ultimat3.jobs.clock import Backoff
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.records import NewJob
from ultimat3.jobs.relay import Relay
from ultimat3.jobs.testing import FakeClock, drain

from .conftest import JOBS, RUNS, StoreSpec, job_a, job_b, keyed


def test_commit_publishes_and_runs_each_job_once(app: App, spec: StoreSpec) -> None:
    with spec.begin() as conn, app.using(conn):
        first = app.enqueue(job_a, 1)
        app.enqueue_many(job_b, [2, 3])
        assert app.count_jobs() == 0  # staged in the business database, not yet a job
    relay = app.relay()
    assert relay.pending() == 3
    assert relay.tick() == 3
    assert relay.pending() == 0
    assert relay.tick() == 0
    assert app.get_job(first.id).name == "job_a"  # the id returned at staging is the job's
    drain(app)
    assert sorted(RUNS) == [("a", 1), ("b", 2), ("b", 3)]


def test_rollback_never_publishes(app: App, spec: StoreSpec) -> None:
    with pytest.raises(RuntimeError), spec.begin() as conn, app.using(conn):
        app.enqueue(job_a, 1)
        raise RuntimeError("the request fails")
    relay = app.relay()
    assert relay.pending() == 0
    assert relay.tick() == 0
    drain(app)
    assert RUNS == []
    assert app.count_jobs() == 0


def test_a_republish_collapses_into_one_job(app: App, spec: StoreSpec) -> None:
    with spec.begin() as conn, app.using(conn):
        app.enqueue(job_a, 1)
        app.enqueue(keyed, {"key": "k"})
    # A relay that published and died before marking: the rows are still pending.
    with spec.store.claim(10) as batch:
        app.driver.job_insert_many([r.job for r in batch.records])
    assert spec.store.pending_count() == 2
    assert app.relay().tick() == 2
    assert app.count_jobs() == 2
    drain(app)
    assert sorted(map(str, RUNS)) == ["('a', 1)", "('keyed', {'key': 'k'})"]


def test_a_failed_publish_holds_back_its_queue_only(
    app: App, spec: StoreSpec, caplog: pytest.LogCaptureFixture
) -> None:
    # A job id already stored under another key cannot be inserted: a real, lasting failure.
    app.driver.job_insert_many(
        [
            NewJob(
                id="taken", name="job_a", queue="a", input="0", idempotency_key="x", max_attempts=1
            )
        ]
    )
    poisoned = NewJob(
        id="taken", name="job_a", queue="a", input="1", idempotency_key="y", max_attempts=1
    )
    with spec.begin() as conn, app.using(conn):
        spec.store.stage(spec.store.adopt(conn), [poisoned])
        app.enqueue(job_a, 2)
        app.enqueue(job_b, 3)
    relay = app.relay()
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        assert relay.tick() == 1  # queue b; nothing of queue a overtakes its failed row
    assert relay.pending() == 2
    failed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.outbox.publish-failed"]
    assert len(failed) == 1
    assert failed[0].fields["queue"] == "a" and failed[0].fields["id"] == "taken"  # type: ignore[attr-defined]
    # The operator removes the conflicting job; the next pass publishes queue a in order.
    assert app.cancel_job("taken")
    assert app.discard_jobs(["taken"]) == ["taken"]
    assert relay.tick() == 2
    assert relay.pending() == 0
    assert app.get_job("taken").input == "1"


@contextmanager
def published() -> Iterator[threading.Event]:
    """Set once a relay has published a row (``jobs.outbox.published``)."""
    done = threading.Event()
    sub = events.subscribe(lambda _: done.set(), names=["jobs.outbox.published"])
    try:
        yield done
    finally:
        sub.close()


def test_the_relay_thread_publishes_within_its_interval(app: App, spec: StoreSpec) -> None:
    with published() as done, app.relay(interval="20ms") as relay:
        with spec.begin() as conn, app.using(conn):
            app.enqueue(job_a, 1)
        assert done.wait(5), "the relay thread published nothing within 5 s"
    assert app.count_jobs() == 1
    assert relay.pending() == 0


def test_outbox_false_inserts_at_once(app: App, spec: StoreSpec) -> None:
    with spec.begin() as conn, app.using(conn):
        app.enqueue(job_a, 1, outbox=False)
        assert app.count_jobs() == 1
    assert spec.store.pending_count() == 0


def test_without_an_outbox_the_error_says_how_to_get_one(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", modules=[JOBS])
    conn = sqlite3.connect(tmp_path / "business.sqlite3")
    try:
        with pytest.raises(ConfigurationError) as caught, app.using(conn):
            pass
        assert "outbox=" in caught.value.fix
        with pytest.raises(ConfigurationError):
            app.relay()
    finally:
        conn.close()
        app.close()


def test_an_outbox_on_the_job_database_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    app = App(url, modules=[JOBS], outbox=url)
    try:
        with pytest.raises(ConfigurationError) as caught:
            app.relay()
        assert "drop outbox=" in caught.value.fix
    finally:
        app.close()


def test_published_rows_are_pruned_after_the_retention(app: App, spec: StoreSpec) -> None:
    with spec.begin() as conn, app.using(conn):
        app.enqueue(job_a, 1)
        app.enqueue(job_a, 2)
    relay = app.relay()
    assert relay.tick() == 2
    assert relay.prune() == 0, "published a moment ago: kept for the retention"
    relay.clock = FakeClock(datetime.now(UTC) + timedelta(days=2))
    assert relay.prune() == 2
    assert relay.pending() == 0
    assert app.count_jobs() == 2, "pruning the outbox never touches the jobs"


def test_the_relay_prunes_every_prune_every_of_its_clock(app: App, spec: StoreSpec) -> None:
    clock = FakeClock(datetime.now(UTC))
    relay = Relay(
        store=spec.store,
        driver=app.driver,
        clock=clock,
        retention=timedelta(minutes=1),
        prune_every=timedelta(minutes=5),
    )
    pruned: list[object] = []
    sub = events.subscribe(lambda e: pruned.append(e.fields["rows"]), names=["jobs.outbox.pruned"])
    try:
        with spec.begin() as conn, app.using(conn):
            app.enqueue(job_a, 1)
        relay._step()
        assert spec.store.pending_count() == 0
        clock.advance(timedelta(minutes=4))
        relay._step()
        assert pruned == [], "past its retention, but the relay's 5 minutes have not passed"
        clock.advance(timedelta(minutes=1))
        relay._step()
        assert pruned == [1]
        relay._step()
        assert pruned == [1], "the next prune is 5 minutes on"
    finally:
        sub.close()
    assert app.count_jobs() == 1


def test_the_relay_thread_survives_an_unexpected_error(app: App, spec: StoreSpec) -> None:
    relay = Relay(
        store=spec.store,
        driver=app.driver,
        clock=app.clock,
        interval=timedelta(milliseconds=20),
        backoff=Backoff(first=0.01, cap=0.01),
    )
    real = relay.tick
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a surprise in the relay")
        return real()

    relay.tick = flaky  # type: ignore[method-assign]
    with published() as done, relay:
        with spec.begin() as conn, app.using(conn):
            app.enqueue(job_a, 1)
        assert done.wait(5), "the relay thread published nothing within 5 s of its failure"
    assert len(calls) > 1 and app.count_jobs() == 1


def test_a_connection_is_identified_on_its_first_join_only(
    app: App, spec: StoreSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database a caller's connection reaches is worked out on its first ``using()``, for
    the outbox's database as for the job database: a later join on it hands the driver and
    the store the ``Joined`` they accepted, and neither identifies the connection again."""
    from ultimat3.jobs.driver import Joined

    seen: list[tuple[str, bool]] = []
    for who, target in (("driver", app.driver), ("store", spec.store)):
        adopt = target.adopt

        def spy(connection: object, _who: str = who, _adopt: Any = adopt) -> Joined:
            seen.append((_who, isinstance(connection, Joined)))
            return _adopt(connection)  # type: ignore[no-any-return]

        monkeypatch.setattr(target, "adopt", spy)
    with spec.begin() as conn:
        with app.using(conn):
            app.enqueue(job_a, 1)
        first = list(seen)
        seen.clear()
        with app.using(conn):
            app.enqueue(job_a, 2)
    assert ("store", False) in first  # identified once
    assert seen and all(joined for _, joined in seen), seen
    assert app.relay().tick() == 2
