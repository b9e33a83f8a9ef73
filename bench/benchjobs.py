"""Jobs the benchmark's worker process runs (`--app benchjobs:app`)."""

from __future__ import annotations

import os
import time
from typing import Any

from ultimat3.jobs import App, Limit, job

_out = os.environ.get("BENCH_LATENCY_FILE", "")
#: drain.py --limited N: the no-op job has a concurrency limit of N per key (ten keys).
_LIMIT = int(os.environ.get("BENCH_LIMIT", "0"))


def _noop(input: Any) -> None:
    return None


if _LIMIT:
    noop = job(name="noop", concurrency=Limit(_LIMIT, key=lambda o: o["i"] % 10))(_noop)
else:
    noop = job(name="noop")(_noop)


@job(queue="latency")
def stamp(input: dict[str, Any]) -> None:
    """Records how long after its enqueue it started (same host, same clock)."""
    started = time.time()
    with open(_out, "a") as f:
        f.write(f"{started - input['t']:.6f}\n")


app = App(os.environ["ULTIMAT3_JOBS_URL"], modules=[__import__(__name__)])
