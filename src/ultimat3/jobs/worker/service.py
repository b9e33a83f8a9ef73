"""The worker's lifecycle and its handler threads. Who owns a job, step by step:

1. **cycle** (``writes``): one transaction writes the outcomes that finished and claims one job
   per free handler; each claimed job gets a ``Run`` (``ultimat3.jobs.run``), its one owner.
2. **handlers**: ``concurrency`` threads (``async def`` jobs run on one event loop). Each takes
   the next ready job and offers its ``Outcome`` (``handlers``) with ``run.settle()``: the
   first settler wins (the handler, a lost lease, shutdown). A thread with no ready job
   *leads*: it runs the next cycle under the cycle's ``supervise.Loop`` policy (``Loop.once``),
   so a short job's thread writes its outcome, claims the next job and runs it with no
   hand-off between threads; while jobs are long (``short_job``), each ready job wakes a thread
   of its own. A leader with nothing to do sleeps until a job is due (``wait_for_jobs``); a
   returning job wakes it at once. Outcomes that wait behind a long job are handed to a
   sleeping thread by the heartbeat (within 100 ms). A slot frees once its run is settled,
   its outcome written and its handler returned.
3. **heartbeat** and **renew** loops (``beat``); 4. the **maintenance** loop (rescue, prune:
   ``ultimat3.jobs.maintenance``, which also says how a job that kills its worker is isolated)
   until the drain begins, and the worker's row (``presence``) until it stops.

The worker's own lifecycle (running, draining, stopped; a hard stop; signals; names it skips)
is one ``run.Life`` changed by one transition function (``_apply``); the threads wait on events
that follow it. A job whose name this worker lacks (a rolling deploy) is given back and passed
over a while (``handlers``). A critical loop that keeps failing stops the worker with
``exit_code`` 70, releasing what it holds, for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

from ultimat3.jobs import events, supervise
from ultimat3.jobs.clock import Backoff, Clock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import JobsError
from ultimat3.jobs.ids import token
from ultimat3.jobs.job import Enqueuer, JobHandle
from ultimat3.jobs.maintenance import Maintenance
from ultimat3.jobs.presence import Presence
from ultimat3.jobs.records import Lease
from ultimat3.jobs.run import (
    Event,
    Fatal,
    Life,
    Phase,
    Signal,
    Start,
    Stop,
    StopNow,
    Stopped,
    transition,
)
from ultimat3.jobs.serialization import Serializer
from ultimat3.jobs.supervise import Loop
from ultimat3.jobs.wake import Wake
from ultimat3.jobs.worker.beat import Beat
from ultimat3.jobs.worker.config import FATAL_EXIT, WorkerConfig, WorkerStats
from ultimat3.jobs.worker.handlers import Handlers, Held, Outcome
from ultimat3.jobs.worker.writes import Writer

__all__ = ["Worker"]


class Worker(Beat, Handlers, Writer):
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
        backoff: Backoff | None = None,
        unknown_skip: float = 60.0,
        loop_blocked_after: float = 1.0,
        short_job: float = 0.002,
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
        #: The back-off of every loop of this worker after a failed step (``supervise.Loop``),
        #: and of the shutdown's last writes; read when the worker starts.
        self.backoff = backoff or supervise.BACKOFF
        self.unknown_grace = self.config.unknown_grace
        #: How long a worker passes over a job name it lacks (a rolling deploy) before it
        #: claims a job of that name again (at most ``unknown_grace``).
        self.unknown_skip = unknown_skip
        self.loop_blocked_after = loop_blocked_after
        #: A job shorter than this on average runs on the thread that took it without waking
        #: another for the next one (see ``_handler_thread``).
        self.short_job = short_job
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

        self._life = Life()
        self._life_lock = threading.Lock()
        self._signals = 0  # counted by the signal handler, fed to ``_apply`` by ``run()``
        self._lock = threading.Lock()
        #: Handler threads wait on it for ready jobs.
        self._cond = threading.Condition(self._lock)
        self._held: dict[Lease, Held] = {}  # by lease: a job can have a zombie run and a new one
        self._wake = Wake()  # wakes the cycle: an outcome, a free slot, a stop (see wake.py)
        #: When (on ``clock.monotonic()``) the last claim's full rate window reopens: the wait
        #: the driver measured on its own clock (``CycleResult.wake_in``) from the claim's send.
        self._rate_wake: float | None = None
        # Events the threads wait on, set by ``_apply`` as the lifecycle moves.
        self._stop_claiming = threading.Event()
        self._hard_stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._halt = threading.Event()
        self._reset_cycle()
        self._handlers: list[threading.Thread] = []
        self._loops: dict[str, Loop] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_done = threading.Event()  # set when the event loop's thread ends
        self._loop_seen = clock.monotonic()
        self._loop_blocked = False
        self._next_isolation_check = 0.0
        self._stuck_since: float | None = None
        self._next_beat = 0.0
        self._seen_step = clock.stepped_at()

    def _reset_cycle(self) -> None:
        """The cycle's state. Under ``_lock``: ``_ready``, ``_pending``, ``_busy``,
        ``_leading``; the rest is the leader's alone."""
        self._ready: deque[Held] = deque()  # claimed, started, waiting for a handler thread
        self._pending: list[Held] = []  # settled, to be written by the next cycle
        self._busy = 0  # claimed and not returned by its handler
        self._leading = False  # a thread runs the cycle (or the shutdown holds it)
        self._exiting = threading.Event()  # this start's handler threads return
        self._leader_waiting = False  # the leader waits for jobs: wake it for outcomes
        self._alone: Held | None = None  # an isolated job running alone
        self._isolating = False
        self._maybe_due = True  # claim at once: the last claim filled up, or a wake-up came
        self._lost_claims: list[str] = []  # tokens of claims whose reply may have been lost
        self._avg_run = 1.0  # seconds; starts long, so that threads wake for each job at first
        #: The cycle's policy (``Loop.once``): the handler threads take turns at leading it.
        self._cycle_loop = self._supervised("cycle", self._cycle_step, stop=threading.Event())
        self._renew_now = threading.Event()  # the heartbeat asks the renew loop to go
        self._clock_checked = False  # the host's clock against the database's (_presence_step)

    def _supervised(
        self,
        name: str,
        step: Callable[[], float],
        *,
        stop: threading.Event,
        critical: bool = True,
    ) -> Loop:
        return Loop(
            name,
            step,
            on_fatal=self._fatal if critical else None,
            stop=stop,
            backoff=self.backoff,
            clock=self.clock,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def exit_code(self) -> int:
        """0 after a clean stop; FATAL_EXIT when a loop could not go on."""
        return self._life.exit_code

    def _apply(self, event: Event) -> tuple[Life, Life]:
        """Move the worker's lifecycle by ``event`` (``run.transition``) and make it so: set
        the events the threads wait on, begin the drain. Returns the states before and
        after."""
        with self._life_lock:
            before = self._life
            self._life = after = transition(before, event)
            if after.phase is Phase.RUNNING and before.phase is Phase.STOPPED:
                self._stopped.clear()
                self._stop_claiming.clear()
                self._hard_stop.clear()
        if after.hard and not before.hard:
            self._hard_stop.set()
        if after.phase is Phase.DRAINING and before.phase is Phase.RUNNING:
            self._stop_claiming.set()
            self._wake.set()
            threading.Thread(
                target=self._shutdown, args=(after.grace,), name="ultimat3-jobs-stop", daemon=True
            ).start()
        if after.phase is Phase.STOPPED and before.phase is not Phase.STOPPED:
            self._stopped.set()
        return before, after

    def start(self) -> None:
        """Start claiming in background threads. Idempotent."""
        before, _ = self._apply(Start())
        if before.phase is not Phase.STOPPED:
            return
        self._halt = halt = threading.Event()
        self._cycle_loop.backoff = self.backoff
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
            "heartbeat": self._supervised("heartbeat", self._heartbeat_step, stop=halt),
            "renew": self._supervised("renew", self._renew_step, stop=halt),
            "maintenance": self._supervised(
                "maintenance", self._maintenance_step, stop=halt, critical=False
            ),
        }
        self._presence_due = 0.0
        self.presence.restarted(self.clock.now())
        for loop in self._loops.values():
            loop.start()
        events.info(
            "jobs.worker.started",
            worker_id=self.worker_id,
            queues=",".join(self.queues),
            concurrency=self.config.concurrency,
        )

    def _grace(self, grace: timedelta | float | None = None) -> float:
        if grace is None:
            return self.config.shutdown_grace.total_seconds()
        if isinstance(grace, timedelta):
            return grace.total_seconds()
        return float(grace)

    def stop(self, grace: timedelta | float | None = None, *, wait: bool = True) -> None:
        """Stop claiming, let in-flight jobs finish for ``grace`` (default ``shutdown_grace``),
        release the rest without consuming their attempt, and stop every thread."""
        self._apply(Stop(self._grace(grace)))
        if wait:
            self._stopped.wait()

    def stop_now(self) -> None:
        """Release in-flight jobs at once and stop (a second SIGTERM)."""
        self._apply(StopNow(self._grace()))

    def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Run until stopped: SIGTERM/SIGINT stop gracefully, a second one at once.
        ``exit_code`` says afterwards whether a loop could not go on."""
        previous: dict[int, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            while True:
                # The handler only counts: a transition takes the lifecycle's lock, and a
                # signal landing inside one (on the same thread) would wait on it forever.
                # This loop feeds each signal to the lifecycle instead, one received before
                # the start included.
                while self._life.signals < self._signals:
                    self._apply(Signal(self._grace()))
                if self.clock.sleep(0.1, self._stopped):
                    break
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.stats

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        events.warning(
            "jobs.worker.signal",
            signal=signum,
            count=self._signals,
            # Started jobs (claimed ones not begun go back at once). No lock in a signal
            # handler: each len is atomic, and the sentence needs no more.
            running=max(0, len(self._held) - len(self._ready)),
            grace=self.config.shutdown_grace.total_seconds(),
        )

    def _fatal(self, loop: str, exc: BaseException) -> None:
        """A critical loop cannot go on: release what we hold and stop, with a non-zero exit."""
        events.error("jobs.worker.fatal", loop=loop, error=type(exc).__name__)
        self._apply(Fatal(FATAL_EXIT, self._grace()))

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
        finished: list[Held] = []
        try:
            while True:
                limit = self.config.concurrency
                if max_jobs is not None:
                    limit = min(limit, max_jobs - done)
                if limit <= 0 and not finished:
                    break
                sent = self.clock.monotonic()
                jobs = self._cycle(finished, limit)
                finished = []
                if not jobs and limit > 0:
                    jobs = self._cycle([], 1, isolated=True)
                if not jobs:
                    break
                for job in jobs:
                    held = Held(job, self.handles(job.name), sent)
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
                    self.clock.sleep(poll, self._wake)  # an outcome (an isolated job runs)
            finally:
                self._leader_waiting = False
            self._maybe_due = True
            return 0.0
        sent = self.clock.monotonic()  # a lease lasts from when its claim was sent
        try:
            jobs = self._cycle(finished, limit, isolated=isolated)
        except BaseException:
            with self._lock:  # written next turn, in order
                self._pending[:0] = finished
            raise
        # Full: more may be due at once. Short: the queue is drained for now; wait.
        self._maybe_due = limit > 0 and len(jobs) == limit
        for held in finished:
            held.run.wrote()
        with self._lock:
            for held in finished:
                if held.run.free:
                    self._held.pop(held.lease, None)
        if jobs:
            self._hand([Held(job, self.handles(job.name), sent) for job in jobs], isolated)
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
        now = self.clock.monotonic()
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

    def _hand(self, batch: list[Held], isolated: bool) -> None:
        """Queue claimed jobs (their starts recorded by the claim) for the handlers; async ones
        go to the event loop."""
        sync: list[Held] = []
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
        ran: Held | None = None  # the job this thread just ran
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
                        if self._ready and self._avg_run >= self.short_job:
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
                self.clock.sleep(pause, self._halt)
        finally:
            with self._cond:
                self._leading = False
                if (self._ready and self._avg_run >= self.short_job) or (
                    self._pending and not self._halt.is_set()
                ):
                    # Long jobs: the next thread takes the next one. Outcomes queued during
                    # this turn: a waiting thread leads to write them now, as this one may
                    # take a ready job first.
                    self._cond.notify()

    def _run_held(self, held: Held) -> bool:
        """Run a ready job on this thread; True when its outcome is this thread's to queue."""
        held.run.start()  # the shutdown releases only what is still in ``_ready``
        outcome: Outcome | None
        try:
            prepared = self._prepare(held)
            if isinstance(prepared, Outcome):
                outcome = prepared
            else:
                timeout = held.handle.timeout if held.handle is not None else None
                held.started_at = started = self.clock.monotonic()
                if timeout is not None:
                    held.deadline = started + timeout.total_seconds()
                outcome = self._call_sync(held, *prepared)
                assert held.duration is not None  # set by _call_sync
                # Unsynchronised on purpose: an average that loses an update now and then is
                # fine.
                self._avg_run = self._avg_run * 0.9 + held.duration * 0.1
                if held.run.timed_out:
                    outcome = self._timeout_outcome(held)
        except BaseException as exc:  # outcome_of catches all; this is the last resort
            outcome = self._failed(held, exc)
        won = held.run.settle(outcome)
        held.run.returned()
        return won

    async def _async_handler(self, held: Held) -> None:
        try:
            held.started_at = self.clock.monotonic()
            outcome = await self._run_async(held)
            self._settle(held, outcome)
        except BaseException as exc:
            self._settle(held, self._failed(held, exc))
        finally:
            self._returned(held)

    def _returned(self, held: Held) -> None:
        """An async job is done: its slot (and outcome, if any) is the cycle's, and a handler
        thread is woken to write it (handler threads do this themselves)."""
        held.run.returned()
        with self._cond:
            self._busy -= 1
            self._cond.notify()
        self._maybe_free(held, wake=False)
        if self._leader_waiting:
            self._wake.set()

    def _settle(self, held: Held, outcome: Outcome | None) -> None:
        """Offer the run's outcome; the first settler's is queued for the next cycle."""
        if outcome is not None and held.run.settle(outcome):
            with self._cond:
                self._pending.append(held)

    def _maybe_free(self, held: Held, *, wake: bool = True) -> None:
        """Free the slot once nothing runs for the job and its outcome is written (or moot)."""
        if held.run.free:
            self._free(held, wake=wake)

    def _free(self, held: Held, *, wake: bool = True) -> None:
        with self._lock:
            self._held.pop(held.lease, None)
        if wake:
            self._wake.set()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._loop_done = done = threading.Event()

                def run() -> None:
                    try:
                        loop.run_forever()
                    finally:
                        done.set()

                thread = threading.Thread(target=run, name="ultimat3-jobs-asyncio", daemon=True)
                thread.start()
                self._loop, self._loop_thread = loop, thread
                self._loop_seen = self.clock.monotonic()
            return self._loop

    # -- maintenance ---------------------------------------------------------------------------

    def _maintenance_step(self) -> float:
        """Write this worker's row when due (until it stops), and rescue and prune when due
        (until its drain begins)."""
        now = self.clock.monotonic()
        if now >= self._presence_due:
            self._presence_due = now + self._presence_step()
        pause = self._presence_due - now
        if self._stop_claiming.is_set():
            return pause
        rescued = self.maintenance.tick(
            rescue_every=self.config.rescue_interval.total_seconds(),
            prune_every=self.config.prune_interval.total_seconds(),
        )
        self.stats.rescued += rescued
        if rescued:  # claim what came back now, and look for isolated jobs at once
            self._next_isolation_check = 0.0
            self._wake.set()
        return min(pause, self.maintenance.next_in())

    # -- shutdown ------------------------------------------------------------------------------

    def _shutdown(self, grace: float) -> None:
        deadline = self.clock.monotonic() + grace
        # Hold the lead: no cycle runs, so no claim lands after the release below.
        self._take_lead()
        with self._cond:
            release = Outcome("release")
            waiting = [h for h in self._ready if h.run.release(release)]  # never began
            self._ready.clear()
            self._busy -= len(waiting)
            self._pending.extend(waiting)  # back at once
            self._leading = False  # handlers may write outcomes meanwhile (claims are over)
            self._cond.notify_all()
        while self.inflight and self.clock.monotonic() < deadline:
            if self.clock.sleep(0.05, self._hard_stop):
                break
        with self._lock:
            remaining = [h for h in self._held.values() if not h.run.settled]
        for h in remaining:
            h.cancelled.set()
            if h.task is not None:
                h.task.cancel()
            if h.run.timed_out:
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
        self._halt.set()
        self._renew_now.set()
        for name in ("maintenance", "heartbeat", "renew"):
            loop = self._loops.get(name)
            if loop is not None:
                loop.join(30.0 if name == "maintenance" else 5.0)
        self.maintenance.resign()
        self.presence.leave()
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self.clock.sleep(5.0, self._loop_done)
            if not self._loop.is_running():
                self._loop.close()
        events.info("jobs.worker.stopped", worker_id=self.worker_id, released=len(remaining))
        with self._lock:
            self._loops = {}
            self._handlers = []
            self._loop = None
            self._held = {}
            self._reset_cycle()
        self._apply(Stopped())

    def _take_lead(self) -> None:
        """Wait for the cycle in flight (5 s at most after a hard stop: a leader stuck in a
        database call is not waited for), then hold the lead."""
        end = self.clock.monotonic() + 5.0
        while True:
            with self._cond:
                if not self._leading or (
                    self._hard_stop.is_set() and self.clock.monotonic() >= end
                ):
                    self._leading = True
                    return
            self.clock.sleep(0.05)

    def _final_writes(self) -> None:
        """Write what is left: retried while the database is away (``backoff``), until a
        hard stop."""
        wait = 0.0
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
                wait = self.backoff.after(wait)
                self.clock.sleep(wait, self._hard_stop)
