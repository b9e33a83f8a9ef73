"""The claim and the enqueue on a big table, beside the same figures on an empty one.

    python bench/scale.py                               # SQLite and PostgreSQL
    python bench/scale.py --driver sqlite --finished 1000000 --ready 100000

Each database is measured twice in one run: first with only the jobs the measure claims, then
after filling ``x_jobs`` with ``--finished`` completed rows and ``--ready`` waiting rows (by SQL,
outside the timings, then ANALYZE). A claim is one ``Driver.job_cycle`` as a worker runs it:
complete the 10 jobs of the previous turn, claim 10 more. The enqueue is one ``enqueue`` call
with its own commit. Read the ratio: this machine is noisy. Not a test: nothing here asserts.
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
from datetime import timedelta
from pathlib import Path
from typing import Any

from run import load_app, pct

from ultimat3.jobs.records import ClaimParams, Cycle

CYCLES = 1000
BATCH = 10
ENQUEUES = 1000
ROUNDS = 3


def fill_plan(finished: int, ready: int) -> list[tuple[str, int, str, str]]:
    """(state, rows, id prefix, queue): the finished rows, and the ready rows waiting in the
    queue the measure claims from (older than its own, so its claims take them first)."""
    return [("completed", finished, "", "default"), ("available", ready, "r", "scale")]


def measure(app: Any, handle: Any) -> dict[str, float]:
    """Claim p50/p99 (ms) over ``CYCLES`` turns of 10, and the single-enqueue rate."""
    app.enqueue_many(handle, [{"i": i} for i in range(CYCLES * BATCH)], queue="scale")
    driver = app.driver
    claim = ClaimParams(
        queues=("scale",), limit=BATCH, lease_for=timedelta(minutes=5), worker_id="bench"
    )
    held: list[Any] = []
    times: list[float] = []
    for _ in range(CYCLES):
        started = time.perf_counter()
        result = driver.job_cycle(Cycle(completes=held, claim=claim))
        times.append((time.perf_counter() - started) * 1000)
        held = [job.lease for job in result.claimed]
    driver.job_cycle(Cycle(completes=held))
    started = time.perf_counter()
    for i in range(ENQUEUES):
        handle.enqueue({"i": i}, queue="scale-enqueue")
    rate = ENQUEUES / (time.perf_counter() - started)
    return {
        "p50": pct(times, 50),
        "p99": pct(times, 99),
        "mean": statistics.mean(times),
        "rate": rate,
    }


def report(label: str, empty: dict[str, float], full: dict[str, float]) -> None:
    print(f"  {label}")
    for key, what, unit in (
        ("p50", "claim+complete turn of 10, p50", "ms"),
        ("p99", "claim+complete turn of 10, p99", "ms"),
        ("rate", "single enqueue (own commit)", "/s"),
    ):
        ratio = full[key] / empty[key]
        print(
            f"    {what:<34} empty {empty[key]:>9.3f} {unit}   full {full[key]:>9.3f} {unit}"
            f"   ratio {ratio:.2f}"
        )


def run(
    urls: tuple[str, str], tmp: Path, fill: Callable[[], None], finished: int, ready: int
) -> None:
    """Measure an empty database and a filled one in alternating rounds (this machine's noise
    then falls on both alike), and report the medians."""
    apps = []
    for url in urls:
        apps.append(load_app(url, tmp))
    started = time.perf_counter()
    fill()
    print(
        f"  (filled {finished:,} finished and {ready:,} ready rows in "
        f"{time.perf_counter() - started:.0f} s)"
    )
    rounds: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
    for _ in range(ROUNDS):
        for bj, results in zip(apps, rounds, strict=True):
            results.append(measure(bj.app, bj.noop))
    for bj in apps:
        bj.app.close()
    empty, full = (
        {key: statistics.median(r[key] for r in results) for key in results[0]}
        for results in rounds
    )
    report(
        f"{finished:,} finished + {ready:,} ready rows vs empty, median of {ROUNDS} rounds",
        empty,
        full,
    )


def bench_sqlite(finished: int, ready: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="u3scale-sqlite-"))
    path = tmp / "full.sqlite3"

    def fill() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        now = int(time.time() * 1_000_000)
        conn.execute("BEGIN IMMEDIATE")
        for state, count, extra, queue in fill_plan(finished, ready):
            conn.execute(
                """
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
                INSERT INTO x_jobs (id, name, queue, input, idempotency_key, priority, state,
                                    attempt, max_attempts, run_at, created_at, finished_at)
                SELECT printf('fill-%s%010d', ?, i), 'benchjobs.noop', ?, '{}',
                       printf('fill-%s%010d', ?, i), 0, ?, ?, 3, ? - 3600000000 + i, ? - 3600000000,
                       CASE WHEN ? = 'completed' THEN ? - 60000000 + i END
                FROM n
                """,
                (
                    count,
                    extra,
                    queue,
                    extra,
                    state,
                    1 if state == "completed" else 0,
                    now,
                    now,
                    state,
                    now,
                ),
            )
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
        conn.close()

    try:
        print("== SQLite (WAL, synchronous=FULL)")
        run((f"sqlite:///{tmp / 'empty.sqlite3'}", f"sqlite:///{path}"), tmp, fill, finished, ready)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_postgres(finished: int, ready: int) -> None:
    import psycopg
    from bench_pg import _url, bench_database

    from pgcluster import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="u3scale-pg-"))
    cluster = Cluster.create()
    try:
        empty = bench_database(cluster, "bench_empty")
        dsn = bench_database(cluster)

        def fill() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for state, count, extra, queue in fill_plan(finished, ready):
                    conn.execute(
                        """
                        INSERT INTO ultimat3_jobs.x_jobs
                            (id, name, queue, input, idempotency_key, priority, state, attempt,
                             max_attempts, run_at, created_at, finished_at)
                        SELECT 'fill-' || %(extra)s || i, 'benchjobs.noop', %(queue)s, '{}',
                               'fill-' || %(extra)s || i, 0, %(state)s,
                               CASE WHEN %(state)s = 'completed' THEN 1 ELSE 0 END, 3,
                               now() - interval '1 hour' + i * interval '1 microsecond',
                               now() - interval '1 hour',
                               CASE WHEN %(state)s = 'completed' THEN now() - interval '1 minute' END
                        FROM generate_series(1, %(count)s) AS i
                        """,
                        {"extra": extra, "state": state, "count": count, "queue": queue},
                    )
                conn.execute("VACUUM ANALYZE ultimat3_jobs.x_jobs")
                conn.execute("CHECKPOINT")  # the fill's writes are not the measure's

        print("== PostgreSQL (throwaway cluster, fsync on)")
        run((_url(empty), _url(dsn)), tmp, fill, finished, ready)
    finally:
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=100_000)
    args = parser.parse_args(argv)
    if args.driver in ("sqlite", "all"):
        bench_sqlite(args.finished, args.ready)
    if args.driver in ("postgres", "all"):
        bench_postgres(args.finished, args.ready)


if __name__ == "__main__":
    main(sys.argv[1:])
