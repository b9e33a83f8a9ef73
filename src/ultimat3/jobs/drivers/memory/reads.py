"""The memory driver's store and the operator's reads of it (``driver.Inspection``).

``Store`` holds every row in dicts behind one lock; ``MemoryDriver`` (the package) adds the
job-processing seam on top. Each read copies what it returns under the lock."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from ultimat3.jobs.clock import Clock, SystemClock
from ultimat3.jobs.drivers.memory.rows import Flow, matches, usage
from ultimat3.jobs.records import (
    FINAL_STATES,
    FinishedCount,
    FlowState,
    Job,
    JobFilter,
    JobState,
    QueueInfo,
    ScheduleState,
    WorkerInfo,
    aware,
)

Key = tuple[str | None, str]


class Store:
    """Jobs, queues, schedules, leaders and workers in dicts behind one lock, on one clock:
    ``now=None`` reads ``clock`` (the host's by default), as a database reads its own."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._generation = 0  # bumped on every change a waiter cares about
        #: Per thread, the generation its last claim or wait saw (``seen``): its next wait
        #: returns for any change since, even one made before that wait began.
        self._counts = threading.local()
        self._jobs: dict[str, Job] = {}
        self._keys: dict[Key, str] = {}  # (tenant_id, idempotency_key) -> id
        self._paused: dict[str, bool] = {}
        self._schedules: dict[str, ScheduleState] = {}
        self._leaders: dict[str, tuple[str, datetime]] = {}  # name -> (holder, expires_at)
        self._workers: dict[str, WorkerInfo] = {}
        self._isolated: set[str] = set()  # ids of jobs rescued after their worker died
        self._limits: dict[str, Flow] = {}  # the jobs with a limit
        self._uniques: dict[str, tuple[str, int]] = {}  # id -> (unique_key, unique_states)
        self._after = ""  # limited claims: the last key taken (keys take turns after it)

    def _at(self, now: datetime | None) -> datetime:
        """``now`` in UTC (refusing a naive one), or the clock's time when None."""
        return self._clock.now() if now is None else aware(now)

    def job_list(
        self, where: JobFilter, *, limit: int = 100, before_id: str | None = None
    ) -> list[Job]:
        with self._lock:
            found = [
                job
                for job in self._jobs.values()
                if matches(job, where) and (before_id is None or job.id < before_id)
            ]
        found.sort(key=lambda job: job.id, reverse=True)
        return found[: max(0, limit)]

    def job_id_below(self, before_id: str | None, offset: int) -> str | None:
        with self._lock:
            ids = sorted(
                (i for i in self._jobs if before_id is None or i < before_id), reverse=True
            )
        return ids[offset] if 0 <= offset < len(ids) else None

    def job_count(self, where: JobFilter) -> dict[tuple[str, JobState], int]:
        with self._lock:
            counts = Counter(
                (job.queue, job.state) for job in self._jobs.values() if matches(job, where)
            )
        return dict(counts)

    def job_finished_counts(
        self, since: datetime, bucket: timedelta, *, tenant_id: str | None = None
    ) -> list[FinishedCount]:
        since = aware(since)
        with self._lock:
            counts = Counter(
                (job.queue, job.state, (job.finished_at - since) // bucket)
                for job in self._jobs.values()
                if job.finished_at is not None
                and job.finished_at >= since
                and job.state in FINAL_STATES
                and (tenant_id is None or job.tenant_id == tenant_id)
            )
        return [
            FinishedCount(queue, state, since + k * bucket, n)
            for (queue, state, k), n in sorted(counts.items())
        ]

    def job_list_running(self, *, limit: int) -> list[Job]:
        with self._lock:
            running = [job for job in self._jobs.values() if job.state is JobState.RUNNING]
        # A running job always holds a lease (the records' invariant).
        running.sort(
            key=lambda job: (job.lease_expires_at or datetime.min.replace(tzinfo=UTC), job.id)
        )
        return running[: max(0, limit)]

    def job_flow(self, job_id: str, *, now: datetime | None = None) -> FlowState | None:
        at = self._at(now)
        with self._lock:
            flow = self._limits.get(job_id)
            if flow is None or job_id not in self._jobs:
                return None
            running, started = usage(self._jobs.values(), self._limits, {flow.key}, at)
        window = at - flow.rate_period
        starts = [t for t in started.get(flow.key, ()) if t > window] if flow.rate_max else []
        return FlowState(
            flow.key,
            flow.most,
            running[flow.key],
            flow.rate_max,
            flow.rate_period,
            len(starts),
            min(starts, default=None),
        )

    def queue_list(self, *, now: datetime | None = None) -> list[QueueInfo]:
        at = self._at(now)
        with self._lock:
            counts: dict[str, Counter[JobState]] = {name: Counter() for name in self._paused}
            oldest: dict[str, datetime] = {}
            for job in self._jobs.values():
                counts.setdefault(job.queue, Counter())[job.state] += 1
                due = job.state in (JobState.SCHEDULED, JobState.AVAILABLE) and job.run_at <= at
                if due and (job.queue not in oldest or job.run_at < oldest[job.queue]):
                    oldest[job.queue] = job.run_at
            return [
                QueueInfo(name, self._paused.get(name, False), dict(counts[name]), oldest.get(name))
                for name in sorted(counts)
            ]

    def worker_list(self) -> list[WorkerInfo]:
        with self._lock:
            return [self._workers[worker_id] for worker_id in sorted(self._workers)]

    def schedule_read(self, tasks: Sequence[str]) -> dict[str, ScheduleState]:
        with self._lock:
            return {task: self._schedules[task] for task in tasks if task in self._schedules}
