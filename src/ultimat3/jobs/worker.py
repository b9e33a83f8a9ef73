"""The worker: claims due jobs, runs them, and records what happened.

Guarantees:

- **At least once.** A claimed job is held by a lease that a heartbeat thread renews; a busy
  handler (a CPU loop in a sync job, a blocking call in an async one) cannot starve it, because
  the heartbeat runs on its own thread and never waits for the handlers. If the process dies,
  the lease expires and maintenance (in any worker) retries the job, counting the attempt.
- **Fenced writes.** Every completion, failure, snooze and release names the lease it was
  claimed with; once the lease is lost (expired and rescued, cancelled by an operator) the
  worker's late writes match nothing, and the handler's ``JobContext.cancelled`` turns True.
- **The attempt is counted at claim**, so a job that kills its worker ends ``dead`` after its
  attempts instead of looping.
- **Graceful shutdown.** ``stop()`` (SIGTERM or SIGINT in ``run()``) stops claiming, lets
  in-flight jobs finish within ``shutdown_grace``, then releases the rest back to the queue
  without consuming their attempt. A second signal releases them at once and returns.

Limits: a sync handler cannot be interrupted. At its timeout its attempt is failed (and retried
elsewhere when attempts remain) and ``ctx.cancelled`` turns True, but its thread runs on, and
holds its concurrency slot, until the function returns. Async handlers are cancelled.
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
from ultimat3.jobs.errors import DeserializationError, JobsError
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
from ultimat3.jobs.serialization import Serializer


@dataclass(frozen=True)
class WorkerConfig:
    #: Queues to serve; None serves every queue the app's registered jobs use.
    queues: tuple[str, ...] | None = None
    concurrency: int = 10
    lease: timedelta = timedelta(seconds=30)
    #: How often leases are renewed; None means a third of the lease.
    heartbeat: timedelta | None = None
    #: The longest the worker goes without looking for due jobs (wake-ups make it sooner).
    poll_interval: timedelta = timedelta(seconds=1)
    shutdown_grace: timedelta = timedelta(seconds=10)
    #: Jobs claimed ahead of free threads; None: twice ``concurrency`` while jobs are short
    #: (under 50 ms on average), none while they are long.
    prefetch: int | None = None
    rescue_interval: timedelta = timedelta(seconds=5)
    prune_interval: timedelta = timedelta(minutes=1)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    worker_id: str = ""

    def heartbeat_every(self) -> float:
        beat = self.heartbeat if self.heartbeat is not None else self.lease / 3
        return max(0.05, beat.total_seconds())


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    dead: int = 0
    snoozed: int = 0
    cancelled: int = 0
    released: int = 0
    lost: int = 0
    rescued: int = 0


OutcomeKind = Literal["complete", "fail", "snooze", "cancel", "release"]


@dataclass
class _Outcome:
    kind: OutcomeKind
    run: _Run
    failure: Failure | None = None
    drop: bool = False
    run_at: datetime | None = None
    reason: str = ""


class _Run:
    """One claimed job while this worker holds it."""

    __slots__ = (
        "_lock",
        "_parts",
        "_settled",
        "cancelled",
        "deadline",
        "job",
        "started",
        "task",
        "timeout",
    )

    def __init__(self, job: Job, timeout: float | None) -> None:
        self.job = job
        self.timeout = timeout
        self.deadline: float | None = None  # set when a handler thread starts it
        self.started = False
        self.cancelled = threading.Event()
        self.task: concurrent.futures.Future[None] | None = None
        self._settled = False
        self._parts = 2  # the handler returning, and its outcome being written (or dropped)
        self._lock = threading.Lock()

    @property
    def lease(self) -> Lease:
        return self.job.lease

    def settle(self) -> bool:
        """Claim the right to write this run's outcome; True exactly once."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
            return True

    @property
    def settled(self) -> bool:
        return self._settled

    def part_done(self) -> bool:
        """Count one of the two parts; True when both are done and the slot is free."""
        with self._lock:
            self._parts -= 1
            return self._parts == 0


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
        if self.config.concurrency < 1:
            raise JobsError(
                f"concurrency={self.config.concurrency} is not valid", fix="use 1 or more"
            )
        self.queues = queues
        self.worker_id = (
            self.config.worker_id or f"{socket.gethostname()}:{os.getpid()}:{token()[:6]}"
        )
        self.stats = WorkerStats()
        self.maintenance = Maintenance(driver, handles, clock, self.config.maintenance)

        self._lock = threading.Lock()
        self._inflight: dict[
            Lease, _Run
        ] = {}  # by lease: a job can have a zombie run and a new one
        self._wake = threading.Event()  # a slot freed, or a stop was asked for
        self._claiming = threading.Event()
        self._stop_asked = threading.Event()
        self._hard_stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._started = False
        self._halt = threading.Event()  # tells the heartbeat thread to end, last of all
        self._threads: dict[str, threading.Thread] = {}
        self._tasks: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[_Outcome | None] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._signals_seen = 0
        self._avg_run = 1.0  # seconds; starts "long", so look-ahead is earned by short jobs

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start claiming in background threads. Idempotent."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self._stopped.clear()
            self._halt.clear()
            self._stop_asked.clear()
            self._hard_stop.clear()
            self._claiming.set()
        tasks, outcomes = self._tasks, self._outcomes
        self._spawn(self._claim_loop, "claim")
        self._spawn(lambda: self._flush_loop(outcomes), "flush")
        self._spawn(self._supervise_loop, "heartbeat")
        self._spawn(self._maintenance_loop, "maintenance")
        for n in range(self.config.concurrency):
            self._spawn(lambda: self._handler_loop(tasks, outcomes), f"handler-{n}")
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
            first = not self._stop_asked.is_set()
            self._stop_asked.set()
            self._claiming.clear()
        self._wake.set()
        if first:
            if grace is None:
                seconds = self.config.shutdown_grace.total_seconds()
            elif isinstance(grace, timedelta):
                seconds = grace.total_seconds()
            else:
                seconds = float(grace)
            stopper = threading.Thread(
                target=self._shutdown, args=(seconds,), name="ultimat3-jobs-stop", daemon=True
            )
            stopper.start()
        if wait:
            self._stopped.wait()

    def stop_now(self) -> None:
        """Release in-flight jobs at once and stop (a second SIGTERM)."""
        self._hard_stop.set()
        self.stop(wait=False)

    def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Run until stopped: SIGTERM/SIGINT stop gracefully, a second one at once."""
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

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def inflight(self) -> int:
        with self._lock:
            return len(self._inflight)

    # -- inline draining (tests, demos) ------------------------------------------------------

    def drain(self, *, max_jobs: int | None = None) -> WorkerStats:
        """Run due jobs in the calling thread until none is due; returns what happened.

        Meant for tests and scripts: no threads, no heartbeats (each job runs within its
        lease), handlers run one at a time, async ones on a private event loop.
        """
        done = 0
        loop: asyncio.AbstractEventLoop | None = None
        try:
            while max_jobs is None or done < max_jobs:
                limit = self.config.concurrency
                if max_jobs is not None:
                    limit = min(limit, max_jobs - done)
                jobs = self._claim(limit)
                if not jobs:
                    break
                for job in jobs:
                    run = _Run(job, None)
                    handle = self.handles(job.name)
                    if handle is not None and handle.is_async:
                        loop = loop or asyncio.new_event_loop()
                        outcome = loop.run_until_complete(self._run_async(run))
                    else:
                        outcome = self._run_sync(run)
                    if outcome is not None and run.settle():
                        self._write([outcome])
                    done += 1
        finally:
            if loop is not None:
                loop.close()
        return self.stats

    # -- threads -----------------------------------------------------------------------------

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"ultimat3-jobs-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()

    def _join(self, name: str, timeout: float | None) -> None:
        thread = self._threads.get(name)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _claim(self, limit: int) -> list[Job]:
        jobs = self.driver.job_claim(
            ClaimParams(
                queues=self.queues,
                limit=limit,
                lease_for=self.config.lease,
                worker_id=self.worker_id,
                now=self.clock.pinned(),
            )
        )
        self.stats.claimed += len(jobs)
        return jobs

    def _claim_loop(self) -> None:
        poll = self.config.poll_interval.total_seconds()
        # Claim in batches when busy: waiting for half the threads' worth of slots to free
        # costs little latency under load and saves a write transaction per job.
        refill = max(1, self.config.concurrency // 2)
        backoff = 0.0
        while self._claiming.is_set():
            self._wake.clear()
            capacity = self._capacity()
            free = capacity - self.inflight
            if free <= 0:
                self._wake.wait(poll)
                continue
            try:
                jobs = self._claim(free)
                backoff = 0.0
            except JobsError as exc:
                backoff = min(5.0, backoff * 2 or 0.1)
                events.warning("jobs.worker.claim-failed", error=exc.cause, retry_in=backoff)
                self._stop_asked.wait(backoff)
                continue
            for job in jobs:
                self._dispatch(job)
            if len(jobs) == free:
                # Busy: come back when enough slots are free (or at once if some still are).
                if capacity - self.inflight < refill:
                    self._wake.wait(poll)
                continue
            try:
                self.driver.wait_for_jobs(poll, self._wake)
            except JobsError as exc:
                events.warning("jobs.worker.wait-failed", error=exc.cause)
                self._stop_asked.wait(poll)

    def _dispatch(self, job: Job) -> None:
        handle = self.handles(job.name)
        is_async = handle is not None and handle.is_async
        timeout = handle.timeout if handle is not None else None
        # Async handlers time out inside their coroutine (asyncio.wait_for); only sync ones
        # need the supervisor's deadline, which starts when a thread picks the run up.
        run = _Run(job, timeout.total_seconds() if timeout is not None and not is_async else None)
        with self._lock:
            self._inflight[run.lease] = run
        if is_async:
            loop = self._event_loop()
            run.task = asyncio.run_coroutine_threadsafe(
                self._run_async_settled(run, self._outcomes), loop
            )
        else:
            self._tasks.put(run)

    def _handler_loop(
        self, tasks: queue.SimpleQueue[_Run | None], outcomes: queue.SimpleQueue[Any]
    ) -> None:
        while True:
            run = tasks.get()
            if run is None:
                return
            if run.settled:  # released at shutdown before it started: nothing to run
                self._part_done(run)
                continue
            run.started = True
            if run.timeout is not None:
                run.deadline = time.monotonic() + run.timeout
            started = time.monotonic()
            outcome = self._run_sync(run)
            self._note_duration(time.monotonic() - started)
            self._finish(run, outcome, outcomes)

    async def _run_async_settled(self, run: _Run, outcomes: queue.SimpleQueue[Any]) -> None:
        run.started = True
        started = time.monotonic()
        outcome = await self._run_async(run)
        self._note_duration(time.monotonic() - started)
        self._finish(run, outcome, outcomes)

    def _note_duration(self, seconds: float) -> None:
        # Unsynchronised on purpose: an average that loses an update now and then is fine.
        self._avg_run = self._avg_run * 0.9 + seconds * 0.1

    def _capacity(self) -> int:
        """How many jobs this worker holds at most: its concurrency, plus twice as many queued
        locally while jobs are short (under 50 ms on average), so claims and completions come
        in batches of about twice the concurrency (one fsync'd transaction each). Long jobs get
        no look-ahead: a job queued behind a long one would wait while another worker idles."""
        concurrency = self.config.concurrency
        ahead = self.config.prefetch
        if ahead is None:
            ahead = 2 * concurrency if self._avg_run < 0.05 else 0
        return concurrency + ahead

    def _finish(
        self, run: _Run, outcome: _Outcome | None, outcomes: queue.SimpleQueue[Any]
    ) -> None:
        # Two parts free a slot: the handler returning (here), and the outcome being written by
        # the flusher, or resolved by whoever settled the run first (timeout, lost lease,
        # shutdown release).
        if run.settle():
            if outcome is not None:
                outcomes.put(outcome)
            else:
                self._part_done(run)
        self._part_done(run)

    def _part_done(self, run: _Run) -> None:
        if run.part_done():
            with self._lock:
                self._inflight.pop(run.lease, None)
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
            return self._loop

    def _flush_loop(self, outcomes: queue.SimpleQueue[_Outcome | None]) -> None:
        while True:
            first = outcomes.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    item = outcomes.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    outcomes.put(None)  # keep the sentinel for the next get
                    break
                batch.append(item)
            self._write_with_retry(batch)
            for outcome in batch:
                self._part_done(outcome.run)

    def _write_with_retry(self, batch: list[_Outcome]) -> None:
        delay = 0.05
        while True:
            try:
                self._write(batch)
                return
            except JobsError as exc:
                # The database is away. The leases will expire and the jobs be retried if it
                # stays away; meanwhile keep trying, so a short blip loses no outcome.
                events.warning("jobs.worker.write-failed", error=exc.cause)
                if self._hard_stop.wait(delay):
                    return
                delay = min(2.0, delay * 2)

    def _supervise_loop(self) -> None:
        every = self.config.heartbeat_every()
        busy_tick = min(0.1, every)
        next_beat = time.monotonic() + every
        tick = busy_tick
        while not self._halt.wait(tick):
            now = time.monotonic()
            with self._lock:
                runs = list(self._inflight.values())
            # Deadlines need a fine tick only while something runs; an idle worker wakes
            # rarely, which keeps its CPU use low (a new run starts within one busy tick of
            # the next wake-up, well inside any timeout).
            tick = busy_tick if runs else min(every, 0.5)
            for run in runs:
                if run.deadline is not None and now >= run.deadline and not run.settled:
                    self._time_out(run)
            if now >= next_beat:
                next_beat = now + every
                self._heartbeat([r for r in runs if not r.settled])

    def _heartbeat(self, runs: list[_Run]) -> None:
        if not runs:
            return
        try:
            held = self.driver.lease_extend(
                [r.lease for r in runs], self.config.lease, now=self.clock.pinned()
            )
        except JobsError as exc:
            events.warning("jobs.worker.heartbeat-failed", error=exc.cause)
            return
        for run in runs:
            if run.job.id not in held and run.settle():
                # Rescued elsewhere or cancelled by an operator: whatever the handler does next
                # is fenced; tell it to stop.
                self.stats.lost += 1
                run.cancelled.set()
                if run.task is not None:
                    run.task.cancel()
                events.warning("jobs.job.lease-lost", job_id=run.job.id)
                self._part_done(run)

    def _time_out(self, run: _Run) -> None:
        if not run.settle():
            return
        run.cancelled.set()
        handle = self.handles(run.job.name)
        error = attempt_error(
            run.job,
            "timeout",
            f"the job ran longer than its timeout of {handle.timeout if handle else '?'}",
            self.clock.now(),
        )
        failure, drop = decide_failure(run.job, handle, error, self.clock.now())
        self._outcomes.put(_Outcome("fail", run, failure=failure, drop=drop))

    def _maintenance_loop(self) -> None:
        rescue_every = self.config.rescue_interval.total_seconds()
        prune_every = self.config.prune_interval.total_seconds()
        next_rescue = time.monotonic()
        next_prune = time.monotonic() + min(prune_every, 5.0)
        pause = 0.0
        while not self._stop_asked.wait(pause):
            now = time.monotonic()
            try:
                if now >= next_rescue:
                    next_rescue = now + rescue_every
                    self.stats.rescued += len(self.maintenance.rescue())
                if now >= next_prune:
                    next_prune = now + prune_every
                    self.maintenance.prune()
            except JobsError as exc:
                events.warning("jobs.maintenance.failed", error=exc.cause)
            pause = max(0.05, min(next_rescue, next_prune) - time.monotonic())

    def _shutdown(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        # No claim may land after the release below: wait for a claim in flight to finish.
        self._join("claim", None if not self._hard_stop.is_set() else 5.0)
        with self._lock:
            queued = [r for r in self._inflight.values() if not r.started and r.task is None]
        for run in queued:  # claimed ahead, never started: back to the queue at once
            if run.settle():
                self._outcomes.put(_Outcome("release", run))
        while self.inflight and time.monotonic() < deadline and not self._hard_stop.is_set():
            self._wake.wait(0.05)
            self._wake.clear()
        with self._lock:
            remaining = [r for r in self._inflight.values() if not r.settled]
        for run in remaining:
            if run.settle():
                run.cancelled.set()
                if run.task is not None:
                    run.task.cancel()
                self._outcomes.put(_Outcome("release", run))
        # Handlers still running past the grace period keep running on daemon threads; their
        # outcomes are fenced because their jobs were released.
        self._outcomes.put(None)
        for _ in range(self.config.concurrency):
            self._tasks.put(None)
        self._join("flush", None if not self._hard_stop.is_set() else 5.0)
        self._join("maintenance", 30.0)
        self._halt.set()
        self._join("heartbeat", 5.0)
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=5.0)
            if not self._loop.is_running():
                self._loop.close()
        events.info("jobs.worker.stopped", worker_id=self.worker_id, released=len(remaining))
        with self._lock:
            self._started = False
            self._threads = {}
            self._loop = None
            self._tasks = queue.SimpleQueue()
            self._outcomes = queue.SimpleQueue()
        self._stopped.set()

    # -- running one job ---------------------------------------------------------------------

    def _prepare(self, run: _Run) -> tuple[JobHandle[Any], list[Any]] | _Outcome:
        job = run.job
        handle = self.handles(job.name)
        now = self.clock.now()
        if handle is None:
            error = attempt_error(
                job,
                "unknown_job",
                f"no job named {job.name!r} is registered in this worker",
                now,
            )
            failure, drop = decide_failure(job, None, error, now)
            return _Outcome("fail", run, failure=failure, drop=drop)
        try:
            value = self.serializer.loads(job.input, into=handle.input_type)
        except DeserializationError as exc:
            error = attempt_error(job, "DeserializationError", str(exc), now)
            # No retry can decode a payload that cannot be decoded now: park it.
            return _Outcome("fail", run, failure=Failure(job.lease, error, None))
        args: list[Any] = [value]
        if handle.wants_context:
            args.append(self._context(run))
        return handle, args

    def _context(self, run: _Run) -> JobContext:
        job = run.job

        def beat() -> bool:
            if run.settled:
                return False
            held = self.driver.lease_extend([run.lease], self.config.lease, now=self.clock.pinned())
            return job.id in held

        return JobContext(
            id=job.id,
            name=job.name,
            queue=job.queue,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            tenant_id=job.tenant_id,
            enqueued_at=job.created_at,
            _heartbeat=beat,
            _cancelled=run.cancelled.is_set,
        )

    def _run_sync(self, run: _Run) -> _Outcome | None:
        prepared = self._prepare(run)
        if isinstance(prepared, _Outcome):
            return prepared
        handle, args = prepared
        reset = current_app.set(self.app)
        try:
            handle.fn(*args)
        except Snooze as snooze:
            return _Outcome("snooze", run, run_at=self.clock.now() + snooze.delay)
        except Cancel as cancel:
            return _Outcome("cancel", run, reason=cancel.reason)
        except BaseException as exc:
            return self._failed(run, handle, exc)
        finally:
            current_app.reset(reset)
        return _Outcome("complete", run)

    async def _run_async(self, run: _Run) -> _Outcome | None:
        prepared = self._prepare(run)
        if isinstance(prepared, _Outcome):
            return prepared
        handle, args = prepared
        reset = current_app.set(self.app)
        timeout = handle.timeout.total_seconds() if handle.timeout is not None else None
        try:
            await asyncio.wait_for(handle.fn(*args), timeout)
        except Snooze as snooze:
            return _Outcome("snooze", run, run_at=self.clock.now() + snooze.delay)
        except Cancel as cancel:
            return _Outcome("cancel", run, reason=cancel.reason)
        except TimeoutError:
            now = self.clock.now()
            error = attempt_error(
                run.job, "timeout", f"the job ran longer than its timeout of {handle.timeout}", now
            )
            failure, drop = decide_failure(run.job, handle, error, now)
            return _Outcome("fail", run, failure=failure, drop=drop)
        except asyncio.CancelledError:
            return None  # cancelled by the worker, which has settled this run already
        except BaseException as exc:
            return self._failed(run, handle, exc)
        finally:
            current_app.reset(reset)
        return _Outcome("complete", run)

    def _failed(self, run: _Run, handle: JobHandle[Any], exc: BaseException) -> _Outcome:
        now = self.clock.now()
        failure, drop = decide_failure(
            run.job, handle, error_from_exception(run.job, exc, now), now
        )
        return _Outcome("fail", run, failure=failure, drop=drop)

    # -- writing outcomes --------------------------------------------------------------------

    def _write(self, batch: list[_Outcome]) -> None:
        now = self.clock.pinned()
        completes = [o.run.lease for o in batch if o.kind == "complete"]
        if completes:
            done = self.driver.job_complete_many(completes, now=now)
            self.stats.completed += len(done)
        failures = [o for o in batch if o.kind == "fail" and o.failure is not None]
        if failures:
            changed = self.driver.job_fail_many([o.failure for o in failures if o.failure], now=now)
            for o in failures:
                assert o.failure is not None
                if o.run.job.id not in changed:
                    continue
                if o.failure.retry_at is None:
                    self.stats.dead += 1
                    events.warning(
                        "jobs.job.dead",
                        job_id=o.run.job.id,
                        job=o.run.job.name,
                        attempt=o.run.job.attempt,
                        error=o.failure.error.kind,
                    )
                else:
                    self.stats.failed += 1
                    events.info(
                        "jobs.job.retrying",
                        job_id=o.run.job.id,
                        job=o.run.job.name,
                        attempt=o.run.job.attempt,
                        retry_at=o.failure.retry_at.isoformat(),
                        error=o.failure.error.kind,
                    )
            drops = [o.run.job.id for o in failures if o.drop and o.run.job.id in changed]
            if drops:
                self.driver.job_discard(drops)
        for o in batch:
            if o.kind == "snooze" or o.kind == "release":
                if self.driver.job_snooze(o.run.lease, o.run_at, now=now):
                    if o.kind == "snooze":
                        self.stats.snoozed += 1
                    else:
                        self.stats.released += 1
            elif o.kind == "cancel" and self.driver.job_cancel(
                o.run.job.id, reason=o.reason, lease=o.run.lease, now=now
            ):
                self.stats.cancelled += 1
