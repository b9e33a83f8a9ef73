"""The outbox-store seam (seed ``OutboxStore``): staged jobs in the *business* database.

Used when the caller's transaction is not on the job database (business rows in PostgreSQL,
jobs in a SQLite file; or two PostgreSQL databases). ``stage`` writes ``x_outbox`` rows through
the caller's own connection, inside the caller's transaction, so they exist if and only if it
commits; the relay (``ultimat3.jobs.relay``) later claims committed rows, publishes them to the
job driver, and then marks them published. Publish-then-mark makes delivery at-least-once; the
staged job's id and idempotency key are fixed at staging time, so a re-publish collapses into
the same job row.

The seed's ``commit(tx)``/``rollback(tx)`` hooks exist only on the memory store
(``outboxes.memory``); the SQL stores get commit and rollback from the database itself.

Stores speak records (``NewJob`` in, ``OutboxRecord`` out), never SQL above this seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from ultimat3.jobs.driver import DatabaseId, Joined
from ultimat3.jobs.records import NewJob

__all__ = ["OutboxBatch", "OutboxRecord", "OutboxStore"]


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One staged job (seed ``OutboxRecord``): the job exactly as it will be inserted, with
    its id and idempotency key already fixed."""

    job: NewJob
    staged_at: datetime
    published_at: datetime | None = None


class OutboxBatch(Protocol):
    """Rows claimed by one relay, held against other relays until the claim's block ends."""

    @property
    def records(self) -> Sequence[OutboxRecord]:
        """Committed, unpublished rows, oldest staged first."""
        ...

    def mark_published(self, ids: Sequence[str], *, now: datetime | None = None) -> None:
        """Mark claimed rows published, in the claim's own transaction (it commits when the
        ``with`` block ends normally, and is rolled back when it raises)."""
        ...


class OutboxStore(Protocol):
    #: "memory", "sqlite" or "postgres".
    name: str
    #: Where the outbox lives, with any password masked; for messages and the CLI.
    display_url: str

    def migrate(self) -> list[int]:
        """Create the ``x_outbox`` table in the business database (numbered, forward-only);
        return the versions applied."""
        ...

    def migration_sql(self) -> list[tuple[int, str]]:
        """Every migration as ``(version, sql)``, for teams that run their own tool."""
        ...

    def schema_current(self) -> bool:
        """True when the outbox table is migrated. A read: it takes no write lock."""
        ...

    def identity(self, *, refresh: bool = False) -> DatabaseId:
        """The business database the outbox lives in."""
        ...

    def adopt(self, connection: Any) -> Joined:
        """Check that a caller's connection (or a ``Joined``) reaches this store's database;
        return it as a ``Joined``, or raise ``ConfigurationError`` with a fix."""
        ...

    def stage(
        self, executor: Joined, jobs: Sequence[NewJob], *, now: datetime | None = None
    ) -> None:
        """Write the jobs into ``x_outbox`` on the caller's connection, inside its transaction.
        Nothing is visible until it commits; a ``delay`` counts from now on the store's
        database clock."""
        ...

    def claim(self, limit: int) -> AbstractContextManager[OutboxBatch]:
        """Up to ``limit`` committed, unpublished rows, oldest staged first, locked against
        other relays for the duration of the ``with`` block (``FOR UPDATE SKIP LOCKED`` on
        PostgreSQL, the write lock on SQLite, a claimed-set in memory)."""
        ...

    def pending_count(self) -> int:
        """How many committed rows wait to be published."""
        ...

    def prune(self, *, published_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` rows published before the given time; return how many."""
        ...

    def close(self) -> None: ...
