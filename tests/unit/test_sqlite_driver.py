"""SQLite-specific behaviour of ``SqliteDriver`` (the generic semantics live in tests/contract):
file settings, busy handling, files that cannot be used, migrations racing across processes,
joining a caller's connection, nested transactions, and kill -9 in the middle of a write."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, TypeVar

import pytest

from ultimat3.jobs.drivers.sqlite import SqliteDriver
from ultimat3.jobs.errors import ConfigurationError, DriverUnavailableError
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import (
    AttemptError,
    ClaimParams,
    Cycle,
    ExpiredQuery,
    Failure,
    InsertResult,
    Job,
    JobFilter,
    JobState,
    NewJob,
)

T = TypeVar("T")
T0 = datetime(2031, 3, 14, 9, 26, 53, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def new_job(key: str | None = None, queue: str = "default") -> NewJob:
    job_id = uuid7()
    return NewJob(job_id, "unit.job", queue, '{"n":1}', key or f"key-{job_id}", 3)


def claim(driver: SqliteDriver, params: ClaimParams) -> list[Job]:
    """Claim as a worker does: a cycle that only claims."""
    return driver.job_cycle(Cycle(claim=params), now=params.now).claimed


def other_thread(call: Callable[[], T]) -> T:
    """Run ``call`` on a thread of its own: another connection of the driver, as a worker's."""
    box: list[T] = []
    thread = threading.Thread(target=lambda: box.append(call()))
    thread.start()
    thread.join(30)
    return box[0]


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.sqlite3")


@pytest.fixture
def driver(path: str) -> Iterator[SqliteDriver]:
    driver = SqliteDriver(path)
    driver.migrate()
    yield driver
    driver.close()


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- settings ------------------------------------------------------------------------------------


def test_connections_use_wal_and_full_synchronous_by_default(driver: SqliteDriver) -> None:
    with driver.transaction() as tx:
        conn = tx.connection
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
        assert conn.isolation_level is None
    # WAL is a property of the file: a plain connection sees it too.
    plain = sqlite3.connect(driver.path)
    try:
        assert plain.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        plain.close()


def test_every_thread_gets_the_requested_synchronous_level(path: str) -> None:
    driver = SqliteDriver(path, synchronous="normal")
    try:
        driver.migrate()

        def level() -> int:
            with driver.transaction() as tx:
                conn = tx.connection
                return int(conn.execute("PRAGMA synchronous").fetchone()[0])

        assert level() == 1
        assert other_thread(level) == 1
    finally:
        driver.close()


def test_identity(driver: SqliteDriver) -> None:
    assert driver.name == "sqlite"
    assert driver.display_url == f"sqlite:///{os.path.abspath(driver.path)}"
    assert driver.display_url.startswith("sqlite:////")


@pytest.mark.parametrize("target", ["", ":memory:", "file:jobs.db?mode=memory"])
def test_rejects_what_is_not_a_file_path(target: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        SqliteDriver(target)
    assert "memory driver" in raised.value.fix


def test_rejects_an_unknown_synchronous_level(path: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        SqliteDriver(path, synchronous="SOMETIMES")
    assert "FULL" in raised.value.fix


# -- files that cannot be used -----------------------------------------------------------------


def test_missing_folder_says_to_create_it(tmp_path: Path) -> None:
    driver = SqliteDriver(tmp_path / "missing" / "jobs.sqlite3")
    with pytest.raises(DriverUnavailableError) as raised:
        driver.migrate()
    assert "create the folder" in raised.value.fix
    assert str(tmp_path / "missing") in raised.value.fix
    assert raised.value.driver == "sqlite"


def test_a_folder_is_not_a_database_file(tmp_path: Path) -> None:
    with pytest.raises(DriverUnavailableError) as raised:
        SqliteDriver(tmp_path).migrate()
    assert "is a folder" in raised.value.fix


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    garbage = tmp_path / "notes.txt"
    garbage.write_bytes(b"these are not the pages you are looking for\n" * 200)
    with pytest.raises(DriverUnavailableError) as raised:
        SqliteDriver(garbage).migrate()
    assert "not a SQLite database" in raised.value.cause
    assert raised.value.fix


def test_a_read_only_file(tmp_path: Path) -> None:
    target = tmp_path / "ro.sqlite3"
    sqlite3.connect(target).close()  # an empty, valid database in rollback-journal mode
    if os.geteuid() == 0:
        # Root ignores permission bits; the immutable flag stops even root.
        chattr = shutil.which("chattr")
        if (
            chattr is None
            or subprocess.run([chattr, "+i", str(target)], capture_output=True).returncode
        ):
            pytest.skip("running as root without chattr +i: cannot make a read-only file")
    else:
        target.chmod(0o444)
    try:
        with pytest.raises(DriverUnavailableError) as raised:
            SqliteDriver(target).migrate()
        assert "writable" in raised.value.fix
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(target)], check=True)
        target.chmod(0o644)


def test_an_unmigrated_file_says_to_migrate(path: str) -> None:
    driver = SqliteDriver(path)
    try:
        with pytest.raises(DriverUnavailableError) as raised:
            driver.job_insert_many([new_job()])
        assert "migrate" in raised.value.fix
    finally:
        driver.close()


# -- busy handling -----------------------------------------------------------------------------


def hold_write_lock(path: str) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


_HOLD_ELSEWHERE = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


def test_a_held_write_lock_becomes_driver_unavailable_not_operational_error(path: str) -> None:
    # Held by another process: one of this process's own would be named as such instead
    # (tests/app/test_sqlite_locks.py).
    SqliteDriver(path).migrate()
    driver = SqliteDriver(path, busy_timeout=0.3)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_ELSEWHERE, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    try:
        for write in (
            lambda: driver.job_insert_many([new_job()]),
            lambda: claim(driver, ClaimParams(("default",), 1, LEASE, "w")),
            lambda: driver.queue_set_paused("q", True),
            lambda: driver.transaction().__enter__(),
        ):
            start = time.monotonic()
            with pytest.raises(DriverUnavailableError) as raised:
                write()
            elapsed = time.monotonic() - start
            assert 0.25 <= elapsed < 5, elapsed
            assert "locked" in raised.value.cause
            assert "busy_timeout" in raised.value.fix
            assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        # Reads do not wait for a writer in WAL mode.
        assert driver.job_get("nope") is None
    finally:
        holder.communicate("", timeout=10)
    assert driver.job_insert_many([job := new_job()]) == [InsertResult(job.id, False)]
    driver.close()


def test_a_writer_longer_than_the_busy_handler_is_waited_for(driver: SqliteDriver) -> None:
    # SQLite's own handler gives up after a few milliseconds; the retry loop keeps going.
    holder = hold_write_lock(driver.path)
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        start = time.monotonic()
        job = new_job()
        assert driver.job_insert_many([job]) == [InsertResult(job.id, False)]
        assert time.monotonic() - start >= 0.4
    finally:
        release.join()
        holder.close()


# -- migrations ----------------------------------------------------------------------------------


def test_four_processes_migrating_an_empty_file_end_with_one_schema(path: str) -> None:
    start_at = time.time() + 1.5
    code = """
        import json, sys, time
        from ultimat3.jobs.drivers.sqlite import SqliteDriver
        driver = SqliteDriver(sys.argv[1])
        while time.time() < float(sys.argv[2]):
            time.sleep(0.001)
        print(json.dumps(driver.migrate()))
        driver.close()
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), path, str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    applied = sorted(out.strip() for out, _ in outputs)
    versions = [v for v, _ in SqliteDriver(path).migration_sql()]
    assert applied == sorted(["[]"] * 3 + [json.dumps(versions)])
    conn = sqlite3.connect(path)
    try:
        recorded = [row[0] for row in conn.execute("SELECT version FROM x_migrations")]
        assert recorded == versions
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        assert {"x_migrations", "x_jobs", "x_queues"} <= tables
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_printed_migrations_are_recognised_by_migrate(path: str) -> None:
    # A team that applies `migrate --sql` with its own tool must not be migrated twice.
    conn = sqlite3.connect(path)
    for _, sql in SqliteDriver(path).migration_sql():
        conn.executescript(sql)
    conn.close()
    driver = SqliteDriver(path)
    try:
        assert driver.migrate() == []
        job = new_job()
        assert driver.job_insert_many([job]) == [InsertResult(job.id, False)]
    finally:
        driver.close()


def test_claims_walk_the_partial_index_without_sorting(driver: SqliteDriver) -> None:
    from ultimat3.jobs.sql import queries

    with driver.transaction() as tx:
        conn = tx.connection
        plan = [
            row[3]
            for row in conn.execute(
                "EXPLAIN QUERY PLAN " + queries("sqlite")["job_claim_queue"],
                {
                    "now": 0,
                    "token": "t",
                    "expires_at": 0,
                    "worker_id": "w",
                    "queue": "q",
                    "limit": 10,
                    "started": 1,
                },
            )
        ]
    assert any("x_jobs_claim" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


# -- transactions and adopted connections --------------------------------------------------------


def test_nested_transactions_are_savepoints(driver: SqliteDriver) -> None:
    outer, inner = new_job(), new_job()
    with driver.transaction() as tx:
        driver.job_insert_many([outer], executor=tx, now=T0)
        with pytest.raises(ZeroDivisionError), driver.transaction() as nested:
            assert nested.connection is tx.connection
            driver.job_insert_many([inner], executor=nested, now=T0)
            1 / 0  # noqa: B018
        assert driver.job_get(inner.id) is None
        assert other_thread(lambda: driver.job_get(outer.id)) is None
    assert driver.job_get(outer.id) is not None
    assert driver.job_get(inner.id) is None


def test_a_separate_write_inside_a_transaction_fails_fast(driver: SqliteDriver) -> None:
    with driver.transaction():
        start = time.monotonic()
        with pytest.raises(ConfigurationError) as raised:
            driver.job_insert_many([new_job()])
        assert time.monotonic() - start < 1
        assert "executor=" in raised.value.fix
        assert driver.job_list_expired(ExpiredQuery(1)) == []  # reads still work inside
    assert driver.job_insert_many([job := new_job()]) == [InsertResult(job.id, False)]


def test_adopt_accepts_the_same_file_under_another_name(
    driver: SqliteDriver, tmp_path: Path
) -> None:
    link = tmp_path / "link.sqlite3"
    link.symlink_to(driver.path)
    conn = sqlite3.connect(link)
    try:
        assert driver.adopt(conn).connection is conn
    finally:
        conn.close()


def test_adopt_rejects_another_file_and_memory(driver: SqliteDriver, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "app.sqlite3")
    memory = sqlite3.connect(":memory:")
    try:
        with pytest.raises(ConfigurationError) as raised:
            driver.adopt(other)
        assert "app.sqlite3" in raised.value.cause
        assert driver.path in raised.value.fix
        with pytest.raises(ConfigurationError):
            driver.adopt(memory)
    finally:
        other.close()
        memory.close()


def app_connection(
    path: str, isolation_level: Literal["DEFERRED", "IMMEDIATE"] | None
) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=isolation_level)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    if conn.in_transaction:
        conn.commit()
    return conn


def visible(driver: SqliteDriver, job_id: str) -> bool:
    return other_thread(lambda: driver.job_get(job_id)) is not None


def test_adopted_transaction_commits_or_rolls_back_the_job_with_the_callers_rows(
    driver: SqliteDriver,
) -> None:
    joined = driver.adopt(app_connection(driver.path, None))
    conn = joined.connection
    try:
        for finish in ("ROLLBACK", "COMMIT"):
            job = new_job()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO orders (item) VALUES (?)", (finish,))
            assert driver.job_insert_many([job], executor=joined, now=T0) == [
                InsertResult(job.id, False)
            ]
            assert conn.in_transaction, "the caller's transaction is still open"
            assert not visible(driver, job.id)
            conn.execute(finish)
            assert visible(driver, job.id) is (finish == "COMMIT")
        items = [row[0] for row in conn.execute("SELECT item FROM orders")]
        assert items == ["COMMIT"]
    finally:
        conn.close()


def test_a_failed_insert_does_not_poison_the_callers_transaction(driver: SqliteDriver) -> None:
    taken = new_job()
    driver.job_insert_many([taken])
    joined = driver.adopt(app_connection(driver.path, None))
    conn = joined.connection
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (item) VALUES ('kept')")
        fresh = new_job()
        clash = NewJob(taken.id, "unit.job", "default", "{}", "another-key", 3)  # id reused
        with pytest.raises(ValueError, match="already stored under another key"):
            driver.job_insert_many([fresh, clash], executor=joined, now=T0)
        assert conn.in_transaction
        conn.execute("COMMIT")
        assert [row[0] for row in conn.execute("SELECT item FROM orders")] == ["kept"]
        assert driver.job_get(fresh.id) is None, "the savepoint undid the whole batch"
    finally:
        conn.close()


def test_one_job_in_an_open_caller_transaction_is_two_statements_in_a_savepoint(
    driver: SqliteDriver,
) -> None:
    """The usual enqueue in a caller's open transaction: the frame check, the insert and the
    count, in a savepoint (a failure takes back both, and nothing of the caller's). A job
    published again, a taken key and an id taken under
    another key find the stored job or name the clash, and leave the counts true."""
    taken = new_job(key="taken")
    driver.job_insert_many([taken])
    joined = driver.adopt(app_connection(driver.path, None))
    conn = joined.connection
    sent: list[str] = []
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (item) VALUES ('one')")
        conn.set_trace_callback(sent.append)
        fresh = new_job()
        assert driver.job_insert_many([fresh], executor=joined) == [InsertResult(fresh.id, False)]
        assert len(sent) == 5, sent
        assert sent[0].startswith("SAVEPOINT") and sent[4].startswith("RELEASE")
        assert "FROM x_clock" in sent[1]  # the frame of the host clock (a step: frame.align)
        assert "INSERT INTO x_jobs " in sent[2] and "INSERT INTO x_job_counts " in sent[3]
        sent.clear()
        assert driver.job_insert_many([fresh], executor=joined) == [InsertResult(fresh.id, True)]
        again = new_job(key="taken")
        assert driver.job_insert_many([again], executor=joined) == [InsertResult(taken.id, True)]
        assert any("SELECT" in s for s in sent), "a duplicate is looked up"
        clash = NewJob(taken.id, "unit.job", "default", "{}", "another-key", 3)
        with pytest.raises(ValueError, match="already stored under another key"):
            driver.job_insert_many([clash], executor=joined)
        conn.set_trace_callback(None)
        assert conn.in_transaction
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert visible(driver, fresh.id)
    assert driver.job_get(again.id) is None
    _kept_counts_agree(driver.path)


def test_legacy_mode_connection_joins_the_transaction_its_insert_would_open(
    driver: SqliteDriver,
) -> None:
    # Legacy mode, as sqlite3.connect's default ("" is DEFERRED): Python BEGINs before DML.
    joined = driver.adopt(app_connection(driver.path, "DEFERRED"))
    conn = joined.connection
    try:
        for finish in (conn.rollback, conn.commit):
            job = new_job()
            assert not conn.in_transaction
            driver.job_insert_many([job], executor=joined, now=T0)
            assert conn.in_transaction, "the job waits for the caller's commit()"
            assert not visible(driver, job.id)
            conn.execute("INSERT INTO orders (item) VALUES ('x')")
            finish()
            assert visible(driver, job.id) is (finish == conn.commit)
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    finally:
        conn.close()


def test_autocommit_connection_outside_a_transaction_commits_at_once(driver: SqliteDriver) -> None:
    joined = driver.adopt(app_connection(driver.path, None))
    conn = joined.connection
    try:
        job = new_job()
        driver.job_insert_many([job], executor=joined, now=T0)
        assert not conn.in_transaction
        assert visible(driver, job.id)
    finally:
        conn.close()


_PEP_249_MODE = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="sqlite3.connect(autocommit=...) arrived in Python 3.12"
)


def _always_in_a_transaction(path: str) -> sqlite3.Connection:
    """Python 3.12's recommended mode: sqlite3 keeps a (deferred) transaction open at all
    times, opened at connect and again after each commit or rollback."""
    conn = sqlite3.connect(path, autocommit=False)  # type: ignore[call-arg,unused-ignore]
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    conn.commit()
    return conn


@_PEP_249_MODE
def test_a_connection_always_in_a_transaction_commits_or_rolls_back_the_job_with_it(
    driver: SqliteDriver,
) -> None:
    joined = driver.adopt(_always_in_a_transaction(driver.path))
    conn = joined.connection
    try:
        for finish in (conn.rollback, conn.commit):
            job = new_job()
            assert conn.in_transaction
            conn.execute("INSERT INTO orders (item) VALUES ('x')")
            driver.job_insert_many([job], executor=joined, now=T0)
            assert not visible(driver, job.id), "the job waits for the caller's commit()"
            finish()
            assert visible(driver, job.id) is (finish == conn.commit)
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    finally:
        conn.close()


@_PEP_249_MODE
def test_a_connection_in_autocommit_true_mode_writes_each_job_at_once_or_in_its_transaction(
    driver: SqliteDriver,
) -> None:
    """``autocommit=True``: outside an explicit BEGIN the job is a transaction of its own,
    committed at once, as the caller's own INSERT would be; inside one, part of it."""
    conn = sqlite3.connect(driver.path, autocommit=True)  # type: ignore[call-arg,unused-ignore]
    joined = driver.adopt(conn)
    try:
        alone = new_job()
        driver.job_insert_many([alone], executor=joined, now=T0)
        assert not conn.in_transaction
        assert visible(driver, alone.id)
        conn.execute("BEGIN")
        inside = new_job()
        driver.job_insert_many([inside], executor=joined, now=T0)
        assert conn.in_transaction and not visible(driver, inside.id)
        conn.execute("ROLLBACK")
        assert not visible(driver, inside.id)
    finally:
        conn.close()


@_PEP_249_MODE
def test_a_read_then_write_in_a_connection_always_in_a_transaction_gets_a_fix_that_applies(
    driver: SqliteDriver,
) -> None:
    """Its transactions open with a plain BEGIN whatever ``isolation_level`` says, so the fix
    for a read-then-write transaction is not ``isolation_level='IMMEDIATE'``."""
    joined = driver.adopt(_always_in_a_transaction(driver.path))
    conn = joined.connection
    try:
        conn.execute("SELECT count(*) FROM x_jobs").fetchone()  # takes a read snapshot
        driver.job_insert_many([new_job()])  # another connection commits meanwhile
        with pytest.raises(DriverUnavailableError) as raised:
            driver.job_insert_many([new_job()], executor=joined, now=T0)
        assert "SQLITE_BUSY_SNAPSHOT" in raised.value.cause
        assert "write before you read" in raised.value.fix
        assert "LEGACY_TRANSACTION_CONTROL" in raised.value.fix
        conn.rollback()
    finally:
        conn.close()


def test_a_read_then_write_caller_transaction_gets_a_fix_not_busy_snapshot(
    driver: SqliteDriver,
) -> None:
    joined = driver.adopt(app_connection(driver.path, None))
    conn = joined.connection
    try:
        conn.execute("BEGIN")  # deferred
        conn.execute("SELECT count(*) FROM x_jobs").fetchone()  # takes a read snapshot
        driver.job_insert_many([new_job()])  # another connection commits meanwhile
        with pytest.raises(DriverUnavailableError) as raised:
            driver.job_insert_many([new_job()], executor=joined, now=T0)
        assert "BEGIN IMMEDIATE" in raised.value.fix
        assert conn.in_transaction, "the caller can still roll back its own transaction"
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def test_close_closes_the_connections_of_every_thread(driver: SqliteDriver) -> None:
    opened: list[sqlite3.Connection] = []
    used, closed = threading.Barrier(3), threading.Event()

    def use() -> None:
        with driver.transaction() as tx:
            conn = tx.connection
            opened.append(conn)
        driver.wait_for_jobs(0.01, threading.Event())  # opens the waiter connection too

    def use_and_stay() -> None:  # alive until after close(), so only close() can close it
        use()
        used.wait(10)
        closed.wait(10)

    threads = [threading.Thread(target=use_and_stay) for _ in range(2)]
    for thread in threads:
        thread.start()
    use()
    used.wait(10)
    try:
        assert all(thread.is_alive() for thread in threads)
        assert len(driver._conns) == 6, "three threads, each a connection and a waiter"
        driver.close()
        assert driver._conns == {}
        assert len(opened) == 3
        for conn in opened:
            with pytest.raises(sqlite3.ProgrammingError):
                conn.execute("SELECT 1")
        with pytest.raises(DriverUnavailableError):
            driver.job_get("x")
    finally:
        closed.set()
        for thread in threads:
            thread.join(10)


def test_a_finished_thread_releases_its_connection(driver: SqliteDriver) -> None:
    box: list[sqlite3.Connection] = []

    def use() -> None:
        with driver.transaction() as tx:
            conn = tx.connection
            box.append(conn)

    thread = threading.Thread(target=use)
    thread.start()
    thread.join(10)
    del thread
    gc.collect()
    with pytest.raises(sqlite3.ProgrammingError):
        box[0].execute("SELECT 1")


def test_wait_for_jobs_notices_a_commit_from_another_connection(driver: SqliteDriver) -> None:
    wake = threading.Event()
    driver.wait_for_jobs(0.01, wake)
    writer = sqlite3.connect(driver.path, isolation_level=None, check_same_thread=False)
    timer = threading.Timer(
        0.3,
        lambda: writer.execute(
            "INSERT INTO x_queues (name, paused, updated_at) VALUES ('q', 0, 0)"
        ),
    )
    try:
        start = time.monotonic()
        timer.start()
        driver.wait_for_jobs(10, wake)
        assert 0.25 <= time.monotonic() - start < 3
    finally:
        timer.join()
        writer.close()


# -- crashes -----------------------------------------------------------------------------------------

KILLED_WRITER = """
    import sys, time
    from datetime import timedelta
    from ultimat3.jobs.drivers.sqlite import SqliteDriver
    from ultimat3.jobs.ids import uuid7
    from ultimat3.jobs.records import ClaimParams, Cycle, NewJob

    driver = SqliteDriver(sys.argv[1])
    mode = sys.argv[2]
    if mode == "held":
        params = ClaimParams(("default",), 1, timedelta(seconds=1), "doomed")
        [job] = driver.job_cycle(Cycle(claim=params)).claimed
        print(job.id, flush=True)
        with driver.transaction() as tx:
            jobs = [NewJob(i, "n", "default", "{}", i, 3) for i in (uuid7() for _ in range(3000))]
            driver.job_insert_many(jobs, executor=tx)
            print("in-transaction", flush=True)
            time.sleep(60)
    else:
        print("writing", flush=True)
        while True:
            jobs = [NewJob(i, "n", "bulk", "x" * 2000, i, 3) for i in (uuid7() for _ in range(200))]
            driver.job_insert_many(jobs)
"""


def start_writer(path: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_WRITER), path, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def integrity(path: str) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def test_kill_9_inside_a_write_transaction_leaves_the_file_intact(driver: SqliteDriver) -> None:
    kept = new_job()
    driver.job_insert_many([kept])
    proc = start_writer(driver.path, "held")
    try:
        assert proc.stdout is not None
        claimed_id = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "in-transaction", proc.stderr
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert claimed_id == kept.id
    assert integrity(driver.path) == "ok"
    # The dead process's lock is gone with it: a short busy_timeout is enough to write at once.
    quick = SqliteDriver(driver.path, busy_timeout=1.0)
    try:
        assert quick.job_insert_many([extra := new_job()]) == [InsertResult(extra.id, False)]
        counts = quick.job_count(JobFilter())
        assert counts == {
            ("default", JobState.RUNNING): 1,
            ("default", JobState.AVAILABLE): 1,
        }, "the uncommitted batch of 3000 vanished"
        # The claimed job is rescued once its lease runs out, and claimable again.
        later = datetime.now(UTC) + timedelta(seconds=5)
        [expired] = quick.job_list_expired(ExpiredQuery(10), now=later)
        assert (expired.id, expired.worker_id, expired.attempt) == (kept.id, "doomed", 1)
        lost = AttemptError(expired.attempt, later, "worker_lost", "killed")
        assert quick.job_fail_many([Failure(expired.lease, lost, timedelta(0))], now=later) == {
            kept.id
        }
        again = claim(quick, ClaimParams(("default",), 10, LEASE, "w2", now=later))
        assert {job.id for job in again} == {kept.id, extra.id}
        assert next(job for job in again if job.id == kept.id).attempt == 2
    finally:
        quick.close()


@pytest.mark.parametrize("delay", [0.15, 0.35, 0.6])
def test_kill_9_during_a_stream_of_commits_leaves_the_file_intact(
    driver: SqliteDriver, delay: float
) -> None:
    proc = start_writer(driver.path, "stream")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing", proc.stderr
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert integrity(driver.path) == "ok"
    counts = driver.job_count(JobFilter())
    assert counts.get(("bulk", JobState.AVAILABLE), 0) % 200 == 0, "batches commit whole"
    assert driver.job_insert_many([job := new_job()]) == [InsertResult(job.id, False)]


def test_a_forked_child_opens_its_own_connections(driver: SqliteDriver) -> None:
    before = new_job()
    driver.job_insert_many([before])  # the parent's connection is open across the fork
    child_job = new_job()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            inserted = driver.job_insert_many([child_job])
            code = 0 if inserted == [InsertResult(child_job.id, False)] else 2
            driver.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert driver.job_get(child_job.id) is not None
    assert driver.job_insert_many([after := new_job()]) == [InsertResult(after.id, False)]
    assert integrity(driver.path) == "ok"


def test_a_republished_job_reports_deduped_even_with_its_own_id(driver: SqliteDriver) -> None:
    # The relay may publish the same staged job twice: same id, same key. The batch takes the
    # row-by-row path, which still tells the re-published job from the new ones.
    staged = new_job(key="order-7")
    assert driver.job_insert_many([staged], now=T0) == [InsertResult(staged.id, False)]
    fresh, twin = new_job(), new_job()
    batch = [
        fresh,
        staged,
        twin,
        NewJob(uuid7(), "unit.job", "default", "{}", twin.idempotency_key, 3),
    ]
    assert driver.job_insert_many(batch, now=T0) == [
        InsertResult(fresh.id, False),
        InsertResult(staged.id, True),
        InsertResult(twin.id, False),
        InsertResult(twin.id, True),
    ]
    assert driver.job_count(JobFilter()) == {("default", JobState.AVAILABLE): 3}


#: Inputs whose text JSON must carry exactly: quotes, a backslash, the six characters of an
#: escaped NUL as text, accents, an emoji, a line break.
TRICKY_INPUTS = [
    '{"s":"a \\"quoted\\" word"}',
    '{"s":"back\\\\slash"}',
    '{"s":"\\\\u0000 as text"}',
    '{"s":"é\\u00e9 ünï"}',
    '{"s":"🦊\\n"}',
]


def _sibling(job: NewJob, n: int) -> NewJob:
    """A job of ``job``'s enqueue (its template's fields) with its own id, input, key, trace
    context and limit key, as ``Builder`` makes them."""
    job_id = uuid7()
    return job._replace(
        id=job_id,
        input=TRICKY_INPUTS[n % len(TRICKY_INPUTS)],
        idempotency_key=job_id if n % 2 else f"key-{n}",  # keyless and keyed
        trace_context="00-trace-01" if n % 3 == 0 else None,
        limit_key=f"tenant-{n % 4}" if n % 5 == 0 else None,
    )


def _stored(path: str) -> dict[str, tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT id, input, idempotency_key, trace_context, limit_key, name, queue, state, "
            "priority, max_attempts, run_at, limit_max FROM x_jobs"
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def _kept_counts_agree(path: str) -> None:
    with closing(sqlite3.connect(path)) as conn:
        kept = {(q, s): n for q, s, n in conn.execute("SELECT * FROM x_job_counts") if n}
        grouped = "SELECT queue, state, count(*) FROM x_jobs GROUP BY queue, state"
        actual = {(q, s): n for q, s, n in conn.execute(grouped)}
    assert kept == actual


@pytest.mark.parametrize("text_limit", [None, 1_000])
def test_a_batch_of_one_enqueue_stores_each_jobs_own_fields_exactly(
    path: str, text_limit: int | None
) -> None:
    """The jobs of one enqueue go as one JSON array of their own fields (``job_insert_batch``),
    or as several past ``batch_text``: each stored input, key, trace context and limit key is
    the job's own, character for character, and the shared fields are the template's."""
    from ultimat3.jobs.drivers.sqlite.insert import batches as batches_of

    driver = SqliteDriver(path) if text_limit is None else SqliteDriver(path, batch_text=text_limit)
    driver.migrate()

    template = NewJob(
        "", "unit.batch", "batch", "", "", 7, run_at=T0 + timedelta(hours=1), priority=3,
        limit_max=2,
    )  # fmt: skip
    jobs = [_sibling(template, n) for n in range(60)]
    batches = batches_of(jobs, 0, text_limit or 4 << 20)
    assert batches is not None and (len(batches) == 1) == (text_limit is None)
    results = driver.job_insert_many(jobs, now=T0)
    assert results == [InsertResult(job.id, False) for job in jobs]
    stored = _stored(path)
    assert len(stored) == 60
    for job in jobs:
        assert stored[job.id] == (
            job.input, job.idempotency_key, job.trace_context, job.limit_key, "unit.batch",
            "batch", "scheduled", 3, 7, int((T0 + timedelta(hours=1)).timestamp() * 1e6), 2,
        )  # fmt: skip
    _kept_counts_agree(path)
    # The same batch again: every job deduped, by its key or its id, and nothing counted twice.
    assert driver.job_insert_many(jobs, now=T0) == [InsertResult(job.id, True) for job in jobs]
    _kept_counts_agree(path)
    driver.close()


def test_a_batch_whose_jobs_differ_in_a_shared_field_is_stored_row_by_row_as_given(
    driver: SqliteDriver, path: str
) -> None:
    """Jobs of several enqueues in one call (a relay's publish): no shared template, so the
    batch goes as rows; each keeps its own queue and name, and the counts follow."""
    from ultimat3.jobs.drivers.sqlite.insert import batches

    jobs = [new_job(queue=f"q{n % 3}") for n in range(9)]
    jobs.append(NewJob(uuid7(), "unit.other", "q0", "{}", "key-other", 3))
    assert batches(jobs, 0, 4 << 20) is None
    assert driver.job_insert_many(jobs, now=T0) == [InsertResult(j.id, False) for j in jobs]
    stored = _stored(path)
    assert {job_id: row[4:6] for job_id, row in stored.items()} == {
        job.id: (job.name, job.queue) for job in jobs
    }
    _kept_counts_agree(path)


def test_claiming_several_queues_merges_them_in_claim_order(driver: SqliteDriver) -> None:
    def job(queue: str, priority: int, seconds: int) -> NewJob:
        job_id = uuid7()
        return NewJob(
            job_id, "unit.job", queue, "{}", job_id, 3, T0 + timedelta(seconds=seconds), priority
        )

    a_old, a_new = job("a", 0, -20), job("a", 0, -10)
    b_high, b_mid = job("b", 5, -1), job("b", 1, -1)
    c_top = job("c", 9, -30)
    driver.job_insert_many([a_old, a_new, b_high, b_mid, c_top], now=T0)
    driver.queue_set_paused("c", True)
    params = ClaimParams(("a", "b", "c", "a"), 3, LEASE, "w", now=T0)
    claimed = claim(driver, params)
    assert [j.id for j in claimed] == [b_high.id, b_mid.id, a_old.id]
    assert {j.lease_token for j in claimed} != {None}
    assert [j.id for j in claim(driver, params)] == [a_new.id]
    assert claim(driver, params) == []
