"""The outbox relay (seed ``createOutboxRelay``): publishes staged jobs to the job database.

Guarantees:

- **At least once, by construction.** Each pass claims committed, unpublished ``x_outbox``
  rows (``store.claim``), inserts their jobs into the job database
  (``driver.job_insert_many``), THEN marks them published in the claim's transaction. A crash
  between the two leaves the rows unpublished and the next pass publishes them again; the job
  id and idempotency key were fixed at staging, so the repeat collapses into the row already
  inserted (``deduped=True``). The opposite order would lose jobs.
- **Per-queue order survives a failure.** Rows are published queue by queue in staging order,
  one insert transaction per queue. When a queue's insert fails, its rows stay unpublished,
  ``jobs.outbox.publish-failed`` is logged, and the rest of that queue's rows in the batch wait
  for the next pass, so nothing of that queue overtakes them. Other queues go on as usual.
- **Several relays split the work.** Claims skip rows another relay holds (``FOR UPDATE SKIP
  LOCKED`` on PostgreSQL; the write lock on SQLite), so nothing is published twice except
  after a crash, and nothing is lost.

Limits: a row that can never be inserted blocks its queue (it is logged on every pass; delete
or fix the row). Order across queues, and across relays running at once, is not kept.

Defaults follow the seed: batches of 100, a pass every 200 ms (at once again after a full
batch). ``tick()`` runs one pass, for tests; ``start()``/``stop()`` run passes on a thread,
which also deletes rows published more than ``retention`` ago (default 1 day), every
``prune_every`` (default a minute) of its clock's monotonic time. A failed pass is retried
after ``backoff`` (``supervise.Loop``'s default unless given).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from datetime import timedelta
from types import TracebackType

from ultimat3.jobs import events
from ultimat3.jobs.clock import Backoff, Clock, SystemClock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.outbox_store import OutboxRecord, OutboxStore
from ultimat3.jobs.supervise import Loop

__all__ = ["FAULT_ENV", "Relay"]

#: Test-only fault point: ``after_publish`` makes the process exit (``os._exit(70)``) right
#: after a batch is published and before it is marked, as a crash there would.
FAULT_ENV = "ULTIMAT3_JOBS_RELAY_FAULT"
_FAULT_EXIT = 70


class Relay:
    """Moves committed outbox rows into the job database; see the module docstring."""

    def __init__(
        self,
        *,
        store: OutboxStore,
        driver: Driver,
        clock: Clock | None = None,
        batch_size: int = 100,
        interval: timedelta = timedelta(milliseconds=200),
        retention: timedelta = timedelta(days=1),
        prune_every: timedelta = timedelta(minutes=1),
        backoff: Backoff | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(
                f"batch_size={batch_size!r} is not valid", fix="use an int >= 1 (default 100)"
            )
        if interval <= timedelta(0):
            raise ConfigurationError(
                f"interval={interval} is not valid", fix='use a positive duration, e.g. "200ms"'
            )
        self.store = store
        self.driver = driver
        self.clock: Clock = clock or SystemClock()
        self.batch_size = batch_size
        self.interval = interval
        self.retention = retention
        self.prune_every = prune_every
        self.backoff = backoff
        self._fault = os.environ.get(FAULT_ENV, "")
        self._loop: Loop | None = None
        self._next_prune = self.clock.monotonic() + prune_every.total_seconds()

    def tick(self) -> int:
        """One pass: claim a batch, publish it queue by queue, mark what was published.
        Returns how many rows were published."""
        with self.store.claim(self.batch_size) as batch:
            published = self._publish(batch.records)
            if published and self._fault == "after_publish":
                os._exit(_FAULT_EXIT)
            if published:
                batch.mark_published(published, now=self.clock.pinned())
        return len(published)

    def _publish(self, records: Sequence[OutboxRecord]) -> list[str]:
        by_queue: dict[str, list[OutboxRecord]] = {}
        for record in records:
            by_queue.setdefault(record.job.queue, []).append(record)
        published: list[str] = []
        for queue, group in by_queue.items():
            try:
                results = self.driver.job_insert_many(
                    [r.job for r in group], now=self.clock.pinned()
                )
            except Exception as exc:
                first = group[0].job
                events.warning(
                    "jobs.outbox.publish-failed",
                    queue=queue,
                    job=first.name,
                    id=first.id,
                    rows=len(group),
                    error=getattr(exc, "cause", None) or str(exc) or type(exc).__name__,
                )
                continue
            events.debug(
                "jobs.outbox.published",
                queue=queue,
                rows=len(group),
                deduped=sum(1 for result in results if result.deduped),
            )
            published.extend(r.job.id for r in group)
        return published

    def prune(self) -> int:
        """Delete rows published more than ``retention`` ago; returns how many."""
        return self.store.prune(published_before=self.clock.now() - self.retention, limit=10_000)

    def pending(self) -> int:
        """Committed rows that wait to be published (seed ``pending()``)."""
        return self.store.pending_count()

    # -- running on a thread -----------------------------------------------------------------

    def start(self) -> None:
        """Run passes on a supervised thread (``supervise.Loop``) until ``stop()``.
        Idempotent."""
        if self._loop is not None:
            return
        self._loop = Loop("relay", self._step, clock=self.clock, backoff=self.backoff)
        self._loop.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the pass in progress. Idempotent."""
        if self._loop is not None:
            self._loop.stop(timeout)
            self._loop = None

    def run(self, stop: threading.Event) -> None:
        """Run passes in this thread until ``stop`` is set."""
        Loop("relay", self._step, stop=stop, clock=self.clock, backoff=self.backoff).run()

    def _step(self) -> float:
        full = self.tick() >= self.batch_size
        now = self.clock.monotonic()
        if now >= self._next_prune:
            self._next_prune = now + self.prune_every.total_seconds()
            pruned = self.prune()
            if pruned:
                events.info("jobs.outbox.pruned", rows=pruned)
        return 0.0 if full else self.interval.total_seconds()

    def __enter__(self) -> Relay:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
