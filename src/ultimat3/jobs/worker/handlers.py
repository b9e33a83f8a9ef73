"""Running one job: what a worker's handler does with a claimed job (``Held``), and how what
happened becomes one ``Outcome``.

A handler prepares the job (decodes its input; a name this worker lacks is given back and
skipped a while, or dead-lettered past ``unknown_grace``), calls its function on a handler
thread (sync) or the worker's event loop (``async def``), and turns its return or exception
into an ``Outcome`` (``outcome_of``: complete, fail with a retry or dead, snooze, cancel,
release). It knows nothing of the cycle, the threads or the database: the worker writes the
outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.errors import DeserializationError, SerializationError
from ultimat3.jobs.job import Cancel, Enqueuer, JobContext, JobHandle, Snooze, current_app
from ultimat3.jobs.maintenance import attempt_error, decide_failure, error_from_exception
from ultimat3.jobs.records import Failure, Job
from ultimat3.jobs.run import Event, Life, Run, Skip
from ultimat3.jobs.serialization import Serializer

__all__ = ["Handlers", "Held", "Outcome", "fields"]


OutcomeKind = Literal["complete", "fail", "snooze", "cancel", "release"]


@dataclass
class Outcome:
    kind: OutcomeKind
    failure: Failure | None = None
    drop: bool = False
    #: A snooze's or release's wait from the write, on the database's clock (``job_snooze``);
    #: None keeps the job's due time (the release of a job whose name this worker lacks).
    delay: timedelta | None = timedelta(0)
    reason: str = ""
    #: A completion's result as JSON text (None: the handler returned None).
    result: str | None = None


class Held:
    """A job this worker holds: its ``Run`` (the state the threads share, under its lock) and
    what its handler thread (or task) alone writes (its deadline, start, duration and task)."""

    __slots__ = (
        "cancelled",
        "deadline",
        "duration",
        "handle",
        "job",
        "lease",
        "run",
        "running",
        "started_at",
        "task",
    )

    def __init__(self, job: Job, handle: JobHandle[Any] | None, claimed_at: float) -> None:
        self.job = job
        self.lease = job.lease
        self.handle = handle
        #: ``claimed_at``: when the claim was sent (monotonic seconds), the lease's first
        #: confirmation (``Run.confirm``).
        self.run: Run[Outcome] = Run(confirmed=claimed_at)
        self.cancelled = threading.Event()
        self.deadline: float | None = None
        self.started_at: float | None = None
        self.duration: float | None = None  # seconds the function ran, once it returned
        self.task: concurrent.futures.Future[None] | None = None
        #: The asyncio task that runs an async job's function, set by that task before its
        #: deadline: the heartbeat that sees the deadline passed cancels it (``Beat``).
        self.running: asyncio.Task[Any] | None = None


class Handlers:
    """What a worker needs to run one job (the ``Worker`` is one): it reads the worker's
    settings and records a skipped name through the worker's lifecycle (``_apply``)."""

    serializer: Serializer
    clock: Clock
    app: Enqueuer
    registered: Callable[[], list[str]]
    unknown_grace: timedelta
    #: How long a job name this worker lacks is passed over before it is claimed again.
    unknown_skip: float
    _life: Life
    _next_beat: float

    def _apply(self, event: Event) -> tuple[Life, Life]:
        raise NotImplementedError

    def _prepare(self, held: Held) -> tuple[JobHandle[Any], list[Any]] | Outcome:
        job = held.job
        handle = held.handle
        if handle is None:
            return self._unknown(job, self.clock.now())
        try:
            value = self.serializer.loads(job.input, into=handle.input_type)
        except DeserializationError as exc:
            error = attempt_error(job, "DeserializationError", str(exc), self.clock.now())
            # No retry can decode a payload that cannot be decoded now: park it.
            return Outcome("fail", failure=Failure(job.lease, error, None))
        args: list[Any] = [value]
        if handle.wants_context:
            args.append(self._context(held))
        return handle, args

    def _unknown(self, job: Job, now: datetime) -> Outcome:
        """A job whose name this worker lacks: given back for a worker that knows it, its
        attempt refunded and its due time kept (the grace counts from it), and passed over by
        this worker's claims for a while; dead-lettered as ``unknown_job`` once it has waited
        ``unknown_grace`` since it became due (no worker that knows it claimed it meanwhile:
        such a worker would have run it, and any outcome but a completion moves its due time).
        The wait is measured on the database's clock: from its due time to this claim."""
        names = ", ".join(self.registered()) or "none"
        grace = self.unknown_grace
        fix = "deploy the code that defines it to the workers of its queue, or discard the job"
        claimed_at = job.attempted_at if job.attempted_at is not None else now
        if claimed_at - job.run_at >= grace:
            error = attempt_error(
                job,
                "unknown_job",
                f"no job named {job.name!r} is registered in this worker (registered: {names}), "
                f"and no worker that knows it claimed it within {format_duration(grace)}",
                now,
            )
            events.warning(
                "jobs.job.unknown",
                job,
                **events.job_fields(job),
                registered=names,
                dead=True,
                fix=fix,
            )
            return Outcome("fail", failure=Failure(job.lease, error, None))
        until = self._life.skipping.get(job.name, 0.0)
        if until <= self.clock.monotonic():  # once per skip period, not for each job of the name
            events.warning(
                "jobs.job.unknown",
                job,
                **events.job_fields(job),
                registered=names,
                dead=False,
                waits_until=(job.run_at + grace).isoformat(),
                fix=fix,
            )
        self._apply(
            Skip(job.name, self.clock.monotonic() + min(self.unknown_skip, grace.total_seconds()))
        )
        return Outcome("release", delay=None)

    def _context(self, held: Held) -> JobContext:
        job = held.job

        def beat() -> bool:
            # Never blocks (the event loop included): the heartbeat thread renews every held
            # lease on its own schedule; this asks it to go now and reports what it knows.
            self._next_beat = 0.0
            return not held.run.lost and not held.run.settled

        return JobContext(
            id=job.id,
            name=job.name,
            queue=job.queue,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            tenant_id=job.tenant_id,
            enqueued_at=job.created_at,
            _heartbeat=beat,
            _cancelled=held.cancelled.is_set,
        )

    def _run_sync(self, held: Held) -> Outcome | None:
        prepared = self._prepare(held)
        if isinstance(prepared, Outcome):
            return prepared
        return self._call_sync(held, *prepared)

    def _call_sync(self, held: Held, handle: JobHandle[Any], args: list[Any]) -> Outcome:
        reset = current_app.set(self.app)
        began = _job_started(held, self.clock)
        try:
            value = handle.fn(*args)
        except BaseException as exc:
            outcome = self.outcome_of(held, exc)
        else:
            outcome = Outcome("complete") if value is None else self._completed(held, value)
        finally:
            current_app.reset(reset)
        _job_finished(held, outcome, self.clock.monotonic() - began)
        return outcome

    async def _run_async(self, held: Held, *, watched: bool = False) -> Outcome | None:
        """Run an async job's function on the running event loop. ``watched``: the worker's
        heartbeat enforces its timeout on the worker's clock, as a sync job's (``Beat``): past
        ``held.deadline`` it marks the run timed out and cancels this task, and the outcome is
        then a timeout, whatever the function does with its ``CancelledError``. Unwatched
        (``Worker.drain``: no heartbeat), the timeout is ``asyncio.wait_for``'s, in real time."""
        prepared = self._prepare(held)
        if isinstance(prepared, Outcome):
            return prepared
        handle, args = prepared
        reset = current_app.set(self.app)
        timeout = handle.timeout.total_seconds() if handle.timeout is not None else None
        began = _job_started(held, self.clock)
        if watched:
            held.running = asyncio.current_task()
            if timeout is not None:
                held.deadline = began + timeout
        outcome: Outcome | None
        try:
            if watched:
                value = await handle.fn(*args)
            else:
                value = await asyncio.wait_for(handle.fn(*args), timeout)
        except asyncio.CancelledError:
            # Cancelled by the worker: settled already (a lost lease, the shutdown), or timed
            # out (below).
            outcome = None
        except BaseException as exc:
            if not watched and isinstance(exc, TimeoutError):
                held.run.time_out()  # ``wait_for``'s
                outcome = None
            else:
                outcome = self.outcome_of(held, exc)
        else:
            outcome = Outcome("complete") if value is None else self._completed(held, value)
        finally:
            current_app.reset(reset)
        if held.run.timed_out:
            outcome = self._timeout_outcome(held)
        _job_finished(held, outcome, self.clock.monotonic() - began)
        return outcome

    def _completed(self, held: Held, value: Any) -> Outcome:
        """A handler returned ``value``: a completion with its result as JSON text, or, when
        it cannot be stored (not JSON, over the payload limit), a failure parked as dead at
        once: the function ran to its end, so a retry would repeat its effects only to return
        the same value."""
        try:
            return Outcome("complete", result=self.serializer.dumps(value, path="result"))
        except SerializationError as exc:
            error = error_from_exception(held.job, exc, self.clock.now())
            return Outcome("fail", failure=Failure(held.lease, error, None))

    def outcome_of(self, held: Held, exc: BaseException) -> Outcome:
        """What a handler's exception means (shared by sync and async handlers). Never raises:
        a bad ``Snooze`` or an unrepresentable retry time becomes a failure of the job."""
        try:
            if isinstance(exc, Snooze):
                return Outcome("snooze", delay=exc.delay)
            if isinstance(exc, Cancel):
                return Outcome("cancel", reason=exc.reason)
            return self._failed(held, exc)
        except BaseException as inner:
            return self._failed(held, inner)

    def _failed(self, held: Held, exc: BaseException) -> Outcome:
        now = self.clock.now()
        error = error_from_exception(held.job, exc, now)
        try:
            failure, drop = decide_failure(held.job, held.handle, error)
        except (OverflowError, ValueError):
            failure, drop = Failure(held.lease, error, None), False  # cannot retry: park it
        return Outcome("fail", failure=failure, drop=drop)

    def _timeout_outcome(self, held: Held) -> Outcome:
        now = self.clock.now()
        timeout = held.handle.timeout if held.handle is not None else None
        error = attempt_error(
            held.job, "timeout", f"the job ran longer than its timeout of {timeout}", now
        )
        failure, drop = decide_failure(held.job, held.handle, error)
        return Outcome("fail", failure=failure, drop=drop)


def fields(h: Held) -> dict[str, Any]:
    """The fields of a job's outcome events."""
    duration = None if h.duration is None else round(h.duration, 6)
    return {**events.job_fields(h.job), "duration": duration}


def _job_started(held: Held, clock: Clock) -> float:
    """``jobs.job.started``, on the thread (or task) about to call the job's function: a
    tracing subscriber opens its span here. Returns the monotonic start."""
    if events.wanted("jobs.job.started", events.DEBUG):
        job = held.job
        at = job.attempted_at
        events.debug(
            "jobs.job.started",
            job,
            **events.job_fields(job),
            queue_latency=None
            if at is None
            else round(max(0.0, (at - job.run_at).total_seconds()), 6),
        )
    return clock.monotonic()


def _job_finished(held: Held, outcome: Outcome | None, duration: float) -> None:
    """The function is done: how long it ran, and ``jobs.job.finished`` on the same thread
    (or task)."""
    held.duration = duration
    if events.wanted("jobs.job.finished", events.DEBUG):
        job = held.job
        failure = outcome.failure if outcome is not None else None
        events.debug(
            "jobs.job.finished",
            job,
            **events.job_fields(job),
            outcome=events.outcome_of(
                None if outcome is None else outcome.kind,
                failure is not None and failure.retry_in is None,
            ),
            duration=round(duration, 6),
            error=None if failure is None else failure.error.kind,
        )
