"""The price of a claim with limits, measured against a claim without, in one process.

    python bench/claims.py                      # SQLite and PostgreSQL
    python bench/claims.py --driver sqlite --cycles 2000

A worker's turn is timed as the worker makes it (``job_cycle``: complete the last batch, claim
the next 10), alternating an unlimited turn (queue "plain", ``limited=False``) and a limited
one (queue "lim": ten keys, a limit of 1000 each that never binds, ``limited=True``), so both
see the same machine load; the figure is the ratio of the medians. ``--unlimited-only`` times
the unlimited turns alone, so the same command can be run against another checkout (with
``PYTHONPATH=<checkout>/src``) to compare its claim. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from ultimat3.jobs.ids import token, uuid7  # noqa: E402
from ultimat3.jobs.records import ClaimParams, Cycle, NewJob  # noqa: E402


def fill(driver: Any, queue: str, count: int, *, limited: bool) -> None:
    for start in range(0, count, 2000):
        batch = []
        for i in range(start, min(count, start + 2000)):
            id_ = uuid7()
            job = NewJob(id_, "bench.claim", queue, '{"n":1}', id_, 3)
            if limited:
                job = job._replace(limit_key=f"job:bench.claim={i % 10}", limit_max=1000)
            batch.append(job)
        driver.job_insert_many(batch)


class Turns:
    """One worker's turns on one queue: complete what the last turn claimed, claim 10."""

    def __init__(self, driver: Any, queue: str, limited: bool) -> None:
        self.driver, self.queue, self.limited = driver, queue, limited
        self.held: list[Any] = []
        self.times: list[float] = []

    def turn(self) -> None:
        options = {"limited": True} if self.limited else {}
        claim = ClaimParams(
            (self.queue,), 10, timedelta(seconds=60), "bench", token=token(), **options
        )
        started = time.perf_counter()
        result = self.driver.job_cycle(Cycle(completes=self.held, claim=claim))
        self.times.append(time.perf_counter() - started)
        self.held = [job.lease for job in result.claimed]


def measure(driver: Any, cycles: int, unlimited_only: bool) -> None:
    fill(driver, "plain", cycles * 10 + 100, limited=False)
    plain = Turns(driver, "plain", limited=False)
    lim = None
    if not unlimited_only:
        fill(driver, "lim", cycles * 10 + 100, limited=True)
        lim = Turns(driver, "lim", limited=True)
    for _ in range(20):  # warm up: connections, prepared statements, caches
        plain.turn()
        if lim is not None:
            lim.turn()
    plain.times.clear()
    if lim is not None:
        lim.times.clear()
    for _ in range(cycles):
        plain.turn()
        if lim is not None:
            lim.turn()
    a = statistics.median(plain.times) * 1e6
    line = f"  unlimited turn {a:8.0f} us (median of {cycles})"
    if lim is not None:
        b = statistics.median(lim.times) * 1e6
        line += f"   limited turn {b:8.0f} us   ratio {b / a:.2f}"
    print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--unlimited-only", action="store_true")
    args = parser.parse_args(argv)
    if args.driver in ("sqlite", "all"):
        from ultimat3.jobs.drivers.sqlite import SqliteDriver

        tmp = Path(tempfile.mkdtemp(prefix="u3claims-"))
        try:
            driver = SqliteDriver(tmp / "jobs.sqlite3")
            driver.migrate()
            print("== SQLite (WAL, synchronous=FULL)")
            measure(driver, args.cycles, args.unlimited_only)
            driver.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.driver in ("postgres", "all"):
        from bench_pg import bench_database

        from pgcluster import Cluster
        from ultimat3.jobs.drivers.postgres import PostgresDriver

        cluster = Cluster.create()
        try:
            driver = PostgresDriver(bench_database(cluster))
            print("== PostgreSQL (throwaway cluster, fsync on)")
            measure(driver, args.cycles, args.unlimited_only)
            driver.close()
        finally:
            cluster.close()


if __name__ == "__main__":
    main(sys.argv[1:])
