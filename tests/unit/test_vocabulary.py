"""One vocabulary for an attempt's outcome: the events, the metrics' labels, the spans, the
log's job lines and the docs' table use the same words (``events.OUTCOMES``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ultimat3.jobs import JobState, events, prometheus
from ultimat3.jobs.logs import configure

DOCS = Path(__file__).parents[2] / "docs" / "operations.md"


def test_the_worker_kinds_map_to_the_outcomes() -> None:
    assert events.outcome_of("complete", False) == "completed"
    assert events.outcome_of("fail", False) == "retried"
    assert events.outcome_of("fail", True) == "dead"
    assert events.outcome_of("snooze", False) == "snoozed"
    assert events.outcome_of("cancel", False) == "cancelled"
    assert events.outcome_of("release", False) == events.outcome_of(None, False) == "released"


def test_written_outcomes_are_events_and_metric_labels_of_the_same_name() -> None:
    written = set(events.OUTCOMES) - {"released"}  # a release writes no outcome event
    assert {f"jobs.job.{o}" for o in written} <= events.CATALOGUE.keys()
    assert set(prometheus._OUTCOMES.values()) == written
    assert all(name == f"jobs.job.{o}" for name, o in prometheus._OUTCOMES.items())
    # The final outcomes are the final states, spelled the same.
    assert {"completed", "dead", "cancelled"} <= {s.value for s in JobState}


def test_the_docs_table_lists_every_outcome_and_state() -> None:
    page = DOCS.read_text(encoding="utf-8")
    table = page[page.index("### One vocabulary") :]
    assert [o for o in events.OUTCOMES if f"| `{o}` |" not in table] == []
    assert [s.value for s in JobState if f"`{s.value}`" not in table] == []


def test_quiet_hides_the_job_lines_at_any_level(capsys: pytest.CaptureFixture[str]) -> None:
    fields = {"job_id": "1", "job": "send", "queue": "mail", "attempt": 1, "max_attempts": 3}
    for level, quiet, shown in (
        (logging.WARNING, False, True),
        (logging.WARNING, True, False),
        (logging.INFO, True, False),  # -q -v: the other info events, not the job lines
        (logging.ERROR, False, True),
    ):
        restore = configure(level, "text", job_lines=not quiet)
        try:
            events.info("jobs.job.completed", None, **fields, duration=0.012)
            events.info("jobs.opened", url="sqlite://")
            events.warning("jobs.job.dead", None, **fields, duration=0.002, error="ValueError")
        finally:
            restore()
        err = capsys.readouterr().err
        assert ("mail: send 1 completed: attempt 1/3 in 12ms" in err) is shown, (level, err)
        assert ("jobs.opened" in err) is (level <= logging.INFO), (level, err)
        dead = "WARNING mail: send 1 dead: attempt 1/3 failed in 2ms (ValueError)"
        assert (dead in err) is (not quiet or level <= logging.WARNING), (level, err)


def test_the_signal_sentences() -> None:
    from ultimat3.jobs.logs import signal_line

    first = {"signal": 15, "count": 1, "grace": 30.0}
    assert signal_line({**first, "running": 3}) == (
        "SIGTERM: finishing 3 jobs (up to 30s); send it again to stop now"
    )
    assert signal_line({**first, "running": 0}) == "SIGTERM: no job is running; stopping"
    again = {"signal": 2, "count": 2, "grace": 30.0}
    assert signal_line({**again, "running": 2}) == (
        "SIGINT again: stopping now; 2 running jobs go back to their queues without using an "
        "attempt"
    )
    assert signal_line({**again, "running": 0}) == "SIGINT again: stopping now"
