"""Real processes whose wall clock steps: two workers and a scheduler, all started with the
same shifted clock (``clockshift/sitecustomize.py``: the test writes an offset to a file, and
every process's ``time.time``/``time.time_ns`` moves by it at once, as a host-wide ``date -s``
would, the test's own ``time.time_ns`` too, since it enqueues; the machine's clock and the
monotonic clock are left alone).

The steps are +2 h, back, -1 h, back. On SQLite the database's clock is the host's, so it steps
too; on PostgreSQL it stays right. Each fault and its correction happen while four jobs (each
longer than three leases) fill every slot. Expect, on both: no job runs twice, no occurrence of the every-2-seconds task
fires more than 1 s before its time (on the true clock), no gap between fires longer than
one period (plus 1 s) through the faults and after each correction, and every fired job runs
(none waits for a clock that stood ahead when it was fired), and a job delayed 90 s does not
run within the test."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from .processes import HERE, wait_until

PERIOD = 2.0
FAULTS = [2 * 3600, -3600]  # seconds; each is stepped back (corrected) 3 s later


@dataclass
class Host:
    url: str
    env: dict[str, str]
    query: Callable[[str], list[Any]]
    shift: Path
    ledger: Path
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def step(self, seconds: int) -> float:
        self.shift.write_text(str(seconds * 10**9))
        return time.time()  # this process is not shifted: the true time

    def ledger_rows(self) -> list[tuple[str, str]]:
        if not self.ledger.exists():
            return []
        return [
            (parts[0], parts[2])
            for parts in (line.split() for line in self.ledger.read_text().splitlines())
            if len(parts) == 3
        ]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    if request.param == "sqlite":
        db = tmp_path / "clock.sqlite3"
        url = f"sqlite:///{db}"

        def query(sql: str) -> list[Any]:
            with closing(sqlite3.connect(db, timeout=10)) as conn:
                return conn.execute(sql).fetchall()
    else:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        dsn = request.getfixturevalue("pg_dsn")
        p = conninfo_to_dict(dsn)
        url = f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"

        def query(sql: str) -> list[Any]:
            with psycopg.connect(dsn, options="-c search_path=ultimat3_jobs") as conn:
                return conn.execute(sql).fetchall()

    shift = tmp_path / "shift"
    shift.write_text("0")
    env = {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "CLOCK_LEDGER": str(tmp_path / "ledger.txt"),
        "CLOCKSHIFT_FILE": str(shift),
        "PYTHONPATH": os.pathsep.join(
            [str(HERE / "clockshift"), str(HERE), os.environ.get("PYTHONPATH", "")]
        ),
    }
    h = Host(url, env, query, shift, tmp_path / "ledger.txt", tmp_path)
    run = [sys.executable, "-m", "ultimat3.jobs", "--app", "clockjobs:app"]
    subprocess.run([*run, "migrate"], env=env, cwd=HERE, check=True, capture_output=True)
    worker = ["worker", "-c", "2", "--lease", "2s", "--heartbeat", "500ms"]
    worker += ["--rescue-interval", "200ms", "--poll-interval", "100ms"]
    commands = [worker, worker, ["scheduler", "--leader", "sole", "--tick", "200ms"]]
    logs = [(tmp_path / f"proc-{n}.log").open("w") for n in range(len(commands))]
    for command, log in zip(commands, logs, strict=True):
        h.procs.append(
            subprocess.Popen([*run, "-v", *command], env=env, cwd=HERE, stdout=log, stderr=log)
        )
    yield h
    for proc in h.procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for log in logs:
        log.close()


class Fires:
    """Polls the jobs table every 50 ms and notes the true time each occurrence's job appeared."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.seen: dict[datetime, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            rows = self.host.query(
                "select idempotency_key from x_jobs where idempotency_key like 'beat:every_2s@%'"
            )
            now = time.time()
            for (key,) in rows:
                at = datetime.fromisoformat(key.split("@", 1)[1])
                self.seen.setdefault(at, now)
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def earliest(self) -> float:
        """How early the earliest fire was, in seconds on the true clock (negative: late)."""
        return max(at.timestamp() - seen for at, seen in self.seen.items())

    def longest_gap(self, after: float) -> float:
        """The longest time without a new fire from ``after`` (true time) to the last fire."""
        times = sorted([after] + [t for t in self.seen.values() if t > after])
        return max(b - a for a, b in itertools.pairwise(times)) if times else 0.0


def test_steps_of_the_wall_clock_run_no_job_twice_and_fire_nothing_early(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process enqueues as a process of the same host: its wall clock (the library reads
    # time.time_ns) moves with the others'. time.time stays true: the test measures with it.
    real_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(host.shift.read_text()))
    monkeypatch.setenv("ULTIMAT3_JOBS_URL", host.url)
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("clockjobs", None)
    import clockjobs

    app = clockjobs.app
    fires = Fires(host)
    try:
        wait_until(lambda: len(fires.seen) >= 2, 30, "the scheduler to fire")
        delayed = clockjobs.hold.enqueue({"sleep": 0}, delay="90s").id
        corrections: list[float] = []
        live: list[str] = []
        for fault in FAULTS:
            # Four jobs that fill every slot live through the fault and its correction; the
            # occurrences fired meanwhile wait behind them.
            ids = [r.id for r in app.enqueue_many(clockjobs.hold, [{"sleep": 7}] * 4)]
            live += ids
            started = lambda ids=ids: {i for i, w in host.ledger_rows() if w == "start"} >= set(ids)  # noqa: E731
            wait_until(started, 30, "four jobs to start")
            host.step(fault)
            time.sleep(3)
            corrections.append(host.step(0))
            done = lambda ids=ids: {i for i, w in host.ledger_rows() if w == "done"} >= set(ids)  # noqa: E731
            wait_until(done, 60, "the four jobs to finish")
        time.sleep(2 * PERIOD + 1)

        def beats_done() -> bool:
            waiting = host.query(
                "select count(*) from x_jobs where name = 'beat' and state <> 'completed'"
            )[0][0]
            return bool(waiting == 0)

        # Every fired job runs: none waits for a clock that stood ahead when it was fired.
        wait_until(beats_done, 10, "every fired job to complete")
    finally:
        fires.stop()
        for proc in host.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in host.procs:
            proc.wait(timeout=20)
        app.close()
        sys.modules.pop("clockjobs", None)

    starts = Counter(i for i, w in host.ledger_rows() if w == "start")
    twice = sorted(i for i in live if starts[i] > 1)
    delayed_ran = starts[delayed] > 0
    silence = [round(fires.longest_gap(c), 2) for c in corrections]
    print(
        f"\nclock steps on {host.url.split(':')[0]}: {len(twice)} of {len(live)} live jobs ran "
        f"twice; earliest fire {fires.earliest():+.2f} s; longest gap after each correction "
        f"{silence} s (period {PERIOD} s); the job delayed 90 s ran: {delayed_ran}"
    )
    assert not twice, f"live jobs ran twice: {twice}"
    assert fires.earliest() <= 1.0, f"an occurrence fired {fires.earliest():.1f} s early"
    assert max(silence) <= PERIOD + 1.0, f"a task stayed silent {max(silence)} s"
    assert fires.longest_gap(min(fires.seen.values())) <= PERIOD + 1.0
    # PostgreSQL: run_at is on the database's clock, which did not step; SQLite: the stored
    # run_at moved with the step of the host's clock (drivers/sqlite.py, ``_align``).
    assert not delayed_ran, "a job delayed 90 s ran early"
