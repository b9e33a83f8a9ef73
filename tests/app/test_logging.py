"""The log of a real run: ``--log-format json``, ``--log-level``, the fields of job events,
and a job's input never in it."""

from __future__ import annotations

import json
import logging
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from ultimat3.jobs import App, job
from ultimat3.jobs.cli import cli

SECRET = "hunter2-credit-card-4111"


@job(queue="mail")
def sends(input: dict[str, str]) -> None:
    if input.get("fail"):
        raise ValueError("refused")


def test_json_log_lines_with_the_level_asked_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'log.sqlite3'}"
    result = CliRunner().invoke(
        cli, ["--url", url, "--log-format", "json", "--log-level", "info", "migrate"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    migrated = next(line for line in lines if line.get("event") == "jobs.migrated")
    assert migrated["level"] == "info" and migrated["logger"] == "ultimat3.jobs"
    assert migrated["versions"]
    quiet = CliRunner().invoke(cli, ["--url", url, "--log-level", "warning", "migrate"])
    assert "jobs.opened" not in quiet.stderr


def test_a_bad_log_option_names_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--log-format", "xml", "migrate"])
    assert result.exit_code == 2
    assert "Invalid value for '--log-format': 'xml' is not one of 'text', 'json'." in result.stderr
    result = CliRunner().invoke(cli, ["--log-level", "loud", "migrate"])
    assert result.exit_code == 2
    assert "Invalid value for '--log-level': 'loud' is not one of" in result.stderr


def test_job_events_carry_their_fields_and_never_the_input(
    make_app: Callable[..., App],
    make_module: Callable[..., types.ModuleType],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(make_module("log_fields", sends=sends))
    with caplog.at_level(logging.DEBUG, logger="ultimat3.jobs"):
        ok = sends.enqueue({"to": SECRET}).id
        bad = sends.enqueue({"to": SECRET, "fail": "1"}, max_attempts=1).id
        app.worker().drain()
    ours = [r for r in caplog.records if hasattr(r, "event") and hasattr(r, "fields")]
    assert all(SECRET not in r.getMessage() for r in caplog.records)
    for record in ours:
        assert SECRET not in record.getMessage()
        assert SECRET not in json.dumps(record.fields, default=str)  # type: ignore[attr-defined]
    by = {(r.event, r.fields.get("job_id")): r.fields for r in ours}  # type: ignore[attr-defined]
    assert by[("jobs.job.enqueued", ok)]["queue"] == "mail"
    started = by[("jobs.job.started", ok)]
    assert started["queue_latency"] >= 0 and started["attempt"] == 1
    assert by[("jobs.job.finished", ok)]["outcome"] == "completed"
    done = by[("jobs.job.completed", ok)]
    assert done["job"] == "sends" and done["queue"] == "mail" and done["tenant"] is None
    assert done["duration"] >= 0
    dead = by[("jobs.job.dead", bad)]
    assert dead["error"] == "ValueError" and dead["attempt"] == 1
    assert by[("jobs.job.finished", bad)]["outcome"] == "dead"
