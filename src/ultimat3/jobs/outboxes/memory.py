"""The memory outbox store (seed ``createMemoryOutboxStore``): staged rows hang off a
transaction object.

``store.transaction()`` yields a ``MemoryOutboxTransaction``; ``with app.using(tx):`` stages
every enqueue of the block on it. When the block ends normally the rows move to the committed
set (``store.commit(tx)``, which returns them), and when it raises they vanish
(``store.rollback(tx)``). A caller with its own transaction runner can call ``commit`` and
``rollback`` itself instead of using the ``with`` block, as the seed's tx runner does.

Committed rows are claimed oldest staged first; a row claimed by one relay is skipped by
another until the first one's claim block ends (as ``FOR UPDATE SKIP LOCKED`` would), so two
relays in one process split the work.

Limits: nothing is persisted or shared across processes, so a crash loses committed but
unpublished rows. Use it for tests and for one-process apps whose data lives only in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

from ultimat3.jobs.clock import utcnow
from ultimat3.jobs.driver import DatabaseId, Joined
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.outbox_store import OutboxRecord
from ultimat3.jobs.records import NewJob

__all__ = ["MemoryOutboxStore", "MemoryOutboxTransaction"]


@dataclass(eq=False)
class MemoryOutboxTransaction:
    """The staging buffer of one transaction: rows staged here exist only once it commits."""

    store: MemoryOutboxStore
    staged: list[OutboxRecord] = field(default_factory=list)
    open: bool = True


@dataclass
class _Batch:
    records: list[OutboxRecord]
    #: Marks wait here until the claim block ends normally, as a transaction's would.
    marks: list[tuple[Sequence[str], datetime]] = field(default_factory=list)

    def mark_published(self, ids: Sequence[str], *, now: datetime | None = None) -> None:
        self.marks.append((list(ids), now or utcnow()))


class MemoryOutboxStore:
    """Staged jobs in dicts behind one lock; see the module docstring."""

    name = "memory"
    display_url = "memory://"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._committed: dict[str, OutboxRecord] = {}  # insertion order is staging order
        self._claimed: set[str] = set()
        self._identity = DatabaseId("memory-outbox", (id(self),), "memory://")

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        return self._identity

    def schema_current(self) -> bool:
        return True

    def migrate(self) -> list[int]:
        return []

    def migration_sql(self) -> list[tuple[int, str]]:
        return []

    def close(self) -> None:
        pass

    # -- the transaction the seed's tx runner drives ----------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[MemoryOutboxTransaction]:
        """A staging transaction: committed on normal exit, rolled back on an exception."""
        tx = MemoryOutboxTransaction(self)
        try:
            yield tx
        except BaseException:
            self.rollback(tx)
            raise
        self.commit(tx)

    def commit(self, tx: MemoryOutboxTransaction) -> list[OutboxRecord]:
        """Make the rows staged on ``tx`` visible to the relay; return them."""
        self._check(tx)
        with self._lock:
            tx.open = False
            for record in tx.staged:
                self._committed.setdefault(record.job.id, record)
        return list(tx.staged)

    def rollback(self, tx: MemoryOutboxTransaction) -> None:
        """Drop the rows staged on ``tx``."""
        tx.open = False
        tx.staged.clear()

    def adopt(self, connection: object) -> Joined:
        return Joined(self._check(connection), self._identity)

    def _check(self, tx: object) -> MemoryOutboxTransaction:
        if isinstance(tx, Joined):
            tx = tx.connection
        if not isinstance(tx, MemoryOutboxTransaction) or tx.store is not self:
            raise ConfigurationError(
                f"the memory outbox store cannot join {type(tx).__name__} as a transaction",
                fix="stage inside `with store.transaction() as tx, app.using(tx):`, or give "
                "the app an outbox on the database your connection uses",
            )
        if not tx.open:
            raise ConfigurationError(
                "this memory outbox transaction has already committed or rolled back",
                fix="enqueue only inside its `with store.transaction()` block",
            )
        return tx

    # -- the seam ------------------------------------------------------------------------------

    def stage(
        self, executor: object, jobs: Sequence[NewJob], *, now: datetime | None = None
    ) -> None:
        tx = self._check(executor)
        at = now or utcnow()
        tx.staged.extend(OutboxRecord(job, at) for job in jobs)

    @contextmanager
    def claim(self, limit: int) -> Iterator[_Batch]:
        with self._lock:
            waiting = [
                record
                for id_, record in self._committed.items()
                if record.published_at is None and id_ not in self._claimed
            ]
            waiting.sort(key=lambda record: record.staged_at)  # stable: commit order on ties
            chosen = waiting[: max(0, limit)]
            self._claimed.update(record.job.id for record in chosen)
        batch = _Batch(chosen)
        try:
            yield batch
            for ids, at in batch.marks:
                self._mark(ids, at)
        finally:
            with self._lock:
                self._claimed.difference_update(record.job.id for record in chosen)

    def _mark(self, ids: Sequence[str], at: datetime) -> None:
        with self._lock:
            for id_ in ids:
                record = self._committed.get(id_)
                if record is not None and record.published_at is None:
                    self._committed[id_] = replace(record, published_at=at)

    def pending_count(self) -> int:
        with self._lock:
            return sum(1 for r in self._committed.values() if r.published_at is None)

    def prune(self, *, published_before: datetime, limit: int) -> int:
        with self._lock:
            old = [
                id_
                for id_, r in self._committed.items()
                if r.published_at is not None and r.published_at < published_before
            ][: max(0, limit)]
            for id_ in old:
                del self._committed[id_]
        return len(old)
