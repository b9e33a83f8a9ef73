"""A worker whose connection stalls (a hung proxy or pooler: the peer still acknowledges at
TCP level, so keepalives notice nothing) loses its lease in time, and says so.

Worker A reaches PostgreSQL through ``tests/tcpproxy.py``; the maintenance node (worker B) and
the worker that runs the rescued copy (C) connect directly. While A runs a long job, the proxy
stalls for three leases. Within one lease of the stall, A logs ``jobs.lease.lost`` for the job
and its handler sees ``ctx.cancelled`` and returns: before the rescuer takes the job, so the
rescued copy never runs beside it. A's renewals fail by the watchdog's budget meanwhile
(``jobs.loop.failed``: the stall is logged, not silent), and once the proxy forwards again A
goes on serving.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from tcpproxy import Proxy
from ultimat3.jobs import App, JobContext, job
from ultimat3.jobs.records import JobState

pytestmark = pytest.mark.postgres

LEASE = 3.0
LOG: list[tuple[str, str, int, float]] = []  # (what, job id, attempt, time.time())


@job(queue="stall")
def long_job(value: Any, ctx: JobContext) -> None:
    copy = any(e[0] == "start" and e[1] == ctx.id for e in LOG)
    LOG.append(("start", ctx.id, ctx.attempt, time.time()))
    if copy or value.get("again"):
        return  # the rescued copy, or the job after the stall: done at once
    while not ctx.cancelled:
        time.sleep(0.01)
    LOG.append(("stop", ctx.id, ctx.attempt, time.time()))


def _wait(what: str, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[Proxy]:
    with Proxy(int(conninfo_to_dict(pg_dsn)["port"])) as p:
        yield p


def test_a_stalled_connection_loses_its_lease_within_one_lease_and_never_overlaps_its_rescue(
    pg_dsn: str,
    proxy: Proxy,
    make_module: Callable[..., types.ModuleType],
    caplog: pytest.LogCaptureFixture,
) -> None:
    LOG.clear()
    parts = conninfo_to_dict(pg_dsn)
    direct = f"postgresql://{parts['user']}@127.0.0.1:{parts['port']}/{parts['dbname']}"
    stalled = (
        f"postgresql://{parts['user']}@127.0.0.1:{proxy.port}/{parts['dbname']}"
        "?statement_timeout=1s&lock_timeout=500ms"
    )
    module = make_module("stall_jobs", long_job=long_job)
    a, b, c = App(stalled, modules=[module]), App(direct, modules=[module]), App(direct)
    c.register(module)
    # B only maintains (its queue is empty); elected before A starts, so A never leads.
    rescuer = b.worker(queues=["nothing"], lease=f"{LEASE}s", rescue_interval="100ms")
    worker = a.worker(lease=f"{LEASE}s", heartbeat="1s", poll_interval="100ms")
    try:
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"), rescuer:
            _wait("B to lead maintenance", lambda: rescuer.maintenance.leading)
            worker.start()
            job_id = a.enqueue(long_job, {}).id
            _wait("A to start the job", lambda: bool(LOG))
            time.sleep(1.2)  # a renewal or two go through first
            stalled_at = time.time()
            proxy.stall()
            _wait("the rescue", lambda: rescuer.stats.rescued >= 1)
            rescued = b.get_job(job_id)
            time.sleep(2 * LEASE - (time.time() - stalled_at))  # A stays cut off meanwhile
            proxy.resume()
            with c.worker(poll_interval="50ms"):
                _wait("the copy", lambda: b.get_job(job_id).state is JobState.COMPLETED)
            # A serves again once the path is back.
            second = a.enqueue(long_job, {"again": True}).id
            _wait("A to run a new job", lambda: b.get_job(second).state is JobState.COMPLETED)
            assert b.get_job(second).worker_id == worker.worker_id
            worker.stop(grace=0.1)
    finally:
        proxy.resume()
        worker.stop(grace=0.1)
        for app in (a, b, c):
            app.close()

    lost = [
        r
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.lease.lost" and r.fields["job_id"] == job_id
    ]
    assert len(lost) == 1, [r.getMessage() for r in lost]
    assert "unconfirmed_for" in lost[0].fields
    assert lost[0].created - stalled_at < LEASE, "noticed within one lease of the stall"
    [stopped] = [e[3] for e in LOG if e[0] == "stop"]
    [worker_lost] = rescued.errors
    assert worker_lost.kind == "worker_lost"
    rescued_at = worker_lost.at.timestamp()
    assert stopped < rescued_at, "A's handler had returned before the rescue"
    # Rescued beside nothing isolated: its attempt given back, the copy is attempt 1 again.
    [(_, first_attempt), (copy_started, copy_attempt)] = [
        (e[3], e[2]) for e in LOG if e[0] == "start" and e[1] == job_id
    ]
    assert (first_attempt, copy_attempt) == (1, 1)
    assert stopped < copy_started
    assert worker.stats.lost == 1
    failed = [
        r
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.loop.failed" and "no reply within" in r.fields["cause"]
    ]
    assert failed, "the stalled calls are logged"
