"""The options of ours a ``postgresql://`` URL may carry (``?schema=``, ``?pooler=``,
``?statement_timeout=``, ...), split off the DSN libpq reads, each refused with its name
when it cannot work. Shared by the driver's and the outbox store's openers."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from ultimat3.jobs.errors import ConfigurationError

__all__ = [
    "OUTBOX_URL_OPTIONS",
    "URL_OPTIONS",
    "flag",
    "listens",
    "pooler_mode",
    "seconds",
    "split_url",
    "whole",
]

#: Options of ours that a PostgreSQL URL may carry; every other query parameter goes to libpq.
URL_OPTIONS = (
    "schema",
    "listen",
    "pooler",
    "pool_min",
    "pool_max",
    "poll",
    "statement_timeout",
    "lock_timeout",
)
#: The options an outbox store's URL may carry.
OUTBOX_URL_OPTIONS = ("schema", "pooler", "statement_timeout", "lock_timeout")


def split_url(url: str, *, allowed: tuple[str, ...] = URL_OPTIONS) -> tuple[str, dict[str, str]]:
    """Split our options (``?schema=``, ``?listen=false``, ``?pool_max=``) off a libpq URL and
    return the DSN for libpq, its query re-encoded, so ``?password=p%26q%3Dr`` reaches libpq as
    ``p&q=r``."""
    from urllib.parse import parse_qsl, quote, urlencode

    parts = urlsplit(url)
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in allowed:
            ours[key] = value
        else:
            theirs.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(theirs, quote_via=quote))), ours


def flag(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(
        f"?{name}={value} is not true or false", fix=f"write ?{name}=true or ?{name}=false"
    )


def listens(options: dict[str, str]) -> bool:
    """Whether the driver may LISTEN and prepare statements: not behind a transaction-mode
    pooler (``?pooler=transaction``, PgBouncer's ``pool_mode = transaction``), whose server
    connections change between transactions, nor with ``?listen=false``."""
    pooler = pooler_mode(options)
    default = pooler != "transaction"
    if pooler == "transaction" and flag(options, "listen", False):
        raise ConfigurationError(
            "?pooler=transaction with ?listen=true cannot work: a transaction-mode pooler "
            "delivers no notifications",
            fix="drop ?listen=true; the worker polls",
        )
    return flag(options, "listen", default)


def whole(options: dict[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(
            f"?{name}={value} is not a whole number", fix=f"write ?{name}=10, for example"
        ) from None


def pooler_mode(options: dict[str, str]) -> str:
    """``?pooler=``: "none" (the default), "session" or "transaction"."""
    pooler = options.get("pooler", "none").lower()
    if pooler not in ("none", "session", "transaction"):
        raise ConfigurationError(
            f"?pooler={options['pooler']} is not a pooler mode",
            fix="write ?pooler=transaction behind PgBouncer in transaction mode (or a managed "
            "service's transaction pooler), ?pooler=session or leave it out otherwise",
        )
    return pooler


def seconds(options: dict[str, str], name: str, default: float) -> float:
    """A duration option (``?statement_timeout=10s``, ``500ms``; a bare number is seconds)."""
    from ultimat3.jobs.duration import to_timedelta
    from ultimat3.jobs.errors import DurationError

    value = options.get(name)
    if value is None:
        return default
    try:
        parsed = to_timedelta(float(value) if _NUMBER.match(value) else value, name=name)
    except DurationError as exc:
        raise ConfigurationError(
            f"?{name}={value} is not a duration: {exc.cause}", fix=f"write ?{name}=5s, for example"
        ) from None
    return parsed.total_seconds()


_NUMBER = re.compile(r"^\d+(\.\d+)?$")
