"""The ``ultimat3-jobs`` command.

Exit codes: 0 ok, 1 an error the library explains (its cause and fix are printed, no
traceback), 2 a usage error (click's message names the option), 70 a worker that stopped for
its supervisor to restart it. Read commands take ``--json``.

``--app module:attribute`` (or ``$ULTIMAT3_JOBS_APP``) names your App; every mistake in it (a
file path, a module that does not import, an attribute that is not an App) is explained, with
where it happened. ``--url`` points that App at another database; without ``--app`` it names
the database, else ``$ULTIMAT3_JOBS_URL``, else ./ultimat3-jobs.sqlite3. Commands that read or
change jobs (``jobs ...``, ``queues ...``) never create a SQLite file: a missing one is an error
that says which folder and option were used.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, NoReturn, TypeVar
from zoneinfo import ZoneInfo

import click

from ultimat3.jobs.app import App
from ultimat3.jobs.cron import next_runs
from ultimat3.jobs.drivers import open_driver, sqlite_path, url_from_env
from ultimat3.jobs.duration import format_duration, to_timedelta
from ultimat3.jobs.errors import ConfigurationError, DurationError, JobsError
from ultimat3.jobs.health import Check, run_checks
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.limits import NO_LIMIT
from ultimat3.jobs.logs import LEVELS, say
from ultimat3.jobs.logs import configure as configure_logs
from ultimat3.jobs.outboxes import open_store
from ultimat3.jobs.pool import POOL_PID, ProcessPool, watch_parent
from ultimat3.jobs.records import FlowState, Job, JobState, WorkerInfo
from ultimat3.jobs.retry import retry_schedule
from ultimat3.jobs.tasks import TaskHandle
from ultimat3.jobs.worker import Worker, WorkerStats

F = TypeVar("F", bound=Callable[..., Any])

_APP_FIX = "point --app at the App in your code: --app package.module:attribute, e.g. shop.jobs:app"


class Context:
    """What the group's options say: the App reference and the database URL."""

    def __init__(self, app_ref: str | None, url: str | None, *, json_log: bool = False) -> None:
        self.app_ref = app_ref
        self.url = url
        #: ``--log-format json``: every line on stderr is JSON, errors included.
        self.json_log = json_log
        self._app: App | None = None

    @property
    def app(self) -> App:
        """The App, for a command that may create the database (worker, migrate, ...)."""
        if self._app is None:
            self._app = load_app(self.app_ref, self.url)
        return self._app

    @property
    def existing_app(self) -> App:
        """The App, for a command that reads or changes jobs: its database and its job tables
        must exist, so a command run in the wrong folder or against a new database says so
        rather than create an empty SQLite file or the schema."""
        app = self.app_with_a_database
        if not app._opened:
            driver = app._unopened_driver()
            if not driver.schema_current():
                raise ConfigurationError(
                    f"the job tables in {driver.display_url} are missing or older than this "
                    "version of ultimat3-jobs, and this command never creates or changes them",
                    fix="run `ultimat3-jobs migrate` (a worker migrates too), then this "
                    "command again",
                )
        return app

    @property
    def app_with_a_database(self) -> App:
        """The App, whose database must exist (a SQLite file is never created): the health
        check reads what state its schema is in."""
        app = self.app
        if app._driver is None and app.url and app.url.startswith("sqlite:"):
            path = sqlite_path(app.url).absolute()
            if not path.exists():
                raise ConfigurationError(
                    f"no job database at {path}: {self._url_source()}",
                    fix="run from your project's folder, or pass --app module:attribute (or "
                    "--url sqlite:///path/to/jobs.sqlite3); `ultimat3-jobs migrate` creates "
                    "a database",
                )
        return app

    def _url_source(self) -> str:
        if self.url:
            return "--url names it, and it does not exist"
        if self.app_ref:
            return f"the app {self.app_ref!r} uses it, and it does not exist"
        if url_from_env():
            return "$ULTIMAT3_JOBS_URL names it, and it does not exist"
        return (
            "with no --app, --url or $ULTIMAT3_JOBS_URL this is the default file, and it does "
            "not exist in this folder"
        )


def load_app(ref: str | None, url: str | None) -> App:
    """The App named by ``module:attribute`` (the attribute defaults to ``app``; ``module:f()``
    calls a factory), pointed at ``url`` when given; without ``ref``, a bare App on ``url``
    (or ``$ULTIMAT3_JOBS_URL``, or ./ultimat3-jobs.sqlite3)."""
    if not ref:
        return App(url)
    module_name, attr, call = _parse_ref(ref)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = _import(ref, module_name)
    if not hasattr(module, attr):
        raise ConfigurationError(
            f"--app {ref!r}: module {module_name!r} has no attribute {attr!r}",
            fix=_app_fix(module, module_name),
        )
    value = getattr(module, attr)
    if call:
        if not inspect.isfunction(value):
            raise ConfigurationError(
                f"--app {ref!r}: {attr} is {_what(value)}, not a function that builds an App",
                fix=_app_fix(module, module_name),
            )
        try:
            value = value()
        except JobsError as exc:
            raise ConfigurationError(
                f"--app {ref!r}: {attr}() raised: {exc.cause}", fix=exc.fix
            ) from exc
        except Exception as exc:
            raise ConfigurationError(
                f"--app {ref!r}: {attr}() raised {type(exc).__name__}: {exc} ({_where(exc)})",
                fix="fix the factory, or point --app at an App built at import",
            ) from exc
    if not isinstance(value, App):
        fix = _app_fix(module, module_name)
        if inspect.isfunction(value):
            fix = f"to build the App by calling {attr}(), write --app '{module_name}:{attr}()'"
        raise ConfigurationError(f"--app {ref!r} is {_what(value)}, not an App", fix=fix)
    if url and value.url != url:
        value._use_url(url, label=f"--app {ref!r}")
    return value


def _parse_ref(ref: str) -> tuple[str, str, bool]:
    """``module:attribute`` as (module, attribute, whether to call it)."""
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    looks_like_path = "/" in module_name or "\\" in module_name or module_name.endswith(".py")
    if looks_like_path:
        path = Path(module_name)
        if path.is_absolute() or ".." in path.parts:
            where = f"run from {path.parent}, and write"
            dotted = path.stem
        else:
            where = "write"
            dotted = ".".join(p for p in path.with_suffix("").parts if p != ".")
        raise ConfigurationError(
            f"--app {ref!r} is a file path; --app takes a module name and an attribute",
            fix=f"{where} --app {dotted}:{attr} (a module importable from the current folder)",
        )
    call = attr.endswith("()")
    name = attr[:-2] if call else attr
    dotted_ok = all(part.isidentifier() for part in module_name.split("."))
    if not module_name or not dotted_ok or not name.isidentifier():
        raise ConfigurationError(f"--app {ref!r} is not module:attribute", fix=_APP_FIX)
    return module_name, name, call


def _import(ref: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigurationError(
                f"--app {ref!r}: no module named {missing!r} in {os.getcwd()} or on sys.path",
                fix="run from the folder that holds your module or package, or fix --app "
                "module:attribute",
            ) from None
        raise _import_error(ref, module_name, exc) from exc
    except SyntaxError as exc:
        raise ConfigurationError(
            f"--app {ref!r}: {exc.msg} ({exc.filename}, line {exc.lineno})",
            fix=f"fix the syntax error; `python -c 'import {module_name}'` shows it in full",
        ) from None
    except JobsError as exc:
        # A definition that cannot work (a bad zone, duration or name) fails at import.
        raise ConfigurationError(
            f"--app {ref!r}: importing {module_name!r} raised {type(exc).__name__} at "
            f"{_where(exc)}: {exc.cause}",
            fix=exc.fix,
        ) from None
    except Exception as exc:
        raise _import_error(ref, module_name, exc) from exc


def _import_error(ref: str, module_name: str, exc: BaseException) -> ConfigurationError:
    return ConfigurationError(
        f"--app {ref!r}: importing {module_name!r} raised {type(exc).__name__}: {exc} "
        f"({_where(exc)})",
        fix=f"fix the error in your module; `python -c 'import {module_name}'` shows the "
        "whole traceback",
    )


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc`` outside this library and importlib: "file, line N"."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen importlib") and _PACKAGE_DIR not in f.filename
    ]
    if not frames:
        return "no frame of yours"
    return f"{frames[-1].filename}, line {frames[-1].lineno}"


_PACKAGE_DIR = str(Path(__file__).parent)


def _what(value: object) -> str:
    """What ``value`` is, as a person would say it."""
    if isinstance(value, type):
        return f"the class {value.__name__} itself"
    if isinstance(value, JobHandle):
        return "a job (@job)"
    if isinstance(value, TaskHandle):
        return "a cron task (task(...))"
    if isinstance(value, ModuleType):
        return f"the module {value.__name__}"
    if inspect.isfunction(value):
        return "a function"
    return f"a {type(value).__name__}"


def _app_fix(module: ModuleType, module_name: str) -> str:
    """The fix for an --app that names no App: the Apps the module has, or how to make one."""
    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if apps:
        return "the module's App: " + " or ".join(f"--app {module_name}:{a}" for a in apps)
    return (
        f"module {module_name!r} holds no App: add `app = App(modules=[sys.modules[__name__]])` "
        "to it, or point --app at the module that does"
    )


def fail(error: JobsError, as_json: bool = False) -> NoReturn:
    if as_json:
        click.echo(json.dumps(error.to_dict()), err=True)
    else:
        click.secho(f"error: {error.cause}", fg="red", err=True)
        if error.fix:
            click.echo(f"  fix: {error.fix}", err=True)
    sys.exit(error.exit_code)


@contextmanager
def explained(as_json: bool = False) -> Iterator[None]:
    """A library error as its cause and fix (JSON with ``--json``, or under ``--log-format
    json``, where every line on stderr is JSON), and its exit code."""
    try:
        yield
    except JobsError as error:
        current = click.get_current_context(silent=True)
        found = current.find_object(Context) if current is not None else None
        fail(error, as_json or (found is not None and found.json_log))


def emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


pass_ctx = click.make_pass_decorator(Context)


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic in newer click, not in 8.1
    """A duration option: text with a unit ("30s", "250ms", "1h30m"), named in its error."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        try:
            return to_timedelta(str(value))
        except DurationError as exc:
            why = exc.context.get("why", exc.cause)
            suggestion = exc.context.get("suggestion")
            if suggestion:
                hint = f'write "{suggestion}"'
            elif "longer than 10 years" in why:
                hint = 'write at most "3653d"'
            else:
                hint = 'write text such as "250ms", "30s", "1h30m" or "2d"'
            self.fail(f"{value!r} {why}; {hint}", param, ctx)


DURATION = Duration()


def table(rows: list[list[str]], headers: list[str]) -> list[str]:
    """Rows as lines with every column lined up (the last column is not padded)."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, with an ellipsis when cut."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--app",
    "app_ref",
    envvar="ULTIMAT3_JOBS_APP",
    metavar="MODULE:ATTR",
    help="Your App, as module:attribute (e.g. shop.jobs:app; module:factory() calls a "
    "function that returns one). Also $ULTIMAT3_JOBS_APP.",
)
@click.option(
    "--url",
    metavar="URL",
    help="The job database (sqlite:///path, postgresql://...). With --app: the app's jobs on "
    "this database instead of its own. Default: the app's URL; without --app, "
    "$ULTIMAT3_JOBS_URL, else ./ultimat3-jobs.sqlite3.",
)
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No line per job's end (a worker prints one by default: completed, retried, dead, "
    "snoozed, cancelled); warnings and errors still show.",
)
@click.option(
    "--log-level",
    type=click.Choice(sorted(LEVELS, key=LEVELS.__getitem__), case_sensitive=False),
    help="The log's level (overrides -v): info shows every completion, debug every start.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="The log on stderr: text lines, or one JSON object a line (event and fields as keys; "
    "every line on stderr, errors included).",
)
@click.version_option(package_name="ultimat3-jobs")
@click.pass_context
def cli(
    ctx: click.Context,
    app_ref: str | None,
    url: str | None,
    verbose: int,
    quiet: bool,
    log_level: str | None,
    log_format: Literal["text", "json"],
) -> None:
    """Durable background jobs: workers, schedules, and the jobs themselves.

    Exit codes: 0 ok, 1 an error explained by its cause and fix, 2 a usage error, 70 a
    worker that stopped so that its supervisor restarts it.
    """
    if log_level is not None:
        level = LEVELS[log_level.lower()]
    else:
        level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    ctx.call_on_close(configure_logs(level, log_format, job_lines=not quiet))
    ctx.obj = Context(app_ref, url, json_log=log_format == "json")


def _worker_options(f: F) -> F:
    """The options of a worker, shared by ``worker`` and ``run``."""
    options = [
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
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _metrics_options(f: F) -> F:
    """The metrics options, shared by ``worker`` and ``run``."""
    f = click.option(
        "--metrics-tenant",
        is_flag=True,
        help="Label job metrics by tenant too (only for a bounded number of tenants).",
    )(f)
    f = click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        metavar="ADDRESS",
        help="The address --metrics-port listens on (0.0.0.0: every interface; the metrics "
        "have no authentication).",
    )(f)
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        help="Serve Prometheus metrics on this port at /metrics (needs the [prometheus] "
        "extra); with --processes the pool serves the sum of its processes. Off by default.",
    )(f)


def _build_worker(app: App, queues: tuple[str, ...], concurrency: int, **settings: Any) -> Worker:
    return app.worker(queues=list(queues) or None, concurrency=concurrency, **settings)


@cli.command()
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
            code = ProcessPool(_without_processes(sys.argv[1:]), processes).run()
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


def _scheduler_options(f: F) -> F:
    f = click.option(
        "--leader",
        type=click.Choice(["sole", "database"]),
        default="database",
        show_default=True,
        help="database: elect one active scheduler among many; sole: this is the only one.",
    )(f)
    f = click.option(
        "--leader-ttl",
        default="15s",
        show_default=True,
        type=DURATION,
        help="How long an elected scheduler stays leader without renewing.",
    )(f)
    return click.option(
        "--tick",
        default="1s",
        show_default=True,
        type=DURATION,
        help="How often due occurrences are checked.",
    )(f)


@cli.command()
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
        stop = _wait_for_signal()  # before the banner: a signal once it is out stops us
        say(
            f"scheduler on {app.driver.display_url}: {', '.join(sorted(app.registry.tasks))}",
            "jobs.cli.scheduler",
            url=app.driver.display_url,
            tasks=",".join(sorted(app.registry.tasks)),
        )
        s.start()
        stop.wait()
        s.stop()


@cli.command()
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
        stop = _wait_for_signal()  # before the banner: a signal once it is out stops us
        say(
            f"relay from {r.store.display_url} to {r.driver.display_url}, {pending} row(s) pending",
            "jobs.cli.relay",
            source=r.store.display_url,
            url=r.driver.display_url,
            pending=pending,
        )
        r.run(stop)


@cli.command("run")
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


def _wait_for_signal() -> threading.Event:
    """An event set by SIGTERM or SIGINT (installed in the main thread)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--count",
    default=5,
    show_default=True,
    type=click.IntRange(0, 1000),
    help="Next cron runs per task.",
)
@pass_ctx
def schedule(ctx: Context, as_json: bool, count: int) -> None:
    """Each job's retry schedule and each task's next cron runs."""
    with explained(as_json):
        app = ctx.app
        if not app.registry.jobs and not app.registry.tasks:
            if ctx.app_ref:
                raise ConfigurationError(
                    f"the app {ctx.app_ref!r} has no job or task registered",
                    fix="register the module that defines them: App(modules=[...]), or "
                    "App(modules=[sys.modules[__name__]]) in the module itself",
                )
            raise ConfigurationError(
                "no --app given: no job or task is known", fix="pass --app module:attribute"
            )
        now = app.clock.now()
        jobs: list[dict[str, Any]] = []
        for name, handle in sorted(app.registry.jobs.items()):
            policy = handle.retry
            jobs.append(
                {
                    "job": name,
                    "queue": handle.queue,
                    "attempts": policy.attempts,
                    "backoff": policy.backoff,
                    "delay": format_duration(policy.delay),
                    "max_delay": format_duration(policy.max_delay),
                    "jitter": policy.jitter,
                    "dead_letter": policy.dead_letter,
                    "schedule": [format_duration(d) for d in retry_schedule(policy)],
                    "schedule_ms": [int(d.total_seconds() * 1000) for d in retry_schedule(policy)],
                    "limits": _limits_of(handle),
                }
            )
        tasks: list[dict[str, Any]] = []
        for name, t in sorted(app.registry.tasks.items()):
            runs = next_runs(t.cron, t.tz, now, count=count)
            tasks.append(
                {
                    "task": name,
                    "cron": t.cron,
                    "tz": t.tz,
                    "explain": t.explain(),
                    "catch_up": t.catch_up,
                    "next": [
                        {
                            "local": r.astimezone(ZoneInfo(t.tz)).isoformat(),
                            "utc": r.astimezone(UTC).isoformat(),
                        }
                        for r in runs
                    ],
                }
            )
        if as_json:
            emit({"jobs": jobs, "tasks": tasks})
            return
        if jobs:
            rows = [
                [
                    j["job"],
                    j["queue"],
                    str(j["attempts"]),
                    j["backoff"] + (", jittered" if j["jitter"] and j["schedule"] else ""),
                    ", ".join(j["schedule"]) or "-",
                    "dead-letter" if j["dead_letter"] else "dropped",
                ]
                for j in jobs
            ]
            headers = ["JOB", "QUEUE", "ATTEMPTS", "BACKOFF", "RETRIES AFTER", "THEN"]
            if any(j["limits"] for j in jobs):  # a column only for an app that has limits
                headers.append("LIMITS")
                for cells, spec in zip(rows, jobs, strict=True):
                    cells.append("; ".join(f"{k} {v}" for k, v in spec["limits"].items()) or "-")
            for line in table(rows, headers):
                click.echo(line)
            if any(j["jitter"] and j["schedule"] for j in jobs):
                click.echo("(jittered: each wait is between half and all of the one shown)")
        for row in tasks:
            if jobs or row is not tasks[0]:
                click.echo()
            click.echo(
                f"task {row['task']}: {row['cron']} in {row['tz']} ({row['explain']}), "
                f"catch-up {row['catch_up']}"
            )
            runs_rows = [[r["local"], r["utc"]] for r in row["next"]]
            for line in table(runs_rows, [f"NEXT RUNS ({row['tz']})", "UTC"]):
                click.echo(f"  {line}")


@cli.group()
def jobs() -> None:
    """List, inspect, retry, discard and cancel jobs."""


def _iso(moment: Any) -> str | None:
    return moment.isoformat() if moment is not None else None


def job_dict(app: App, j: Job, full: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": j.id,
        "name": j.name,
        "queue": j.queue,
        "state": j.state.value,
        "attempt": j.attempt,
        "max_attempts": j.max_attempts,
        "priority": j.priority,
        "tenant_id": j.tenant_id,
        "run_at": j.run_at.isoformat(),
        "created_at": j.created_at.isoformat(),
        "attempted_at": _iso(j.attempted_at),
        "finished_at": _iso(j.finished_at),
    }
    if full:
        try:
            data["input"] = app.decode_input(j)
        except JobsError as exc:
            data["input_error"] = exc.cause
        data["idempotency_key"] = j.idempotency_key
        data["lease_expires_at"] = _iso(j.lease_expires_at)
        data["worker_id"] = j.worker_id
        data["cancel_reason"] = j.cancel_reason
        if j.state is JobState.COMPLETED:
            try:
                data["result"] = None if j.result is None else app.serializer.loads(j.result)
            except JobsError as exc:
                data["result_error"] = exc.cause
        data["errors"] = [e.to_json() for e in j.errors]
    elif j.errors:
        data["last_error"] = f"{j.errors[-1].kind}: {j.errors[-1].message}"
    return data


def _limits_of(handle: JobHandle[Any]) -> dict[str, str]:
    """A job's limits as ``schedule`` shows them."""
    limits: dict[str, str] = {}
    if handle.concurrency is not None:
        limits["concurrency"] = handle.concurrency.describe()
    if handle.rate is not None:
        limits["rate"] = handle.rate.describe()
    if handle.unique is not None:
        limits["unique"] = handle.unique.describe()
    return limits


def _flow_text(flow: FlowState) -> str:
    """Where a job's partition stands, as ``jobs show`` says it."""
    parts = []
    if flow.limit_max < NO_LIMIT:
        parts.append(f"{flow.running}/{flow.limit_max} running")
    if flow.rate_max:
        parts.append(f"{flow.starts}/{flow.rate_max} starts in {flow.rate_period}")
    return f"{', '.join(parts)} on {flow.limit_key}"


_TENANT_HELP = "Only the jobs of this tenant (tenant_id)."
_JSON_HELP = "Print JSON."


@jobs.command("list")
@click.option(
    "--state",
    type=click.Choice([s.value for s in JobState]),
    multiple=True,
    help="Only jobs in this state (repeatable).",
)
@click.option("--queue", help="Only jobs of this queue.")
@click.option("--name", help="Only jobs of this name (the job's export name).")
@click.option("--tenant", help=_TENANT_HELP)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="At most this many jobs.",
)
@click.option("--before", "before_id", help="Page: only jobs older than this id.")
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def jobs_list(
    ctx: Context,
    state: tuple[str, ...],
    queue: str | None,
    name: str | None,
    tenant: str | None,
    limit: int,
    before_id: str | None,
    as_json: bool,
) -> None:
    """Jobs, newest first."""
    with explained(as_json):
        app = ctx.existing_app
        found = app.list_jobs(
            state=list(state) or None,
            queue=queue,
            name=name,
            tenant_id=tenant,
            limit=limit,
            before_id=before_id,
        )
        if as_json:
            emit([job_dict(app, j) for j in found])
            return
        if not found:
            click.echo("no jobs")
            return
        rows = [
            [
                j.id,
                j.state.value,
                j.name,
                j.queue,
                f"{j.attempt}/{j.max_attempts}",
                clip(f"{j.errors[-1].kind}: {j.errors[-1].message}", 60) if j.errors else "",
            ]
            for j in found
        ]
        for line in table(rows, ["ID", "STATE", "NAME", "QUEUE", "ATTEMPT", "LAST ERROR"]):
            click.echo(line)


@jobs.command("show")
@click.argument("job_id")
@click.option("--tenant", help=_TENANT_HELP)
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def jobs_show(ctx: Context, job_id: str, tenant: str | None, as_json: bool) -> None:
    """One job with its input, its result (once completed) and every attempt's error."""
    with explained(as_json):
        app = ctx.existing_app
        job = app.get_job(job_id, tenant_id=tenant)
        data = job_dict(app, job, full=True)
        if job.worker_id is not None and job.state is JobState.RUNNING:
            found = {w.id: w for w in app.workers()}.get(job.worker_id)
            data["worker"] = worker_dict(found) if found is not None else None
        flow = app.job_flow(job.id)
        if flow is not None:
            data["limits"] = _flow_text(flow)
            reason = flow.why_waiting()
            if reason is not None and job.state in (JobState.SCHEDULED, JobState.AVAILABLE):
                data["waiting_on"] = reason
        if as_json:
            emit(data)
            return
        errors = data.pop("errors")
        if "worker" in data:
            found_row = data.pop("worker")
            data["worker_id"] = (
                f"{job.worker_id} (live: pid {found_row['pid']} on {found_row['host']}, "
                f"heartbeat {found_row['heartbeat_at']})"
                if found_row is not None
                else f"{job.worker_id} (no live worker has this id: it exited or was killed; "
                "the job is rescued once its lease expires)"
            )
        for key, value in data.items():
            shown = json.dumps(value, default=str) if key in ("input", "result") else value
            click.echo(f"{key:>16}: {shown}")
        for e in errors:
            click.echo(f"\nattempt {e['attempt']} at {e['at']}: {e['kind']}: {e['message']}")
            if e["traceback"]:
                click.echo(e["traceback"].rstrip())


def _act(
    ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool, action: str
) -> None:
    with explained(as_json):
        app = ctx.existing_app
        if action == "retry":
            changed = app.retry_jobs(ids, tenant_id=tenant)
        elif action == "discard":
            changed = app.discard_jobs(ids, tenant_id=tenant)
        else:
            changed = [i for i in ids if app.cancel_job(i, tenant_id=tenant)]
        missed = [i for i in ids if i not in changed]
        if as_json:
            emit({action: changed, "unchanged": missed})
        else:
            for i in changed:
                click.echo(f"{action}: {i}")
            for i in missed:
                click.echo(
                    f"unchanged (not found, or its state does not allow {action}): {i}", err=True
                )
        if missed:
            sys.exit(1)


@jobs.command("retry")
@click.argument("ids", nargs=-1, required=True)
@click.option("--tenant", help=_TENANT_HELP)
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def jobs_retry(ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
    """Give dead or cancelled jobs one more attempt, now."""
    _act(ctx, ids, tenant, as_json, "retry")


@jobs.command("discard")
@click.argument("ids", nargs=-1, required=True)
@click.option("--tenant", help=_TENANT_HELP)
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def jobs_discard(ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
    """Delete dead or cancelled jobs."""
    _act(ctx, ids, tenant, as_json, "discard")


@jobs.command("cancel")
@click.argument("ids", nargs=-1, required=True)
@click.option("--tenant", help=_TENANT_HELP)
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def jobs_cancel(ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
    """Cancel scheduled, available or running jobs."""
    _act(ctx, ids, tenant, as_json, "cancel")


def worker_dict(w: WorkerInfo) -> dict[str, Any]:
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "queues": list(w.queues),
        "concurrency": w.concurrency,
        "started_at": w.started_at.isoformat(),
        "heartbeat_at": w.heartbeat_at.isoformat(),
        "version": w.version,
    }


@cli.command()
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def workers(ctx: Context, as_json: bool) -> None:
    """Live worker processes (one row each, refreshed with its heartbeat)."""
    with explained(as_json):
        app = ctx.existing_app
        found = app.workers()
        if as_json:
            emit([worker_dict(w) for w in found])
            return
        if not found:
            click.echo("no live workers")
            return
        now = app.clock.now()
        rows = [
            [
                w.id,
                str(w.pid),
                ",".join(w.queues),
                str(w.concurrency),
                w.started_at.isoformat(timespec="seconds"),
                f"{max(0.0, (now - w.heartbeat_at).total_seconds()):.1f}s ago",
                w.version,
            ]
            for w in found
        ]
        headers = ["ID", "PID", "QUEUES", "CONCURRENCY", "STARTED", "HEARTBEAT", "VERSION"]
        for line in table(rows, headers):
            click.echo(line)


@cli.command()
@click.option(
    "--min-workers",
    default=1,
    show_default=True,
    type=click.IntRange(0, None),
    help="Fail (exit 5) with fewer live workers than this.",
)
@click.option(
    "--worker-stale",
    default="1m",
    show_default=True,
    type=DURATION,
    help="A worker whose heartbeat is older than this is not counted as live.",
)
@click.option(
    "--max-ready-age",
    default="5m",
    show_default=True,
    type=DURATION,
    help="Fail (exit 6) when a queue's oldest ready job has waited longer (paused queues "
    "are not checked).",
)
@click.option("-q", "--queue", "queues", multiple=True, help="Check only these queues' ready age.")
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def healthcheck(
    ctx: Context,
    min_workers: int,
    worker_stale: timedelta,
    max_ready_age: timedelta,
    queues: tuple[str, ...],
    as_json: bool,
) -> None:
    """Check the database, its migrations, the live workers and the oldest ready job, for
    container probes. Exit codes: 0 healthy, 3 database unreachable, 4 migrations pending,
    5 too few live workers, 6 a ready job waited too long (the first failing check's)."""
    try:
        app = ctx.app_with_a_database
        driver = app._driver or open_driver(app.url or "")  # never migrates
    except JobsError as exc:
        checks = [Check("database", False, exc.cause, exc.fix or "")]
    else:
        checks = run_checks(
            driver,
            min_workers=min_workers,
            worker_stale=worker_stale,
            max_ready_age=max_ready_age,
            queues=queues,
        )
    code = next((c.exit_code for c in checks if not c.ok), 0)
    if as_json:
        emit({"healthy": code == 0, "exit_code": code, "checks": [c.to_json() for c in checks]})
    else:
        for c in checks:
            click.echo(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
            if not c.ok and c.fix:
                click.echo(f"     fix: {c.fix}")
    sys.exit(code)


@cli.group()
def queues() -> None:
    """List, pause and resume queues."""


@queues.command("list")
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@pass_ctx
def queues_list(ctx: Context, as_json: bool) -> None:
    """Queues with their per-state counts."""
    with explained(as_json):
        found = ctx.existing_app.queues()
        if as_json:
            emit(
                [
                    {
                        "queue": q.name,
                        "paused": q.paused,
                        "counts": {s.value: n for s, n in q.counts.items()},
                    }
                    for q in found
                ]
            )
            return
        if not found:
            click.echo("no queues")
            return
        rows = [
            [
                q.name,
                "paused" if q.paused else "",
                "  ".join(f"{s.value}={n}" for s, n in sorted(q.counts.items()) if n) or "empty",
            ]
            for q in found
        ]
        for line in table(rows, ["QUEUE", "PAUSED", "JOBS"]):
            click.echo(line)


@queues.command("pause")
@click.argument("name")
@pass_ctx
def queues_pause(ctx: Context, name: str) -> None:
    """Stop claiming from a queue (running jobs finish)."""
    with explained():
        ctx.existing_app.pause_queue(name)
        click.echo(f"paused {name}")


@queues.command("resume")
@click.argument("name")
@pass_ctx
def queues_resume(ctx: Context, name: str) -> None:
    """Claim from a paused queue again."""
    with explained():
        ctx.existing_app.resume_queue(name)
        click.echo(f"resumed {name}")


@cli.command()
@click.option(
    "--sql", "print_sql", is_flag=True, help="Print the migrations instead of applying them."
)
@pass_ctx
def migrate(ctx: Context, print_sql: bool) -> None:
    """Create or upgrade the job tables (and the app's outbox table, when it has one)."""
    with explained():
        app = ctx.app
        if print_sql:
            driver = app._driver or open_driver(app.url or "")
            for version, sql in driver.migration_sql():
                click.echo(f"-- migration {version}\n{sql.rstrip()}\n")
            if app._outbox is not None:
                store = open_store(app._outbox) if isinstance(app._outbox, str) else app._outbox
                for version, sql in store.migration_sql():
                    click.echo(
                        f"-- outbox migration {version} (your business database)\n{sql.rstrip()}\n"
                    )
            return
        driver = app.driver  # opening migrates
        click.echo(f"migrated {driver.display_url}")
        if app._outbox is not None:
            click.echo(f"migrated the outbox at {app._open_outbox().display_url}")


@cli.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Anything but loopback needs basic auth: "
    "$ULTIMAT3_JOBS_DASHBOARD_USER and $ULTIMAT3_JOBS_DASHBOARD_PASSWORD.",
)
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port."
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option("--tenant", help="Show only this tenant's jobs (another's answer 404).")
@click.option(
    "--refresh",
    default="3s",
    show_default=True,
    type=DURATION,
    help="How often pages refresh their live part (0s: never).",
)
@pass_ctx
def dashboard(
    ctx: Context,
    host: str,
    port: int,
    read_only: bool,
    tenant: str | None,
    refresh: timedelta,
) -> None:
    """The web dashboard (extra [dashboard]): queues, jobs, dead letters, cron, workers."""
    with explained():
        from ultimat3.jobs.dashboard.serve import serve  # missing_extra's error without it

        serve(
            ctx.existing_app,
            host=host,
            port=port,
            read_only=read_only,
            tenant=tenant,
            refresh=refresh.total_seconds(),
        )


@cli.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    help="Where to put the demo's SQLite file and keep it (default: a temporary directory, "
    "removed at the end).",
)
def demo(directory: str | None) -> None:
    """A self-contained tour on a fresh SQLite file (a few seconds)."""
    from ultimat3.jobs.demo import run_demo

    with explained():
        sys.exit(run_demo(directory))


def main() -> None:
    cli(prog_name="ultimat3-jobs")
