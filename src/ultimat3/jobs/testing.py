"""Helpers for testing code that enqueues and runs jobs (Oban's and River's, in Python).

- ``FakeClock``: time that moves only when told (``clock.advance("5m")``); pass it as
  ``App(clock=...)`` and retries, delays and leases follow it on every driver. Sleeps on it
  block until time is moved (``advance_until``, ``wait_for_sleepers``).
- ``drain(app)``: run every due job in the calling thread, now; returns the worker's counts.
- ``inline(app)``: inside the block, ``enqueue`` runs the job at once in the caller (after a
  JSON round trip of its input, as a worker would see it) and writes nothing; errors propagate.
- ``manual`` is the default: jobs are written and wait for ``drain`` or a worker.
- ``assert_enqueued`` / ``refute_enqueued`` / ``all_enqueued``: look at what is waiting, by job,
  partial input, queue and tenant. They read the database, so inside a Django ``TestCase`` or an
  open ``app.transaction()`` on the same connection they see uncommitted jobs too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ultimat3.jobs.app import App
from ultimat3.jobs.clock import FakeClock
from ultimat3.jobs.driver import inspection
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.job import Cancel, EnqueueResult, JobContext, JobHandle, Snooze, current_app
from ultimat3.jobs.records import ACTIVE_STATES, Job, JobFilter, JobState, NewJob
from ultimat3.jobs.worker import WorkerStats

__all__ = [
    "FakeClock",
    "all_enqueued",
    "assert_enqueued",
    "drain",
    "inline",
    "refute_enqueued",
    "run_job",
]


def drain(app: App, *, queues: list[str] | None = None, max_jobs: int | None = None) -> WorkerStats:
    """Run due jobs of ``queues`` (default: every registered job's queue) until none is due."""
    return app.worker(queues=queues).drain(max_jobs=max_jobs)


def run_job(app: App, handle: JobHandle[Any], input: Any) -> Any:
    """Run a job's function now, with its input round-tripped through JSON as a worker would,
    and a ``JobContext`` when it asks for one. Returns what the function returns."""
    name = handle.name
    text = app.serializer.dumps(input)
    value = app.serializer.loads(text, into=handle.input_type)
    args: list[Any] = [value]
    if handle.wants_context:
        args.append(
            JobContext(
                id=uuid7(),
                name=name,
                queue=handle.queue,
                attempt=1,
                max_attempts=handle.retry.attempts,
                tenant_id=None,
                enqueued_at=app.clock.now(),
            )
        )
    token = current_app.set(app)
    try:
        result = handle.fn(*args)
        if handle.is_async:
            result = asyncio.run(result)
        return result
    finally:
        current_app.reset(token)


@contextmanager
def inline(app: App) -> Iterator[None]:
    """Within the block, enqueued jobs run at once in the caller and nothing is written.
    ``Snooze`` and ``Cancel`` raised by a job end it quietly; other errors propagate."""

    def run_now(jobs: list[NewJob]) -> list[EnqueueResult]:
        for new in jobs:
            handle = app.registry.job_named(new.name)
            assert handle is not None
            try:
                run_job(app, handle, app.serializer.loads(new.input))
            except (Snooze, Cancel):
                pass
        return [EnqueueResult(id=new.id, deduped=False) for new in jobs]

    previous = app._intercept
    app._intercept = run_now
    try:
        yield
    finally:
        app._intercept = previous


def all_enqueued(
    app: App,
    job: JobHandle[Any] | str | None = None,
    *,
    input: dict[str, Any] | None = None,
    queue: str | None = None,
    tenant_id: str | None = None,
    states: frozenset[JobState] = frozenset({JobState.AVAILABLE, JobState.SCHEDULED}),
) -> list[Job]:
    """Waiting jobs that match: ``input`` matches when each of its keys is equal in the job's."""
    name = job.name if isinstance(job, JobHandle) else job
    found = inspection(app.driver).job_list(
        JobFilter(states=states, queue=queue, name=name, tenant_id=tenant_id), limit=10_000
    )
    if input is None:
        return found
    return [j for j in found if _matches(app.decode_input(j), input)]


def assert_enqueued(
    app: App,
    job: JobHandle[Any] | str | None = None,
    *,
    input: dict[str, Any] | None = None,
    queue: str | None = None,
    tenant_id: str | None = None,
    count: int | None = None,
) -> list[Job]:
    """Fail unless a waiting job matches (exactly ``count`` of them, when given)."""
    found = all_enqueued(app, job, input=input, queue=queue, tenant_id=tenant_id)
    if (count is None and not found) or (count is not None and len(found) != count):
        waiting = inspection(app.driver).job_list(JobFilter(states=ACTIVE_STATES), limit=20)
        listing = "\n".join(f"  {j.name} {app.decode_input(j)!r} queue={j.queue}" for j in waiting)
        wanted = f"{count} job(s)" if count is not None else "a job"
        raise AssertionError(
            f"expected {wanted} matching name={_label(job)} input={input!r} queue={queue!r}, "
            f"found {len(found)}; waiting now:\n{listing or '  (nothing)'}"
        )
    return found


def refute_enqueued(
    app: App,
    job: JobHandle[Any] | str | None = None,
    *,
    input: dict[str, Any] | None = None,
    queue: str | None = None,
    tenant_id: str | None = None,
) -> None:
    """Fail if a waiting job matches."""
    found = all_enqueued(app, job, input=input, queue=queue, tenant_id=tenant_id)
    if found:
        raise AssertionError(
            f"expected no job matching name={_label(job)} input={input!r}, found {len(found)}: "
            + ", ".join(j.id for j in found[:5])
        )


def _label(job: JobHandle[Any] | str | None) -> str:
    if isinstance(job, JobHandle):
        return repr(job.bound_name)
    return repr(job)


def _matches(value: Any, partial: dict[str, Any]) -> bool:
    return isinstance(value, dict) and all(k in value and value[k] == v for k, v in partial.items())
