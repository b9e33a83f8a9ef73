"""A worker's turn, inside one write transaction: the fenced completions and failures (each
write matches only the lease it names), then the claim for the handlers free now, which
marks its jobs started. A claim takes the best due jobs of its queues in claim order, and
with limits walks the keys in turns (``limits``): the counts are exact under the write lock
the transaction holds."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs import ids
from ultimat3.jobs.dialects.sqlite import MICROSECOND, savepoint
from ultimat3.jobs.dialects.sqlite import now_us as _now_us
from ultimat3.jobs.drivers.sqlite.insert import Redo
from ultimat3.jobs.drivers.sqlite.reads import job as _job
from ultimat3.jobs.limits import keys_to_look
from ultimat3.jobs.records import ClaimParams, Failure, Job
from ultimat3.jobs.sql import queries

_Q = queries("sqlite")
_CLAIM_QUEUE = _Q["job_claim_queue"]


def _claim_order(job: Job) -> tuple[int, datetime, str]:
    return (-job.priority, job.run_at, job.id)


def failure_rows(failures: Sequence[Failure], now_us: int) -> list[dict[str, Any]]:
    return [
        {
            "retry_at": None
            if failure.retry_in is None
            else now_us + failure.retry_in // MICROSECOND,
            "now": now_us,
            "error": json.dumps(failure.error.to_json()),
            "id": failure.lease.id,
            "token": failure.lease.token,
            "isolated": int(failure.isolate),
            "refund": int(failure.refund),
        }
        for failure in failures
    ]


def apply_each(
    conn: sqlite3.Connection, query: str, rows: Sequence[Any], ids_: list[str]
) -> set[str]:
    """Run a one-row fenced UPDATE per row; return the ids it changed. ``executemany`` does the
    whole batch at once; only when some row matched nothing (a stale lease, a repeated id) is
    the batch redone row by row to learn which."""
    try:
        with savepoint(conn):
            if conn.executemany(query, rows).rowcount != len(rows):
                raise Redo
        return set(ids_)
    except Redo:
        return {
            id_ for id_, row in zip(ids_, rows, strict=True) if conn.execute(query, row).rowcount
        }


def claim(
    conn: sqlite3.Connection, params: ClaimParams, *, after: dict[str, str]
) -> tuple[list[Job], timedelta | None]:
    """Claim for ``params`` in the open transaction, marking the jobs started; and how long
    after its ``now`` a job held back by a rate limit may be claimed. ``after`` holds the
    per-queue key cursor of limited claims, and is advanced."""
    now_us = _now_us(params.now)
    args: dict[str, Any] = {
        "now": now_us,
        "token": params.token or ids.token(),
        "expires_at": now_us + params.lease_for // MICROSECOND,
        "worker_id": params.worker_id,
        "limit": params.limit,
    }
    queues = sorted(set(params.queues))
    wake: list[int] = []
    if len(queues) == 1 and not (params.isolated or params.limited or params.skip):
        args["queue"] = queues[0]
        rows = conn.execute(_CLAIM_QUEUE, args).fetchall()
    else:
        args["isolated"] = int(params.isolated)
        args["skip"] = json.dumps(sorted(params.skip))
        rows = _claim_queues(conn, queues, args, after if params.limited else None, wake)
    jobs = [_job(row) for row in rows]
    jobs.sort(key=_claim_order)
    return jobs, (timedelta(microseconds=min(wake) - now_us) if wake else None)


def _claim_queues(
    conn: sqlite3.Connection,
    queues: list[str],
    args: dict[str, Any],
    after: dict[str, str] | None,
    wake: list[int],
) -> list[Any]:
    """Claim the best of several queues (or of one, with limits: ``after`` is not None; the
    times rate windows reopen go to ``wake``)."""
    # (-priority, rank within its key, the key's turn, run_at, id): with limits, keys take
    # turns within a priority (the unlimited jobs of a queue go first, as one key); without,
    # rank and turn are 0 and this is claim order.
    candidates: list[tuple[int, int, int, int, str]] = []
    for queue in queues:  # a paused queue yields nothing (the queries say so)
        query_args = {
            "queue": queue,
            "now": args["now"],
            "limit": args["limit"],
            "isolated": args["isolated"],
            "skip": args["skip"],
        }
        if after is None:
            rows = conn.execute(_Q["job_claim_candidates"], query_args)
            candidates.extend((-priority, 0, -1, run_at, id_) for id_, priority, run_at in rows)
        else:  # the unlimited ones come with the limited ones, in one statement
            candidates.extend(_limited_candidates(conn, query_args, after, wake))
    if not candidates:
        return []
    candidates.sort()
    chosen = [candidate[-1] for candidate in candidates[: args["limit"]]]
    return conn.execute(_Q["job_claim_ids"], {**args, "ids": json.dumps(chosen)}).fetchall()


def _limited_candidates(
    conn: sqlite3.Connection, args: dict[str, Any], after: dict[str, str], wake: list[int]
) -> list[tuple[int, int, int, int, str]]:
    """The unlimited due jobs of one queue (the claim's first ``limit``), and those that fit
    their key's free slots (``limits``, steps 1 and 2), key by key from the one after the
    queue's cursor (wrapping around once, at most ``keys_to_look(limit)`` keys) until the
    claim's ``limit`` is met; the cursor moves to the last key taken. The keys are read
    lazily, so the walk stops where the claim is full."""
    queue = args["queue"]
    need = args["limit"]
    most_keys = keys_to_look(need)
    start = after.get(queue, "")
    taken: list[str] = []
    looked: list[str] = []
    found: list[tuple[int, int, int, int, str]] = []
    passes = [(start, None)] + ([("", start)] if start else [])
    for begin, upto in passes:
        keys = conn.execute(
            _Q["job_limit_keys"],
            {
                **args,
                "after": begin,
                "upto": upto,
                "keys": most_keys - len(looked),
                "plain": upto is None,  # the first pass also reads the unlimited jobs
            },
        )
        for key, most, running, rate_max, rate_period, starts, oldest, due in keys:
            if key is None:
                found.extend(
                    (-priority, rank, -1, run_at, id_)
                    for rank, (id_, priority, run_at) in enumerate(_by_claim_order(due))
                )
                continue
            looked.append(key)
            free = most - running
            if rate_max:
                if starts >= rate_max and running < most:
                    wake.append(oldest + rate_period)  # when the oldest start leaves the window
                free = min(free, rate_max - starts)
            if free <= 0 or due is None:
                continue
            rows = _by_claim_order(due)[: min(free, need)]
            turn = len(taken)
            found.extend(
                (-priority, rank, turn, run_at, id_)
                for rank, (id_, priority, run_at) in enumerate(rows)
            )
            taken.append(key)
            need -= len(rows)
            if need <= 0:
                break
        keys.close()  # ends the walk where it is
        if need <= 0 or len(looked) >= most_keys:
            break
    if taken:
        after[queue] = taken[-1]  # round-robin: the next claim starts after the last key taken
    elif len(looked) >= most_keys:
        after[queue] = looked[-1]  # past the full keys looked at
    return found


def _by_claim_order(rows: str) -> list[list[Any]]:
    """A JSON array of [id, priority, run_at] (``job_limit_keys``), in claim order."""
    return sorted(json.loads(rows), key=lambda r: (-r[1], r[2], r[0]))
