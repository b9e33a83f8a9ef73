"""A process that used an app ends at once and quietly, whether or not its code closed the app.

psycopg_pool's threads, left open to the interpreter's shutdown, make it wait (5 s a pool and a
"hint: you can try to call 'close()'" warning on Python 3.12, forever on 3.13); SQLite's
connections left to the garbage collector warn ``ResourceWarning: unclosed database`` on 3.13.
Each case is a real process on every database driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .processes import HERE, wait_until

NOISE = ("hint: you can try to call 'close()'", "couldn't stop thread", "ResourceWarning")

SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    from ultimat3.jobs import App, job

    @job
    def hello(input):
        pass

    app = App(sys.argv[1], modules=[sys.modules[__name__]])
    app.enqueue(hello, {})
    with app.transaction():
        app.enqueue(hello, {})
    print(app.count_jobs(), time.time())  # the script ends here; the interpreter's exit next
    """
)


@pytest.fixture
def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONWARNINGS": "always::ResourceWarning",
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _quiet(stderr: str) -> None:
    assert not [n for n in NOISE if n in stderr], stderr


def test_a_script_that_never_closes_its_app_exits_at_once(
    url: str, tmp_path: Path, env: dict[str, str]
) -> None:
    script = tmp_path / "never_closes.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), url], env=env, capture_output=True, text=True, timeout=60
    )
    took = time.time() - float(done.stdout.split()[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "2"
    _quiet(done.stderr)
    assert took < 3, f"the interpreter took {took:.1f}s to exit (a pool left open waits 5 s)"


def test_a_command_exits_at_once(url: str, tmp_path: Path, env: dict[str, str]) -> None:
    if url == "memory://":
        pytest.skip("a worker process on memory:// shares its queue with nobody")
    env = {**env, "ULTIMAT3_JOBS_URL": url, "FAULT_LEDGER": str(tmp_path / "ledger.txt")}
    cli = [sys.executable, "-m", "ultimat3.jobs", "--app", "faultjobs:app"]
    migrate = subprocess.run([*cli, "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert migrate.returncode == 0, migrate.stderr
    _quiet(migrate.stderr)
    worker = subprocess.Popen(
        [*cli, "worker", "--poll-interval", "200ms"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ledger = tmp_path / "ledger.txt"
        enqueue = "import faultjobs; faultjobs.ledger.enqueue({})"
        for args in ([sys.executable, "-c", enqueue], [*cli, "jobs", "list"]):
            done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            _quiet(done.stderr)
        wait_until(lambda: "done" in (ledger.read_text() if ledger.exists() else ""), 30, "a job")
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _, stderr = worker.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, stderr
    assert " INFO stopped: 1 completed" in stderr
    _quiet(stderr)
    assert took < 3, f"the worker took {took:.1f}s to exit after SIGTERM"
