"""Reading a job's result: wait for the job to finish, then decode what its handler returned.

``app.result(job_id, timeout=...)`` (and ``handle.result``, ``app.result_async``) is built on
``Driver.job_wait``, which sleeps on the database's wake-ups (LISTEN/NOTIFY on PostgreSQL, or a
read every ``?poll=`` seconds behind a transaction pooler; ``PRAGMA data_version`` on SQLite)
and never spins. What it returns or raises:

- completed: the result decoded from its JSON text (codecs applied; a dataclass or pydantic
  model comes back as the dict it was stored as), ``None`` for a handler that returned None;
- dead or cancelled: ``JobFailedError`` with the job's state, its last error (kind, message,
  traceback) or cancel reason;
- still unfinished at ``timeout``: ``ResultTimeoutError`` (also a ``TimeoutError``) with the
  job's state; ``timeout=None`` waits as long as it takes;
- no such job (never enqueued, or pruned after its retention): ``JobNotFoundError``.

The async variant waits on a worker thread in slices of at most a second, so cancelling the
awaiting task frees that thread soon after.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from ultimat3.jobs.clock import Clock, SystemClock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.duration import DurationInput, format_duration, to_timedelta
from ultimat3.jobs.errors import JobFailedError, JobNotFoundError, ResultTimeoutError
from ultimat3.jobs.records import ACTIVE_STATES, Job, JobState
from ultimat3.jobs.serialization import Serializer

__all__ = ["outcome", "wait_result", "wait_result_async"]

#: The waits are real ones on the database (as every driver's ``job_wait``), so their deadline
#: is on the system's clock unless a caller passes another.
_SYSTEM = SystemClock()
#: The longest one driver wait lasts before the loop goes round again (a long or no timeout).
_SYNC_SLICE = 60.0
#: The same for the async variant, whose wait holds a thread: cancelling it frees the thread
#: within this.
_ASYNC_SLICE = 1.0


def outcome(job: Job | None, job_id: str, serializer: Serializer, waited: float | None) -> Any:
    """What a finished ``job`` gives its reader: the decoded result, or the error that says why
    there is none. ``waited`` is the timeout that passed (for the message) when unfinished."""
    if job is None:
        raise JobNotFoundError(
            f"no job has the id {job_id!r}",
            fix="check the id; a finished job's row (and its result) is pruned after the "
            "worker's retention (1 day by default)",
        )
    if job.state is JobState.COMPLETED:
        return None if job.result is None else serializer.loads(job.result)
    if job.state is JobState.DEAD:
        last = job.errors[-1] if job.errors else None
        why = f"{last.kind}: {last.message}" if last is not None else "no error was recorded"
        raise JobFailedError(
            f"job {job.id} ({job.name}) is dead after {job.attempt} attempt(s), so it has no "
            f"result; its last error: {why}",
            fix=f"see every attempt with `ultimat3-jobs jobs show {job.id}`; after fixing the "
            f"cause, `ultimat3-jobs jobs retry {job.id}` runs it again",
            job=job,
        )
    if job.state is JobState.CANCELLED:
        raise JobFailedError(
            f"job {job.id} ({job.name}) was cancelled ({job.cancel_reason or 'no reason'}), so "
            "it has no result",
            fix=f"`ultimat3-jobs jobs retry {job.id}` runs it again, if it should run",
            job=job,
        )
    label = "the timeout" if waited is None else format_duration(timedelta(seconds=waited))
    raise ResultTimeoutError(
        f"job {job.id} ({job.name}) is still {job.state.value} after {label}",
        fix="wait longer (timeout=...), check that a worker serves its queue "
        f"{job.queue!r} (`ultimat3-jobs queues`), or read it later",
        job=job,
    )


def wait_result(
    driver: Driver,
    serializer: Serializer,
    job_id: str,
    *,
    timeout: DurationInput | None,
    tenant_id: str | None = None,
    clock: Clock | None = None,
) -> Any:
    wait = _Wait(timeout, _SYNC_SLICE, clock or _SYSTEM)
    while True:
        job = driver.job_wait(job_id, timeout=wait.span(), tenant_id=tenant_id)
        if wait.over(job):
            return outcome(job, job_id, serializer, wait.limit)


async def wait_result_async(
    driver: Driver,
    serializer: Serializer,
    job_id: str,
    *,
    timeout: DurationInput | None,
    tenant_id: str | None = None,
    clock: Clock | None = None,
) -> Any:
    wait = _Wait(timeout, _ASYNC_SLICE, clock or _SYSTEM)
    while True:
        job = await asyncio.to_thread(
            driver.job_wait, job_id, timeout=wait.span(), tenant_id=tenant_id
        )
        if wait.over(job):
            return outcome(job, job_id, serializer, wait.limit)


class _Wait:
    """The deadline of one ``result`` call on ``clock``'s monotonic time, waited for in slices
    of at most ``most``."""

    __slots__ = ("clock", "deadline", "limit", "most")

    def __init__(self, timeout: DurationInput | None, most: float, clock: Clock) -> None:
        self.clock = clock
        seconds = None if timeout is None else to_timedelta(timeout, name="timeout")
        self.limit = None if seconds is None else max(0.0, seconds.total_seconds())
        self.deadline = None if self.limit is None else clock.monotonic() + self.limit
        self.most = most

    def span(self) -> float:
        if self.deadline is None:
            return self.most
        return min(self.most, max(0.0, self.deadline - self.clock.monotonic()))

    def over(self, job: Job | None) -> bool:
        """The job finished (or is gone), or the deadline passed."""
        if job is None or job.state not in ACTIVE_STATES:
            return True
        return self.deadline is not None and self.clock.monotonic() >= self.deadline
