"""Claims, a worker's cycle (completions, failures and a claim, one statement for the usual
turn: ``job_cycle_queue``), lease renewals and the other writes of a running job's life on
PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs import ids
from ultimat3.jobs.drivers.postgres.connections import _MICROSECOND, Row, _job, _json, _utc
from ultimat3.jobs.drivers.postgres.insert import Inserts
from ultimat3.jobs.limits import keys_to_look
from ultimat3.jobs.records import (
    Cancellation,
    ClaimParams,
    Cycle,
    CycleResult,
    ExpiredQuery,
    Failure,
    FlowState,
    Job,
    Lease,
)


class Cycles(Inserts):
    """Claims and the writes of a running job's life."""

    def _claim_steps(self, params: ClaimParams) -> list[tuple[bytes, dict[str, Any]]]:
        """The claim's statements: one without limits; with them (``params.limited``), the
        planner settings (``job_claim_limited_setup``), the key locks (``job_limit_lock``) then
        the claim (``job_claim_limited``), in one transaction (see ``limits``: the claim's
        snapshot must follow the locks)."""
        if not params.limited:
            return [self._claim_query(params)]
        shared = {
            "queues": sorted(set(params.queues)),
            "now": params.now,
            "isolated": params.isolated,
            "limit": params.limit,
        }
        lock = {
            **shared,
            "after": self._after,
            "keys": keys_to_look(params.limit),
            "lock_class": self._limit_lock_class,
        }
        claim = {
            **shared,
            "lease_for": params.lease_for,
            "worker_id": params.worker_id,
            "token": params.token or ids.token(),
            "skip": sorted(params.skip),
        }
        return [
            (self._q["job_claim_limited_setup"], {}),
            (self._q["job_limit_lock"], lock),
            (self._q["job_claim_limited"], claim),
        ]

    def _advance(self, params: ClaimParams, lock_rows: list[Row]) -> timedelta | None:
        """Move the key cursor where a limited claim says (``job_limit_lock``: after the last
        key it got, round-robin); return how long after the statement's ``now`` a full rate
        window reopens."""
        if not (params.limited and lock_rows):
            return None
        _, cursor, wake_in = lock_rows[0]
        if cursor is not None:
            self._after = cursor
        return wake_in  # type: ignore[no-any-return]

    def _claim_query(
        self, params: ClaimParams, *, relaxed: bool = False
    ) -> tuple[bytes, dict[str, Any]]:
        """The claim statement for ``params`` and its parameters: one queue has its own,
        cheaper statement (``job_claim_queue``). ``relaxed``: the statement is a transaction
        alone, and commits without waiting for the WAL flush (see job_claim in queries.sql)."""
        values: dict[str, Any] = {
            "lease_for": params.lease_for,
            "worker_id": params.worker_id,
            "now": params.now,
            "token": params.token or ids.token(),
            "relaxed": relaxed,
        }
        queues = sorted(set(params.queues))
        if len(queues) == 1 and not (params.isolated or params.skip):
            values["queue"] = queues[0]
            return self._with_limit("job_claim_queue", params.limit), values
        values.update(queues=queues, limit=params.limit, skip=sorted(params.skip))
        return self._q["job_claim_isolated" if params.isolated else "job_claim"], values

    def _with_limit(self, name: str, limit: int) -> bytes:
        """Statement ``name`` with ``limit`` written into its text for ``{limit}`` (see
        job_claim_queue in queries.sql)."""
        return self._q[name].replace(b"{limit}", str(int(limit)).encode())

    def job_cycle(self, cycle: Cycle, *, now: datetime | None = None) -> CycleResult:
        claim = cycle.claims
        if not (cycle.writes or claim is not None):
            return CycleResult()
        self._counts.seen, self._counting = self._wake_seq, True  # before the claim's snapshot
        # One transaction, its statements pipelined: one round trip, each statement with its
        # own (generic, prepared) plan. A turn that only claims skips the WAL flush: the
        # claim of an unlimited job is then one statement, a transaction of its own.
        relaxed = not cycle.writes
        if claim is not None and not claim.limited:
            if relaxed:
                alone = self._fetch(*self._claim_query(claim, relaxed=True))
                return CycleResult(claimed=[_job(row) for row in alone])
            if (
                not cycle.failures
                and len(set(claim.queues)) == 1
                and not (claim.isolated or claim.skip)
            ):
                return self._cycle_queue(cycle, claim, now)
        steps: list[tuple[bytes, dict[str, Any]]] = []
        if relaxed:
            steps.append((self._q["commit_relaxed"], {}))
        if cycle.completes:
            steps.append((self._q["job_complete"], self._complete_params(cycle, now)))
        if cycle.failures:
            steps.append((self._q["job_fail"], self._failure_params(cycle.failures, now)))
        if claim is not None:
            steps.extend(self._claim_steps(claim))
        rows = self._pipelined(steps)
        result = CycleResult()
        wake_in = None
        at = 1 if relaxed else 0
        for changed, present in (
            (result.completed, cycle.completes),
            (result.failed, cycle.failures),
        ):
            if present:
                changed.update(row[0] for row in rows[at])
                at += 1
        if claim is not None:
            if claim.limited:
                wake_in = self._advance(claim, rows[at + 1])
                at += 2
            result.claimed.extend(_job(row) for row in rows[at])
        return replace(result, wake_in=wake_in) if wake_in is not None else result

    def _cycle_queue(self, cycle: Cycle, claim: ClaimParams, now: datetime | None) -> CycleResult:
        """The usual turn, completions and a claim of one queue, as one statement
        (``job_cycle_queue``): in psycopg a pipelined transaction costs the client about as
        much as the server's work, which one statement does not."""
        query = self._with_limit("job_cycle_queue", claim.limit)
        params = self._complete_params(cycle, now)
        params.update(
            queue=claim.queues[0],
            lease_for=claim.lease_for,
            worker_id=claim.worker_id,
            token=claim.token or ids.token(),
        )
        if claim.now is not None:
            params["now"] = claim.now
        rows = self._fetch(query, params)
        result = CycleResult(completed=set(rows[0][-2] or ()) if rows else set())
        result.claimed.extend(_job(row[:-2]) for row in rows if row[0] is not None)
        return result

    def job_release_claim(self, token: str, *, now: datetime | None = None) -> list[str]:
        params = {"token": token, "now": now, "channel": self._channel}
        return sorted(row[0] for row in self._fetch("job_release_claim", params))

    def job_flow(self, job_id: str, *, now: datetime | None = None) -> FlowState | None:
        rows = self._fetch("job_flow", {"id": job_id, "now": now})
        if not rows:
            return None
        key, most, running, rate_max, period, starts, oldest = rows[0]
        return FlowState(
            key,
            most,
            running,
            rate_max,
            period * _MICROSECOND,
            starts,
            None if oldest is None else _utc(oldest),
        )

    def job_peek_isolated(self, queues: Sequence[str], *, now: datetime | None = None) -> bool:
        rows = self._fetch("job_peek_isolated", {"queues": sorted(set(queues)), "now": now})
        return bool(rows and rows[0][0])

    def lease_extend(
        self, leases: Sequence[Lease], lease_for: timedelta, *, now: datetime | None = None
    ) -> set[str]:
        if not leases:
            return set()
        params = {**_lease_arrays(leases), "lease_for": lease_for, "now": now}
        rows = self._on_renewer(self._q["lease_extend"], params)
        assert rows is not None  # it waited for the connection
        return {row[0] for row in rows}

    def _complete_params(self, cycle: Cycle, now: datetime | None) -> dict[str, Any]:
        params: dict[str, Any] = {
            **_lease_arrays(cycle.completes),
            "now": now,
            "finished": self._finished_channel,
            "channel": self._channel,
            "results": None,
        }
        results = cycle.results
        if results:
            ordered = sorted(lease.id for lease in cycle.completes)  # as _lease_arrays
            params["results"] = [results.get(id_) for id_ in ordered]
        return params

    def job_fail_many(
        self, failures: Sequence[Failure], *, now: datetime | None = None
    ) -> set[str]:
        if not failures:
            return set()
        rows = self._fetch("job_fail", self._failure_params(failures, now))
        return {row[0] for row in rows}

    def _failure_params(self, failures: Sequence[Failure], now: datetime | None) -> dict[str, Any]:
        ordered = sorted(failures, key=lambda f: f.lease.id)  # lock order, as in _lease_arrays
        return {
            "failures": _json(
                [
                    {
                        "id": f.lease.id,
                        "token": f.lease.token,
                        "error": f.error.to_json(),
                        "retry_us": None if f.retry_in is None else f.retry_in // _MICROSECOND,
                        "isolate": f.isolate,
                        "refund": f.refund,
                    }
                    for f in ordered
                ]
            ),
            "ids": [f.lease.id for f in ordered],
            "now": now,
            "channel": self._channel,
            "finished": self._finished_channel,
        }

    def job_snooze(
        self, lease: Lease, delay: timedelta | None, *, now: datetime | None = None
    ) -> bool:
        rows = self._fetch(
            "job_snooze",
            {
                "id": lease.id,
                "token": lease.token,
                "delay_us": None if delay is None else delay // _MICROSECOND,
                "now": now,
                "channel": self._channel,
            },
        )
        return bool(rows and rows[0][0])

    def job_cancel(self, cancel: Cancellation, *, now: datetime | None = None) -> bool:
        if cancel.stray:
            return False
        lease = cancel.lease
        rows = self._fetch(
            "job_cancel",
            {
                "id": cancel.job_id,
                "reason": cancel.reason,
                "token": lease.token if lease is not None else None,
                "tenant_id": cancel.tenant_id,
                "now": now,
                "finished": self._finished_channel,
            },
        )
        return bool(rows)

    def job_list_expired(self, query: ExpiredQuery, *, now: datetime | None = None) -> list[Job]:
        if not query.limit:
            return []
        params = {"limit": query.limit, "now": now, "isolated": query.isolated}
        rows = self._fetch("job_list_expired", params)
        return [_job(row) for row in rows]

    def job_list_running(self, *, limit: int) -> list[Job]:
        if limit <= 0:
            return []
        return [_job(row) for row in self._fetch("job_list_running", {"limit": limit})]


def _lease_arrays(leases: Sequence[Lease]) -> dict[str, list[str]]:
    # Sorted by id so that two batches over the same rows lock them in the same order.
    ordered = sorted(leases, key=lambda lease: lease.id)
    return {
        "ids": [lease.id for lease in ordered],
        "tokens": [lease.token for lease in ordered],
    }
