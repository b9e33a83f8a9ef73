"""The relay as a real process, with a fault point between publish and mark.

``ULTIMAT3_JOBS_RELAY_FAULT=after_publish`` makes the relay process exit (``os._exit``) right
after it inserted a batch into the job database and before it marked the batch published,
exactly where a crash would hurt. Every row must still be delivered at least once, and the job
database must end with exactly one job per key. Two relays started together must split the
rows with nothing lost or published twice (counted from their own debug logs).
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App
from ultimat3.jobs.relay import FAULT_ENV

HERE = Path(__file__).parent
_PUBLISHED = re.compile(r"jobs\.outbox\.published queue=\S+ rows=(\d+) deduped=(\d+)")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def outbox_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'business.sqlite3'}"
    from .conftest import _url

    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn if "://" in dsn else _url(dsn)


@pytest.fixture
def env(tmp_path: Path, outbox_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"sqlite:///{tmp_path / 'jobs.sqlite3'}",
        "RELAY_OUTBOX_URL": outbox_url,
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


@pytest.fixture
def relayapp(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key in ("ULTIMAT3_JOBS_URL", "RELAY_OUTBOX_URL"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("relayapp", None)
    import relayapp

    yield relayapp
    relayapp.app.close()
    sys.modules.pop("relayapp", None)


@pytest.fixture
def spawn(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start a relay (or another command) whose stderr goes to a file (``LOGS[proc]``): a pipe
    nobody reads while it runs would fill at -vv and block it."""
    procs: list[subprocess.Popen[str]] = []

    def start(
        *args: str, fault: str | None = None, command: str = "relay"
    ) -> subprocess.Popen[str]:
        proc_env = dict(env)
        if fault:
            proc_env[FAULT_ENV] = fault
        log = tmp_path / f"stderr-{len(procs)}.log"
        with log.open("w") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ultimat3.jobs",
                    "-vv",
                    "--app",
                    "relayapp:app",
                    command,
                    *args,
                ],
                env=proc_env,
                cwd=HERE,
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
            )
        LOGS[proc] = log
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        LOGS.pop(proc, None)


@contextmanager
def business_tx(url: str) -> Iterator[Any]:
    """A transaction on the outbox's database, as the application would open it."""
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url[len("sqlite:///") :])) as conn:
            yield conn
            conn.commit()
        return
    import psycopg

    with psycopg.connect(url) as pg, pg.transaction():
        yield pg


def stage(relayapp: Any, url: str, count: int) -> None:
    app = relayapp.app
    with business_tx(url) as conn, app.using(conn):
        app.enqueue_many(relayapp.keyed, [{"n": n} for n in range(count // 2)])
        app.enqueue_many(relayapp.unkeyed, [{"n": n} for n in range(count - count // 2)])


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


#: Each spawned process's stderr file.
LOGS: dict[subprocess.Popen[str], Path] = {}


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    err = LOGS[proc].read_text()
    assert proc.returncode == 0, err
    return err


def test_a_relay_killed_between_publish_and_mark_loses_and_doubles_nothing(
    relayapp: Any, outbox_url: str, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    app: App = relayapp.app
    stage(relayapp, outbox_url, 250)
    relay = app.relay()
    assert relay.pending() == 250

    for _ in range(2):  # twice: the second crash re-publishes the first one's batch
        crashed = spawn("--batch-size", "100", fault="after_publish")
        crashed.wait(timeout=30)
        err = LOGS[crashed].read_text()
        assert crashed.returncode == 70, err
        assert app.count_jobs() == 100  # published...
        assert relay.pending() == 250  # ...and never marked

    survivor = spawn("--batch-size", "100")
    wait_for(lambda: relay.pending() == 0)
    log = stop(survivor)
    counts = [(int(r), int(d)) for r, d in _PUBLISHED.findall(log)]
    assert sum(r for r, _ in counts) == 250  # every row, the first batch once more...
    assert sum(d for _, d in counts) == 100  # ...where the job database collapsed it
    jobs = app.list_jobs(limit=1000)
    assert len(jobs) == 250
    assert len({(j.tenant_id, j.idempotency_key) for j in jobs}) == 250


def test_two_relays_split_the_work(
    relayapp: Any, outbox_url: str, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    app: App = relayapp.app
    app.relay()  # opens and migrates the outbox before the relays start
    relays = [spawn("--batch-size", "10", "--interval", "20ms") for _ in range(2)]
    for proc in relays:  # wait until both run (they print "relay from ..." then)
        wait_for(lambda proc=proc: "relay from" in LOGS[proc].read_text())  # type: ignore[misc]
    stage(relayapp, outbox_url, 1000)
    wait_for(lambda: app.relay().pending() == 0)
    logs = [stop(proc) for proc in relays]
    per_relay = [[(int(r), int(d)) for r, d in _PUBLISHED.findall(log)] for log in logs]
    published = [sum(r for r, _ in counts) for counts in per_relay]
    assert sum(published) == 1000  # nothing lost, nothing published twice
    assert all(d == 0 for counts in per_relay for _, d in counts)
    if outbox_url.startswith("postgres"):
        assert all(n > 0 for n in published), published  # SKIP LOCKED: both took rows
    assert app.count_jobs() == 1000


def test_run_publishes_and_works_in_one_process(
    relayapp: Any, outbox_url: str, spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    app: App = relayapp.app
    stage(relayapp, outbox_url, 20)
    proc = spawn(command="run")
    wait_for(lambda: app.count_jobs(state="completed") == 20)
    stop(proc)
    assert app.relay().pending() == 0
