"""Who holds SQLite's write lock, asked of SQLite's locks rather than guessed from "a
transaction is open":

- A deferred ``BEGIN`` (Python's, Django's) that has written nothing holds no lock: the first
  enqueue inside it migrates a fresh file on the library's connection, and joins it.
- A transaction that read the file before the tables existed is told why it cannot see them;
  one that wrote is refused in about half a second, not after the busy timeout.
- A write lock held by the application's own connection in this process (a SQLAlchemy
  session after ``flush()``, a ``sqlite3`` connection in a transaction) while an enqueue goes
  through the app's own connection, with no other thread running, is named in about half a
  second; one held by another process is waited for, and the error names that process; one
  held by another thread of this process is waited for (noted once in a WARNING), and named
  only if it lasts the whole busy timeout.

The bounds are loose on purpose (5 s against a busy timeout of 10 s): the diagnosis comes at
about 0.55 s, and a loaded machine must not make it look late.

The early diagnosis needs the waiting thread to be the process's only one
(``LockWatch.alone``). A daemon thread left by an earlier test in the same pytest run (a
pool's, a watchdog's) would turn it into the busy timeout, so the tests of its message and
timing give the driver a ``LockWatch`` whose ``alone`` is true (the ``alone`` fixture), and one
test runs the real check in a fresh process.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, ConfigurationError, DriverUnavailableError, job
from ultimat3.jobs.dialects.sqlite_locks import LockWatch
from ultimat3.jobs.drivers.sqlite import SqliteDriver

#: The lock's owner is read from Linux's /proc/locks; elsewhere such a wait lasts busy_timeout.
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the lock's owner is read from /proc/locks"
)

HELD_HERE = "this process holds the write lock on a connection of its own"


@job
def record(value: Any) -> None:
    pass


@pytest.fixture
def module(make_module: Callable[..., types.ModuleType]) -> types.ModuleType:
    return make_module("sqlite_locks_jobs", record=record)


@pytest.fixture
def alone() -> LockWatch:
    """The waiting thread counts as the process's only one, whatever threads earlier tests of
    this run left behind (the real check: ``test_the_early_diagnosis_in_a_process_of_one_thread``)."""
    return LockWatch(alone=lambda: True)


@pytest.fixture
def migrated(
    tmp_path: Path, module: types.ModuleType, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, App]]:
    """A job file migrated beforehand with a business table, and an App on it with a short
    busy timeout (a wait that should not happen fails the test quickly on the old code); its
    driver watches the lock with the test's ``alone`` when the test asks for it."""
    path = tmp_path / "jobs.sqlite3"
    watch = request.getfixturevalue("alone") if "alone" in request.fixturenames else None
    driver = SqliteDriver(path, busy_timeout=10.0, lock_watch=watch)
    app = App(driver=driver, modules=[module])
    app.open()
    with closing(sqlite3.connect(path, isolation_level=None)) as setup:
        setup.execute("CREATE TABLE orders (id integer)")
    yield path, app
    app.close()


def test_a_deferred_transaction_that_wrote_nothing_migrates_a_fresh_file(
    tmp_path: Path, module: types.ModuleType
) -> None:
    path = tmp_path / "jobs.sqlite3"
    app = App(f"sqlite:///{path}", modules=[module])
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")  # deferred, as Python's and Django's: no lock yet
        started = time.monotonic()
        with app.using(conn):
            record.enqueue({"order": 1})
        assert time.monotonic() - started < 5.0
        conn.execute("CREATE TABLE orders (id integer)")
        conn.execute("INSERT INTO orders VALUES (1)")
        conn.execute("COMMIT")
        assert app.count_jobs() == 1
        # And the job was part of the transaction: a rolled-back one leaves none.
        conn.execute("BEGIN")
        with app.using(conn):
            record.enqueue({"order": 2})
        conn.execute("ROLLBACK")
        assert app.count_jobs() == 1
    finally:
        conn.close()
        app.close()


def test_a_transaction_that_read_before_the_migration_is_told_why_it_cannot_see_it(
    tmp_path: Path, module: types.ModuleType
) -> None:
    path = tmp_path / "jobs.sqlite3"
    with closing(sqlite3.connect(path, isolation_level=None)) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE orders (id integer)")
    app = App(f"sqlite:///{path}", modules=[module])
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM orders").fetchone()  # its snapshot starts here
        with pytest.raises(ConfigurationError) as raised, app.using(conn):
            record.enqueue({})
        assert "snapshot" in raised.value.cause
        assert raised.value.fix.startswith("roll the transaction back and run it again")
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")  # run again: the tables exist now
        with app.using(conn):
            record.enqueue({})
        conn.execute("COMMIT")
        assert app.count_jobs() == 1
    finally:
        conn.close()
        app.close()


@linux_only
def test_a_transaction_that_wrote_is_refused_within_a_second(
    tmp_path: Path, module: types.ModuleType, alone: LockWatch
) -> None:
    path = tmp_path / "jobs.sqlite3"
    with closing(sqlite3.connect(path, isolation_level=None)) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE orders (id integer)")
    app = App(driver=SqliteDriver(path, busy_timeout=10.0, lock_watch=alone), modules=[module])
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO orders VALUES (1)")  # now it holds the write lock
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as raised, app.using(conn):
            record.enqueue({})
        assert time.monotonic() - started < 5.0
        assert "need migrating" in raised.value.cause
        assert "the transaction around this call, once it has written" in raised.value.cause
        assert "ultimat3-jobs migrate" in raised.value.fix
    finally:
        conn.close()
        app.close()


@linux_only
def test_a_transaction_that_read_a_new_file_is_told_it_keeps_it_from_being_set_up(
    tmp_path: Path, module: types.ModuleType, alone: LockWatch
) -> None:
    path = tmp_path / "jobs.sqlite3"
    app = App(driver=SqliteDriver(path, busy_timeout=10.0, lock_watch=alone), modules=[module])
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()  # a read lock, held
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as raised, app.using(conn):
            record.enqueue({})
        assert time.monotonic() - started < 5.0
        assert "is new, and setting it up (WAL mode) needs every other" in raised.value.cause
        assert "ultimat3-jobs migrate" in raised.value.fix
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        with app.using(conn):  # nothing read yet: set up and migrated on the app's connection
            record.enqueue({})
        conn.execute("COMMIT")
        assert app.count_jobs() == 1
    finally:
        conn.close()
        app.close()


@linux_only
def test_the_applications_own_lock_in_this_process_is_named_within_a_second(
    migrated: tuple[Path, App], alone: LockWatch
) -> None:
    path, app = migrated
    own = sqlite3.connect(path)  # Python's legacy mode: the INSERT opens a transaction
    try:
        own.execute("INSERT INTO orders VALUES (1)")  # holds the write lock, not joined
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as raised:
            record.enqueue({})  # through the app's own connection: would wait for `own`
        took = time.monotonic() - started
        assert took < 5.0, f"diagnosed after {took:.2f}s"
        assert raised.value.cause.startswith(HELD_HERE)
        assert raised.value.fix.startswith("enqueue through it with using(app, session)")
        own.rollback()
        record.enqueue({})  # once it is over, the enqueue goes through
        assert app.count_jobs() == 1
    finally:
        own.close()


#: Run in a fresh process, whose only thread is the one that waits: the real
#: ``LockWatch.alone``.
_ONE_THREAD = """
import sqlite3, sys, threading, time, types
from ultimat3.jobs import App, ConfigurationError, job
from ultimat3.jobs.drivers.sqlite import SqliteDriver

@job
def record(value):
    pass

module = types.ModuleType("one_thread_jobs")
module.record = record
sys.modules[module.__name__] = module
path = sys.argv[1]
app = App(driver=SqliteDriver(path, busy_timeout=10.0), modules=[module])
app.open()
setup = sqlite3.connect(path, isolation_level=None)
setup.execute("CREATE TABLE orders (id integer)")
setup.close()
own = sqlite3.connect(path)
own.execute("INSERT INTO orders VALUES (1)")
threads = threading.active_count()
started = time.monotonic()
try:
    record.enqueue({})
except ConfigurationError as exc:
    print(threads, round(time.monotonic() - started, 3), exc.cause, sep="\\n")
else:
    print(threads, "no error", sep="\\n")
"""


@linux_only
def test_the_early_diagnosis_in_a_process_of_one_thread(tmp_path: Path) -> None:
    """The real check that no other thread could release the lock (``LockWatch.alone``, which the
    other tests take as true): in a process of one thread, an enqueue that would wait for the
    application's own uncommitted write is named in about half a second."""
    path = tmp_path / "jobs.sqlite3"
    run = subprocess.run(
        [sys.executable, "-c", _ONE_THREAD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    threads, took, cause = run.stdout.split("\n", 2)
    assert threads == "1"
    assert float(took) < 5.0, f"diagnosed after {took}s (busy_timeout 10 s)"
    assert cause.startswith(HELD_HERE)


@linux_only
def test_a_sqlalchemy_session_after_flush_is_named_within_a_second(
    migrated: tuple[Path, App], alone: LockWatch
) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    path, _ = migrated
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        with Session(engine) as session, session.begin():
            session.execute(sqlalchemy.text("INSERT INTO orders VALUES (1)"))
            session.flush()
            started = time.monotonic()
            with pytest.raises(ConfigurationError) as raised:
                record.enqueue({})  # forgot using(app, session)
            assert time.monotonic() - started < 5.0
            assert raised.value.cause.startswith(HELD_HERE)
    finally:
        engine.dispose()


@linux_only
def test_a_lock_held_by_another_process_is_waited_for_and_names_it(
    migrated: tuple[Path, App],
) -> None:
    path, _ = migrated
    fast = App(driver=SqliteDriver(path, busy_timeout=1.0), modules=[])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(DriverUnavailableError) as raised:
            fast.driver.job_insert_many([_job()])
        assert time.monotonic() - started >= 1.0, "another process's lock is waited for"
        assert f"another writer (process {holder.pid})" in raised.value.cause
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
        holder.stdout.close()
        fast.close()


class _HeldHereNoted(logging.Handler):
    """Sets ``noted`` when the wait logs that the lock is held in this process."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.noted = threading.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "jobs.sqlite.held-here":
            self.records.append(record)
            self.noted.set()


@pytest.fixture
def held_here_log() -> Iterator[_HeldHereNoted]:
    handler = _HeldHereNoted()
    logger = logging.getLogger("ultimat3.jobs.dialects.sqlite")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@linux_only
def test_another_threads_transaction_in_this_process_is_waited_for_past_the_diagnosis(
    migrated: tuple[Path, App], held_here_log: _HeldHereNoted
) -> None:
    """Another thread of the app holds an ordinary write transaction on the job file, longer
    than the half second after which a lock held here is named: the enqueue is a wait that can
    still succeed, so it notes the lock once (a WARNING) and goes on waiting until the holder
    commits, here once that note is out."""
    path, app = migrated
    held = threading.Event()

    def transaction() -> None:
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            other.execute("INSERT INTO orders VALUES (1)")
            held.set()
            held_here_log.noted.wait(8)  # past the diagnosis, well within busy_timeout
            other.execute("COMMIT")

    thread = threading.Thread(target=transaction)
    thread.start()
    try:
        assert held.wait(5)
        record.enqueue({})
        assert app.count_jobs() == 1
        assert held_here_log.noted.is_set(), "the wait went on past the held-here look"
        [note] = held_here_log.records
        assert HELD_HERE in note.getMessage()
    finally:
        held_here_log.noted.set()
        thread.join()


@linux_only
def test_another_threads_lock_held_past_the_timeout_is_named_at_the_timeout(
    tmp_path: Path, module: types.ModuleType
) -> None:
    """The same, held for longer than ``busy_timeout``: the wait lasts the whole timeout (the
    holder might have committed), then names the lock held here rather than "busy"."""
    path = tmp_path / "jobs.sqlite3"
    app = App(driver=SqliteDriver(path, busy_timeout=1.0), modules=[module])
    app.open()
    held, done = threading.Event(), threading.Event()

    def transaction() -> None:
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            held.set()
            done.wait(10)
            other.execute("ROLLBACK")

    thread = threading.Thread(target=transaction)
    thread.start()
    try:
        assert held.wait(5)
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as raised:
            record.enqueue({})
        took = time.monotonic() - started
        assert took >= 1.0, f"gave up after {took:.2f}s, before busy_timeout"
        assert raised.value.cause.startswith(HELD_HERE)
    finally:
        done.set()
        thread.join()
        app.close()


def _job() -> Any:
    from ultimat3.jobs.records import NewJob

    return NewJob(id="j1", name="record", queue="default", input="{}", idempotency_key="j1",
                  max_attempts=1)  # fmt: skip


def test_a_store_dropped_without_close_is_no_longer_counted_as_the_librarys(
    tmp_path: Path,
) -> None:
    """The registry of the library's connections (``hold_own``) forgets a store collected
    without close(): its connection is closed then, and nothing scans it any longer."""
    import gc

    from ultimat3.jobs.dialects import sqlite_locks as dialect
    from ultimat3.jobs.outboxes.sqlite import SqliteOutboxStore

    path = tmp_path / "business.sqlite3"
    key = dialect.file_identity(str(path)).key

    def registered() -> int:
        with dialect._own_lock:
            return sum(1 for _, file, _, _ in dialect._own.values() if file == key)

    store = SqliteOutboxStore(path)
    store.migrate()
    key = dialect.file_identity(str(path)).key  # the file exists now: its device and inode
    assert registered() == 1
    del store
    gc.collect()
    assert registered() == 0


def test_a_disowned_connection_is_no_longer_kept_by_its_owners_finalizer(
    tmp_path: Path,
) -> None:
    """``disown`` (a connection closed or dropped for a new one) detaches the finalizer that
    ``hold_own`` left on the owner, so nothing of the library keeps the old connection while
    the owner lives: noted twice (a reconnect on the same slot), disowned once, it is held by
    the test alone, as a connection the library never saw is."""
    from ultimat3.jobs.dialects import sqlite_locks as dialect

    path = tmp_path / "business.sqlite3"

    class Owner:
        pass

    owner = Owner()
    never_noted = sqlite3.connect(path)
    conn = sqlite3.connect(path)
    try:
        dialect.hold_own(conn, str(path), owner)
        dialect.hold_own(conn, str(path), owner)
        dialect.disown(conn)
        assert sys.getrefcount(conn) == sys.getrefcount(never_noted)
        assert owner is not None  # alive throughout
    finally:
        conn.close()
        never_noted.close()
