"""Maintenance: rescue jobs whose worker vanished, and prune finished rows.

Guarantees and limits:

- **Rescue is by lease, not by age.** A running job is rescued only once its lease expired on
  the database's clock, i.e. no heartbeat renewed it for a whole lease. A job whose worker is
  alive keeps its lease however long it runs. The rescue is a failure written through the
  expired lease: if the worker comes back and writes first, the rescue matches nothing, and if
  the rescue writes first, the worker's late write matches nothing (fencing).
- **The rescued attempt counts.** The attempt was counted at claim time, so a job that kills
  its worker on every attempt ends ``dead`` after ``max_attempts`` claims, with error kind
  ``worker_lost`` for each.
- Every worker may run maintenance; two rescuers racing on one job are fenced the same way, so
  running it everywhere costs queries, never correctness.
- Pruning deletes ``completed`` and ``cancelled`` rows finished longer ago than ``retention``
  (default 1 day), which also ends the dedupe window of their idempotency keys. ``dead`` rows
  are kept until retried or discarded unless ``dead_retention`` is set.
"""

from __future__ import annotations

import dataclasses
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.records import AttemptError, Failure, Job, JobState
from ultimat3.jobs.retry import DEFAULT_RETRY, next_retry

TRACEBACK_LIMIT = 16_000
MESSAGE_LIMIT = 4_000


def attempt_error(job: Job, kind: str, message: str, now: datetime, tb: str = "") -> AttemptError:
    return AttemptError(
        attempt=job.attempt,
        at=now,
        kind=kind,
        message=message[:MESSAGE_LIMIT],
        traceback=tb[-TRACEBACK_LIMIT:],
    )


def error_from_exception(job: Job, exc: BaseException, now: datetime) -> AttemptError:
    tb = "".join(traceback.format_exception(exc))
    return attempt_error(job, type(exc).__qualname__, str(exc) or repr(exc), now, tb)


def decide_failure(
    job: Job,
    handle: JobHandle[Any] | None,
    error: AttemptError,
    now: datetime,
    rand: Callable[[], float] = random.random,
) -> tuple[Failure, bool]:
    """The one place a failed attempt becomes a retry or a dead job (seed ``nextRetry``).

    ``job.max_attempts`` is the row's (an operator's retry may have raised it); backoff comes
    from the job's policy. Returns the failure and whether a dead job must be dropped
    (``dead_letter=False``).
    """
    policy = handle.retry if handle is not None else DEFAULT_RETRY
    decision = next_retry(dataclasses.replace(policy, attempts=job.max_attempts), job.attempt, rand)
    retry_at = now + decision.delay if decision.retry else None
    drop = not decision.retry and not decision.dead_letter
    return Failure(lease=job.lease, error=error, retry_at=retry_at), drop


@dataclass
class MaintenanceConfig:
    rescue_batch: int = 100
    retention: timedelta = timedelta(days=1)
    dead_retention: timedelta | None = None
    prune_batch: int = 10_000


class Maintenance:
    """Rescuer and pruner. ``tick()`` does one pass of each and returns what it did."""

    def __init__(
        self,
        driver: Driver,
        handles: Callable[[str], JobHandle[Any] | None],
        clock: Clock,
        config: MaintenanceConfig | None = None,
    ) -> None:
        self.driver = driver
        self.handles = handles
        self.clock = clock
        self.config = config or MaintenanceConfig()

    def rescue(self) -> list[str]:
        """Fail every job whose lease expired; return the ids rescued."""
        rescued: list[str] = []
        while True:
            expired = self.driver.job_list_expired(
                limit=self.config.rescue_batch, now=self.clock.pinned()
            )
            if not expired:
                return rescued
            now = self.clock.now()
            failures: list[Failure] = []
            drops: list[str] = []
            for job in expired:
                error = attempt_error(
                    job,
                    "worker_lost",
                    "the lease expired: the worker crashed, hung, or lost the database",
                    now,
                )
                failure, drop = decide_failure(job, self.handles(job.name), error, now)
                failures.append(failure)
                if drop:
                    drops.append(job.id)
            changed = self.driver.job_fail_many(failures, now=self.clock.pinned())
            for failure in failures:
                if failure.lease.id in changed:
                    events.warning(
                        "jobs.job.rescued", job_id=failure.lease.id, dead=failure.retry_at is None
                    )
            if drops:
                self.driver.job_discard([i for i in drops if i in changed])
            rescued.extend(sorted(changed))
            if len(expired) < self.config.rescue_batch:
                return rescued

    def prune(self) -> int:
        now = self.clock.now()
        total = self.driver.job_prune(
            states=frozenset({JobState.COMPLETED, JobState.CANCELLED}),
            finished_before=now - self.config.retention,
            limit=self.config.prune_batch,
        )
        if self.config.dead_retention is not None:
            total += self.driver.job_prune(
                states=frozenset({JobState.DEAD}),
                finished_before=now - self.config.dead_retention,
                limit=self.config.prune_batch,
            )
        if total:
            events.info("jobs.pruned", count=total)
        return total
