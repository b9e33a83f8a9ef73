"""OpenTelemetry spans captured with the SDK's in-memory exporter, for the tracing tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ultimat3.jobs import otel


class Captured:
    def __init__(self) -> None:
        self.provider = TracerProvider()
        self.exporter = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]


@contextmanager
def traced(*, new_trace: bool = False) -> Iterator[Captured]:
    captured = Captured()
    otel.instrument(tracer_provider=captured.provider, new_trace=new_trace)
    try:
        yield captured
    finally:
        otel.uninstrument()


def check_link(
    send: Any, process: Any, job_id: str, queue: str, attempt: int = 1, *, child: bool = True
) -> None:
    """``process`` is the consumer span of ``job_id``, linked to the producer span ``send``
    and, unless ``child`` is False (``new_trace``), its child in the same trace."""
    assert send.kind.name == "PRODUCER" and process.kind.name == "CONSUMER"
    assert send.name == process.name.replace("process", "send") == f"send {queue}"
    for span, operation in ((send, "send"), (process, "process")):
        assert span.attributes["messaging.system"] == "ultimat3_jobs"
        assert span.attributes["messaging.destination.name"] == queue
        assert span.attributes["messaging.message.id"] == job_id
        assert span.attributes["messaging.operation.type"] == operation
    assert process.attributes["ultimat3_jobs.attempt"] == attempt
    (link,) = process.links
    assert link.context.trace_id == send.context.trace_id
    assert link.context.span_id == send.context.span_id
    if child:
        assert process.parent is not None and process.parent.span_id == send.context.span_id
        assert process.context.trace_id == send.context.trace_id
    else:
        assert process.parent is None
        assert process.context.trace_id != send.context.trace_id
