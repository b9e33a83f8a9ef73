"""Outbox stores, chosen by URL: where staged jobs wait when your data is not in the job
database. Each store module is imported only when its URL is used, so ``import ultimat3.jobs``
never pulls in psycopg.

- ``sqlite:///path/to/business.sqlite3`` (your application's SQLite file)
- ``postgresql://user:password@host:5432/dbname`` (``postgres://`` too; ``?schema=name``,
  default ``ultimat3_jobs``; ``?statement_timeout=10s``, ``?lock_timeout=5s``;
  ``?pooler=transaction|session`` is accepted: the store keeps no session state anyway)
- ``memory://`` (one process: staged rows hang off ``store.transaction()`` objects)
"""

from __future__ import annotations

from ultimat3.jobs.dialects import canonical_url
from ultimat3.jobs.dialects.sqlite import sqlite_path, url_options
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.outbox_store import OutboxStore

__all__ = ["open_store"]

URL_HELP = (
    "use sqlite:///path/to/your-data.sqlite3, postgresql://user:pass@host/db, or memory:// "
    "(the database your business transactions run on)"
)


def open_store(url: str) -> OutboxStore:
    """Open (not yet migrate) the outbox store a URL names. (Its returns are where mypy proves
    that each store class satisfies ``OutboxStore``.)"""
    url = canonical_url(url)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from ultimat3.jobs.outboxes.sqlite import SqliteOutboxStore

        options = url_options(
            url,
            ("busy_timeout",),
            what="SQLite outbox URL",
            fix="the only option is ?busy_timeout=SECONDS",
        )
        return SqliteOutboxStore(
            sqlite_path(url, fix=URL_HELP), busy_timeout=float(options["busy_timeout"])
        )
    if scheme in ("postgresql", "postgres"):
        from ultimat3.jobs.dialects.postgres import LOCK_TIMEOUT, STATEMENT_TIMEOUT
        from ultimat3.jobs.dialects.postgres_url import (
            OUTBOX_URL_OPTIONS,
            pooler_mode,
            seconds,
            split_url,
        )
        from ultimat3.jobs.outboxes.postgres import PostgresOutboxStore

        dsn, ours = split_url(url, allowed=OUTBOX_URL_OPTIONS)
        pooler_mode(ours)  # validated; nothing of the store's lives in a session
        return PostgresOutboxStore(
            dsn,
            schema=ours.get("schema", "ultimat3_jobs"),
            statement_timeout=seconds(ours, "statement_timeout", STATEMENT_TIMEOUT),
            lock_timeout=seconds(ours, "lock_timeout", LOCK_TIMEOUT),
        )
    if scheme == "memory":
        from ultimat3.jobs.outboxes.memory import MemoryOutboxStore

        return MemoryOutboxStore()
    raise ConfigurationError(f"no outbox store for the URL {url!r}", fix=URL_HELP)
