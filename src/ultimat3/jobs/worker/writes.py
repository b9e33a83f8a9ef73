"""Writing what a worker's jobs did: one transaction per turn (``job_cycle``) writes the
completions and failures (each fenced by its lease; a refused late write is a lost lease,
``Run.lose``) and claims one job per free handler, marked started; the rarer outcomes
(snoozes, releases, cancels) follow it, one write each. A claim whose reply was lost is given
back before the next one. Nothing here waits or holds a thread: the worker's cycle loop and
``drain`` call it."""

from __future__ import annotations

import threading

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.ids import token
from ultimat3.jobs.records import Cancellation, ClaimParams, Cycle, Failure, Job
from ultimat3.jobs.run import Life, skipped
from ultimat3.jobs.worker.config import WorkerConfig, WorkerStats
from ultimat3.jobs.worker.handlers import Held, Outcome, fields

__all__ = ["Writer"]


class Writer:
    """The writes of a ``Worker`` (which is one)."""

    driver: Driver
    clock: Clock
    config: WorkerConfig
    stats: WorkerStats
    queues: tuple[str, ...]
    worker_id: str
    limited: bool
    _lock: threading.Lock
    _life: Life
    _lost_claims: list[str]
    _rate_wake: float | None

    def _cycle(self, finished: list[Held], limit: int, *, isolated: bool = False) -> list[Job]:
        """One turn in one transaction (``job_cycle``): write the completions and failures of
        ``finished`` and claim up to ``limit`` jobs for handlers free now (marked started).
        The rarer outcomes (snoozes, releases, cancels) are written after it, one by one."""
        done: list[Held] = []
        fails: list[Held] = []
        failures: list[Failure] = []
        rare: list[Held] = []
        results: dict[str, str] = {}
        for held in finished:
            outcome = held.run.outcome
            assert outcome is not None
            if outcome.kind == "complete":
                done.append(held)
                if outcome.result is not None:
                    results[held.lease.id] = outcome.result
            elif outcome.kind == "fail":
                assert outcome.failure is not None
                fails.append(held)
                failures.append(outcome.failure)
            else:
                rare.append(held)
        self._release_lost_claims()
        claim = None
        if limit > 0:
            claim = ClaimParams(
                queues=self.queues,
                limit=limit,
                lease_for=self.config.lease,
                worker_id=self.worker_id,
                now=self.clock.pinned(),
                isolated=isolated,
                token=token(),
                limited=self.limited,
                skip=self._skipped() if self._life.skipping else (),
            )
        sent = self.clock.monotonic()  # the driver's now is no earlier than this
        try:
            result = self.driver.job_cycle(
                Cycle(
                    completes=[h.lease for h in done],
                    failures=failures,
                    claim=claim,
                    results=results,
                ),
                now=self.clock.pinned(),
            )
        except BaseException:
            # The claim may have committed with its reply lost: its jobs, which this worker
            # never saw, go back (attempt refunded) before the next claim.
            if claim is not None:
                self._lost_claims.append(claim.token)
            raise
        self.stats.claimed += len(result.claimed)
        wake_in = result.wake_in
        self._rate_wake = None if wake_in is None else sent + wake_in.total_seconds()
        if done:
            self.stats.completed += len(result.completed)
            self._note_lost([h for h in done if h.job.id not in result.completed])
            if events.wanted("jobs.job.completed", events.INFO):  # `-v`: every completion
                for h in done:
                    if h.job.id in result.completed:
                        events.info("jobs.job.completed", h.job, **fields(h))
        if fails:
            self._failed_written(fails, result.failed)
        self._write_rare(rare)
        return result.claimed

    def _skipped(self) -> tuple[str, ...]:
        """The job names this worker passes over now (``_unknown`` adds them)."""
        return skipped(self._life, self.clock.monotonic())

    def _release_lost_claims(self) -> None:
        while self._lost_claims:
            released = self.driver.job_release_claim(self._lost_claims[0], now=self.clock.pinned())
            self._lost_claims.pop(0)
            if released:
                events.warning(
                    "jobs.worker.claim-released", jobs=",".join(released), count=len(released)
                )

    def _write_rare(self, batch: list[Held]) -> None:
        """Snoozes, releases and cancels: one write each, after the cycle's transaction."""
        now = self.clock.pinned()
        for h in batch:
            outcome = h.run.outcome
            assert outcome is not None
            if outcome.kind in ("snooze", "release"):
                if self.driver.job_snooze(h.lease, outcome.delay, now=now):
                    if outcome.kind == "snooze":
                        self.stats.snoozed += 1
                        events.info("jobs.job.snoozed", h.job, **fields(h))
                    else:
                        self.stats.released += 1
                else:
                    self._note_lost([h])
            else:
                cancel = Cancellation(h.job.id, outcome.reason, h.lease)
                if self.driver.job_cancel(cancel, now=now):
                    self.stats.cancelled += 1
                    events.info("jobs.job.cancelled", h.job, **fields(h), reason=outcome.reason)
                else:
                    self._note_lost([h])

    def _failed_written(self, fails: list[Held], failed: set[str]) -> None:
        self._note_lost([h for h in fails if h.job.id not in failed])
        drops = []
        for h in fails:
            outcome = h.run.outcome
            assert outcome is not None and outcome.failure is not None
            if h.job.id not in failed:
                continue
            if outcome.drop:
                drops.append(h.job.id)
            if outcome.failure.retry_in is None:
                self.stats.dead += 1
                events.warning(
                    "jobs.job.dead",
                    h.job,
                    **fields(h),
                    error=outcome.failure.error.kind,
                    dropped=outcome.drop,
                )
            else:
                self.stats.failed += 1
                events.info(
                    "jobs.job.retried",
                    h.job,
                    **fields(h),
                    # The worker's reading of the due time the database computed.
                    retry_at=(self.clock.now() + outcome.failure.retry_in).isoformat(),
                    error=outcome.failure.error.kind,
                )
        if drops:
            self.driver.job_discard(drops)

    def _note_lost(self, refused: list[Held]) -> None:
        """Writes that fencing refused: the lease had been lost (rescued, cancelled)."""
        for h in refused:
            if not h.run.lose(Outcome("release")):  # the renew loop may have given it up
                continue
            with self._lock:
                self.stats.lost += 1
            events.warning("jobs.lease.lost", job_id=h.job.id, job=h.job.name, late_write=True)
