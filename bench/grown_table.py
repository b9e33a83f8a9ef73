"""PostgreSQL's claims when ``x_jobs`` grew after their plans were made.

    python bench/grown_table.py              # 100,000 finished rows added
    python bench/grown_table.py --rows 500000

A worker's connection keeps each prepared statement's plan from when it was made. Two starts,
each on a fresh database of a throwaway cluster, with a driver of one pooled connection:

- **never analyzed**: a fresh install, 3 jobs;
- **analyzed while tiny**: the same, after an ``ANALYZE`` (autovacuum's first comes after about
  50 rows).

In each, 12 claim-only turns make the plans; then ``--rows`` finished jobs arrive at once (a
burst, before autovacuum could analyze them), and each of 8 turns claims 10 new due jobs. The
script prints each turn's time in ms: a plan that scans the table shows in every turn, one
made again after the first slow statement (``_attempts``) in the first only. Not a test: its
one check is that each turn claimed its 10 jobs.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from bench_pg import COLUMNS, ROW_VALUES, _row  # noqa: E402

from pgcluster import Cluster  # noqa: E402
from ultimat3.jobs.drivers.postgres import PostgresDriver  # noqa: E402
from ultimat3.jobs.records import ClaimParams, Cycle  # noqa: E402

TABLE = '"ultimat3_jobs".x_jobs'
DUE = f"INSERT INTO {TABLE} ({COLUMNS}) {ROW_VALUES}"


def turns(cluster: Cluster, name: str, rows: int, *, analyze: bool) -> list[float]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = str(cluster.dsn(name))
    driver = PostgresDriver(dsn, pool_min=1, pool_max=1)
    turn = Cycle(claim=ClaimParams(("grown",), 10, timedelta(seconds=30), "bench"))
    took = []
    try:
        driver.migrate()
        with psycopg.connect(dsn, autocommit=True) as conn:

            def due(n: int) -> None:
                for _ in range(n):
                    conn.execute(DUE, _row("grown"))

            due(3)
            if analyze:
                conn.execute(f"ANALYZE {TABLE}")
            for _ in range(12):
                driver.job_cycle(turn)
            conn.execute(
                f"INSERT INTO {TABLE} ({COLUMNS}) SELECT 'f' || g, 'bench.old', 'old', '{{}}', "
                f"'f' || g, 0, 'completed', 3, now(), now() FROM generate_series(1, {rows}) g"
            )
            for _ in range(8):
                due(10)
                started = time.perf_counter()
                claimed = driver.job_cycle(turn).claimed
                took.append((time.perf_counter() - started) * 1000)
                assert len(claimed) == 10, claimed
    finally:
        driver.close()
    return took


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000, help="Finished rows added at once.")
    args = parser.parse_args(argv)
    cluster = Cluster.create()
    try:
        print(f"== PostgreSQL: claims of 10 after {args.rows:,} rows arrived, ms per turn")
        for label, name, analyze in (
            ("never analyzed", "fresh", False),
            ("analyzed while tiny", "tiny", True),
        ):
            took = turns(cluster, name, args.rows, analyze=analyze)
            print(f"  {label:22s} " + " ".join(f"{ms:7.1f}" for ms in took))
    finally:
        cluster.close()


if __name__ == "__main__":
    main(sys.argv[1:])
