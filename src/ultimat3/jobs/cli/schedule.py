"""``schedule``: each job's retry schedule and limits, each task's next cron runs."""

from __future__ import annotations

from datetime import UTC
from typing import Any
from zoneinfo import ZoneInfo

import click

from ultimat3.jobs.cli.context import (
    Context,
    emit,
    explained,
    json_option,
    pass_ctx,
    table,
)
from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.retry import retry_schedule


@click.command()
@json_option
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
            runs = t.next_runs(now, count=count)
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
            table(rows, headers)
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
            table(runs_rows, [f"NEXT RUNS ({row['tz']})", "UTC"], indent="  ")


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
