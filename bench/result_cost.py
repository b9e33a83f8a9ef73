"""What recording a result costs per job: the worker's cycle run in this process
(``worker.drain()``: claim 10, run, write the outcomes in the next claim's transaction) over a
backlog of jobs that return None (``noop``) or their input (``echo``: a small stored result),
interleaved, several rounds; the best round of each is printed, as µs per job.

    python bench/result_cost.py                       # SQLite and PostgreSQL
    python bench/result_cost.py --driver sqlite --jobs 5000 --rounds 7

It uses only what every version has (``App``, ``job``, ``enqueue_many``, ``drain``), so the
same file measures an older checkout: ``PYTHONPATH=../old/src python bench/result_cost.py``
(there ``echo``'s return value is dropped). The best of several rounds is the least disturbed
by whatever else the machine runs. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from ultimat3.jobs import App, job

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


@job
def noop(input: Any) -> None:
    return None


@job
def echo(input: Any) -> Any:
    return input


JOBS = types.ModuleType("result_cost_jobs")
JOBS.noop = noop  # type: ignore[attr-defined]
JOBS.echo = echo  # type: ignore[attr-defined]


def one_round(url: str, handle: Any, jobs: int) -> float:
    """Seconds per job to drain ``jobs`` fresh jobs of ``handle`` (the enqueue not counted)."""
    app = App(url, modules=[JOBS])
    try:
        app.enqueue_many(handle, [{"i": i, "note": "a small result"} for i in range(jobs)])
        worker = app.worker(concurrency=10)
        started = time.perf_counter()
        stats = worker.drain()
        elapsed = time.perf_counter() - started
        assert stats.completed == jobs, stats
        return elapsed / jobs
    finally:
        app.close()


def measure(label: str, urls: Any, jobs: int, rounds: int) -> None:
    best = {"noop": float("inf"), "echo": float("inf")}
    for n in range(rounds):
        for name, handle in (("noop", noop), ("echo", echo)):
            best[name] = min(best[name], one_round(urls(n, name), handle, jobs))
    print(
        f"  {label:<10} noop {best['noop'] * 1e6:7.1f} µs/job   echo {best['echo'] * 1e6:7.1f} "
        f"µs/job   echo/noop {best['echo'] / best['noop']:.3f}   (best of {rounds})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.driver in ("sqlite", "all"):
        tmp = Path(tempfile.mkdtemp(prefix="u3result-"))
        try:
            measure(
                "sqlite",
                lambda n, name: f"sqlite:///{tmp / f'{name}{n}.sqlite3'}",
                args.jobs,
                args.rounds,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.driver in ("postgres", "all"):
        import psycopg
        from bench_pg import _url, bench_database

        from pgcluster import Cluster

        cluster = Cluster.create()
        try:
            dsn = bench_database(cluster)

            def fresh(n: int, name: str) -> str:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("TRUNCATE ultimat3_jobs.x_jobs")
                return _url(dsn)

            measure("postgres", fresh, args.jobs, args.rounds)
        finally:
            cluster.close()


if __name__ == "__main__":
    main(sys.argv[1:])
