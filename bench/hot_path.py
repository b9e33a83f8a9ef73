"""CPU per job of the library's own hot paths, in this process: enqueue (one by one and in
batches) and a drain by ``worker.drain()``, on the memory driver (no I/O: the Python code
alone) and on SQLite (its C library runs in this process too, so triggers and statements
count; waiting for the disk does not). CPU time, not wall time, so that other load on the
machine moves the figures less; compare two checkouts by running it with each on
``PYTHONPATH``:

    PYTHONPATH=/path/to/other/src python bench/hot_path.py
    python bench/hot_path.py

Prints the best of ``--rounds`` in microseconds of CPU per job. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

import ultimat3.jobs
from ultimat3.jobs import App, job


@job
def noop(input: dict[str, int]) -> None:
    pass


def cpu_per_job(call: Callable[[], int]) -> float:
    started = time.process_time()
    n = call()
    return (time.process_time() - started) / n * 1e6


def one_round(url: str, jobs: int) -> dict[str, float]:
    module = types.ModuleType("hot_path_jobs")
    module.noop = noop  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    app = App(url, modules=[module])
    try:
        app.open()
        singles = jobs // 10

        def single() -> int:
            for i in range(singles):
                noop.enqueue({"i": i})
            return singles

        def batches() -> int:
            for start in range(0, jobs, 1000):
                app.enqueue_many(noop, [{"i": i} for i in range(start, start + 1000)])
            return jobs

        def drain() -> int:
            stats = app.worker(concurrency=10).drain()
            return stats.completed

        return {
            "enqueue one by one": cpu_per_job(single),
            "enqueue_many (1000 a call)": cpu_per_job(batches),
            "drain (worker.drain)": cpu_per_job(drain),
        }
    finally:
        app.close()
        sys.modules.pop(module.__name__, None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"ultimat3.jobs from {Path(ultimat3.jobs.__file__).parent}")
    for name in ("memory", "sqlite"):
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            tmp = Path(tempfile.mkdtemp(prefix="u3hot-"))
            try:
                url = "memory://" if name == "memory" else f"sqlite:///{tmp / 'jobs.sqlite3'}"
                for what, us in one_round(url, args.jobs).items():
                    best[what] = min(best.get(what, us), us)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        for what, us in best.items():
            print(f"  {name:<7} {what:<28} {us:8.1f} us CPU/job")


if __name__ == "__main__":
    main()
