"""Transactional enqueue (ARCHITECTURE.md, "The life of a job"): visible if and only if the caller's transaction commits."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import (
    App,
    ConfigurationError,
    JobState,
    OutboxNoTxError,
    PayloadTooLargeError,
    RegistrationError,
    SerializationError,
    events,
    job,
)
from ultimat3.jobs.drivers import sqlite_path
from ultimat3.jobs.records import NewJob


@job
def noop(input: dict[str, Any]) -> None:
    return None


@job(idempotency_key=lambda i: str(i["order"]))
def receipt(input: dict[str, Any]) -> None:
    return None


def test_commit_makes_the_job_visible(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(noop=noop))
    with app.transaction():
        result = noop.enqueue({"n": 1})
    assert app.get_job(result.id).state is JobState.AVAILABLE


def test_rollback_takes_the_job_with_it(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(noop=noop))
    with pytest.raises(RuntimeError), app.transaction():
        result = noop.enqueue({"n": 1})
        raise RuntimeError("request failed")
    assert app.driver.job_get(result.id) is None
    assert app.count_jobs() == 0


def test_business_rows_and_job_share_the_transaction(sqlite_url: str, make_module: Any) -> None:
    app = App(sqlite_url, modules=[make_module(noop=noop)])
    with app.transaction() as conn:
        conn.execute("create table orders(id integer primary key)")
    with pytest.raises(RuntimeError), app.transaction() as conn:
        conn.execute("insert into orders values (1)")
        noop.enqueue({"order": 1})
        raise RuntimeError("boom")
    with app.transaction() as conn:
        assert conn.execute("select count(*) from orders").fetchone()[0] == 0
    assert app.count_jobs() == 0
    with app.transaction() as conn:
        conn.execute("insert into orders values (2)")
        noop.enqueue({"order": 2})
    assert app.count_jobs() == 1
    app.close()


def test_own_sqlite_connection_joins(sqlite_url: str, make_module: Any) -> None:
    app = App(sqlite_url, modules=[make_module(noop=noop)])
    app.open()
    conn = sqlite3.connect(sqlite_path(sqlite_url), isolation_level=None)
    conn.execute("begin immediate")
    with app.using(conn):
        rolled = noop.enqueue({"n": 1})
    conn.execute("rollback")
    assert app.driver.job_get(rolled.id) is None
    conn.execute("begin immediate")
    with app.using(conn):
        kept = noop.enqueue({"n": 2})
    conn.execute("commit")
    assert app.get_job(kept.id).state is JobState.AVAILABLE
    conn.close()
    app.close()


def test_a_connection_to_another_database_is_refused(
    sqlite_url: str, tmp_path: Path, make_module: Any
) -> None:
    app = App(sqlite_url, modules=[make_module(noop=noop)])
    other = sqlite3.connect(tmp_path / "other.sqlite3")
    with pytest.raises(ConfigurationError), app.using(other):
        pass
    other.close()
    app.close()


def test_required_mode_refuses_an_enqueue_outside_a_transaction(
    make_app: Callable[..., App], make_module: Any
) -> None:
    app = make_app(make_module(noop=noop), mode="required")
    with pytest.raises(OutboxNoTxError) as caught:
        noop.enqueue({})
    assert "transaction" in caught.value.fix
    assert app.count_jobs() == 0
    escaped = noop.enqueue({}, outbox=False)
    assert app.get_job(escaped.id)
    with app.transaction():
        noop.enqueue({})
    assert app.count_jobs() == 2


def test_outbox_false_escapes_the_transaction(
    make_app: Callable[..., App], make_module: Any
) -> None:
    app = make_app(make_module(noop=noop))
    if app.driver.single_writer:
        # One writer at a time: a separate commit inside the open transaction would wait for
        # itself, so the escape hatch says so instead of hanging.
        with pytest.raises(ConfigurationError) as caught, app.transaction():
            noop.enqueue({"audit": True}, outbox=False)
        assert "after the transaction" in caught.value.fix
        return
    with pytest.raises(RuntimeError), app.transaction():
        escaped = noop.enqueue({"audit": True}, outbox=False)
        raise RuntimeError("rolled back")
    assert app.get_job(escaped.id).state is JobState.AVAILABLE


def test_idempotency_key_dedupes(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(receipt=receipt, noop=noop))
    first = receipt.enqueue({"order": 7})
    second = receipt.enqueue({"order": 7})
    assert not first.deduped
    assert second.deduped and second.id == first.id
    # Without a key function, identical inputs are not merged.
    assert noop.enqueue({"a": 1}).id != noop.enqueue({"a": 1}).id
    # Keys are namespaced by job: the same business key under two jobs gives two jobs.
    other = app.enqueue(noop, {}, idempotency_key="7")
    assert other.id != first.id and not other.deduped


def test_bulk_enqueue(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(receipt=receipt))
    results = app.enqueue_many(receipt, [{"order": i % 50} for i in range(100)])
    assert len(results) == 100
    assert sum(r.deduped for r in results) == 50
    assert app.count_jobs() == 50
    assert results[0].id == results[50].id


def test_bad_input_writes_nothing(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(noop=noop), payload_limit=1000)
    with pytest.raises(SerializationError) as caught:
        noop.enqueue({"items": [1, 2, {"when": object()}]})
    assert caught.value.path == "input.items[2].when"
    with pytest.raises(PayloadTooLargeError):
        noop.enqueue({"blob": "x" * 2000})
    with pytest.raises(SerializationError):
        app.enqueue_many(noop, [{"ok": 1}, {"bad": {1, 2}}])
    assert app.count_jobs() == 0


def test_a_big_batch_refused_far_in_writes_nothing_and_spares_the_transaction(
    make_app: Callable[..., App], make_module: Any
) -> None:
    """On PostgreSQL a batch this big is built a slice at a time while COPY writes the last
    one (``NewJobs.stream``): input 700 is refused after 600 rows went to the server."""
    app = make_app(make_module(noop=noop))
    batch: list[Any] = [{"n": i} for i in range(1_000)]
    batch[700] = {"bad": {1, 2}}
    with pytest.raises(SerializationError):
        app.enqueue_many(noop, batch)
    assert app.count_jobs() == 0
    with app.transaction():
        before = noop.enqueue({"n": -1})
        with pytest.raises(SerializationError):
            app.enqueue_many(noop, batch)
        after = app.enqueue_many(noop, [{"n": i} for i in range(300)])  # the transaction goes on
    assert app.count_jobs() == 301
    assert app.get_job(before.id).state is JobState.AVAILABLE
    assert all(app.get_job(r.id).state is JobState.AVAILABLE for r in (after[0], after[-1]))


def test_a_plain_batch_reaches_the_database_without_a_job_record_per_row(
    make_app: Callable[..., App], make_module: Any, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain batch is kept as its ids and JSON texts (``NewJobs.columns``): SQLite's batch
    statement writes those, and makes no ``NewJob`` for a row. The memory driver stores
    records, and PostgreSQL's COPY writes each job's line, so they make one for each."""
    app = make_app(make_module(noop=noop))
    made: list[str] = []
    sibling = NewJob.sibling
    monkeypatch.setattr(NewJob, "sibling", lambda job, *a: made.append(a[0]) or sibling(job, *a))
    results = app.enqueue_many(noop, [{"n": i} for i in range(600)])
    assert app.count_jobs() == 600 and len({r.id for r in results}) == 600
    assert app.get_job(results[599].id).input == '{"n":599}'
    assert len(made) == (0 if url.startswith("sqlite") else 600)


def test_a_big_batch_with_a_key_repeated_far_in_dedupes_it(
    make_app: Callable[..., App], make_module: Any
) -> None:
    app = make_app(make_module(receipt=receipt))
    orders = list(range(600))
    orders[550] = 10  # found by the COPY of PostgreSQL in its second slice: it takes the other path
    results = app.enqueue_many(receipt, [{"order": n} for n in orders])
    assert [i for i, r in enumerate(results) if r.deduped] == [550]
    assert results[550].id == results[10].id
    assert app.count_jobs() == 599


def test_enqueue_options(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(noop=noop))
    later = noop.enqueue({}, delay="1h", tenant_id="acme", queue="slow", priority=5)
    got = app.get_job(later.id)
    assert got.state is JobState.SCHEDULED
    assert (got.tenant_id, got.queue, got.priority) == ("acme", "slow", 5)
    with pytest.raises(ConfigurationError):
        noop.enqueue({}, delay="soon")
    with pytest.raises(ConfigurationError):
        noop.enqueue({}, priority=1000)


def test_an_enqueue_after_a_job_setting_changed_uses_the_new_setting(
    make_app: Callable[..., App], make_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app keeps each job's checked settings for the enqueues without options
    (``App._builder``); a setting changed since, or a tracing integration turned on since,
    is never missed."""
    app = make_app(make_module(noop=noop))
    first = app.get_job(noop.enqueue({}).id)
    assert (first.queue, first.priority, first.max_attempts) == ("default", 0, 3)
    monkeypatch.setattr(noop, "queue", "slow")
    monkeypatch.setattr(noop, "priority", 9)
    monkeypatch.setattr(noop, "retry", noop.retry.__class__(attempts=2))
    monkeypatch.setattr(events, "trace_context_for", lambda queue, name, job_id: f"t-{job_id}")
    second = app.get_job(noop.enqueue({}).id)
    assert (second.queue, second.priority, second.max_attempts) == ("slow", 9, 2)
    assert second.trace_context == f"t-{second.id}"


def test_unregistered_handles_cannot_be_enqueued(make_app: Callable[..., App]) -> None:
    @job
    def lonely(input: dict[str, Any]) -> None:
        return None

    with pytest.raises(RegistrationError) as caught:
        lonely.enqueue({})
    assert "register" in caught.value.fix
    app = make_app()
    with pytest.raises(RegistrationError):
        app.enqueue(lonely, {})


async def test_async_enqueue(make_app: Callable[..., App], make_module: Any) -> None:
    app = make_app(make_module(noop=noop))
    result = await noop.enqueue_async({"n": 1})
    assert app.get_job(result.id).name == "noop"
    many = await app.enqueue_many_async(noop, [{"n": 2}, {"n": 3}])
    assert len(many) == 2
