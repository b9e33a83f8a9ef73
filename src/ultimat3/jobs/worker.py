"""The worker: claims due jobs, runs them, records what happened. Who owns a job, step by step:

1. **claim** loop: claims up to the free slots (plus a look-ahead while jobs are short) and
   gives each job a ``Run`` (``ultimat3.jobs.run``), its one owner in this worker; ``def``
   jobs queue for ``concurrency`` handler threads, ``async def`` jobs go to one event loop.
2. **handler**: ``run.start()`` (refused once released), prepares the input, waits until the
   start loop has *recorded the start* (``job_mark_started``), calls the function, turns what
   happened into one ``Outcome`` (``outcome_of``, shared by sync and async) and offers it with
   ``run.settle()``: the first settler wins (the handler, a lost lease, shutdown).
3. **flush** loop: one transaction per batch writes start marks, completions and failures
   (``job_settle_many``), fenced by each lease; a refused late write is counted in ``lost``.
   A slot frees once its run is settled and its handler has returned, so a sync job past its
   timeout keeps its lease until its thread ends.
4. **heartbeat** loop: asks the **renew** loop to renew held leases every heartbeat, tells
   handlers of lost ones (``ctx.cancelled``), marks timeouts, logs ``jobs.worker.stuck`` (and
   exits past ``stuck_limit``) and an event loop blocked by an async job. It never waits for
   the database: a renewal that cannot get through (a stalled connection) blocks the renew
   loop only, and a lease whose last confirmed renewal was sent ``lease - heartbeat/2`` ago is
   given up (``jobs.lease.lost``, ``ctx.cancelled``) before it can have expired in the
   database, so before it can have been rescued elsewhere. Not on a single-writer database
   (SQLite): there a stall holds every writer, the rescuer included, and the rescuer trusts
   an expiry only once writes have flowed for a full lease, so leases are kept through it.
5. **maintenance** loop: rescue and prune, on the one node elected for it.

A job whose worker dies before its start is recorded goes back with its attempt; one that had
started is rescued as ``worker_lost`` and *isolated*: a worker runs it alone (nothing else in
flight) until it returns. Every loop is a ``supervise.Loop``; a critical one (claim, flush,
heartbeat) that keeps failing unexpectedly stops the worker with ``exit_code`` 70, releasing
what it holds, for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType
from typing import Any, Literal

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import ConfigurationError, DeserializationError, JobsError
from ultimat3.jobs.ids import token
from ultimat3.jobs.job import Cancel, Enqueuer, JobContext, JobHandle, Snooze, current_app
from ultimat3.jobs.maintenance import (
    Maintenance,
    MaintenanceConfig,
    attempt_error,
    decide_failure,
    error_from_exception,
)
from ultimat3.jobs.records import ClaimParams, Failure, Job, Lease
from ultimat3.jobs.run import Run
from ultimat3.jobs.serialization import Serializer
from ultimat3.jobs.supervise import Loop

#: The exit code of a worker that stopped because a loop could not go on (EX_SOFTWARE).
FATAL_EXIT = 70
#: An event loop that has not run a callback for this long is reported as blocked.
_LOOP_BLOCKED_AFTER = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    #: Queues to serve; None serves every queue the app's registered jobs use.
    queues: tuple[str, ...] | None = None
    concurrency: int = 10
    lease: timedelta = timedelta(seconds=30)
    #: How often leases are renewed; None means a third of the lease. At most half the lease.
    heartbeat: timedelta | None = None
    #: The longest the worker goes without looking for due jobs (wake-ups make it sooner).
    poll_interval: timedelta = timedelta(seconds=1)
    shutdown_grace: timedelta = timedelta(seconds=10)
    rescue_interval: timedelta = timedelta(seconds=5)
    #: How often the maintenance node prunes (each pass deletes until nothing is past the
    #: retention); finished rows stay bounded near throughput x (retention + this).
    prune_interval: timedelta = timedelta(seconds=10)
    #: How long stuck threads (sync jobs past their timeout) may hold every slot before the
    #: worker exits for its supervisor to restart it; None: never.
    stuck_limit: timedelta | None = timedelta(minutes=5)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    worker_id: str = ""

    def __post_init__(self) -> None:
        if (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or not 1 <= self.concurrency <= 1000
        ):
            raise ConfigurationError(
                f"concurrency={self.concurrency!r} is not valid", fix="use an int from 1 to 1000"
            )
        if self.lease < timedelta(milliseconds=200):
            raise ConfigurationError(
                f"lease={self.lease} is too short", fix="use a lease of at least 200ms"
            )
        beat = self.heartbeat_interval
        if beat * 2 > self.lease:
            raise ConfigurationError(
                f"heartbeat={beat} is more than half the lease ({self.lease}): one late "
                "heartbeat would let the lease expire under a live job",
                fix=f"use heartbeat of at most {self.lease / 2} (the default is a third of "
                "the lease), or a longer lease",
            )
        for name in ("poll_interval", "rescue_interval", "prune_interval"):
            if getattr(self, name) <= timedelta(0):
                raise ConfigurationError(f"{name} must be positive", fix=f'use e.g. {name}="1s"')

    @property
    def heartbeat_interval(self) -> timedelta:
        return self.heartbeat if self.heartbeat is not None else self.lease / 3

    def heartbeat_every(self) -> float:
        return max(0.05, self.heartbeat_interval.total_seconds())


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    dead: int = 0
    snoozed: int = 0
    cancelled: int = 0
    released: int = 0
    #: Leases lost while running (rescued elsewhere, cancelled), and late writes refused.
    lost: int = 0
    rescued: int = 0


OutcomeKind = Literal["complete", "fail", "snooze", "cancel", "release"]


@dataclass
class Outcome:
    kind: OutcomeKind
    failure: Failure | None = None
    drop: bool = False
    run_at: datetime | None = None
    reason: str = ""


class _Held:
    """A job this worker holds: its ``Run`` state machine plus what the threads share."""

    __slots__ = (
        "cancelled",
        "confirmed",
        "deadline",
        "handle",
        "job",
        "lost",
        "mark",
        "run",
        "started_at",
        "task",
        "timed_out",
        "written",
    )

    def __init__(
        self, job: Job, handle: JobHandle[Any] | None, claimed_at: float | None = None
    ) -> None:
        self.job = job
        self.handle = handle
        #: When the request that last set this lease's expiry was sent (time.monotonic()):
        #: the claim, then each renewal the database confirmed. The lease lasts at least
        #: until this plus the lease, whatever the clocks say.
        self.confirmed = time.monotonic() if claimed_at is None else claimed_at
        self.run: Run[Outcome] = Run()
        self.cancelled = threading.Event()
        self.deadline: float | None = None
        self.started_at: float | None = None
        self.timed_out = False
        self.lost = False
        #: The outcome is in the database (or there is nothing left to write).
        self.written = False
        #: Resolved by the flush loop once the start is recorded (True) or cannot be (False).
        self.mark: concurrent.futures.Future[bool] | None = None
        self.task: concurrent.futures.Future[None] | None = None

    @property
    def lease(self) -> Lease:
        return self.job.lease


class Worker:
    """Runs jobs from a job database. Build it with ``app.worker(...)``."""

    def __init__(
        self,
        *,
        driver: Driver,
        handles: Callable[[str], JobHandle[Any] | None],
        queues: tuple[str, ...],
        serializer: Serializer,
        clock: Clock,
        app: Enqueuer,
        config: WorkerConfig | None = None,
    ) -> None:
        self.driver = driver
        self.handles = handles
        self.serializer = serializer
        self.clock = clock
        self.app = app
        self.config = config or WorkerConfig()
        self.queues = queues
        self.worker_id = (
            self.config.worker_id or f"{socket.gethostname()}:{os.getpid()}:{token()[:6]}"
        )
        self.stats = WorkerStats()
        self.maintenance = Maintenance(
            driver,
            handles,
            clock,
            self.config.maintenance,
            holder=self.worker_id,
            grace=self.config.lease,
        )
        #: 0 after a clean stop; FATAL_EXIT when a loop could not go on.
        self.exit_code = 0

        self._lock = threading.Lock()
        self._held: dict[Lease, _Held] = {}  # by lease: a job can have a zombie run and a new one
        self._wake = threading.Event()  # a slot freed, or a stop was asked for
        self._stop_claiming = threading.Event()
        self._hard_stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._started = False
        self._tasks: queue.SimpleQueue[_Held | None] = queue.SimpleQueue()
        #: What the flush loop writes: outcomes; and what the start loop records: starts.
        self._outcomes: queue.SimpleQueue[_Held | None] = queue.SimpleQueue()
        self._starts: queue.SimpleQueue[_Held | None] = queue.SimpleQueue()
        self._handlers: list[threading.Thread] = []
        self._loops: dict[str, Loop] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_seen = time.monotonic()
        self._loop_blocked = False
        self._signals_seen = 0
        self._isolating = False
        self._next_isolation_check = 0.0
        self._stuck_since: float | None = None
        self._next_beat = 0.0
        self._renew_now = threading.Event()  # the heartbeat asks the renew loop to go
        self._avg_run = 1.0  # seconds; starts "long", so look-ahead is earned by short jobs

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start claiming in background threads. Idempotent."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self._stopped.clear()
            self._stop_claiming.clear()
            self._hard_stop.clear()
            self.exit_code = 0
        for n in range(self.config.concurrency):
            thread = threading.Thread(
                target=self._handler_thread,
                args=(self._tasks,),
                name=f"ultimat3-jobs-handler-{n}",
                daemon=True,
            )
            self._handlers.append(thread)
            thread.start()
        halt = threading.Event()
        self._loops = {
            "claim": Loop(
                "claim", self._claim_step, on_fatal=self._fatal, stop=self._stop_claiming
            ),
            "flush": Loop("flush", self._flush_step, on_fatal=self._fatal, stop=halt),
            "start": Loop("start", self._start_step, on_fatal=self._fatal, stop=halt),
            "heartbeat": Loop("heartbeat", self._heartbeat_step, on_fatal=self._fatal, stop=halt),
            "renew": Loop("renew", self._renew_step, on_fatal=self._fatal, stop=halt),
            "maintenance": Loop("maintenance", self._maintenance_step, stop=self._stop_claiming),
        }
        self._halt = halt
        for loop in self._loops.values():
            loop.start()
        events.info(
            "jobs.worker.started",
            worker_id=self.worker_id,
            queues=",".join(self.queues),
            concurrency=self.config.concurrency,
        )

    def stop(self, grace: timedelta | float | None = None, *, wait: bool = True) -> None:
        """Stop claiming, let in-flight jobs finish for ``grace`` (default ``shutdown_grace``),
        release the rest without consuming their attempt, and stop every thread."""
        with self._lock:
            if not self._started:
                return
            first = not self._stop_claiming.is_set()
            self._stop_claiming.set()
        self._wake.set()
        if first:
            if grace is None:
                seconds = self.config.shutdown_grace.total_seconds()
            elif isinstance(grace, timedelta):
                seconds = grace.total_seconds()
            else:
                seconds = float(grace)
            threading.Thread(
                target=self._shutdown, args=(seconds,), name="ultimat3-jobs-stop", daemon=True
            ).start()
        if wait:
            self._stopped.wait()

    def stop_now(self) -> None:
        """Release in-flight jobs at once and stop (a second SIGTERM)."""
        self._hard_stop.set()
        self.stop(wait=False)

    def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Run until stopped: SIGTERM/SIGINT stop gracefully, a second one at once.
        ``exit_code`` says afterwards whether a loop could not go on."""
        previous: dict[int, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            while not self._stopped.wait(0.2):
                pass
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.stats

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        events.warning("jobs.worker.signal", signal=signum, count=self._signals_seen)
        if self._signals_seen == 1:
            self.stop(wait=False)
        else:
            self.stop_now()

    def _fatal(self, loop: str, exc: BaseException) -> None:
        """A critical loop cannot go on: release what we hold and stop, with a non-zero exit."""
        self.exit_code = FATAL_EXIT
        events.error("jobs.worker.fatal", loop=loop, error=type(exc).__name__)
        self.stop_now()

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def inflight(self) -> int:
        with self._lock:
            return len(self._held)

    # -- inline draining (tests, demos) ------------------------------------------------------

    def drain(self, *, max_jobs: int | None = None) -> WorkerStats:
        """Run due jobs in the calling thread until none is due; returns what happened.

        Meant for tests and scripts: no threads, no heartbeats (each job runs within its
        lease), handlers run one at a time, async ones on a private event loop. Isolated jobs
        are run too (one at a time is isolation enough)."""
        done = 0
        loop: asyncio.AbstractEventLoop | None = None
        try:
            while max_jobs is None or done < max_jobs:
                limit = self.config.concurrency
                if max_jobs is not None:
                    limit = min(limit, max_jobs - done)
                jobs = self._claim(limit, isolated=False) or self._claim(1, isolated=True)
                if not jobs:
                    break
                for job in jobs:
                    held = _Held(job, self.handles(job.name))
                    held.run.start()
                    self.driver.job_mark_started([held.lease], now=self.clock.pinned())
                    if held.handle is not None and held.handle.is_async:
                        loop = loop or asyncio.new_event_loop()
                        outcome = loop.run_until_complete(self._run_async(held))
                    else:
                        outcome = self._run_sync(held)
                    if outcome is not None and held.run.settle(outcome):
                        self._write([held])
                    done += 1
        finally:
            if loop is not None:
                loop.close()
        return self.stats

    # -- claiming ------------------------------------------------------------------------------

    def _claim(self, limit: int, *, isolated: bool) -> list[Job]:
        jobs = self.driver.job_claim(
            ClaimParams(
                queues=self.queues,
                limit=limit,
                lease_for=self.config.lease,
                worker_id=self.worker_id,
                now=self.clock.pinned(),
                isolated=isolated,
            )
        )
        self.stats.claimed += len(jobs)
        return jobs

    def _claim_step(self) -> float:
        poll = self.config.poll_interval.total_seconds()
        self._wake.clear()
        if self._stop_claiming.is_set():
            return 0.0
        now = time.monotonic()
        if not self._isolating and now >= self._next_isolation_check:
            self._next_isolation_check = now + min(poll, 1.0)
            self._isolating = self.driver.job_peek_isolated(self.queues, now=self.clock.pinned())
        if self._isolating:
            # Run one isolated job alone: wait until nothing else runs, then claim it.
            if self.inflight:
                self._wake.wait(poll)
                return 0.0
            jobs = self._claim(1, isolated=True)
            self._isolating = False
            for job in jobs:
                events.warning(
                    "jobs.job.isolated", job_id=job.id, job=job.name, attempt=job.attempt
                )
                self._dispatch(job)
                self._wait_until_idle(poll)
            return 0.0
        free = self._capacity() - self.inflight
        if free <= 0:
            self._wake.wait(poll)
            return 0.0
        jobs = self._claim(free, isolated=False)
        for job in jobs:
            self._dispatch(job)
        if len(jobs) == free:
            # Busy: claim again once half the threads' worth of slots is free, so claims (and
            # their start marks) come in batches rather than one job per freed slot.
            refill = max(1, self.config.concurrency // 2)
            while self._capacity() - self.inflight < refill and not self._stop_claiming.is_set():
                self._wake.wait(poll)
                self._wake.clear()
            return 0.0
        if jobs:
            return 0.0
        self.driver.wait_for_jobs(poll, self._wake)
        return 0.0

    def _capacity(self) -> int:
        """How many jobs this worker holds at most: its concurrency, plus twice as many queued
        locally while jobs are short (under 50 ms on average), so claims and their start marks
        come in batches. A queued job has not started: if the worker dies, it goes back with
        its attempt. Long jobs get no look-ahead (a job queued behind one would wait)."""
        concurrency = self.config.concurrency
        return concurrency + (2 * concurrency if self._avg_run < 0.05 else 0)

    def _note_duration(self, seconds: float) -> None:
        # Unsynchronised on purpose: an average that loses an update now and then is fine.
        self._avg_run = self._avg_run * 0.9 + seconds * 0.1

    def _wait_until_idle(self, poll: float) -> None:
        while self.inflight and not self._stop_claiming.is_set():
            self._wake.wait(poll)
            self._wake.clear()

    def _dispatch(self, job: Job) -> None:
        handle = self.handles(job.name)
        held = _Held(job, handle)
        with self._lock:
            self._held[held.lease] = held
        if handle is not None and handle.is_async:
            loop = self._event_loop()
            held.task = asyncio.run_coroutine_threadsafe(self._async_handler(held), loop)
        else:
            self._tasks.put(held)

    # -- handlers ------------------------------------------------------------------------------

    def _handler_thread(self, tasks: queue.SimpleQueue[_Held | None]) -> None:
        while True:
            held = tasks.get()
            if held is None:
                return
            try:
                if not held.run.start():
                    continue  # released at shutdown before it began
                # Everything but the call happens before the start is recorded, so that the
                # recorded start and the handler's first line are as close as threads allow.
                prepared = self._prepare(held)
                if isinstance(prepared, Outcome):
                    self._settle(held, prepared)
                    continue
                if not self._started_for_sure(self._mark_request(held)):
                    self._settle(held, Outcome("release"))
                    continue
                timeout = held.handle.timeout if held.handle is not None else None
                held.started_at = time.monotonic()
                if timeout is not None:
                    held.deadline = held.started_at + timeout.total_seconds()
                outcome = self._call_sync(held, *prepared)
                self._note_duration(time.monotonic() - held.started_at)
                if held.timed_out:
                    outcome = self._timeout_outcome(held)
                self._settle(held, outcome)
            except BaseException as exc:  # outcome_of catches all; this is the last resort
                self._settle(held, self._failed(held, exc))
            finally:
                held.run.returned()
                self._maybe_free(held)

    async def _async_handler(self, held: _Held) -> None:
        try:
            if not held.run.start():
                return
            if not await asyncio.wrap_future(self._mark_request(held)):
                self._settle(held, Outcome("release"))
                return
            held.started_at = time.monotonic()
            outcome = await self._run_async(held)
            self._note_duration(time.monotonic() - held.started_at)
            self._settle(held, outcome)
        except BaseException as exc:
            self._settle(held, self._failed(held, exc))
        finally:
            held.run.returned()
            self._maybe_free(held)

    def _settle(self, held: _Held, outcome: Outcome | None) -> None:
        if outcome is not None and held.run.settle(outcome):
            self._outcomes.put(held)

    def _mark_request(self, held: _Held) -> concurrent.futures.Future[bool]:
        """Ask the start loop to record that ``held`` starts; the future says whether the lease
        was still held when it did."""
        mark: concurrent.futures.Future[bool] = concurrent.futures.Future()
        held.mark = mark
        self._starts.put(held)
        return mark

    def _start_step(self) -> float:
        """Record every waiting start in one write (``job_mark_started``, which need not wait
        for a disk flush: a mark lost to a power cut only gives the attempt back)."""
        first = self._starts.get()
        if first is None:
            self._starts.put(None)  # stopping: keep returning until the loop sees the halt
            return 0.05
        batch = [first]
        while True:
            try:
                item = self._starts.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._starts.put(None)
                break
            batch.append(item)
        try:
            held = self.driver.job_mark_started([h.lease for h in batch], now=self.clock.pinned())
        except BaseException:
            for h in batch:  # not recorded, so not run: released (or lapsing, unstarted)
                if h.mark is not None and not h.mark.done():
                    h.mark.set_result(False)
            raise
        for h in batch:
            if h.mark is not None:
                h.mark.set_result(h.job.id in held)
        return 0.0

    def _started_for_sure(self, mark: concurrent.futures.Future[bool]) -> bool:
        try:
            return mark.result(timeout=self.config.lease.total_seconds())
        except concurrent.futures.TimeoutError:
            return False

    def _maybe_free(self, held: _Held) -> None:
        """Free the slot once nothing runs for the job and its outcome is written (or moot)."""
        if not held.run.free:
            return
        if held.run.outcome is not None and not held.written:
            return  # the flush loop frees it after writing
        self._free(held)

    def _free(self, held: _Held) -> None:
        with self._lock:
            self._held.pop(held.lease, None)
        self._wake.set()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="ultimat3-jobs-asyncio", daemon=True
                )
                thread.start()
                self._loop, self._loop_thread = loop, thread
                self._loop_seen = time.monotonic()
            return self._loop

    # -- writing outcomes ----------------------------------------------------------------------

    def _flush_step(self) -> float:
        first = self._outcomes.get()
        if first is None:
            self._halt.set()
            return 0.0
        batch = [first]
        while True:
            try:
                item = self._outcomes.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._outcomes.put(None)  # keep the sentinel for the next step
                break
            batch.append(item)
        try:
            self._write(batch)
        except BaseException:
            for held in batch:  # not written: back in line, in order, for the retry
                self._outcomes.put(held)
            if self._hard_stop.is_set():
                return 0.0
            raise
        for held in batch:
            held.written = True
            if held.run.free:
                self._free(held)
        return 0.0

    def _write(self, batch: list[_Held]) -> None:
        """Write a batch: completions and failures in one transaction (one commit), then the
        rarer snoozes, releases and cancels."""
        now = self.clock.pinned()
        kinds: dict[OutcomeKind, list[_Held]] = {}
        for held in batch:
            assert held.run.outcome is not None
            kinds.setdefault(held.run.outcome.kind, []).append(held)
        done = kinds.get("complete", [])
        fails = kinds.get("fail", [])
        failures = [h.run.outcome.failure for h in fails if h.run.outcome and h.run.outcome.failure]
        completed, failed = self.driver.job_settle_many(
            completes=[h.lease for h in done], failures=failures, now=now
        )
        if done:
            self.stats.completed += len(completed)
            self._note_lost([h for h in done if h.job.id not in completed])
            for h in done:
                if h.job.id in completed:
                    events.debug("jobs.job.completed", job_id=h.job.id, job=h.job.name)
        if fails:
            self._failed_written(fails, failed)
        for h in kinds.get("snooze", []) + kinds.get("release", []):
            outcome = h.run.outcome
            assert outcome is not None
            if self.driver.job_snooze(h.lease, outcome.run_at, now=now):
                if outcome.kind == "snooze":
                    self.stats.snoozed += 1
                else:
                    self.stats.released += 1
            else:
                self._note_lost([h])
        for h in kinds.get("cancel", []):
            outcome = h.run.outcome
            assert outcome is not None
            if self.driver.job_cancel(h.job.id, reason=outcome.reason, lease=h.lease, now=now):
                self.stats.cancelled += 1
            else:
                self._note_lost([h])

    def _failed_written(self, fails: list[_Held], failed: set[str]) -> None:
        self._note_lost([h for h in fails if h.job.id not in failed])
        drops = []
        for h in fails:
            outcome = h.run.outcome
            assert outcome is not None and outcome.failure is not None
            if h.job.id not in failed:
                continue
            if outcome.drop:
                drops.append(h.job.id)
            if outcome.failure.retry_at is None:
                self.stats.dead += 1
                events.warning(
                    "jobs.job.dead",
                    job_id=h.job.id,
                    job=h.job.name,
                    attempt=h.job.attempt,
                    error=outcome.failure.error.kind,
                )
            else:
                self.stats.failed += 1
                events.info(
                    "jobs.job.retrying",
                    job_id=h.job.id,
                    job=h.job.name,
                    attempt=h.job.attempt,
                    retry_at=outcome.failure.retry_at.isoformat(),
                    error=outcome.failure.error.kind,
                )
        if drops:
            self.driver.job_discard(drops)

    def _note_lost(self, refused: list[_Held]) -> None:
        """Writes that fencing refused: the lease had been lost (rescued, cancelled)."""
        for h in refused:
            if not h.lost:
                h.lost = True
                self.stats.lost += 1
                events.warning("jobs.lease.lost", job_id=h.job.id, job=h.job.name, late_write=True)

    # -- heartbeat, timeouts, stuck threads ---------------------------------------------------

    def _heartbeat_step(self) -> float:
        every = self.config.heartbeat_every()
        now = time.monotonic()
        with self._lock:
            held = list(self._held.values())
        for h in held:
            if (
                h.deadline is not None
                and now >= h.deadline
                and not h.timed_out
                and not h.run.settled
            ):
                h.timed_out = True
                h.cancelled.set()
                events.warning(
                    "jobs.job.timeout",
                    job_id=h.job.id,
                    job=h.job.name,
                    timeout=str(h.handle.timeout if h.handle else None),
                )
        self._check_stuck(held, now)
        self._check_event_loop(held, now)
        self._check_leases(held, now)
        if now >= self._next_beat:
            self._next_beat = now + every
            self._renew_now.set()
        if self._halt.is_set() and not held:
            return 0.0
        # Deadlines need a fine tick only while something runs; an idle worker wakes rarely.
        return min(0.1, every) if held else min(every, 0.5)

    def _check_leases(self, held: list[_Held], now: float) -> None:
        """Give up leases whose renewal has not been confirmed for ``lease - heartbeat/2``:
        the database may expire them half a heartbeat later, and then rescue the job (unless
        a stall of ours is every writer's: see the module docstring)."""
        if self.driver.single_writer:
            return
        limit = self.config.lease.total_seconds() - self.config.heartbeat_every() / 2
        for h in held:
            if not h.lost and not h.run.settled and now - h.confirmed >= limit:
                self._lose(h, unconfirmed_for=round(now - h.confirmed, 3))

    def _renew_step(self) -> float:
        """Renew every held lease when the heartbeat asks (on the renew loop's own thread,
        so a call stalled on the database holds up nothing else)."""
        self._renew_now.wait(self.config.heartbeat_every())
        self._renew_now.clear()
        if self._halt.is_set():
            return 0.0
        with self._lock:
            held = [h for h in self._held.values() if not h.run.settled and not h.lost]
        self._renew(held)
        return 0.0

    def _renew(self, held: list[_Held]) -> None:
        if not held:
            return
        sent = time.monotonic()
        try:
            kept = self.driver.lease_extend(
                [h.lease for h in held], self.config.lease, now=self.clock.pinned()
            )
        except JobsError:
            self._next_beat = time.monotonic() + min(1.0, self.config.heartbeat_every())
            raise
        for h in held:
            if h.job.id in kept:
                h.confirmed = max(h.confirmed, sent)
            else:
                # Rescued elsewhere or cancelled by an operator: whatever the handler does next
                # is fenced; tell it to stop.
                self._lose(h)

    def _lose(self, h: _Held, **why: Any) -> None:
        """The lease is gone (or may be): count it once, tell the handler, write nothing."""
        with self._lock:
            if h.lost:
                return
            h.lost = True
            self.stats.lost += 1
        h.cancelled.set()
        if h.task is not None:
            h.task.cancel()
        events.warning("jobs.lease.lost", job_id=h.job.id, job=h.job.name, **why)
        if h.run.settle(Outcome("release")):
            h.written = True  # nothing to write: the lease is gone
            if h.run.free:
                self._free(h)

    def _check_stuck(self, held: list[_Held], now: float) -> None:
        stuck = [h for h in held if h.timed_out and h.started_at is not None]
        if len(stuck) < self.config.concurrency or not stuck:
            if self._stuck_since is not None:
                events.info("jobs.worker.unstuck", worker_id=self.worker_id)
            self._stuck_since = None
            return
        if self._stuck_since is None:
            self._stuck_since = now
            events.error(
                "jobs.worker.stuck",
                worker_id=self.worker_id,
                jobs=",".join(f"{h.job.name}:{h.job.id}" for h in stuck),
            )
        limit = self.config.stuck_limit
        if limit is not None and now - self._stuck_since >= limit.total_seconds():
            self._stuck_since = None
            self._fatal("heartbeat", StuckError(f"every slot held past its timeout for {limit}"))

    def _check_event_loop(self, held: list[_Held], now: float) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if now - self._loop_seen > _LOOP_BLOCKED_AFTER:
            if not self._loop_blocked:
                self._loop_blocked = True
                running = [h for h in held if h.task is not None and h.started_at is not None]
                events.warning(
                    "jobs.worker.loop-blocked",
                    seconds=round(now - self._loop_seen, 3),
                    jobs=",".join(f"{h.job.name}:{h.job.id}" for h in running),
                )
        elif self._loop_blocked:
            self._loop_blocked = False
        try:
            loop.call_soon_threadsafe(self._loop_tick)
        except RuntimeError:
            pass  # closed meanwhile

    def _loop_tick(self) -> None:
        self._loop_seen = time.monotonic()

    # -- maintenance ---------------------------------------------------------------------------

    def _maintenance_step(self) -> float:
        rescued = self.maintenance.tick(
            rescue_every=self.config.rescue_interval.total_seconds(),
            prune_every=self.config.prune_interval.total_seconds(),
        )
        self.stats.rescued += rescued
        return self.maintenance.next_in()

    # -- shutdown ------------------------------------------------------------------------------

    def _shutdown(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        # No claim may land after the release below: wait for a claim in flight to finish.
        claim = self._loops.get("claim")
        if claim is not None:
            claim.join(None if not self._hard_stop.is_set() else 5.0)
        maintenance = self._loops.get("maintenance")
        with self._lock:
            held = list(self._held.values())
        for h in held:  # dispatched, never started: back to the queue at once
            if h.run.release():
                self._settle_release(h)
        while self.inflight and time.monotonic() < deadline and not self._hard_stop.is_set():
            self._wake.wait(0.05)
            self._wake.clear()
        with self._lock:
            remaining = [h for h in self._held.values() if not h.run.settled]
        for h in remaining:
            h.cancelled.set()
            if h.task is not None:
                h.task.cancel()
            if h.timed_out:
                self._settle(h, self._timeout_outcome(h))
            else:
                self._settle(h, Outcome("release"))
        # Handlers still running past the grace period keep running on daemon threads; their
        # outcomes are fenced because their jobs were released.
        self._outcomes.put(None)
        self._starts.put(None)
        for _ in self._handlers:
            self._tasks.put(None)
        flush = self._loops.get("flush")
        if flush is not None:
            flush.join(None if not self._hard_stop.is_set() else 5.0)
        starter = self._loops.get("start")
        if starter is not None:
            starter.join(5.0)
        if maintenance is not None:
            maintenance.join(30.0)
        self.maintenance.resign()
        self._halt.set()
        self._renew_now.set()
        for name in ("heartbeat", "renew"):
            beating = self._loops.get(name)
            if beating is not None:
                beating.join(5.0)
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=5.0)
            if not self._loop.is_running():
                self._loop.close()
        events.info("jobs.worker.stopped", worker_id=self.worker_id, released=len(remaining))
        with self._lock:
            self._started = False
            self._loops = {}
            self._handlers = []
            self._loop = None
            self._held = {}
            self._tasks = queue.SimpleQueue()
            self._outcomes = queue.SimpleQueue()
            self._starts = queue.SimpleQueue()
        self._stopped.set()

    def _settle_release(self, held: _Held) -> None:
        held.run.outcome = Outcome("release")
        self._outcomes.put(held)

    # -- running one job -----------------------------------------------------------------------

    def _prepare(self, held: _Held) -> tuple[JobHandle[Any], list[Any]] | Outcome:
        job = held.job
        handle = held.handle
        now = self.clock.now()
        if handle is None:
            error = attempt_error(
                job, "unknown_job", f"no job named {job.name!r} is registered in this worker", now
            )
            events.warning("jobs.job.unknown", job_id=job.id, job=job.name)
            failure, drop = decide_failure(job, None, error, now)
            return Outcome("fail", failure=failure, drop=drop)
        try:
            value = self.serializer.loads(job.input, into=handle.input_type)
        except DeserializationError as exc:
            error = attempt_error(job, "DeserializationError", str(exc), now)
            # No retry can decode a payload that cannot be decoded now: park it.
            return Outcome("fail", failure=Failure(job.lease, error, None))
        args: list[Any] = [value]
        if handle.wants_context:
            args.append(self._context(held))
        return handle, args

    def _context(self, held: _Held) -> JobContext:
        job = held.job

        def beat() -> bool:
            # Never blocks (the event loop included): the heartbeat thread renews every held
            # lease on its own schedule; this asks it to go now and reports what it knows.
            self._next_beat = 0.0
            return not held.lost and not held.run.settled

        return JobContext(
            id=job.id,
            name=job.name,
            queue=job.queue,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            tenant_id=job.tenant_id,
            enqueued_at=job.created_at,
            _heartbeat=beat,
            _cancelled=held.cancelled.is_set,
        )

    def _run_sync(self, held: _Held) -> Outcome | None:
        prepared = self._prepare(held)
        if isinstance(prepared, Outcome):
            return prepared
        return self._call_sync(held, *prepared)

    def _call_sync(self, held: _Held, handle: JobHandle[Any], args: list[Any]) -> Outcome:
        reset = current_app.set(self.app)
        try:
            handle.fn(*args)
        except BaseException as exc:
            return self.outcome_of(held, exc)
        finally:
            current_app.reset(reset)
        return Outcome("complete")

    async def _run_async(self, held: _Held) -> Outcome | None:
        prepared = self._prepare(held)
        if isinstance(prepared, Outcome):
            return prepared
        handle, args = prepared
        reset = current_app.set(self.app)
        timeout = handle.timeout.total_seconds() if handle.timeout is not None else None
        try:
            await asyncio.wait_for(handle.fn(*args), timeout)
        except TimeoutError:
            return self._timeout_outcome(held)
        except asyncio.CancelledError:
            return None  # cancelled by the worker, which has settled this run already
        except BaseException as exc:
            return self.outcome_of(held, exc)
        finally:
            current_app.reset(reset)
        return Outcome("complete")

    def outcome_of(self, held: _Held, exc: BaseException) -> Outcome:
        """What a handler's exception means (shared by sync and async handlers). Never raises:
        a bad ``Snooze`` or an unrepresentable retry time becomes a failure of the job."""
        try:
            if isinstance(exc, Snooze):
                return Outcome("snooze", run_at=self.clock.now() + exc.delay)
            if isinstance(exc, Cancel):
                return Outcome("cancel", reason=exc.reason)
            return self._failed(held, exc)
        except BaseException as inner:
            return self._failed(held, inner)

    def _failed(self, held: _Held, exc: BaseException) -> Outcome:
        now = self.clock.now()
        error = error_from_exception(held.job, exc, now)
        try:
            failure, drop = decide_failure(held.job, held.handle, error, now)
        except (OverflowError, ValueError):
            failure, drop = Failure(held.lease, error, None), False  # cannot retry: park it
        return Outcome("fail", failure=failure, drop=drop)

    def _timeout_outcome(self, held: _Held) -> Outcome:
        now = self.clock.now()
        timeout = held.handle.timeout if held.handle is not None else None
        error = attempt_error(
            held.job, "timeout", f"the job ran longer than its timeout of {timeout}", now
        )
        failure, drop = decide_failure(held.job, held.handle, error, now)
        return Outcome("fail", failure=failure, drop=drop)


class StuckError(Exception):
    """Every slot is held by a thread past its timeout, for longer than the stuck limit."""
