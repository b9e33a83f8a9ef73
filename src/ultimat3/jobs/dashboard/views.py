"""What each page shows, read from an App: plain data for the templates, no HTTP.

Every read is bounded at any table size: the jobs list pages by keyset (``before``: the last id
shown) and a text search reads newer-to-older for at most ``Budget.scan_seconds`` per page, then
offers to go on from where it stopped; the overview reads the queues (kept counts, the oldest
ready job by index seeks) and the last hour's ends (a range of the finished index); the
workers page the workers table and the running jobs (the lease index).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from ultimat3.jobs.app import App
from ultimat3.jobs.driver import inspection
from ultimat3.jobs.errors import ConfigurationError, JobsError
from ultimat3.jobs.records import Job, JobFilter, JobState, WorkerInfo
from ultimat3.jobs.retry import Retry, backoff_delay

__all__ = [
    "PAGE_SIZE",
    "Budget",
    "Filters",
    "JobsPage",
    "cron_rows",
    "job_detail",
    "jobs_page",
    "overview",
    "queue_rows",
    "workers",
]

PAGE_SIZE = 50
_SCAN_BATCH = 250
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
_STATES = {s.value: s for s in JobState}


@dataclass(frozen=True)
class Budget:
    """How much one request of the dashboard reads or changes: its settings, with defaults."""

    #: How long one page reads jobs (on the app's monotonic clock) before it offers to
    #: continue from where it stopped.
    scan_seconds: float = 0.04
    #: How many ids of the id order one step reads (a filter's window).
    window: int = 10_000
    #: The most jobs one confirmed "all that match" action changes.
    bulk_limit: int = 1_000


DEFAULT_BUDGET = Budget()


@dataclass(frozen=True)
class Filters:
    """The jobs list's filter, as the query string gives it ("" is "any")."""

    queue: str = ""
    state: str = ""
    name: str = ""
    tenant: str = ""
    text: str = ""

    @classmethod
    def parse(cls, params: Any, *, tenant: str | None) -> Filters:
        state = str(params.get("state", "")).strip()
        if state and state not in _STATES:
            raise ConfigurationError(
                f"{state!r} is not a job state",
                fix="use one of: " + ", ".join(_STATES),
            )
        return cls(
            queue=str(params.get("queue", "")).strip(),
            state=state,
            name=str(params.get("name", "")).strip(),
            # A tenant-scoped dashboard ignores the field: it shows one tenant, always.
            tenant=tenant if tenant is not None else str(params.get("tenant", "")).strip(),
            text=str(params.get("q", "")).strip(),
        )

    def job_filter(self) -> JobFilter:
        return JobFilter(
            states=frozenset({_STATES[self.state]}) if self.state else None,
            queue=self.queue or None,
            name=self.name or None,
            tenant_id=self.tenant or None,
        )

    def query(self, **extra: str) -> dict[str, str]:
        """The filter as query-string pairs (empty ones left out)."""
        pairs = {
            "queue": self.queue,
            "state": self.state,
            "name": self.name,
            "tenant": self.tenant,
            "q": self.text,
            **extra,
        }
        return {k: v for k, v in pairs.items() if v}


@dataclass
class JobsPage:
    jobs: list[Job]
    #: The id to page on from (``before=``), or None on the last page.
    next_before: str | None
    #: How many jobs this page read.
    scanned: int = 0
    #: The page stopped at its time budget: more may match further on.
    budget_spent: bool = False


def matches_text(job: Job, text: str) -> bool:
    """Whether ``text`` (case-insensitive) is in the job's input or any attempt's error."""
    needle = text.casefold()
    if needle in job.input.casefold():
        return True
    return any(
        needle in e.message.casefold()
        or needle in e.kind.casefold()
        or needle in e.traceback.casefold()
        for e in job.errors
    )


def jobs_page(
    app: App, filters: Filters, before: str | None, budget: Budget = DEFAULT_BUDGET
) -> JobsPage:
    text = filters.text
    scan = _scan(
        app,
        filters.job_filter(),
        before,
        want=PAGE_SIZE + 1,
        accept=(lambda job: matches_text(job, text)) if text else None,
        budget=budget,
    )
    if scan.stopped is not None:
        return JobsPage(scan.jobs[:PAGE_SIZE], scan.stopped, scan.read, budget_spent=True)
    shown = scan.jobs[:PAGE_SIZE]
    more = len(scan.jobs) > PAGE_SIZE
    return JobsPage(shown, shown[-1].id if more else None, scan.read)


@dataclass
class _Scan:
    jobs: list[Job]
    read: int
    #: Where the time ran out (the next page starts below it), or None: it did not.
    stopped: str | None


def _scan(
    app: App,
    where: JobFilter,
    before: str | None,
    *,
    want: int,
    accept: Callable[[Job], bool] | None,
    budget: Budget,
) -> _Scan:
    """Up to ``want`` jobs of ``where`` (and ``accept``), newest first below ``before``, read
    window by window down the id order (``budget.window`` ids each, so a filter that matches
    little never makes the database walk the whole table in one statement) until
    ``budget.scan_seconds`` is spent on the app's clock."""
    driver = inspection(app.driver)
    clock = app.clock
    deadline = clock.monotonic() + budget.scan_seconds
    hits: list[Job] = []
    read = 0
    cursor = before
    while True:
        floor = driver.job_id_below(cursor, budget.window - 1)  # the window's oldest id
        window = replace(where, min_id=floor)
        inner = cursor
        while True:
            batch = driver.job_list(
                window, limit=_SCAN_BATCH if accept else want - len(hits), before_id=inner
            )
            read += len(batch)
            for job in batch:
                inner = job.id
                if accept is None or accept(job):
                    hits.append(job)
                    if len(hits) == want:
                        return _Scan(hits, read, None)
            if accept is None or len(batch) < _SCAN_BATCH:
                break
            if clock.monotonic() >= deadline:
                return _Scan(hits, read, inner)
        if floor is None:
            return _Scan(hits, read, None)
        cursor = floor
        if clock.monotonic() >= deadline:
            return _Scan(hits, read, cursor)


def bulk_ids(
    app: App, filters: Filters, action: str, budget: Budget = DEFAULT_BUDGET
) -> tuple[list[str], bool]:
    """The ids "all that match" covers: dead or cancelled jobs of the filter, newest first, at
    most ``budget.bulk_limit`` or what ``budget.scan_seconds`` finds; and whether more may
    match."""
    if filters.text:
        raise ConfigurationError(
            "an action on all that match cannot use a text search (it reads a bounded window)",
            fix="clear the text field, or use the Retry and Discard buttons of single jobs",
        )
    states = {_STATES[filters.state]} if filters.state else {JobState.DEAD, JobState.CANCELLED}
    if not states <= {JobState.DEAD, JobState.CANCELLED}:
        raise ConfigurationError(
            f"only dead or cancelled jobs can be {'retried' if action == 'retry' else 'discarded'},"
            f" and the filter is {filters.state}",
            fix="filter on state dead (or cancelled)",
        )
    where = replace(filters.job_filter(), states=frozenset(states))
    most = budget.bulk_limit
    scan = _scan(app, where, None, want=most, accept=None, budget=budget)
    return [j.id for j in scan.jobs], scan.stopped is not None or len(scan.jobs) == most


# -- overview ----------------------------------------------------------------------------------


@dataclass
class QueueRow:
    name: str
    paused: bool | None = None  # None: not shown (a tenant's view)
    counts: dict[str, int] = field(default_factory=dict)
    oldest_ready_age: timedelta | None = None
    #: Jobs that ended in each minute of the last hour, oldest minute first.
    completed: list[int] = field(default_factory=lambda: [0] * 60)
    dead: list[int] = field(default_factory=lambda: [0] * 60)


@dataclass
class Overview:
    now: datetime
    starts: list[datetime]
    queues: list[QueueRow]
    completed: list[int]
    dead: list[int]
    workers: list[WorkerRow] | None  # None: not shown (a tenant's view)
    paused: list[str] = field(default_factory=list)


def queue_rows(app: App, tenant: str | None) -> dict[str, QueueRow]:
    """Each queue's counts by state, pause flag and oldest ready job (a tenant's view: that
    tenant's counts only, the shared flags left out)."""
    driver = inspection(app.driver)
    now = app.clock.now()
    per_queue: dict[str, QueueRow] = {}

    def row(name: str) -> QueueRow:
        if name not in per_queue:
            per_queue[name] = QueueRow(name)
        return per_queue[name]

    if tenant is None:
        for info in driver.queue_list():
            r = row(info.name)
            r.paused = info.paused
            r.counts = {s.value: n for s, n in info.counts.items() if n}
            if info.oldest_ready_at is not None:
                r.oldest_ready_age = max(timedelta(0), now - info.oldest_ready_at)
    else:
        for (name, state), n in driver.job_count(JobFilter(tenant_id=tenant)).items():
            if n:
                row(name).counts[state.value] = n
    return per_queue


def overview(app: App, tenant: str | None) -> Overview:
    now = app.clock.now()
    # Whole minutes, so a refresh a few seconds later draws the same buckets.
    end = now.replace(second=0, microsecond=0) + MINUTE
    since = end - HOUR
    starts = [since + i * MINUTE for i in range(60)]
    per_queue = queue_rows(app, tenant)
    completed, dead = [0] * 60, [0] * 60
    for c in inspection(app.driver).job_finished_counts(since, MINUTE, tenant_id=tenant):
        k = int((c.start - since) / MINUTE)
        if not 0 <= k < 60:
            continue
        r = per_queue.setdefault(c.queue, QueueRow(c.queue))
        if c.state is JobState.COMPLETED:
            r.completed[k] += c.count
            completed[k] += c.count
        elif c.state is JobState.DEAD:
            r.dead[k] += c.count
            dead[k] += c.count
    live = workers(app) if tenant is None else None
    queues = [per_queue[name] for name in sorted(per_queue)]
    return Overview(
        now=now,
        starts=starts,
        queues=queues,
        completed=completed,
        dead=dead,
        workers=live,
        paused=[q.name for q in queues if q.paused],
    )


# -- workers -----------------------------------------------------------------------------------


@dataclass
class WorkerRow:
    info: WorkerInfo
    running: list[Job]


#: The most running jobs the workers page reads (a worker runs at most its concurrency).
RUNNING_LIMIT = 2_000


def workers(app: App) -> list[WorkerRow]:
    """Live workers with the jobs each runs."""
    reads = inspection(app.driver)
    infos = reads.worker_list()
    running = reads.job_list_running(limit=RUNNING_LIMIT)
    by_worker: dict[str, list[Job]] = {}
    for job in running:
        if job.worker_id is not None:
            by_worker.setdefault(job.worker_id, []).append(job)
    return [WorkerRow(info, by_worker.get(info.id, [])) for info in infos]


# -- one job -----------------------------------------------------------------------------------


@dataclass
class PlannedAttempt:
    attempt: int
    wait: timedelta | None  # after the previous attempt fails; None: the next run itself
    earliest: datetime


@dataclass
class JobDetail:
    job: Job
    input_text: str
    input_error: str | None
    registered: bool
    policy: Retry | None
    next_run: datetime | None
    plan: list[PlannedAttempt]
    worker: WorkerInfo | None  # the worker that runs it, while its row is live


def job_detail(app: App, job: Job) -> JobDetail:
    try:
        decoded = app.decode_input(job)
        input_text = json.dumps(decoded, indent=2, ensure_ascii=False, sort_keys=True)
        input_error = None
    except JobsError as exc:
        input_text, input_error = job.input, exc.cause
    handle = app.registry.jobs.get(job.name)
    policy = handle.retry if handle is not None else None
    waiting = job.state in (JobState.SCHEDULED, JobState.AVAILABLE)
    next_run = job.run_at if waiting else None
    plan: list[PlannedAttempt] = []
    if policy is not None and waiting:
        at = job.run_at
        plan.append(PlannedAttempt(job.attempt + 1, None, at))
        for attempt in range(job.attempt + 1, job.max_attempts):
            # Jitter off: the longest wait the policy allows (jitter waits half to all of it).
            wait = backoff_delay(policy, attempt, random=lambda: 1.0)
            at = at + wait
            plan.append(PlannedAttempt(attempt + 1, wait, at))
    worker = None
    if job.worker_id is not None and job.state is JobState.RUNNING:
        worker = next(
            (w for w in inspection(app.driver).worker_list() if w.id == job.worker_id), None
        )
    return JobDetail(
        job, input_text, input_error, handle is not None, policy, next_run, plan, worker
    )


# -- cron --------------------------------------------------------------------------------------


@dataclass
class CronRow:
    name: str
    cron: str
    tz: str
    explain: str
    catch_up: str
    next_runs: list[tuple[datetime, datetime]]  # (in the zone, in UTC)
    last_fired_at: datetime | None
    first_seen_at: datetime | None


def cron_rows(app: App, count: int = 5) -> list[CronRow]:
    tasks = app.registry.tasks
    state = inspection(app.driver).schedule_read(sorted(tasks))
    now = app.clock.now()
    rows = []
    for name, t in sorted(tasks.items()):
        zone = ZoneInfo(t.tz)
        runs = [(r.astimezone(zone), r.astimezone(UTC)) for r in t.next_runs(now, count)]
        s = state.get(name)
        rows.append(
            CronRow(
                name,
                t.cron,
                t.tz,
                t.explain(),
                t.catch_up,
                runs,
                s.last_fired_at if s else None,
                s.first_seen_at if s else None,
            )
        )
    return rows
