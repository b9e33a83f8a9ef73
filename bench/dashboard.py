"""Every dashboard page's response time at 1,000,000 jobs, on SQLite and on PostgreSQL.

    python bench/dashboard.py                    # both databases, 1,000,000 rows
    python bench/dashboard.py --driver sqlite --rows 200000

Fills the job table with a production-like mix (95% completed over the last day, 2% dead
with an error, dead and waiting jobs over four queues, four priorities and 100 tenants),
serves the dashboard with uvicorn on 127.0.0.1 and times real HTTP requests to each page
(keep-alive, after one warm-up request): median, p95 and max in milliseconds. A request above
100 ms is flagged. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import http.client
import random
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "dashboard"))
sys.path.insert(0, str(HERE))

import dashjobs  # noqa: E402

from ultimat3.jobs import App  # noqa: E402
from ultimat3.jobs.dialects.sqlite import us  # noqa: E402
from ultimat3.jobs.ids import uuid7  # noqa: E402

QUEUES = ["mail", "billing", "reports", "default"]
BUDGET_MS = 100.0
COLUMNS = (
    "id, tenant_id, name, queue, input, idempotency_key, priority, state, attempt, "
    "max_attempts, run_at, created_at, attempted_at, finished_at, errors, lease_token, "
    "lease_expires_at, worker_id"
)


def rows(n: int, now: datetime) -> Iterator[tuple[Any, ...]]:
    """The mix: (id, tenant, name, queue, input, key, priority, state, attempt, max_attempts,
    run_at, created_at, attempted_at, finished_at, errors-json), ids in time order."""
    rnd = random.Random(7)
    error = (
        '[{"attempt": 1, "at": "%s", "kind": "RuntimeError", "message": "card declined", '
        '"traceback": "Traceback (most recent call last):\\n  ...\\nRuntimeError: card declined"}]'
    )
    for i in range(n):
        roll = rnd.random()
        created = now - timedelta(seconds=86_400 * (n - i) / n)
        queue = QUEUES[i % 4]
        tenant = f"t{i % 100}"
        name = {"mail": "send_mail", "billing": "charge", "reports": "report"}.get(queue, "job")
        if i % (n // 10) == 1:  # ten jobs of a rare tenant and a rare name, spread out
            tenant, name = "rare", "refund"
        payload = f'{{"customer": "c{i}", "note": "order {i}"}}'
        job_id = uuid7()
        lease: tuple[Any, ...] = (None, None, None)
        if roll < 0.95:
            state, attempt, finished, errors = "completed", 1, created + timedelta(seconds=1), "[]"
        elif roll < 0.97:
            finished = created + timedelta(seconds=2)
            state, attempt, errors = "dead", 1, error % finished.isoformat()
        elif roll < 0.975:
            state, attempt, finished, errors = "cancelled", 0, created, "[]"
        elif roll < 0.976:  # 0.1% running, on eight workers
            state, attempt, finished, errors = "running", 1, None, "[]"
            lease = (f"t.{job_id}", now + timedelta(hours=1), f"bench:{i % 8}")
        else:
            state, attempt, finished, errors = "available", 0, None, "[]"
            if roll > 0.995:
                state, created = "scheduled", now + timedelta(hours=1)
        run_at = created
        yield (
            job_id,
            tenant,
            name,
            queue,
            payload,
            f"k{i}",
            i % 4,
            state,
            attempt,
            3,
            run_at,
            created,
            created if attempt else None,
            finished,
            errors,
            *lease,
        )


def fill_sqlite(path: Path, n: int, now: datetime) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(
        f"INSERT INTO x_jobs ({COLUMNS}) VALUES ({', '.join('?' * 18)})",
        (
            (
                *r[:10],
                us(r[10]),
                us(r[11]),
                None if r[12] is None else us(r[12]),
                None if r[13] is None else us(r[13]),
                r[14],
                r[15],
                None if r[16] is None else us(r[16]),
                r[17],
            )
            for r in rows(n, now)
        ),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def fill_postgres(dsn: str, n: int, now: datetime) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        with (
            conn.cursor() as cur,
            cur.copy(f'COPY "ultimat3_jobs".x_jobs ({COLUMNS}) FROM STDIN') as copy,
        ):
            for r in rows(n, now):
                copy.write_row(r)
        conn.execute('VACUUM ANALYZE "ultimat3_jobs".x_jobs')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(app: App) -> Iterator[int]:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from ultimat3.jobs.dashboard import create_app

    host = Starlette(
        routes=[
            Mount("/t/t7", app=create_app(app, tenant="t7")),
            Mount("/t/rare", app=create_app(app, tenant="rare")),
            Mount("/", app=create_app(app)),
        ]
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(host, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def pages(app: App, count: int) -> list[tuple[str, str]]:
    driver = app.driver
    from ultimat3.jobs.records import JobFilter, JobState

    dead = driver.job_list(JobFilter(states=frozenset({JobState.DEAD})), limit=1)[0]
    page2 = driver.job_list(JobFilter(), limit=1, before_id=dead.id)[0]
    tenant_job = driver.job_list(JobFilter(tenant_id="t7"), limit=1)[0]
    deep = driver.job_id_below(None, min(990_000, count - 2))
    return [
        ("overview", "/"),
        ("jobs, newest", "/jobs"),
        ("jobs, an older page (keyset)", f"/jobs?before={page2.id}"),
        (f"jobs, a page {min(990_000, count - 2):,} jobs deep (keyset)", f"/jobs?before={deep}"),
        ("jobs, tenant=rare (10 jobs)", "/jobs?tenant=rare"),
        ("jobs, name=refund (10 jobs)", "/jobs?name=refund"),
        ("jobs, state=dead", "/jobs?state=dead"),
        ("jobs, queue=billing & state=available", "/jobs?queue=billing&state=available"),
        ("jobs, name=report", "/jobs?name=report"),
        ("jobs, tenant=t42", "/jobs?tenant=t42"),
        ("jobs, text in input (a hit)", "/jobs?q=order%209"),
        ("jobs, text in error, state=dead", "/jobs?state=dead&q=declined"),
        ("jobs, text that matches nothing (budget)", "/jobs?q=no-such-text"),
        ("job detail (dead)", f"/jobs/{dead.id}"),
        ("dead letters", "/dead"),
        ("dead letters, queue=billing", "/dead?queue=billing"),
        ("queues", "/queues"),
        ("cron", "/cron"),
        ("workers", "/workers"),
        ("tenant t7: overview", "/t/t7/"),
        ("tenant t7: jobs", "/t/t7/jobs"),
        ("tenant t7: job detail", f"/t/t7/jobs/{tenant_job.id}"),
        ("tenant rare (10 jobs): overview", "/t/rare/"),
        ("tenant rare (10 jobs): jobs", "/t/rare/jobs"),
    ]


def measure(port: int, targets: list[tuple[str, str]], repeat: int) -> list[str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    slow = []
    print(f"  {'page':<44} {'median':>8} {'p95':>8} {'max':>8}  (ms, {repeat} requests)")
    for label, path in targets:
        times = []
        for i in range(repeat + 1):
            started = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            elapsed = (time.perf_counter() - started) * 1000
            if response.status != 200:
                raise SystemExit(f"{path}: HTTP {response.status}")
            if i:
                times.append(elapsed)
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        flag = "  OVER 100 ms" if times[-1] > BUDGET_MS else ""
        if flag:
            slow.append(label)
        print(
            f"  {label:<44} {statistics.median(times):>8.1f} {p95:>8.1f} {times[-1]:>8.1f}{flag}",
            flush=True,
        )
    conn.close()
    return slow


def run(kind: str, n: int, repeat: int) -> list[str]:
    now = datetime.now(UTC)
    print(f"\n== {kind}, {n:,} jobs")
    if kind == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="u3dash-")) / "jobs.sqlite3"
        url = f"sqlite:///{path}"
        App(url).driver.close()  # migrate
        started = time.perf_counter()
        fill_sqlite(path, n, now)
        print(f"  filled in {time.perf_counter() - started:.0f} s")
        app = App(url, modules=[dashjobs])
        with serving(app) as port:
            slow = measure(port, pages(app, n), repeat)
        app.close()
        return slow
    from bench_pg import _url, bench_database

    from pgcluster import Cluster

    cluster = Cluster.create()
    try:
        dsn = bench_database(cluster)
        started = time.perf_counter()
        fill_postgres(dsn, n, now)
        print(f"  filled in {time.perf_counter() - started:.0f} s")
        app = App(_url(dsn), modules=[dashjobs])
        with serving(app) as port:
            slow = measure(port, pages(app, n), repeat)
        app.close()
        return slow
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--driver", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.driver == "both" else [args.driver]
    slow = {kind: run(kind, args.rows, args.repeat) for kind in kinds}
    for kind, labels in slow.items():
        print(
            f"\n{kind}: {len(labels)} page(s) over {BUDGET_MS:.0f} ms: {', '.join(labels) or '-'}"
        )


if __name__ == "__main__":
    main()
