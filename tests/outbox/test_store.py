"""The outbox store seam, on every store: staged rows exist if and only if the caller's
transaction commits; claims return them oldest first, skip rows another claim holds, and
marks commit with the claim."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgwait import interrupt_when_blocked  # tests/ is on the path, as for pgcluster
from ultimat3.jobs.errors import (
    ConfigurationError,
    DriverUnavailableError,
    EnqueueRefusedError,
    JobsError,
)
from ultimat3.jobs.outboxes import open_store
from ultimat3.jobs.records import NewJob

from .conftest import StoreSpec


def new_job(n: int, queue: str = "default", **kw: object) -> NewJob:
    return NewJob(
        id=f"job-{n:04d}",
        name="job_a",
        queue=queue,
        input=f'{{"n": {n}}}',
        idempotency_key=f"key-{n}",
        max_attempts=3,
        **kw,  # type: ignore[arg-type]
    )


def stage(spec: StoreSpec, *jobs: NewJob, now: datetime | None = None) -> None:
    with spec.begin() as conn:
        spec.store.stage(spec.store.adopt(conn), list(jobs), now=now)


def test_commit_makes_rows_visible_with_every_field(spec: StoreSpec) -> None:
    at = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    job = new_job(1, queue="mail", run_at=at, priority=7, tenant_id="t1")
    stage(spec, job)
    assert spec.store.pending_count() == 1
    with spec.store.claim(10) as batch:
        (record,) = batch.records
    assert record.job == job
    assert record.published_at is None
    assert record.staged_at.tzinfo is not None


def test_rollback_leaves_nothing(spec: StoreSpec) -> None:
    with pytest.raises(RuntimeError), spec.begin() as conn:
        spec.store.stage(spec.store.adopt(conn), [new_job(1)])
        raise RuntimeError("the business transaction fails")
    assert spec.store.pending_count() == 0
    with spec.store.claim(10) as batch:
        assert list(batch.records) == []


def test_claim_is_oldest_first_and_bounded(spec: StoreSpec) -> None:
    base = datetime(2030, 1, 1, tzinfo=UTC)
    stage(spec, new_job(3), now=base + timedelta(seconds=3))
    stage(spec, new_job(1), new_job(2), now=base + timedelta(seconds=1))
    with spec.store.claim(2) as batch:
        assert [r.job.id for r in batch.records] == ["job-0001", "job-0002"]
    with spec.store.claim(10) as batch:
        assert [r.job.id for r in batch.records] == ["job-0001", "job-0002", "job-0003"]


def test_marks_commit_with_the_claim(spec: StoreSpec) -> None:
    stage(spec, new_job(1), new_job(2))
    with spec.store.claim(10) as batch:
        batch.mark_published(["job-0001"])
    assert spec.store.pending_count() == 1
    with pytest.raises(RuntimeError), spec.store.claim(10) as batch:
        batch.mark_published(["job-0002"])
        raise RuntimeError("the relay dies before its claim commits")
    assert spec.store.pending_count() == 1
    with spec.store.claim(10) as batch:
        assert [r.job.id for r in batch.records] == ["job-0002"]


def test_a_claim_skips_rows_another_claim_holds(spec: StoreSpec) -> None:
    if spec.kind == "sqlite":
        pytest.skip("SQLite serialises claims on its write lock (tested in test_relay)")
    stage(spec, *(new_job(n) for n in range(6)))
    seen: list[list[str]] = []
    held = threading.Event()
    release = threading.Event()

    def first() -> None:
        with spec.store.claim(3) as batch:
            seen.append([r.job.id for r in batch.records])
            held.set()
            release.wait(10)

    # Another relay is another process with its own store (one store object serialises its
    # claims on its one connection); the memory store's state lives in the one object.
    second = spec.store if spec.kind == "memory" else open_store(spec.url)
    thread = threading.Thread(target=first)
    thread.start()
    assert held.wait(10)
    try:
        with second.claim(10) as batch:
            seen.append([r.job.id for r in batch.records])
    finally:
        release.set()
        thread.join(10)
        if second is not spec.store:
            second.close()
    assert seen[0] == ["job-0000", "job-0001", "job-0002"]
    assert seen[1] == ["job-0003", "job-0004", "job-0005"]


def test_prune_deletes_only_old_published_rows(spec: StoreSpec) -> None:
    stage(spec, new_job(1), new_job(2))
    old = datetime(2020, 1, 1, tzinfo=UTC)
    with spec.store.claim(10) as batch:
        batch.mark_published(["job-0001"], now=old)
    assert spec.store.prune(published_before=old + timedelta(days=1), limit=10) == 1
    assert spec.store.prune(published_before=old + timedelta(days=1), limit=10) == 0
    assert spec.store.pending_count() == 1


def test_a_connection_that_makes_dicts_of_rows_is_joined_as_any_other(spec: StoreSpec) -> None:
    if spec.kind == "memory":
        pytest.skip("the memory store has no connection")
    with spec.begin() as conn:
        if spec.kind == "sqlite":
            conn.row_factory = lambda cursor, row: {
                column[0]: value for column, value in zip(cursor.description, row, strict=True)
            }
        else:
            from psycopg.rows import dict_row

            conn.row_factory = dict_row
        spec.store.stage(spec.store.adopt(conn), [new_job(1), new_job(2)])
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}  # the caller's, again
    assert spec.store.pending_count() == 2


def test_a_psycopg_connection_with_raw_cursors_and_its_own_adapters_stages_as_any_other(
    spec: StoreSpec,
) -> None:
    """Our statements bind ``%s`` and send through psycopg's own dumpers, whatever cursor
    class and adapters the caller's connection has; the caller's keep theirs."""
    if spec.kind != "postgres":
        pytest.skip("psycopg connections only")
    import psycopg
    from psycopg.types.string import StrDumperUnknown, TextLoader

    class Shouting(TextLoader):
        def load(self, data: Any) -> str:
            return bytes(data).decode().upper()

    class ShoutingDumper(StrDumperUnknown):
        def dump(self, obj: str) -> bytes:
            return obj.upper().encode()

    with spec.begin() as conn:
        conn.cursor_factory = psycopg.RawCursor
        conn.adapters.register_loader("text", Shouting)
        conn.adapters.register_dumper(str, ShoutingDumper)
        spec.store.stage(spec.store.adopt(conn), [new_job(1), new_job(2)])
        assert conn.execute("SELECT $1::text", ["a"]).fetchone() == ("A",)  # the caller's
    with spec.store.claim(10) as batch:
        assert [r.job.id for r in batch.records] == ["job-0001", "job-0002"]
        assert [r.job.input for r in batch.records] == [new_job(1).input, new_job(2).input]


def test_adopt_refuses_a_foreign_connection(spec: StoreSpec) -> None:
    import sqlite3

    other = sqlite3.connect(":memory:")
    try:
        with pytest.raises(ConfigurationError) as caught:
            spec.store.adopt(other)
        assert caught.value.fix
    finally:
        other.close()


def test_a_failed_stage_never_lets_the_transaction_commit_without_it(spec: StoreSpec) -> None:
    """A failed stage rolls back to its savepoint: the transaction goes on, holding none of
    the failed call's rows, and commits the rows staged before and after it."""
    if spec.kind == "memory":
        pytest.skip("the memory store has no statement that can fail")
    with spec.begin() as conn:
        executor = spec.store.adopt(conn)
        spec.store.stage(executor, [new_job(1)])
        with pytest.raises(EnqueueRefusedError, match=r"(?i)unique") as refused:
            spec.store.stage(executor, [new_job(3), new_job(1)])  # the same id again
        assert refused.value.retryable is False, "the caller's transaction is theirs to retry"
        assert "still usable" in refused.value.fix
        spec.store.stage(executor, [new_job(2)])  # the transaction is still usable
    with spec.store.claim(10) as batch:
        assert [r.job.id for r in batch.records] == ["job-0001", "job-0002"]


def test_a_forked_child_leaves_the_parents_connection_alone(spec: StoreSpec) -> None:
    """A store opened before a fork (a pre-fork server's app): the child opens its own
    connection, and its exit, which closes every open store (``atexit``), never closes the
    parent's. On PostgreSQL closing it there would end the parent's session."""
    import os

    from ultimat3.jobs import driver

    if spec.kind == "memory":
        pytest.skip("the memory store has no connection")
    stage(spec, new_job(1))
    assert spec.store.pending_count() == 1  # the parent's connection is open
    pid = os.fork()
    if pid == 0:  # the child: use the store, then exit as a process does
        code = 1
        try:
            stage(spec, new_job(2))
            code = 0 if spec.store.pending_count() == 2 else 3
        finally:
            driver._close_at_exit()  # what the interpreter's exit runs (not the test run's hooks)
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert spec.store.pending_count() == 2, "the parent's connection still works"
    stage(spec, new_job(3))
    assert spec.store.pending_count() == 3


# -- PostgreSQL: a failed stage in the caller's transaction ---------------------------------
# The store writes through dialects.postgres.in_savepoint, as the driver does
# (tests/app/test_failed_enqueue.py): the same savepoint, the same named errors.


def _pg(spec: StoreSpec) -> None:
    if spec.kind != "postgres":
        pytest.skip("the PostgreSQL store's savepoint")


def _staged_ids(spec: StoreSpec) -> list[str]:
    with spec.store.claim(100) as batch:
        return [r.job.id for r in batch.records]


def test_pg_a_stage_waiting_past_lock_timeout_on_a_staged_id_names_it(spec: StoreSpec) -> None:
    """Another transaction staged the same job id and has not ended: the stage waits for it
    until the caller's lock_timeout, and the error names the id and the timeout."""
    _pg(spec)
    import psycopg

    with psycopg.connect(spec.url) as other:
        spec.store.stage(spec.store.adopt(other), [new_job(1)])  # uncommitted: the id is held
        with spec.begin() as conn:
            conn.execute("SET LOCAL lock_timeout = '200ms'")
            executor = spec.store.adopt(conn)
            with pytest.raises(EnqueueRefusedError) as caught:
                spec.store.stage(executor, [new_job(1)])
            spec.store.stage(executor, [new_job(2)])  # the transaction goes on
        other.rollback()
    exc = caught.value
    assert exc.retryable is False
    assert "'job-0001'" in exc.cause and "lock_timeout 200ms" in exc.cause
    assert "still usable" in exc.fix and "see the message above" not in exc.fix
    assert _staged_ids(spec) == ["job-0002"]


def test_pg_a_stage_refused_by_a_constraint_of_the_caller_names_it(spec: StoreSpec) -> None:
    _pg(spec)
    import psycopg

    with psycopg.connect(spec.url, autocommit=True) as admin:
        admin.execute(
            "ALTER TABLE ultimat3_jobs.x_outbox ADD CONSTRAINT no_mail CHECK (queue <> 'mail')"
        )
    with spec.begin() as conn:
        executor = spec.store.adopt(conn)
        with pytest.raises(EnqueueRefusedError) as caught:
            spec.store.stage(executor, [new_job(1, queue="mail")])
        spec.store.stage(executor, [new_job(2)])
    assert caught.value.retryable is False
    assert "no_mail" in caught.value.cause and "still usable" in caught.value.fix
    assert "constraint or trigger" in caught.value.fix
    assert _staged_ids(spec) == ["job-0002"]


def test_pg_a_stage_of_an_id_staged_before_names_it(spec: StoreSpec) -> None:
    _pg(spec)
    with spec.begin() as conn:
        executor = spec.store.adopt(conn)
        spec.store.stage(executor, [new_job(1)])
        with pytest.raises(EnqueueRefusedError) as caught:
            spec.store.stage(executor, [new_job(3), new_job(1)])
        spec.store.stage(executor, [new_job(2)])
    assert "x_outbox_id_key" in caught.value.cause
    assert "written twice" in caught.value.fix
    assert _staged_ids(spec) == ["job-0001", "job-0002"]


def test_pg_a_stage_after_the_table_was_dropped_says_to_migrate(spec: StoreSpec) -> None:
    """The table went between adopt and stage: the error names the migration (not "see the
    message above"), and the caller's transaction goes on."""
    _pg(spec)
    import psycopg

    with spec.begin() as conn:
        executor = spec.store.adopt(conn)
        with psycopg.connect(spec.url, autocommit=True) as admin:
            admin.execute("DROP TABLE ultimat3_jobs.x_outbox")
        with pytest.raises(DriverUnavailableError) as caught:
            spec.store.stage(executor, [new_job(1)])
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the transaction goes on
    assert "missing" in caught.value.cause and "migrate" in caught.value.fix
    assert caught.value.retryable is False


def test_pg_a_stage_on_a_lost_connection_raises_a_jobs_error(spec: StoreSpec) -> None:
    """The caller's connection was cut off before the SAVEPOINT: a DriverUnavailableError, not
    psycopg's own error."""
    _pg(spec)
    import psycopg

    with psycopg.connect(spec.url) as conn:
        conn.execute("SELECT 1")  # a transaction is open
        executor = spec.store.adopt(conn)
        with psycopg.connect(spec.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        with pytest.raises(DriverUnavailableError) as caught:
            spec.store.stage(executor, [new_job(1)])
        assert conn.broken
    assert not isinstance(caught.value, EnqueueRefusedError)
    assert caught.value.retryable is True


def test_pg_an_interrupted_stage_rolls_back_to_its_savepoint(spec: StoreSpec) -> None:
    """Ctrl-C while the stage waits for a lock: psycopg cancels the statement and raises
    KeyboardInterrupt; the savepoint is rolled back, so the caller's transaction goes on."""
    _pg(spec)
    import psycopg

    with psycopg.connect(spec.url) as other:
        spec.store.stage(spec.store.adopt(other), [new_job(1)])  # the id is held
        with spec.begin() as conn:
            conn.execute("SET LOCAL lock_timeout = '10s'")  # never for ever
            executor = spec.store.adopt(conn)
            blocked = (conn.info.backend_pid, other.info.backend_pid)
            with (
                interrupt_when_blocked(spec.url, *blocked) as sent,
                pytest.raises(KeyboardInterrupt),
            ):
                spec.store.stage(executor, [new_job(1)])
            assert sent == [True], "interrupted while it waited for the id"
            spec.store.stage(executor, [new_job(2)])  # the transaction goes on
        other.rollback()
    assert _staged_ids(spec) == ["job-0002"]


def test_pg_a_failed_stage_on_a_connection_in_pipeline_mode(spec: StoreSpec) -> None:
    """executemany rides the caller's pipeline without a sync: the stage syncs, so its error
    is raised by the stage (not at the caller's next statement) and rolled back."""
    _pg(spec)
    with spec.begin() as conn, conn.pipeline():
        executor = spec.store.adopt(conn)
        spec.store.stage(executor, [new_job(1)])
        with pytest.raises(EnqueueRefusedError):
            spec.store.stage(executor, [new_job(3), new_job(1)])
        spec.store.stage(executor, [new_job(2)])
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _staged_ids(spec) == ["job-0001", "job-0002"]


def test_pg_a_statement_the_server_refuses_raises_a_jobs_error(spec: StoreSpec) -> None:
    """A statement of the store's own that PostgreSQL refuses (here a column dropped by hand)
    raises the library's error with its cause and fix, never psycopg's own."""
    _pg(spec)
    import psycopg

    stage(spec, new_job(1))
    with psycopg.connect(spec.url, autocommit=True) as admin:
        admin.execute("ALTER TABLE ultimat3_jobs.x_outbox DROP COLUMN priority")
    with pytest.raises(JobsError) as caught, spec.store.claim(10):
        pass
    assert isinstance(caught.value, DriverUnavailableError)
    assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedColumn)
    assert "SQLSTATE 42703" in caught.value.cause and caught.value.retryable is False
    assert spec.store.pending_count() == 1  # the store goes on


@pytest.mark.parametrize("query", ["?busy_timeout=abc", "?busy_timeout=5s", "?timeout=5"])
def test_a_bad_sqlite_outbox_url_option_is_a_configuration_error(tmp_path: Any, query: str) -> None:
    """A SQLite outbox URL's options are read as the job driver's are: a busy_timeout that is
    not a number, or an unknown option, raises ConfigurationError naming it, not ValueError."""
    with pytest.raises(ConfigurationError) as caught:
        open_store(f"sqlite:///{tmp_path / 'business.sqlite3'}{query}")
    assert ("busy_timeout" in caught.value.cause) == query.startswith("?busy_timeout")
    assert caught.value.fix


def test_a_sqlite_outbox_url_takes_a_busy_timeout(tmp_path: Any) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'business.sqlite3'}?busy_timeout=2.5")
    assert store._busy_timeout == 2.5  # type: ignore[attr-defined]
