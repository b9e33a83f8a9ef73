"""OpenTelemetry traces (the ``[otel]`` extra: opentelemetry-api only; you bring the SDK and
its exporters). ``instrument()`` once in each process, after configuring your SDK:

- each enqueue gets a ``send {queue}`` span (kind PRODUCER), a child of whatever span is
  current (the request's), and its W3C trace context is stored with the job (the
  ``trace_context`` column; through an outbox too, which the relay carries to the job row);
- each attempt runs inside a ``process {queue}`` span (kind CONSUMER), current while the
  job's function runs (its own spans nest under it), linked to the enqueue's span, with an
  error status when the attempt failed.

Attributes follow the OpenTelemetry messaging semantic conventions: ``messaging.system``
(``ultimat3_jobs``), ``messaging.destination.name`` (the queue),
``messaging.message.id`` (the job's id), ``messaging.operation.type`` (``send`` or
``process``), plus ``ultimat3_jobs.job.name``, ``ultimat3_jobs.attempt`` and
``ultimat3_jobs.outcome``.

The consumer span *links* to the producer's (the conventions' advice for work that runs
later, maybe in batches): it starts a trace of its own, and a tracing UI shows the link.
"""

from __future__ import annotations

import threading
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.errors import ConfigurationError, missing_extra

try:
    from opentelemetry import context, propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra("tracing", "otel", exc) from exc

__all__ = ["Tracing", "instrument", "uninstrument"]

SYSTEM = "ultimat3_jobs"


class Tracing:
    """The producer hook and the consumer subscriber; ``instrument()`` builds and installs
    one."""

    def __init__(self, tracer_provider: Any = None) -> None:
        from ultimat3.jobs.presence import library_version

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
            raise ConfigurationError(
                "tracing is already instrumented in this process",
                fix="call ultimat3.jobs.otel.instrument() once (uninstrument() undoes it)",
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
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "ultimat3_jobs.job.name": name,
        }
        carrier: dict[str, str] = {}
        with self.tracer.start_as_current_span(
            f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
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
            stored = getattr(job, "trace_context", None)
            if stored:
                parent, _, state = stored.partition(" ")
                carrier = {"traceparent": parent, **({"tracestate": state} if state else {})}
                found = trace.get_current_span(propagate.extract(carrier)).get_span_context()
                if found.is_valid:
                    links.append(Link(found))
            span = self.tracer.start_span(
                f"process {job.queue}",
                kind=SpanKind.CONSUMER,
                links=links,
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.destination.name": job.queue,
                    "messaging.message.id": job.id,
                    "messaging.operation.type": "process",
                    "messaging.operation.name": "process",
                    "ultimat3_jobs.job.name": job.name,
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
        if outcome == "fail":
            span.set_status(Status(StatusCode.ERROR, str(event.fields.get("error"))))
        context.detach(token)
        span.end()


_installed: Tracing | None = None


def instrument(tracer_provider: Any = None) -> Tracing:
    """Trace enqueues and attempts in this process (once; ``uninstrument()`` undoes it)."""
    global _installed
    tracing = Tracing(tracer_provider).install()
    _installed = tracing
    return tracing


def uninstrument() -> None:
    """Undo ``instrument()`` (nothing when it was not called)."""
    global _installed
    if _installed is not None:
        _installed.uninstall()
        _installed = None
