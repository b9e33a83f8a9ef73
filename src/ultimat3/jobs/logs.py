"""How the command line prints the log: ``--log-format text|json``, ``--log-level`` and ``-q``.

**What a worker prints by default** (level warning): one line per job's end, whatever the
level, as RQ does (``-q`` turns them off)::

    2026-12-04 10:00:00,123 INFO mail: send_receipt 0193... completed: attempt 1/3 in 12ms
    2026-12-04 10:00:00,456 INFO mail: charge 0193... retried: attempt 1/3 failed in 3ms (ValueError), next at 10:00:02Z
    2026-12-04 10:00:02,789 WARNING mail: charge 0193... dead: attempt 3/3 failed in 2ms (ValueError)

plus warnings and errors, what a signal does (``finishing 2 jobs (up to 10s); send it again
to stop now``), and the command's own lines (what it serves, and how it stopped).

Text is ``time LEVEL message``: a job's end as above, other events as ``event key=value
...``. JSON is one object a line with ``ts``, ``level``, ``logger``, ``event`` and the event's
fields at the top level (``job_id``, ``job``, ``queue``, ``tenant``, ``attempt``,
``max_attempts``, ``duration``, ``error``...), plus ``exc`` with the traceback when there is
one, and ``message`` for the command's own lines. A record that is not one of ours (another
library's) has ``message`` instead of fields. With ``--log-format json`` every line a command
writes to stderr is such an object, its error included. A library user configures logging
their own way: the ``ultimat3.jobs`` logger's records carry ``record.event`` and
``record.fields``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from ultimat3.jobs import events
from ultimat3.jobs.duration import format_duration

__all__ = ["JOB_LINES", "LEVELS", "JsonFormatter", "TextFormatter", "configure", "say"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: The events of a job's end (``events.OUTCOMES``; a released job has none): a worker prints
#: one line for each by default (``-q``: none).
JOB_LINES = frozenset(f"jobs.job.{word}" for word in events.OUTCOMES if word != "released")
#: The logger of the command's own lines (what it serves, how it stopped): always printed.
CLI_LOGGER = "ultimat3.jobs.cli"
#: Keys of the JSON object that a field may not take over.
_RESERVED = frozenset({"ts", "level", "logger", "event", "message", "exc"})

_cli = logging.getLogger(CLI_LOGGER)


def say(text: str, event: str, **fields: Any) -> None:
    """One line of the command's own on stderr: ``text`` as a text line, or a JSON object
    with ``event``, ``message`` and ``fields`` (``--log-format json``)."""
    _cli.info(text, extra={"event": event, "fields": fields, "message_too": True})


def _duration(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    if seconds < 0.001:
        return "<1ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.2f}s"


def _clock(iso: object) -> str:
    """A retry time as ``HH:MM:SSZ`` (UTC, as stored)."""
    try:
        moment = datetime.fromisoformat(str(iso)).astimezone(UTC)
    except ValueError:
        return str(iso)
    return moment.strftime("%H:%M:%SZ")


def job_line(event: str, fields: dict[str, Any]) -> str:
    """The text of one job's end (``JOB_LINES``), RQ style: where, what, the outcome in the
    shared vocabulary (docs: Operations), the attempt and how long it ran."""
    outcome = event.rsplit(".", 1)[1]
    attempt = f"attempt {fields.get('attempt')}/{fields.get('max_attempts', '?')}"
    took = _duration(fields.get("duration"))
    head = f"{fields.get('queue')}: {fields.get('job')} {fields.get('job_id')} {outcome}"
    if outcome in ("retried", "dead"):
        text = f"{head}: {attempt} failed in {took} ({fields.get('error')})"
        if outcome == "retried":
            text += f", next at {_clock(fields.get('retry_at'))}"
        elif fields.get("dropped"):
            text += ", dropped"
        return text
    text = f"{head}: {attempt} in {took}"
    if outcome == "cancelled" and fields.get("reason"):
        text += f" ({fields['reason']})"
    return text


def _plural(n: int, one: str) -> str:
    return f"{n} {one}" if n == 1 else f"{n} {one}s"


def signal_line(fields: dict[str, Any]) -> str:
    """What a worker does on SIGTERM or SIGINT (``jobs.worker.signal``)."""
    try:
        name = signal.Signals(int(fields.get("signal", 0))).name
    except ValueError:
        name = f"signal {fields.get('signal')}"
    running = int(fields.get("running", 0) or 0)
    if int(fields.get("count", 1) or 1) > 1:
        if running == 0:
            return f"{name} again: stopping now"
        goes = "goes back to its queue" if running == 1 else "go back to their queues"
        return (
            f"{name} again: stopping now; {_plural(running, 'running job')} {goes} "
            "without using an attempt"
        )
    grace = format_duration(timedelta(seconds=float(fields.get("grace", 0) or 0)))
    if running == 0:
        return f"{name}: no job is running; stopping"
    return f"{name}: finishing {_plural(running, 'job')} (up to {grace}); send it again to stop now"


class TextFormatter(logging.Formatter):
    """``time LEVEL message``: a job's end and a signal as sentences, other events as
    ``event key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        event = getattr(record, "event", None)
        fields = getattr(record, "fields", None)
        if not isinstance(fields, dict) or (
            event not in JOB_LINES and event != "jobs.worker.signal"
        ):
            return super().formatMessage(record)
        kept = record.message
        record.message = job_line(event, fields) if event in JOB_LINES else signal_line(fields)
        try:
            return super().formatMessage(record)
        finally:
            record.message = kept


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
            if getattr(record, "message_too", False):
                data["message"] = record.getMessage()
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


class _Shown(logging.Filter):
    """At or above ``level``, and the command's own lines; a job's end at any level unless
    quiet (quiet, even with -v: only a dead job, a warning, at a level that shows those)."""

    def __init__(self, level: int, job_lines: bool) -> None:
        super().__init__()
        self.level = level
        self.job_lines = job_lines

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == CLI_LOGGER:
            return True
        if getattr(record, "event", None) in JOB_LINES:  # at any level, unless quiet
            return self.job_lines or record.levelno >= max(self.level, logging.WARNING)
        return record.levelno >= self.level


def configure(
    level: int, fmt: Literal["text", "json"], *, job_lines: bool = True
) -> Callable[[], None]:
    """Send the log to stderr at ``level`` in ``fmt`` (the command line's one handler), with
    a line per job's end whatever the level unless ``job_lines`` is False (``-q``). Returns
    what puts the levels and handlers back (a command run in process, as tests do)."""
    loggers = [logging.getLogger(), logging.getLogger("ultimat3.jobs"), _cli]
    before = [(logger, logger.level) for logger in loggers]
    handler = _Stderr()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_Shown(level, job_lines))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_ultimat3_jobs", False):
            root.removeHandler(old)
    handler._ultimat3_jobs = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    # The command line decides ours: the job lines are info records, let through to the filter.
    ours = min(level, logging.INFO) if job_lines else level
    logging.getLogger("ultimat3.jobs").setLevel(ours)
    _cli.setLevel(logging.INFO)

    def restore() -> None:
        root.removeHandler(handler)
        for logger, was in before:
            logger.setLevel(was)

    return restore
