"""The operator's reads and actions: ``jobs`` (list, show, retry, discard, cancel),
``workers``, and ``queues`` (list, pause, resume). None of them creates a database."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from ultimat3.jobs.app import App
from ultimat3.jobs.cli.context import (
    Context,
    clip,
    emit,
    explained,
    json_option,
    pass_ctx,
    table,
)
from ultimat3.jobs.errors import JobsError
from ultimat3.jobs.limits import NO_LIMIT
from ultimat3.jobs.records import FlowState, Job, JobState, WorkerInfo


@click.group()
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


def _flow_text(flow: FlowState) -> str:
    """Where a job's partition stands, as ``jobs show`` says it."""
    parts = []
    if flow.limit_max < NO_LIMIT:
        parts.append(f"{flow.running}/{flow.limit_max} running")
    if flow.rate_max:
        parts.append(f"{flow.starts}/{flow.rate_max} starts in {flow.rate_period}")
    return f"{', '.join(parts)} on {flow.limit_key}"


_tenant_option = click.option("--tenant", help="Only the jobs of this tenant (tenant_id).")


@jobs.command("list")
@click.option(
    "--state",
    type=click.Choice([s.value for s in JobState]),
    multiple=True,
    help="Only jobs in this state (repeatable).",
)
@click.option("--queue", help="Only jobs of this queue.")
@click.option("--name", help="Only jobs of this name (the job's export name).")
@_tenant_option
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="At most this many jobs.",
)
@click.option("--before", "before_id", help="Page: only jobs older than this id.")
@json_option
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
        table(rows, ["ID", "STATE", "NAME", "QUEUE", "ATTEMPT", "LAST ERROR"])


@jobs.command("show")
@click.argument("job_id")
@_tenant_option
@json_option
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


def _action(
    action: str, about: str, change: Callable[[App, tuple[str, ...], str | None], Any]
) -> None:
    """``jobs <action> IDS...``: says what ``change`` changed, and exits 1 when an id was not."""

    @jobs.command(action, help=about)
    @click.argument("ids", nargs=-1, required=True)
    @_tenant_option
    @json_option
    @pass_ctx
    def act(ctx: Context, ids: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
        with explained(as_json):
            changed = list(change(ctx.existing_app, ids, tenant))
            missed = [i for i in ids if i not in changed]
            if as_json:
                emit({action: changed, "unchanged": missed})
            else:
                for i in changed:
                    click.echo(f"{action}: {i}")
                for i in missed:
                    click.echo(
                        f"unchanged (not found, or its state does not allow {action}): {i}",
                        err=True,
                    )
            if missed:
                sys.exit(1)


_action(
    "retry",
    "Give dead or cancelled jobs one more attempt, now.",
    lambda app, ids, tenant: app.retry_jobs(ids, tenant_id=tenant),
)
_action(
    "discard",
    "Delete dead or cancelled jobs.",
    lambda app, ids, tenant: app.discard_jobs(ids, tenant_id=tenant),
)
_action(
    "cancel",
    "Cancel scheduled, available or running jobs.",
    lambda app, ids, tenant: [i for i in ids if app.cancel_job(i, tenant_id=tenant)],
)


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


@click.command()
@json_option
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
        table(rows, headers)


@click.group()
def queues() -> None:
    """List, pause and resume queues."""


@queues.command("list")
@json_option
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
        table(rows, ["QUEUE", "PAUSED", "JOBS"])


def _queue_action(action: str, done: str, about: str, change: Callable[[App, str], Any]) -> None:
    """``queues <action> NAME``: says what it did."""

    @queues.command(action, help=about)
    @click.argument("name")
    @pass_ctx
    def act(ctx: Context, name: str) -> None:
        with explained():
            change(ctx.existing_app, name)
            click.echo(f"{done} {name}")


_queue_action(
    "pause", "paused", "Stop claiming from a queue (running jobs finish).", App.pause_queue
)
_queue_action("resume", "resumed", "Claim from a paused queue again.", App.resume_queue)
