"""A failed enqueue leaves the caller's transaction usable (ARCHITECTURE.md, "The life of a
job", the rule; docs/guarantees.md, "Transactional enqueue"): whatever the database raised,
the enqueue's own writes are rolled back to its savepoint, the error names the cause and says
the enqueue cannot be retried inside that transaction, and the caller's own rows in the same
transaction commit."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgwait import interrupt_when_blocked  # tests/ is on the path, as for pgcluster
from ultimat3.jobs import App, DriverUnavailableError, EnqueueRefusedError, JobsError, job


@job
def ship(input: dict[str, Any]) -> None:
    return None


@job(idempotency_key=lambda i: f"order-{i['order']}")
def receipt(input: dict[str, Any]) -> None:
    return None


def _refused_in_place(exc: JobsError) -> None:
    """The common shape of the error: an EnqueueRefusedError (a DriverUnavailableError, for
    the handlers of that), not the outage's, not retryable in that transaction."""
    assert type(exc) is EnqueueRefusedError
    assert isinstance(exc, DriverUnavailableError)
    assert exc.retryable is False
    assert "server is running" not in exc.fix
    assert "transaction" in exc.fix


# -- PostgreSQL ------------------------------------------------------------------------------


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_dsn)
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


@pytest.fixture
def pg_app(pg_url: str, make_module: Any) -> Iterator[App]:
    import psycopg

    app = App(pg_url, modules=[make_module(ship=ship, receipt=receipt)])
    app.open()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("create table orders (id int primary key)")
    yield app
    app.close()


def _orders(url: str) -> list[int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute("select id from orders order by id")]


@pytest.mark.postgres
def test_pg_lock_timeout_on_a_key_another_transaction_holds(pg_app: App, pg_url: str) -> None:
    """The issue's case: another session enqueued order-42 and has not committed; the caller's
    enqueue of the same key waits for it until its lock_timeout."""
    import psycopg

    with psycopg.connect(pg_url) as other, psycopg.connect(pg_url) as conn:
        with pg_app.using(other):
            receipt.enqueue({"order": 42})  # left uncommitted: the key is held
        conn.execute("set lock_timeout = '200ms'")
        conn.commit()
        with conn.transaction(), pg_app.using(conn):
            conn.execute("insert into orders values (1)")
            with pytest.raises(EnqueueRefusedError) as caught:
                receipt.enqueue({"order": 42})
            conn.execute("insert into orders values (2)")  # the transaction goes on
        other.rollback()
    exc = caught.value
    _refused_in_place(exc)
    assert "order-42" in exc.cause and "lock_timeout" in exc.cause and "200ms" in exc.cause
    assert _orders(pg_url) == [1, 2]
    assert pg_app.count_jobs() == 0


@pytest.mark.postgres
def test_pg_statement_timeout_in_the_callers_transaction(pg_app: App, pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url) as other, psycopg.connect(pg_url) as conn:
        with pg_app.using(other):
            receipt.enqueue({"order": 7})
        conn.execute("set statement_timeout = '200ms'")
        conn.commit()
        with conn.transaction(), pg_app.using(conn):
            conn.execute("insert into orders values (1)")
            with pytest.raises(EnqueueRefusedError) as caught:
                receipt.enqueue({"order": 7})
            conn.execute("insert into orders values (2)")
        other.rollback()
    _refused_in_place(caught.value)
    assert "statement_timeout" in caught.value.cause and "200ms" in caught.value.cause
    assert _orders(pg_url) == [1, 2]


@pytest.mark.postgres
@pytest.mark.parametrize("refusal", ["check", "unique"])
def test_pg_a_row_refused_by_a_constraint_of_the_caller(
    pg_app: App, pg_url: str, refusal: str
) -> None:
    """A CHECK constraint the caller added on the job table, or a trigger of theirs whose
    write hits a unique index: the first job is refused, the second one goes in."""
    import psycopg

    table = "ultimat3_jobs.x_jobs"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        if refusal == "check":
            admin.execute(
                f"alter table {table} add constraint no_drones "
                "check (input::text not like '%drone%')"
            )
        else:
            admin.execute("create table shipped (what text primary key)")
            admin.execute("insert into shipped values ('drone')")
            admin.execute(
                "create function note_shipped() returns trigger language plpgsql as $$ begin "
                "insert into shipped values (new.input->>'what'); return new; end $$"
            )
            admin.execute(
                f"create trigger note_shipped after insert on {table} "
                "for each row execute function note_shipped()"
            )
    with psycopg.connect(pg_url) as conn, conn.transaction(), pg_app.using(conn):
        conn.execute("insert into orders values (1)")
        with pytest.raises(EnqueueRefusedError) as caught:
            ship.enqueue({"what": "drone"})
        conn.execute("insert into orders values (2)")
        kept = ship.enqueue({"what": "book"})
    _refused_in_place(caught.value)
    assert ("no_drones" if refusal == "check" else "shipped") in caught.value.cause
    assert _orders(pg_url) == [1, 2]
    assert pg_app.count_jobs() == 1
    assert json.loads(pg_app.get_job(kept.id).input) == {"what": "book"}


@pytest.mark.postgres
def test_pg_serialization_failure_in_a_repeatable_read_transaction(
    pg_app: App, pg_url: str
) -> None:
    """The caller's snapshot predates another transaction's commit of the same key: ON
    CONFLICT cannot dedupe onto a row the snapshot does not see, and PostgreSQL refuses."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction(), pg_app.using(conn):
            conn.execute("insert into orders values (1)")  # the snapshot is taken
            receipt.enqueue({"order": 9}, outbox=False)  # committed by the app on its own
            with pytest.raises(EnqueueRefusedError) as caught:
                receipt.enqueue({"order": 9})
            conn.execute("insert into orders values (2)")
    _refused_in_place(caught.value)
    assert "serializ" in caught.value.cause
    assert _orders(pg_url) == [1, 2]
    assert pg_app.count_jobs() == 1


# -- SQLite ----------------------------------------------------------------------------------


@pytest.fixture
def sq_app(tmp_path: Path, make_module: Any) -> Iterator[App]:
    app = App(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", modules=[make_module(ship=ship)])
    app.open()
    yield app
    app.close()


def _connect(app: App, timeout: float = 5.0) -> sqlite3.Connection:
    path = app.driver.path  # type: ignore[attr-defined]
    conn = sqlite3.connect(path, isolation_level=None, timeout=timeout)
    conn.execute("create table if not exists orders (id integer primary key)")
    return conn


def test_sqlite_a_trigger_of_the_caller_refuses_the_job_half_way(sq_app: App) -> None:
    """RAISE(FAIL) ends the statement but keeps what it did before failing, here the job's
    row: only the enqueue's savepoint takes it back, so that a failed enqueue writes nothing."""
    conn = _connect(sq_app)
    conn.execute(
        "create trigger no_drones after insert on x_jobs when new.input like '%drone%' "
        "begin select raise(fail, 'no drones'); end"
    )
    conn.execute("begin immediate")
    with sq_app.using(conn):
        conn.execute("insert into orders values (1)")
        with pytest.raises(EnqueueRefusedError) as caught:
            ship.enqueue({"what": "drone"})
        conn.execute("insert into orders values (2)")
        kept = ship.enqueue({"what": "book"})
    conn.execute("commit")
    _refused_in_place(caught.value)
    assert "no drones" in caught.value.cause
    assert [r[0] for r in conn.execute("select id from orders order by id")] == [1, 2]
    assert conn.execute("select count(*) from x_jobs").fetchone() == (1,)
    assert sq_app.count_jobs() == 1
    assert json.loads(sq_app.get_job(kept.id).input) == {"what": "book"}
    conn.close()


def test_sqlite_busy_in_the_callers_deferred_transaction(sq_app: App) -> None:
    """The caller's deferred transaction has written nothing, and another connection holds
    the write lock past the caller's busy timeout: the enqueue fails, the caller's transaction
    is still open, and writes once the other one is gone."""
    conn = _connect(sq_app, timeout=0.2)
    holder = _connect(sq_app)
    holder.execute("begin immediate")
    holder.execute("insert into orders values (99)")
    conn.execute("begin")
    with sq_app.using(conn):
        with pytest.raises(EnqueueRefusedError) as caught:
            ship.enqueue({"what": "book"})
        assert conn.in_transaction
        holder.execute("rollback")
        conn.execute("insert into orders values (1)")
        kept = ship.enqueue({"what": "lamp"})
    conn.execute("commit")
    _refused_in_place(caught.value)
    assert "lock" in caught.value.cause
    assert [r[0] for r in conn.execute("select id from orders")] == [1]
    assert sq_app.count_jobs() == 1
    assert json.loads(sq_app.get_job(kept.id).input) == {"what": "lamp"}
    conn.close()
    holder.close()


@pytest.mark.postgres
def test_pg_a_refused_enqueue_on_a_connection_in_pipeline_mode(pg_app: App, pg_url: str) -> None:
    """The caller's connection is in pipeline mode, where an execute takes one statement and
    an error is raised at the next sync: the rollback to the savepoint is two executes, and
    synced, so the transaction goes on."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "alter table ultimat3_jobs.x_jobs add constraint no_drones "
            "check (input::text not like '%drone%')"
        )
    with (
        psycopg.connect(pg_url) as conn,
        conn.transaction(),
        pg_app.using(conn),
        conn.pipeline(),
    ):
        conn.execute("insert into orders values (1)")
        with pytest.raises(EnqueueRefusedError) as caught:
            ship.enqueue({"what": "drone"})
        conn.execute("insert into orders values (2)")
        kept = ship.enqueue({"what": "book"})
    _refused_in_place(caught.value)
    assert "no_drones" in caught.value.cause
    assert _orders(pg_url) == [1, 2]
    assert pg_app.count_jobs() == 1
    assert json.loads(pg_app.get_job(kept.id).input) == {"what": "book"}


@pytest.mark.postgres
def test_pg_an_enqueue_after_a_failed_statement_in_the_callers_pipeline(
    pg_app: App, pg_url: str
) -> None:
    """The caller's own statement failed in their pipeline, not synced yet: the enqueue says
    that their transaction has failed, not that a write of ours failed in a usable one."""
    import psycopg

    from ultimat3.jobs import ConfigurationError

    with psycopg.connect(pg_url) as conn:
        with (
            pytest.raises(psycopg.errors.InFailedSqlTransaction),
            pg_app.using(conn),
            conn.pipeline(),
        ):
            conn.execute("insert into orders values (1)")
            conn.execute("insert into orders values (1)")  # refused, raised at the next sync
            with pytest.raises(ConfigurationError) as caught:
                ship.enqueue({"what": "book"})
            conn.execute("select 1")  # the transaction is aborted, as the error said
        conn.rollback()
    assert "transaction has failed" in caught.value.cause
    assert _orders(pg_url) == []


@pytest.mark.postgres
def test_pg_a_failed_pipeline_is_named_however_the_replies_arrive(pg_app: App, pg_url: str) -> None:
    """psycopg raises the caller's error as soon as it reads it, at times before the Sync's
    reply that marks their transaction failed (without the fix, at least once in each of three
    runs of 600): the enqueue reads that reply before it judges, so it names the failed
    transaction every time."""
    import psycopg

    from ultimat3.jobs import ConfigurationError

    causes = set()
    with psycopg.connect(pg_url) as conn:
        for _ in range(600):
            with pg_app.using(conn), conn.pipeline():
                conn.execute("insert into orders values (1)")
                conn.execute("insert into orders values (1)")
                with pytest.raises(ConfigurationError) as caught:
                    ship.enqueue({"what": "book"})
                causes.add(caught.value.cause)
            conn.rollback()
    assert len(causes) == 1 and "transaction has failed" in causes.pop()


@pytest.mark.postgres
def test_pg_an_enqueue_after_a_failed_statement_in_an_autocommit_pipeline(
    pg_app: App, pg_url: str
) -> None:
    """On an autocommit connection in pipeline mode the caller's failed statement ran in an
    implicit transaction of its own, which the enqueue's sync ends: no failed transaction is
    left to name, and the caller's error reaches them as a JobsError, like every driver
    error, with the psycopg error as its cause."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn, pg_app.using(conn):
        with conn.pipeline():
            conn.execute("insert into orders values (1)")
            conn.execute("insert into orders values (1)")  # refused, raised at the next sync
            with pytest.raises(JobsError) as caught:
                ship.enqueue({"what": "book"})
        assert isinstance(caught.value.__cause__, psycopg.errors.UniqueViolation)
        ship.enqueue({"what": "lamp"})  # the connection goes on
    assert _orders(pg_url) == []  # the implicit transaction lasted to the sync: both undone
    assert pg_app.count_jobs() == 1


@pytest.fixture(params=["sigint_default", "sigint_ignored"])
def inherited_sigint(request: pytest.FixtureRequest) -> Iterator[None]:
    """The SIGINT disposition the test process starts with: Python's default, or ignored, as
    in a suite started in the background by a non-interactive shell (``pytest ... &``)."""
    import signal

    handler = signal.default_int_handler if request.param == "sigint_default" else signal.SIG_IGN
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.postgres
@pytest.mark.usefixtures("inherited_sigint")
def test_pg_an_interrupted_enqueue_rolls_back_to_its_savepoint(pg_app: App, pg_url: str) -> None:
    """Ctrl-C while the enqueue waits for a key: psycopg cancels the statement and raises
    KeyboardInterrupt; the savepoint is rolled back, so the caller's transaction goes on."""
    import psycopg

    with psycopg.connect(pg_url) as other, psycopg.connect(pg_url) as conn:
        with pg_app.using(other):
            receipt.enqueue({"order": 5})  # left uncommitted: the key is held
        with conn.transaction(), pg_app.using(conn):
            conn.execute("set local lock_timeout = '10s'")  # never for ever
            conn.execute("insert into orders values (1)")
            blocked = (conn.info.backend_pid, other.info.backend_pid)
            with (
                interrupt_when_blocked(pg_url, *blocked) as sent,
                pytest.raises(KeyboardInterrupt),
            ):
                receipt.enqueue({"order": 5})
            assert sent == [True], "interrupted while it waited for the key"
            conn.execute("insert into orders values (2)")
        other.rollback()
    assert _orders(pg_url) == [1, 2]
    assert pg_app.count_jobs() == 0


@pytest.mark.postgres
def test_pg_an_interrupt_whose_rollback_to_the_savepoint_failed_says_so(pg_url: str) -> None:
    """An interrupt goes on as it is; when rolling back to the savepoint failed too (here the
    savepoint is gone, released inside the body), it carries a note saying so, since the
    caller's transaction may now be aborted."""
    import psycopg

    from ultimat3.jobs.dialects.postgres import in_savepoint

    with psycopg.connect(pg_url) as conn:
        conn.execute("select 1")  # the caller's transaction is open
        with (
            pytest.raises(KeyboardInterrupt) as caught,
            in_savepoint(
                conn,
                driver="postgres",
                describe=lambda: ("the test's write", ""),
                translate=lambda exc: exc,
            ),
        ):
            conn.execute("release savepoint ultimat3_jobs")
            raise KeyboardInterrupt
        [note] = caught.value.__notes__
        assert "rolling back to its savepoint failed too" in note
        assert "ultimat3_jobs" in note  # psycopg's "savepoint ... does not exist"
        assert "may be aborted" in note
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.rollback()
