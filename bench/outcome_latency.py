"""Outcome write latency with a real worker process (not part of CI).

    python bench/outcome_latency.py                          # SQLite, a temp file
    python bench/outcome_latency.py --url postgresql://...   # PostgreSQL (migrated here)
    python bench/outcome_latency.py --cluster                # PostgreSQL, a throwaway cluster
    python bench/outcome_latency.py --restart-cluster        # PostgreSQL restart drain time

One ``ultimat3-jobs worker --poll-interval 60s`` process; jobs enqueued one at a time, each
sleeping ``--sleep`` seconds (so that the worker's leader has gone to sleep by the time it
returns) and returning the wall time of its return (``faultjobs.stamped``). This process reads
the job's state every 0.5 ms: the latency is when it first reads ``completed`` minus that
return time (an upper bound: it includes up to one read). Printed: p50, p90 and max in ms.

``--restart-cluster`` starts a throwaway cluster (``tests/pgcluster.py``), drains 1,500 jobs
with two workers (``--poll-interval 60s``), stops the server with ``-m immediate`` once 300
are done, starts it again, and prints how long the rest took after the restart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAULTS = HERE.parent / "tests" / "app"


def _env(url: str, ledger: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "FAULT_LEDGER": str(ledger),
        "PYTHONPATH": str(FAULTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _spawn(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ultimat3.jobs", "--app", "faultjobs:app", "worker", *args],
        env=env,
        cwd=FAULTS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _faultjobs(url: str, ledger: Path):  # type: ignore[no-untyped-def]
    os.environ.update(_env(url, ledger))
    sys.path.insert(0, str(FAULTS))
    import faultjobs

    faultjobs.app.driver.migrate()
    return faultjobs


def latency(url: str, jobs: int, sleep: float) -> None:
    ledger = Path(tempfile.mkdtemp()) / "ledger"
    fj = _faultjobs(url, ledger)
    app = fj.app
    worker = _spawn(_env(url, ledger), "--concurrency", "4", "--poll-interval", "60s")
    try:
        while not app.workers():
            time.sleep(0.05)
        seen: list[float] = []
        for _ in range(jobs):
            job_id = fj.stamped.enqueue({"sleep": sleep}).id
            deadline = time.monotonic() + 30
            while True:
                job = app.get_job(job_id)
                if job.state.value == "completed":
                    now = time.time()
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} not completed after 30 s: {job.state}")
                time.sleep(0.0005)
            returned = app.result(job_id, timeout=1)
            seen.append((now - returned) * 1000)
        seen.sort()
        p50 = statistics.median(seen)
        p90 = seen[int(len(seen) * 0.9) - 1]
        print(
            f"{app.driver.name}: outcome visible after the handler returned, {jobs} jobs: "
            f"p50 {p50:.1f} ms, p90 {p90:.1f} ms, max {seen[-1]:.1f} ms"
        )
    finally:
        worker.terminate()
        worker.wait()
        app.close()


def restart() -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from pgcluster import Cluster

    cluster = Cluster.create()
    try:
        url = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
        ledger = Path(tempfile.mkdtemp()) / "ledger"
        fj = _faultjobs(url, ledger)
        app = fj.app
        app.enqueue_many(fj.stamped, [{"sleep": 0.01}] * 1500)
        args = ("--concurrency", "4", "--lease", "30s", "--poll-interval", "60s")
        workers = [_spawn(_env(url, ledger), *args) for _ in range(2)]
        try:
            while app.count_jobs(state="completed") < 300:
                time.sleep(0.01)
            cluster.stop("immediate")
            cluster.start()
            restarted = time.monotonic()
            while app.count_jobs(state="completed") + app.count_jobs(state="dead") < 1500:
                time.sleep(0.05)
                if time.monotonic() - restarted > 120:
                    raise SystemExit("not drained 120 s after the restart")
            drained = time.monotonic() - restarted
            dead = app.count_jobs(state="dead")
            print(
                f"postgres restart: drained {drained:.1f} s after the restart "
                f"(1500 jobs, 2 workers, --poll-interval 60s); dead {dead}"
            )
        finally:
            for proc in workers:
                proc.terminate()
                proc.wait()
            app.close()
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--restart-cluster", action="store_true")
    options = parser.parse_args()
    if options.restart_cluster:
        restart()
        return
    if options.cluster:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from pgcluster import Cluster

        cluster = Cluster.create()
        try:
            url = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
            latency(url, options.jobs, options.sleep)
        finally:
            cluster.close()
        return
    url = options.url or f"sqlite:///{tempfile.mkdtemp()}/latency.sqlite3"
    latency(url, options.jobs, options.sleep)


if __name__ == "__main__":
    main()
