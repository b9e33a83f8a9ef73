"""Fairness of limited claims: where a small tenant's jobs land behind a big tenant's backlog.

    python bench/fairness.py                     # SQLite, 100,000 jobs ahead, claims of 1, 4, 10
    python bench/fairness.py --backlog 20000

The big tenant's jobs are enqueued first, then the small tenant's 10; both are limited per
tenant by a limit that never binds (``Limit(100_000, key="tenant")``), so only the turns the
keys take decide the order. Prints the claim position of each small job (the position of the
first job of its claim). Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ultimat3.jobs.drivers.sqlite import SqliteDriver
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.limits import NO_LIMIT
from ultimat3.jobs.records import ClaimParams, Cycle, NewJob

T0 = datetime(2031, 1, 1, tzinfo=UTC)


def job(tenant: str) -> NewJob:
    id_ = uuid7()
    new = NewJob(id_, "bench.fair", "default", "{}", id_, 3, tenant_id=tenant)
    return new._replace(limit_key=f"job:bench.fair={tenant}", limit_max=NO_LIMIT)


def positions(backlog: int, batch: int) -> list[int]:
    tmp = Path(tempfile.mkdtemp(prefix="u3fair-"))
    try:
        driver = SqliteDriver(tmp / "jobs.sqlite3")
        driver.migrate()
        big = [job("big") for _ in range(backlog)]
        for start in range(0, backlog, 5000):
            driver.job_insert_many(big[start : start + 5000], now=T0)
        small = [job("small") for _ in range(10)]
        driver.job_insert_many(small, now=T0 + timedelta(seconds=1))
        ids = {j.id for j in small}
        at = T0 + timedelta(seconds=2)
        claimed, found = 0, []
        while len(found) < len(small):
            params = ClaimParams(("default",), batch, timedelta(minutes=1), "w", at, limited=True)
            got = driver.job_cycle(Cycle(claim=params), now=at).claimed
            found += [claimed + 1 for j in got if j.id in ids]
            claimed += len(got)
            driver.job_complete_many([j.lease for j in got], now=at)
        driver.close()
        return found
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=100_000)
    args = parser.parse_args(argv)
    for batch in (1, 4, 10):
        found = positions(args.backlog, batch)
        print(f"claims of {batch:>2}: the small tenant's 10 jobs at positions {found}")


if __name__ == "__main__":
    main(sys.argv[1:])
