"""The long-running commands: ``worker`` (one process, or ``--processes N`` as a pool),
``scheduler``, ``relay``, and ``run`` (all of them in one process); their shared options,
their metrics endpoint, and how a signal stops each."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Literal

import click

from ultimat3.jobs.app import App
from ultimat3.jobs.cli.context import (
    DURATION,
    Context,
    explained,
    options,
    pass_ctx,
)
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.logs import say
from ultimat3.jobs.pool import POOL_PID, ProcessPool, watch_parent
from ultimat3.jobs.worker import Worker, WorkerStats

#: The options of a worker, shared by ``worker`` and ``run``.
_worker_options = options(
    click.option(
        "-q",
        "--queue",
        "queues",
        multiple=True,
        help="Queue to serve (repeatable); default: every registered job's queue.",
    ),
    click.option(
        "-c",
        "--concurrency",
        default=10,
        show_default=True,
        type=click.IntRange(1, 1000),
        help="Jobs run at once.",
    ),
    click.option(
        "--lease",
        default="30s",
        show_default=True,
        type=DURATION,
        help="How long a claimed job is this worker's without a renewal; after it, a "
        "dead worker's job is run again.",
    ),
    click.option(
        "--shutdown-grace",
        default="10s",
        show_default=True,
        type=DURATION,
        help="On SIGTERM, how long running jobs may take to finish before they are "
        "released (without using up an attempt).",
    ),
    click.option(
        "--poll-interval",
        default="1s",
        show_default=True,
        type=DURATION,
        help="How often an idle worker looks for due jobs when no notification wakes it.",
    ),
    click.option(
        "--rescue-interval",
        default="5s",
        show_default=True,
        type=DURATION,
        help="How often expired leases are looked for.",
    ),
    click.option(
        "--heartbeat",
        default=None,
        type=DURATION,
        help="Lease renewal interval, at most half the lease (default: a third of the lease).",
    ),
    click.option(
        "--stuck-limit",
        default="5m",
        show_default=True,
        type=DURATION,
        help="Exit (code 70) when jobs past their timeout hold every slot for this long.",
    ),
    click.option(
        "--unknown-grace",
        default="1h",
        show_default=True,
        type=DURATION,
        help="How long a job whose name this worker lacks waits for a worker that knows it "
        "(given back without using an attempt) before it is dead-lettered.",
    ),
)

#: The metrics options, shared by ``worker`` and ``run``.
_metrics_options = options(
    click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        help="Serve Prometheus metrics on this port at /metrics (needs the [prometheus] "
        "extra); with --processes the pool serves the sum of its processes. Off by default.",
    ),
    click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        metavar="ADDRESS",
        help="The address --metrics-port listens on (0.0.0.0: every interface; the metrics "
        "have no authentication).",
    ),
    click.option(
        "--metrics-tenant",
        is_flag=True,
        help="Label job metrics by tenant too (only for a bounded number of tenants).",
    ),
)


def _build_worker(app: App, queues: tuple[str, ...], concurrency: int, **settings: Any) -> Worker:
    return app.worker(queues=list(queues) or None, concurrency=concurrency, **settings)


@click.command()
@_worker_options
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Worker processes to run, each with --concurrency handler threads; one that exits "
    "is restarted. SIGTERM stops them all gracefully.",
)
@_metrics_options
@pass_ctx
def worker(
    ctx: Context,
    /,
    queues: tuple[str, ...],
    concurrency: int,
    processes: int,
    metrics_port: int | None,
    metrics_host: str,
    metrics_tenant: bool,
    **settings: Any,
) -> None:
    """Run jobs until SIGTERM/SIGINT (a second signal stops at once).

    Prints a line per job's end (completed, retried, dead, snoozed, cancelled) with its
    attempt and how long it ran; `ultimat3-jobs -q worker` prints none."""
    if processes > 1:
        metrics_dir = None
        with explained():
            app = ctx.app
            _build_worker(app, queues, concurrency, **settings)  # every option checked here
            app.open()  # and the schema migrated once, before the children start
            say(
                f"{processes} worker processes on {app.driver.display_url}, concurrency "
                f"{concurrency} each",
                "jobs.cli.pool",
                processes=processes,
                url=app.driver.display_url,
                concurrency=concurrency,
            )
            if metrics_port is not None:
                metrics_dir = _pool_metrics(app, metrics_host, metrics_port)
            else:
                app.close()
        try:
            code = ProcessPool(_without_processes(sys.argv[1:]), processes, clock=app.clock).run()
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        sys.exit(code)
    watch_parent()
    with explained():
        app = ctx.app
        w = _build_worker(app, queues, concurrency, **settings)
        if metrics_port is not None:
            _worker_metrics(app, metrics_host, metrics_port, metrics_tenant)
        with _signals_counted(w):
            say(
                f"worker {w.worker_id} on {app.driver.display_url}, queues "
                f"{', '.join(w.queues)}, concurrency {concurrency}",
                "jobs.cli.worker",
                worker_id=w.worker_id,
                url=app.driver.display_url,
                queues=",".join(w.queues),
                concurrency=concurrency,
            )
            _stopped(w.run())
    _exit_for_supervisor(w)


def _stopped(stats: WorkerStats) -> None:
    """The worker's closing line: what it did, in the outcomes' vocabulary."""
    counts = {
        "completed": stats.completed,
        "retried": stats.failed,
        "dead": stats.dead,
        "snoozed": stats.snoozed,
        "cancelled": stats.cancelled,
        "released": stats.released,
        "lost": stats.lost,
    }
    shown = ", ".join(f"{n} {word}" for word, n in counts.items() if n or word == "completed")
    say(f"stopped: {shown}", "jobs.cli.stopped", claimed=stats.claimed, **counts)


def _exit_for_supervisor(w: Worker) -> None:
    if w.exit_code:
        say(
            "the worker stopped because one of its loops could not go on (see the log "
            f"above); exiting with {w.exit_code} so that its supervisor restarts it",
            "jobs.cli.exit",
            code=w.exit_code,
        )
        sys.exit(w.exit_code)


def _load_metrics() -> Any:
    """``ultimat3.jobs.prometheus``, imported on first use (it raises ``missing_extra``'s
    error without the [prometheus] extra)."""
    from ultimat3.jobs import prometheus

    return prometheus


def _pool_metrics(app: App, host: str, port: int) -> str:
    """A pool: its children write their metrics to a folder of its own, and it serves them."""
    import tempfile

    path = tempfile.mkdtemp(prefix=f"ultimat3-jobs-metrics-{os.getpid()}-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path  # before prometheus_client is imported
    try:
        _load_metrics().serve(port, app, pool_dir=path, addr=host)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    say(
        f"metrics of the pool on {_http(host, port)}",
        "jobs.cli.metrics",
        url=_http(host, port),
    )
    return path


def _http(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


def _worker_metrics(app: App, host: str, port: int, tenant: bool) -> None:
    """One worker process: its metrics, served by itself, or by its pool when it is a
    pool's child."""
    prometheus = _load_metrics()
    prometheus.Metrics(tenant=tenant).subscribe()
    if os.environ.get(POOL_PID) and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return  # the pool serves the sum of its children
    prometheus.serve(port, app, addr=host)
    say(f"metrics on {_http(host, port)}", "jobs.cli.metrics", url=_http(host, port))


def _without_processes(argv: list[str]) -> list[str]:
    """The command line of one child of a pool: ``argv`` without ``--processes N``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--processes":
            skip = True
        elif not arg.startswith("--processes="):
            kept.append(arg)
    return kept


#: The options of a scheduler, shared by ``scheduler`` and ``run``.
_scheduler_options = options(
    click.option(
        "--tick",
        default="1s",
        show_default=True,
        type=DURATION,
        help="How often due occurrences are checked.",
    ),
    click.option(
        "--leader-ttl",
        default="15s",
        show_default=True,
        type=DURATION,
        help="How long an elected scheduler stays leader without renewing.",
    ),
    click.option(
        "--leader",
        type=click.Choice(["sole", "database"]),
        default="database",
        show_default=True,
        help="database: elect one active scheduler among many; sole: this is the only one.",
    ),
)


@click.command()
@_scheduler_options
@pass_ctx
def scheduler(ctx: Context, leader: str, leader_ttl: timedelta, tick: timedelta) -> None:
    """Fire cron tasks until SIGTERM/SIGINT (each occurrence exactly once)."""
    with explained():
        app = ctx.app
        if not app.registry.tasks:
            raise ConfigurationError(
                "no task is registered", fix="register a module that exports task(...) handles"
            )
        s = app.scheduler(leader=_leader(leader), leader_ttl=leader_ttl, tick_interval=tick)
        with _stopped_by_signal() as stop:  # before the banner: a signal once it is out stops us
            say(
                f"scheduler on {app.driver.display_url}: {', '.join(sorted(app.registry.tasks))}",
                "jobs.cli.scheduler",
                url=app.driver.display_url,
                tasks=",".join(sorted(app.registry.tasks)),
            )
            s.start()
            stop.wait()
            s.stop()


@click.command()
@click.option(
    "--batch-size",
    default=100,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Outbox rows published per pass.",
)
@click.option(
    "--interval", default="200ms", show_default=True, type=DURATION, help="Time between passes."
)
@pass_ctx
def relay(ctx: Context, batch_size: int, interval: timedelta) -> None:
    """Publish the app's outbox (App(outbox=...)) to the job database until SIGTERM/SIGINT."""
    with explained():
        app = ctx.app
        r = app.relay(batch_size=batch_size, interval=interval)
        pending = r.pending()
        with _stopped_by_signal() as stop:  # before the banner: a signal once it is out stops us
            say(
                f"relay from {r.store.display_url} to {r.driver.display_url}, {pending} row(s) "
                "pending",
                "jobs.cli.relay",
                source=r.store.display_url,
                url=r.driver.display_url,
                pending=pending,
            )
            r.run(stop)


@click.command("run")
@_worker_options
@_scheduler_options
@_metrics_options
@pass_ctx
def run_all(
    ctx: Context,
    /,
    queues: tuple[str, ...],
    concurrency: int,
    leader: str,
    leader_ttl: timedelta,
    tick: timedelta,
    metrics_port: int | None,
    metrics_host: str,
    metrics_tenant: bool,
    **settings: Any,
) -> None:
    """Worker, scheduler and (with App(outbox=...)) the outbox relay in one process."""
    with explained():
        app = ctx.app
        s = (
            app.scheduler(leader=_leader(leader), leader_ttl=leader_ttl, tick_interval=tick)
            if app.registry.tasks
            else None
        )
        r = app.relay() if app._outbox is not None else None
        w = _build_worker(app, queues, concurrency, **settings)
        if metrics_port is not None:
            _worker_metrics(app, metrics_host, metrics_port, metrics_tenant)
        extra = " + relay" if r is not None else ""
        with _signals_counted(w):
            say(
                f"worker + scheduler{extra} on {app.driver.display_url}",
                "jobs.cli.run",
                url=app.driver.display_url,
                relay=r is not None,
            )
            if s is not None:
                s.start()
            if r is not None:
                r.start()
            try:
                stats = w.run()
            finally:
                if r is not None:
                    r.stop()
                if s is not None:
                    s.stop()
        _stopped(stats)
    _exit_for_supervisor(w)


def _leader(value: str) -> Literal["sole", "database"]:
    return "sole" if value == "sole" else "database"


@contextmanager
def _signals_counted(w: Worker) -> Iterator[None]:
    """SIGTERM/SIGINT counted by the worker from before its banner on (``Worker.run`` acts on
    the count), so a supervisor that signals once it reads the banner stops it gracefully."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    counted = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, w._on_signal) for sig in counted}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _stopped_by_signal() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT during the block (installed in the main thread);
    the handlers found are put back after it, so a command run in process (as tests and
    embedding programs do) leaves Ctrl-C as it was."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
