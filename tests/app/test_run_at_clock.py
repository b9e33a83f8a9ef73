"""Due times the worker and the rescuer ask for follow the database's clock, not the host's.

A worker whose host clock is two hours off (ahead or behind) still retries a failed job, and
wakes a snoozed one, its delay after the database's ``now()``; the rescuer makes a lost job due
at the database's now; and the grace for a job whose name the worker lacks is measured on the
database's clock. Before, each of these was the host's time plus the delay, written as a time:
on PostgreSQL a retry landed two hours late (or ran at once), a rescued job waited two hours,
and an unknown job was dead-lettered on its first claim. On SQLite and in memory the database's
clock is the host's, read by the driver (``clock.wall_ns``), never the worker's ``Clock``.

The last test does it with a real worker process whose wall clock is shifted
(``clockshift/sitecustomize.py``) on PostgreSQL: before, a retry with a 2 s back-off and a
2 s snooze ran 0.10 s after the attempt before with the clock 2 h behind, and not within 30 s
with it 2 h ahead; now 2.05-2.10 s after it either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App, JobState, Retry, Snooze, job
from ultimat3.jobs.clock import SystemClock
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.maintenance import Maintenance, MaintenanceConfig
from ultimat3.jobs.records import ClaimParams, Cycle, NewJob
from ultimat3.jobs.testing import FakeClock, drain

from .processes import HERE, wait_until

DELAY = timedelta(seconds=2)
SHIFTS = [timedelta(hours=2), -timedelta(hours=2)]


class ShiftedClock(SystemClock):
    """The system clock on a host whose wall clock is ``by`` off: ``pinned()`` stays None, so
    the database keeps its own clock."""

    def __init__(self, by: timedelta) -> None:
        self.by = by

    def now(self) -> datetime:
        return super().now() + self.by


@job(retry=Retry(attempts=3, backoff="fixed", delay="2s", jitter=False))
def fails(input: Any) -> None:
    raise ValueError("down")


@job
def snoozes(input: Any) -> None:
    raise Snooze("2s")


@pytest.fixture(params=SHIFTS, ids=["ahead", "behind"])
def shifted(
    request: pytest.FixtureRequest, url: str, make_module: Callable[..., Any]
) -> Iterator[App]:
    module = make_module("run_at_clock_jobs", fails=fails, snoozes=snoozes)
    app = App(url, modules=[module], clock=ShiftedClock(request.param))
    yield app
    app.close()


def _due_in(app: App, run: Callable[[], object], job_id: str) -> tuple[datetime, datetime, Any]:
    before = app.driver.database_now()
    run()
    after = app.driver.database_now()
    return before, after, app.get_job(job_id)


def test_a_retry_is_due_its_delay_after_the_databases_clock(shifted: App) -> None:
    made = fails.enqueue({})
    before, after, stored = _due_in(shifted, lambda: drain(shifted), made.id)
    assert (stored.state, stored.attempt) == (JobState.SCHEDULED, 1)
    assert before + DELAY <= stored.run_at <= after + DELAY


def test_a_snooze_is_due_its_delay_after_the_databases_clock(shifted: App) -> None:
    made = snoozes.enqueue({})
    before, after, stored = _due_in(shifted, lambda: drain(shifted), made.id)
    assert (stored.state, stored.attempt) == (JobState.SCHEDULED, 0)
    assert before + DELAY <= stored.run_at <= after + DELAY


@pytest.mark.parametrize("alone", [False, True], ids=["beside-others", "alone"])
def test_a_rescued_job_is_due_at_the_databases_now(shifted: App, alone: bool) -> None:
    """A worker claimed the job an hour ago (on the database's clock) and died: the rescuer,
    on a host whose clock is off, makes it due now on the database's clock (its retry delay
    after that when it ran alone, and the attempt counts)."""
    db = shifted.driver
    long_ago = db.database_now() - timedelta(hours=1)
    made = fails.enqueue({}, run_at=long_ago)
    lease = timedelta(seconds=30)
    [claimed] = db.job_cycle(
        Cycle(claim=ClaimParams(("default",), 1, lease, "gone", now=long_ago)), now=long_ago
    ).claimed
    assert claimed.id == made.id
    if alone:  # rescued then (isolated), and claimed alone: an hour ago too
        then = FakeClock(long_ago + lease * 2)
        assert Maintenance(db, shifted.registry.job_named, then, grace=timedelta(0)).rescue() == [
            made.id
        ]
        params = ClaimParams(("default",), 1, lease, "gone", now=then.now(), isolated=True)
        [claimed] = db.job_cycle(Cycle(claim=params), now=then.now()).claimed
    rescuer = Maintenance(db, shifted.registry.job_named, shifted.clock, grace=timedelta(0))
    before, after, stored = _due_in(shifted, rescuer.rescue, made.id)
    assert stored.errors[-1].kind == "worker_lost"
    if alone:
        assert (stored.state, stored.attempt) == (JobState.SCHEDULED, 1)
        assert before + DELAY <= stored.run_at <= after + DELAY
    else:
        assert (stored.state, stored.attempt) == (JobState.AVAILABLE, 0)
        assert before <= stored.run_at <= after


def test_the_grace_of_an_unknown_name_is_measured_on_the_databases_clock(shifted: App) -> None:
    """A job whose name the worker lacks, due just now, is given back for free (its due time
    kept), however far the worker's clock is off; not dead-lettered because the host's clock
    is ahead of the job's due time by more than ``unknown_grace``."""
    job_id = uuid7()
    due = shifted.driver.database_now()
    shifted.driver.job_insert_many(
        [NewJob(job_id, "deploy.newer", "default", "{}", job_id, max_attempts=5, run_at=due)]
    )
    shifted.worker(queues=["default"], unknown_grace="1h").drain()
    stored = shifted.get_job(job_id)
    assert (stored.state, stored.attempt, stored.errors) == (JobState.AVAILABLE, 0, ())
    assert stored.run_at == due


@pytest.mark.postgres
@pytest.mark.parametrize("shift", [7200, -7200], ids=["ahead", "behind"])
def test_a_worker_process_with_a_shifted_clock_retries_and_wakes_on_time(
    shift: int, pg_dsn: str, tmp_path: Path
) -> None:
    """A real worker process whose wall clock is 2 h off (the database's is right) runs a
    failed job's retry, and a snoozed job, 2 s after the attempt before, as their delays say:
    not 2 h later, and not at once."""
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(pg_dsn)
    url = f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"
    (tmp_path / "shift").write_text(str(shift * 10**9))
    ledger = tmp_path / "ledger.txt"
    env = {
        **os.environ,
        "ULTIMAT3_JOBS_URL": url,
        "RUNAT_LEDGER": str(ledger),
        "CLOCKSHIFT_FILE": str(tmp_path / "shift"),
        "PYTHONPATH": os.pathsep.join(
            [str(HERE / "clockshift"), str(HERE), os.environ.get("PYTHONPATH", "")]
        ),
    }
    run = [sys.executable, "-m", "ultimat3.jobs", "--app", "runatjobs:app"]
    subprocess.run([*run, "migrate"], env=env, cwd=HERE, check=True, capture_output=True)
    with (tmp_path / "worker.log").open("w") as log:
        worker = subprocess.Popen(
            [*run, "worker", "--poll-interval", "100ms"], env=env, cwd=HERE, stdout=log, stderr=log
        )
    try:
        app = App(url)
        try:
            ids = [uuid7(), uuid7()]
            app.driver.job_insert_many(
                [
                    NewJob(ids[0], "flaky", "default", "{}", ids[0], max_attempts=2),
                    NewJob(ids[1], "sleepy", "default", "{}", ids[1], max_attempts=1),
                ]
            )
            wait_until(
                lambda: all(
                    app.get_job(i).state in (JobState.DEAD, JobState.COMPLETED) for i in ids
                ),
                30,
                "the retry and the snoozed job to run",
            )
        finally:
            app.close()
    finally:
        worker.terminate()
        worker.wait(30)
    starts: dict[str, list[float]] = {}
    for line in ledger.read_text().splitlines():
        job_id, _, at = line.split()
        starts.setdefault(job_id, []).append(float(at))
    assert sorted(len(s) for s in starts.values()) == [2, 2]
    gaps = [s[1] - s[0] for s in starts.values()]
    print(f"gaps between the two starts (s), worker clock {shift:+d} s: {gaps}")
    assert all(2.0 <= gap < 5.0 for gap in gaps), gaps


@pytest.mark.parametrize("finished_ago", [timedelta(minutes=1), timedelta(minutes=90)])
def test_retention_counts_on_the_databases_clock(shifted: App, finished_ago: timedelta) -> None:
    """With a retention of 1 h, a job finished a minute ago (on the database's clock) stays and
    one finished 90 minutes ago goes, whatever the pruning host's clock says. Before, a host
    2 h ahead pruned every finished row (ending dedupe windows, losing results early), and one
    2 h behind kept rows 2 h too long."""
    db = shifted.driver
    finished_at = db.database_now() - finished_ago
    made = fails.enqueue({}, run_at=finished_at)
    params = ClaimParams(("default",), 1, timedelta(seconds=30), "w", now=finished_at)
    [claimed] = db.job_cycle(Cycle(claim=params), now=finished_at).claimed
    done = db.job_cycle(Cycle(completes=[claimed.lease]), now=finished_at)
    assert done.completed == {made.id}
    config = MaintenanceConfig(retention=timedelta(hours=1))
    pruner = Maintenance(db, shifted.registry.job_named, shifted.clock, config)
    assert pruner.prune() == (1 if finished_ago > config.retention else 0)
    assert (db.job_get(made.id) is None) == (finished_ago > config.retention)
