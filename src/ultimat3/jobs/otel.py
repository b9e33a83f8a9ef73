"""OpenTelemetry traces (the ``[otel]`` extra: opentelemetry-api and
opentelemetry-instrumentation; you bring the SDK and its exporters). Two ways in:

- **Without code:** ``opentelemetry-instrument ultimat3-jobs worker`` (with
  opentelemetry-distro, or any configurator) loads ``JobsInstrumentor`` through its entry
  point, as it does for every library it knows; so does your web app started the same way,
  whose enqueues are then traced too.
- **In code:** ``instrument()`` once in each process, after configuring your SDK (a worker
  started by the command line runs it when your ``--app`` module calls it at import).

What is traced:

- each enqueue gets a ``send {queue}`` span (kind PRODUCER), a child of whatever span is
  current (the request's), and its W3C trace context is stored with the job (the
  ``trace_context`` column; through an outbox too, which the relay carries to the job row);
- each attempt runs inside a ``process {queue}`` span (kind CONSUMER), current while the
  job's function runs (its own spans nest under it), with an error status when the attempt
  failed (retried or dead).

By default the ``process`` span is a **child** of the enqueue's ``send`` span, so a request
and the jobs it enqueued are one trace; it also links to it, as the messaging conventions
advise. With ``new_trace=True`` (``instrument(new_trace=True)``, or
``ULTIMAT3_JOBS_OTEL_NEW_TRACE=true`` for the instrumentor) each attempt starts a trace of its
own that only links to the enqueue's span: the conventions' choice for work that runs much
later or in batches, and for traces that should stay small.

Attributes follow the OpenTelemetry messaging semantic conventions: ``messaging.system``
(``ultimat3_jobs``), ``messaging.destination.name`` (the queue),
``messaging.message.id`` (the job's id), ``messaging.operation.type`` (``send`` or
``process``), plus ``ultimat3_jobs.job.name``, ``ultimat3_jobs.attempt`` and
``ultimat3_jobs.outcome`` (the outcomes' one vocabulary: completed, retried, dead, snoozed,
cancelled, released; see docs/operations.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.errors import ConfigurationError, missing_extra

try:
    from opentelemetry import context, propagate, trace

    # The module is `# type: ignore` upstream: mypy sees no names in it.
    from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
        BaseInstrumentor,
    )
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra("tracing", "otel", exc) from exc

__all__ = ["JobsInstrumentor", "Tracing", "instrument", "uninstrument"]

SYSTEM = "ultimat3_jobs"
#: The instrumentor's setting for ``new_trace`` (``opentelemetry-instrument`` takes no
#: arguments): true, 1 or yes.
NEW_TRACE_ENV = "ULTIMAT3_JOBS_OTEL_NEW_TRACE"
#: Outcomes of a failed attempt: the span's status is an error.
_FAILED = frozenset({"retried", "dead"})


class Tracing:
    """The producer hook and the consumer subscriber; ``instrument()`` builds and installs
    one."""

    def __init__(self, tracer_provider: Any = None, *, new_trace: bool = False) -> None:
        from ultimat3.jobs.presence import library_version

        self.new_trace = new_trace
        self.tracer = trace.get_tracer(
            "ultimat3.jobs", library_version(), tracer_provider=tracer_provider
        )
        self._open: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._subscription: events.Subscription | None = None

    def install(self) -> Tracing:
        """Start tracing this process's enqueues and attempts (``instrument()`` calls it);
        ``ConfigurationError`` when tracing is already installed."""
        if events.trace_context_for is not None:
            by_instrumentor = JobsInstrumentor().is_instrumented_by_opentelemetry
            raise ConfigurationError(
                "tracing is already instrumented in this process"
                + (" (by opentelemetry-instrument)" if by_instrumentor else ""),
                fix="call ultimat3.jobs.otel.instrument() once (uninstrument() undoes it)"
                + (
                    "; under opentelemetry-instrument, do not call it, or set "
                    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=ultimat3_jobs"
                    if by_instrumentor
                    else ""
                ),
            )
        events.trace_context_for = self.produce
        self._subscription = events.subscribe(
            self.consume, names=["jobs.job.started", "jobs.job.finished"]
        )
        return self

    def uninstall(self) -> None:
        """Stop tracing (what ``install`` did is undone)."""
        if events.trace_context_for == self.produce:
            events.trace_context_for = None
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    def produce(self, queue: str, name: str, job_id: str) -> str | None:
        """The ``send {queue}`` span of one enqueue, and the trace context to store."""
        carrier: dict[str, str] = {}
        with self.tracer.start_as_current_span(
            f"send {queue}",
            kind=SpanKind.PRODUCER,
            attributes=_attributes("send", queue, job_id, name),
        ):
            propagate.inject(carrier)
        parent = carrier.get("traceparent")
        if not parent:
            return None  # a no-op tracer: nothing to link to
        state = carrier.get("tracestate")
        return f"{parent} {state}" if state else parent

    def consume(self, event: events.Event) -> None:
        """The subscriber: opens a job attempt's ``process {queue}`` span when it starts and
        ends it, with the outcome, when it finishes."""
        job = event.job
        if job is None:
            return
        key = (job.id, job.attempt)
        if event.name == "jobs.job.started":
            links = []
            parent_context = None
            stored = getattr(job, "trace_context", None)
            if stored:
                parent, _, state = stored.partition(" ")
                carrier = {"traceparent": parent, **({"tracestate": state} if state else {})}
                extracted = propagate.extract(carrier)
                found = trace.get_current_span(extracted).get_span_context()
                if found.is_valid:
                    links.append(Link(found))
                    if not self.new_trace:
                        parent_context = extracted
            if parent_context is None:
                # No parent: not the worker thread's current span either (a new trace).
                parent_context = context.Context()
            span = self.tracer.start_span(
                f"process {job.queue}",
                context=parent_context,
                kind=SpanKind.CONSUMER,
                links=links,
                attributes={
                    **_attributes("process", job.queue, job.id, job.name),
                    "ultimat3_jobs.attempt": job.attempt,
                },
            )
            token = context.attach(trace.set_span_in_context(span))
            with self._lock:
                self._open[key] = (span, token)
            return
        with self._lock:
            opened = self._open.pop(key, None)
        if opened is None:
            return
        span, token = opened
        outcome = event.fields.get("outcome")
        span.set_attribute("ultimat3_jobs.outcome", str(outcome))
        if outcome in _FAILED:
            span.set_status(Status(StatusCode.ERROR, str(event.fields.get("error"))))
        context.detach(token)
        span.end()


def _attributes(operation: str, queue: str, job_id: str, name: str) -> dict[str, Any]:
    """The messaging conventions' attributes of a ``send`` or ``process`` span."""
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.message.id": job_id,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "ultimat3_jobs.job.name": name,
    }


_installed: Tracing | None = None


def instrument(tracer_provider: Any = None, *, new_trace: bool = False) -> Tracing:
    """Trace enqueues and attempts in this process (once; ``uninstrument()`` undoes it).
    ``new_trace``: each attempt's span starts a trace of its own, linked to the enqueue's
    span, instead of being its child."""
    global _installed
    tracing = Tracing(tracer_provider, new_trace=new_trace).install()
    _installed = tracing
    return tracing


def uninstrument() -> None:
    """Undo ``instrument()`` (nothing when it was not called)."""
    global _installed
    if _installed is not None:
        _installed.uninstall()
        _installed = None


class JobsInstrumentor(BaseInstrumentor):  # type: ignore[misc]  # untyped upstream
    """The OpenTelemetry instrumentor (entry point ``ultimat3_jobs`` of the
    ``opentelemetry_instrumentor`` group), so that ``opentelemetry-instrument`` traces
    enqueues and jobs: ``JobsInstrumentor().instrument(tracer_provider=...,
    new_trace=...)`` is ``instrument(...)``; without ``new_trace``,
    ``$ULTIMAT3_JOBS_OTEL_NEW_TRACE`` decides."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """None: the library instruments itself, so nothing else must be installed."""
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        new_trace = kwargs.get("new_trace")
        if new_trace is None:
            setting = os.environ.get(NEW_TRACE_ENV, "").strip().lower()
            if setting not in ("", "true", "1", "yes", "false", "0", "no"):
                raise ConfigurationError(
                    f"${NEW_TRACE_ENV} is {setting!r}",
                    fix=f"set {NEW_TRACE_ENV} to true or false",
                )
            new_trace = setting in ("true", "1", "yes")
        instrument(kwargs.get("tracer_provider"), new_trace=bool(new_trace))

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
