"""Inserting jobs, inside a write transaction the driver opened (its own, or the caller's
savepoint): one row, an ``executemany`` of rows, or the jobs of one ``enqueue_many`` as JSON
arrays (``job_insert_batch``); a batch refused in part goes again row by row, so each job
learns whether it was stored or deduplicated, and by which key. The kept counts
(``x_job_counts``) follow in the same transaction."""

from __future__ import annotations

import json
import operator
import sqlite3
from collections.abc import Sequence
from typing import Any

from ultimat3.jobs.dialects.sqlite import MICROSECOND, savepoint
from ultimat3.jobs.dialects.sqlite import us as _us
from ultimat3.jobs.errors import DriverUnavailableError
from ultimat3.jobs.records import InsertResult, NewJob, ids_of
from ultimat3.jobs.sql import queries

_Q = queries("sqlite")
_INSERT = _Q["job_insert"]
_INSERT_BATCH = _Q["job_insert_batch"]
_COUNTS_ADD = _Q["job_counts_add"]


class Redo(Exception):
    """A batch that did not go as one: rolled back (``savepoint``), to be done row by row."""


def job_row(job: NewJob, now_us: int) -> tuple[Any, ...]:
    """``job`` as the values of ``job_insert``, in its order."""
    if job.run_at is not None:
        run_at = _us(job.run_at)
    elif job.delay is not None:
        run_at = now_us + job.delay // MICROSECOND
    else:
        run_at = now_us
    return (
        job.id,
        job.tenant_id,
        job.name,
        job.queue,
        job.input,
        job.idempotency_key,
        job.priority,
        "scheduled" if run_at > now_us else "available",
        job.max_attempts,
        run_at,
        now_us,
        job.trace_context,
        job.limit_key,
        job.limit_max,
        job.rate_max,
        job.rate_period // MICROSECOND,
    )


def insert(
    conn: sqlite3.Connection,
    jobs: Sequence[NewJob],
    now_us: int,
    rows: list[tuple[Any, ...]] | None,
    batches: list[dict[str, Any]] | None,
) -> list[InsertResult]:
    """Insert ``jobs``: as ``batches`` (``batches``) when given, else as their ``rows``
    (made from the jobs when None) in one ``executemany``, else, when some key is taken,
    row by row to learn which."""
    if len(jobs) > 1 and (batches is not None or not any(j.unique_key is not None for j in jobs)):
        try:
            with savepoint(conn):
                if batches is not None:
                    inserted = sum(conn.execute(_INSERT_BATCH, b).rowcount for b in batches)
                    counted = [(batches[0]["queue"], batches[0]["state"], len(jobs))]
                else:
                    assert rows is not None
                    inserted = conn.executemany(_INSERT, rows).rowcount
                    counted = _counted(rows)
                if inserted != len(jobs):
                    raise Redo
                conn.executemany(_COUNTS_ADD, counted)
            return [InsertResult(job_id, False) for job_id in ids_of(jobs)]
        except (Redo, sqlite3.IntegrityError):
            # Some keys were already stored or repeat within the batch (an IntegrityError:
            # the row-by-row pass below names the offending job): the batch was rolled back,
            # and goes again row by row to learn which, so a re-published job with its
            # original id still reports deduped=True.
            pass
    if rows is None:
        rows = [job_row(job, now_us) for job in jobs]
    results = [_insert_one(conn, job, row) for job, row in zip(jobs, rows, strict=True)]
    _count_inserted(conn, [row for row, r in zip(rows, results, strict=True) if not r.deduped])
    return results


#: What the jobs of one ``job_insert_batch`` share (``batches``).
_SHARED = operator.attrgetter(
    "tenant_id", "name", "queue", "priority", "max_attempts", "run_at", "delay",
    "limit_max", "rate_max", "rate_period",
)  # fmt: skip
_encode_rows = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), check_circular=False
).encode


def batches(jobs: Sequence[NewJob], now_us: int, batch_text: int) -> list[dict[str, Any]] | None:
    """``jobs`` as the parameters of ``job_insert_batch`` statements (one per
    ``batch_text`` characters of rows), when they share every field it binds once: the jobs of one
    ``enqueue_many``. None when two differ in one of those, or a job has a uniqueness key
    (each is resolved by a statement of its own)."""
    first = jobs[0]
    shared = _SHARED(first)
    rows: list[tuple[Any, ...]] = []
    for job in jobs:
        if job.unique_key is not None or _SHARED(job) != shared:
            return None
        job_id, key = job.id, job.idempotency_key
        if key == job_id and job.trace_context is None and job.limit_key is None:
            rows.append((job_id, job.input))
        else:
            rows.append(
                (job_id, job.input, None if key == job_id else key, job.trace_context,
                 job.limit_key)
            )  # fmt: skip
    chunks: list[list[tuple[Any, ...]]] = []
    chunk: list[tuple[Any, ...]] = []
    size = 0
    for row in rows:  # (id, input, ...)
        chunk.append(row)
        size += len(row[1]) + 100
        if size > batch_text:
            chunks.append(chunk)
            chunk, size = [], 0
    if chunk:
        chunks.append(chunk)
    head = job_row(first, now_us)
    shared_values = {
        "tenant_id": head[1],
        "name": head[2],
        "queue": head[3],
        "priority": head[6],
        "state": head[7],
        "max_attempts": head[8],
        "run_at": head[9],
        "created_at": head[10],
        "limit_max": head[13],
        "rate_max": head[14],
        "rate_period": head[15],
    }
    return [{**shared_values, "rows": _encode_rows(chunk)} for chunk in chunks]


def _count_inserted(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Add the inserted rows to the kept counts (migration 5), in the same transaction."""
    conn.executemany(_COUNTS_ADD, _counted(rows))


def _counted(rows: Sequence[tuple[Any, ...]]) -> list[tuple[str, str, int]]:
    """``job_counts_add``'s values for ``rows`` of ``job_insert``: one per (queue, state)."""
    added: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row[3], row[7])
        added[key] = added.get(key, 0) + 1
    return [(queue, state, n) for (queue, state), n in added.items()]


def _insert_one(conn: sqlite3.Connection, job: NewJob, row: tuple[Any, ...]) -> InsertResult:
    unique = job.unique_key is not None
    try:
        if unique:
            row = (*row, job.unique_key, job.unique_states)
            inserted = conn.execute(_Q["job_insert_unique"], row).rowcount == 1
        else:
            inserted = conn.execute(_INSERT, row).rowcount == 1
    except sqlite3.IntegrityError as exc:
        if "x_jobs.id" in str(exc):
            raise ValueError(f"job id {job.id} is already stored under another key") from exc
        raise DriverUnavailableError(
            f"SQLite refused the row of job {job.name} ({job.id}): {exc}",
            driver="sqlite",
            fix="a constraint or trigger added to the job tables refused it (the library's own "
            "schema refuses none of its rows)",
            retryable=False,
        ) from exc
    if inserted:
        return InsertResult(job.id, False)
    found = None
    if job.idempotency_key != job.id:  # a caller's key (a keyless job's key is its id)
        found = conn.execute(_Q["job_id_by_key"], {"tenant_id": row[1], "key": row[5]}).fetchone()
    if found is None:
        holder = conn.execute(_Q["job_key_by_id"], {"id": job.id}).fetchone()
        if holder is not None:
            if holder[0] != job.idempotency_key:
                raise ValueError(f"job id {job.id} is already stored under another key")
            found = (job.id,)  # this very job, stored before (a re-published one)
    if found is None and unique:
        # The unique key is held (the write lock is ours: the holder cannot move meanwhile).
        found = conn.execute(_Q["job_unique_holder"], {"key": job.unique_key}).fetchone()
        if found is not None and job.unique_replace:
            args = {"id": found[0], "input": row[4], "run_at": row[9], "priority": row[6]}
            conn.execute(_Q["job_debounce"], {**args, "now": row[10]})
    # The write lock is ours: whatever refused the row is still there to be found.
    assert found is not None, f"job {job.id} was refused, yet no stored job holds its key"
    return InsertResult(found[0], True)
