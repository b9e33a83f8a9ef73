"""Cron schedules, leadership, the database's clock and the workers' presence rows on
PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from ultimat3.jobs.drivers.postgres.connections import _utc
from ultimat3.jobs.drivers.postgres.reads import Reads
from ultimat3.jobs.records import (
    Fire,
    InsertResult,
    Leadership,
    Rewind,
    ScheduleState,
    WorkerInfo,
)


class Schedules(Reads):
    """Schedules, leaders and live workers."""

    def schedule_read(self, tasks: Sequence[str]) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        rows = self._fetch("schedule_read", {"tasks": sorted(set(tasks))})
        return {
            task: ScheduleState(task, _utc(first), _utc(last) if last is not None else None)
            for task, first, last in rows
        }

    def schedule_state(
        self, tasks: Sequence[str], *, now: datetime | None = None
    ) -> dict[str, ScheduleState]:
        if not tasks:
            return {}
        params = {"tasks": sorted(set(tasks)), "now": now}
        with self._connection() as conn:
            self._exec(conn, self._q["schedule_register"], params, bounded=True)
            rows = self._exec(conn, self._q["schedule_read"], params, bounded=True).fetchall()
        found = {
            task: ScheduleState(task, _utc(first), _utc(last) if last is not None else None)
            for task, first, last in rows
        }
        return {task: found[task] for task in tasks}

    def schedule_fire(
        self, fire: Fire, *, now: datetime | None = None
    ) -> list[InsertResult] | None:
        jobs = fire.jobs
        params = {"task": fire.task, "occurrence": fire.occurrence, "now": now}
        with self._connection() as conn, conn.transaction():
            self._bound(conn)
            advanced = self._exec(conn, self._q["schedule_advance"], params).fetchall()
            if not advanced:
                return None
            results = self._insert(conn, jobs, now, bounded=False) if jobs else []
        self._woke(jobs)
        return results

    def schedule_rewind(self, rewind: Rewind) -> bool:
        params = {"task": rewind.task, "was": rewind.was, "to": rewind.to}
        return bool(self._fetch("schedule_rewind", params))

    def database_now(self, *, now: datetime | None = None) -> datetime:
        if now is not None:
            return _utc(now)
        return _utc(self._fetch("database_now", {})[0][0])

    def leader_elect(self, lead: Leadership, *, now: datetime | None = None) -> bool:
        params = {"name": lead.name, "holder": lead.holder, "ttl": lead.ttl, "now": now}
        return bool(self._fetch("leader_elect", params))

    def leader_resign(self, lead: Leadership) -> None:
        params = {"name": lead.name, "holder": lead.holder}
        with self._connection() as conn:
            self._exec(conn, self._q["leader_resign"], params, bounded=True)

    def worker_beat(self, worker: WorkerInfo, *, now: datetime | None = None) -> None:
        params = {
            "id": worker.id,
            "host": worker.host,
            "pid": worker.pid,
            "queues": list(worker.queues),
            "concurrency": worker.concurrency,
            "started_at": worker.started_at,
            "now": now,
            "version": worker.version,
        }
        # On the renewals' connection (a busy pool cannot make a live worker look gone), unless
        # a renewal holds it for long: then pooled.
        query, wait, bounds = self._q["worker_beat"], self._beat_wait, self._beat_bounds
        if self._on_renewer(query, params, rows=False, wait=wait, bounds=bounds) is None:
            self._write_only("worker_beat", params)

    def worker_remove(self, worker_id: str) -> None:
        self._write_only("worker_remove", {"id": worker_id})

    def worker_prune(self, stale_after: timedelta, *, now: datetime | None = None) -> list[str]:
        rows = self._fetch("worker_prune", {"stale": stale_after, "now": now})
        return sorted(row[0] for row in rows)
