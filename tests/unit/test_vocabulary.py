"""One vocabulary for an attempt's outcome: the events, the metrics' labels, the spans and the
docs' table use the same words (``events.OUTCOMES``)."""

from __future__ import annotations

from pathlib import Path

from ultimat3.jobs import JobState, events, prometheus

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
