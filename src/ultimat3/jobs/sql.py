"""SQL lives in ``.sql`` files, one folder per dialect, loaded as named blocks.

``drivers/sql/<dialect>/queries.sql`` holds blocks that each start with a ``-- name: NAME``
line; ``drivers/sql/<dialect>/migrations/NNNN_description.sql`` are the numbered, forward-only
migrations, the only source of the schema. The outbox stores keep theirs the same way under
``outboxes/sql/<dialect>/`` (``package="ultimat3.jobs.outboxes"``).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


_DRIVERS = "ultimat3.jobs.drivers"


def _folder(dialect: str, package: str) -> resources.abc.Traversable:
    return resources.files(package).joinpath("sql", dialect)


@cache
def queries(dialect: str, package: str = _DRIVERS) -> dict[str, str]:
    """Every named block of ``<package>/sql/<dialect>/queries.sql``, stripped."""
    text = _folder(dialect, package).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"{dialect}/queries.sql names {name!r} twice")
        blocks[name] = body.strip()
    return blocks


@cache
def migrations(dialect: str, package: str = _DRIVERS) -> tuple[tuple[int, str], ...]:
    """``(version, sql)`` for each migration file of a dialect, in version order."""
    folder = _folder(dialect, package).joinpath("migrations")
    found: list[tuple[int, str]] = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [v for v, _ in found]
    # Gaps are allowed: features developed side by side reserve their numbers, and each
    # migration stands alone (applied by version, never by count).
    if len(set(versions)) != len(versions) or (versions and versions[0] < 1):
        raise ValueError(f"{dialect} migrations must have distinct numbers from 1: {versions}")
    return tuple(found)
