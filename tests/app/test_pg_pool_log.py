"""psycopg_pool's records are the worker's: a PostgreSQL outage under a real worker process
prints one ``jobs.database.unavailable`` line and one ``jobs.database.recovered`` line, and
none of psycopg_pool's own warnings."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App

from .processes import HERE, ledger, wait_until
from .test_pg_faults import FAST, env

pytestmark = pytest.mark.postgres
WORKER = (sys.executable, "-m", "ultimat3.jobs", "--app", "faultjobs:app", "worker")
__all__ = ["env"]  # fixtures


def test_an_outage_is_one_line_and_its_recovery_another(
    fault_app: App,
    env: dict[str, str],
    cluster: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import faultjobs

    fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0.05}] * 100)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*WORKER, "--concurrency", "4", *FAST],
            env=env,
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        wait_until(lambda: len(ledger(env)) >= 10, 30, "the drain to be under way")
        cluster.stop("immediate")
        time.sleep(4)  # the pool retries its connections meanwhile
        cluster.start()
        wait_until(
            lambda: fault_app.count_jobs(state="completed") == 100, 90, "every job to complete"
        )
        assert not caplog.records or all(r.name != "psycopg.pool" for r in caplog.records), (
            "this process's driver owns its pool's records too"
        )
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    assert text.count("jobs.database.unavailable") == 1, text
    assert text.count("jobs.database.recovered") == 1, text
    for raw in ("WARNING error connecting", "WARNING discarding", "WARNING reconnection"):
        assert raw not in text, text  # psycopg_pool's own lines
    assert text.index("jobs.database.unavailable") < text.index("jobs.database.recovered")
