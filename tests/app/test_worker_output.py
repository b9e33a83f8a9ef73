"""What a worker prints, as a user meets it: a real `ultimat3-jobs worker` process, real
jobs, real signals, its stderr read line by line. By default a line per job's end with its
attempt and duration; `-q` prints none; a signal says what the worker will do; with
`--log-format json` every line on stderr is a JSON object."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ultimat3.jobs import App

from .processes import HERE, ledger, wait_until

CLI = (sys.executable, "-m", "ultimat3.jobs")
FAST = ("worker", "--concurrency", "2", "--poll-interval", "50ms")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"sqlite:///{tmp_path / 'output.sqlite3'}",
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _start(env: dict[str, str], *before: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *before, "--app", "faultjobs:app", *FAST],
        env=env,
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _settle(fault_app: App) -> None:
    wait_until(
        lambda: (
            fault_app.count_jobs(state="completed") == 1 and fault_app.count_jobs(state="dead") == 1
        ),
        60,
        "one completed and one dead job",
    )


def _finish(proc: subprocess.Popen[str], env: dict[str, str], *signals: int) -> list[str]:
    """Start a 1.5 s job, wait until it runs, send ``signals`` and return stderr's lines."""
    import faultjobs

    slow = faultjobs.ledger.enqueue({"sleep": 1.5}).id
    wait_until(lambda: any(r[0] == slow for r in ledger(env)), 30, "the slow job to start")
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for n, signum in enumerate(signals):
            proc.send_signal(signum)
            if n + 1 < len(signals):  # a signal sent before the last was handled would merge
                while "finishing" not in (lines[-1] if lines else ""):
                    lines.append(proc.stderr.readline().rstrip("\n"))
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return lines + rest.splitlines()


def test_a_worker_prints_each_jobs_end_and_what_a_signal_does(
    fault_app: App, env: dict[str, str]
) -> None:
    import faultjobs

    ok = faultjobs.ledger.enqueue({}).id
    bad = faultjobs.raises.enqueue({}).id
    proc = _start(env)
    _settle(fault_app)
    lines = _finish(proc, env, signal.SIGTERM)
    assert proc.returncode == 0, lines
    text = "\n".join(lines)
    assert re.search(
        rf"INFO default: ledger {ok} completed: attempt 1/3 in (<1|\d+)ms$", text, re.M
    )
    assert re.search(
        rf"INFO default: raises {bad} retried: attempt 1/2 failed in (<1|\d+)ms \(ValueError\), "
        r"next at \d\d:\d\d:\d\dZ$",
        text,
        re.M,
    ), text
    assert re.search(
        rf"WARNING default: raises {bad} dead: attempt 2/2 failed in (<1|\d+)ms \(ValueError\)$",
        text,
        re.M,
    ), text
    assert text.count(" completed: ") == 2  # the quick job and the slow one, once each
    assert "SIGTERM: finishing 1 job (up to 10s); send it again to stop now" in text
    assert "jobs.worker.signal" not in text  # said in words, not as key=value
    assert lines[-1].endswith(" INFO " + "stopped: 2 completed, 1 retried, 1 dead"), lines
    # The slow job's line comes after the signal's: it finished during the grace.
    signal_at = next(i for i, line in enumerate(lines) if "SIGTERM: finishing" in line)
    assert any(" ledger " in line and " completed: " in line for line in lines[signal_at:])


def test_a_second_signal_says_it_stops_now(fault_app: App, env: dict[str, str]) -> None:
    proc = _start(env)
    lines = _finish(proc, env, signal.SIGINT, signal.SIGINT)
    text = "\n".join(lines)
    assert "SIGINT: finishing 1 job (up to 10s); send it again to stop now" in text, text
    assert (
        "SIGINT again: stopping now; 1 running job goes back to its queue without using an "
        "attempt" in text
    ), text
    assert lines[-1].endswith(" INFO " + "stopped: 0 completed, 1 released"), lines


def test_quiet_prints_no_job_line(fault_app: App, env: dict[str, str]) -> None:
    import faultjobs

    faultjobs.ledger.enqueue({})
    faultjobs.raises.enqueue({})
    proc = _start(env, "-q")
    _settle(fault_app)
    lines = _finish(proc, env, signal.SIGTERM)
    text = "\n".join(lines)
    assert " completed: " not in text and " retried: " not in text, text
    # A dead job is a warning: -q hides the job lines, not the warnings.
    assert " dead: attempt 2/2" in text
    assert "SIGTERM: finishing 1 job" in text
    assert lines[-1].endswith(" INFO " + "stopped: 2 completed, 1 retried, 1 dead"), lines


def test_json_log_format_makes_every_stderr_line_json(fault_app: App, env: dict[str, str]) -> None:
    import faultjobs

    ok = faultjobs.ledger.enqueue({}).id
    bad = faultjobs.raises.enqueue({}).id
    proc = _start(env, "--log-format", "json")
    _settle(fault_app)
    lines = _finish(proc, env, signal.SIGTERM)
    assert lines
    records = [json.loads(line) for line in lines]  # every line, or this raises
    events = [r.get("event") for r in records]
    assert events[0] == "jobs.cli.worker" and records[0]["message"].startswith("worker ")
    by = {(r.get("event"), r.get("job_id")): r for r in records}
    done = by[("jobs.job.completed", ok)]
    assert done["attempt"] == 1 and done["max_attempts"] == 3 and done["duration"] >= 0
    assert by[("jobs.job.retried", bad)]["error"] == "ValueError"
    assert by[("jobs.job.dead", bad)]["attempt"] == 2
    (sig,) = [r for r in records if r.get("event") == "jobs.worker.signal"]
    assert sig["signal"] == signal.SIGTERM and sig["running"] == 1 and sig["grace"] == 10
    stopped = records[-1]
    assert stopped["event"] == "jobs.cli.stopped" and stopped["message"].startswith("stopped: ")
    assert (stopped["completed"], stopped["retried"], stopped["dead"]) == (2, 1, 1)


def test_json_log_format_makes_an_error_json(tmp_path: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [*CLI, "--log-format", "json", "--app", "nosuchmodule:app", "worker"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    error = json.loads(line)
    assert "nosuchmodule" in error["cause"] and error["fix"]


def test_json_log_format_makes_any_commands_error_json(tmp_path: Path) -> None:
    missing = tmp_path / "none.sqlite3"
    done = subprocess.run(
        [*CLI, "--log-format", "json", "--url", f"sqlite:///{missing}", "jobs", "list"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert json.loads(line)["cause"].startswith(f"no job database at {missing}")
