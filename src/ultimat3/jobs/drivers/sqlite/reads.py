"""Reading rows back: a job row as a ``Job``, and the operator reads (job lists and counts,
queues, finished buckets, live workers) as plain functions taking the connection, run by the
driver in a read (``SqliteDriver._read``). They write nothing."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs.dialects.sqlite import dt as _dt
from ultimat3.jobs.dialects.sqlite import snapshot
from ultimat3.jobs.records import (
    AttemptError,
    FinishedCount,
    Job,
    JobFilter,
    JobState,
    QueueInfo,
    ScheduleState,
    WorkerInfo,
    job_from_row,
)
from ultimat3.jobs.sql import queries

_Q = queries("sqlite")
STATES = {state.value: state for state in JobState}


def _errors(text: str) -> tuple[AttemptError, ...]:
    if text == "[]":
        return ()
    return tuple(AttemptError.from_json(item) for item in json.loads(text))


def job(row: Sequence[Any]) -> Job:
    return job_from_row(row, to_time=_dt, to_errors=_errors)


def _oldest_ready(conn: sqlite3.Connection, now_us: int) -> list[tuple[str, int | None]]:
    """Per queue with a waiting job, the run_at of its oldest job due by ``now_us`` (None:
    none is due): a walk of the claim index's (queue, priority) groups, a seek a step, and the
    due limited jobs (rows of both kinds for a queue that has both)."""
    found: list[tuple[str, int | None]] = list(
        conn.execute(_Q["queue_oldest_limited"], {"now": now_us}).fetchall()
    )
    after = ""
    while True:
        row = conn.execute(_Q["queue_first"], {"after": after}).fetchone()
        if row is None or row[0] is None:
            return found
        queue, priority = row
        oldest: int | None = None
        while priority is not None:
            args = {"queue": queue, "priority": priority}
            first = conn.execute(_Q["queue_group_first_run_at"], args).fetchone()[0]
            if first is not None and first <= now_us and (oldest is None or first < oldest):
                oldest = first
            priority = conn.execute(_Q["queue_next_priority"], args).fetchone()[0]
        found.append((queue, oldest))
        after = queue


def _filter_args(where: JobFilter) -> dict[str, Any]:
    return {
        "states": None if where.states is None else json.dumps(sorted(where.states)),
        "queue": where.queue,
        "name": where.name,
        "tenant_id": where.tenant_id,
        "ids": None if where.ids is None else json.dumps(list(where.ids)),
        "min_id": where.min_id,
    }


def in_order(requested: Sequence[str], changed: set[str]) -> list[str]:
    """The ``changed`` ids in the order first ``requested``."""
    return list(dict.fromkeys(id_ for id_ in requested if id_ in changed))


def jobs(rows: Sequence[Sequence[Any]]) -> list[Job]:
    return [job(row) for row in rows]


def job_list(
    conn: sqlite3.Connection, where: JobFilter, limit: int, before_id: str | None
) -> list[Job]:
    args = {**_filter_args(where), "before_id": before_id, "limit": max(0, limit)}
    return jobs(conn.execute(_Q["job_list"], args).fetchall())


def job_count(conn: sqlite3.Connection, where: JobFilter) -> dict[tuple[str, JobState], int]:
    args = _filter_args(where)
    tenant_only = where.tenant_id is not None and where == JobFilter(tenant_id=where.tenant_id)
    if tenant_only:
        query = _Q["job_count_tenant"]
    elif where.by_queue_and_state:
        query = _Q["job_count_kept"]
        args = {"states": args["states"], "queue": args["queue"]}
    else:
        query = _Q["job_count"]
    rows = conn.execute(query, args).fetchall()
    return {(queue, STATES[state]): count for queue, state, count in rows}


def finished_counts(
    conn: sqlite3.Connection, since_us: int, bucket: timedelta, tenant_id: str | None
) -> list[FinishedCount]:
    step = max(1, bucket // timedelta(microseconds=1))
    args = {"since": since_us, "bucket": step, "tenant_id": tenant_id}
    rows = conn.execute(_Q["job_finished_counts"], args).fetchall()
    return [
        FinishedCount(queue, STATES[state], _dt(since_us + k * step), n)
        for queue, state, k, n in sorted(rows)
    ]


def queue_list(conn: sqlite3.Connection, now_us: int) -> list[QueueInfo]:
    with snapshot(conn):  # one read transaction, so the counts and the pause settings agree
        counts = conn.execute(_Q["queue_counts"]).fetchall()
        settings = conn.execute(_Q["queue_settings"]).fetchall()
        oldest_rows = _oldest_ready(conn, now_us)
    oldest: dict[str, datetime] = {}
    for queue, run_at in oldest_rows:  # unlimited and limited jobs: a queue may have both
        if run_at is not None and (queue not in oldest or _dt(run_at) < oldest[queue]):
            oldest[queue] = _dt(run_at)
    paused = {name: bool(flag) for name, flag in settings}
    per_queue: dict[str, dict[JobState, int]] = {name: {} for name in paused}
    for queue, state, count in counts:
        per_queue.setdefault(queue, {})[STATES[state]] = count
    return [
        QueueInfo(name, paused.get(name, False), per_queue[name], oldest.get(name))
        for name in sorted(per_queue)
    ]


def schedules(rows: Sequence[Sequence[Any]]) -> dict[str, ScheduleState]:
    return {
        task: ScheduleState(task, _dt(first), None if last is None else _dt(last))
        for task, first, last in rows
    }


def worker_list(conn: sqlite3.Connection) -> list[WorkerInfo]:
    rows = conn.execute(_Q["worker_list"]).fetchall()
    return [
        WorkerInfo(
            id_,
            host,
            pid,
            tuple(json.loads(queues)),
            concurrency,
            _dt(started),
            _dt(beat),
            version,
        )
        for id_, host, pid, queues, concurrency, started, beat, version in rows
    ]
