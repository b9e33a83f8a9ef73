"""Drivers, chosen by URL. Each driver module is imported only when its URL is used, so
``import ultimat3.jobs`` never pulls in psycopg.

- ``sqlite:///relative/path.sqlite3``, ``sqlite:////absolute/path.sqlite3`` (the default
  backend; ``?synchronous=NORMAL`` trades power-loss durability for speed, explicitly)
- ``postgresql://user:password@host:5432/dbname`` (``postgres://`` too). Options of ours:
  ``?schema=name``, ``?pooler=transaction`` (behind PgBouncer in transaction mode: no
  LISTEN, no prepared statements; the worker polls), ``?pooler=session``, ``?listen=false``
  (poll without a pooler), ``?poll=500ms`` (the longest gap between two looks for new jobs
  while polling), ``?pool_min=N``, ``?pool_max=N``, ``?statement_timeout=10s`` and
  ``?lock_timeout=5s`` (the bounds of every statement of ours, set per transaction); every
  other parameter goes to libpq, re-encoded, so a percent-encoded password arrives as
  written.
- ``memory://`` (one process, nothing persisted: tests and demos)

SQLAlchemy's URLs name the same databases: ``postgresql+psycopg://``,
``postgresql+psycopg_async://`` and ``postgresql+psycopg2://`` open the PostgreSQL driver, ``sqlite+pysqlite:///`` and
``sqlite+aiosqlite:///`` the SQLite one (``canonical_url``), so an app keeps one setting.
"""

from __future__ import annotations

import os
from pathlib import Path

from ultimat3.jobs.clock import Clock
from ultimat3.jobs.dialects import canonical_url as canonical_url
from ultimat3.jobs.dialects.sqlite import sqlite_path as dialect_sqlite_path
from ultimat3.jobs.dialects.sqlite import url_options
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import ConfigurationError

DEFAULT_SQLITE_FILE = "ultimat3-jobs.sqlite3"
URL_HELP = "use sqlite:///path/to/jobs.sqlite3, postgresql://user:pass@host/db, or memory://"


def default_url(cwd: Path | None = None) -> str:
    return f"sqlite:///{(cwd or Path.cwd()) / DEFAULT_SQLITE_FILE}"


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite://`` URL names (``sqlite:///rel`` relative, ``sqlite:////abs``)."""
    return dialect_sqlite_path(url, fix=URL_HELP)


def open_driver(url: str, *, clock: Clock | None = None) -> Driver:
    """Open (not yet migrate) the driver a URL names. ``clock``: the app's. It is the memory
    driver's database clock; SQLite reads its frame, to notice a step of the wall clock
    (``SqliteDriver``); PostgreSQL keeps the server's ``now()`` and waits on real time (a
    pinned ``now`` still reaches it through every call)."""
    url = canonical_url(url)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from ultimat3.jobs.drivers.sqlite import SqliteDriver

        options = url_options(
            url,
            ("synchronous", "busy_timeout"),
            what="SQLite URL",
            fix="the options are ?synchronous=FULL|NORMAL and ?busy_timeout=SECONDS",
        )
        return SqliteDriver(
            sqlite_path(url),
            synchronous=options.get("synchronous", "FULL").upper(),
            busy_timeout=float(options["busy_timeout"]),
            clock=clock,
        )
    if scheme in ("postgresql", "postgres"):
        from ultimat3.jobs.dialects.postgres import LOCK_TIMEOUT, STATEMENT_TIMEOUT
        from ultimat3.jobs.dialects.postgres_url import (
            listens,
            pooler_mode,
            seconds,
            split_url,
            whole,
        )
        from ultimat3.jobs.drivers.postgres import PostgresDriver

        dsn, ours = split_url(url)
        return PostgresDriver(
            dsn,
            schema=ours.get("schema", "ultimat3_jobs"),
            listen=listens(ours),
            pooler=pooler_mode(ours),
            poll=seconds(ours, "poll", 0.5),
            pool_min=whole(ours, "pool_min", 1),
            pool_max=whole(ours, "pool_max", 10),
            statement_timeout=seconds(ours, "statement_timeout", STATEMENT_TIMEOUT),
            lock_timeout=seconds(ours, "lock_timeout", LOCK_TIMEOUT),
        )
    if scheme == "memory":
        from ultimat3.jobs.drivers.memory import MemoryDriver

        return MemoryDriver(clock=clock)
    raise ConfigurationError(f"no driver for the URL {url!r}", fix=URL_HELP)


def url_from_env() -> str | None:
    return os.environ.get("ULTIMAT3_JOBS_URL") or None
