"""The instrumentation point: subscribers, routing by name, the log as the default consumer,
and what a failing subscriber does."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from ultimat3.jobs import events
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.logs import JsonFormatter

SRC = Path(__file__).parents[2] / "src" / "ultimat3" / "jobs"


def test_a_subscriber_gets_every_event_until_it_closes() -> None:
    seen: list[events.Event] = []
    job = object()
    with events.subscribe(seen.append):
        events.info("jobs.job.completed", job, job_id="1", job="send")
        events.debug("jobs.job.started", job_id="2")
    events.info("jobs.job.completed", job_id="3")
    assert [(e.name, e.level, e.fields.get("job_id")) for e in seen] == [
        ("jobs.job.completed", logging.INFO, "1"),
        ("jobs.job.started", logging.DEBUG, "2"),
    ]
    assert seen[0].job is job and seen[1].job is None


def test_a_subscriber_by_name_gets_only_those() -> None:
    some: list[str] = []
    every: list[str] = []
    with events.subscribe(lambda e: some.append(e.name), names=["jobs.job.dead"]):
        with events.subscribe(lambda e: every.append(e.name)):
            assert events.wanted("jobs.job.started", logging.DEBUG)
            events.warning("jobs.job.dead", job_id="1")
            events.debug("jobs.job.started", job_id="1")
        assert events.wanted("jobs.job.dead", logging.DEBUG)
        assert not events.wanted("jobs.job.started", logging.DEBUG)
        events.debug("jobs.job.started", job_id="2")
    assert some == ["jobs.job.dead"]
    assert every == ["jobs.job.dead", "jobs.job.started"]


def test_an_unknown_name_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError) as caught:
        events.subscribe(print, names=["jobs.job.complete"])
    assert "'jobs.job.complete'" in caught.value.cause
    assert "CATALOGUE" in (caught.value.fix or "")


def test_the_log_needs_no_subscriber_and_follows_its_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not events.wanted("jobs.job.started", logging.DEBUG) or logging.getLogger(
        "ultimat3.jobs"
    ).isEnabledFor(logging.DEBUG)
    with caplog.at_level(logging.INFO, logger="ultimat3.jobs"):
        assert events.wanted("jobs.job.completed", logging.INFO)
        events.info("jobs.job.completed", job_id="7", attempt=2)
        events.debug("jobs.job.started", job_id="7")
    (record,) = caplog.records
    assert record.getMessage() == "jobs.job.completed job_id=7 attempt=2"
    assert record.event == "jobs.job.completed"  # type: ignore[attr-defined]
    assert record.fields == {"job_id": "7", "attempt": 2}  # type: ignore[attr-defined]


def test_a_failing_subscriber_is_logged_once_and_the_rest_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    after: list[str] = []

    def broken(event: events.Event) -> None:
        raise RuntimeError("bug in a handler")

    with (
        caplog.at_level(logging.WARNING, logger="ultimat3.jobs"),
        events.subscribe(broken),
        events.subscribe(lambda e: after.append(e.name)),
    ):
        events.warning("jobs.lease.lost", job_id="1")
        events.warning("jobs.lease.lost", job_id="2")
    assert after == ["jobs.lease.lost", "jobs.lease.lost"]
    failures = [r for r in caplog.records if "subscriber-failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert sum(1 for r in caplog.records if getattr(r, "event", "") == "jobs.lease.lost") == 2


def test_every_event_the_code_emits_is_in_the_catalogue() -> None:
    pattern = re.compile(r'events\.(?:debug|info|warning|error)\(\s*"([a-z.-]+)"', re.S)
    emitted = {
        name
        for path in SRC.rglob("*.py")
        for name in pattern.findall(path.read_text(encoding="utf-8"))
    }
    assert len(emitted) > 30
    assert sorted(emitted - events.CATALOGUE.keys()) == []


def test_json_lines_put_the_fields_at_the_top() -> None:
    record = logging.LogRecord("ultimat3.jobs", logging.WARNING, "x", 1, "m", None, None)
    record.event = "jobs.job.dead"
    record.fields = {"job_id": "9", "attempt": 3, "level": "clash"}
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "jobs.job.dead" and line["job_id"] == "9" and line["attempt"] == 3
    assert line["level"] == "warning" and line["field_level"] == "clash"
    other = logging.LogRecord("psycopg", logging.INFO, "x", 1, "hello %s", ("you",), None)
    assert json.loads(JsonFormatter().format(other))["message"] == "hello you"


def test_the_operations_page_lists_every_event() -> None:
    page = (SRC.parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    assert [name for name in events.CATALOGUE if f"| `{name}` |" not in page] == []
