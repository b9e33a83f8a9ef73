"""Inserting jobs on PostgreSQL: one statement (``job_insert_one``, ``job_insert``) with ON
CONFLICT DO NOTHING and a look-up of the stored ids for the rows that conflicted (an insert
racing one of the same key waits for it, then dedupes onto its row), or COPY for a big batch
that bets no key is stored yet."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs.clock import Backoff
from ultimat3.jobs.dialects.postgres import our_cursor
from ultimat3.jobs.dialects.postgres import refused as _refused
from ultimat3.jobs.driver import Executor
from ultimat3.jobs.drivers.postgres.connections import _MICROSECOND, _NAME, Conn, Row, _json
from ultimat3.jobs.drivers.postgres.waiting import Waiting
from ultimat3.jobs.errors import DriverUnavailableError
from ultimat3.jobs.records import InsertResult, NewJob, ids_of, in_slices

with contextlib.suppress(ImportError):  # the driver names the extra to install
    import psycopg
    from psycopg import errors as pg_errors

#: Jobs per INSERT statement; bigger batches run several statements in one transaction.
_CHUNK = 5000
#: From this many jobs, a batch first tries COPY (see ``_copy``), sent this many rows at a time.
_COPY_FROM = 200
_COPY_SLICE = 500
#: A batch that lost a deadlock waits 0.05-0.1 s, then 0.1-0.2 s, before it runs again.
_DEADLOCK_BACKOFF = Backoff(first=0.1, cap=0.2, jitter=True)


class Inserts(Waiting):
    """``job_insert_many`` and the insert of ``schedule_fire``."""

    def job_insert_many(
        self,
        jobs: Sequence[NewJob],
        *,
        executor: Executor | None = None,
        now: datetime | None = None,
    ) -> list[InsertResult]:
        if not jobs:
            return []
        if executor is not None:
            # In a savepoint of the caller's transaction (``_joined``). A deadlock here is the
            # caller's to handle: their transaction holds other locks.
            with self._joined(executor, jobs) as conn:
                return self._insert(conn, jobs, now, bounded=False)
        wait = 0.0
        for attempt in range(3):
            # A batch that lost a deadlock was rolled back whole: it runs again after a pause
            # that lets the winner take the keys first (at once, the two would deadlock again).
            if attempt:
                wait = _DEADLOCK_BACKOFF.after(wait)
                self._clock.sleep(_DEADLOCK_BACKOFF.pause(wait))
            try:
                with self._connection() as conn:
                    if len(jobs) < _COPY_FROM:
                        # One statement, its own transaction (unless keys conflict).
                        results = self._insert(conn, jobs, now, bounded=True)
                    else:
                        with conn.transaction():
                            self._bound(conn)
                            results = self._insert(conn, jobs, now, bounded=False)
                self._woke(jobs)
                return results
            except DriverUnavailableError as exc:
                if attempt == 2 or not isinstance(exc.__cause__, pg_errors.DeadlockDetected):
                    raise
        raise AssertionError("unreachable")

    def _insert(
        self, conn: Conn, jobs: Sequence[NewJob], now: datetime | None, *, bounded: bool
    ) -> list[InsertResult]:
        """Insert, then resolve the rows that conflicted to the stored ids. A conflicting row
        can vanish before the look-up (pruned, or its transaction rolled back): insert again.
        ``bounded``: each statement is its own transaction of ours (autocommit), so each
        carries the timeouts; otherwise a transaction is open (ours, bounded at its start, or
        the caller's) and nothing is set."""
        if len(jobs) >= _COPY_FROM and not bounded:
            copied = self._copy(conn, jobs, now)
            if copied is not None:
                return copied
        results: list[InsertResult | None] = [None] * len(jobs)
        pending: Sequence[int] = range(len(jobs))
        for _ in range(5):
            fresh: set[str] = set()
            for start in range(0, len(pending), _CHUNK):
                batch = [jobs[i] for i in pending[start : start + _CHUNK]]
                fresh.update(
                    {row[0] for row in self._execute_insert(conn, batch, now, bounded=bounded)}
                )
            conflicted: list[int] = []
            for i in pending:
                job_id = jobs[i].id
                if job_id in fresh:
                    fresh.discard(job_id)  # a second copy of one id in the batch is a dupe
                    results[i] = InsertResult(job_id, deduped=False)
                else:
                    conflicted.append(i)
            if not conflicted:
                break
            stored = self._ids_by_key(conn, [jobs[i] for i in conflicted], bounded=bounded)
            again: list[int] = []
            for at, i in enumerate(conflicted):
                found = stored.get(at)
                if found is None:
                    again.append(i)
                else:
                    results[i] = InsertResult(found, deduped=True)
            for i in [i for i in again if jobs[i].unique_key is not None]:
                holder = self._unique_holder(conn, jobs[i], now, bounded=bounded)
                if holder is not None:
                    again.remove(i)
                    results[i] = InsertResult(holder, deduped=True)
            if not again:
                break
            pending = again
        done = [result for result in results if result is not None]
        if len(done) < len(results):
            raise DriverUnavailableError(
                "inserted jobs kept conflicting with rows that vanished before they could be read",
                driver=_NAME,
                fix="retry the enqueue; if it persists, a pruner is deleting fresh rows",
            )
        return done

    def _copy(
        self, conn: Conn, jobs: Sequence[NewJob], now: datetime | None
    ) -> list[InsertResult] | None:
        """A big batch by COPY, in a savepoint of the open transaction, betting that no key is
        stored yet. A key repeated in the batch, a job COPY cannot carry (``_copyable``), a
        row that conflicts, or a caller's connection in pipeline mode (where psycopg refuses
        COPY) returns None having written nothing: the caller then takes the ON CONFLICT path,
        which dedupes. An input refused rolls the savepoint back and raises."""
        if conn.pgconn.pipeline_status:  # PipelineStatus.OFF is 0
            return None
        rest = in_slices(jobs, _COPY_SLICE)
        head = next(rest)
        if not _copyable(head[0]):
            return None  # the usual case of a batch COPY cannot take: say so before any I/O
        slices = itertools.chain((head,), rest)
        row = self._exec(conn, self._q["clock"], {"now": now}).fetchone()
        assert row is not None
        at: datetime = row[0]
        due: set[str] = set()
        keys: set[tuple[str | None, str]] = set()
        # The times as text, each written once for the batch (its jobs share them): psycopg
        # would dump each datetime of each row again, which costs more than the rest of it.
        times: dict[datetime, str] = {}
        created = _time_text(at)
        try:
            with conn.transaction(), our_cursor(conn) as cur, cur.copy(self._q["job_copy"]) as copy:
                # psycopg sends the rows as its buffer fills: the server works meanwhile.
                for batch in slices:
                    for j in batch:
                        key = (j.tenant_id, j.idempotency_key)
                        if key in keys or not _copyable(j):
                            raise _NotCopyable
                        keys.add(key)
                        run_at = j.run_at or at + (j.delay or _ZERO)
                        state = "available" if run_at <= at else "scheduled"
                        if run_at <= at:
                            due.add(j.queue)
                        run_text = times.get(run_at)
                        if run_text is None:
                            run_text = times[run_at] = _time_text(run_at)
                        copy.write_row(
                            (j.id, j.name, j.queue, j.input, j.tenant_id, j.idempotency_key,
                             j.priority, state, j.max_attempts, run_text, created)
                        )  # fmt: skip
        except (_NotCopyable, pg_errors.UniqueViolation):
            return None
        except psycopg.DataError as exc:
            raise _refused(exc) from None
        if due:
            self._exec(
                conn,
                self._q["notify_queues"],
                {"channel": self._channel, "queues": sorted(due)},
            )
        return [InsertResult(job_id, False) for job_id in ids_of(jobs)]

    def _execute_insert(
        self, conn: Conn, jobs: Sequence[NewJob], now: datetime | None, *, bounded: bool
    ) -> list[Row]:
        query: bytes
        params: dict[str, Any]
        if len(jobs) > 1 and any(j.unique_key is not None for j in jobs):
            # One by one: each unique key is resolved by its own statement.
            return [
                row for j in jobs for row in self._execute_insert(conn, [j], now, bounded=bounded)
            ]
        if len(jobs) == 1:
            [j] = jobs
            query = self._q["job_insert_one"]
            params = {
                "id": j.id,
                "name": j.name,
                "queue": j.queue,
                "input": j.input,
                "tenant_id": j.tenant_id,
                "key": j.idempotency_key,
                "priority": j.priority,
                "max_attempts": j.max_attempts,
                "trace_context": j.trace_context,
                "channel": self._channel,
                "run_at": j.run_at,
                "delay": j.delay,
                "now": now,
                "limit_key": j.limit_key,
                "limit_max": j.limit_max,
                "rate_max": j.rate_max,
                "rate_period": j.rate_period // _MICROSECOND,
                "unique_key": j.unique_key,
                "unique_states": j.unique_states,
            }
        else:
            rows = [
                [
                    j.id,
                    j.name,
                    j.queue,
                    j.input,
                    j.tenant_id,
                    j.idempotency_key,
                    j.priority,
                    j.max_attempts,
                    j.run_at.isoformat() if j.run_at is not None else None,
                    None if j.delay is None else f"{j.delay // _MICROSECOND} microseconds",
                    j.trace_context,
                    j.limit_key,
                    j.limit_max,
                    j.rate_max,
                    j.rate_period // _MICROSECOND,
                ]
                for j in jobs
            ]
            query = self._q["job_insert"]
            params = {"rows": _json(rows), "now": now, "channel": self._channel}
        try:
            return self._exec(conn, query, params, bounded=bounded).fetchall()
        except psycopg.DataError as exc:
            raise _refused(exc) from None

    def _unique_holder(
        self, conn: Conn, job: NewJob, now: datetime | None, *, bounded: bool
    ) -> str | None:
        """The job holding ``job``'s unique key, debounced to ``job`` first when it asks to
        replace (see ``job_debounce``); None when the key is free again (insert once more)."""
        row = self._exec(
            conn, self._q["job_unique_holder"], {"key": job.unique_key}, bounded=bounded
        ).fetchone()
        if row is None:
            return None
        holder: str = row[0]
        if job.unique_replace:
            params = {
                "id": holder,
                "input": job.input,
                "priority": job.priority,
                "run_at": job.run_at,
                "delay": job.delay,
                "now": now,
                "channel": self._channel,
            }
            self._exec(conn, self._q["job_debounce"], params, bounded=bounded)
        return holder

    def _ids_by_key(self, conn: Conn, jobs: Sequence[NewJob], *, bounded: bool) -> dict[int, str]:
        """The stored job each of ``jobs`` (which inserted nothing) duplicates, by position:
        the holder of its key, or the row of its id stored under that same key (a keyless
        job's key is its id). A row holding its id under another key is an error."""
        rows = self._exec(
            conn,
            self._q["job_ids_by_key"],
            {"keys": _json([{"t": j.tenant_id, "k": j.idempotency_key, "i": j.id} for j in jobs])},
            bounded=bounded,
        ).fetchall()
        found: dict[int, str] = {}
        for ord_, id_, key in sorted(rows, key=lambda row: row[2] is not None):
            at = ord_ - 1
            if key is None:  # the holder of a caller's key comes first
                found[at] = id_
            elif key == jobs[at].idempotency_key:
                found.setdefault(at, id_)
            elif at not in found:
                # In a caller's transaction, ``_joined`` rolls back to its savepoint.
                raise ValueError(f"job id {id_} is already stored under another key")
        return found


def _time_text(moment: datetime) -> str:
    """``moment`` (aware) as the text of a ``timestamptz``: ISO 8601 with its offset, as
    psycopg's own text dumper writes it."""
    return moment.isoformat()


def _copyable(job: NewJob) -> bool:
    """Whether COPY can store ``job``: no limit, no uniqueness key, no trace context."""
    return job.limit_key is None and job.unique_key is None and job.trace_context is None


class _NotCopyable(Exception):
    """A batch that COPY cannot store as it is (see ``PostgresDriver._copy``)."""


_ZERO = timedelta(0)
