"""Throughput and latency, per driver, each beside the bare-SQL baseline measured in the same run.

    python bench/run.py                 # SQLite (and PostgreSQL when its binaries are present)
    python bench/run.py --driver sqlite --quick
    python bench/run.py --driver postgres --processes 1,2,4   # and a --processes sweep
    python bench/run.py --driver postgres --quick --pgbouncer   # also through PgBouncer

Figures are jobs per second and latency percentiles on this machine, noisy by nature: quote
them as ratios to the baselines printed beside them. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f}/s"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class Table:
    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[str, str, str]] = []

    def add(self, what: str, ours: str, baseline: str = "") -> None:
        self.rows.append((what, ours, baseline))
        print(f"  {what:<48} {ours:>20}   {baseline}", flush=True)

    def header(self) -> None:
        print(f"\n== {self.title}")
        print(f"  {'measure':<48} {'ultimat3-jobs':>20}   baseline (bare SQL, same run)")


# -- SQLite baselines ----------------------------------------------------------------------


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("pragma journal_mode=wal")
    conn.execute("pragma synchronous=full")
    conn.execute("pragma busy_timeout=30000")
    return conn


def interleaved_rates(steps: list[Callable[[int], None]], blocks: int, size: int) -> list[float]:
    """Operations per second of each ``step(i)``, the steps taking turns in blocks of ``size``
    (one untimed block each first), so the machine's drift and the disk's slow moments reach
    all of them alike. ``blocks * size`` operations of each are timed."""
    spent = [0.0] * len(steps)
    for block in range(blocks + 1):
        for k, step in enumerate(steps):
            started = time.perf_counter()
            for i in range(block * size, (block + 1) * size):
                step(i)
            if block:
                spent[k] += time.perf_counter() - started
    return [blocks * size / seconds for seconds in spent]


def sqlite_single_steps(
    tmp: Path,
) -> tuple[list[tuple[str, Callable[[int], None]]], Callable[[], None]]:
    """The bare single-enqueue loops, one step each: a one-row INSERT into a two-column table,
    and a keyless job INSERTed into ``x_jobs`` (the library's schema in a file of its own),
    each its own write transaction; and the function that closes their files."""
    from ultimat3.jobs.ids import uuid7

    minimal = sqlite_connect(tmp / "bare-single.sqlite3")
    minimal.execute("create table if not exists t(id integer primary key, v text)")
    sqlite_job_table(tmp / "bare-single-jobs.sqlite3")
    jobs = sqlite_connect(tmp / "bare-single-jobs.sqlite3")

    def one_row(i: int) -> None:
        minimal.execute("begin immediate")
        minimal.execute("insert into t(v) values (?)", (f"v{i}",))
        minimal.execute("commit")

    def into_jobs(i: int) -> None:
        j = uuid7()
        jobs.execute("begin immediate")
        jobs.execute(BARE_JOB_INSERT, (j, j))
        jobs.execute("commit")

    def close() -> None:
        minimal.close()
        jobs.close()

    return [("one-row INSERT", one_row), ("into x_jobs", into_jobs)], close


def sqlite_bare_executemany(path: Path, n: int) -> float:
    conn = sqlite_connect(path)
    conn.execute("create table if not exists m(id integer primary key, v text)")
    rows = [(f"v{i}",) for i in range(n)]
    started = time.perf_counter()
    conn.execute("begin immediate")
    conn.executemany("insert into m(v) values (?)", rows)
    conn.execute("commit")
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def sqlite_bare_claim_loop(path: Path, n: int) -> float:
    conn = sqlite_connect(path)
    conn.execute("create table if not exists q(id integer primary key, state text, lease text)")
    conn.execute("create index if not exists q_avail on q(id) where state = 'available'")
    conn.execute("begin immediate")
    conn.executemany("insert into q(state) values ('available')", [()] * n)
    conn.execute("commit")
    started = time.perf_counter()
    while True:
        conn.execute("begin immediate")
        ids = [
            r[0]
            for r in conn.execute(
                "update q set state = 'running', lease = 'x' where id in "
                "(select id from q where state = 'available' order by id limit 10) returning id"
            )
        ]
        conn.execute("commit")
        if not ids:
            break
        conn.execute("begin immediate")
        conn.executemany(
            "update q set state = 'completed' where id = ? and lease = 'x'", [(i,) for i in ids]
        )
        conn.execute("commit")
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


#: A keyless job (its key is its id) inserted by hand into the library's SQLite table: the
#: columns without defaults, in the bare queue.
BARE_JOB_INSERT = (
    "insert into x_jobs (id, name, queue, input, idempotency_key, priority, state, "
    "max_attempts, run_at, created_at) values (?,'bench.bare','bare','{}',?,0,'available',3,1,1)"
)


def sqlite_job_table(path: Path) -> None:
    """The library's own schema in a fresh file, for the bare loops that run on it: the
    table, its indexes and its triggers, with no library code in the loop."""
    from ultimat3.jobs.drivers.sqlite import SqliteDriver

    driver = SqliteDriver(str(path))
    driver.migrate()
    driver.close()


def sqlite_bare_jobs_executemany(path: Path, n: int) -> float:
    """Rows per second of a bare ``executemany`` INSERT of n keyless jobs into ``x_jobs``."""
    from ultimat3.jobs.ids import uuid7_many

    sqlite_job_table(path)
    conn = sqlite_connect(path)
    rows = [(i, i) for i in uuid7_many(n)]
    started = time.perf_counter()
    conn.execute("begin immediate")
    conn.executemany(BARE_JOB_INSERT, rows)
    conn.execute("commit")
    elapsed = time.perf_counter() - started
    conn.execute("delete from x_jobs")
    conn.close()
    return n / elapsed


def sqlite_bare_jobs_claim_loop(path: Path, n: int) -> float:
    """Seconds for the bare claim-10/ack-10 loop over n jobs of ``x_jobs`` (the file's own
    schema from ``sqlite_job_table``): the claim through the claim index, a lease token and
    expiry, each ack fenced by the token, each step a write transaction of its own."""
    from ultimat3.jobs.ids import token, uuid7_many

    sqlite_job_table(path)
    conn = sqlite_connect(path)
    conn.execute("begin immediate")
    conn.executemany(BARE_JOB_INSERT, [(i, i) for i in uuid7_many(n)])
    conn.execute("commit")
    claim = (
        "update x_jobs set state = 'running', attempt = attempt + 1, lease_token = :t, "
        "lease_expires_at = :exp where id in (select id from x_jobs where queue = 'bare' "
        "and state in ('scheduled', 'available') and limit_key is null "
        "order by priority desc, run_at, id limit 10) returning id"
    )
    ack = (
        "update x_jobs set state = 'completed', finished_at = ?, lease_token = null, "
        "lease_expires_at = null where id = ? and lease_token = ?"
    )
    started = time.perf_counter()
    while True:
        tok = token()
        conn.execute("begin immediate")
        ids = [r[0] for r in conn.execute(claim, {"t": tok, "exp": 2**40})]
        conn.execute("commit")
        if not ids:
            break
        conn.execute("begin immediate")
        conn.executemany(ack, [(2**40, i, tok) for i in ids])
        conn.execute("commit")
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def sqlite_bare_data_version_latency(path: Path, samples: int) -> list[float]:
    watcher = sqlite_connect(path)
    writer = sqlite_connect(path)
    writer.execute("create table if not exists dv(id integer primary key)")
    seen: list[float] = []
    for _ in range(samples):
        base = watcher.execute("pragma data_version").fetchone()[0]
        stamp: list[float] = []

        def write(stamp: list[float] = stamp) -> None:
            time.sleep(0.005)
            stamp.append(time.perf_counter())
            writer.execute("insert into dv default values")

        t = threading.Thread(target=write)
        t.start()
        while watcher.execute("pragma data_version").fetchone()[0] == base:
            time.sleep(0.001)
        noticed = time.perf_counter()
        t.join()
        seen.append(noticed - stamp[0])
    watcher.close()
    writer.close()
    return seen


# -- library measures (any driver) ---------------------------------------------------------


def load_app(url: str, tmp: Path) -> Any:
    os.environ["ULTIMAT3_JOBS_URL"] = url
    os.environ["BENCH_LATENCY_FILE"] = str(tmp / "latency.txt")
    sys.path.insert(0, str(HERE))
    sys.modules.pop("benchjobs", None)
    import benchjobs

    benchjobs.app.open()  # open + migrate outside the timings
    return benchjobs


def spawn_worker(url: str, tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "BENCH_LATENCY_FILE": str(tmp / "latency.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "ultimat3.jobs", "--app", "benchjobs:app", "worker", *args],
        env=env,
        cwd=HERE,
        stdout=subprocess.DEVNULL,
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its children (a ``--processes`` pool)."""
    total = cpu_seconds(pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def drained_span(url: str) -> tuple[float, float]:
    """(first claim, last completion) of the jobs of queue ``default``, in epoch seconds, as the
    database recorded them."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            first, last = conn.execute(
                "SELECT min(attempted_at), max(finished_at) FROM x_jobs WHERE queue = 'default'"
            ).fetchone()
        finally:
            conn.close()
        return first / 1e6, last / 1e6
    import psycopg

    with psycopg.connect(url.split("?")[0]) as pg:  # our URL options are not libpq's
        row = pg.execute(
            "SELECT extract(epoch FROM min(attempted_at)), extract(epoch FROM max(finished_at))"
            " FROM ultimat3_jobs.x_jobs WHERE queue = 'default'"
        ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


def drain_rate(app: Any, url: str, tmp: Path, total: int, *args: str) -> float:
    """Jobs per second of one worker process (``args`` its options) over a backlog of
    ``total`` jobs, from the database's own timestamps; progress is polled twice a second, so
    the poll does not load the database it measures."""
    worker = spawn_worker(url, tmp, "--queue", "default", "--poll-interval", "100ms", *args)
    deadline = time.monotonic() + 600
    while app.count_jobs(state="completed") < total and time.monotonic() < deadline:
        time.sleep(0.5)
    worker.terminate()
    worker.wait()
    first, last = drained_span(url)
    return total / (last - first)


def measure_library(
    table: Table,
    url: str,
    tmp: Path,
    quick: bool,
    baselines: dict[str, float],
    in_tx: Callable[[Any, int], list[float]],
) -> None:
    bj = load_app(url, tmp)
    app = bj.app
    # Ours and each bare loop take turns in blocks of 50, so a slow moment of the disk does
    # not land on one side only.
    bare_steps = baselines["single"]
    blocks = 20 if quick else 60
    n_single = (blocks + 1) * 50  # the untimed first block enqueues too
    rates = interleaved_rates(
        [lambda i: bj.noop.enqueue({"i": i}), *(step for _, step in bare_steps)], blocks, 50
    )
    single, bare_rates = rates[0], rates[1:]
    table.add(
        "single enqueue (one commit each, interleaved)",
        f"{single:>12,.0f}/s",
        "; ".join(
            f"{label} {bare:,.0f}/s (ratio {single / bare:.2f})"
            for (label, _), bare in zip(bare_steps, bare_rates, strict=True)
        ),
    )

    n_bulk = 50_000 if quick else 200_000
    inputs = [{"i": i} for i in range(n_bulk)]
    calls = []  # each call timed on its own: the median, so one slow moment is not the row
    for chunk in range(0, n_bulk, 10_000):
        started = time.perf_counter()
        app.enqueue_many(bj.noop, inputs[chunk : chunk + 10_000])
        calls.append(time.perf_counter() - started)
    table.add(
        f"bulk enqueue (10,000 per call, median of {len(calls)})",
        rate(10_000, statistics.median(calls)),
        f"{baselines['bulk']:,.0f}/s {baselines['bulk_label']}",
    )

    total = n_single + n_bulk
    drained = drain_rate(app, url, tmp, total)
    on_jobs = ""
    if "claim_jobs" in baselines:  # SQLite: the loop on a minimal table, and on x_jobs
        on_jobs = f"; on x_jobs {baselines['claim_jobs']:,.0f}/s (ratio {drained / baselines['claim_jobs']:.2f})"
    table.add(
        f"drain {total:,} no-op jobs (1 worker process, defaults)",
        f"{drained:>12,.0f}/s",
        f"{baselines['claim']:,.0f}/s bare claim-10/ack-10 loop  (ratio {drained / baselines['claim']:.2f})"
        + on_jobs,
    )

    worker = spawn_worker(url, tmp, "--queue", "latency", "--poll-interval", "1s")
    time.sleep(1.5)
    out = tmp / "latency.txt"
    out.unlink(missing_ok=True)
    n_lat = 250 if quick else 500
    for _ in range(n_lat):
        bj.stamp.enqueue({"t": time.time()})
        time.sleep(1 / 50)
    time.sleep(1.0)
    lat = [float(x) * 1000 for x in out.read_text().split()]
    table.add(
        f"enqueue-to-start at 50 jobs/s ({len(lat)} jobs) p50/p95/p99",
        f"{pct(lat, 50):.2f}/{pct(lat, 95):.2f}/{pct(lat, 99):.2f} ms",
        baselines.get("wake_label", ""),
    )
    out.unlink()
    idle_samples: list[float] = []
    cpu_idle = 0.0
    for _ in range(3 if quick else 5):
        before = cpu_seconds(worker.pid)
        time.sleep(5)
        cpu_idle = (cpu_seconds(worker.pid) - before) / 5
        bj.stamp.enqueue({"t": time.time()})
        time.sleep(0.5)
    idle_samples = [float(x) * 1000 for x in out.read_text().split()]
    table.add(
        f"first job after 5 s idle ({len(idle_samples)} samples) median/max",
        f"{statistics.median(idle_samples):.2f}/{max(idle_samples):.2f} ms",
        f"{statistics.median(idle_samples) / pct(lat, 50):.2f}x the p50 above; "
        + baselines.get("idle_label", ""),
    )
    table.add("idle worker CPU (share of one core)", f"{cpu_idle * 100:.2f} %")
    worker.terminate()
    worker.wait()

    alone, bare, ours, *notify = in_tx(bj, 500 if quick else 2000)
    with_notify = ""
    if notify:  # PostgreSQL: the INSERT that also NOTIFYs, which waking the workers needs
        added = notify[0] - alone
        with_notify = f"; with NOTIFY {added * 1000:.3f} ms, ratio {(ours - alone) / added:.2f}"
    table.add(
        "added cost of one enqueue inside a business tx",
        f"{(ours - alone) * 1000:.3f} ms",
        f"bare INSERT into the job table adds {(bare - alone) * 1000:.3f} ms  "
        f"(ratio {(ours - alone) / (bare - alone):.2f}{with_notify}; "
        f"tx alone {alone * 1000:.3f} ms)",
    )
    app.close()


def kinds_medians(n: int, run: Callable[[int, int], None], kinds: int) -> list[float]:
    """Seconds per ``run(i, kind)``, medians of ``n`` of each kind. The kinds take turns, so
    the machine's drift reaches all of them alike; the first 20 turns are a warm-up."""
    times: list[list[float]] = [[] for _ in range(kinds)]
    for i in range(n + 20):
        for kind in range(kinds):
            started = time.perf_counter()
            run(i, kind)
            if i >= 20:
                times[kind].append(time.perf_counter() - started)
    return [statistics.median(t) for t in times]


def sqlite_in_tx(bj: Any, n: int) -> list[float]:
    """Seconds per business transaction, medians of ``n`` each: alone, with a bare INSERT
    into the job table, with an enqueue."""
    from ultimat3.jobs.ids import uuid7

    app = bj.app
    with app.transaction() as conn:
        conn.execute("create table if not exists orders(id integer primary key, v text)")

    def transaction(i: int, kind: int) -> None:
        with app.transaction() as conn:
            conn.execute("insert into orders(v) values (?)", (f"o{i}",))
            if kind == 1:
                j = uuid7()
                conn.execute(BARE_JOB_INSERT, (j, j))
            elif kind == 2:
                bj.noop.enqueue({"order": i})

    return kinds_medians(n, transaction, 3)


def bench_sqlite(quick: bool) -> None:
    table = Table("SQLite (WAL, synchronous=FULL, default settings)")
    table.header()
    tmp = Path(tempfile.mkdtemp(prefix="u3bench-sqlite-"))
    try:
        single, close_single = sqlite_single_steps(tmp)
        m = 200_000 if quick else 500_000
        bulk = m / sqlite_bare_executemany(tmp / "bare.sqlite3", m)
        bulk_jobs = sqlite_bare_jobs_executemany(tmp / "bare-jobs.sqlite3", m // 4)
        c = 20_000 if quick else 50_000
        claim = c / sqlite_bare_claim_loop(tmp / "bare.sqlite3", c)
        claim_jobs = c / sqlite_bare_jobs_claim_loop(tmp / "bare-jobs.sqlite3", c)
        dv = [x * 1000 for x in sqlite_bare_data_version_latency(tmp / "bare.sqlite3", 50)]
        baselines = {
            "single": single,
            "bulk": bulk,
            "bulk_label": f"executemany rows (into x_jobs: {bulk_jobs:,.0f}/s)",
            "claim": claim,
            "claim_jobs": claim_jobs,
            "wake_label": f"bare data_version poll notices a commit in {statistics.median(dv):.2f} ms p50",
        }
        measure_library(
            table, f"sqlite:///{tmp / 'jobs.sqlite3'}", tmp, quick, baselines, sqlite_in_tx
        )
        close_single()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="Smaller counts (about a minute).")
    parser.add_argument(
        "--processes",
        default="",
        help="Also drain with `worker --processes N` for each N of this comma-separated list "
        "(bench/drain.py, beside its own bare loop).",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="PostgreSQL: measure the library once more through PgBouncer in transaction "
        "mode (?pooler=transaction), on the same cluster in the same run.",
    )
    args = parser.parse_args()
    if args.driver in ("sqlite", "all"):
        bench_sqlite(args.quick)
    if args.driver in ("postgres", "all"):
        try:
            from bench_pg import bench_postgres
        except ImportError as exc:
            print(f"\n== PostgreSQL: skipped ({exc})")
        else:
            bench_postgres(args.quick, Table, measure_library, pgbouncer=args.pgbouncer)
    if args.processes:
        import drain

        sweep = ["--driver", args.driver, "--processes", args.processes]
        drain.main([*sweep, "--jobs", "20000" if args.quick else "50000"])


if __name__ == "__main__":
    main()
