"""Traces of direct enqueues on every driver: a producer span per enqueue, the trace context
stored with the job (one by one, and in a batch big enough for PostgreSQL's COPY path), and a
consumer span per attempt, current while the function runs, in error when it failed: a child
of the enqueue's span by default (one trace per request), a new linked trace with
``new_trace``. The instrumentor does the same, and ``opentelemetry-instrument ultimat3-jobs
worker`` traces a real worker process without code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import opentelemetry.sdk  # noqa: F401  (a dev dependency: a missing one fails, it is not skipped)
import pytest
from opentelemetry import trace

from tracing import Captured, check_link, traced
from ultimat3.jobs import App, ConfigurationError, job, otel
from ultimat3.jobs.otel import JobsInstrumentor

from .processes import HERE, wait_until

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


def _spans_printed(stdout: str) -> list[dict[str, Any]]:
    """The spans the SDK's console exporter printed: JSON objects one after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := stdout.find("{", at)) != -1:
        span, at = decoder.raw_decode(stdout, at)
        found.append(span)
    return found


def test_opentelemetry_instrument_traces_a_worker_without_code(
    fault_app: App, tmp_path: Path
) -> None:
    """`opentelemetry-instrument ultimat3-jobs worker`, a real process with the distro's
    configurator and the console exporter: the job's span is a child of the span of the
    request that enqueued it, and the worker's app module calls no instrument()."""
    import faultjobs

    bin_dir = Path(sys.executable).parent
    with traced() as spans:
        with spans.tracer.start_as_current_span("POST /orders") as request:
            job_id = faultjobs.ledger.enqueue({}).id
        (send,) = spans.named("send")
    env = {
        **os.environ,
        "ULTIMAT3_JOBS_URL": os.environ["ULTIMAT3_JOBS_URL"],
        "FAULT_LEDGER": os.environ["FAULT_LEDGER"],
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OTEL_SERVICE_NAME": "shop-worker",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    proc = subprocess.Popen(
        [
            str(bin_dir / "opentelemetry-instrument"),
            str(bin_dir / "ultimat3-jobs"),
            "--app",
            "faultjobs:app",
            "worker",
            "--poll-interval",
            "50ms",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: fault_app.get_job(job_id).state.value == "completed", 60, "the job")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    (process,) = [s for s in _spans_printed(stdout) if s["name"] == "process default"]
    assert process["kind"] == "SpanKind.CONSUMER"
    assert process["context"]["trace_id"] == f"0x{request.get_span_context().trace_id:032x}"
    assert process["parent_id"] == f"0x{send.context.span_id:016x}"
    assert process["attributes"]["messaging.message.id"] == job_id
    assert process["attributes"]["ultimat3_jobs.outcome"] == "completed"
    assert process["resource"]["attributes"]["service.name"] == "shop-worker"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"sqlite:///{tmp_path / 'traced.sqlite3'}",
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
    }
