"""Traces across the outbox relay: the trace context staged with the job in the business
database reaches the job row, and the worker's span links to the request that enqueued it."""

from __future__ import annotations

import opentelemetry.sdk  # noqa: F401  (a dev dependency: a missing one fails, it is not skipped)

from tracing import check_link, traced
from ultimat3.jobs import App
from ultimat3.jobs.testing import drain

from .conftest import StoreSpec, job_a


def test_the_consumer_span_links_to_the_request_through_the_relay(
    app: App, spec: StoreSpec
) -> None:
    with traced() as spans:
        with (
            spans.tracer.start_as_current_span("POST /orders") as request,
            spec.begin() as conn,
            app.using(conn),
        ):
            staged = app.enqueue(job_a, 1).id
        assert app.relay().tick() == 1
        job = app.get_job(staged)
        assert job.trace_context is not None
        trace_id = format(request.get_span_context().trace_id, "032x")
        assert job.trace_context.startswith(f"00-{trace_id}-")
        drain(app)
        (send,) = spans.named("send")
        (process,) = spans.named("process")
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    check_link(send, process, staged, job.queue)
    assert process.attributes["ultimat3_jobs.outcome"] == "completed"
