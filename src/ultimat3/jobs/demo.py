"""``ultimat3-jobs demo``: a short tour of the guarantees, on a fresh SQLite file.

A small shop writes orders and enqueues their jobs in the same transaction. The tour shows a
rolled-back request whose job never runs, a duplicate enqueue collapsed by its idempotency
key, a flaky job retrying on its printed schedule, and a poison job parked in dead-letter and
retried through the API once "fixed". A real worker runs in background threads; the story is
checked as it goes, and the command exits 1 if any guarantee did not hold.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import tempfile
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from ultimat3.jobs import events
from ultimat3.jobs.app import App
from ultimat3.jobs.cli.context import clip
from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.job import current_app, job
from ultimat3.jobs.records import Job, JobState
from ultimat3.jobs.retry import Retry, retry_schedule

__all__ = ["charge_legacy_gateway", "run_demo", "send_receipt", "sync_inventory"]

_flaky_calls: list[float] = []
_gateway_fixed = threading.Event()
#: The events the tour prints, and the state each one's line shows.
_STATE_OF = {
    "jobs.job.started": JobState.RUNNING,
    "jobs.job.completed": JobState.COMPLETED,
    "jobs.job.retried": JobState.SCHEDULED,
    "jobs.job.dead": JobState.DEAD,
}


def _app() -> App:
    app = current_app.get()
    assert isinstance(app, App)
    return app


@job(queue="mail", idempotency_key=lambda order: f"order-{order['order']}")
def send_receipt(order: dict[str, Any]) -> None:
    """Email the receipt: recorded in the same database, once per order."""
    with _app().transaction() as conn:
        conn.execute(
            "insert into receipts(order_id, sent_at) values (?, ?)",
            (order["order"], _app().clock.now().timestamp()),
        )


@job(retry=Retry(attempts=4, backoff="exponential", delay="400ms", jitter=False))
def sync_inventory(order: dict[str, Any]) -> None:
    """Talks to a warehouse API that times out twice, then answers."""
    _flaky_calls.append(_app().clock.monotonic())
    if len(_flaky_calls) <= 2:
        raise TimeoutError("warehouse API did not answer within 2s")


@job(retry=Retry(attempts=3, backoff="fixed", delay="200ms", jitter=False))
def charge_legacy_gateway(order: dict[str, Any]) -> None:
    """A gateway with a bug: every attempt fails until someone fixes it."""
    if not _gateway_fixed.is_set():
        raise ValueError(f"gateway rejected amount {order['amount']!r}: expected cents as int")


def _say(step: str, text: str) -> None:
    click.echo(click.style(f"[{step}] ", fg="cyan", bold=True) + text)


def _ok(text: str) -> None:
    click.echo(click.style("    ✓ ", fg="green") + text)


def _bad(text: str) -> None:
    click.echo(click.style("    ✗ ", fg="red") + text)


class _Watcher(threading.Thread):
    """Prints each job's state changes as they happen (the live part of the tour), from the
    worker's events: every attempt of every job gets its ``running`` line and its outcome's,
    in the order they happened. The events are queued by the worker's threads and printed by
    this one, which reads the error's message from the database. Times are the app's clock's."""

    def __init__(self, app: App, started: float) -> None:
        super().__init__(name="demo-watcher", daemon=True)
        self.app = app
        self.started = started
        #: Events to print; None (put by ``close``) ends the thread once the rest are printed.
        self.queued: queue.Queue[events.Event | None] = queue.Queue()
        #: Per job id, the state its last printed line showed.
        self.printed: dict[str, JobState] = {}
        self.changed = threading.Condition()
        self.subscription = events.subscribe(self.queued.put, names=_STATE_OF)

    def run(self) -> None:
        while (event := self.queued.get()) is not None:
            self._print(event)

    def close(self) -> None:
        self.subscription.close()
        self.queued.put(None)
        self.join()

    def wait_for(self, job_id: str, states: set[JobState], timeout: float = 10.0) -> Job:
        """The job, once its line in one of ``states`` is printed (or ``timeout`` passed)."""
        with self.changed:
            self.changed.wait_for(lambda: self.printed.get(job_id) in states, timeout)
        return self.app.get_job(job_id)

    def _print(self, event: events.Event) -> None:
        fields = event.fields
        job_id, name = str(fields["job_id"]), str(fields["job"])
        state = _STATE_OF[event.name]
        note = ""
        if state in (JobState.SCHEDULED, JobState.DEAD):
            errors = self.app.get_job(job_id).errors
            kind = errors[-1].kind if errors else fields.get("error")
            message = errors[-1].message if errors else ""
            message = clip(message, 60)
            note = f"  ({kind}: {message})"
            if state is JobState.SCHEDULED:
                retry_at = datetime.fromisoformat(str(fields["retry_at"]))
                wait = (retry_at - self.app.clock.now()).total_seconds()
                note += f", next try in {max(0.0, wait):.1f}s"
        colour = {
            JobState.COMPLETED: "green",
            JobState.DEAD: "red",
            JobState.RUNNING: "yellow",
        }.get(state, "white")
        attempts = _attempts(self.app, name, int(fields["attempt"]), int(fields["max_attempts"]))
        click.echo(
            f"      {self.app.clock.monotonic() - self.started:5.2f}s  {name:<22} "
            + click.style(f"{state.value:<9}", fg=colour)
            + f" attempt {attempts}{note}"
        )
        with self.changed:
            self.printed[job_id] = state
            self.changed.notify_all()


def _attempts(app: App, name: str, attempt: int, max_attempts: int) -> str:
    """``2/3``; past the job's planned attempts, what an operator's retry granted:
    ``4/3+1`` (``app.retry_jobs`` gives a dead job one more)."""
    handle = app.registry.jobs.get(name)
    planned = handle.retry.attempts if handle is not None else max_attempts
    if max_attempts > planned:
        return f"{attempt}/{planned}+{max_attempts - planned}"
    return f"{attempt}/{max_attempts}"


def _errors(j: Job, width: int = 50) -> str:
    """The error column of the closing table: a job that completed after failing says how
    often it failed; one that has not completed shows its last error, cut with an ellipsis."""
    if not j.errors:
        return ""
    if j.state is JobState.COMPLETED:
        return f"{len(j.errors)} before it completed"
    return clip(f"{j.errors[-1].kind}: {j.errors[-1].message}", width)


def run_demo(directory: str | None = None) -> int:
    """Run the tour; return the exit code (0 when every guarantee held). Without
    ``directory`` the SQLite file lives in a temporary directory removed at the end."""
    if directory:
        return _tour(Path(directory))
    with tempfile.TemporaryDirectory(prefix="ultimat3-jobs-demo-") as folder:
        return _tour(Path(folder))


def _tour(folder: Path) -> int:
    _flaky_calls.clear()
    _gateway_fixed.clear()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "demo.sqlite3"
    for leftover in folder.glob("demo.sqlite3*"):
        leftover.unlink()
    app = App(f"sqlite:///{path}", modules=[sys.modules[__name__]])
    failures: list[str] = []
    started = app.clock.monotonic()
    watcher = _Watcher(app, started)
    # The tour tells its own story; the library's warnings (a dead job) would interleave.
    logging.getLogger("ultimat3.jobs").setLevel(logging.ERROR)

    def check(ok: bool, good: str, bad: str) -> None:
        if ok:
            _ok(good)
        else:
            _bad(bad)
            failures.append(bad)

    click.echo(click.style("ultimat3-jobs demo", bold=True) + f"  (database: {path})\n")
    with app.transaction() as conn:
        conn.execute("create table orders(id integer primary key, amount integer not null)")
        conn.execute("create table receipts(order_id integer not null, sent_at real not null)")

    _say("schedule", "each job's retry schedule, as `ultimat3-jobs schedule` prints it:")
    for name, handle in sorted(app.registry.jobs.items()):
        steps = ", ".join(format_duration(d) for d in retry_schedule(handle.retry)) or "none"
        how = "jittered: each wait between half and all of it" if handle.retry.jitter else "exact"
        click.echo(
            f"      {name:<22} {handle.retry.attempts} attempts, retries after: {steps} ({how})"
        )

    worker = app.worker(concurrency=4, poll_interval="100ms", shutdown_grace="2s")
    worker.start()
    watcher.start()
    try:
        click.echo()
        _say("1 commit", "order #1001 and its receipt job are written in ONE transaction")
        with app.transaction() as conn:
            conn.execute("insert into orders(id, amount) values (1001, 4200)")
            receipt = send_receipt.enqueue({"order": 1001})
        done = watcher.wait_for(receipt.id, {JobState.COMPLETED})
        check(
            done.state is JobState.COMPLETED,
            "receipt for #1001 sent",
            f"receipt job ended {done.state}",
        )

        click.echo()
        _say("2 rollback", "order #1002's payment fails after the enqueue: the request rolls back")
        rolled_back_id = ""
        try:
            with app.transaction() as conn:
                conn.execute("insert into orders(id, amount) values (1002, 990)")
                rolled_back_id = send_receipt.enqueue({"order": 1002}).id
                raise RuntimeError("card declined")
        except RuntimeError:
            pass
        app.clock.sleep(0.3)
        with app.transaction() as conn:
            orders = conn.execute("select count(*) from orders where id = 1002").fetchone()[0]
        ghost = app.driver.job_get(rolled_back_id)
        check(
            orders == 0 and ghost is None,
            "no order #1002 and no job: the rollback took the job with it",
            "a rolled-back job exists",
        )

        click.echo()
        _say("3 dedupe", "the client retries its request for #1001: same idempotency key")
        again = send_receipt.enqueue({"order": 1001})
        check(
            again.deduped and again.id == receipt.id,
            f"deduped=True, the same job id {again.id[:13]}…, no second receipt",
            f"duplicate was not deduped: {again}",
        )

        click.echo()
        schedule = ", ".join(format_duration(d) for d in retry_schedule(sync_inventory.retry))
        _say("4 retry", f"sync_inventory fails twice; its schedule says retry after {schedule}")
        flaky = sync_inventory.enqueue({"order": 1001})
        done = watcher.wait_for(flaky.id, {JobState.COMPLETED, JobState.DEAD}, timeout=15)
        gaps = [b - a for a, b in itertools.pairwise(_flaky_calls)]
        planned = [d.total_seconds() for d in retry_schedule(sync_inventory.retry)]
        on_time = len(gaps) == 2 and all(
            p <= g < p + 1.5 for g, p in zip(gaps, planned, strict=False)
        )
        check(
            done.state is JobState.COMPLETED and on_time,
            "succeeded on attempt 3; retries came after "
            + ", ".join(f"{g:.2f}s" for g in gaps)
            + f" (planned {schedule})",
            f"flaky job ended {done.state} with gaps {gaps}",
        )

        click.echo()
        _say(
            "5 dead-letter", "charge_legacy_gateway has a bug: 3 attempts, then parked, not dropped"
        )
        poison = charge_legacy_gateway.enqueue({"order": 1001, "amount": "42.00"})
        dead = watcher.wait_for(poison.id, {JobState.DEAD}, timeout=10)
        check(
            dead.state is JobState.DEAD and len(dead.errors) == 3,
            f"dead after {dead.attempt} attempts, every error kept ({dead.errors[-1].kind if dead.errors else '-'})",
            f"poison job ended {dead.state} with {len(dead.errors)} errors",
        )
        _say("5 dead-letter", "the bug is fixed and an operator retries it: app.retry_jobs([id])")
        _gateway_fixed.set()
        app.retry_jobs([poison.id])
        revived = watcher.wait_for(poison.id, {JobState.COMPLETED}, timeout=10)
        check(
            revived.state is JobState.COMPLETED,
            f"completed on attempt {revived.attempt}, the one more that the retry granted; "
            f"history of {len(revived.errors)} errors kept",
            f"retried job ended {revived.state}",
        )
    finally:
        worker.stop()
        watcher.close()

    with app.transaction() as conn:
        receipts = conn.execute("select count(*) from receipts").fetchone()[0]
    check(receipts == 1, "exactly one receipt row exists", f"{receipts} receipt rows exist")

    click.echo()
    click.echo(click.style("what happened", bold=True))
    click.echo(f"  {'job':<22} {'state':<10} {'attempts':<9} errors")
    for j in sorted(app.list_jobs(limit=100), key=lambda j: j.id):
        click.echo(
            f"  {j.name:<22} {j.state.value:<10} "
            f"{_attempts(app, j.name, j.attempt, j.max_attempts):<9} "
            f"{_errors(j)}".rstrip()
        )
    click.echo(
        f"  worker: {worker.stats.completed} completed, {worker.stats.failed} retried, "
        f"{worker.stats.dead} dead; rolled back 1, deduped 1"
    )
    app.close()
    click.echo()
    if failures:
        click.secho(f"{len(failures)} guarantee(s) did not hold", fg="red", bold=True)
        return 1
    took = app.clock.monotonic() - started
    click.secho(f"all guarantees held in {took:.1f}s", fg="green", bold=True)
    return 0
