"""The operator reads at scale: queue_list, job_count, worker_list and the oldest ready job
(what the metrics, the health check and the dashboard ask) on 1M jobs, on SQLite and on a
throwaway PostgreSQL cluster, beside the full scan they replaced.

    python bench/operator_reads.py                      # both, 1,000,000 rows
    python bench/operator_reads.py --driver sqlite --rows 200000

Each figure is the median of repeated calls, in milliseconds. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.drivers import open_driver
from ultimat3.jobs.records import JobFilter, JobState, WorkerInfo

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))  # pgcluster

QUEUES = ("default", "mail", "reports", "billing")
#: Of every 100 rows: 90 completed, 7 available (due), 2 scheduled (future), 1 dead.
FILL_SQLITE = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows)
INSERT INTO x_jobs (id, name, queue, input, idempotency_key, state, attempt, max_attempts,
                    run_at, created_at, finished_at)
SELECT printf('%012d', i), 'bench.job', json_extract(:queues, '$[' || (i % 4) || ']'), '{}',
       printf('k%012d', i),
       CASE WHEN i % 100 < 90 THEN 'completed' WHEN i % 100 < 97 THEN 'available'
            WHEN i % 100 < 99 THEN 'scheduled' ELSE 'dead' END,
       1, 3,
       CASE WHEN i % 100 BETWEEN 97 AND 98 THEN :now + 3600000000 ELSE :now - i END,
       :now - i,
       CASE WHEN i % 100 < 90 OR i % 100 = 99 THEN :now - i END
FROM n
"""
FILL_POSTGRES = """
INSERT INTO "ultimat3_jobs".x_jobs (id, name, queue, input, idempotency_key, state, attempt,
                                    max_attempts, run_at, created_at, finished_at)
SELECT lpad(i::text, 12, '0'), 'bench.job', (ARRAY['default','mail','reports','billing'])[i %% 4 + 1],
       '{}', 'k' || lpad(i::text, 12, '0'),
       CASE WHEN i %% 100 < 90 THEN 'completed' WHEN i %% 100 < 97 THEN 'available'
            WHEN i %% 100 < 99 THEN 'scheduled' ELSE 'dead' END,
       1, 3,
       CASE WHEN i %% 100 BETWEEN 97 AND 98 THEN now() + interval '1 hour'
            ELSE now() - i * interval '1 microsecond' END,
       now() - i * interval '1 microsecond',
       CASE WHEN i %% 100 < 90 OR i %% 100 = 99 THEN now() - i * interval '1 microsecond' END
FROM generate_series(1, %(rows)s) AS i
"""
SCAN_SQLITE = "SELECT queue, state, count(*) FROM x_jobs GROUP BY queue, state"
SCAN_POSTGRES = 'SELECT queue, state, count(*) FROM "ultimat3_jobs".x_jobs GROUP BY queue, state'


def median_ms(call: Callable[[], Any], repeat: int = 15) -> float:
    call()  # warm
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(title: str, driver: Driver, scan: Callable[[], Any]) -> None:
    now = datetime.now(UTC)
    for i in range(8):
        driver.worker_beat(WorkerInfo(f"h:{i}:bench", "h", i, QUEUES, 10, now, now, "bench"))
    queues = driver.queue_list()
    total = sum(sum(q.counts.values()) for q in queues)
    print(f"\n== {title}: {total:,} jobs in {len(queues)} queues")
    rows = [
        ("queue_list (counts + oldest ready)", lambda: driver.queue_list()),
        (
            "job_count(state=available)",
            lambda: driver.job_count(JobFilter(frozenset({JobState.AVAILABLE}))),
        ),
        ("job_count(queue=mail)", lambda: driver.job_count(JobFilter(queue="mail"))),
        ("job_count() all", lambda: driver.job_count(JobFilter())),
        ("worker_list (8 rows)", lambda: driver.worker_list()),
        ("the full scan queue_list did before", scan),
    ]
    for what, call in rows:
        print(f"  {what:<42} {median_ms(call, 5 if 'scan' in what else 15):8.2f} ms")


def bench_sqlite(rows: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="u3bench-reads-"))
    try:
        path = tmp / "jobs.sqlite3"
        driver = open_driver(f"sqlite:///{path}")
        driver.migrate()
        import json

        started = time.perf_counter()
        with sqlite3.connect(path) as conn:
            now_us = int(time.time() * 1_000_000)
            conn.execute(FILL_SQLITE, {"rows": rows, "queues": json.dumps(QUEUES), "now": now_us})
            conn.execute("ANALYZE")
        print(f"(filled {rows:,} rows in {time.perf_counter() - started:.1f}s)")
        scan_conn = sqlite3.connect(path)
        measure("SQLite", driver, lambda: scan_conn.execute(SCAN_SQLITE).fetchall())
        scan_conn.close()
        driver.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_postgres(rows: int) -> None:
    try:
        import psycopg
        from bench_pg import bench_database

        from pgcluster import Cluster
    except ImportError as exc:
        print(f"\n== PostgreSQL: skipped ({exc})")
        return
    cluster = Cluster.create()
    try:
        dsn = bench_database(cluster)
        started = time.perf_counter()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(FILL_POSTGRES, {"rows": rows})
            conn.execute('VACUUM ANALYZE "ultimat3_jobs".x_jobs')
        print(f"(filled {rows:,} rows in {time.perf_counter() - started:.1f}s)")
        from ultimat3.jobs.drivers.postgres import PostgresDriver

        driver = PostgresDriver(dsn)
        scan_conn = psycopg.connect(dsn, autocommit=True)
        measure("PostgreSQL", driver, lambda: scan_conn.execute(SCAN_POSTGRES).fetchall())
        scan_conn.close()
        driver.close()
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.driver in ("sqlite", "all"):
        bench_sqlite(args.rows)
    if args.driver in ("postgres", "all"):
        bench_postgres(args.rows)


if __name__ == "__main__":
    main()
