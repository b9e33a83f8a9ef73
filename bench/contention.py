"""How the PostgreSQL claim behaves with many worker processes contending for one queue.

    python bench/contention.py                       # 1, 2, 4 and 8 processes
    python bench/contention.py --processes 8 --jobs 40000

For each process count: a backlog of no-op jobs drained by ``worker --processes N``, on a
throwaway cluster with ``pg_stat_statements`` loaded. It prints the drain rate, then, read off
the server: how many claim statements ran and how many rows each returned on average (a claim
asks for one row per free handler, so fewer rows than handlers means rows skipped as locked, or
nothing left), the claim's mean and max execution time, and the share of samples of
``pg_stat_activity`` (every 10 ms) in which a backend waited on a heavyweight lock (``Lock``) or
an internal one (``LWLock``), plus deadlocks and rollbacks. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from drain import drain

STATEMENTS = """
SELECT calls, rows, mean_exec_time, max_exec_time
FROM pg_stat_statements
WHERE query LIKE %s AND dbid = (SELECT oid FROM pg_database WHERE datname = 'bench')
"""


def sample_waits(dsn: str, stop: threading.Event, out: dict[str, int]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(
                "SELECT wait_event_type, wait_event, count(*) FROM pg_stat_activity"
                " WHERE datname = 'bench' AND state = 'active' AND pid <> pg_backend_pid()"
                " GROUP BY 1, 2"
            ).fetchall()
            out["samples"] += 1
            for kind, event, count in rows:
                out["active"] += count
                if kind in ("Lock", "LWLock"):
                    out[kind] += count
                    out[f"{kind}:{event}"] = out.get(f"{kind}:{event}", 0) + count
            stop.wait(0.01)


def statement(conn: Any, pattern: str) -> tuple[int, int, float, float]:
    calls = rows = 0
    mean = peak = 0.0
    for c, r, m, p in conn.execute(STATEMENTS, (pattern,)).fetchall():
        mean = (mean * calls + m * c) / (calls + c) if calls + c else 0.0
        calls += c
        rows += r
        peak = max(peak, p)
    return calls, rows, mean, peak


def main(argv: list[str] | None = None) -> None:
    import psycopg
    from bench_pg import _url, bench_database

    from pgcluster import Cluster

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--processes", default="1,2,4,8")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="u3contention-"))
    cluster = Cluster.create(start=False)
    try:
        with open(cluster.datadir / "postgresql.conf", "a") as conf:
            conf.write("\nshared_preload_libraries = 'pg_stat_statements'\n")
        cluster.start()
        dsn = bench_database(cluster)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        print(f"== PostgreSQL: drain {args.jobs:,} no-op jobs, default worker settings")
        for n in [int(p) for p in args.processes.split(",")]:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("TRUNCATE ultimat3_jobs.x_jobs")
                before = conn.execute(
                    "SELECT deadlocks, xact_rollback FROM pg_stat_database WHERE datname = 'bench'"
                ).fetchone()
                conn.execute("SELECT pg_stat_statements_reset()")
            waits = {"samples": 0, "active": 0, "Lock": 0, "LWLock": 0}
            stop = threading.Event()
            sampler = threading.Thread(target=sample_waits, args=(dsn, stop, waits))
            sampler.start()
            try:
                rate, cpu, cores = drain(_url(dsn), tmp, args.jobs, n)
            finally:
                stop.set()
                sampler.join()
            with psycopg.connect(dsn, autocommit=True) as conn:
                after = conn.execute(
                    "SELECT deadlocks, xact_rollback FROM pg_stat_database WHERE datname = 'bench'"
                ).fetchone()
                claims, claimed, mean, peak = statement(conn, "%SKIP LOCKED%")
                top = conn.execute(
                    "SELECT calls, mean_exec_time, max_exec_time, query FROM pg_stat_statements"
                    " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'bench')"
                    " ORDER BY total_exec_time DESC LIMIT 3"
                ).fetchall()
            assert before is not None and after is not None
            samples = max(1, waits["samples"])
            print(
                f"  {n} process(es): {rate:>8,.0f} jobs/s (worker CPU {cpu:.0%} of a core; "
                f"machine {cores:.2f} of {os.cpu_count()} cores busy)\n"
                f"    claims {claims:,}, rows per claim {claimed / max(1, claims):.2f},"
                f" claim exec mean {mean:.3f} ms max {peak:.1f} ms\n"
                f"    backends active per sample {waits['active'] / samples:.2f}, waiting on"
                f" Lock {waits['Lock'] / samples:.3f}, on LWLock {waits['LWLock'] / samples:.3f};"
                f" deadlocks {after[0] - before[0]}, rollbacks {after[1] - before[1]}"
            )
            events = sorted(((k, v) for k, v in waits.items() if ":" in k), key=lambda kv: -kv[1])[
                :4
            ]
            if events:
                print(
                    "    waits by event (backends per sample): "
                    + ", ".join(f"{k} {v / samples:.3f}" for k, v in events)
                )
            for calls, s_mean, s_max, query in top:
                text = " ".join(query.split())[:70]
                print(f"    {calls:>7,} x {s_mean:.3f} ms (max {s_max:.1f}): {text}")
    finally:
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
