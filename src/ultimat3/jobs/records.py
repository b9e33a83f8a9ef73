"""The records that cross the driver seam: immutable (frozen dataclasses, and ``NewJob`` a
``NamedTuple``), never rows or cursors.

Times are timezone-aware UTC ``datetime``; durations are ``timedelta``; ``input`` and
``result`` are JSON text exactly as stored (the serializer owns encoding and decoding, drivers
never parse them).

Job states::

    scheduled ──(run_at reached)──> available ──(claim)──> running ──> completed
        ^                                                     │ └────> dead      (exhausted)
        └──────────────(fail with retry / snooze)─────────────┘ └────> cancelled
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

DEFAULT_QUEUE = "default"
"""The queue of a job that names none (``@job`` without ``queue=``)."""


class JobState(StrEnum):
    """Where a job is in its life: ``scheduled`` (due later), ``available`` (due, waiting for a
    worker), ``running`` (claimed, under a lease), and the final ``completed``, ``dead`` (its
    last attempt failed: dead-letter) and ``cancelled``. A ``str``: ``JobState.DEAD == "dead"``."""

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


#: States a job can still leave on its own.
ACTIVE_STATES = frozenset({JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING})
#: States that end a job.
FINAL_STATES = frozenset({JobState.COMPLETED, JobState.DEAD, JobState.CANCELLED})


class NewJob(NamedTuple):
    """A job to insert. ``id`` and ``idempotency_key`` are fixed by the caller, so a relay that
    publishes the same staged job twice produces one row.

    A ``NamedTuple``, not a frozen dataclass like the other records: as immutable, and built
    once per job of a batch, where a frozen dataclass's ``__init__`` costs several times more.
    Copy one with a change by ``job._replace(...)``."""

    id: str
    name: str
    queue: str
    input: str
    idempotency_key: str
    max_attempts: int
    run_at: datetime | None = None  # None: now (plus ``delay``), on the database's clock
    priority: int = 0
    tenant_id: str | None = None
    #: With ``run_at`` None: run this long after the insert, on the database's clock.
    delay: timedelta | None = None
    #: The W3C trace context of the enqueue (``traceparent``, then `` tracestate`` if any),
    #: set by a tracing integration; the worker's span links to it.
    trace_context: str | None = None
    #: The concurrency partition (``limits.Limit.key_for``), None for an unlimited job, and
    #: how many of its jobs may run at once.
    limit_key: str | None = None
    limit_max: int = 0
    #: At most ``rate_max`` starts of the partition per ``rate_period`` (0: no rate limit).
    rate_max: int = 0
    rate_period: timedelta = timedelta(0)
    #: The uniqueness key (``limits.Unique.key_for``), None for none; the states it holds in
    #: (``limits.STATE_BITS``); and whether a conflict replaces the waiting job's input,
    #: ``run_at`` and priority (debounce) instead of only returning it.
    unique_key: str | None = None
    unique_states: int = 0
    unique_replace: bool = False


class NewJobs(Sequence[NewJob]):
    """The jobs of one enqueue of many inputs, built when first read. Any read builds them all
    at once, so a refused input raises before a driver that reads them writes anything, as
    with a list. ``stream`` builds them a slice at a time instead, for a driver that writes
    while it builds (PostgreSQL's COPY: the server stores one slice while the next is built),
    inside a transaction that a refused input rolls back whole."""

    __slots__ = ("_build", "_built", "_inputs")

    def __init__(self, inputs: Sequence[Any], build: Callable[[Sequence[Any]], list[NewJob]]):
        self._inputs = inputs
        self._build = build  # the jobs of a run of inputs, in order
        self._built: list[NewJob] = []

    def __len__(self) -> int:
        return len(self._inputs)

    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]

    def __iter__(self) -> Iterator[NewJob]:
        return iter(self._all())

    def stream(self, size: int) -> Iterator[list[NewJob]]:
        """The jobs in slices of ``size``, each built as it is reached (once: a later read
        gets the same jobs)."""
        for start in range(0, len(self._inputs), size):
            yield self._built_to(start + size)[start : start + size]

    def _all(self) -> list[NewJob]:
        return self._built_to(len(self._inputs))

    def _built_to(self, end: int) -> list[NewJob]:
        """The jobs, built up to index ``end`` at least (all of them, past the last)."""
        built, end = self._built, min(end, len(self._inputs))
        start = len(built)
        if start < end:
            built.extend(self._build(self._inputs[start:end]))
        return built


def ids_of(jobs: Sequence[NewJob]) -> list[str]:
    """The ids of ``jobs``, in order."""
    return [job.id for job in jobs]


def in_slices(jobs: Sequence[NewJob], size: int) -> Iterator[Sequence[NewJob]]:
    """``jobs`` in slices of ``size``: built as they are reached when ``jobs`` is a
    ``NewJobs`` (``NewJobs.stream``), cut from the sequence otherwise."""
    if isinstance(jobs, NewJobs):
        return jobs.stream(size)
    return (jobs[at : at + size] for at in range(0, len(jobs), size))


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What an enqueue (an insert) did: the job's ``id``, which is the existing job's when
    ``deduped`` (an earlier job had the same idempotency key)."""

    id: str
    deduped: bool


#: The name the drivers use for it.
InsertResult = EnqueueResult


@dataclass(frozen=True, slots=True)
class AttemptError:
    """One failed attempt, as stored in a job's error history."""

    attempt: int
    at: datetime
    kind: str  # the exception class, or "timeout", "worker_lost"
    message: str
    traceback: str = ""
    #: The worker that ran the attempt ("" when unknown: written before it was kept).
    worker_id: str = ""
    #: The exception's class with its module (``builtins.ValueError``); "" when the attempt
    #: ended without an exception (a timeout, a lost worker) or was written before it was kept.
    exception_path: str = ""

    def to_json(self) -> dict[str, Any]:
        """This error as the JSON object a job's ``errors`` column stores."""
        data: dict[str, Any] = {
            "attempt": self.attempt,
            "at": self.at.isoformat(),
            "kind": self.kind,
            "message": self.message,
            "traceback": self.traceback,
        }
        if self.worker_id:
            data["worker_id"] = self.worker_id
        if self.exception_path:
            data["exception_path"] = self.exception_path
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptError:
        """The error ``to_json`` wrote (fields it did not write get their defaults)."""
        return cls(
            attempt=int(data["attempt"]),
            at=datetime.fromisoformat(data["at"]),
            kind=str(data["kind"]),
            message=str(data["message"]),
            traceback=str(data.get("traceback", "")),
            worker_id=str(data.get("worker_id", "")),
            exception_path=str(data.get("exception_path", "")),
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof that a worker holds a running job. Every write after the claim names it; a write
    whose token is no longer the row's matches nothing (fencing)."""

    id: str
    token: str


@dataclass(frozen=True, slots=True)
class Job:
    """A job row."""

    id: str
    name: str
    queue: str
    input: str
    tenant_id: str | None
    idempotency_key: str
    priority: int
    state: JobState
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    attempted_at: datetime | None = None
    finished_at: datetime | None = None
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    worker_id: str | None = None
    errors: tuple[AttemptError, ...] = ()
    cancel_reason: str | None = None
    #: The trace context stored with the job at enqueue (see ``NewJob.trace_context``).
    trace_context: str | None = None
    #: What the handler returned, as JSON text; None until it completes, and when it returned
    #: None.
    result: str | None = None

    @property
    def lease(self) -> Lease:
        """The lease of a running job (its id and lease token); ``ValueError`` for a job that
        holds none."""
        if self.lease_token is None:
            raise ValueError(f"job {self.id} is {self.state}, it holds no lease")
        return Lease(self.id, self.lease_token)


_STATES = {state.value: state for state in JobState}


def job_from_row(
    row: Sequence[Any],
    *,
    to_time: Callable[[Any], datetime],
    to_errors: Callable[[Any], tuple[AttemptError, ...]],
) -> Job:
    """A ``Job`` from a row whose columns come in ``Job``'s field order (every SQL driver
    selects them so); the driver supplies how its times and error histories are stored."""

    def at(value: Any) -> datetime | None:
        return None if value is None else to_time(value)

    return Job(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        _STATES[row[7]],
        row[8],
        row[9],
        to_time(row[10]),
        to_time(row[11]),
        at(row[12]),
        at(row[13]),
        row[14],
        at(row[15]),
        row[16],
        to_errors(row[17]),
        row[18],
        row[19] if len(row) > 19 else None,  # trace_context
        row[20] if len(row) > 20 else None,  # result
    )


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs to list or count. Every field narrows; None means any."""

    states: frozenset[JobState] | None = None
    queue: str | None = None
    name: str | None = None
    tenant_id: str | None = None
    ids: tuple[str, ...] | None = None
    #: Only ids at or above this one: with ``job_list``'s ``before_id``, a window of the id
    #: order, so a selective filter reads that window, not the whole table.
    min_id: str | None = None

    @property
    def by_queue_and_state(self) -> bool:
        """Whether only states and a queue narrow it: the counts kept per (queue, state)
        answer it then (``job_count``). A field added later narrows too, so it is not."""
        return self == JobFilter(states=self.states, queue=self.queue)


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt: retried ``retry_in`` after it is written, or parked as dead when
    that is None.

    A delay, not a time: the driver adds it to the ``now`` of the write (``None``: the
    database's own clock, PostgreSQL's ``now()``), so a retry is due on the same clock as
    every other decision of the database, whatever the clock of the worker that failed
    (``Clock.pinned()``, a fake time under test, is used as that ``now``)."""

    lease: Lease
    error: AttemptError
    retry_in: timedelta | None
    #: The job's worker died under it (a rescue): until it returns, it is claimed only alone.
    #: Any other failure clears the mark.
    isolate: bool = False
    #: The attempt is given back (``attempt`` goes down by one): a rescue of a job whose worker
    #: died while it ran beside other jobs, which cannot tell which of them caused it.
    refund: bool = False


def aware(moment: datetime) -> datetime:
    """``moment`` in UTC; ``ValueError`` for a naive one (drivers take aware times only)."""
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} is naive; drivers take timezone-aware UTC datetimes")
    return moment if moment.tzinfo is UTC else moment.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Cancellation:
    """A job to cancel (``Driver.job_cancel``). With ``lease``, only while that lease is held
    (a handler cancelling itself); with ``tenant_id``, only that tenant's job."""

    job_id: str
    reason: str
    lease: Lease | None = None
    tenant_id: str | None = None

    @property
    def stray(self) -> bool:
        """The lease is another job's: the cancel matches nothing."""
        return self.lease is not None and self.lease.id != self.job_id


@dataclass(frozen=True, slots=True)
class ExpiredQuery:
    """Which expired leases to list (``Driver.job_list_expired``): up to ``limit`` (a negative
    one reads as 0); ``isolated`` None lists them all, True those claimed alone (see
    ``Failure.isolate``), False those claimed beside others."""

    limit: int
    isolated: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", max(0, self.limit))


@dataclass(frozen=True, slots=True)
class Prune:
    """Finished jobs to delete (``Driver.job_prune``): up to ``limit`` (a negative one reads
    as 0) of those in ``states`` (kept to the final ones) that finished before
    ``finished_before`` (aware, held in UTC)."""

    states: frozenset[JobState]
    finished_before: datetime
    limit: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "states", frozenset(self.states) & FINAL_STATES)
        object.__setattr__(self, "finished_before", aware(self.finished_before))
        object.__setattr__(self, "limit", max(0, self.limit))

    @property
    def empty(self) -> bool:
        """Nothing can match: no final state, or a limit of 0."""
        return not self.states or not self.limit


@dataclass(frozen=True, slots=True)
class Fire:
    """One occurrence of a cron task to dispatch, with its jobs (``Driver.schedule_fire``);
    ``occurrence`` is aware, held in UTC."""

    task: str
    occurrence: datetime
    jobs: Sequence[NewJob] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "occurrence", aware(self.occurrence))


@dataclass(frozen=True, slots=True)
class Rewind:
    """A task's ``last_fired_at`` to move back from ``was`` to ``to`` (``Driver.
    schedule_rewind``); both aware, held in UTC."""

    task: str
    was: datetime
    to: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "was", aware(self.was))
        object.__setattr__(self, "to", aware(self.to))


@dataclass(frozen=True, slots=True)
class Leadership:
    """A lease on the leadership of ``name`` held by ``holder``, ``ttl`` at a time
    (``Driver.leader_elect``; ``leader_resign`` ignores ``ttl``)."""

    name: str
    holder: str
    ttl: timedelta


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue as ``App.queues()`` and ``ultimat3-jobs queues list`` show it: its name,
    whether it is paused, its jobs counted by state, and when its oldest due job became due."""

    name: str
    paused: bool
    counts: dict[JobState, int] = field(default_factory=dict)
    #: The ``run_at`` of the oldest job due now (scheduled or available), None when none is
    #: due: how long the queue's next job has waited.
    oldest_ready_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class FinishedCount:
    """How many jobs of ``queue`` ended in ``state`` during the time bucket that starts at
    ``start`` (the dashboard's throughput chart)."""

    queue: str
    state: JobState
    start: datetime
    count: int


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A cron task's persisted state: when the scheduler first knew it (nothing is owed before
    that), and the last occurrence dispatched for it."""

    task: str
    first_seen_at: datetime
    last_fired_at: datetime | None


@dataclass(frozen=True, slots=True)
class FlowState:
    """Where a job's partition stands against its limits now (``Driver.job_flow``)."""

    limit_key: str
    #: How many of the partition may run at once (``limits.NO_LIMIT``: only a rate limit),
    #: and how many hold a slot now (running, lease not expired).
    limit_max: int
    running: int
    #: At most ``rate_max`` starts per ``rate_period`` (0: no rate limit); the starts within
    #: the window now, and when its oldest start leaves it.
    rate_max: int = 0
    rate_period: timedelta = timedelta(0)
    starts: int = 0
    oldest_start: datetime | None = None

    @property
    def reopens_at(self) -> datetime | None:
        """When a full rate window lets the next job start; None when it is not full."""
        if not self.rate_max or self.starts < self.rate_max or self.oldest_start is None:
            return None
        return self.oldest_start + self.rate_period

    def why_waiting(self) -> str | None:
        """What holds a waiting job back, in words; None when nothing does."""
        if self.running >= self.limit_max:
            return f"concurrency {self.running}/{self.limit_max} on {self.limit_key}"
        reopens = self.reopens_at
        if reopens is not None:
            return (
                f"rate-limited until {reopens.strftime('%H:%M:%S')} UTC "
                f"({self.starts}/{self.rate_max} starts in {self.rate_period} on {self.limit_key})"
            )
        return None


@dataclass(frozen=True, slots=True)
class ClaimParams:
    queues: tuple[str, ...]
    limit: int
    lease_for: timedelta
    worker_id: str
    now: datetime | None = None
    #: False: claim ordinary jobs only; True: claim isolated ones only (see ``Failure``).
    isolated: bool = False
    #: The claim's token; each claimed job's lease token is it, a dot, and the job's id. A
    #: caller that picks it (``ids.token()``) can give back a claim whose reply it lost
    #: (``Driver.job_release_claim``). Empty: the driver picks one.
    token: str = ""
    #: Also claim jobs with a concurrency limit (see ``limits``); False claims only jobs
    #: without one.
    limited: bool = False
    #: Job names not to claim: names this worker lacks and skips for a while (a rolling
    #: deploy).
    skip: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Cycle:
    """One turn of a worker, written in one transaction: the outcomes that finished and a claim
    for the handlers that are free (see ``Driver.job_cycle``)."""

    completes: Sequence[Lease] = ()
    failures: Sequence[Failure] = ()
    #: The results of completions, as JSON text by job id; a completion absent here stores
    #: none (its handler returned None). Written with the completion, fenced by its lease.
    results: Mapping[str, str] = field(default_factory=dict)
    #: Claimed for handlers free now, so the claim marks its jobs started.
    claim: ClaimParams | None = None

    @property
    def claims(self) -> ClaimParams | None:
        """The claim, unless it can claim nothing (no queue, or no handler free)."""
        claim = self.claim
        return claim if claim is not None and claim.limit > 0 and claim.queues else None

    @property
    def writes(self) -> bool:
        """Whether the cycle settles anything: only then must its commit reach the disk."""
        return bool(self.completes or self.failures)


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What a ``Cycle`` changed: the ids each fenced write matched, and the claimed jobs in
    claim order."""

    completed: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    claimed: list[Job] = field(default_factory=list)
    #: With limits: how long after the claim's ``now`` (the driver's clock, as every due time)
    #: a due job held back by a full rate window may next be claimed; the worker's wait ends
    #: then at the latest, measured on its monotonic clock, so a host clock that is off cannot
    #: shorten or stretch it. None when nothing waits on a rate limit.
    wake_in: timedelta | None = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker process, as its row in the workers table says: refreshed with its
    heartbeat, removed when it exits cleanly, pruned by the maintenance node once stale.
    ``id`` is the ``worker_id`` it writes into the jobs it runs (``Job.worker_id``)."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    version: str
