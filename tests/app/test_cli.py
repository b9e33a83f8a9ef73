"""The command line: every command, --json, and errors as cause + fix with exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import click
import pytest

from ultimat3.jobs.cli import cli

from .cliapp import app_module, run

APP_MODULE = """
from ultimat3.jobs import App, Retry, job, task

@job(retry=Retry(attempts=6, delay="1s", max_delay="10s", jitter=False))
def resize(input):
    pass

@job(queue="mail")
def poison(input):
    raise ValueError("always")

nightly = task("30 2 * * *", tz="America/New_York", enqueue=lambda: [(resize, {})])

app = App(URL, modules=[__import__(__name__)])
"""


@pytest.fixture
def app_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from app_module(tmp_path, monkeypatch, APP_MODULE, "cliapp")


def test_schedule_text_and_json(app_ref: str) -> None:
    code, out, _ = run("--app", app_ref, "schedule")
    assert code == 0
    assert "resize" in out and "1s, 2s, 4s, 8s, 10s" in out
    assert "nightly" in out
    code, out, _ = run("--app", app_ref, "schedule", "--json")
    data = json.loads(out)
    resize = next(j for j in data["jobs"] if j["job"] == "resize")
    assert resize["schedule_ms"] == [1000, 2000, 4000, 8000, 10000]
    (nightly,) = data["tasks"]
    assert len(nightly["next"]) == 5 and nightly["tz"] == "America/New_York"


def test_jobs_commands(app_ref: str) -> None:
    import importlib

    module = importlib.import_module(app_ref.split(":")[0])
    app = module.app
    job_id = module.poison.enqueue({"n": 1}, max_attempts=1).id
    app.worker().drain()
    code, out, _ = run("--app", app_ref, "jobs", "list", "--state", "dead", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["id"] == job_id and row["last_error"].startswith("ValueError")
    _, out, _ = run("--app", app_ref, "jobs", "show", job_id, "--json")
    shown = json.loads(out)
    assert shown["input"] == {"n": 1} and shown["errors"][0]["kind"] == "ValueError"
    code, out, _ = run("--app", app_ref, "jobs", "show", job_id)
    assert code == 0 and "Traceback" in out
    code, out, _ = run("--app", app_ref, "jobs", "retry", job_id)
    assert code == 0 and f"retry: {job_id}" in out
    code, _, err = run("--app", app_ref, "jobs", "discard", job_id)
    assert code == 1 and "unchanged" in err  # it is available again, not dead
    code, out, _ = run("--app", app_ref, "jobs", "cancel", job_id)
    assert code == 0
    code, out, _ = run("--app", app_ref, "jobs", "discard", job_id, "--json")
    assert json.loads(out) == {"discard": [job_id], "unchanged": []}


def test_queue_commands(app_ref: str) -> None:
    assert run("--app", app_ref, "migrate")[0] == 0
    assert run("--app", app_ref, "queues", "pause", "mail")[0] == 0
    code, out, _ = run("--app", app_ref, "queues", "list", "--json")
    assert code == 0
    assert {"queue": "mail", "paused": True, "counts": {}} in json.loads(out)
    assert run("--app", app_ref, "queues", "resume", "mail")[0] == 0


def test_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    code, out, _ = run("--url", url, "migrate", "--sql")
    assert code == 0 and "create table" in out.lower() and "x_jobs" in out
    code, out, _ = run("--url", url, "migrate")
    assert code == 0 and "migrated" in out


def test_library_errors_print_cause_and_fix(tmp_path: Path) -> None:
    code, _, err = run("--url", "mysql://nope", "jobs", "list")
    assert code == 1
    assert "error:" in err and "fix:" in err and "Traceback" not in err
    code, _, err = run("--app", "no_such_module_xyz:app", "worker")
    assert code == 1 and "fix:" in err
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    assert run("--url", url, "migrate")[0] == 0
    code, _, err = run("--url", url, "jobs", "show", "nope")
    assert code == 1 and "error: no job has the id 'nope'\n" in err


def test_usage_errors_exit_2() -> None:
    assert run("jobs", "list", "--state", "bogus")[0] == 2
    assert run("no-such-command")[0] == 2


def test_worker_without_jobs_explains(tmp_path: Path) -> None:
    code, _, err = run("--url", f"sqlite:///{tmp_path / 'w.sqlite3'}", "worker")
    assert code == 1 and "no queue" in err


def test_demo_module_importable() -> None:
    from ultimat3.jobs import demo

    assert callable(demo.run_demo)


def test_migrate_covers_the_outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "outboxapp_cli.py"
    module.write_text(
        "from ultimat3.jobs import App\n"
        f"app = App({str('sqlite:///' + str(tmp_path / 'jobs.sqlite3'))!r}, "
        f"outbox={str('sqlite:///' + str(tmp_path / 'business.sqlite3'))!r})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = run("--app", "outboxapp_cli:app", "migrate", "--sql")
    assert code == 0 and "x_outbox" in out and "outbox migration 1" in out
    code, out, _ = run("--app", "outboxapp_cli:app", "migrate")
    assert code == 0 and "migrated the outbox" in out
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(tmp_path / "business.sqlite3")) as conn:
        assert conn.execute("select count(*) from x_outbox").fetchone()[0] == 0
    sys.modules.pop("outboxapp_cli", None)


# -- the first hour: every mistake a newcomer made is explained, exactly -----------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty project folder as the working directory, importable as a user's is."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("ULTIMAT3_JOBS_URL", raising=False)
    monkeypatch.delenv("ULTIMAT3_JOBS_APP", raising=False)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("newcomer"):
            sys.modules.pop(name)


NEWCOMER = """\
import sys

from ultimat3.jobs import App, job


@job
def flaky(order):
    pass


app = App("sqlite:///jobs.sqlite3", modules=[sys.modules[__name__]])
"""


def lines(err: str) -> list[str]:
    return err.rstrip("\n").split("\n")


@pytest.mark.parametrize(
    ("source", "ref", "expected"),
    [
        (
            "x = (\n",
            "newcomer_syntax:app",
            [
                "error: --app 'newcomer_syntax:app': '(' was never closed "
                "({dir}/newcomer_syntax.py, line 1)",
                "  fix: fix the syntax error; `python -c 'import newcomer_syntax'` shows it in full",
            ],
        ),
        (
            NEWCOMER,
            "./newcomer_path.py:app",
            [
                "error: --app './newcomer_path.py:app' is a file path; --app takes a module "
                "name and an attribute",
                "  fix: write --app newcomer_path:app (a module importable from the current folder)",
            ],
        ),
        (
            NEWCOMER,
            "newcomer_job:flaky",
            [
                "error: --app 'newcomer_job:flaky' is a job (@job), not an App",
                "  fix: the module's App: --app newcomer_job:app",
            ],
        ),
        (
            NEWCOMER,
            "newcomer_class:App",
            [
                "error: --app 'newcomer_class:App' is the class App itself, not an App",
                "  fix: the module's App: --app newcomer_class:app",
            ],
        ),
        (
            NEWCOMER,
            "newcomer_nope:nope",
            [
                "error: --app 'newcomer_nope:nope': module 'newcomer_nope' has no attribute 'nope'",
                "  fix: the module's App: --app newcomer_nope:app",
            ],
        ),
        (
            "from ultimat3.jobs import App\n\ndef make():\n    return App()\n",
            "newcomer_factory:make",
            [
                "error: --app 'newcomer_factory:make' is a function, not an App",
                "  fix: to build the App by calling make(), write --app 'newcomer_factory:make()'",
            ],
        ),
        (
            "x = 1\nraise ValueError('boom')\n",
            "newcomer_raises:app",
            [
                "error: --app 'newcomer_raises:app': importing 'newcomer_raises' raised "
                "ValueError: boom ({dir}/newcomer_raises.py, line 2)",
                "  fix: fix the error in your module; `python -c 'import newcomer_raises'` shows "
                "the whole traceback",
            ],
        ),
        (
            "from ultimat3.jobs import task\n\nnightly = task('0 3 * * *', tz='utc', enqueue=list)\n",
            "newcomer_zone:app",
            [
                "error: --app 'newcomer_zone:app': importing 'newcomer_zone' raised CronError at "
                "{dir}/newcomer_zone.py, line 3: unknown time zone 'utc'; zone names are "
                'case-sensitive: "UTC"',
                '  fix: write tz="UTC"',
            ],
        ),
        (
            "import sys\nfrom ultimat3.jobs import App\n\napp = App(modules=[sys.modules[__name__]])\n",
            "newcomer_empty:app",
            [
                "error: the app 'newcomer_empty:app' has no job or task registered",
                "  fix: register the module that defines them: App(modules=[...]), or "
                "App(modules=[sys.modules[__name__]]) in the module itself",
            ],
        ),
    ],
)
def test_app_mistakes_say_what_and_where(
    project: Path, source: str, ref: str, expected: list[str]
) -> None:
    module = ref.split(":")[0].removeprefix("./").removesuffix(".py")
    (project / f"{module}.py").write_text(source)
    code, out, err = run("--app", ref, "schedule")
    assert (code, out) == (1, "")
    assert lines(err) == [line.format(dir=project) for line in expected]


def test_an_unknown_module_says_where_it_was_looked_for(project: Path) -> None:
    code, _, err = run("--app", "newcomer_missing:app", "worker")
    assert code == 1
    assert lines(err) == [
        f"error: --app 'newcomer_missing:app': no module named 'newcomer_missing' in {project} "
        "or on sys.path",
        "  fix: run from the folder that holds your module or package, or fix --app "
        "module:attribute",
    ]


def test_a_factory_is_called_when_asked(project: Path) -> None:
    (project / "newcomer_made.py").write_text(
        NEWCOMER.replace("app = App(", "def make():\n    return App(")
    )
    code, out, _ = run("--app", "newcomer_made:make()", "schedule", "--json")
    assert code == 0 and [j["job"] for j in json.loads(out)["jobs"]] == ["flaky"]


def test_url_points_the_app_at_another_database(project: Path) -> None:
    (project / "newcomer_url.py").write_text(NEWCOMER)
    other = project / "other.sqlite3"
    code, out, _ = run("--app", "newcomer_url:app", "--url", f"sqlite:///{other}", "migrate")
    assert (code, out) == (0, f"migrated sqlite:///{other}\n")
    assert other.exists() and not (project / "jobs.sqlite3").exists()
    code, out, _ = run("--app", "newcomer_url", "--url", f"sqlite:///{other}", "jobs", "list")
    assert (code, out) == (0, "no jobs\n")


def test_url_cannot_move_an_app_opened_at_import(project: Path) -> None:
    (project / "newcomer_opened.py").write_text(NEWCOMER + "app.open()\n")
    code, _, err = run(
        "--app", "newcomer_opened:app", "--url", "sqlite:///other.sqlite3", "jobs", "list"
    )
    assert code == 1
    assert lines(err) == [
        "error: --url cannot point --app 'newcomer_opened:app' at another database: the app "
        f"already opened sqlite:///{project}/jobs.sqlite3 (when its module was imported)",
        "  fix: drop --url, or build the App without opening it at import time (no app.open() "
        "or enqueue at module level), so that --url can choose its database",
    ]


def test_help_says_where_the_database_comes_from() -> None:
    code, out, _ = run("--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "With --app: the app's jobs on this database instead of its own." in flat
    assert "without --app, $ULTIMAT3_JOBS_URL, else ./ultimat3-jobs.sqlite3" in flat


@pytest.mark.parametrize(
    "args",
    [
        ("jobs", "list"),
        ("jobs", "show", "x"),
        ("jobs", "retry", "x"),
        ("jobs", "discard", "x"),
        ("jobs", "cancel", "x"),
        ("queues", "list"),
        ("queues", "pause", "mail"),
        ("queues", "resume", "mail"),
    ],
)
def test_commands_on_jobs_never_create_a_database(project: Path, args: tuple[str, ...]) -> None:
    code, out, err = run(*args)
    assert (code, out) == (1, "")
    assert lines(err) == [
        f"error: no job database at {project}/ultimat3-jobs.sqlite3: with no --app, --url or "
        "$ULTIMAT3_JOBS_URL this is the default file, and it does not exist in this folder",
        "  fix: run from your project's folder, or pass --app module:attribute (or --url "
        "sqlite:///path/to/jobs.sqlite3); `ultimat3-jobs migrate` creates a database",
    ]
    assert list(project.iterdir()) == []


def test_a_missing_database_names_the_option_that_chose_it(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run("--url", "sqlite:///gone.sqlite3", "jobs", "list")
    assert code == 1 and f"error: no job database at {project}/gone.sqlite3: --url names it," in err
    monkeypatch.setenv("ULTIMAT3_JOBS_URL", "sqlite:///env.sqlite3")
    code, _, err = run("jobs", "list")
    assert (
        code == 1
        and f"error: no job database at {project}/env.sqlite3: $ULTIMAT3_JOBS_URL names it," in err
    )
    (project / "newcomer_where.py").write_text(NEWCOMER)
    code, _, err = run("--app", "newcomer_where:app", "queues", "list")
    assert code == 1
    assert (
        f"error: no job database at {project}/jobs.sqlite3: the app 'newcomer_where:app' uses it,"
        in err
    )
    assert list(project.iterdir()) == [project / "newcomer_where.py"]


def test_schedule_without_an_app_is_an_error(project: Path) -> None:
    code, out, err = run("schedule")
    assert (code, out) == (1, "")
    assert lines(err) == [
        "error: no --app given: no job or task is known",
        "  fix: pass --app module:attribute",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("worker", "--lease", "30"),
            """Error: Invalid value for '--lease': '30' has a number without a unit: "30"; write "30s\"""",
        ),
        (
            ("run", "--poll-interval", "5 minutes"),
            "Error: Invalid value for '--poll-interval': '5 minutes' has an unknown part: "
            '"minutes" (units are d, h, m, s, ms); write "5m"',
        ),
        (
            ("worker", "--heartbeat", "5M"),
            "Error: Invalid value for '--heartbeat': '5M' has an unknown part: \"M\" (units are "
            'd, h, m, s, ms); write text such as "250ms", "30s", "1h30m" or "2d"',
        ),
        (
            ("worker", "--lease", "99999999d"),
            "Error: Invalid value for '--lease': '99999999d' is longer than 10 years; write at "
            'most "3653d"',
        ),
        (
            ("scheduler", "--tick", "1.5 seconds"),
            "Error: Invalid value for '--tick': '1.5 seconds' has an unknown part: \"seconds\" "
            '(units are d, h, m, s, ms); write "1.5s"',
        ),
    ],
)
def test_duration_options_name_the_option_and_the_fix(
    project: Path, args: tuple[str, ...], message: str
) -> None:
    code, out, err = run(*args)
    assert (code, out) == (2, "")
    assert lines(err)[-1] == message


def test_run_takes_every_worker_option() -> None:
    worker = {p.name for p in cli.commands["worker"].params}
    # --processes is the worker command's alone: `run` also hosts a scheduler and a relay.
    assert worker - {"processes"} <= {p.name for p in cli.commands["run"].params}
    assert {"lease", "shutdown_grace", "poll_interval", "heartbeat"} <= worker


def test_run_passes_the_worker_options_on(project: Path) -> None:
    (project / "newcomer_run.py").write_text(NEWCOMER)
    code, _, err = run("--app", "newcomer_run:app", "run", "--lease", "2s", "--heartbeat", "2s")
    assert code == 1
    # Both reached the worker, which refuses the pair.
    assert err.startswith("error: heartbeat=2s is more than half the lease (2s)")


def test_a_pool_needs_at_least_one_process(project: Path) -> None:
    (project / "newcomer_pool.py").write_text(NEWCOMER)
    code, out, err = run("--app", "newcomer_pool:app", "worker", "--processes", "0")
    assert (code, out) == (2, "")
    assert lines(err)[-1] == (
        "Error: Invalid value for '--processes': 0 is not in the range 1<=x<=256."
    )


def test_a_pool_child_runs_the_same_command_without_processes() -> None:
    from ultimat3.jobs.cli.worker import _without_processes

    argv = ["--app", "m:app", "worker", "--processes", "4", "-c", "2", "--processes=3", "-q", "p"]
    assert _without_processes(argv) == ["--app", "m:app", "worker", "-c", "2", "-q", "p"]


def _every_command(group: click.Group, path: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        yield f"{path}{name}", command
        if isinstance(command, click.Group):
            yield from _every_command(command, f"{path}{name} ")


def test_every_option_and_command_has_help() -> None:
    missing = [
        f"{path} {param.opts[0]}"
        for path, command in [("", cli), *_every_command(cli)]
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert missing == []
    assert [path for path, command in _every_command(cli) if not command.help] == []


def test_jobs_list_lines_up(app_ref: str) -> None:
    import importlib

    module = importlib.import_module(app_ref.split(":")[0])
    dead = module.poison.enqueue({"n": 1}, max_attempts=1).id
    waiting = module.resize.enqueue({"n": 2}).id
    module.app.worker(queues=["mail"]).drain()
    code, out, _ = run("--app", app_ref, "jobs", "list")
    assert code == 0
    pad = " " * (len(dead) - 2)
    assert out.split("\n") == [
        f"ID{pad}  STATE      NAME    QUEUE    ATTEMPT  LAST ERROR",
        f"{waiting}  available  resize  default  0/6",
        f"{dead}  dead       poison  mail     1/1      ValueError: always",
        "",
    ]


def test_a_long_last_error_is_cut_with_an_ellipsis() -> None:
    from ultimat3.jobs.cli.context import clip

    assert clip("ValueError: " + "x" * 100, 60) == "ValueError: " + "x" * 47 + "…"
    assert clip("one\ntwo   three", 60) == "one two three"
    assert clip("x" * 60, 60) == "x" * 60


def test_schedule_lines_up(app_ref: str) -> None:
    code, out, _ = run("--app", app_ref, "schedule")
    assert code == 0
    text = out.split("\n")
    assert text[:6] == [
        "JOB     QUEUE    ATTEMPTS  BACKOFF                RETRIES AFTER        THEN",
        "poison  mail     3         exponential, jittered  1s, 2s               dead-letter",
        "resize  default  6         exponential            1s, 2s, 4s, 8s, 10s  dead-letter",
        "(jittered: each wait is between half and all of the one shown)",
        "",
        "task nightly: 30 2 * * * in America/New_York (At 02:30 every day), catch-up skip",
    ]
    assert text[6] == "  NEXT RUNS (America/New_York)  UTC"
    for row in text[7:12]:
        local, utc = row.split()
        assert row == f"  {local}     {utc}"
        assert local.endswith(("-05:00", "-04:00")) and utc.endswith("+00:00")


def test_jobs_show_includes_attempted_at(app_ref: str) -> None:
    import importlib

    module = importlib.import_module(app_ref.split(":")[0])
    job_id = module.poison.enqueue({"n": 1}, max_attempts=1).id
    module.app.worker().drain()
    shown = json.loads(run("--app", app_ref, "jobs", "show", job_id, "--json")[1])
    attempted = module.app.get_job(job_id).attempted_at
    assert attempted is not None and shown["attempted_at"] == attempted.isoformat()
    assert (
        f"    attempted_at: {attempted.isoformat()}\n"
        in run("--app", app_ref, "jobs", "show", job_id)[1]
    )


def test_jobs_show_prints_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'results.sqlite3'}"
    (tmp_path / "cli_results_app.py").write_text(
        "from ultimat3.jobs import App, job\n\n"
        "@job\n"
        "def quote(input):\n"
        "    return {'price': input['n'] * 2, 'note': 'ünï'}\n\n"
        f"app = App({url!r}, modules=[__import__(__name__)])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("cli_results_app")
    try:
        job_id = module.quote.enqueue({"n": 21}).id
        ref = "cli_results_app:app"
        waiting = json.loads(run("--app", ref, "jobs", "show", job_id, "--json")[1])
        assert "result" not in waiting, "no result before it completes"
        module.app.worker().drain()
        shown = json.loads(run("--app", ref, "jobs", "show", job_id, "--json")[1])
        assert shown["result"] == {"price": 42, "note": "ünï"}
        code, out, _ = run("--app", ref, "jobs", "show", job_id)
        assert code == 0
        assert '          result: {"price": 42, "note": "\\u00fcn\\u00ef"}\n' in out
    finally:
        module.app.close()
        sys.modules.pop("cli_results_app", None)


def test_demo_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, _ = run("demo")
    assert code == 0, out
    assert list(tmp_path.iterdir()) == []
    table = out[out.index("what happened") :].split("\n")
    assert table[1:5] == [
        "  job                    state      attempts  errors",
        "  send_receipt           completed  1/3",
        "  sync_inventory         completed  3/4       2 before it completed",
        "  charge_legacy_gateway  completed  4/3+1     3 before it completed",
    ]
    assert "1 dead;" in table[5]


def test_the_demo_says_what_it_shows(tmp_path: Path) -> None:
    """Each schedule says whether it is jittered; every attempt of every job has its
    `running` line before its outcome's; an attempt past the job's own is shown as granted."""
    code, out, _ = run("demo", "--dir", str(tmp_path))
    assert code == 0, out
    assert "send_receipt           3 attempts, retries after: 1s, 2s (jittered: each wait " in out
    assert "sync_inventory         4 attempts, retries after: 400ms, 800ms, 1.6s (exact)" in out
    live = [
        (words[1], words[2], words[4])
        for words in (line.split() for line in out.splitlines() if re.match(r" +\d+\.\d\ds ", line))
    ]
    for name, attempts in (
        ("send_receipt", 1),
        ("sync_inventory", 3),
        ("charge_legacy_gateway", 4),
    ):
        mine = [(state, attempt) for who, state, attempt in live if who == name]
        running = [a for state, a in mine if state == "running"]
        assert len(running) == attempts, mine
        ends = [a for state, a in mine if state != "running"]
        assert ends == running, mine  # each attempt: running, then how it ended
    assert "4/4" not in out and "attempt 4/3+1" in out


def test_the_demo_cuts_a_long_error_with_an_ellipsis() -> None:
    from datetime import UTC, datetime

    from ultimat3.jobs.demo import _errors
    from ultimat3.jobs.records import AttemptError, Job, JobState

    at = datetime(2030, 1, 1, tzinfo=UTC)
    error = AttemptError(attempt=1, at=at, kind="ValueError", message="x" * 100)
    job = Job(
        "id", "j", "default", "{}", None, "k", 0, JobState.DEAD, 1, 1, at, at, errors=(error,)
    )
    assert _errors(job) == "ValueError: " + "x" * 37 + "…"
    assert len(_errors(job)) == 50


@pytest.mark.parametrize("args", [("queues", "list"), ("jobs", "list"), ("workers",)])
def test_commands_on_jobs_never_create_the_schema_in_a_sqlite_file(
    project: Path, args: tuple[str, ...]
) -> None:
    import sqlite3

    sqlite3.connect(project / "empty.sqlite3").close()  # a file of some other program's
    code, out, err = run("--url", "sqlite:///empty.sqlite3", *args)
    assert (code, out) == (1, "")
    assert "are missing or older than this version" in err
    assert "fix: run `ultimat3-jobs migrate` (a worker migrates too)" in err
    with closing(sqlite3.connect(project / "empty.sqlite3")) as conn:
        tables = conn.execute("select name from sqlite_master").fetchall()
    assert tables == []


@pytest.mark.parametrize("args", [("queues", "list"), ("jobs", "list")])
def test_commands_on_jobs_never_create_the_schema_in_postgres(
    pg_empty_dsn: str, args: tuple[str, ...]
) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_empty_dsn)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    code, out, err = run("--url", url, *args)
    assert (code, out) == (1, "")
    assert "are missing or older than this version" in err
    with psycopg.connect(pg_empty_dsn) as conn:
        tables = conn.execute(
            "select table_name from information_schema.tables where table_name like 'x\\_%'"
        ).fetchall()
    assert tables == []
    assert run("--url", url, "migrate")[0] == 0
    assert run("--url", url, *args)[0] == 0


def test_the_scheduler_run_in_process_puts_the_signal_handlers_back(
    app_ref: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scheduler`` (like ``relay``) stops on SIGTERM or SIGINT; run in process, as a test or
    an embedding program does, it leaves Ctrl-C as it found it. It used to keep its own
    handlers installed, so a later Ctrl-C only set an event nobody waited on."""
    found = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    installed = threading.Event()
    install = signal.signal

    def noting(sig: int, handler: Any) -> Any:
        previous = install(sig, handler)
        if sig == signal.SIGTERM and handler is not found[1]:
            installed.set()
        return previous

    monkeypatch.setattr(signal, "signal", noting)

    def stop_once_installed() -> None:
        assert installed.wait(30), "the scheduler never installed its handler"
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_installed)
    stopper.start()
    code, _, err = run("--app", app_ref, "scheduler", "--leader", "sole")
    stopper.join()
    assert code == 0, err
    assert "scheduler on" in err
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == found
