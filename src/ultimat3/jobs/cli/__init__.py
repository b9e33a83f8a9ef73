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

import logging
from typing import Literal

import click

from ultimat3.jobs.cli import admin, jobs, schedule, worker
from ultimat3.jobs.cli.context import Context
from ultimat3.jobs.logs import LEVELS
from ultimat3.jobs.logs import configure as configure_logs

__all__ = ["cli", "main"]


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


def main() -> None:
    cli(prog_name="ultimat3-jobs")


for _command in (
    *(worker.worker, worker.scheduler, worker.relay, worker.run_all, schedule.schedule),
    *(jobs.jobs, jobs.workers, jobs.queues),
    *(admin.healthcheck, admin.migrate, admin.dashboard, admin.demo),
):
    cli.add_command(_command)
