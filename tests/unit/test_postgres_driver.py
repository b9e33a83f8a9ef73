"""What only the PostgreSQL driver does: its schema and SQL, NOTIFY, joining a caller's psycopg
connection, concurrent migrations in real processes, and healing after the server or its
sessions go away. The behaviour every driver shares is in ``tests/contract``."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgcluster import Cluster, find_bindir
from ultimat3.jobs import events
from ultimat3.jobs import sql as sql_files
from ultimat3.jobs.drivers.postgres import PostgresDriver
from ultimat3.jobs.errors import ConfigurationError, DriverUnavailableError
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.limits import STATE_BITS
from ultimat3.jobs.records import (
    Cancellation,
    ClaimParams,
    Cycle,
    Fire,
    InsertResult,
    JobFilter,
    JobState,
    NewJob,
    NewJobs,
)

pytestmark = pytest.mark.postgres

T0 = datetime(2031, 3, 14, 9, 26, 53, tzinfo=UTC)
LEASE = timedelta(seconds=30)
SPAWN = multiprocessing.get_context("spawn")
T = TypeVar("T")
VERSIONS = [version for version, _ in sql_files.migrations("postgres")]


def new_job(queue: str = "default", **fields: Any) -> NewJob:
    job_id = uuid7()
    values: dict[str, Any] = {
        "id": job_id,
        "name": "pg.job",
        "queue": queue,
        "input": '{"n":1}',
        "idempotency_key": f"key-{job_id}",
        "max_attempts": 3,
        **fields,
    }
    return NewJob(**values)


def claim(
    driver: Any, now: datetime | None = T0, limit: int = 10, queue: str = "default"
) -> list[Any]:
    params = ClaimParams(queues=(queue,), limit=limit, lease_for=LEASE, worker_id="w", now=now)
    result: list[Any] = driver.job_cycle(Cycle(claim=params)).claimed
    return result


def eventually(action: Callable[[], T], within: float = 20.0) -> T:
    """Retry ``action`` until it stops raising ``DriverUnavailableError``."""
    deadline = time.monotonic() + within
    while True:
        try:
            return action()
        except DriverUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def driver(pg_dsn: str) -> Iterator[Any]:
    drv = PostgresDriver(pg_dsn)
    try:
        yield drv
    finally:
        drv.close()


@pytest.fixture
def listener(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A bare connection LISTENing on the driver's channel (the schema name)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("LISTEN ultimat3_jobs")
        yield conn


def payloads(conn: psycopg.Connection[Any], wait: float = 0.5) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=wait)]


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema", ["", "Jobs", "1jobs", "jobs;drop", 'a"b', "x" * 64, "jobs-x", "ünï"]
)
def test_schema_names_are_validated(schema: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        PostgresDriver("postgresql://localhost/db", schema=schema)
    assert raised.value.fix


def test_display_url_masks_the_password() -> None:
    for dsn, shown in [
        (
            "postgresql://app:s3cret@db.example:5432/jobs",
            "postgresql://app:***@db.example:5432/jobs",
        ),
        (
            "postgres://app@db/jobs?password=s3cret&sslmode=require",
            "postgres://app@db/jobs?password=***&sslmode=require",
        ),
        (
            "host=db user=app password=s3cret dbname=jobs",
            "host=db user=app password=*** dbname=jobs",
        ),
        ("host=db password='s3 cret' dbname=jobs", "host=db password=*** dbname=jobs"),
    ]:
        drv = PostgresDriver(dsn, pool_min=0)
        try:
            assert drv.display_url == shown
            assert "s3" not in drv.display_url
        finally:
            drv.close()


def test_a_bad_dsn_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not valid"):
        PostgresDriver("host=db port")


def test_missing_psycopg_names_the_extra_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"
        "from ultimat3.jobs.drivers.postgres import PostgresDriver\n"
        "from ultimat3.jobs.errors import DriverUnavailableError\n"
        "try:\n"
        "    PostgresDriver('postgresql://localhost/db')\n"
        "except DriverUnavailableError as exc:\n"
        "    print(exc.fix)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == 'pip install "ultimat3-jobs[postgres]"'


# -- schema and migrations ---------------------------------------------------------------------


def test_a_custom_schema_holds_its_own_queue(pg_dsn: str) -> None:
    default, other = PostgresDriver(pg_dsn), PostgresDriver(pg_dsn, schema="tenant_b")
    try:
        assert other.migrate() == VERSIONS
        job = new_job()
        other.job_insert_many([job], now=T0)
        assert default.job_get(job.id) is None
        assert other.job_get(job.id) is not None
        sqls = other.migration_sql()
        assert all('"tenant_b".' in text and "{schema}" not in text for _, text in sqls)
    finally:
        default.close()
        other.close()


def test_migrations_without_the_schema_raise_with_the_fix(pg_empty_dsn: str) -> None:
    drv = PostgresDriver(pg_empty_dsn)
    try:
        with pytest.raises(DriverUnavailableError) as raised:
            drv.job_get("x")
        assert "migrate" in raised.value.fix
        assert drv.migrate() == VERSIONS
        assert drv.job_get("x") is None
    finally:
        drv.close()


def _migrate_in_process(dsn: str, barrier: Any, results: Any) -> None:
    drv = PostgresDriver(dsn)
    try:
        barrier.wait(30)
        results.put(drv.migrate())
    except BaseException as exc:
        results.put(repr(exc))
    finally:
        drv.close()


def test_four_processes_migrating_at_once_leave_one_schema(pg_empty_dsn: str) -> None:
    barrier, results = SPAWN.Barrier(4), SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_migrate_in_process, args=(pg_empty_dsn, barrier, results))
        for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    applied = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(30)
    assert sorted(applied, key=len) == [[], [], [], VERSIONS], applied
    with psycopg.connect(pg_empty_dsn) as conn:
        ledger = conn.execute("SELECT version FROM ultimat3_jobs.x_migrations ORDER BY 1")
        assert [row[0] for row in ledger] == VERSIONS
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'ultimat3_jobs' ORDER BY 1"
        ).fetchall()
        assert [row[0] for row in tables] == [
            "x_job_counts",
            "x_jobs",
            "x_leaders",
            "x_migrations",
            "x_queues",
            "x_schedules",
            "x_workers",
        ]
        indexes = {
            row[0]
            for row in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'x_jobs'"
            ).fetchall()
        }
        assert {"x_jobs_claim_idx", "x_jobs_idempotency_keyed_idx"} <= indexes


# -- storage -----------------------------------------------------------------------------------


def test_input_keeps_its_exact_text(driver: Any) -> None:
    text = '{ "z": 1,  "a": [1.50, "\\u0000", "\\u00e9"], "z": 2 }'
    job = new_job(input=text)
    driver.job_insert_many([job], now=T0)
    assert driver.job_get(job.id).input == text
    assert claim(driver)[0].input == text


def test_invalid_json_is_refused_and_nothing_is_written(driver: Any) -> None:
    from ultimat3.jobs.errors import SerializationError

    good, bad = new_job(), new_job(input="{not json")
    with pytest.raises(SerializationError):
        driver.job_insert_many([good, bad], now=T0)
    assert driver.job_count(JobFilter()) == {}


@pytest.mark.parametrize("size", [3, 250], ids=["statement", "copy"])
def test_a_batch_stores_each_jobs_times_and_state(driver: Any, size: int) -> None:
    """The COPY writes the times as text, once per batch: the same instants as the statement."""
    later = (T0 + timedelta(hours=1)).astimezone(timezone(timedelta(hours=5, minutes=30)))
    kinds = [{"run_at": later}, {"delay": timedelta(minutes=5)}, {}]
    jobs = [new_job(**kinds[i % 3]) for i in range(size)]
    driver.job_insert_many(jobs, now=T0)
    for job in jobs:
        stored = driver.job_get(job.id)
        due = job.run_at or T0 + (job.delay or timedelta(0))
        assert (stored.run_at, stored.created_at) == (due, T0)
        assert stored.state == (JobState.AVAILABLE if due <= T0 else JobState.SCHEDULED)


def test_a_batch_built_as_it_is_read_is_built_a_slice_at_a_time_by_the_copy(driver: Any) -> None:
    """The COPY builds the next slice of a ``NewJobs`` while the server stores the last one,
    and builds none of a batch that it cannot take (a limit here)."""
    built: list[int] = []

    def build(inputs: Sequence[Any], **fields: Any) -> list[NewJob]:
        built.append(len(inputs))
        return [new_job(**fields) for _ in inputs]

    results = driver.job_insert_many(NewJobs(list(range(1_200)), build))
    assert built == [500, 500, 200]
    assert len({r.id for r in results}) == 1_200 and not any(r.deduped for r in results)
    assert driver.job_count(JobFilter()) == {("default", JobState.AVAILABLE): 1_200}
    built.clear()
    limited = NewJobs(list(range(700)), lambda inputs: build(inputs, limit_key="k", limit_max=5))
    assert len(driver.job_insert_many(limited)) == 700
    assert built == [500, 200]  # the first slice said no; the ON CONFLICT path read the rest


def generic_plan(conn: psycopg.Connection[Any], statement: bytes, values: dict[str, Any]) -> str:
    """The plan ``statement`` runs with as a worker's connection runs it: prepared and planned
    generically, for any values (``EXPLAIN`` with values would plan for those values, a custom
    plan). auto_explain prints the plan the statement ran with; the run is rolled back."""
    plans: list[str] = []
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    with conn.transaction(force_rollback=True):
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET LOCAL auto_explain.log_min_duration = 0")
        conn.execute("SET LOCAL auto_explain.log_level = notice")
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(statement, values, prepare=True).fetchall()
    [plan] = [text for text in plans if "plan:" in text]
    assert re.search(r"\$\d", plan), f"the plan is not a generic one (values bound): {plan}"
    return plan


def plan_part(plan: str, cte: str) -> str:
    """The lines of ``plan`` under its ``CTE cte`` node."""
    lines = plan.splitlines()
    [start] = [i for i, line in enumerate(lines) if line.strip() == f"CTE {cte}"]
    depth = len(lines[start]) - len(lines[start].lstrip())
    part = []
    for line in lines[start + 1 :]:
        if len(line) - len(line.lstrip()) <= depth:
            break
        part.append(line)
    assert part, plan
    return "\n".join(part)


def test_claims_use_the_partial_index_with_a_large_finished_backlog(
    driver: Any, pg_dsn: str
) -> None:
    jobs = [new_job() for _ in range(20_000)]
    driver.job_insert_many(jobs, now=T0)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE ultimat3_jobs.x_jobs SET state = 'completed', finished_at = %s WHERE id <> %s",
            (T0, jobs[-1].id),
        )
        conn.execute("ANALYZE ultimat3_jobs.x_jobs")
        values = {"lease_for": LEASE, "worker_id": "w", "now": T0, "started": True, "token": "t"}
        values["relaxed"] = False
        plans = [
            generic_plan(
                conn,
                driver._with_limit("job_claim_queue", 10),
                {**values, "queue": "default"},
            ),
            generic_plan(
                conn,
                driver._q["job_claim"],
                {**values, "queues": "{default,other}", "limit": 10, "skip": "{gone.job}"},
            ),
        ]
    for text in plans:
        assert "x_jobs_claim_idx" in text, text
        assert "Seq Scan on x_jobs" not in text, text
        assert "Index Scan using x_jobs_pkey" in text, text
    assert [job.id for job in claim(driver)] == [jobs[-1].id]


def test_a_one_queue_claim_probes_the_primary_key_on_a_table_never_analyzed(
    driver: Any, pg_dsn: str
) -> None:
    """A fresh install: PostgreSQL has no statistics of x_jobs yet, and the generic plan a
    worker's connection keeps is made then. The one-queue claims (alone, relaxed, and the
    cycle's) must still find their rows by the primary key, not scan the table (which grows
    under that plan until the first ANALYZE). The cycle's write of finished jobs
    (``id = ANY(ids)``, 10 ids guessed against 10 pages) does plan a scan there: ``_replan``
    drops that plan at the first slow cycle (the test after this one)."""
    driver.job_insert_many([new_job()], now=T0)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        [(tuples,)] = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'ultimat3_jobs.x_jobs'::regclass"
        ).fetchall()
        assert tuples < 0, "the table was analyzed: this test needs one that never was"
        values = {"lease_for": LEASE, "worker_id": "w", "now": T0, "started": True, "token": "t"}
        values |= {"queue": "default", "finished": "f", "ids": [], "tokens": [], "results": []}
        statements = {
            "claim": (driver._with_limit("job_claim_queue", 10), False),
            "relaxed claim": (driver._with_limit("job_claim_queue", 10), True),
            "cycle": (driver._with_limit("job_cycle_queue", 10), False),
        }
        for name, (statement, relaxed) in statements.items():
            plan = generic_plan(conn, statement, {**values, "relaxed": relaxed})
            claim = plan_part(plan, "due") + plan_part(plan, "claimed")
            assert "Seq Scan on x_jobs" not in claim, (name, plan)
            assert "Index Scan using x_jobs_pkey" in claim, (name, plan)


def test_a_claim_planned_while_the_table_was_tiny_is_planned_again_once_it_is_slow(
    pg_dsn: str,
) -> None:
    """A generic plan made when x_jobs held 3 rows (analyzed) scans the table; after a burst
    made it big, it would scan 100,000 rows per claim until autovacuum's next ANALYZE. The
    first slow claim drops the connection's plans, and the next claim is planned for the
    table as it is."""
    driver = PostgresDriver(pg_dsn, pool_min=1, pool_max=1)  # one connection: its plans
    try:
        driver.job_insert_many([new_job() for _ in range(3)])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ANALYZE ultimat3_jobs.x_jobs")
            # No autovacuum ANALYZE in the middle, which would end the stale plan itself.
            conn.execute("ALTER TABLE ultimat3_jobs.x_jobs SET (autovacuum_enabled = false)")
        turn = Cycle(claim=ClaimParams(("default",), 10, LEASE, "w"))
        for _ in range(12):  # prepared, then planned generically, on a table of 3 rows
            driver.job_cycle(turn)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO ultimat3_jobs.x_jobs (id, name, queue, input, idempotency_key, "
                "state, max_attempts, run_at, created_at, finished_at) "
                "SELECT 'f' || g, 'old', 'default', '{}', 'f' || g, 'completed', 1, now(), "
                "now(), now() FROM generate_series(1, 100000) g"
            )
        took = []
        seen: list[events.Event] = []
        with events.subscribe(seen.append, names=["jobs.postgres.replanned"]):
            for _ in range(2):
                driver.job_insert_many([new_job() for _ in range(10)])
                started = time.monotonic()
                assert len(driver.job_cycle(turn).claimed) == 10
                took.append(time.monotonic() - started)
        assert took[0] > 0.02, f"the stale plan did not show ({took}): this test needs it"
        assert took[1] < took[0] / 5, took
        [replanned] = seen  # the first claim, and only it
        assert 0.02 < replanned.fields["seconds"] <= round(took[0], 3) + 0.001
    finally:
        driver.close()


def test_plans_dropped_again_and_again_are_made_again_each_time(pg_dsn: str) -> None:
    """``_replan`` on a connection with nothing prepared yet, then with statements prepared,
    more than once: the server's prepared statements are gone each time, and psycopg, which
    knows, prepares them again instead of naming ones that no longer exist."""
    from ultimat3.jobs.drivers.postgres.connections import _replan

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _replan(conn)
        for _ in range(3):
            for _ in range(8):  # prepared from the sixth on
                assert conn.execute("SELECT %s::int + 1", (1,)).fetchone() == (2,)
            prepared = "SELECT count(*) FROM pg_prepared_statements"
            assert conn.execute(prepared, prepare=False).fetchone() == (1,)
            _replan(conn)
            assert conn.execute(prepared, prepare=False).fetchone() == (0,)


# -- notifications -----------------------------------------------------------------------------


def test_insert_notifies_the_queue_name_at_commit(driver: Any, listener: Any) -> None:
    driver.job_insert_many([new_job("mail"), new_job("mail"), new_job("sms")], now=T0)
    assert sorted(payloads(listener)) == ["mail", "sms"]
    driver.job_insert_many([new_job("later", run_at=T0 + timedelta(hours=1))], now=T0)
    assert payloads(listener) == [], "a scheduled job wakes nobody"


def test_rolled_back_insert_notifies_nobody(driver: Any, listener: Any) -> None:
    job = new_job("mail")
    with pytest.raises(RuntimeError), driver.transaction() as tx:
        driver.job_insert_many([job], executor=tx, now=T0)
        assert payloads(listener, 0.3) == [], "nothing before commit"
        raise RuntimeError("roll back")
    assert payloads(listener) == []
    assert driver.job_get(job.id) is None


def test_retry_resume_and_snooze_notify(driver: Any, listener: Any) -> None:
    driver.queue_set_paused("mail", True)
    driver.job_insert_many([new_job("mail")], now=T0)
    payloads(listener)
    driver.queue_set_paused("mail", False)
    assert payloads(listener) == ["mail"]
    [job] = claim(driver, queue="mail")
    assert driver.job_snooze(job.lease, timedelta(0), now=T0)
    assert payloads(listener) == ["mail"]
    [job] = claim(driver, queue="mail")
    driver.job_cancel(Cancellation(job.id, "x"), now=T0)
    assert driver.job_retry([job.id], now=T0) == [job.id]
    assert payloads(listener) == ["mail"]


# -- joining a caller's connection -------------------------------------------------------------


#: ``now`` of an insert: pinned (a test clock), or None, the database's clock, as the usual
#: enqueue passes.
NOWS = pytest.mark.parametrize("now", [T0, None], ids=["pinned", "database-clock"])


@NOWS
def test_insert_on_a_callers_transaction_commits_and_rolls_back_with_it(
    driver: Any, pg_dsn: str, now: datetime | None
) -> None:
    kept, dropped = new_job(), new_job()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        driver.job_insert_many([kept], executor=driver.adopt(conn), now=now)
        assert driver.job_get(kept.id) is None, "invisible before the caller commits"
        conn.commit()
        assert driver.job_get(kept.id) is not None
        driver.job_insert_many([dropped], executor=driver.adopt(conn), now=now)
        conn.rollback()
    assert driver.job_get(dropped.id) is None


@NOWS
def test_a_failed_insert_leaves_the_callers_transaction_usable(
    driver: Any, pg_dsn: str, now: datetime | None
) -> None:
    # Our writes run in a savepoint: a failed insert rolls back to it, and the caller's
    # transaction goes on with nothing of the failed call (ARCHITECTURE.md, the rule).
    existing = new_job()
    driver.job_insert_many([existing], now=T0)
    clash = new_job(id=existing.id)  # same id, other key
    fresh, kept = new_job(), new_job()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        with pytest.raises(ValueError, match="another key"):
            driver.job_insert_many([fresh, clash], executor=driver.adopt(conn), now=now)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        driver.job_insert_many([kept], executor=driver.adopt(conn), now=now)
        conn.commit()
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    assert driver.job_get(fresh.id) is None, "the savepoint undid the whole call"
    assert driver.job_get(kept.id) is not None


def test_one_job_that_conflicts_in_a_callers_transaction_is_resolved_there(
    driver: Any, pg_dsn: str
) -> None:
    """One job's savepoint is released in the round trip of its INSERT: a conflict (nothing
    written) is resolved in a savepoint of its own, in the caller's transaction: a stored
    key dedupes, a held unique key debounces, and a stored id under another key is refused
    with the transaction spared."""
    stored = new_job(idempotency_key="k")
    waiting = STATE_BITS["scheduled"] | STATE_BITS["available"]
    held = new_job(unique_key="u", unique_states=waiting, unique_replace=True, input='{"v":1}')
    driver.job_insert_many([stored, held], now=T0)
    again = new_job(idempotency_key="k")
    debounced = new_job(unique_key="u", unique_states=waiting, unique_replace=True, input='{"v":2}')
    clash = new_job(id=stored.id, idempotency_key=stored.id)
    fresh = new_job()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        joined = driver.adopt(conn)
        assert driver.job_insert_many([again], executor=joined, now=T0) == [
            InsertResult(stored.id, deduped=True)
        ]
        assert driver.job_insert_many([debounced], executor=joined, now=T0) == [
            InsertResult(held.id, deduped=True)
        ]
        with pytest.raises(ValueError, match="another key"):
            driver.job_insert_many([clash], executor=joined, now=T0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert driver.job_insert_many([fresh], executor=joined, now=T0) == [
            InsertResult(fresh.id, deduped=False)
        ]
        assert driver.job_get(held.id).input == '{"v":1}', "invisible before the commit"
        conn.commit()
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    assert driver.job_get(held.id).input == '{"v":2}'
    assert driver.job_get(fresh.id) is not None
    assert sum(driver.job_count(JobFilter()).values()) == 3


@NOWS
def test_a_refused_value_in_a_callers_transaction_says_so_and_spares_it(
    driver: Any, pg_dsn: str, now: datetime | None
) -> None:
    from ultimat3.jobs.errors import SerializationError

    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(SerializationError, match="PostgreSQL refused the job"):
            driver.job_insert_many(
                [new_job(input="{not json")], executor=driver.adopt(conn), now=now
            )
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute("SELECT 2").fetchone() == (2,)
        conn.commit()
    assert driver.job_count(JobFilter()) == {}


def test_an_idle_connection_gets_a_transaction_the_caller_commits(driver: Any, pg_dsn: str) -> None:
    job = new_job()
    with psycopg.connect(pg_dsn) as conn:
        driver.job_insert_many([job], executor=driver.adopt(conn), now=T0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert driver.job_get(job.id) is None
        conn.commit()
    assert driver.job_get(job.id) is not None


def test_an_autocommit_connection_commits_the_insert_on_its_own(driver: Any, pg_dsn: str) -> None:
    job = new_job()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert driver.job_insert_many([job], executor=driver.adopt(conn), now=T0) == [
            InsertResult(job.id, deduped=False)
        ]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert driver.job_get(job.id) is not None


def test_adopt_refuses_other_databases_and_unusable_connections(
    driver: Any, pg_dsn: str, pg_empty_dsn: str
) -> None:
    with psycopg.connect(pg_empty_dsn) as other, pytest.raises(ConfigurationError) as raised:
        driver.adopt(other)
    assert raised.value.fix
    with psycopg.connect(pg_dsn) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(ConfigurationError, match="rolled back"):
            driver.adopt(conn)
        conn.rollback()
        assert driver.adopt(conn).connection is conn
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_adopt_refuses_async_connections(driver: Any, pg_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        with pytest.raises(ConfigurationError, match="async"):
            driver.adopt(conn)


def test_adopt_refuses_a_database_without_the_tables(pg_dsn: str) -> None:
    drv = PostgresDriver(pg_dsn, schema="elsewhere")  # same database, schema not migrated
    try:
        with psycopg.connect(pg_dsn) as conn, pytest.raises(ConfigurationError) as raised:
            drv.adopt(conn)
        assert "migrate" in raised.value.fix
    finally:
        drv.close()


# -- wake-ups ----------------------------------------------------------------------------------


def _waited(drv: PostgresDriver, timeout: float, wake: threading.Event | None = None) -> float:
    start = time.monotonic()
    drv.wait_for_jobs(timeout, wake or threading.Event())
    return time.monotonic() - start


def test_listen_false_polls_only(pg_dsn: str) -> None:
    drv = PostgresDriver(pg_dsn, listen=False, application_name="u3j-nolisten", poll=0.2)
    other = PostgresDriver(pg_dsn, listen=False, application_name="u3j-nolisten-2")
    try:
        with drv.transaction() as tx:
            assert tx.connection.prepare_threshold is None, "no prepared statements behind a pooler"
        assert 0.55 <= _waited(drv, 0.6) < 2, "nothing changed, so nothing wakes it"
        # An insert by this driver wakes its waiters at once.
        timer = threading.Timer(0.1, lambda: drv.job_insert_many([new_job()], now=T0))
        timer.start()
        assert _waited(drv, 10) < 0.5
        timer.join()
        # Another process's insert is seen by the next look (at most `poll` apart).
        timer = threading.Timer(0.3, lambda: other.job_insert_many([new_job()], now=T0))
        timer.start()
        assert 0.25 <= _waited(drv, 10) < 1.0
        timer.join()
        wake = threading.Event()
        threading.Timer(0.1, wake.set).start()
        assert _waited(drv, 10, wake) < 5
        with psycopg.connect(pg_dsn) as conn:
            listening = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'u3j-nolisten%'"
                " AND query ILIKE 'listen%'"
            ).fetchone()
        assert listening == (0,)
    finally:
        drv.close()
        other.close()


def test_many_threads_wait_on_one_listen_connection(driver: Any, pg_dsn: str) -> None:
    woke: list[float] = []

    def wait() -> None:
        start = time.monotonic()
        driver.wait_for_jobs(15, threading.Event())
        woke.append(time.monotonic() - start)

    threads = [threading.Thread(target=wait) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    driver.job_insert_many([new_job()], now=T0)
    for thread in threads:
        thread.join(20)
    assert len(woke) == 4 and max(woke) < 5, woke
    with psycopg.connect(pg_dsn) as conn:
        sessions = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ultimat3-jobs'"
            " AND query ILIKE 'listen%'"
        ).fetchone()
    assert sessions == (1,)


def test_the_first_wait_returns_once_it_listens(pg_dsn: str) -> None:
    """A worker claims, then waits; its first wait opens the LISTEN. A job inserted between
    the two notified nobody: the first wait returns as soon as it listens, so the caller
    claims it, instead of sleeping to the end of its poll interval."""
    drv = PostgresDriver(pg_dsn, application_name="u3j-first-listen")
    other = PostgresDriver(pg_dsn, application_name="u3j-first-listen-2")
    try:
        assert claim(drv) == []  # the caller's claim: nothing yet
        other.job_insert_many([new_job()], now=T0)  # before anyone LISTENs
        assert _waited(drv, 20) < 5, "the insert before the LISTEN was left to the next poll"
        assert len(claim(drv)) == 1
    finally:
        drv.close()
        other.close()


def test_a_reader_awaiting_a_due_job_wakes_the_workers_again(pg_dsn: str) -> None:
    """``job_await`` (``app.result`` right after the enqueue) locks the job's row while a
    worker woken by the insert may be claiming: the claim passes over the locked row
    (SKIP LOCKED) and finds nothing. The await notifies the queue again at its commit."""
    drv = PostgresDriver(pg_dsn, application_name="u3j-await")
    other = PostgresDriver(pg_dsn, application_name="u3j-await-2")
    try:
        drv.wait_for_jobs(0.05, threading.Event())  # listening from now on
        [inserted] = other.job_insert_many([new_job()])  # due now, on the database's clock
        assert _waited(drv, 20) < 5  # the insert's NOTIFY
        # The claim that NOTIFY set off ran while the reader held the row: it found nothing.
        timer = threading.Timer(0.2, lambda: other.job_wait(inserted.id, timeout=0))
        timer.start()
        assert _waited(drv, 20) < 5, "the await's commit woke nobody: the job waits a poll"
        timer.join()
        assert [j.id for j in claim(drv, now=None)] == [inserted.id]
    finally:
        drv.close()
        other.close()


def test_a_result_waiter_returns_on_the_notification_not_at_the_end_of_its_slice(
    pg_dsn: str,
) -> None:
    """The thread that listens for finished jobs is a waiter too: it returns as soon as the
    NOTIFY of its job arrives, not at the end of its 100 ms listening turn."""
    from ultimat3.jobs.clock import Backoff, SystemClock
    from ultimat3.jobs.drivers.postgres.listen import Finished, Listener
    from ultimat3.jobs.drivers.postgres.watchdog import Watchdog

    clock = SystemClock()
    listener = Listener(
        lambda: psycopg.connect(pg_dsn, autocommit=True),
        clock=clock,
        backoff=Backoff(first=0.25, cap=5.0),
        probe_after=30.0,
        ping=b"SELECT 1",
        watch=Watchdog(30.0, clock),
    )
    finished = Finished(listener, "u3j_test:finished", clock, span=0.1)
    delays: list[float] = []
    try:
        mark = finished.wait(("x",), 2.0, finished.mark())  # opens the LISTEN
        with psycopg.connect(pg_dsn, autocommit=True) as sender:

            def send(job_id: str, sent: list[float]) -> None:
                sent.append(time.monotonic())
                sender.execute("SELECT pg_notify('u3j_test:finished', %s)", (job_id,))

            for n in range(7):
                sent: list[float] = []
                timer = threading.Timer(0.13, send, (f"job-{n}", sent))
                timer.start()
                mark = finished.wait((f"job-{n}",), 5.0, mark)
                returned = time.monotonic()
                timer.join()
                delays.append(returned - sent[0])
    finally:
        listener.close(within=1.0)
    delays.sort()
    assert delays[len(delays) // 2] < 0.05, delays  # the median: a busy machine is noisy


# -- sessions and servers going away -----------------------------------------------------------


def _terminate(cluster: Cluster, application_name: str) -> None:
    """Terminate the sessions and wait until they are gone (the server ends them
    asynchronously)."""
    assert cluster.terminate_backends(application_name) > 0
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
            (application_name,),
        ).fetchone() != (0,):
            assert time.monotonic() < deadline
            time.sleep(0.02)


def test_terminated_sessions_are_replaced(pg_cluster: Cluster, pg_dsn: str) -> None:
    name = f"u3j-kill-{uuid7()[-8:]}"
    drv = PostgresDriver(pg_dsn, pool_min=2, application_name=name)
    try:
        drv.job_insert_many([new_job()], now=T0)
        waited: list[float] = []
        waiter = threading.Thread(target=lambda: waited.append(_timed_wait(drv, 30)), daemon=True)
        waiter.start()
        time.sleep(0.5)  # the waiter is LISTENing now
        _terminate(pg_cluster, name)
        waiter.join(10)
        assert waited and waited[0] < 5, "a lost LISTEN connection returns early"
        assert len(claim(drv)) == 1, "the pool replaced its dead sessions"
        # The listener LISTENs again: an insert wakes the next wait.
        drv.wait_for_jobs(2, threading.Event())
        timer = threading.Timer(0.3, lambda: drv.job_insert_many([new_job()], now=T0))
        timer.start()
        assert _timed_wait(drv, 20) < 5
        timer.join()
    finally:
        drv.close()


def _backend_pid(drv: Any) -> int:
    with drv._connection() as conn:
        pid: int = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    return pid


def test_close_ends_every_session_of_the_driver(pg_dsn: str) -> None:
    name = f"u3j-close-{uuid7()[-8:]}"
    drv = PostgresDriver(pg_dsn, pool_min=0, application_name=name)
    drv.job_insert_many([new_job()], now=T0)
    drv.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "a session of the closed driver is still open"
            time.sleep(0.02)


def _timed_wait(drv: Any, timeout: float) -> float:
    start = time.monotonic()
    drv.wait_for_jobs(timeout, threading.Event())
    return time.monotonic() - start


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    """A cluster of this module's own, since these tests crash it."""
    if find_bindir() is None:
        pytest.skip("no PostgreSQL binaries to start a cluster that may be crashed")
    cluster = Cluster.create()
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_forked_child_gets_connections_of_its_own(driver: Any, pg_dsn: str) -> None:
    """A pre-fork web server forks after the app opened its pool: parent and child insert at
    once, each on its own sessions; the child then finishes what it inherited, as its exit
    would, and the parent's sessions and LISTEN go on."""
    driver.job_insert_many([new_job()], now=T0)
    driver.wait_for_jobs(0.2, threading.Event())  # the LISTEN connection is open now
    with warnings.catch_warnings():  # Python 3.12 warns of fork() in a process with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            for _ in range(30):
                driver.job_insert_many([new_job()], now=T0)
            driver._inherited.clear()
            gc.collect()  # each inherited connection sends its Terminate to /dev/null
            code = 0
        finally:
            os._exit(code)
    for _ in range(30):
        driver.job_insert_many([new_job()], now=T0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for _ in range(5):  # every pooled session of the parent still answers its own statements
        driver.job_insert_many([new_job()], now=T0)
    assert driver.job_count(JobFilter()) == {("default", JobState.AVAILABLE): 66}

    def notify() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute("NOTIFY ultimat3_jobs, 'default'")

    while _waited(driver, 0.3) < 0.25:  # the notifications of the inserts, heard
        pass
    timer = threading.Timer(0.3, notify)
    timer.start()
    waited = _waited(driver, 10)
    timer.join()
    assert 0.25 < waited < 5  # the parent's LISTEN heard the NOTIFY sent after the fork


def test_a_fork_disowns_the_connection_of_a_call_in_flight(driver: Any) -> None:
    """A thread of the parent is inside ``driver.transaction()`` at the fork: in the child that
    connection, like every other it inherited, points at /dev/null; the parent's transaction
    goes on and commits."""
    held, release = threading.Event(), threading.Event()
    lent: list[Any] = []

    def hold() -> None:
        with driver.transaction() as joined:
            lent.append(joined.connection)
            held.set()
            release.wait(10)
            driver.job_insert_many([new_job()], executor=joined, now=T0)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            disowned = [c for c in driver._inherited[-1][1] if c is not None]
            targets = {os.readlink(f"/proc/self/fd/{c.pgconn.socket}") for c in disowned}
            if targets == {os.devnull} and any(c is lent[0] for c in disowned):
                code = 0
        finally:
            os._exit(code)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert driver.job_count(JobFilter()) == {("default", JobState.AVAILABLE): 1}


def test_the_driver_works_again_after_a_server_crash(own_cluster: Cluster) -> None:
    with psycopg.connect(own_cluster.dsn(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS crash WITH (FORCE)")
        conn.execute("CREATE DATABASE crash")
    drv = PostgresDriver(make_conninfo(own_cluster.dsn(), dbname="crash"), pool_min=2)
    try:
        drv.migrate()
        acknowledged = new_job()
        drv.job_insert_many([acknowledged], now=T0)
        drv.wait_for_jobs(0.3, threading.Event())  # the listener is connected now
        own_cluster.stop("immediate")

        start = time.monotonic()
        with pytest.raises(DriverUnavailableError) as raised:
            drv.job_insert_many([new_job()], now=T0)
        assert time.monotonic() - start < 3, "an outage fails fast"
        assert raised.value.cause and raised.value.fix
        assert raised.value.driver == "postgres"
        start = time.monotonic()
        drv.wait_for_jobs(10, threading.Event())  # a hint: the lost listener returns early
        drv.wait_for_jobs(1.0, threading.Event())  # and, still down, neither raises nor hangs
        assert time.monotonic() - start < 4

        own_cluster.start()
        restarted = time.monotonic()
        jobs = eventually(lambda: claim(drv))
        assert time.monotonic() - restarted < 10
        assert [job.id for job in jobs] == [acknowledged.id], "a committed insert survives"
        assert _timed_wait(drv, 20) < 8, "re-LISTENing returns early, for a catch-up poll"
        timer = threading.Timer(0.5, lambda: drv.job_insert_many([new_job()], now=T0))
        timer.start()
        assert _timed_wait(drv, 20) < 8, "the listener came back"
        timer.join()
    finally:
        drv.close()


def test_an_unreachable_server_fails_fast_with_cause_and_fix() -> None:
    dsn = f"host=127.0.0.1 port={_closed_port()} user=postgres dbname=x connect_timeout=2"
    drv = PostgresDriver(dsn, pool_min=0)
    try:
        start = time.monotonic()
        with pytest.raises(DriverUnavailableError) as raised:
            drv.job_get("x")
        assert time.monotonic() - start < 3
        assert drv.display_url in raised.value.cause
        assert "refused" in raised.value.cause, "libpq's own reason"
        assert "server" in raised.value.fix
    finally:
        drv.close()


@pytest.mark.slow
def test_an_exhausted_pool_says_so(pg_dsn: str) -> None:
    drv = PostgresDriver(pg_dsn, pool_min=1, pool_max=1)
    try:
        with drv.transaction(), pytest.raises(DriverUnavailableError) as raised:
            drv.job_get("x")
        assert "busy" in raised.value.fix and "pool_max" in raised.value.fix
        assert drv.job_get("x") is None
    finally:
        drv.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- odd text through the array parameters -----------------------------------------------------


def test_ids_with_any_characters_survive_the_array_parameters(driver: Any) -> None:
    odd = ['a"b', "c\\d", "e,f", "{g}", "NULL", " h ", "ü✓", "'i'"]
    jobs = [new_job(id=job_id, max_attempts=1) for job_id in odd]
    driver.job_insert_many(jobs, now=T0)
    listed = driver.job_list(JobFilter(ids=tuple(odd)))
    assert sorted(job.id for job in listed) == sorted(odd)
    claimed = claim(driver, limit=len(odd))
    assert driver.lease_extend([job.lease for job in claimed], LEASE, now=T0) == set(odd)
    assert driver.job_cycle(
        Cycle(completes=[job.lease for job in claimed[:4]]), now=T0
    ).completed == {job.id for job in claimed[:4]}
    for job in claimed[4:]:
        assert driver.job_cancel(Cancellation(job.id, "odd"), now=T0)
    rest = [job.id for job in claimed[4:]]
    assert driver.job_retry(rest, now=T0) == rest
    assert {job.id for job in claim(driver, limit=10)} == set(rest)


# -- cron schedules and leadership -------------------------------------------------------------


def test_schedule_state_remembers_when_a_task_was_first_seen(driver: Any) -> None:
    first = driver.schedule_state(["a", "b"], now=T0)
    assert [(s.task, s.first_seen_at, s.last_fired_at) for s in first.values()] == [
        ("a", T0, None),
        ("b", T0, None),
    ]
    later = driver.schedule_state(["b", "c"], now=T0 + timedelta(hours=1))
    assert later["b"].first_seen_at == T0
    assert later["c"].first_seen_at == T0 + timedelta(hours=1)


def test_schedule_fire_moves_forward_only(driver: Any) -> None:
    occurrence = T0 + timedelta(minutes=1)
    fired = driver.schedule_fire(
        Fire("nightly", occurrence, [new_job(idempotency_key="n@1")]), now=T0
    )
    assert fired is not None and not fired[0].deduped
    assert driver.schedule_fire(Fire("nightly", occurrence, [new_job()]), now=T0) is None
    assert driver.schedule_fire(Fire("nightly", T0, [new_job()]), now=T0) is None
    assert driver.schedule_state(["nightly"])["nightly"].last_fired_at == occurrence
    assert sum(driver.job_count(JobFilter()).values()) == 1
    assert driver.schedule_fire(Fire("nightly", occurrence + timedelta(minutes=1)), now=T0) == []


def test_racing_schedulers_fire_each_occurrence_once(pg_dsn: str) -> None:
    drivers = [PostgresDriver(pg_dsn) for _ in range(4)]
    occurrences = [T0 + timedelta(minutes=m) for m in range(15)]
    fired: list[datetime] = []
    barrier = threading.Barrier(len(drivers))

    def run(drv: Any) -> None:
        barrier.wait(10)
        for occurrence in occurrences:
            result = drv.schedule_fire(Fire("race", occurrence, [new_job()]), now=T0)
            if result is not None:
                fired.append(occurrence)

    threads = [threading.Thread(target=run, args=(drv,)) for drv in drivers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(fired) == len(set(fired))
        assert sum(drivers[0].job_count(JobFilter()).values()) == len(fired)
        assert drivers[0].schedule_state(["race"])["race"].last_fired_at == occurrences[-1]
    finally:
        for drv in drivers:
            drv.close()


# -- big batches (the COPY path) ---------------------------------------------------------------


def test_a_big_batch_keeps_every_text_exactly(driver: Any) -> None:
    odd = ["tab\there", "new\nline", "cr\rhere", "back\\slash", "\\N", "ü✓ 'q' \"dq\"", ""]
    jobs = [
        new_job(
            queue=f"q{i % 3}",
            name=f"name {odd[i % len(odd)]}",
            input=json.dumps({"s": odd[i % len(odd)], "i": i}, ensure_ascii=False),
            idempotency_key=f"key {odd[i % len(odd)]} {i}",
            tenant_id=None if i % 2 else odd[i % len(odd)],
            priority=i % 5,
            run_at=T0 + timedelta(seconds=i % 2),
        )
        for i in range(300)
    ]
    results = driver.job_insert_many(jobs, now=T0)
    assert results == [InsertResult(job.id, deduped=False) for job in jobs]
    stored = {job.id: job for job in driver.job_list(JobFilter(), limit=1000)}
    for job in jobs:
        got = stored[job.id]
        assert (got.name, got.queue, got.input, got.idempotency_key, got.tenant_id) == (
            job.name,
            job.queue,
            job.input,
            job.idempotency_key,
            job.tenant_id,
        )
        assert got.priority == job.priority and got.run_at == job.run_at
        assert got.state is (
            JobState.SCHEDULED if job.run_at and job.run_at > T0 else JobState.AVAILABLE
        )


def test_a_big_batch_of_one_shape_escapes_each_line_that_needs_it(driver: Any) -> None:
    # The jobs of one enqueue share the text of their line but for the id, input and key
    # (made once for the run): a tenant that needs escapes makes every line take the slow
    # path, an input or key that needs them only its own; a delay is worked out once.
    tenant = "t\\en\tant"
    odd = ["tab\there", "back\\slash", "new\nline", "plain"]
    jobs = [
        new_job(
            input=json.dumps({"s": odd[i % len(odd)]}),
            idempotency_key=f"{odd[(i // 4) % len(odd)]} {i}",
            tenant_id=tenant if i < 300 else None,
            delay=timedelta(minutes=5) if i % 600 >= 500 else None,
        )
        for i in range(1200)
    ]
    assert driver.job_insert_many(jobs, now=T0) == [InsertResult(j.id, False) for j in jobs]
    stored = {job.id: job for job in driver.job_list(JobFilter(), limit=2000)}
    for job in jobs:
        got = stored[job.id]
        assert (got.input, got.idempotency_key, got.tenant_id) == (
            job.input,
            job.idempotency_key,
            job.tenant_id,
        )
        delayed = job.delay is not None
        assert got.state is (JobState.SCHEDULED if delayed else JobState.AVAILABLE)
        assert got.run_at == (T0 + timedelta(minutes=5) if delayed else T0)


def test_a_big_batch_with_stored_or_repeated_keys_dedupes(driver: Any) -> None:
    stored = new_job(idempotency_key="taken")
    driver.job_insert_many([stored], now=T0)
    jobs = [new_job(idempotency_key=f"k{i}") for i in range(250)]
    jobs[10] = new_job(idempotency_key="taken")
    jobs[20] = new_job(idempotency_key="k0")
    results = driver.job_insert_many(jobs, now=T0)
    assert results[10] == InsertResult(stored.id, deduped=True)
    assert results[20] == InsertResult(jobs[0].id, deduped=True)
    assert sum(not r.deduped for r in results) == 248
    assert sum(driver.job_count(JobFilter()).values()) == 249


def test_a_big_batch_notifies_each_due_queue_once_at_commit(driver: Any, listener: Any) -> None:
    jobs = [new_job(queue=("a", "b")[i % 2]) for i in range(400)]
    jobs += [new_job(queue="later", run_at=T0 + timedelta(hours=1)) for _ in range(300)]
    with driver.transaction() as tx:
        driver.job_insert_many(jobs, executor=tx, now=T0)
        assert payloads(listener, 0.3) == []
    assert sorted(payloads(listener)) == ["a", "b"]


def test_a_big_batch_rolls_back_with_the_callers_transaction(driver: Any, pg_dsn: str) -> None:
    jobs = [new_job() for _ in range(500)]
    with psycopg.connect(pg_dsn) as conn:
        driver.job_insert_many(jobs, executor=driver.adopt(conn), now=T0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
    assert driver.job_count(JobFilter()) == {}


def test_a_big_batch_on_a_callers_connection_in_pipeline_mode_is_inserted(
    driver: Any, pg_dsn: str
) -> None:
    """psycopg refuses COPY in pipeline mode: a big batch on a caller's connection in that
    mode takes the INSERT, which stores and dedupes it all the same."""
    stored = new_job()
    driver.job_insert_many([stored], now=T0)
    jobs = [new_job() for _ in range(300)]
    with psycopg.connect(pg_dsn) as conn:
        joined = driver.adopt(conn)
        with conn.pipeline():
            results = driver.job_insert_many([*jobs, stored], executor=joined, now=T0)
        conn.commit()
    assert results == [*(InsertResult(j.id, False) for j in jobs), InsertResult(stored.id, True)]
    assert sum(driver.job_count(JobFilter()).values()) == 301


@pytest.mark.parametrize("size", [2, 250], ids=["statement", "copy"])
def test_a_batch_that_loses_a_deadlock_is_retried(driver: Any, pg_dsn: str, size: int) -> None:
    """A caller's open transaction holds key k2 and then asks for k1, while the driver's batch
    holds k1 and waits for k2: PostgreSQL aborts the batch (it waited first, so its deadlock
    check runs first) and the driver runs it again once the caller is done. It pauses before
    it does, so the caller's insert of k1 (woken by the abort) goes first: a batch that ran
    again at once could take k1 back and deadlock a second time, with the caller as likely to
    lose as the batch (a third of the runs lost so, before the pause)."""
    keys = ["k1", *(f"filler{i}" for i in range(size - 2)), "k2"]
    batch = [new_job(idempotency_key=key) for key in keys]
    outcome: list[Any] = []

    def run_batch() -> None:
        try:
            outcome.append(driver.job_insert_many(batch, now=T0))
        except BaseException as exc:
            outcome.append(exc)

    with psycopg.connect(pg_dsn) as caller, psycopg.connect(pg_dsn, autocommit=True) as watch:
        # The batch's deadlock check (after deadlock_timeout, 1 s) must run before the
        # caller's: on a loaded machine two checks a few milliseconds apart can run in either
        # order, so the caller's waits far longer (the test's user is a superuser).
        caller.execute("SET deadlock_timeout = '20s'")
        mine = driver.job_insert_many(
            [new_job(idempotency_key="k2")], executor=driver.adopt(caller), now=T0
        )
        thread = threading.Thread(target=run_batch)
        thread.start()
        # The batch waits for k2 before the caller asks for k1, however loaded the machine
        # (a fixed sleep once let the caller wait first, and lose the deadlock instead).
        deadline = time.monotonic() + 30
        while not watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the batch never waited for k2"
            time.sleep(0.01)
        driver.job_insert_many(
            [new_job(idempotency_key="k1")], executor=driver.adopt(caller), now=T0
        )
        caller.commit()
        thread.join(30)
    [result] = outcome
    assert isinstance(result, list), result
    assert result[-1] == InsertResult(mine[0].id, deduped=True)
    assert len({r.id for r in result}) == size


def test_an_unreachable_server_says_what_a_worker_and_a_command_do() -> None:
    from ultimat3.jobs.errors import DriverUnavailableError

    unreachable = PostgresDriver("postgresql://nobody@127.0.0.1:1/none")
    try:
        with pytest.raises(DriverUnavailableError) as raised:
            unreachable.job_get("nothing")
    finally:
        unreachable.close()
    assert raised.value.cause.startswith(
        "cannot connect to PostgreSQL at postgresql://nobody@127.0.0.1:1/none: "
    )
    assert raised.value.fix == (
        "check that the server is running and reachable with this URL and its credentials; a "
        "running worker keeps retrying until it is back, a command or a starting worker exits "
        "(run it again once it is back)"
    )


def test_kept_counts_are_emptied_by_a_truncate(driver: Any, pg_dsn: str) -> None:
    """TRUNCATE fires no DELETE trigger: its own trigger empties the kept counts, so a count
    read after it (a benchmark's reset, an operator's) is not the old table's."""
    driver.job_insert_many([new_job() for _ in range(3)])
    assert sum(driver.job_count(JobFilter()).values()) == 3
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE ultimat3_jobs.x_jobs")
    assert sum(driver.job_count(JobFilter()).values()) == 0
    driver.job_insert_many([new_job()])
    assert driver.job_count(JobFilter()) == {("default", JobState.AVAILABLE): 1}


def test_only_an_awaited_job_notifies_the_finished_channel(driver: Any, pg_dsn: str) -> None:
    """Every NOTIFY takes a database-wide lock at commit: a completion nobody waits for sends
    none; one a reader waits for (``job_wait`` marks it awaited first) sends its id."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute('LISTEN "ultimat3_jobs:finished"')
        driver.job_insert_many([new_job(), new_job()])
        quiet, waited = claim(driver, limit=2)
        driver.job_cycle(Cycle(completes=[quiet.lease]))
        assert payloads(conn) == []

        found: list[Any] = []
        reader = threading.Thread(
            target=lambda: found.append(driver.job_wait(waited.id, timeout=30.0))
        )
        reader.start()
        deadline = time.monotonic() + 20
        while not _awaited(pg_dsn, waited.id):
            assert time.monotonic() < deadline, "job_wait never marked the job awaited"
            time.sleep(0.05)
        driver.job_cycle(Cycle(completes=[waited.lease]))
        assert waited.id in ",".join(payloads(conn, wait=5.0))
        reader.join(30)
        assert found and found[0].state is JobState.COMPLETED


def _awaited(dsn: str, job_id: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT awaited FROM ultimat3_jobs.x_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    return bool(row and row[0])


def test_the_one_statement_turn_repeats_the_completion_and_the_claim_word_for_word() -> None:
    # job_cycle_queue is job_complete's fenced write and job_claim_queue's claim in one
    # statement; a change to either must reach it too.
    import re

    from ultimat3.jobs import sql as sql_files

    q = sql_files.queries("postgres")

    def block(text: str, start: str, end: str) -> str:
        found = re.search(re.escape(start) + r".*?" + re.escape(end), text, re.S)
        assert found is not None, (start, end)
        return found.group(0)

    for start, end in (
        (
            "UPDATE {schema}.x_jobs j\n    SET state = 'completed'",
            "AND j.lease_token = ANY(%(tokens)s::text[])",
        ),
        ("due AS (", "FOR UPDATE SKIP LOCKED"),
        (
            "UPDATE {schema}.x_jobs j\n    SET state = 'running'",
            "j.cancel_reason, j.trace_context, j.result::text",
        ),
    ):
        theirs = block(
            q["job_complete"] if "completed" in start else q["job_claim_queue"], start, end
        )
        ours = block(q["job_cycle_queue"], start, end)
        if "'running'" in start:  # the turn writes: it never relaxes its commit
            theirs = theirs.replace(" AND (SELECT off FROM relax) IS NOT NULL", "")
        assert ours == theirs
