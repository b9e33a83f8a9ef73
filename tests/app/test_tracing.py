"""Traces of direct enqueues on every driver: a producer span per enqueue, the trace context
stored with the job (one by one, and in a batch big enough for PostgreSQL's COPY path), and a
consumer span per attempt, current while the function runs, in error when it failed: a child
of the enqueue's span by default (one trace per request), a new linked trace with
``new_trace``. The instrumentor does the same, and ``opentelemetry-instrument ultimat3-jobs
worker`` traces a real worker process without code."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import opentelemetry.sdk  # noqa: F401  (a dev dependency: a missing one fails, it is not skipped)
import pytest
from opentelemetry import trace

from tracing import Captured, check_link, traced
from ultimat3.jobs import App, ConfigurationError, job, otel
from ultimat3.jobs.otel import JobsInstrumentor

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
    # One trace from the request to the job's function.
    assert processes[ok].context.trace_id == request.get_span_context().trace_id
    assert processes[ok].status.is_ok and processes[ok].attributes["ultimat3_jobs.outcome"] == (
        "completed"
    )
    assert processes[bad].attributes["ultimat3_jobs.outcome"] == "dead"
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


def test_new_trace_links_instead(
    make_app: Callable[..., App], make_module: Callable[..., types.ModuleType]
) -> None:
    app = make_app(make_module("new_trace_jobs", traced_job=traced_job))
    with traced(new_trace=True) as spans:
        with spans.tracer.start_as_current_span("request"):
            retried = traced_job.enqueue({"fail": True}, max_attempts=2).id
            dead = traced_job.enqueue({"fail": True}, max_attempts=1).id
        app.worker().drain()
        sends = {s.attributes["messaging.message.id"]: s for s in spans.named("send")}
        processes = {s.attributes["messaging.message.id"]: s for s in spans.named("process")}
    for job_id in (retried, dead):
        check_link(sends[job_id], processes[job_id], job_id, "traced", child=False)
        assert processes[job_id].status.status_code.name == "ERROR"
    assert processes[retried].context.trace_id != processes[dead].context.trace_id
    assert processes[retried].attributes["ultimat3_jobs.outcome"] == "retried"
    assert processes[dead].attributes["ultimat3_jobs.outcome"] == "dead"


def test_the_instrumentor_instruments(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import entry_points

    (point,) = entry_points(group="opentelemetry_instrumentor", name="ultimat3_jobs")
    assert point.load() is JobsInstrumentor
    app = make_app(make_module("instrumentor_jobs", traced_job=traced_job))
    captured = Captured()
    monkeypatch.setenv("ULTIMAT3_JOBS_OTEL_NEW_TRACE", "true")
    instrumentor = JobsInstrumentor()
    instrumentor.instrument(tracer_provider=captured.provider)
    try:
        assert instrumentor.is_instrumented_by_opentelemetry
        with pytest.raises(ConfigurationError, match="by opentelemetry-instrument") as raised:
            otel.instrument()
        assert "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=ultimat3_jobs" in str(raised.value.fix)
        job_id = traced_job.enqueue({}).id
        app.worker().drain()
    finally:
        instrumentor.uninstrument()
    (send,) = captured.named("send")
    (process,) = captured.named("process")
    check_link(send, process, job_id, "traced", child=False)  # as the variable says
    assert app.get_job(traced_job.enqueue({}).id).trace_context is None  # uninstrumented
    monkeypatch.setenv("ULTIMAT3_JOBS_OTEL_NEW_TRACE", "maybe")
    with pytest.raises(ConfigurationError, match="ULTIMAT3_JOBS_OTEL_NEW_TRACE is 'maybe'"):
        instrumentor.instrument(tracer_provider=captured.provider)
    assert not instrumentor.is_instrumented_by_opentelemetry
