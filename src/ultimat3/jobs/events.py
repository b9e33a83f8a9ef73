"""The one instrumentation point: every service emits its events here, and logging, metrics,
tracing and a user's own handlers are subscribers (the way Oban's ``:telemetry`` events feed
every consumer).

An event has a stable name (``jobs.job.completed``, ``jobs.lease.lost``: ``CATALOGUE`` lists
them), a level, scalar ``fields`` and, for job events, the ``job`` record itself (never put in
a log line: job inputs are never logged). Two kinds of consumer:

- **The log.** Every event is a record of the ``ultimat3.jobs`` logger at its level, with the
  name and fields both in the message (``jobs.job.dead job=send job_id=... attempt=3``) and in
  ``extra`` (``record.event``, ``record.fields``) for JSON formatters and structlog. Only the
  command line configures handlers; a library user who configures none sees nothing.
- **Subscribers.** ``subscribe(handler)`` (or ``subscribe(handler, names=[...])``) calls
  ``handler(event)`` for each event, whatever the log level, on the thread that emitted it:
  a handler must be quick and must not raise (one that raises is logged once and kept).

With no subscriber an event costs one tuple test and the logger's level check (cached by
``logging``); a caller that would build costly fields asks ``wanted(name, level)`` first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CATALOGUE",
    "OUTCOMES",
    "Event",
    "Subscription",
    "emit",
    "subscribe",
    "wanted",
]

logger = logging.getLogger("ultimat3.jobs")
logger.addHandler(logging.NullHandler())

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR

#: Every event name a service emits, with what it means (docs/operations.md shows it; a test
#: checks that the code emits no name missing here).
CATALOGUE: dict[str, str] = {
    "jobs.job.enqueued": "a job was inserted (or deduped onto an existing one)",
    "jobs.job.started": "a worker calls a job's function (queue_latency: due time to start)",
    "jobs.job.finished": "a job's function returned or raised (outcome, duration)",
    "jobs.job.completed": "a completion was written",
    "jobs.job.retried": "a failed attempt was written, with its retry time",
    "jobs.job.dead": "a job used its last attempt (dead-lettered, or dropped)",
    "jobs.job.snoozed": "a job snoozed itself",
    "jobs.job.cancelled": "a job cancelled itself",
    "jobs.job.rescued": "a worker rescued a job whose worker vanished (`charged`: the attempt counts)",
    "jobs.job.unknown": "a job no function of this worker is registered for (`dead`: its grace ended)",
    "jobs.job.timeout": "a job ran past its timeout",
    "jobs.job.isolated": "a rescued job runs alone",
    "jobs.lease.lost": "a worker gave up a lease (rescued elsewhere, cancelled, unconfirmed)",
    "jobs.worker.started": "a worker started",
    "jobs.worker.stopped": "a worker stopped",
    "jobs.worker.signal": "a worker received SIGTERM or SIGINT",
    "jobs.worker.fatal": "a worker stops because a loop cannot go on (exit 70)",
    "jobs.worker.stuck": "every slot is held by jobs past their timeout",
    "jobs.worker.unstuck": "a stuck worker has a free slot again",
    "jobs.worker.loop-blocked": "an async job blocks the event loop",
    "jobs.worker.claim-released": "a claim whose reply was lost was given back",
    "jobs.worker.beat-failed": "a worker could not refresh its row in the workers table",
    "jobs.worker.leave-failed": "a worker could not delete its row on exit",
    "jobs.worker.pruned": "the maintenance node deleted a stale worker row",
    "jobs.worker.bounds": "a PostgreSQL statement_timeout shorter than the lease",
    "jobs.clock.skewed": (
        "at a worker's or scheduler's start, the host's clock and the database's differ by more "
        "than 5 s (due times, leases and cron use the database's: only log times and the "
        "dashboard's display show the skew)"
    ),
    "jobs.database.unavailable": "the worker lost its database connections (once per outage)",
    "jobs.database.recovered": "the worker reaches its database again",
    "jobs.maintenance.rescue-deferred": (
        "rescues wait: this process saw its writes stall or its wall clock step"
    ),
    "jobs.pruned": "finished rows past their retention were deleted",
    "jobs.loop.failed": "a background loop's step failed; it retries",
    "jobs.loop.crashed": "a background loop's step raised unexpectedly; it retries",
    "jobs.loop.fatal": "a critical loop failed too often in a row",
    "jobs.pool.started": "a worker process of a pool started",
    "jobs.pool.exited": "a worker process of a pool exited; it is restarted",
    "jobs.pool.orphaned": "a pool's child found its pool gone and stops",
    "jobs.scheduler.fired": "a cron occurrence's jobs were inserted",
    "jobs.scheduler.task-failed": "a cron task's enqueue function raised",
    "jobs.scheduler.missed": "cron occurrences were missed (the catch-up policy says what runs)",
    "jobs.scheduler.leader-elected": "this scheduler became the leader",
    "jobs.scheduler.leader-lost": "this scheduler lost the leadership",
    "jobs.scheduler.leader-unknown": "the leadership could not be checked",
    "jobs.scheduler.clock-stepped": "the database's clock stepped; the scheduler keeps its time",
    "jobs.scheduler.clock-back": "the database's clock is back with the scheduler's time",
    "jobs.scheduler.clock-followed": "a clock step held for step_hold; the scheduler follows it",
    "jobs.scheduler.rewound": "a task's last-fired time lay in the future; brought back to now",
    "jobs.outbox.published": "the relay inserted staged jobs into the job database",
    "jobs.outbox.publish-failed": "the relay could not insert staged jobs; it retries",
    "jobs.outbox.pruned": "published outbox rows were deleted",
    "jobs.outbox.migrated": "the outbox table was created or upgraded",
    "jobs.migrated": "the job tables were created or upgraded",
    "jobs.opened": "an App opened its job database",
    "jobs.postgres.pooler": "what the PostgreSQL driver found about a connection pooler",
    "jobs.postgres.replanned": "a slow statement made its connection plan every statement again",
}
"""Every event name a service emits, with what it means: the names ``subscribe(names=...)``
takes."""


@dataclass(frozen=True, slots=True)
class Event:
    """One event, as a subscriber gets it."""

    name: str
    level: int
    fields: dict[str, Any] = field(default_factory=dict)
    #: The job record (``records.Job`` or ``records.NewJob``) for job events, else None.
    job: Any = None
    exc: BaseException | None = None


Handler = Callable[[Event], None]


class Subscription:
    """What ``subscribe`` returns: ``close()`` (or leaving its ``with`` block) unsubscribes."""

    __slots__ = ("handler", "names")

    def __init__(self, handler: Handler, names: frozenset[str] | None) -> None:
        self.handler = handler
        self.names = names

    def close(self) -> None:
        """Unsubscribe: the handler gets no event emitted after this returns."""
        with _lock:
            global _subscriptions
            _subscriptions = tuple(s for s in _subscriptions if s is not self)
            _reroute()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The one vocabulary of a job attempt's outcome: the ``outcome`` field of
#: ``jobs.job.finished``, the ``outcome`` label of ``ultimat3_jobs_outcomes_total`` and
#: ``ultimat3_jobs_duration_seconds``, the ``ultimat3_jobs.outcome`` span attribute, and the
#: name of the event written for it (``jobs.job.<outcome>``). A final one is also the job's
#: state (completed, dead, cancelled). docs/operations.md has the table.
OUTCOMES: dict[str, str] = {
    "completed": "the function returned; the job is completed",
    "retried": "the attempt failed; the job runs again at its retry time",
    "dead": "the attempt failed and was the last one (dead-lettered, or dropped)",
    "snoozed": "the job snoozed itself; it runs again later without using an attempt",
    "cancelled": "the job cancelled itself; it is cancelled",
    "released": (
        "the worker gave the job back unended (it stopped, or lacks the job's name); it runs "
        "again, attempt refunded"
    ),
}


def outcome_of(kind: str | None, last: bool) -> str:
    """The ``OUTCOMES`` word of an attempt whose end is ``kind`` (the worker's: complete,
    fail, snooze, cancel, release; None: released), ``last``: a failure with no retry."""
    if kind == "fail":
        return "dead" if last else "retried"
    return _OUTCOME_OF_KIND.get(kind or "release", kind or "released")


_OUTCOME_OF_KIND = {
    "complete": "completed",
    "snooze": "snoozed",
    "cancel": "cancelled",
    "release": "released",
}

#: Set by a tracing integration (``ultimat3.jobs.otel``): called as ``(queue, job name, job
#: id)`` for each job the enqueue path builds, it returns the trace context to store with the
#: job (W3C ``traceparent``, then `` tracestate``), or None. None: no tracing.
trace_context_for: Callable[[str, str, str], str | None] | None = None

_lock = threading.Lock()
_subscriptions: tuple[Subscription, ...] = ()
#: Per event name, the handlers that want it; ``_everything`` for names not routed.
_routes: dict[str, tuple[Handler, ...]] = {}
_everything: tuple[Handler, ...] = ()
_failed: set[int] = set()


def _reroute() -> None:
    global _routes, _everything
    _everything = tuple(s.handler for s in _subscriptions if s.names is None)
    named = {n for s in _subscriptions if s.names is not None for n in s.names}
    _routes = {
        n: tuple(s.handler for s in _subscriptions if s.names is None or n in s.names)
        for n in named
    }


def subscribe(handler: Handler, *, names: Iterable[str] | None = None) -> Subscription:
    """Call ``handler(event)`` for every event (or only those ``names``), from now on."""
    chosen = None if names is None else frozenset(names)
    if chosen is not None:
        unknown = sorted(chosen - CATALOGUE.keys())
        if unknown:
            from ultimat3.jobs.errors import ConfigurationError

            raise ConfigurationError(
                f"no event is named {', '.join(map(repr, unknown))}",
                fix="use names from ultimat3.jobs.events.CATALOGUE (docs: Operations)",
            )
    sub = Subscription(handler, chosen)
    global _subscriptions
    with _lock:
        _subscriptions = (*_subscriptions, sub)
        _reroute()
    return sub


def job_fields(job: Any) -> dict[str, Any]:
    """The fields every event about a job (a ``records.Job``) carries: never its input."""
    return {
        "job_id": job.id,
        "job": job.name,
        "queue": job.queue,
        "tenant": job.tenant_id,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
    }


def wanted(name: str, level: int) -> bool:
    """Would an event of this name and level reach anyone (a subscriber or the log)?"""
    if _subscriptions and (_routes.get(name) or _everything):
        return True
    return logger.isEnabledFor(level)


def emit(
    level: int, event: str, exc: BaseException | None = None, record: Any = None, **fields: Any
) -> None:
    """Emit ``event``: to the subscribers that want it, and to the log at ``level``.
    ``record`` is the job (``Job`` or ``NewJob``) of a job event, for subscribers only."""
    if _subscriptions:
        handlers = _routes.get(event) or _everything
        if handlers:
            happened = Event(event, level, fields, record, exc)
            for handler in handlers:
                try:
                    handler(happened)
                except Exception as failure:
                    if id(handler) not in _failed:
                        _failed.add(id(handler))
                        logger.error(
                            "jobs.events.subscriber-failed handler=%r event=%s error=%s",
                            handler,
                            event,
                            type(failure).__name__,
                            exc_info=failure,
                        )
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    logger.log(
        level,
        f"{event} {text}".rstrip(),
        exc_info=exc,
        extra={"event": event, "fields": fields},
    )


def debug(event: str, record: Any = None, **fields: Any) -> None:
    emit(DEBUG, event, None, record, **fields)


def info(event: str, record: Any = None, **fields: Any) -> None:
    emit(INFO, event, None, record, **fields)


def warning(event: str, record: Any = None, **fields: Any) -> None:
    emit(WARNING, event, None, record, **fields)


def error(event: str, exc: BaseException | None = None, record: Any = None, **fields: Any) -> None:
    emit(ERROR, event, exc, record, **fields)
