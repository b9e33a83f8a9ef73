"""How the command line prints the log: ``--log-format text|json`` and ``--log-level``.

Text is ``time LEVEL event key=value ...``; JSON is one object a line with ``ts``, ``level``,
``logger``, ``event`` and the event's fields at the top level (``job_id``, ``job``,
``queue``, ``tenant``, ``attempt``, ``duration``, ``error``...), plus ``exc`` with the
traceback when there is one. A record that is not one of ours (another library's) has
``message`` instead of fields. A library user configures logging their own way: the
``ultimat3.jobs`` logger's records carry ``record.event`` and ``record.fields``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

__all__ = ["LEVELS", "JsonFormatter", "configure"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_TEXT = "%(asctime)s %(levelname)s %(message)s"
#: Keys of the JSON object that a field may not take over.
_RESERVED = frozenset({"ts", "level", "logger", "event", "message", "exc"})


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        fields = getattr(record, "fields", None)
        if isinstance(event, str) and isinstance(fields, dict):
            data["event"] = event
            for key, value in fields.items():
                data[f"field_{key}" if key in _RESERVED else key] = value
        else:
            data["message"] = record.getMessage()
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to whatever ``sys.stderr`` is when a record comes."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def configure(level: int, fmt: Literal["text", "json"]) -> None:
    """Send the log to stderr at ``level`` in ``fmt`` (the command line's one handler)."""
    handler = _Stderr()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_ultimat3_jobs", False):
            root.removeHandler(old)
    handler._ultimat3_jobs = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("ultimat3.jobs").setLevel(level)  # the command line decides ours
