"""Structured logging: stable event names (seed ``jobs.outbox.publish-failed``) with fields.

Every record goes to the ``ultimat3.jobs`` logger with the event name and fields both in the
message (``jobs.job.dead job=send id=... attempt=3``) and in ``extra`` (``record.event``,
``record.fields``) for JSON formatters and structlog. Job inputs are never logged. Only the
command line configures handlers; a library user who configures none sees nothing.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("ultimat3.jobs")
logger.addHandler(logging.NullHandler())


def emit(level: int, event: str, exc: BaseException | None = None, **fields: Any) -> None:
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    logger.log(
        level,
        f"{event} {text}".rstrip(),
        exc_info=exc,
        extra={"event": event, "fields": fields},
    )


def debug(event: str, **fields: Any) -> None:
    emit(logging.DEBUG, event, **fields)


def info(event: str, **fields: Any) -> None:
    emit(logging.INFO, event, **fields)


def warning(event: str, **fields: Any) -> None:
    emit(logging.WARNING, event, **fields)


def error(event: str, exc: BaseException | None = None, **fields: Any) -> None:
    emit(logging.ERROR, event, exc, **fields)
