"""Traces of direct enqueues on every driver: a producer span per enqueue, the trace context
stored with the job (one by one, and in a batch big enough for PostgreSQL's COPY path), and a
consumer span per attempt, current while the function runs, in error when it failed."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import opentelemetry.sdk  # noqa: F401  (a dev dependency: a missing one fails, it is not skipped)
from opentelemetry import trace

from tracing import check_link, traced
from ultimat3.jobs import App, job

INSIDE: list[Any] = []


@job(queue="traced")
def traced_job(input: dict[str, Any]) -> None:
    INSIDE.append(trace.get_current_span().get_span_context())
    if input.get("fail"):
        raise ValueError("no")


def test_enqueue_to_process_on_every_driver(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("tracing_jobs", traced_job=traced_job))
    INSIDE.clear()
    with traced() as spans:
        with spans.tracer.start_as_current_span("request") as request:
            ok = traced_job.enqueue({}).id
            bad = traced_job.enqueue({"fail": True}, max_attempts=1).id
        batch = [r.id for r in app.enqueue_many(traced_job, [{}] * 250)]
        stored = [app.get_job(i).trace_context for i in (ok, bad, batch[0], batch[-1])]
        assert all(s is not None and s.startswith("00-") for s in stored), stored
        app.worker(concurrency=5).drain()
        sends = {s.attributes["messaging.message.id"]: s for s in spans.named("send")}
        processes = {s.attributes["messaging.message.id"]: s for s in spans.named("process")}
    assert len(sends) == len(processes) == 252
    for job_id in (ok, bad, batch[0], batch[-1]):
        check_link(sends[job_id], processes[job_id], job_id, "traced")
    assert sends[ok].parent.span_id == request.get_span_context().span_id
    assert processes[ok].status.is_ok and processes[ok].attributes["ultimat3_jobs.outcome"] == (
        "complete"
    )
    assert processes[bad].status.status_code.name == "ERROR"
    assert processes[bad].status.description == "ValueError"
    # The function ran inside its process span.
    ran = {ctx.span_id for ctx in INSIDE}
    assert {processes[ok].context.span_id, processes[bad].context.span_id} <= ran


def test_without_instrumentation_nothing_is_stored(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("untraced_jobs", traced_job=traced_job))
    assert app.get_job(traced_job.enqueue({}).id).trace_context is None
