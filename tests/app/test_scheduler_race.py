"""Three scheduler processes on one database race for an every-2-seconds task: the leader is
paused past its lease (SIGSTOP, then SIGCONT) and later killed (SIGKILL). The fired
occurrences have no duplicate and no hole.

A process frozen in the middle of a write holds SQLite's write lock until it resumes (the
server ends such a session on PostgreSQL, after ``idle_in_transaction_session_timeout``), and
then nobody can take over: `pause` freezes the leader at a moment it holds nothing, which is
the case this test is about."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


class Race:
    """Where the three schedulers meet: the database URL, a way to query it, their logs."""

    def __init__(
        self,
        url: str,
        logdir: Path,
        query: Callable[[str], list[Any]],
        writable: Callable[[], bool],
    ) -> None:
        self.url = url
        self.logdir = logdir
        self.query = query
        self.writable = writable


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def race(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Race, list[subprocess.Popen[bytes]]]]:
    if request.param == "sqlite":
        db = tmp_path / "race.sqlite3"
        url = f"sqlite:///{db}"

        def query(sql: str) -> list[Any]:
            with closing(sqlite3.connect(db)) as conn:
                return conn.execute(sql).fetchall()

        def writable() -> bool:
            with closing(sqlite3.connect(db, timeout=0.5, isolation_level=None)) as conn:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError:
                    return False
                conn.execute("ROLLBACK")
                return True
    else:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        dsn = request.getfixturevalue("pg_dsn")
        p = conninfo_to_dict(dsn)
        url = f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"

        def query(sql: str) -> list[Any]:
            with psycopg.connect(dsn, options="-c search_path=ultimat3_jobs") as conn:
                return conn.execute(sql).fetchall()

        def writable() -> bool:
            with psycopg.connect(dsn, options="-c search_path=ultimat3_jobs") as conn:
                try:
                    conn.execute("SELECT 1 FROM x_leaders FOR UPDATE NOWAIT")
                except psycopg.errors.LockNotAvailable:
                    return False
                return True

    env = {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    subprocess.run(
        [sys.executable, "-m", "ultimat3.jobs", "--app", "crontasks:app", "migrate"],
        env=env,
        cwd=HERE,
        check=True,
        capture_output=True,
    )
    args = ["--app", "crontasks:app", "scheduler", "--leader", "database"]
    args += ["--leader-ttl", "2s", "--tick", "200ms"]
    logs = [(tmp_path / f"scheduler-{n}.log").open("w") for n in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ultimat3.jobs", "-v", *args],
            env=env,
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        for log in logs
    ]
    yield Race(url, tmp_path, query, writable), procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
    for log in logs:
        log.close()


def leader_pid(race: Race) -> int | None:
    rows = race.query("select holder from x_leaders where name = 'scheduler'")
    if not rows:
        return None
    return int(rows[0][0].split(":")[1])


def fired(race: Race) -> list[datetime]:
    """Every occurrence some scheduler process says it dispatched (it logs only the fires whose
    compare-and-set it won), across all three logs: a double fire would appear twice here, even
    though the idempotency key would collapse its job rows."""
    found = []
    for log in race.logdir.glob("scheduler-*.log"):
        for line in log.read_text().splitlines():
            if "jobs.scheduler.fired" in line:
                found.append(datetime.fromisoformat(line.split("occurrence=")[1].split()[0]))
    return found


def wait_for_leader(race: Race, not_pid: int | None, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = leader_pid(race)
        if pid is not None and pid != not_pid:
            return pid
        time.sleep(0.1)
    raise AssertionError("no (new) leader was elected")


def pause(race: Race, pid: int) -> None:
    """SIGSTOP `pid` at a moment it holds no write lock and no leader row (it is in there for a
    few milliseconds of every 200 ms tick): one caught inside a write is let go and stopped
    again a moment later."""
    for attempt in range(50):
        os.kill(pid, signal.SIGSTOP)
        if race.writable():
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.013 * (attempt % 7 + 1))
    raise AssertionError(f"process {pid} held the database each time it was stopped")


def test_no_duplicate_and_no_hole(race: tuple[Race, list[subprocess.Popen[bytes]]]) -> None:
    where, procs = race
    by_pid = {p.pid: p for p in procs}
    first = wait_for_leader(where, None, 15)
    time.sleep(3)
    pause(where, first)  # past its 2 s lease: another takes over
    second = wait_for_leader(where, first, 30)
    time.sleep(3)
    os.kill(first, signal.SIGCONT)  # the zombie wakes up believing it leads, for a moment
    time.sleep(3)
    os.kill(second, signal.SIGKILL)
    by_pid[second].wait()
    wait_for_leader(where, second, 30)
    time.sleep(3)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=10)

    occurrences = fired(where)
    assert len(occurrences) == len(set(occurrences)), "an occurrence fired twice"
    assert where.query("select count(*) from x_jobs")[0][0] == len(occurrences)
    ordered = sorted(occurrences)
    assert len(ordered) >= 6
    gaps = {b - a for a, b in itertools.pairwise(ordered)}
    assert gaps == {timedelta(seconds=2)}, f"holes in the fired occurrences: {sorted(gaps)}"
