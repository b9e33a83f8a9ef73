"""Where PostgreSQL's enqueue-to-start time and in-transaction enqueue cost go, part by part.

    python bench/latency_parts.py             # all three, on a throwaway cluster (fsync on)
    python bench/latency_parts.py --jobs 500 --rounds 1000  # more samples

1. **Enqueue-to-start, split.** A worker process (10 handlers, the CLI's defaults) serves a
   queue while this process enqueues 50 jobs a second, as ``run.py`` does. The worker's
   driver is wrapped to stamp (``time.time()``, one host) when its LISTEN wait returned and
   when its claim began and ended; the job stamps when it started. The parts are medians:
   enqueue call to its return, the return to the listener's wake-up (negative: the NOTIFY
   arrived before the enqueue returned), wake-up to claim, the claim, claim to handler.
2. **The claim of one due job**, 20 ms after its commit (as at 50 jobs a second) and at once:
   the driver's claim-only turn (``job_cycle``), the same statement on a plain connection,
   and the bare claim of ``run.py`` (session ``synchronous_commit`` off, as its consumer).
3. **The added cost of an enqueue inside a business transaction**, beside a bare INSERT and
   a bare INSERT that NOTIFYs in the same statement (which waking the workers needs); the
   kinds take turns.

Figures move with the machine: read them as ratios of the same run. Not a test: its one check
is that each claim got the job it was timed for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from bench_pg import (  # noqa: E402
    BARE_STARTED,
    COLUMNS,
    ROW_VALUES,
    _pg_in_tx,
    _row,
    _url,
    bare_claim,
    bench_database,
)

from pgcluster import Cluster  # noqa: E402
from ultimat3.jobs import App, job  # noqa: E402
from ultimat3.jobs.ids import uuid7  # noqa: E402
from ultimat3.jobs.records import ClaimParams, Cycle  # noqa: E402

TABLE = '"ultimat3_jobs".x_jobs'
_marks: dict[str, float] = {}


@job(queue="parts")
def stamp(input: dict[str, Any]) -> None:
    started = time.time()
    with open(os.environ["PARTS_OUT"], "a") as f:
        marks = [_marks.get(name, 0.0) for name in ("woke", "claim0", "claim1")]
        f.write(" ".join(repr(x) for x in (input["t"], *marks, started)) + "\n")


def _stamped(cls: Any, name: str, before: str | None, after: str) -> None:
    original = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            _marks[before] = time.time()
        result = original(*args, **kwargs)
        _marks[after] = time.time()
        return result

    setattr(cls, name, wrapper)


def run_worker(url: str) -> None:
    """The worker side of part 1 (``--worker``): the driver stamped, then the usual worker."""
    from ultimat3.jobs.drivers.postgres import PostgresDriver

    _stamped(PostgresDriver, "_listen_once", None, "woke")
    _stamped(PostgresDriver, "job_cycle", "claim0", "claim1")
    App(url, modules=[sys.modules[__name__]]).worker(queues=["parts"]).run()


def enqueue_to_start(url: str, jobs: int) -> None:
    out = Path(tempfile.mkdtemp(prefix="u3parts-")) / "stamps.txt"
    env = {**os.environ, "PARTS_OUT": str(out)}
    worker = subprocess.Popen(
        [sys.executable, __file__, "--worker", url], env=env, stdout=subprocess.DEVNULL
    )
    app = App(url, modules=[sys.modules[__name__]])
    try:
        time.sleep(2.0)  # the worker listens
        returned: dict[float, float] = {}
        for _ in range(jobs):
            sent = time.time()
            stamp.enqueue({"t": sent})
            returned[sent] = time.time()
            time.sleep(1 / 50)
        time.sleep(1.0)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        app.close()
    parts: list[list[float]] = [[] for _ in range(6)]
    for line in out.read_text().split("\n"):
        if not line:
            continue
        sent, woke, claim0, claim1, started = (float(x) for x in line.split())
        back = returned[sent]
        for i, value in enumerate(
            (back - sent, woke - back, claim0 - woke, claim1 - claim0, started - claim1)
        ):
            parts[i].append(value * 1000)
        parts[5].append((started - sent) * 1000)
    names = (
        "enqueue (call to return)",
        "return -> listener woke",
        "woke -> claim",
        "claim (job_cycle)",
        "claim -> handler",
        "enqueue-to-start",
    )
    print(f"  enqueue-to-start at 50 jobs/s, {len(parts[5])} jobs, medians (p90):")
    for name, values in zip(names, parts, strict=True):
        values.sort()
        p90 = values[int(len(values) * 0.9)]
        print(f"    {name:28s} {statistics.median(values):7.3f} ms  ({p90:.3f})")


def claim_one(url: str, rounds: int) -> None:
    from ultimat3.jobs.drivers.postgres import PostgresDriver

    driver = PostgresDriver(url)
    params = ClaimParams(("claim1",), 10, timedelta(seconds=30), "bench")
    ours, ours_params = driver._claim_query(params, started=True, relaxed=True)
    insert = f"INSERT INTO {TABLE} ({COLUMNS}) {ROW_VALUES}"
    with (
        psycopg.connect(url, autocommit=True) as feeder,
        psycopg.connect(url, autocommit=True) as plain,
        psycopg.connect(url, autocommit=True) as bare,
    ):
        bare.execute("SET synchronous_commit = off")
        claim_bare = bare_claim(TABLE, "claim1", BARE_STARTED)
        kinds: dict[str, Callable[[], list[Any]]] = {
            "the driver's claim-only turn": lambda: driver.job_cycle(Cycle(claim=params)).claimed,
            "its statement, plain connection": lambda: plain.execute(
                ours, {**ours_params, "token": uuid7()}
            ).fetchall(),
            "the bare claim": lambda: bare.execute(claim_bare, ("t",)).fetchall(),
        }
        for idle in (0.02, 0.0):
            times: dict[str, list[float]] = {name: [] for name in kinds}
            for i in range(rounds + 10):
                for name, claim in kinds.items():
                    feeder.execute(insert, _row("claim1", '{"t":1}'))
                    time.sleep(idle)
                    started = time.perf_counter()
                    claimed = claim()
                    if i >= 10:
                        times[name].append((time.perf_counter() - started) * 1000)
                    assert len(claimed) == 1, claimed
            label = "20 ms after the job's commit" if idle else "right after the job's commit"
            print(f"  claim of one due job, {label}, medians of {rounds}:")
            for name, values in times.items():
                print(f"    {name:34s} {statistics.median(values):.3f} ms")
    driver.close()


def in_transaction(url: str, dsn: str, rounds: int) -> None:
    app = App(url, modules=[sys.modules[__name__]])
    alone, bare, enqueue, notify = _pg_in_tx(dsn)(SimpleNamespace(app=app, noop=stamp), rounds)
    app.close()
    added = {
        "bare INSERT": bare - alone,
        "bare INSERT + NOTIFY": notify - alone,
        "enqueue": enqueue - alone,
    }
    print(f"  added to a business transaction ({alone * 1000:.3f} ms alone), medians of {rounds}:")
    for name, seconds in added.items():
        ratio = seconds / added["bare INSERT"]
        print(f"    {name:24s} {seconds * 1000:.3f} ms  ({ratio:.2f} of the bare INSERT)")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--worker"]:
        run_worker(argv[1])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=250, help="Jobs enqueued in part 1.")
    parser.add_argument("--rounds", type=int, default=300, help="Samples of each kind, 2 and 3.")
    args = parser.parse_args(argv)
    cluster = Cluster.create()
    try:
        dsn = bench_database(cluster)
        url = _url(dsn)
        print("== PostgreSQL (throwaway cluster, fsync on)")
        enqueue_to_start(url, args.jobs)
        claim_one(url, args.rounds)
        in_transaction(url, dsn, args.rounds)
    finally:
        cluster.close()


if __name__ == "__main__":
    main(sys.argv[1:])
