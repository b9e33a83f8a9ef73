"""The ``ultimat3-jobs`` command.

Exit codes: 0 ok, 1 an error the library explains (its cause and fix are printed, no
traceback), 2 a usage error. Read commands take ``--json``. ``--app module:attr`` (or
``$ULTIMAT3_JOBS_APP``) names your App; ``--url`` (or ``$ULTIMAT3_JOBS_URL``) the database.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC
from typing import Any, Literal, NoReturn, TypeVar
from zoneinfo import ZoneInfo

import click

from ultimat3.jobs.app import App
from ultimat3.jobs.cron import next_runs
from ultimat3.jobs.drivers import open_driver
from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.errors import ConfigurationError, JobsError
from ultimat3.jobs.outboxes import open_store
from ultimat3.jobs.records import Job, JobState
from ultimat3.jobs.retry import retry_schedule

F = TypeVar("F", bound=Callable[..., Any])


class Context:
    def __init__(self, app_ref: str | None, url: str | None) -> None:
        self.app_ref = app_ref
        self.url = url
        self._app: App | None = None

    @property
    def app(self) -> App:
        if self._app is None:
            self._app = load_app(self.app_ref, self.url)
        return self._app


def load_app(ref: str | None, url: str | None) -> App:
    """The App named by ``module:attr`` (attr defaults to ``app``), or a bare App on ``url``."""
    if not ref:
        return App(url)
    module_name, _, attr = ref.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r} for --app: {exc}",
            fix="run from your project's directory, or check --app module:attribute",
        ) from None
    value = getattr(module, attr or "app", None)
    if callable(value) and not isinstance(value, App):
        value = value()
    if not isinstance(value, App):
        raise ConfigurationError(
            f"--app {ref!r} is not an App (found {type(value).__name__})",
            fix="point --app at a module attribute holding App(...), e.g. myproject.jobs:app",
        )
    if url and value.url != url:
        raise ConfigurationError(
            f"--url {url!r} differs from the URL of the app {ref!r} ({value.url!r})",
            fix="pass one of --url or --app, or make them agree",
        )
    return value


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
    try:
        yield
    except JobsError as error:
        fail(error, as_json)


def emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


pass_ctx = click.make_pass_decorator(Context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--app", "app_ref", envvar="ULTIMAT3_JOBS_APP", help="module:attribute of your App.")
@click.option(
    "--url", envvar="ULTIMAT3_JOBS_URL", help="Job database URL (sqlite:///..., postgresql://...)."
)
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.version_option(package_name="ultimat3-jobs")
@click.pass_context
def cli(ctx: click.Context, app_ref: str | None, url: str | None, verbose: int) -> None:
    """Durable background jobs: workers, schedules, and the jobs themselves."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")
    ctx.obj = Context(app_ref, url)


@cli.command()
@click.option(
    "-q",
    "--queue",
    "queues",
    multiple=True,
    help="Queue to serve (repeatable); default: every registered job's queue.",
)
@click.option("-c", "--concurrency", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--lease", default="30s", show_default=True)
@click.option("--shutdown-grace", default="10s", show_default=True)
@click.option("--poll-interval", default="1s", show_default=True)
@click.option(
    "--rescue-interval",
    default="5s",
    show_default=True,
    help="How often expired leases are looked for.",
)
@click.option(
    "--heartbeat",
    default=None,
    help="Lease renewal interval, at most half the lease (default: a third of the lease).",
)
@click.option(
    "--stuck-limit",
    default="5m",
    show_default=True,
    help="Exit (code 70) when jobs past their timeout hold every slot for this long.",
)
@pass_ctx
def worker(
    ctx: Context,
    queues: tuple[str, ...],
    concurrency: int,
    lease: str,
    shutdown_grace: str,
    poll_interval: str,
    rescue_interval: str,
    heartbeat: str | None,
    stuck_limit: str,
) -> None:
    """Run jobs until SIGTERM/SIGINT (a second signal stops at once)."""
    with explained():
        app = ctx.app
        w = app.worker(
            queues=list(queues) or None,
            concurrency=concurrency,
            lease=lease,
            shutdown_grace=shutdown_grace,
            poll_interval=poll_interval,
            rescue_interval=rescue_interval,
            heartbeat=heartbeat,
            stuck_limit=stuck_limit,
        )
        click.echo(
            f"worker {w.worker_id} on {app.driver.display_url}, queues {', '.join(w.queues)}, "
            f"concurrency {concurrency}",
            err=True,
        )
        stats = w.run()
        click.echo(f"stopped: {stats}", err=True)
    if w.exit_code:
        click.echo(
            "the worker stopped because one of its loops could not go on (see the log "
            f"above); exiting with {w.exit_code} so that its supervisor restarts it",
            err=True,
        )
        sys.exit(w.exit_code)


def _scheduler_options(f: F) -> F:
    f = click.option(
        "--leader",
        type=click.Choice(["sole", "database"]),
        default="database",
        show_default=True,
        help="database: elect one active scheduler among many.",
    )(f)
    f = click.option("--leader-ttl", default="15s", show_default=True)(f)
    return click.option(
        "--tick", default="1s", show_default=True, help="How often due occurrences are checked."
    )(f)


@cli.command()
@_scheduler_options
@pass_ctx
def scheduler(ctx: Context, leader: str, leader_ttl: str, tick: str) -> None:
    """Fire cron tasks until SIGTERM/SIGINT (each occurrence exactly once)."""
    with explained():
        app = ctx.app
        if not app.registry.tasks:
            raise ConfigurationError(
                "no task is registered", fix="register a module that exports task(...) handles"
            )
        s = app.scheduler(leader=_leader(leader), leader_ttl=leader_ttl, tick_interval=tick)
        click.echo(
            f"scheduler on {app.driver.display_url}: {', '.join(sorted(app.registry.tasks))}",
            err=True,
        )
        stop = _wait_for_signal()
        s.start()
        stop.wait()
        s.stop()


@cli.command()
@click.option("--batch-size", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--interval", default="200ms", show_default=True, help="Time between passes.")
@pass_ctx
def relay(ctx: Context, batch_size: int, interval: str) -> None:
    """Publish the app's outbox (App(outbox=...)) to the job database until SIGTERM/SIGINT."""
    with explained():
        app = ctx.app
        r = app.relay(batch_size=batch_size, interval=interval)
        click.echo(
            f"relay from {r.store.display_url} to {r.driver.display_url}, "
            f"{r.pending()} row(s) pending",
            err=True,
        )
        r.run(_wait_for_signal())


@cli.command("run")
@click.option("-q", "--queue", "queues", multiple=True)
@click.option("-c", "--concurrency", default=10, show_default=True, type=click.IntRange(1, 1000))
@_scheduler_options
@pass_ctx
def run_all(
    ctx: Context, queues: tuple[str, ...], concurrency: int, leader: str, leader_ttl: str, tick: str
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
        w = app.worker(queues=list(queues) or None, concurrency=concurrency)
        extra = " + relay" if r is not None else ""
        click.echo(f"worker + scheduler{extra} on {app.driver.display_url}", err=True)
        if s is not None:
            s.start()
        if r is not None:
            r.start()
        try:
            w.run()
        finally:
            if r is not None:
                r.stop()
            if s is not None:
                s.stop()
    if w.exit_code:
        sys.exit(w.exit_code)


def _leader(value: str) -> Literal["sole", "database"]:
    return "sole" if value == "sole" else "database"


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
@click.option("--count", default=5, show_default=True, help="Next cron runs per task.")
@pass_ctx
def schedule(ctx: Context, as_json: bool, count: int) -> None:
    """Each job's retry schedule and each task's next cron runs."""
    with explained(as_json):
        app = ctx.app
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
        if not jobs and not tasks:
            click.echo("no jobs or tasks registered (pass --app module:app)")
        for j in jobs:
            if j["schedule"]:
                retries = f"retries after {', '.join(j['schedule'])}"
                if j["jitter"]:
                    retries += " (jittered: each between half and all of that)"
            else:
                retries = "no retry"
            parked = "then dead-letter" if j["dead_letter"] else "then dropped"
            click.echo(
                f"{j['job']}  queue={j['queue']}  {j['attempts']} attempts, {j['backoff']}, "
                f"{retries}, {parked}"
            )
        for row in tasks:
            click.echo(f"{row['task']}  {row['cron']}  {row['tz']}  ({row['explain']})")
            for r in row["next"]:
                click.echo(f"    {r['local']}   {r['utc']}")


@cli.group()
def jobs() -> None:
    """List, inspect, retry, discard and cancel jobs."""


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
        "finished_at": j.finished_at.isoformat() if j.finished_at else None,
    }
    if full:
        try:
            data["input"] = app.decode_input(j)
        except JobsError as exc:
            data["input_error"] = exc.cause
        data["idempotency_key"] = j.idempotency_key
        data["lease_expires_at"] = j.lease_expires_at.isoformat() if j.lease_expires_at else None
        data["worker_id"] = j.worker_id
        data["cancel_reason"] = j.cancel_reason
        data["errors"] = [e.to_json() for e in j.errors]
    elif j.errors:
        data["last_error"] = f"{j.errors[-1].kind}: {j.errors[-1].message}"
    return data


@jobs.command("list")
@click.option("--state", type=click.Choice([s.value for s in JobState]), multiple=True)
@click.option("--queue")
@click.option("--name")
@click.option("--tenant")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--before", "before_id", help="Page: only jobs older than this id.")
@click.option("--json", "as_json", is_flag=True)
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
        app = ctx.app
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
        for j in found:
            line = f"{j.id}  {j.state.value:<9}  {j.name}  queue={j.queue}  attempt {j.attempt}/{j.max_attempts}"
            if j.errors:
                line += f"  last error: {j.errors[-1].kind}: {j.errors[-1].message[:80]}"
            click.echo(line)


@jobs.command("show")
@click.argument("job_id")
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_show(ctx: Context, job_id: str, tenant: str | None, as_json: bool) -> None:
    """One job with its input and every attempt's error."""
    with explained(as_json):
        app = ctx.app
        data = job_dict(app, app.get_job(job_id, tenant_id=tenant), full=True)
        if as_json:
            emit(data)
            return
        errors = data.pop("errors")
        for key, value in data.items():
            click.echo(f"{key:>16}: {json.dumps(value) if key == 'input' else value}")
        for e in errors:
            click.echo(f"\nattempt {e['attempt']} at {e['at']}: {e['kind']}: {e['message']}")
            if e["traceback"]:
                click.echo(e["traceback"].rstrip())


def _act(
    ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool, action: str
) -> None:
    with explained(as_json):
        app = ctx.app
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
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_retry(ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
    """Give dead or cancelled jobs one more attempt, now."""
    _act(ctx, ids, tenant, as_json, "retry")


@jobs.command("discard")
@click.argument("ids", nargs=-1, required=True)
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_discard(ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
    """Delete dead or cancelled jobs."""
    _act(ctx, ids, tenant, as_json, "discard")


@jobs.command("cancel")
@click.argument("ids", nargs=-1, required=True)
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def jobs_cancel(ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
    """Cancel scheduled, available or running jobs."""
    _act(ctx, ids, tenant, as_json, "cancel")


@cli.group()
def queues() -> None:
    """List, pause and resume queues."""


@queues.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def queues_list(ctx: Context, as_json: bool) -> None:
    """Queues with their per-state counts."""
    with explained(as_json):
        found = ctx.app.queues()
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
        for q in found:
            counts = "  ".join(f"{s.value}={n}" for s, n in sorted(q.counts.items()) if n)
            click.echo(f"{q.name}{'  (paused)' if q.paused else ''}  {counts or 'empty'}")


@queues.command("pause")
@click.argument("name")
@pass_ctx
def queues_pause(ctx: Context, name: str) -> None:
    """Stop claiming from a queue (running jobs finish)."""
    with explained():
        ctx.app.pause_queue(name)
        click.echo(f"paused {name}")


@queues.command("resume")
@click.argument("name")
@pass_ctx
def queues_resume(ctx: Context, name: str) -> None:
    """Claim from a paused queue again."""
    with explained():
        ctx.app.resume_queue(name)
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
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    help="Where to put the demo's SQLite file (default: a new temporary directory).",
)
def demo(directory: str | None) -> None:
    """A self-contained tour on a fresh SQLite file (a few seconds)."""
    from ultimat3.jobs.demo import run_demo

    with explained():
        sys.exit(run_demo(directory))


def main() -> None:
    cli(prog_name="ultimat3-jobs")
