"""The PostgreSQL half of ``bench/run.py``: a throwaway cluster (fsync on), bare-SQL baselines
on the library's own table, then the same library measures as for SQLite; with
``pgbouncer=True`` the library measures once more, on a second database of the same cluster,
through PgBouncer in transaction mode (``?pooler=transaction``)."""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgcluster import Bouncer, Cluster
from ultimat3.jobs.drivers.postgres import PostgresDriver
from ultimat3.jobs.ids import token, uuid7

COLUMNS = (
    "id, name, queue, input, idempotency_key, priority, state, max_attempts, run_at, created_at"
)


def _pcts(values: list[float]) -> str:
    from run import pct

    return "/".join(f"{pct(values, p):.2f}" for p in (50, 95, 99))


def _url(dsn: str) -> str:
    p = conninfo_to_dict(dsn)
    return f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"


#: The values of one due job (``_row``), its times the database's clock.
ROW_VALUES = "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,now(),now())"


def _row(queue: str = "bare", input: str = '{"n":1}') -> tuple[Any, ...]:
    i = uuid7()
    return (i, "bench.bare", queue, input, i, 0, "available", 3)


def bare_insert_notify_step(conn: psycopg.Connection[Any], table: str) -> Callable[[int], None]:
    """One bare single enqueue on an autocommit connection: INSERT + NOTIFY + commit, one
    statement (``run.interleaved_rates`` runs it in turns with the library's)."""
    sql = (
        f"WITH i AS (INSERT INTO {table} ({COLUMNS}) {ROW_VALUES} "
        "RETURNING id) SELECT id, pg_notify('bench', '') FROM i"
    )

    def step(i: int) -> None:
        conn.execute(sql, _row()).fetchone()

    return step


def bare_multirow(conn: psycopg.Connection[Any], table: str, n: int) -> float:
    rows = [_row() for _ in range(n)]
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} ({COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,now(),now())", rows
        )
    return n / (time.perf_counter() - started)


def bare_copy(conn: psycopg.Connection[Any], table: str, n: int) -> float:
    rows = [(*_row(), "2026-01-01", "2026-01-01") for _ in range(n)]
    started = time.perf_counter()
    with (
        conn.transaction(),
        conn.cursor() as cur,
        cur.copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row(row)
    return n / (time.perf_counter() - started)


def bare_claim(table: str, queue: str, returning: str) -> str:
    """The bare claim of up to 10 jobs of ``queue`` (``SKIP LOCKED``, one statement), its lease
    token the one parameter; it returns ``returning`` of each claimed row."""
    return (
        # limit_key IS NULL: the claim index holds jobs without a concurrency limit only
        # (migration 6), as the library's own claim of such jobs says.
        f"WITH c AS (SELECT id FROM {table} WHERE state = 'available' AND queue = '{queue}' "
        "AND limit_key IS NULL "
        "ORDER BY priority DESC, run_at, id LIMIT 10 FOR UPDATE SKIP LOCKED) "
        f"UPDATE {table} j SET state = 'running', lease_token = %s, attempt = attempt + 1, "
        "lease_expires_at = now() + interval '30 seconds' "
        f"FROM c WHERE j.id = c.id RETURNING {returning}"
    )


def bare_claim_loop(conn: psycopg.Connection[Any], table: str) -> float:
    """Jobs per second of the bare claim-10/ack-10 loop on ``conn`` until queue ``bare`` is
    empty."""
    started = time.perf_counter()
    done = bare_claim_drain(conn, table)
    return done / (time.perf_counter() - started)


def bare_claim_drain(conn: psycopg.Connection[Any], table: str) -> int:
    """Claim 10 of queue ``bare`` (``SKIP LOCKED``), complete them, again until none is left;
    how many it completed."""
    claim = bare_claim(table, "bare", "j.id")
    ack = (
        f"UPDATE {table} SET state = 'completed', finished_at = now(), lease_token = NULL, "
        "lease_expires_at = NULL WHERE id = ANY(%s) AND lease_token = %s"
    )
    done = 0
    while True:
        tok = token()
        ids = [r[0] for r in conn.execute(claim, (tok,)).fetchall()]
        if not ids:
            return done
        conn.execute(ack, (ids, tok))
        done += len(ids)


def bare_claim_processes(dsn: str, table: str, processes: int) -> float:
    """Jobs per second of ``processes`` processes running the bare loop at once on one queue,
    from their common start to the last one's end: the floor a worker pool of as many
    processes is measured against (the same machine, the same contention on the rows)."""
    start_at = time.time() + 5.0  # each process connects first, then they start together
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        ran = list(
            pool.map(_bare_drainer, [dsn] * processes, [table] * processes, [start_at] * processes)
        )
    if any(late for _, _, late in ran):
        raise RuntimeError("a bare-loop process started late: the machine is too slow for 5 s")
    return sum(done for done, _, _ in ran) / (max(end for _, end, _ in ran) - start_at)


def _bare_drainer(dsn: str, table: str, start_at: float) -> tuple[int, float, bool]:
    """One process of ``bare_claim_processes``: (jobs, when it ended, whether it was late)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        late = time.time() > start_at
        time.sleep(max(0.0, start_at - time.time()))
        done = bare_claim_drain(conn, table)
        return done, time.time(), late


def bare_notify_latency(dsn: str, samples: int) -> list[float]:
    listener = psycopg.connect(dsn, autocommit=True)
    sender = psycopg.connect(dsn, autocommit=True)
    listener.execute("LISTEN bench_latency")
    seen: list[float] = []
    for _ in range(samples):
        sent: list[float] = []

        def send(sent: list[float] = sent) -> None:
            time.sleep(0.005)
            sent.append(time.perf_counter())
            sender.execute("NOTIFY bench_latency")

        t = threading.Thread(target=send)
        t.start()
        for _ in listener.notifies(timeout=2, stop_after=1):
            pass
        seen.append(time.perf_counter() - sent[0])
        t.join()
    listener.close()
    sender.close()
    return seen


#: What the bare claims of the latency loops return: when the job was enqueued.
BARE_STARTED = "(j.input->>'t')::float8"
BARE_CONSUMER = """
import sys, time, psycopg
dsn, claim, out = sys.argv[1:4]
listener = psycopg.connect(dsn, autocommit=True)
worker = psycopg.connect(dsn, autocommit=True)
worker.execute("SET synchronous_commit = off")  # as the library's claim-only turn
listener.execute("LISTEN bare_latency")
print("ready", flush=True)
with open(out, "a") as f:
    while True:
        for n in listener.notifies(timeout=1.0, stop_after=1):
            if n.payload == "stop":
                sys.exit(0)
        for (sent,) in worker.execute(claim, ("t",)).fetchall():
            f.write(f"{time.time() - sent:.6f}\\n")
        f.flush()
"""


def bare_latency(
    dsn: str, table: str, tmp: Path, samples: int, idle: int = 0
) -> tuple[list[float], list[float]]:
    """Enqueue-to-start of the bare loop, seconds: one-row INSERT whose statement NOTIFYs,
    autocommit, at 50 a second; a consumer in its own process LISTENs and claims with the
    bare claim statement (its commit not flushed, as the library's claim-only turn), and
    records when each row came back to it. Then ``idle`` more, each the first after 5 s with
    nothing sent, as the library's "first job after 5 s idle". The library's figures are
    measured the same way. Returns (steady, after idle)."""
    import subprocess
    import sys

    out = tmp / "bare-latency.txt"
    consumer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            BARE_CONSUMER,
            dsn,
            bare_claim(table, "barelat", BARE_STARTED),
            str(out),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert consumer.stdout is not None
        consumer.stdout.readline()  # ready: it listens
        insert = (
            f"WITH i AS (INSERT INTO {table} ({COLUMNS}) "
            "VALUES (%s,'bench.bare','barelat',%s,%s,0,'available',3,now(),now()) RETURNING queue) "
            "SELECT pg_notify('bare_latency', queue) FROM i"
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            for k in range(samples + idle):
                if k >= samples:
                    time.sleep(5)
                i = uuid7()
                conn.execute(insert, (i, f'{{"t": {time.time()!r}}}', i))
                time.sleep(1 / 50 if k < samples else 0.5)
            time.sleep(0.5)
            conn.execute("NOTIFY bare_latency, 'stop'")
        consumer.wait(timeout=10)
    finally:
        consumer.kill()
    seen = [float(x) for x in out.read_text().split()]
    return seen[: len(seen) - idle], seen[len(seen) - idle :]


def bench_database(cluster: Cluster, name: str = "bench") -> str:
    """A fresh database (``bench``) on the throwaway cluster, with the library's schema; its DSN."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = str(cluster.dsn(name))
    driver = PostgresDriver(dsn)
    driver.migrate()
    driver.close()
    return dsn


def bench_postgres(
    quick: bool, table_cls: Any, measure_library: Callable[..., None], *, pgbouncer: bool = False
) -> None:
    table = table_cls("PostgreSQL (throwaway cluster, fsync on, default settings)")
    table.header()
    tmp = Path(tempfile.mkdtemp(prefix="u3bench-pg-"))
    cluster = Cluster.create()
    try:
        dsn = bench_database(cluster)
        jobs_table = '"ultimat3_jobs".x_jobs'
        with psycopg.connect(dsn, autocommit=True) as conn:
            multi = bare_multirow(conn, jobs_table, 20_000 if quick else 50_000)
            copy = bare_copy(conn, jobs_table, 50_000 if quick else 200_000)
            claim = bare_claim_loop(conn, jobs_table)
        notify = [x * 1000 for x in bare_notify_latency(dsn, 30)]
        steady, after_idle = bare_latency(
            dsn, jobs_table, tmp, 250 if quick else 500, idle=3 if quick else 5
        )
        lat = [x * 1000 for x in steady]
        idle_ms = [x * 1000 for x in after_idle]
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A fresh table for the library, as each bare loop had one: a DELETE would leave
            # every bare row dead in the heap and the indexes until autovacuum came by.
            conn.execute(f"TRUNCATE {jobs_table}")
        print(
            f"  (bare: multi-row INSERT {multi:,.0f} rows/s, COPY {copy:,.0f} rows/s)", flush=True
        )
        single = psycopg.connect(dsn, autocommit=True)
        baselines = {
            "single": [("INSERT + NOTIFY", bare_insert_notify_step(single, jobs_table))],
            "bulk": copy,
            "bulk_label": f"COPY rows (multi-row INSERT {multi:,.0f}/s)",
            "claim": claim,
            "wake_label": f"bare loop {_pcts(lat)} ms (NOTIFY alone {statistics.median(notify):.2f} ms p50)",
            "idle_label": f"bare loop {statistics.median(idle_ms):.2f}/{max(idle_ms):.2f} ms "
            f"({statistics.median(idle_ms) / statistics.median(lat):.2f}x its p50)",
        }
        measure_library(table, _url(dsn), tmp, quick, baselines, _pg_in_tx(dsn))
        if pgbouncer:
            with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
                admin.execute("CREATE DATABASE bench_pgb")
            bouncer = Bouncer.start(cluster)
            try:
                through = bouncer.dsn("bench_pgb")
                bounced = table_cls("PostgreSQL through PgBouncer 1.18, pool_mode=transaction")
                bounced.header()
                measure_library(
                    bounced,
                    _url(through) + "?pooler=transaction",
                    tmp,
                    quick,
                    baselines,
                    _pg_in_tx(through, prepare_threshold=None),
                )
            finally:
                bouncer.close()
        single.close()
    finally:
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _pg_in_tx(dsn: str, **connect: Any) -> Callable[[Any, int], list[float]]:
    """Seconds per business transaction on a connection of the caller's, medians of ``n``
    (``run.kinds_medians``): alone, with a bare INSERT, with ``bj.noop.enqueue`` (``bj.app``
    joins the transaction), and with a bare INSERT that NOTIFYs in the same statement (the
    enqueue's floor)."""

    def in_tx(bj: Any, n: int) -> list[float]:
        from run import kinds_medians

        app = bj.app
        table = '"ultimat3_jobs".x_jobs'
        notify = (
            f"WITH i AS (INSERT INTO {table} ({COLUMNS}) {ROW_VALUES} RETURNING queue) "
            "SELECT pg_notify('bench_in_tx', queue) FROM i"
        )
        with psycopg.connect(dsn, **connect) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial primary key, v text)")
            conn.commit()

            def transaction(i: int, kind: int) -> None:
                with app.using(conn):
                    conn.execute("INSERT INTO orders (v) VALUES (%s)", (f"o{i}",))
                    if kind == 1:
                        conn.execute(f"INSERT INTO {table} ({COLUMNS}) {ROW_VALUES}", _row())
                    elif kind == 2:
                        bj.noop.enqueue({"order": i})
                    elif kind == 3:
                        conn.execute(notify, _row())
                conn.commit()

            return kinds_medians(n, transaction, 4)

    return in_tx
