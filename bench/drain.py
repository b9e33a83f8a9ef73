"""The drain alone: worker processes against a backlog of no-op jobs, beside the bare
claim-10/ack-10 loop measured in the same run.

    python bench/drain.py                          # SQLite and PostgreSQL, 1 process
    python bench/drain.py --driver postgres --processes 1,2,4
    python bench/drain.py --jobs 100000
    python bench/drain.py --limited 100            # the no-op job limited to 100 per key, 10 keys
    python bench/drain.py --returning              # each job returns its input: a stored result

Each figure is jobs per second from the first claim to the last completion; read it as the
ratio beside it. Each round (``--rounds``, 3 by default) runs the bare loop once, then the
library at each process count of the sweep (in the reverse order every other round), each on a
fresh table; the median ratios come last, to the bare loop and, for a sweep, of each process
count to the first one (``--processes 1,2``: how much faster two processes drain than one).
Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from run import (
    drained_span,
    load_app,
    spawn_worker,
    sqlite_bare_claim_loop,
    sqlite_bare_jobs_claim_loop,
    tree_cpu_seconds,
)

#: One round's figures for one process count: jobs per second, the worker processes' CPU (in
#: cores), the bare loop's jobs per second, and the whole machine's busy cores meanwhile.
Round = tuple[float, float, float, float]


def machine_jiffies() -> tuple[int, int]:
    """(busy, all) CPU time of the whole machine so far, in clock ticks, from ``/proc/stat``:
    everything but idle and I/O wait is busy (the database server's work included)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def drain(
    url: str, tmp: Path, jobs: int, processes: int, returning: bool = False
) -> tuple[float, float, float]:
    """Jobs per second from the first claim to the last completion, as the database recorded
    them (``drained_span``); the worker processes' CPU share meanwhile; and how many cores of
    the machine were busy meanwhile (``machine_jiffies``, over the polling window, which ends
    up to half a second after the last completion: the figure errs low). Progress is polled
    rarely: a count every few milliseconds would load the database it measures."""
    bj = load_app(url, tmp)
    app = bj.app
    handle = bj.echo if returning else bj.noop
    for chunk in range(0, jobs, 10_000):
        app.enqueue_many(handle, [{"i": i} for i in range(chunk, min(jobs, chunk + 10_000))])
    args = ["--queue", "default", "--poll-interval", "100ms"]
    if processes > 1:
        args += ["--processes", str(processes)]
    worker = spawn_worker(url, tmp, *args)
    cpu = 0.0
    busy = (0, 0)
    deadline = time.monotonic() + 600
    while app.count_jobs(state="completed") < jobs and time.monotonic() < deadline:
        if not cpu:
            cpu = tree_cpu_seconds(worker.pid)  # once the app is loaded: about the first claim
            busy = machine_jiffies()
        time.sleep(0.5)
    cpu = tree_cpu_seconds(worker.pid) - cpu
    busy_now, all_now = machine_jiffies()
    cores = (busy_now - busy[0]) / max(1, all_now - busy[1]) * (os.cpu_count() or 1)
    worker.terminate()
    worker.wait()
    app.close()
    first, last = drained_span(url)
    return jobs / (last - first), cpu / (last - first), cores


def rounds_report(label: str, rounds: list[Round]) -> None:
    """One line per round, then the median ratio: the bare loop and the library take turns,
    so a machine that drifts moves both."""
    ratios = []
    for i, (ours, cpu, bare, cores) in enumerate(rounds, 1):
        ratios.append(ours / bare)
        print(
            f"  {label} round {i}: {ours:>10,.0f}/s   bare {bare:>9,.0f}/s   "
            f"ratio {ours / bare:.2f}   (worker CPU {cpu:.0%} of a core; "
            f"machine {cores:.2f} of {os.cpu_count()} cores busy)"
        )
    print(f"  {label}: median ratio {statistics.median(ratios):.2f} of {len(rounds)} rounds")


def in_turn(sweep: list[int], round_: int) -> list[int]:
    """The sweep's process counts in the order round ``round_`` runs them: reversed every
    other round, so that no count always runs first (on a colder machine) or last."""
    return sweep if round_ % 2 == 0 else sweep[::-1]


def scaling_report(label: str, measured: dict[int, list[Round]], *, bare_too: bool = False) -> None:
    """Each process count beside the first of the sweep (``--processes 1,2``: 2 beside 1), as
    the median of the rounds' ratios: in a round the counts run one after the other, so a
    machine that drifts moves them alike. ``bare_too``: the bare loop ran in as many
    processes as the library, and its own ratio is the floor of the library's. Last, the CPU
    ceiling: all the machine's cores over the cores the first count kept busy (work that is
    all CPU, the worker's and the server's, cannot drain faster than that)."""
    counts = list(measured)
    first = measured[counts[0]]
    busy = statistics.median(cores for _, _, _, cores in first)
    for n in counts[1:]:
        pairs = list(zip(measured[n], first, strict=True))
        ratios = [ours / base[0] for (ours, *_), base in pairs]
        each = ", ".join(f"{r:.2f}" for r in ratios)
        line = (
            f"  {label}, {n} process(es) beside {counts[0]}: median ratio "
            f"{statistics.median(ratios):.2f} (rounds {each})"
        )
        if bare_too:
            bare = [round_[2] / base[2] for round_, base in pairs]
            line += f"; the bare loop's {statistics.median(bare):.2f}"
        print(
            f"{line}; the CPU ceiling {(os.cpu_count() or 1) / busy:.2f} ({counts[0]} "
            f"process(es) kept {busy:.2f} of {os.cpu_count()} cores busy)"
        )


def bench_sqlite(jobs: int, sweep: list[int], returning: bool, rounds: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="u3drain-sqlite-"))
    try:
        print("== SQLite (WAL, synchronous=FULL)")
        minimal: dict[int, list[Round]] = {n: [] for n in sweep}
        on_jobs: dict[int, list[Round]] = {n: [] for n in sweep}
        for r in range(rounds):
            bare = jobs / sqlite_bare_claim_loop(tmp / f"bare{r}.sqlite3", jobs)
            bare_jobs = jobs / sqlite_bare_jobs_claim_loop(tmp / f"bare-jobs{r}.sqlite3", jobs)
            for n in in_turn(sweep, r):
                url = f"sqlite:///{tmp / f'jobs{n}-{r}.sqlite3'}"
                ours, cpu, cores = drain(url, tmp, jobs, n, returning)
                minimal[n].append((ours, cpu, bare, cores))
                on_jobs[n].append((ours, cpu, bare_jobs, cores))
        label = f"drain {jobs:,} {_kind(returning)} jobs"
        for n in sweep:
            rounds_report(f"{label}, {n} process(es), bare loop on a minimal table", minimal[n])
            rounds_report(f"{label}, {n} process(es), bare loop on x_jobs", on_jobs[n])
        scaling_report(label, minimal)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_postgres(jobs: int, sweep: list[int], returning: bool, rounds: int) -> None:
    import psycopg
    from bench_pg import _url, bare_claim_processes, bare_copy, bench_database

    from pgcluster import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="u3drain-pg-"))
    cluster = Cluster.create()
    try:
        dsn = bench_database(cluster)
        table = '"ultimat3_jobs".x_jobs'
        print("== PostgreSQL (throwaway cluster, fsync on)")
        measured: dict[int, list[Round]] = {n: [] for n in sweep}
        for r in range(rounds):
            for n in in_turn(sweep, r):
                # The bare loop in as many processes, then the library, each on a fresh table.
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("TRUNCATE ultimat3_jobs.x_jobs")
                    bare_copy(conn, table, jobs)
                bare = bare_claim_processes(dsn, table, n)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("TRUNCATE ultimat3_jobs.x_jobs")
                ours, cpu, cores = drain(_url(dsn), tmp, jobs, n, returning)
                measured[n].append((ours, cpu, bare, cores))
        label = f"drain {jobs:,} {_kind(returning)} jobs"
        for n in sweep:
            rounds_report(f"{label}, {n} process(es), bare loop in as many", measured[n])
        scaling_report(label, measured, bare_too=True)
    finally:
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _kind(returning: bool) -> str:
    return "returning" if returning else "no-op"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument(
        "--limited",
        type=int,
        default=0,
        help="give the no-op job a concurrency limit of N per key (ten keys); 0: none",
    )
    parser.add_argument(
        "--processes", default="1", help="comma-separated worker process counts, e.g. 1,2,4"
    )
    parser.add_argument(
        "--returning",
        action="store_true",
        help="each job returns its input ({'i': n}), so each completion stores a result",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="bare loop and library take turns this many times"
    )
    args = parser.parse_args(argv)
    sweep = [int(p) for p in args.processes.split(",")]
    if args.limited:
        os.environ["BENCH_LIMIT"] = str(args.limited)  # read by benchjobs, here and in workers
    if args.driver in ("sqlite", "all"):
        bench_sqlite(args.jobs, sweep, args.returning, args.rounds)
    if args.driver in ("postgres", "all"):
        bench_postgres(args.jobs, sweep, args.returning, args.rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
