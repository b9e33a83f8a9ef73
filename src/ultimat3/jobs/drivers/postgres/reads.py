"""The operator's reads and actions on PostgreSQL (the command line, the dashboard): jobs,
counts, queues, workers, and retrying, discarding and pruning jobs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs.driver import wait_until_final
from ultimat3.jobs.drivers.postgres.connections import _STATES, _job, _utc
from ultimat3.jobs.drivers.postgres.cycle import Cycles
from ultimat3.jobs.records import (
    FinishedCount,
    Job,
    JobFilter,
    JobState,
    Prune,
    QueueInfo,
    WorkerInfo,
)

#: A queue_list that summed more count deltas than this folds them (see 0005).
_FOLD_AFTER = 5_000


class Reads(Cycles):
    """What an operator reads and does."""

    def job_get(self, job_id: str, *, tenant_id: str | None = None) -> Job | None:
        rows = self._fetch("job_get", {"id": job_id, "tenant_id": tenant_id})
        return _job(rows[0]) if rows else None

    def job_wait(self, job_id: str, *, timeout: float, tenant_id: str | None = None) -> Job | None:
        """With LISTEN: marks the job awaited, then is woken by the NOTIFY of its end
        (``listen.Finished``; only awaited jobs notify). Without: one read every ``poll``."""
        listening = self._listening()
        mark = self._finished.mark()
        if listening:  # its end notifies from now on (see job_await)
            self._fetch(
                "job_await", {"id": job_id, "tenant_id": tenant_id, "channel": self._channel}
            )

        def wait(remaining: float) -> None:
            nonlocal mark
            if listening:
                mark = self._finished.wait((job_id,), remaining, mark)
            else:
                self._clock.sleep(min(remaining, self._poll))

        return wait_until_final(
            lambda: self.job_get(job_id, tenant_id=tenant_id),
            wait,
            timeout=timeout,
            clock=self._clock,
            closed=lambda: self._closed,
        )

    def job_list(
        self, where: JobFilter, *, limit: int = 100, before_id: str | None = None
    ) -> list[Job]:
        if limit <= 0:
            return []
        params = {**_filter_params(where), "limit": limit, "before_id": before_id}
        return [_job(row) for row in self._fetch("job_list", params, prepare=False)]

    def job_id_below(self, before_id: str | None, offset: int) -> str | None:
        if offset < 0:
            return None
        params = {"before_id": before_id, "offset": offset}
        rows = self._fetch("job_id_below", params, prepare=False)
        return str(rows[0][0]) if rows else None

    def job_count(self, where: JobFilter) -> dict[tuple[str, JobState], int]:
        params = _filter_params(where)
        if where.by_queue_and_state:
            kept = {"states": params["states"], "queue": params["queue"]}
            rows = self._fetch("job_count_kept", kept, prepare=False)
        else:
            rows = self._fetch("job_count", params, prepare=False)
        return {(queue, _STATES[state]): count for queue, state, count in rows}

    def job_retry(
        self, ids: Sequence[str], *, tenant_id: str | None = None, now: datetime | None = None
    ) -> list[str]:
        if not ids:
            return []
        rows = self._fetch(
            "job_retry",
            {"ids": list(ids), "tenant_id": tenant_id, "now": now, "channel": self._channel},
        )
        changed = {row[0] for row in rows}
        return [job_id for job_id in dict.fromkeys(ids) if job_id in changed]

    def job_discard(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        if not ids:
            return []
        rows = self._fetch("job_discard", {"ids": list(ids), "tenant_id": tenant_id})
        deleted = {row[0] for row in rows}
        return [job_id for job_id in dict.fromkeys(ids) if job_id in deleted]

    def job_finished_counts(
        self, since: datetime, bucket: timedelta, *, tenant_id: str | None = None
    ) -> list[FinishedCount]:
        step = bucket.total_seconds()
        params = {"since": since, "bucket": step, "tenant_id": tenant_id}
        rows = self._fetch("job_finished_counts", params, prepare=False)
        return [
            FinishedCount(queue, _STATES[state], _utc(since) + k * bucket, n)
            for queue, state, k, n in sorted(rows)
        ]

    def job_prune(self, prune: Prune) -> int:
        if prune.empty:
            return 0
        final = sorted(state.value for state in prune.states)
        params = {"states": final, "before": prune.finished_before, "limit": prune.limit}
        with self._connection() as conn:
            # The maintenance node prunes: it folds the count deltas too (see 0005).
            self._exec(conn, self._q["job_counts_fold"], {}, bounded=True)
            return self._exec(conn, self._q["job_prune"], params, bounded=True).rowcount

    def queue_set_paused(self, queue: str, paused: bool) -> None:
        self._fetch("queue_set_paused", {"name": queue, "paused": paused, "channel": self._channel})

    def queue_list(self, *, now: datetime | None = None) -> list[QueueInfo]:
        paused: dict[str, bool] = {}
        counts: dict[str, dict[JobState, int]] = {}
        summed = 0
        rows, oldest_rows = self._pipelined(
            [(self._q["queue_list"], {}), (self._q["queue_oldest_ready"], {"now": now})]
        )
        for queue, is_paused, state, count, deltas in rows:
            paused[queue] = is_paused
            summed += deltas
            per_state = counts.setdefault(queue, {})
            if state is not None:
                per_state[_STATES[state]] = count
        oldest: dict[str, datetime] = {}
        for queue, at in oldest_rows:  # unlimited and limited jobs: a queue may have both
            if at is not None and (queue not in oldest or _utc(at) < oldest[queue]):
                oldest[queue] = _utc(at)
        for queue in oldest:  # a queue whose counts have not been read yet (a race)
            paused.setdefault(queue, False)
            counts.setdefault(queue, {})
        if summed > _FOLD_AFTER:  # no maintenance node has folded the deltas for a while
            self.job_counts_fold()
        return [
            QueueInfo(name, paused[name], counts[name], oldest.get(name)) for name in sorted(paused)
        ]

    def job_counts_fold(self) -> None:
        """Fold the count deltas the triggers append into one row per (queue, state) (the
        maintenance node does it as it prunes; a read that summed many does it too)."""
        with self._connection() as conn:
            self._exec(conn, self._q["job_counts_fold"], {}, bounded=True)

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id_, host, pid, tuple(queues), concurrency, _utc(started), _utc(beat), version
            )
            for id_, host, pid, queues, concurrency, started, beat, version in self._fetch(
                "worker_list", {}
            )
        ]


def _filter_params(where: JobFilter) -> dict[str, Any]:
    return {
        "states": sorted(s.value for s in where.states) if where.states is not None else None,
        "queue": where.queue,
        "name": where.name,
        "tenant_id": where.tenant_id,
        "ids": list(where.ids) if where.ids is not None else None,
        "min_id": where.min_id,
    }
