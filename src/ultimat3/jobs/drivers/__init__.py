"""Drivers, chosen by URL. Each driver module is imported only when its URL is used, so
``import ultimat3.jobs`` never pulls in psycopg.

- ``sqlite:///relative/path.sqlite3``, ``sqlite:////absolute/path.sqlite3`` (the default
  backend; ``?synchronous=NORMAL`` trades power-loss durability for speed, explicitly)
- ``postgresql://user:password@host:5432/dbname`` (``postgres://`` too; ``?schema=name``)
- ``memory://`` (one process, nothing persisted: tests and demos)
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import ConfigurationError

DEFAULT_SQLITE_FILE = "ultimat3-jobs.sqlite3"
URL_HELP = "use sqlite:///path/to/jobs.sqlite3, postgresql://user:pass@host/db, or memory://"


def default_url(cwd: Path | None = None) -> str:
    return f"sqlite:///{(cwd or Path.cwd()) / DEFAULT_SQLITE_FILE}"


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite://`` URL names (``sqlite:///rel`` relative, ``sqlite:////abs``)."""
    rest = url[len("sqlite://") :]
    if not rest.startswith("/") or rest in ("/", ""):
        raise ConfigurationError(f"the SQLite URL {url!r} names no file", fix=URL_HELP)
    path = rest[1:].split("?", 1)[0]
    return Path(path).expanduser()


def open_driver(url: str) -> Driver:
    """Open (not yet migrate) the driver a URL names."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from ultimat3.jobs.drivers.sqlite import SqliteDriver

        options = dict(parse_qsl(urlsplit(url).query))
        unknown = set(options) - {"synchronous", "busy_timeout"}
        if unknown:
            raise ConfigurationError(
                f"unknown SQLite URL option(s): {', '.join(sorted(unknown))}",
                fix="the options are ?synchronous=FULL|NORMAL and ?busy_timeout=SECONDS",
            )
        return SqliteDriver(
            sqlite_path(url),
            synchronous=options.get("synchronous", "FULL").upper(),
            busy_timeout=float(options.get("busy_timeout", 30.0)),
        )
    if scheme in ("postgresql", "postgres"):
        from ultimat3.jobs.drivers.postgres import PostgresDriver

        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        schema = query.pop("schema", None)
        dsn = urlunsplit(parts._replace(query="&".join(f"{k}={v}" for k, v in query.items())))
        return PostgresDriver(dsn, schema=schema) if schema else PostgresDriver(dsn)
    if scheme == "memory":
        from ultimat3.jobs.drivers.memory import MemoryDriver

        return MemoryDriver()
    raise ConfigurationError(f"no driver for the URL {url!r}", fix=URL_HELP)


def url_from_env() -> str | None:
    return os.environ.get("ULTIMAT3_JOBS_URL") or None
