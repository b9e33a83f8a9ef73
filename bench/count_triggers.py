"""What the kept counts cost (migration 5's triggers; on SQLite, inserts are counted by the
driver, so only the cycle's cost shows here): the same insert-then-cycle loop on one
database with the count triggers and without them, alternately, in one process, on SQLite and
on a throwaway PostgreSQL cluster.

    python bench/count_triggers.py                 # both, 3 rounds of 5,000 jobs
    python bench/count_triggers.py --driver sqlite --jobs 20000

Prints the median wall time per job of each phase (``job_insert_many`` in batches of 500,
then ``job_cycle`` claiming and completing 10 at a time) with and without the triggers, and
their ratio. The triggers are dropped and created again between rounds, so both sides run
on the same database, its caches warm alike. Not a test: nothing asserts.
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

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))  # pgcluster

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.drivers import open_driver
from ultimat3.jobs.ids import token, uuid7
from ultimat3.jobs.records import ClaimParams, Cycle, NewJob
from ultimat3.jobs.sql import migrations


def _trigger_sql(dialect: str) -> tuple[list[str], list[str]]:
    """The statements that drop migration 5's count triggers, and those that create them."""
    text = dict(migrations(dialect))[5].replace("{schema}", '"ultimat3_jobs"')
    end = "END;" if dialect == "sqlite" else ";"
    creates = [
        "CREATE TRIGGER" + part.split(end)[0] + end for part in text.split("CREATE TRIGGER")[1:]
    ]
    names = [create.split()[2] for create in creates]
    on = "" if dialect == "sqlite" else ' ON "ultimat3_jobs".x_jobs'
    return [f"DROP TRIGGER {name}{on}" for name in names], creates


def _phases(driver: Driver, jobs: int) -> tuple[float, float]:
    batch = [NewJob(uuid7(), "bench.job", "default", "{}", uuid7(), 3) for _ in range(jobs)]
    started = time.perf_counter()
    for i in range(0, jobs, 500):
        driver.job_insert_many(batch[i : i + 500])
    inserted = time.perf_counter() - started
    started = time.perf_counter()
    leases: list[Any] = []
    done = 0
    while True:
        claim = ClaimParams(("default",), 10, timedelta(minutes=1), "bench", token=token())
        result = driver.job_cycle(Cycle(completes=leases, claim=claim))
        done += len(leases)
        leases = [j.lease for j in result.claimed]
        if not leases:
            break
    cycled = time.perf_counter() - started
    assert done == jobs, (done, jobs)
    return inserted / jobs * 1e6, cycled / jobs * 1e6


def run(title: str, driver: Driver, execute: Any, dialect: str, jobs: int, rounds: int) -> None:
    drops, creates = _trigger_sql(dialect)
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    for _ in range(rounds):
        on.append(_phases(driver, jobs))
        for statement in drops:
            execute(statement)
        off.append(_phases(driver, jobs))
        for statement in creates:
            execute(statement)
    print(f"\n== {title}: {rounds} rounds of {jobs:,} jobs, median us per job")
    for i, phase in enumerate(("insert (500 a call)", "cycle (claim + complete 10)")):
        with_ = statistics.median(r[i] for r in on)
        without = statistics.median(r[i] for r in off)
        print(
            f"  {phase:<30} with {with_:8.1f}   without {without:8.1f}   ratio {with_ / without:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.driver in ("sqlite", "all"):
        import sqlite3

        tmp = Path(tempfile.mkdtemp(prefix="u3bench-counts-"))
        try:
            path = tmp / "jobs.sqlite3"
            driver = open_driver(f"sqlite:///{path}")
            driver.migrate()
            admin = sqlite3.connect(path, isolation_level=None)
            run("SQLite", driver, admin.execute, "sqlite", args.jobs, args.rounds)
            admin.close()
            driver.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.driver in ("postgres", "all"):
        import psycopg
        from bench_pg import bench_database

        from pgcluster import Cluster
        from ultimat3.jobs.drivers.postgres import PostgresDriver

        cluster = Cluster.create()
        try:
            dsn = bench_database(cluster)
            driver = PostgresDriver(dsn)
            with psycopg.connect(dsn, autocommit=True) as admin:
                run("PostgreSQL", driver, admin.execute, "postgres", args.jobs, args.rounds)
            driver.close()
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
