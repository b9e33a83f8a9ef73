"""The worker: claims due jobs, runs them, records what happened. Who owns a job, step by step:

1. **cycle**: one transaction (``job_cycle``) writes the outcomes that finished (completions
   and failures, each fenced by its lease; a refused late write is counted in ``lost``) and
   claims one job per free handler, each marked *started* by the claim. The rarer outcomes
   (snoozes, releases, cancels) follow it, one write each. Each claimed job gets a ``Run``
   (``ultimat3.jobs.run``), its one owner in this worker.
2. **handlers**: ``concurrency`` threads. Each takes the next ready job, calls its function
   and turns what happened into one ``Outcome`` (``outcome_of``, shared with ``async def``
   jobs, which run on one event loop), offered with ``run.settle()``: the first settler wins
   (the handler, a lost lease, shutdown). A thread with no ready job *leads*: it runs the
   next cycle itself, so a short job's thread writes its outcome, claims the next job and
   runs it with no hand-off between threads; while jobs are long, each ready job wakes a
   thread of its own. A leader with nothing to write and nothing due sleeps until a job is
   (``wait_for_jobs``); a thread whose job returns wakes it at once to write the outcome,
   whatever the poll interval. Outcomes that wait behind a long job on the thread that queued
   them are handed to a sleeping thread by the heartbeat (within 100 ms). A slot frees once its run is settled and its handler has returned, so
   a sync job past its timeout keeps its lease until its thread ends.
3. **heartbeat** loop: asks the **renew** loop to renew held leases every heartbeat, tells
   handlers of lost ones (``ctx.cancelled``), marks timeouts, logs ``jobs.worker.stuck`` (and
   exits past ``stuck_limit``) and an event loop blocked by an async job. It never waits for
   the database: a renewal that cannot get through (a stalled connection) blocks the renew
   loop only, and a lease whose last confirmed renewal was sent ``lease - heartbeat/2`` ago is
   given up (``jobs.lease.lost``, ``ctx.cancelled``) before it can have expired in the
   database, so before it can have been rescued elsewhere. Not on a single-writer database
   (SQLite): there a stall holds every writer, the rescuer included, and the rescuer trusts
   an expiry only once writes have flowed for a full lease, so leases are kept through it.
4. **maintenance** loop: rescue expired leases (on every worker) and prune (on the one node
   elected for it).

A job whose worker dies while it holds it (started, by its claim) is rescued as
``worker_lost`` and *isolated*: a worker runs it alone (nothing else in flight) until it
returns. Its attempt counts only if it ran alone when the worker died; one a shutdown gives
back before a thread took it goes back with its attempt. A job whose name this worker lacks
(a rolling deploy) is given back, its attempt refunded, and passed over by this worker's
claims for a while (``ClaimParams.skip``); ``unknown_grace`` after it became due it is
dead-lettered as ``unknown_job``. The cycle runs under the policy of a ``supervise.Loop``
(``Loop.once``), the heartbeat and maintenance as loops of their own; a critical one that
keeps failing unexpectedly stops the worker with ``exit_code`` 70, releasing what it holds,
for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType
from typing import Any, Literal

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import Driver, check_clock_skew
from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.errors import (
    ConfigurationError,
    DeserializationError,
    JobsError,
    SerializationError,
)
from ultimat3.jobs.ids import token
from ultimat3.jobs.job import Cancel, Enqueuer, JobContext, JobHandle, Snooze, current_app
from ultimat3.jobs.maintenance import (
    Maintenance,
    MaintenanceConfig,
    attempt_error,
    decide_failure,
    error_from_exception,
)
from ultimat3.jobs.presence import Presence
from ultimat3.jobs.records import ClaimParams, Cycle, Failure, Job, Lease
from ultimat3.jobs.run import Run
from ultimat3.jobs.serialization import Serializer
from ultimat3.jobs.supervise import Loop
from ultimat3.jobs.wake import Wake

#: The exit code of a worker that stopped because a loop could not go on (EX_SOFTWARE).
FATAL_EXIT = 70
#: A job shorter than this on average runs on the thread that took it without waking another
#: for the next one (see ``Worker._handler_thread``).
_SHORT_JOB = 0.002
#: An event loop that has not run a callback for this long is reported as blocked.
_LOOP_BLOCKED_AFTER = 1.0
#: How long a worker passes over a job name it lacks (a rolling deploy) before it claims a job
#: of that name again (at most ``unknown_grace``).
_UNKNOWN_SKIP = 60.0


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
    #: How long a job whose name this worker lacks waits for a worker that knows it (counted
    #: from when it became due) before it is dead-lettered as ``unknown_job``. Until then each
    #: worker that lacks it gives it back without charging an attempt and passes over it for a
    #: while (a rolling deploy).
    unknown_grace: timedelta = timedelta(hours=1)

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
                f"lease={format_duration(self.lease)} is too short",
                fix="use a lease of at least 200ms",
            )
        beat = self.heartbeat_interval
        if beat * 2 > self.lease:
            raise ConfigurationError(
                f"heartbeat={format_duration(beat)} is more than half the lease "
                f"({format_duration(self.lease)}): one late "
                "heartbeat would let the lease expire under a live job",
                fix=f"use heartbeat of at most {format_duration(self.lease / 2)} (the default "
                "is a third of "
                "the lease), or a longer lease",
            )
        for name in ("poll_interval", "rescue_interval", "prune_interval", "unknown_grace"):
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
    #: A snooze's or release's wait from the write, on the database's clock (``job_snooze``);
    #: None keeps the job's due time (the release of a job whose name this worker lacks).
    delay: timedelta | None = timedelta(0)
    reason: str = ""
    #: A completion's result as JSON text (None: the handler returned None).
    result: str | None = None


class _Flag:
    """A flag that is set once and read often (``ctx.cancelled``): a bool, without the lock
    and condition of a ``threading.Event``, since nothing waits on it."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class _Held:
    """A job this worker holds: its ``Run`` state machine plus what the threads share."""

    __slots__ = (
        "cancelled",
        "confirmed",
        "deadline",
        "duration",
        "handle",
        "job",
        "lease",
        "lost",
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
        self.lease = job.lease
        self.handle = handle
        #: When the request that last set this lease's expiry was sent (time.monotonic()):
        #: the claim, then each renewal the database confirmed. The lease lasts at least
        #: until this plus the lease, whatever the clocks say.
        self.confirmed = time.monotonic() if claimed_at is None else claimed_at
        self.run: Run[Outcome] = Run()
        self.cancelled = _Flag()
        self.deadline: float | None = None
        self.started_at: float | None = None
        self.duration: float | None = None  # seconds the function ran, once it returned
        self.timed_out = False
        self.lost = False
        #: The outcome is in the database (or there is nothing left to write).
        self.written = False
        self.task: concurrent.futures.Future[None] | None = None


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
        registered: Callable[[], list[str]] | None = None,
        limited: bool = False,
    ) -> None:
        self.driver = driver
        #: The job names this worker can run (named by the warning for an unknown one).
        self.registered = registered or list
        #: Claim jobs with a concurrency limit too (some registered job has one: ``limits``).
        self.limited = limited
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
            # A lease long (1 s to 15 s): a dead leader's successor takes over within a lease
            # and a rescue interval (rescue itself runs on every worker).
            leader_ttl=min(max(self.config.lease, timedelta(seconds=1)), timedelta(seconds=15)),
        )
        #: This worker's row in the workers table (``ultimat3-jobs workers``).
        self.presence = Presence(
            driver,
            clock,
            worker_id=self.worker_id,
            queues=queues,
            concurrency=self.config.concurrency,
            every=self.config.heartbeat_every(),
        )
        #: 0 after a clean stop; FATAL_EXIT when a loop could not go on.
        self.exit_code = 0

        self._lock = threading.Lock()
        #: Handler threads wait on it for ready jobs, or for the lead of the cycle.
        self._cond = threading.Condition(self._lock)
        self._held: dict[Lease, _Held] = {}  # by lease: a job can have a zombie run and a new one
        self._wake = Wake()  # a slot freed, or a stop was asked for (selectable: see wake.py)
        #: When (on ``clock.monotonic()``) the last claim's full rate window reopens: the wait
        #: the driver measured on its own clock (``CycleResult.wake_in``) from the claim's send.
        self._rate_wake: float | None = None
        self._stop_claiming = threading.Event()
        self._hard_stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._started = False
        self._halt = threading.Event()
        self._reset_cycle()
        self._handlers: list[threading.Thread] = []
        self._loops: dict[str, Loop] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_seen = time.monotonic()
        self._loop_blocked = False
        self._signals_seen = 0
        self._next_isolation_check = 0.0
        #: Job names this worker lacks and passes over in its claims, until (clock.monotonic()).
        #: Handler threads write it; nothing removes an entry (one per name, past ones unread),
        #: so a skip a handler writes while the cycle reads is never lost.
        self._skipping: dict[str, float] = {}
        self._stuck_since: float | None = None
        self._next_beat = 0.0
        self._seen_step = clock.stepped_at()

    def _reset_cycle(self) -> None:
        """The cycle's state. Under ``_lock``: ``_ready``, ``_pending``, ``_busy``,
        ``_leading``; the rest is the leader's alone."""
        self._ready: deque[_Held] = deque()  # claimed, started, waiting for a handler thread
        self._pending: list[_Held] = []  # settled, to be written by the next cycle
        self._busy = 0  # claimed and not returned by its handler
        self._leading = False  # a thread runs the cycle (or the shutdown holds it)
        self._exiting = threading.Event()  # this start's handler threads return
        self._leader_waiting = False  # the leader waits for jobs: wake it for outcomes
        self._alone: _Held | None = None  # an isolated job running alone
        self._isolating = False
        self._maybe_due = True  # claim at once: the last claim filled up, or a wake-up came
        self._lost_claims: list[str] = []  # tokens of claims whose reply may have been lost
        self._avg_run = 1.0  # seconds; starts long, so that threads wake for each job at first
        self._cycle_loop = Loop("cycle", self._cycle_step, on_fatal=self._fatal)
        self._renew_now = threading.Event()  # the heartbeat asks the renew loop to go
        self._clock_checked = False  # the host's clock against the database's (_presence_step)

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
        self._halt = halt = threading.Event()
        exiting = self._exiting
        for n in range(self.config.concurrency):
            thread = threading.Thread(
                target=self._handler_thread,
                args=(exiting,),
                name=f"ultimat3-jobs-handler-{n}",
                daemon=True,
            )
            self._handlers.append(thread)
            thread.start()
        self._loops = {
            "heartbeat": Loop("heartbeat", self._heartbeat_step, on_fatal=self._fatal, stop=halt),
            "renew": Loop("renew", self._renew_step, on_fatal=self._fatal, stop=halt),
            "maintenance": Loop("maintenance", self._maintenance_step, stop=self._stop_claiming),
            "presence": Loop("presence", self._presence_step, stop=halt),
        }
        self.presence.restarted(self.clock.now())
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
            acted = 0
            while True:
                # The handler only counts: stopping takes the worker's lock, and a second
                # signal landing inside the first one's stop() (or in start()) would wait on
                # it forever, on the same thread. This loop acts on the count instead.
                seen = self._signals_seen
                if seen > acted:
                    acted = seen
                    self.stop_now() if seen > 1 else self.stop(wait=False)
                if self._stopped.wait(0.1):
                    break
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.stats

    def _presence_step(self) -> float:
        """Write this worker's row; after the first beat that reached the database, compare
        the host's clock with the database's once (``check_clock_skew``)."""
        every = self.presence.beat()
        if not self._clock_checked:
            try:
                check_clock_skew(self.driver, self.clock, service="worker")
                self._clock_checked = True
            except JobsError:
                pass  # the database is away (the beat said so): checked at the next beat
        return every

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        events.warning(
            "jobs.worker.signal",
            signal=signum,
            count=self._signals_seen,
            # Started jobs (claimed ones not begun go back at once). No lock in a signal
            # handler: each len is atomic, and the sentence needs no more.
            running=max(0, len(self._held) - len(self._ready)),
            grace=self.config.shutdown_grace.total_seconds(),
        )

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
        """How many claimed jobs this worker holds now (running, or about to start)."""
        with self._lock:
            return len(self._held)

    # -- inline draining (tests, demos) ------------------------------------------------------

    def drain(self, *, max_jobs: int | None = None) -> WorkerStats:
        """Run due jobs in the calling thread until none is due; returns what happened.

        Meant for tests and scripts: no threads, no heartbeats (each job runs within its
        lease), handlers run one at a time, async ones on a private event loop. Isolated jobs
        are run too (one at a time is isolation enough). Each batch's outcomes are written in
        the transaction that claims the next batch, as the threaded worker does."""
        done = 0
        loop: asyncio.AbstractEventLoop | None = None
        finished: list[_Held] = []
        try:
            while True:
                limit = self.config.concurrency
                if max_jobs is not None:
                    limit = min(limit, max_jobs - done)
                if limit <= 0 and not finished:
                    break
                jobs = self._cycle(finished, limit)
                finished = []
                if not jobs and limit > 0:
                    jobs = self._cycle([], 1, isolated=True)
                if not jobs:
                    break
                for job in jobs:
                    held = _Held(job, self.handles(job.name))
                    held.run.start()
                    if held.handle is not None and held.handle.is_async:
                        loop = loop or asyncio.new_event_loop()
                        outcome = loop.run_until_complete(self._run_async(held))
                    else:
                        outcome = self._run_sync(held)
                    if outcome is not None and held.run.settle(outcome):
                        finished.append(held)
                    done += 1
        finally:
            if finished:
                self._cycle(finished, 0)
            if loop is not None:
                loop.close()
        return self.stats

    # -- the cycle: settle and claim -----------------------------------------------------------

    def _cycle(self, finished: list[_Held], limit: int, *, isolated: bool = False) -> list[Job]:
        """One turn in one transaction (``job_cycle``): write the completions and failures of
        ``finished`` and claim up to ``limit`` jobs for handlers free now (marked started).
        The rarer outcomes (snoozes, releases, cancels) are written after it, one by one."""
        done: list[_Held] = []
        fails: list[_Held] = []
        failures: list[Failure] = []
        rare: list[_Held] = []
        results: dict[str, str] = {}
        for held in finished:
            outcome = held.run.outcome
            assert outcome is not None
            if outcome.kind == "complete":
                done.append(held)
                if outcome.result is not None:
                    results[held.lease.id] = outcome.result
            elif outcome.kind == "fail":
                assert outcome.failure is not None
                fails.append(held)
                failures.append(outcome.failure)
            else:
                rare.append(held)
        self._release_lost_claims()
        claim = None
        if limit > 0:
            claim = ClaimParams(
                queues=self.queues,
                limit=limit,
                lease_for=self.config.lease,
                worker_id=self.worker_id,
                now=self.clock.pinned(),
                isolated=isolated,
                token=token(),
                limited=self.limited,
                skip=self._skipped() if self._skipping else (),
            )
        sent = self.clock.monotonic()  # the driver's now is no earlier than this
        try:
            result = self.driver.job_cycle(
                Cycle(
                    completes=[h.lease for h in done],
                    failures=failures,
                    claim=claim,
                    results=results,
                ),
                now=self.clock.pinned(),
            )
        except BaseException:
            # The claim may have committed with its reply lost: its jobs, which this worker
            # never saw, go back (attempt refunded) before the next claim.
            if claim is not None:
                self._lost_claims.append(claim.token)
            raise
        self.stats.claimed += len(result.claimed)
        wake_in = result.wake_in
        self._rate_wake = None if wake_in is None else sent + wake_in.total_seconds()
        if done:
            self.stats.completed += len(result.completed)
            self._note_lost([h for h in done if h.job.id not in result.completed])
            if events.wanted("jobs.job.completed", events.INFO):  # `-v`: every completion
                for h in done:
                    if h.job.id in result.completed:
                        events.info("jobs.job.completed", h.job, **_fields(h))
        if fails:
            self._failed_written(fails, result.failed)
        self._write_rare(rare)
        return result.claimed

    def _skipped(self) -> tuple[str, ...]:
        """The job names this worker passes over now (``_prepare`` adds them)."""
        now = self.clock.monotonic()
        skipping = self._skipping.copy()  # handler threads write it meanwhile
        return tuple(sorted(name for name, until in skipping.items() if until > now))

    def _release_lost_claims(self) -> None:
        while self._lost_claims:
            released = self.driver.job_release_claim(self._lost_claims[0], now=self.clock.pinned())
            self._lost_claims.pop(0)
            if released:
                events.warning(
                    "jobs.worker.claim-released", jobs=",".join(released), count=len(released)
                )

    def _cycle_step(self) -> float:
        """One turn of the leader (the handler thread that runs the cycle): write the outcomes
        that arrived and claim for the free handlers, in one transaction, then queue the
        claimed jobs for the handlers (the leader among them). With nothing to write and
        nothing due, wait for a commit or a wake-up instead."""
        poll = self.config.poll_interval.total_seconds()
        limit, isolated = (0, False) if self._stop_claiming.is_set() else self._claim_limit()
        with self._lock:
            finished, self._pending = self._pending, []
            idle = not (finished or (limit and self._maybe_due))
            if idle:
                # Under the lock that outcomes are queued under: one queued from now on sees
                # the flag and sets _wake, so the wait below cannot sleep through it.
                self._leader_waiting = True
                self._wake.clear()
        if idle:
            wake_at = self._rate_wake
            if wake_at is not None:  # a rate window reopens then: no later than that
                left = wake_at - self.clock.monotonic()
                poll = min(poll, max(0.01, left + 0.002))
            try:
                if limit:
                    self.driver.wait_for_jobs(poll, self._wake)  # a commit, or a wake-up
                else:
                    self._wake.wait(poll)  # an outcome (an isolated job runs, say)
            finally:
                self._leader_waiting = False
            self._maybe_due = True
            return 0.0
        sent = time.monotonic()  # a lease lasts from when its claim was sent
        try:
            jobs = self._cycle(finished, limit, isolated=isolated)
        except BaseException:
            with self._lock:  # written next turn, in order
                self._pending[:0] = finished
            raise
        # Full: more may be due at once. Short: the queue is drained for now; wait.
        self._maybe_due = limit > 0 and len(jobs) == limit
        for held in finished:
            held.written = True
        with self._lock:
            for held in finished:
                if held.run.free:
                    self._held.pop(held.lease, None)
        if jobs:
            self._hand([_Held(job, self.handles(job.name), sent) for job in jobs], isolated)
        return 0.0

    def _claim_limit(self) -> tuple[int, bool]:
        """How many jobs to claim (one per free handler), and whether they are isolated ones:
        none while an isolated job runs, and one isolated job alone once nothing else runs."""
        alone = self._alone
        if alone is not None:
            if not alone.run.free:
                return 0, False
            self._alone = None
            # Another isolated job may wait: look before claiming others, so that isolated
            # jobs run back to back (each is exposed to a crash of the worker while it runs).
            self._next_isolation_check = 0.0
        with self._lock:
            busy = self._busy
        now = time.monotonic()
        if not self._isolating and now >= self._next_isolation_check:
            poll = self.config.poll_interval.total_seconds()
            self._next_isolation_check = now + min(poll, 1.0)
            self._isolating = self.driver.job_peek_isolated(self.queues, now=self.clock.pinned())
        if self._isolating:
            if busy:
                return 0, False  # let what runs finish first
            self._isolating = False
            return 1, True
        return self.config.concurrency - busy, False

    def _hand(self, batch: list[_Held], isolated: bool) -> None:
        """Queue claimed jobs (their starts recorded by the claim) for the handlers; async ones
        go to the event loop."""
        sync: list[_Held] = []
        for held in batch:
            if isolated:
                events.warning(
                    "jobs.job.isolated",
                    job_id=held.job.id,
                    job=held.job.name,
                    attempt=held.job.attempt,
                )
                self._alone = held
            if held.handle is None or not held.handle.is_async:
                sync.append(held)
        with self._cond:
            for held in batch:
                self._held[held.lease] = held
            self._busy += len(batch)
            self._ready.extend(sync)
        for held in batch:
            if held.handle is not None and held.handle.is_async:
                held.run.start()
                loop = self._event_loop()
                held.task = asyncio.run_coroutine_threadsafe(self._async_handler(held), loop)

    # -- handlers ------------------------------------------------------------------------------

    def _handler_thread(self, exiting: threading.Event) -> None:
        """A handler: runs the next ready job, or, when none is ready and no other thread
        leads, leads the cycle. A thread that ran a job queues its outcome, takes the next job
        and wakes no other thread while jobs are short: short jobs run on the threads that are
        awake, without a hand-off between threads for each one. ``exiting`` is this start's:
        a thread that outlives its worker's stop (a job past the shutdown grace) leaves the
        state of a restarted worker alone."""
        ran: _Held | None = None  # the job this thread just ran
        queued = False  # and its outcome is for the cycle to write
        while True:
            with self._cond:
                if exiting.is_set():
                    return
                if ran is not None:
                    self._busy -= 1
                    if queued:
                        self._pending.append(ran)
                        if self._leader_waiting:
                            # The leader sleeps until a job is due: wake it now to write this
                            # outcome, before this thread waits below for a job or the lead
                            # (waiting first left the outcome to the next poll).
                            self._wake.set()
                held = None
                while True:
                    if self._ready:
                        held = self._ready.popleft()
                        if self._ready and self._avg_run >= _SHORT_JOB:
                            self._cond.notify()  # long jobs: the next thread takes the next one
                        break
                    if exiting.is_set():
                        return
                    if not self._leading and self._leader_wanted():
                        self._leading = True
                        break
                    self._cond.wait()
            if ran is not None and not queued:
                self._maybe_free(ran)  # its lease was lost, say: nothing to write
            ran = None
            if held is None:
                self._lead()
            else:
                queued = self._run_held(held)
                ran = held

    def _leader_wanted(self) -> bool:
        """Under ``_lock``: is there a cycle to run (outcomes to write, or handlers to claim
        for)?"""
        if self._halt.is_set():
            return False
        if self._pending:
            return True
        return not self._stop_claiming.is_set() and self._busy < self.config.concurrency

    def _lead(self) -> None:
        pause: float | None = 0.0
        try:
            pause = self._cycle_loop.once()
            if pause:  # a backoff: keep the lead meanwhile, so no other thread retries sooner
                self._halt.wait(pause)
        finally:
            with self._cond:
                self._leading = False
                if (self._ready and self._avg_run >= _SHORT_JOB) or (
                    self._pending and not self._halt.is_set()
                ):
                    # Long jobs: the next thread takes the next one. Outcomes queued during
                    # this turn: a waiting thread leads to write them now, as this one may
                    # take a ready job first.
                    self._cond.notify()

    def _run_held(self, held: _Held) -> bool:
        """Run a ready job on this thread; True when its outcome is this thread's to queue."""
        held.run.start()  # the shutdown releases only what is still in ``_ready``
        outcome: Outcome | None
        try:
            prepared = self._prepare(held)
            if isinstance(prepared, Outcome):
                outcome = prepared
            else:
                timeout = held.handle.timeout if held.handle is not None else None
                held.started_at = started = time.monotonic()
                if timeout is not None:
                    held.deadline = started + timeout.total_seconds()
                outcome = self._call_sync(held, *prepared)
                assert held.duration is not None  # set by _call_sync
                # Unsynchronised on purpose: an average that loses an update now and then is
                # fine.
                self._avg_run = self._avg_run * 0.9 + held.duration * 0.1
                if held.timed_out:
                    outcome = self._timeout_outcome(held)
        except BaseException as exc:  # outcome_of catches all; this is the last resort
            outcome = self._failed(held, exc)
        won = held.run.settle(outcome)
        held.run.returned()
        return won

    async def _async_handler(self, held: _Held) -> None:
        try:
            held.started_at = time.monotonic()
            outcome = await self._run_async(held)
            self._settle(held, outcome)
        except BaseException as exc:
            self._settle(held, self._failed(held, exc))
        finally:
            self._returned(held)

    def _returned(self, held: _Held) -> None:
        """An async job is done: its slot (and outcome, if any) is the cycle's, and a handler
        thread is woken to write it (handler threads do this themselves)."""
        held.run.returned()
        with self._cond:
            self._busy -= 1
            self._cond.notify()
        self._maybe_free(held, wake=False)
        if self._leader_waiting:
            self._wake.set()

    def _settle(self, held: _Held, outcome: Outcome | None) -> None:
        """Offer the run's outcome; the first settler's is queued for the next cycle (the
        async handler's wakes a thread in ``_returned``; the shutdown writes its own)."""
        if outcome is not None and held.run.settle(outcome):
            with self._cond:
                self._pending.append(held)

    def _maybe_free(self, held: _Held, *, wake: bool = True) -> None:
        """Free the slot once nothing runs for the job and its outcome is written (or moot)."""
        if not held.run.free:
            return
        if held.run.outcome is not None and not held.written:
            return  # the cycle frees it after writing
        self._free(held, wake=wake)

    def _free(self, held: _Held, *, wake: bool = True) -> None:
        with self._lock:
            self._held.pop(held.lease, None)
        if wake:
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

    def _write_rare(self, batch: list[_Held]) -> None:
        """Snoozes, releases and cancels: one write each, after the cycle's transaction."""
        now = self.clock.pinned()
        for h in batch:
            outcome = h.run.outcome
            assert outcome is not None
            if outcome.kind in ("snooze", "release"):
                if self.driver.job_snooze(h.lease, outcome.delay, now=now):
                    if outcome.kind == "snooze":
                        self.stats.snoozed += 1
                        events.info("jobs.job.snoozed", h.job, **_fields(h))
                    else:
                        self.stats.released += 1
                else:
                    self._note_lost([h])
            else:
                if self.driver.job_cancel(h.job.id, reason=outcome.reason, lease=h.lease, now=now):
                    self.stats.cancelled += 1
                    events.info("jobs.job.cancelled", h.job, **_fields(h), reason=outcome.reason)
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
            if outcome.failure.retry_in is None:
                self.stats.dead += 1
                events.warning(
                    "jobs.job.dead",
                    h.job,
                    **_fields(h),
                    error=outcome.failure.error.kind,
                    dropped=outcome.drop,
                )
            else:
                self.stats.failed += 1
                events.info(
                    "jobs.job.retried",
                    h.job,
                    **_fields(h),
                    # The worker's reading of the due time the database computed.
                    retry_at=(self.clock.now() + outcome.failure.retry_in).isoformat(),
                    error=outcome.failure.error.kind,
                )
        if drops:
            self.driver.job_discard(drops)

    def _note_lost(self, refused: list[_Held]) -> None:
        """Writes that fencing refused: the lease had been lost (rescued, cancelled)."""
        for h in refused:
            with self._lock:  # the renew loop may be giving the same lease up (``_lose``)
                if h.lost:
                    continue
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
        with self._cond:
            if self._ready:  # a job waits behind a long one on an awake thread: wake the rest
                self._cond.notify_all()
            elif self._pending and not self._leading:
                # Outcomes wait behind a long job on the thread that queued them (short jobs
                # run back to back on one thread): a sleeping thread leads and writes them.
                self._cond.notify()
        self._check_stuck(held, now)
        self._check_event_loop(held, now)
        self._check_leases(held, now)
        stepped = self.clock.stepped_at()
        if now >= self._next_beat or stepped != self._seen_step:
            # A step of the wall clock: renew at once, so that a lease renewed on time in the
            # old time does not look expired in the new one (the rescuer waits for this).
            self._seen_step = stepped
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
            elif not h.run.settled:  # settled meanwhile: its write is fenced, and tells
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
        if rescued:  # claim what came back now, and look for isolated jobs at once
            self._next_isolation_check = 0.0
            self._wake.set()
        return self.maintenance.next_in()

    # -- shutdown ------------------------------------------------------------------------------

    def _shutdown(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        # Hold the lead: no cycle runs, so no claim lands after the release below.
        self._take_lead()
        maintenance = self._loops.get("maintenance")
        with self._cond:
            waiting = [h for h in self._ready if h.run.release()]  # never began: back at once
            self._ready.clear()
            self._busy -= len(waiting)
        for h in waiting:
            h.run.outcome = Outcome("release")
        with self._cond:
            self._pending.extend(waiting)
            self._leading = False  # handlers may write outcomes meanwhile (claims are over)
            self._cond.notify_all()
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
        self._take_lead()
        self._final_writes()
        with self._cond:
            self._exiting.set()
            self._cond.notify_all()
        if maintenance is not None:
            maintenance.join(30.0)
        self.maintenance.resign()
        self._halt.set()
        self._renew_now.set()
        for name in ("heartbeat", "renew", "presence"):
            beating = self._loops.get(name)
            if beating is not None:
                beating.join(5.0)
        self.presence.leave()
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
            self._reset_cycle()
        self._stopped.set()

    def _take_lead(self) -> None:
        """Wait for the cycle in flight (5 s at most after a hard stop: a leader stuck in a
        database call is not waited for), then hold the lead."""
        with self._cond:
            end = time.monotonic() + 5.0
            while self._leading:
                if self._hard_stop.is_set() and time.monotonic() >= end:
                    break
                self._cond.wait(0.05)
            self._leading = True

    def _final_writes(self) -> None:
        """Write what is left: retried while the database is away, until a hard stop."""
        backoff = 0.1
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                self._cycle(batch, 0)
            except JobsError as exc:
                if self._hard_stop.is_set():
                    return
                events.warning("jobs.loop.failed", loop="shutdown", error=type(exc).__name__)
                with self._lock:
                    self._pending[:0] = batch
                self._hard_stop.wait(backoff)
                backoff = min(5.0, backoff * 2)

    # -- running one job -----------------------------------------------------------------------

    def _prepare(self, held: _Held) -> tuple[JobHandle[Any], list[Any]] | Outcome:
        job = held.job
        handle = held.handle
        now = self.clock.now()
        if handle is None:
            return self._unknown(job, now)
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

    def _unknown(self, job: Job, now: datetime) -> Outcome:
        """A job whose name this worker lacks: given back for a worker that knows it, its
        attempt refunded and its due time kept (the grace counts from it), and passed over by
        this worker's claims for a while; dead-lettered as ``unknown_job`` once it has waited
        ``unknown_grace`` since it became due (no worker that knows it claimed it meanwhile:
        such a worker would have run it, and any outcome but a completion moves its due time).
        The wait is measured on the database's clock: from its due time to this claim."""
        names = ", ".join(self.registered()) or "none"
        grace = self.config.unknown_grace
        fix = "deploy the code that defines it to the workers of its queue, or discard the job"
        claimed_at = job.attempted_at if job.attempted_at is not None else now
        if claimed_at - job.run_at >= grace:
            error = attempt_error(
                job,
                "unknown_job",
                f"no job named {job.name!r} is registered in this worker (registered: {names}), "
                f"and no worker that knows it claimed it within {format_duration(grace)}",
                now,
            )
            events.warning(
                "jobs.job.unknown",
                job,
                **events.job_fields(job),
                registered=names,
                dead=True,
                fix=fix,
            )
            return Outcome("fail", failure=Failure(job.lease, error, None))
        until = self._skipping.get(job.name, 0.0)
        if until <= self.clock.monotonic():  # once per skip period, not for each job of the name
            events.warning(
                "jobs.job.unknown",
                job,
                **events.job_fields(job),
                registered=names,
                dead=False,
                waits_until=(job.run_at + grace).isoformat(),
                fix=fix,
            )
        self._skipping[job.name] = self.clock.monotonic() + min(
            _UNKNOWN_SKIP, grace.total_seconds()
        )
        return Outcome("release", delay=None)

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
        began = _job_started(held)
        try:
            value = handle.fn(*args)
        except BaseException as exc:
            outcome = self.outcome_of(held, exc)
        else:
            outcome = Outcome("complete") if value is None else self._completed(held, value)
        finally:
            current_app.reset(reset)
        _job_finished(held, outcome, began)
        return outcome

    async def _run_async(self, held: _Held) -> Outcome | None:
        prepared = self._prepare(held)
        if isinstance(prepared, Outcome):
            return prepared
        handle, args = prepared
        reset = current_app.set(self.app)
        timeout = handle.timeout.total_seconds() if handle.timeout is not None else None
        began = _job_started(held)
        outcome: Outcome | None
        try:
            value = await asyncio.wait_for(handle.fn(*args), timeout)
        except TimeoutError:
            outcome = self._timeout_outcome(held)
        except asyncio.CancelledError:
            outcome = None  # cancelled by the worker, which has settled this run already
        except BaseException as exc:
            outcome = self.outcome_of(held, exc)
        else:
            outcome = Outcome("complete") if value is None else self._completed(held, value)
        finally:
            current_app.reset(reset)
        _job_finished(held, outcome, began)
        return outcome

    def _completed(self, held: _Held, value: Any) -> Outcome:
        """A handler returned ``value``: a completion with its result as JSON text, or, when
        it cannot be stored (not JSON, over the payload limit), a failure parked as dead at
        once: the function ran to its end, so a retry would repeat its effects only to return
        the same value."""
        try:
            return Outcome("complete", result=self.serializer.dumps(value, path="result"))
        except SerializationError as exc:
            error = error_from_exception(held.job, exc, self.clock.now())
            return Outcome("fail", failure=Failure(held.lease, error, None))

    def outcome_of(self, held: _Held, exc: BaseException) -> Outcome:
        """What a handler's exception means (shared by sync and async handlers). Never raises:
        a bad ``Snooze`` or an unrepresentable retry time becomes a failure of the job."""
        try:
            if isinstance(exc, Snooze):
                return Outcome("snooze", delay=exc.delay)
            if isinstance(exc, Cancel):
                return Outcome("cancel", reason=exc.reason)
            return self._failed(held, exc)
        except BaseException as inner:
            return self._failed(held, inner)

    def _failed(self, held: _Held, exc: BaseException) -> Outcome:
        now = self.clock.now()
        error = error_from_exception(held.job, exc, now)
        try:
            failure, drop = decide_failure(held.job, held.handle, error)
        except (OverflowError, ValueError):
            failure, drop = Failure(held.lease, error, None), False  # cannot retry: park it
        return Outcome("fail", failure=failure, drop=drop)

    def _timeout_outcome(self, held: _Held) -> Outcome:
        now = self.clock.now()
        timeout = held.handle.timeout if held.handle is not None else None
        error = attempt_error(
            held.job, "timeout", f"the job ran longer than its timeout of {timeout}", now
        )
        failure, drop = decide_failure(held.job, held.handle, error)
        return Outcome("fail", failure=failure, drop=drop)


def _fields(h: _Held) -> dict[str, Any]:
    """The fields of a job's outcome events."""
    duration = None if h.duration is None else round(h.duration, 6)
    return {**events.job_fields(h.job), "duration": duration}


def _job_started(held: _Held) -> float:
    """``jobs.job.started``, on the thread (or task) about to call the job's function: a
    tracing subscriber opens its span here. Returns the monotonic start."""
    if events.wanted("jobs.job.started", events.DEBUG):
        job = held.job
        at = job.attempted_at
        events.debug(
            "jobs.job.started",
            job,
            **events.job_fields(job),
            queue_latency=None
            if at is None
            else round(max(0.0, (at - job.run_at).total_seconds()), 6),
        )
    return time.monotonic()


def _job_finished(held: _Held, outcome: Outcome | None, began: float) -> None:
    """The function is done: how long it ran, and ``jobs.job.finished`` on the same thread
    (or task)."""
    held.duration = duration = time.monotonic() - began
    if events.wanted("jobs.job.finished", events.DEBUG):
        job = held.job
        failure = outcome.failure if outcome is not None else None
        events.debug(
            "jobs.job.finished",
            job,
            **events.job_fields(job),
            outcome=events.outcome_of(
                None if outcome is None else outcome.kind,
                failure is not None and failure.retry_in is None,
            ),
            duration=round(duration, 6),
            error=None if failure is None else failure.error.kind,
        )


class StuckError(Exception):
    """Every slot is held by a thread past its timeout, for longer than the stuck limit."""
