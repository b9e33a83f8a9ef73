"""Concurrency limits across real worker processes: six `ultimat3-jobs worker` processes on one
database, with far more free handlers than the limits allow. The largest overlap is read from
the ledger the handlers write (start and end times), not from the library's counters."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contract.helpers import max_overlap  # tests/ is on the path, as for pgcluster
from ultimat3.jobs import App

from .processes import HERE, wait_until

PROCESSES = 6
WORKER = ("worker", "--concurrency", "4", "--poll-interval", "200ms", "--lease", "10s")


@pytest.fixture
def limit_app(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    for key in ("ULTIMAT3_JOBS_URL", "LIMIT_LEDGER"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("limitjobs", None)
    import limitjobs

    limitjobs.app.open()
    yield limitjobs.app
    limitjobs.app.close()
    sys.modules.pop("limitjobs", None)


@pytest.fixture
def workers(env: dict[str, str]) -> Iterator[Callable[[], list[subprocess.Popen[bytes]]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> list[subprocess.Popen[bytes]]:
        for _ in range(PROCESSES):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ultimat3.jobs", "--app", "limitjobs:app", *WORKER],
                    env=env,
                    cwd=HERE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        return procs

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def read_ledger(env: dict[str, str]) -> list[tuple[str, int, float, float]]:
    path = Path(env["LIMIT_LEDGER"])
    rows = []
    for line in path.read_text().splitlines():
        partition, pid, start, end = line.split()
        rows.append((partition, int(pid), float(start), float(end)))
    return rows


@pytest.mark.slow
def test_six_worker_processes_never_exceed_the_limits(
    limit_app: App, env: dict[str, str], workers: Callable[[], list[subprocess.Popen[bytes]]]
) -> None:
    import limitjobs

    limit_app.enqueue_many(
        limitjobs.per_account, [{"account": n % 3, "sleep": 0.05} for n in range(60)]
    )
    limit_app.enqueue_many(limitjobs.whole_job, [{"sleep": 0.05} for _ in range(30)])
    limit_app.enqueue_many(limitjobs.unlimited, [{"sleep": 0.05} for _ in range(30)])
    limit_app.enqueue_many(limitjobs.rated, [{"sleep": 0.01} for _ in range(20)])
    procs = workers()
    wait_until(lambda: limit_app.count_jobs(state="completed") == 140, 180, "every job to complete")
    rows = read_ledger(env)
    assert len(rows) == 140
    peaks = {
        partition: max_overlap([(s, e) for p, _, s, e in rows if p == partition])
        for partition in {p for p, _, _, _ in rows}
    }
    print("max overlap per partition:", dict(sorted(peaks.items())))
    starts = sorted(s for p, _, s, _ in rows if p == "rated")
    # At most 5 starts per second. The limit holds for the claims (each job's attempted_at, on
    # the database's clock): any window of one second holds at most 5. A handler starts a
    # little after its claim, by however long a loaded machine takes to hand it over, so in
    # the handlers' own ledger a window shorter by that lag holds at most 5: 0.5 s is allowed.
    claimed = sorted(
        j.attempted_at.timestamp()
        for j in limit_app.list_jobs(name=limitjobs.rated.name, limit=100)
        if j.attempted_at is not None
    )
    assert len(claimed) == 20
    by_claim = max(sum(1 for t in claimed if s <= t < s + 1.0) for s in claimed)
    busiest = max(sum(1 for t in starts if s <= t < s + 0.5) for s in starts)
    span = starts[-1] - starts[0]
    print(
        f"rated: busiest 1 s window of claims {by_claim}, 0.5 s window of handler starts"
        f" {busiest}; 20 starts over {span:.2f} s"
    )
    assert by_claim <= 5, claimed
    assert busiest <= 5, starts
    assert span >= 2.9, f"20 starts at 5 per second take at least 3 windows, not {span:.2f} s"
    for account in ("account=0", "account=1", "account=2"):
        assert peaks[account] <= 2, peaks
    assert peaks["whole_job"] <= 3, peaks
    del peaks["rated"]
    # The limits bound what runs together, not what runs at all: work spread over processes.
    assert len({pid for _, pid, _, _ in rows}) >= 2
    assert max(peaks.values()) >= 2, f"nothing ran in parallel: {peaks}"
    for proc in procs:
        proc.terminate()
