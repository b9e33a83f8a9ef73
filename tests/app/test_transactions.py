"""The one rule of the enqueue path, in every shape a real application takes: an enqueue inside
a transaction joins it or raises; it never commits on its own, and it never waits for the
caller's own lock.

- Two App objects on one database (a web app and a management command) join each other's
  transactions: joining is decided by database identity, not by driver object.
- A fresh App whose first use is inside the caller's write transaction opens with a read.
- A transaction the app cannot join (another database, no outbox) is an error with a fix.
- ``app.transaction()`` / ``app.using()`` make their app the current one.
- A ``delay`` counts on the database's clock (PostgreSQL), not the enqueuing host's.
- Many threads through two Apps, half rolled back: jobs == committed business rows, exactly.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sqlite3
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, ConfigurationError, job
from ultimat3.jobs.clock import SystemClock
from ultimat3.jobs.drivers import open_driver
from ultimat3.jobs.records import JobState


@job
def in_a(value: Any) -> None:
    pass


@job
def in_b(value: Any) -> None:
    pass


def _pg_url(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return _pg_url(request.getfixturevalue("pg_dsn"))
    return f"sqlite:///{tmp_path / 'jobs.sqlite3'}"


@pytest.fixture
def two_apps(
    db_url: str, make_module: Callable[..., types.ModuleType]
) -> Iterator[tuple[App, App]]:
    a = App(db_url, modules=[make_module("tx_jobs_a", in_a=in_a)])
    b = App(db_url, modules=[make_module("tx_jobs_b", in_b=in_b)])
    a.open()
    b.open()
    yield a, b
    a.close()
    b.close()


def _business_table(app: App) -> None:
    with app.transaction() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id integer)")


def test_two_apps_on_one_database_join_each_others_transactions(two_apps: tuple[App, App]) -> None:
    a, b = two_apps
    _business_table(a)
    started = time.monotonic()
    with pytest.raises(RuntimeError), a.transaction() as conn:
        conn.execute("INSERT INTO orders VALUES (1)")
        in_b.enqueue({"n": 1})  # through App B, inside App A's transaction
        raise RuntimeError("the request fails")
    assert b.count_jobs() == 0, "B's job rolled back with A's transaction"
    with a.transaction() as conn:
        conn.execute("INSERT INTO orders VALUES (2)")
        result = in_b.enqueue({"n": 2})
        assert b.count_jobs() == 0 or b.driver.name == "sqlite"  # not visible outside yet
    assert [j.id for j in b.list_jobs()] == [result.id]
    assert time.monotonic() - started < 2.0, "nothing waited for a lock"


def _dicts(cursor: Any, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


def test_a_connection_that_makes_dicts_of_rows_is_joined_as_any_other(
    db_url: str, request: pytest.FixtureRequest, make_module: Any
) -> None:
    """Apps set a row factory on their connections (psycopg's ``dict_row``, a sqlite3
    factory, sqlite3's ``text_factory``): the library's statements on it still read plain
    rows, and the caller's rows are the caller's again afterwards."""
    app = App(db_url, modules=[make_module("tx_dict_rows", in_a=in_a)])
    app.open()
    conn: Any
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url[len("sqlite:///") :])
        conn.row_factory = _dicts
        conn.text_factory = bytes
    else:
        import psycopg
        from psycopg.rows import dict_row

        conn = psycopg.connect(request.getfixturevalue("pg_dsn"), row_factory=dict_row)
    try:
        with app.using(conn):
            first = in_a.enqueue({"n": 0}, idempotency_key="k")
            again = in_a.enqueue({"n": 0}, idempotency_key="k")
            many = app.enqueue_many(in_a, [{"n": n} for n in range(1, 251)])  # COPY on PG
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        conn.commit()
    finally:
        conn.close()
        app.close()
    assert again.deduped and again.id == first.id
    reopened = App(db_url, modules=[make_module("tx_dict_rows_check", in_a=in_a)])
    try:
        assert reopened.count_jobs() == 251 == 1 + len(many)
    finally:
        reopened.close()


@pytest.mark.parametrize("declared", ["TEXT", "INTEGER"])
def test_a_sqlite3_connection_that_converts_our_column_types_is_refused_with_a_fix(
    tmp_path: Path, make_module: Any, monkeypatch: pytest.MonkeyPatch, declared: str
) -> None:
    """A converter registered for ``TEXT`` or ``INTEGER`` applies, on a connection made with
    ``detect_types=PARSE_DECLTYPES``, to the job tables' columns too: a deduped enqueue would
    hand back a converted job id. Such a connection is refused with a fix, and nothing is
    written; one whose converters are for other types (Django's: ``timestamp``, ``bool``...)
    is joined, and reads our ids unchanged."""
    path = tmp_path / "jobs.sqlite3"
    app = App(f"sqlite:///{path}", modules=[make_module("tx_converted", in_a=in_a)])
    app.open()
    # monkeypatch puts sqlite3's process-wide converters back as they were
    monkeypatch.setitem(sqlite3.converters, "JSON", lambda raw: ("json", raw))
    with closing(sqlite3.connect(path, detect_types=sqlite3.PARSE_DECLTYPES)) as conn:
        with app.using(conn):
            first = in_a.enqueue({"n": 1}, idempotency_key="k")
            again = in_a.enqueue({"n": 1}, idempotency_key="k")
        conn.commit()
        assert again.deduped and again.id == first.id and isinstance(again.id, str)
        monkeypatch.setitem(sqlite3.converters, declared, lambda raw: ("converted", raw))
        with pytest.raises(ConfigurationError) as refused, app.using(conn):
            in_a.enqueue({"n": 2})
        conn.commit()
    message = str(refused.value)
    assert f"converter registered for {declared!r}" in message
    assert "detect_types=sqlite3.PARSE_DECLTYPES" in message
    assert "register the converter under a type name of your own" in message
    assert app.count_jobs() == 1
    app.close()


def _connection_of_its_own_kind(dsn: str, kind: str) -> Any:
    """A psycopg connection as some apps make them: another cursor class, or loaders and
    dumpers of its own that reshape text and timestamps (for the caller's rows only)."""
    import psycopg
    from psycopg.types.string import StrDumperUnknown, TextLoader

    if kind == "raw cursors":  # $1 placeholders
        return psycopg.connect(dsn, cursor_factory=psycopg.RawCursor)
    if kind == "client cursors":  # parameters bound in the client (Django's default)
        return psycopg.connect(dsn, cursor_factory=psycopg.ClientCursor)
    if kind == "prepared at once":  # every statement, from its first run
        return psycopg.connect(dsn, prepare_threshold=0)
    if kind == "never prepared":  # as behind a transaction-mode pooler
        return psycopg.connect(dsn, prepare_threshold=None)

    class Shouting(TextLoader):
        def load(self, data: Any) -> str:
            return bytes(data).decode().upper()

    class Stamp(TextLoader):  # timestamps as their text
        pass

    class ShoutingDumper(StrDumperUnknown):
        def dump(self, obj: str) -> bytes:
            return obj.upper().encode()

    conn = psycopg.connect(dsn)
    conn.adapters.register_loader("text", Shouting)
    conn.adapters.register_loader("timestamptz", Stamp)
    conn.adapters.register_dumper(str, ShoutingDumper)
    return conn


@pytest.mark.parametrize(
    "kind", ["raw cursors", "client cursors", "adapters", "prepared at once", "never prepared"]
)
def test_a_psycopg_connection_of_its_own_kind_is_joined_with_our_statements_unchanged(
    pg_dsn: str, make_module: Any, kind: str
) -> None:
    """The library's statements on a caller's connection bind ``%s``, and read and send
    through psycopg's own adapters: a ``RawCursor`` connection is joined, and loaders or
    dumpers the connection registered for itself reshape neither a job's id, its input, nor
    the clock a big batch reads (COPY); the caller's statements keep theirs."""
    import psycopg

    app = App(_pg_url(pg_dsn), modules=[make_module("tx_own_kind", in_a=in_a)])
    app.open()
    conn = _connection_of_its_own_kind(pg_dsn, kind)
    try:
        with app.using(conn):
            first = in_a.enqueue({"n": "zero"}, idempotency_key="k")
            again = in_a.enqueue({"n": "zero"}, idempotency_key="k")
            many = app.enqueue_many(in_a, [{"n": n} for n in range(1, 251)])  # COPY
        if kind == "raw cursors":
            assert conn.execute("SELECT $1::int", [7]).fetchone() == (7,)
        elif kind == "adapters":
            assert conn.execute("SELECT %s::text", ["a"]).fetchone() == ("A",)
            assert isinstance(conn.execute("SELECT now()").fetchone()[0], str)
        assert isinstance(conn, psycopg.Connection)
        conn.commit()
    finally:
        conn.close()
    try:
        assert again.deduped and again.id == first.id
        assert app.get_job(first.id).input == '{"n":"zero"}'
        assert app.count_jobs() == 251 == 1 + len({r.id for r in many})
        assert app.get_job(many[-1].id).input == '{"n":250}'
    finally:
        app.close()


def test_a_transaction_on_another_database_is_refused_not_committed_alone(
    tmp_path: Path, make_module: Callable[..., types.ModuleType]
) -> None:
    a = App(f"sqlite:///{tmp_path / 'a.sqlite3'}", modules=[make_module("tx_a", in_a=in_a)])
    b = App(f"sqlite:///{tmp_path / 'b.sqlite3'}", modules=[make_module("tx_b", in_b=in_b)])
    try:
        b.open()
        with a.transaction(), pytest.raises(ConfigurationError) as raised:
            in_b.enqueue({})
        assert "neither this app's job database" in raised.value.cause
        assert "outbox" in raised.value.fix
        assert b.count_jobs() == 0
    finally:
        a.close()
        b.close()


def test_an_aborted_or_closed_connection_cannot_be_joined(tmp_path: Path, make_module: Any) -> None:
    path = tmp_path / "jobs.sqlite3"
    app = App(f"sqlite:///{path}", modules=[make_module("tx_closed", in_a=in_a)])
    app.open()
    try:
        conn = sqlite3.connect(path)
        conn.close()
        with pytest.raises(ConfigurationError, match="cannot inspect"), app.using(conn):
            pass
    finally:
        app.close()


def test_a_connection_is_identified_on_its_first_join_and_checked_on_every_join(
    tmp_path: Path, make_module: Any
) -> None:
    """Which file a caller's connection opens is asked once (its first ``using()``); what
    can change between transactions is still checked before each write: an enqueue joined
    from another thread and one after ``close()`` are refused as before."""
    path = tmp_path / "jobs.sqlite3"
    app = App(f"sqlite:///{path}", modules=[make_module("tx_known", in_a=in_a)])
    app.open()
    statements: list[str] = []
    try:
        conn = sqlite3.connect(path)
        conn.set_trace_callback(statements.append)
        for n in range(3):
            with app.using(conn):
                in_a.enqueue({"n": n})
            conn.commit()
        assert sum("database_list" in s for s in statements) == 1
        assert app.count_jobs() == 3

        refused: list[BaseException] = []

        def elsewhere() -> None:
            try:
                with app.using(conn):
                    in_a.enqueue({"n": "thread"})
            except ConfigurationError as exc:
                refused.append(exc)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert len(refused) == 1 and "cannot inspect" in str(refused[0])
        conn.close()
        with pytest.raises(ConfigurationError, match="cannot inspect"), app.using(conn):
            in_a.enqueue({"n": "closed"})
        assert app.count_jobs() == 3
    finally:
        app.close()


def test_a_using_block_cannot_be_entered_twice_at_once(tmp_path: Path, make_module: Any) -> None:
    """The block sets the current transaction and app, and puts back what it found: entered
    again while open, it would lose what to put back, so it refuses."""
    path = tmp_path / "jobs.sqlite3"
    app = App(f"sqlite:///{path}", modules=[make_module("tx_twice", in_a=in_a)])
    app.open()
    try:
        with closing(sqlite3.connect(path)) as conn:
            block = app.using(conn)
            with block, pytest.raises(RuntimeError, match="entered twice"):
                block.__enter__()
            with app.using(conn):
                in_a.enqueue({"n": 1})
            conn.commit()
        assert app.count_jobs() == 1
    finally:
        app.close()


def test_a_closed_sqlite_connection_is_forgotten_so_its_id_can_name_another(
    tmp_path: Path,
) -> None:
    """A ``sqlite3.Connection`` takes no weak reference, so the database it reaches is kept
    by ``id()``: the entry ends when the connection is closed or freed, before another
    connection can be given the same id."""
    from ultimat3.jobs.driver import DatabaseId
    from ultimat3.jobs.outbox import KnownDatabases

    known = KnownDatabases()
    database = DatabaseId("sqlite", ("test",))
    closed = sqlite3.connect(tmp_path / "a.sqlite3")
    known.remember(closed, database)
    assert known.get(closed) == database
    closed.close()
    assert known.get(closed) is None
    freed = sqlite3.connect(tmp_path / "b.sqlite3")
    known.remember(freed, database)
    with warnings.catch_warnings():  # freed unclosed on purpose (Python 3.13 warns of it)
        warnings.simplefilter("ignore", ResourceWarning)
        del freed
        gc.collect()
    assert known._by_id == {}


@pytest.mark.postgres
def test_an_aborted_postgres_transaction_cannot_be_joined(pg_dsn: str, make_module: Any) -> None:
    import psycopg

    app = App(_pg_url(pg_dsn), modules=[make_module("tx_aborted", in_a=in_a)])
    try:
        with psycopg.connect(pg_dsn) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")
            with pytest.raises(ConfigurationError, match="rolled back") as raised, app.using(conn):
                in_a.enqueue({})
            assert "new one" in raised.value.fix
    finally:
        app.close()


@pytest.mark.postgres
def test_a_postgres_transaction_that_fails_inside_using_refuses_the_next_enqueue(
    pg_dsn: str, make_module: Any
) -> None:
    """Joined when it was fine, the transaction fails before the enqueue (or its connection
    is closed): the enqueue says so, rather than psycopg's error about the statement."""
    import psycopg

    app = App(_pg_url(pg_dsn), modules=[make_module("tx_fails_inside", in_a=in_a)])
    try:
        with psycopg.connect(pg_dsn) as conn, app.using(conn):
            in_a.enqueue({})
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")
            with pytest.raises(ConfigurationError, match="rolled back"):
                in_a.enqueue({})
            conn.rollback()
        with psycopg.connect(pg_dsn) as conn, app.using(conn):
            conn.close()
            with pytest.raises(ConfigurationError, match="closed"):
                in_a.enqueue({})
        assert app.count_jobs() == 0
    finally:
        app.close()


def test_a_fresh_app_opens_inside_the_callers_write_transaction_without_waiting(
    tmp_path: Path, make_module: Callable[..., types.ModuleType]
) -> None:
    """Django's shape: the App is built at import time, the first request writes inside
    ``atomic()`` (holding SQLite's write lock) and then enqueues."""
    path = tmp_path / "jobs.sqlite3"
    migrated = App(f"sqlite:///{path}")
    migrated.open()  # migrated once, as `ultimat3-jobs migrate` would
    migrated.close()
    fresh = App(f"sqlite:///{path}", modules=[make_module("tx_fresh", in_a=in_a)])
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE orders (id integer)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders VALUES (1)")  # the caller holds the write lock
        started = time.monotonic()
        with fresh.using(conn):
            in_a.enqueue({"order": 1})
        assert time.monotonic() - started < 1.0
        conn.execute("COMMIT")
        assert fresh.count_jobs() == 1
    finally:
        conn.close()
        fresh.close()


@pytest.mark.parametrize("file", ["an older schema", "a new file"])
def test_a_stale_schema_inside_the_callers_write_transaction_raises_at_once(
    file: str, tmp_path: Path, make_module: Callable[..., types.ModuleType]
) -> None:
    path = tmp_path / "jobs.sqlite3"
    if file == "an older schema":  # as after an upgrade that added migration 2
        older = App(f"sqlite:///{path}")
        older.open()
        older.close()
        with closing(sqlite3.connect(path, isolation_level=None)) as old:
            old.execute("DROP TABLE x_schedules")
            old.execute("DROP TABLE x_leaders")
            old.execute("DELETE FROM x_migrations WHERE version = 2")
    fresh = App(f"sqlite:///{path}", modules=[make_module("tx_stale", in_a=in_a)])
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE orders (id integer)")
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as raised, fresh.using(conn):
            in_a.enqueue({})
        assert time.monotonic() - started < 1.0, "no wait for the busy timeout"
        assert "ultimat3-jobs migrate" in raised.value.fix
        assert "app.open()" in raised.value.fix
        conn.execute("ROLLBACK")
        fresh.open()  # once the caller's transaction is over, it migrates
        assert fresh.driver.schema_current()
    finally:
        conn.close()
        fresh.close()


def test_a_write_outside_the_callers_transaction_on_the_same_file_fails_fast(
    two_apps: tuple[App, App],
) -> None:
    a, b = two_apps
    if b.driver.name != "sqlite":
        pytest.skip("only SQLite has one write lock per file")
    job_id = in_b.enqueue({}).id
    with a.transaction():
        started = time.monotonic()
        with pytest.raises(ConfigurationError, match="wait for your own open transaction"):
            b.cancel_job(job_id)
        assert time.monotonic() - started < 1.0


def test_the_app_of_a_transaction_is_current_inside_it(
    db_url: str, make_module: Callable[..., types.ModuleType]
) -> None:
    shared = make_module("tx_shared", in_a=in_a)
    a, b = App(db_url, modules=[shared]), App(db_url, modules=[shared])
    try:
        with pytest.raises(ConfigurationError, match="none is current"):
            in_a.enqueue({})
        with a.transaction():
            in_a.enqueue({"via": "a"})
        raw = a.driver
        if raw.name == "sqlite":
            conn = sqlite3.connect(raw.display_url[len("sqlite:///") :], isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            with b.using(conn):
                in_a.enqueue({"via": "b"})
            conn.execute("COMMIT")
            conn.close()
        assert a.count_jobs() == (2 if raw.name == "sqlite" else 1)
    finally:
        a.close()
        b.close()


class _HostBehind:
    """A host whose clock runs two hours behind, with the database's clock in charge."""

    def __init__(self) -> None:
        self._system = SystemClock()

    def now(self) -> datetime:
        return self._system.now() - timedelta(hours=2)

    def pinned(self) -> datetime | None:
        return None

    def monotonic(self) -> float:
        return self._system.monotonic()

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> bool:
        return self._system.sleep(seconds, wake)

    def stepped_at(self) -> float:
        return self._system.stepped_at()


@pytest.mark.postgres
def test_a_delay_counts_on_the_database_clock(pg_dsn: str, make_module: Any) -> None:
    app = App(_pg_url(pg_dsn), modules=[make_module("tx_delay", in_a=in_a)], clock=_HostBehind())
    try:
        made = in_a.enqueue({}, delay="1h")
        stored = app.get_job(made.id)
        assert stored.state is JobState.SCHEDULED
        assert abs(stored.run_at - (stored.created_at + timedelta(hours=1))) < timedelta(seconds=1)
        explicit = datetime(2030, 1, 1, tzinfo=UTC)
        assert app.get_job(in_a.enqueue({}, run_at=explicit).id).run_at == explicit
    finally:
        app.close()


def test_many_threads_through_two_apps_commit_exactly_the_committed_jobs(
    two_apps: tuple[App, App],
) -> None:
    a, b = two_apps
    _business_table(a)
    rng = random.Random(9)
    plans = [[rng.random() < 0.5 for _ in range(50)] for _ in range(8)]
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            for n, commit in enumerate(plans[index]):
                app = a if (index + n) % 2 else b
                try:
                    with app.transaction() as conn:
                        conn.execute("INSERT INTO orders VALUES (?)".replace("?", str(n)))
                        (in_a if n % 2 else in_b).enqueue({"t": index, "n": n})
                        if not commit:
                            raise KeyError("roll back")
                except KeyError:
                    pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    with a.transaction() as conn:
        rows = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
    committed = sum(sum(plan) for plan in plans)
    assert rows == committed
    assert a.count_jobs() == committed


@pytest.mark.postgres
async def test_gathered_async_enqueues_on_one_connection_commit_or_roll_back_together(
    pg_dsn: str, make_module: Any
) -> None:
    import psycopg

    from ultimat3.jobs.integrations.psycopg import using

    app = App(_pg_url(pg_dsn), modules=[make_module("tx_async", in_a=in_a)])
    app.open()
    try:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            async with conn.transaction(), using(app, conn):
                await asyncio.gather(*(app.enqueue_async(in_a, {"n": n}) for n in range(50)))
            assert app.count_jobs() == 50
            with pytest.raises(RuntimeError):
                async with conn.transaction(), using(app, conn):
                    await asyncio.gather(*(in_a.enqueue_async({"n": n}) for n in range(50)))
                    raise RuntimeError("roll back")
            assert app.count_jobs() == 50
    finally:
        app.close()


@pytest.mark.postgres
def test_a_url_password_with_special_characters_reaches_libpq(pg_dsn: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_dsn)
    secret = "p&q=r%@x"
    encoded = "p%26q%3Dr%25%40x"
    url = (
        f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
        f"?password={encoded}&application_name=u3j%20test"
    )
    driver = open_driver(url)
    try:
        given = conninfo_to_dict(driver._dsn)  # type: ignore[attr-defined]
        assert given["password"] == secret
        assert given["application_name"] == "u3j test"
        assert secret not in driver.display_url
        driver.migrate()
    finally:
        driver.close()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("query", "listen"),
    [
        ("", True),
        ("?pooler=transaction", False),
        ("?listen=false", False),
        ("?pooler=session", True),
    ],
)
def test_the_pooler_mode_and_pool_size_come_from_the_url(
    pg_dsn: str, query: str, listen: bool
) -> None:
    joiner = "&" if "?" in query else "?"
    driver = open_driver(_pg_url(pg_dsn) + query + joiner + "pool_max=3")
    try:
        assert driver._listen is listen  # type: ignore[attr-defined]
        assert driver._pool_max == 3  # type: ignore[attr-defined]
    finally:
        driver.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?pooler=bouncy", "not a pooler mode"),
        ("?pooler=transaction&listen=true", "cannot work"),
        ("?listen=maybe", "not true or false"),
        ("?pool_max=lots", "not a whole number"),
    ],
)
def test_bad_postgres_url_options_are_explained(query: str, message: str) -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(ConfigurationError, match=message):
        open_driver("postgresql://nobody@127.0.0.1:1/none" + query)
