"""Set-up and probes: ``migrate``, ``healthcheck``, ``dashboard`` and ``demo``."""

from __future__ import annotations

import sys
from datetime import timedelta

import click

from ultimat3.jobs.cli.context import (
    DURATION,
    Context,
    emit,
    explained,
    json_option,
    pass_ctx,
)
from ultimat3.jobs.drivers import open_driver
from ultimat3.jobs.errors import JobsError
from ultimat3.jobs.health import Check, run_checks
from ultimat3.jobs.outboxes import open_store


@click.command()
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
@json_option
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
        driver = app._driver or open_driver(app.url or "", clock=app.clock)  # never migrates
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


@click.command()
@click.option(
    "--sql", "print_sql", is_flag=True, help="Print the migrations instead of applying them."
)
@pass_ctx
def migrate(ctx: Context, print_sql: bool) -> None:
    """Create or upgrade the job tables (and the app's outbox table, when it has one)."""
    with explained():
        app = ctx.app
        if print_sql:
            driver = app._driver or open_driver(app.url or "", clock=app.clock)
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


@click.command()
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


@click.command()
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
