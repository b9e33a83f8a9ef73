"""A rolling deploy with real worker processes on SQLite and PostgreSQL: a job whose name the
running (old) worker lacks waits for a worker that knows it, at no cost in attempts, and is
dead-lettered as ``unknown_job`` only after ``--unknown-grace``. (Before, the old worker failed
it as ``unknown_job`` on each claim: 3-4 of 5 attempts went in about 20 s.)
"""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from ultimat3.jobs import App, JobState, job
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import NewJob

from .processes import wait_until

NEW_NAME = "deploy.newer"


@job(name=NEW_NAME)
def newer(input: Any) -> str:
    return "ran"


@pytest.fixture
def new_app(env: dict[str, str]) -> Iterator[App]:
    """The new version of the app: it knows ``deploy.newer``."""
    module = types.ModuleType("deploy_new_version")
    module.newer = newer  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    app = App(env["ULTIMAT3_JOBS_URL"], modules=[module])
    yield app
    app.close()
    sys.modules.pop(module.__name__, None)


def _stray(app: App) -> str:
    """A job of the new version, written where the old worker will see it first."""
    job_id = uuid7()
    app.driver.job_insert_many([NewJob(job_id, NEW_NAME, "default", "{}", job_id, max_attempts=5)])
    return job_id


def test_an_old_worker_gives_a_new_job_back_for_free_and_the_new_worker_runs_it(
    fault_app: App, new_app: App, spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    import faultjobs

    job_id = _stray(fault_app)
    spawn("--concurrency", "2", "--poll-interval", "100ms")
    wait_until(lambda: fault_app.get_job(job_id).attempted_at is not None, 30, "a claim")
    first = fault_app.get_job(job_id)
    # The old worker stays busy meanwhile: its other jobs run.
    known = [r.id for r in fault_app.enqueue_many(faultjobs.ledger, [{"sleep": 0}] * 5)]
    wait_until(lambda: fault_app.count_jobs(state="completed") == 5, 30, "the old jobs")
    # A job enqueued now runs on the old worker while the stray one, older, is available too:
    # the old worker's claims (two free slots) pass over it.
    later = faultjobs.ledger.enqueue({"sleep": 0}).id
    wait_until(
        lambda: fault_app.get_job(later).state is JobState.COMPLETED, 30, "a job enqueued after"
    )
    waiting = fault_app.get_job(job_id)
    assert (waiting.state, waiting.attempt, waiting.errors) == (JobState.AVAILABLE, 0, ())
    assert waiting.attempted_at == first.attempted_at, "the old worker passes over it"
    assert all(fault_app.get_job(i).state is JobState.COMPLETED for i in known)
    new_app.worker().drain()
    done = new_app.get_job(job_id)
    assert (done.state, done.attempt, done.errors) == (JobState.COMPLETED, 1, ())


def test_a_job_no_worker_knows_ends_dead_after_the_grace(
    fault_app: App, spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    job_id = _stray(fault_app)
    spawn("--concurrency", "2", "--poll-interval", "100ms", "--unknown-grace", "1s")
    wait_until(lambda: fault_app.get_job(job_id).state is JobState.DEAD, 30, "the grace to end")
    dead = fault_app.get_job(job_id)
    assert dead.attempt == 1, dead
    assert [e.kind for e in dead.errors] == ["unknown_job"]
    assert NEW_NAME in dead.errors[0].message and "ledger" in dead.errors[0].message
    assert dead.finished_at is not None
    assert dead.finished_at - dead.run_at >= timedelta(seconds=1), "not before the grace"
