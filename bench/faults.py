"""Fault measurements with real worker processes and real signals (not part of CI).

    python bench/faults.py poison      # 1 poison of each kind + 200 normal jobs, 2 workers
    python bench/faults.py kill-loop   # kill -9 a worker at random over 2,000 jobs and 3 poison
    python bench/faults.py kill-loop --jobs 500 --postgres   # smaller, on PostgreSQL
    python bench/faults.py prune       # a full-speed drain with retention=1s: finished rows
    python bench/faults.py all

Each prints what it measured; ``--url`` points it at PostgreSQL instead of a SQLite file.
Jobs are those of ``tests/app/faultjobs.py``; their handler appends ``id attempt pid start`` to
an fsync'd ledger before it does anything, which is what "started" is checked against.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAULTS = HERE.parent / "tests" / "app"
ARGS = (
    "--lease",
    "1s",
    "--heartbeat",
    "300ms",
    "--rescue-interval",
    "200ms",
    "--poll-interval",
    "100ms",
)


def _env(url: str, ledger: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "FAULT_LEDGER": str(ledger),
        "PYTHONPATH": str(FAULTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _spawn(
    env: dict[str, str], *extra: str, args: tuple[str, ...] = ARGS
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ultimat3.jobs", "--app", "faultjobs:app", "worker", *args, *extra],
        env=env,
        cwd=FAULTS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _ledger(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(
        line.split()[0] for line in path.read_text().splitlines() if line.endswith("start")
    )


def _app(url: str, ledger: Path):  # type: ignore[no-untyped-def]
    os.environ.update(_env(url, ledger))
    sys.path.insert(0, str(FAULTS))
    import faultjobs

    return faultjobs


def poison(url: str, ledger: Path) -> None:
    fj = _app(url, ledger)
    app = fj.app
    bad = {h.name: h.enqueue({}).id for h in (fj.suicide, fj.aborts, fj.segfaults)}
    normal = [r.id for r in app.enqueue_many(fj.ledger, [{"sleep": 0.01}] * 200)]
    env = _env(url, ledger)
    procs = [_spawn(env, "-c", "4"), _spawn(env, "-c", "4")]
    started, restarts = time.monotonic(), 0
    while True:
        dead = all(app.get_job(i).state.value == "dead" for i in bad.values())
        if dead and app.count_jobs(state="completed") == len(normal):
            break
        if time.monotonic() - started > 300:
            print("did not settle within 300 s")
            break
        for n, proc in enumerate(procs):
            if proc.poll() is not None:
                restarts += 1
                procs[n] = _spawn(env, "-c", "4")
        time.sleep(0.05)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    starts = _ledger(ledger)
    runs = Counter(starts[i] for i in normal)
    print(f"poison: settled in {time.monotonic() - started:.1f} s, {restarts} worker restarts")
    print(f"  normal jobs completed: {app.count_jobs(state='completed')}/{len(normal)}")
    print(f"  normal jobs by number of starts: {dict(sorted(runs.items()))}")
    for name, job_id in bad.items():
        found = app.get_job(job_id)
        kinds = Counter(e.kind for e in found.errors)
        print(f"  {name}: {found.state.value} after {found.attempt} attempts {dict(kinds)}")


def kill_loop(url: str, ledger: Path, jobs: int = 2000) -> None:
    """kill -9 a worker every 0.3-1.2 s over ``jobs`` healthy jobs and one poison job of each
    kind, all on their own retry policy (3 attempts). Target: no healthy job dead or charged
    an attempt it did not use, each poison job dead after exactly its maximum attempts."""
    fj = _app(url, ledger)
    app = fj.app
    ids = [r.id for r in app.enqueue_many(fj.ledger, [{"sleep": 0.02}] * jobs)]
    bad = {h.name: h.enqueue({}).id for h in (fj.suicide, fj.aborts, fj.segfaults)}
    env = _env(url, ledger)
    rng = random.Random(7)
    # A 3 s lease: with the 1 s one of the other runs, a worker starved of CPU for a second
    # (imports of restarting workers, the server, on 2 cores) loses live leases to the rescuer.
    slow = (
        "--lease",
        "3s",
        "--heartbeat",
        "1s",
        "--rescue-interval",
        "500ms",
        "--poll-interval",
        "100ms",
    )
    procs = [_spawn(env, "-c", "8", args=slow), _spawn(env, "-c", "8", args=slow)]
    kills, restarts, started = 0, 0, time.monotonic()

    def settled() -> bool:
        if app.count_jobs(state=["available", "scheduled", "running"]):
            return False
        return all(app.get_job(i).state.value == "dead" for i in bad.values())

    next_kill = started + rng.uniform(0.3, 1.2)
    while not settled() and time.monotonic() - started < 600:
        time.sleep(0.05)
        for n, proc in enumerate(procs):
            if proc.poll() is not None:  # a poison job took it down
                restarts += 1
                procs[n] = _spawn(env, "-c", "8", args=slow)
        if time.monotonic() >= next_kill and app.count_jobs(state="completed") < jobs:
            next_kill = time.monotonic() + rng.uniform(0.3, 1.2)
            victim = rng.randrange(len(procs))
            if procs[victim].poll() is None:
                procs[victim].kill()
                kills += 1
            procs[victim].wait()
            procs[victim] = _spawn(env, "-c", "8", args=slow)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    starts = _ledger(ledger)
    healthy = [app.get_job(i) for i in ids]
    dead = [j for j in healthy if j.state.value == "dead"]
    charged = [j for j in healthy if j.attempt > 1]
    lost = [j for j in healthy if j.attempt > starts[j.id]]
    took = time.monotonic() - started
    print(f"kill-loop on {app.driver.name}: {jobs} jobs + {len(bad)} poison, {took:.1f} s")
    print(f"  {kills} kill -9, {restarts} restarts after a poison job's crash")
    print(f"  healthy completed: {sum(j.state.value == 'completed' for j in healthy)}/{jobs}")
    print(f"  healthy dead: {len(dead)}")
    print(f"  healthy charged more than one attempt: {len(charged)}")
    print(f"  healthy whose attempts exceed their starts (an attempt lost unstarted): {len(lost)}")
    rescued = Counter(
        "charged" if "ran alone" in e.message else "given back"
        for j in healthy
        for e in j.errors
        if e.kind == "worker_lost"
    )
    print(f"  healthy worker_lost rescues: {dict(rescued)}")
    for job in (dead + charged)[:10]:
        kinds = [e.kind for e in job.errors]
        ran = starts[job.id]
        print(f"    {job.id}: {job.state.value}, {job.attempt} attempts, {ran} starts, {kinds}")
    for name, job_id in bad.items():
        found = app.get_job(job_id)
        alone = sum("ran alone" in e.message for e in found.errors)
        print(
            f"  poison {name}: {found.state.value} after {found.attempt} attempts of"
            f" {found.max_attempts}, {len(found.errors)} rescues ({alone} alone)"
        )


def prune(url: str, ledger: Path, jobs: int = 100_000) -> None:
    sys.path.insert(0, str(HERE))
    os.environ["ULTIMAT3_JOBS_URL"] = url
    import benchjobs  # type: ignore[import-not-found]

    app, handle = benchjobs.app, benchjobs.noop
    worker = app.worker(concurrency=10, retention="1s", poll_interval="20ms")
    worker.maintenance.config.prune_batch = 2_000
    peak, started = 0, time.monotonic()
    with worker:
        for _ in range(jobs // 1000):
            app.enqueue_many(handle, [{}] * 1000)
            peak = max(peak, app.count_jobs(state="completed"))
        while app.count_jobs(state=["available", "running"]) and time.monotonic() - started < 600:
            peak = max(peak, app.count_jobs(state="completed"))
            time.sleep(0.2)
        time.sleep(12)  # one prune interval (10 s) and the retention
        left = app.count_jobs(state="completed")
    rate = jobs / (time.monotonic() - started)
    print(f"prune: {jobs} jobs drained at ~{rate:,.0f}/s with retention=1s")
    print(f"  finished rows at most {peak:,} while draining; {left:,} left 12 s after")
    if app.driver.name == "postgres":
        with app.driver._connection() as conn:  # type: ignore[attr-defined]
            row = conn.execute(
                "SELECT n_live_tup, n_dead_tup, pg_total_relation_size(relid)"
                " FROM pg_stat_user_tables WHERE relname = 'x_jobs'"
            ).fetchone()
        print(f"  x_jobs: {row[0]} live, {row[1]} dead tuples, {row[2] / 1e6:.1f} MB")
    else:
        size = Path(app.driver.display_url[len("sqlite:///") :]).stat().st_size
        print(f"  file: {size / 1e6:.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("what", choices=["poison", "kill-loop", "prune", "all"])
    parser.add_argument("--url", help="a PostgreSQL URL (default: a fresh SQLite file)")
    parser.add_argument(
        "--postgres", action="store_true", help="on a throwaway PostgreSQL cluster (initdb)"
    )
    parser.add_argument("--jobs", type=int, default=2000, help="kill-loop: healthy jobs")
    args = parser.parse_args()
    cluster = None
    if args.postgres:
        sys.path.insert(0, str(HERE.parent / "tests"))
        import psycopg

        from pgcluster import Cluster  # type: ignore[import-not-found]

        cluster = Cluster.create()
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE faults")
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(cluster.dsn("faults"))
        args.url = f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"
    try:
        for what in ["poison", "kill-loop", "prune"] if args.what == "all" else [args.what]:
            scratch = Path(tempfile.mkdtemp(prefix=f"u3j-{what}-"))
            url = args.url or f"sqlite:///{scratch / 'jobs.sqlite3'}"
            if what == "kill-loop":
                kill_loop(url, scratch / "ledger", args.jobs)
            else:
                {"poison": poison, "prune": prune}[what](url, scratch / "ledger")
            sys.modules.pop("faultjobs", None)
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main()
