"""The worker's lifecycle and its handler threads. Who owns a job, step by step:

1. **cycle** (``writes``), one supervised loop (``supervise.Loop``) on a thread of its own:
   each turn is one transaction that writes every outcome queued by then and claims one job
   per free handler; each claimed job gets a ``Run`` (``ultimat3.jobs.run``), its one owner,
   and goes on one ready queue. Outcomes that arrive during a turn wait for the next one, so
   a turn writes a batch. With nothing to write and nothing due the loop sleeps until a job
   is due (``wait_for_jobs``) or an outcome arrives (only a sleeping loop is woken).
2. **handlers**: ``concurrency`` threads (``async def`` jobs run on one event loop) only run
   jobs: each takes the next ready job and offers its ``Outcome`` (``handlers``) with
   ``run.settle()``: the first settler wins (the handler, a lost lease, shutdown). A batch
   wakes one thread, and a thread that takes a job wakes one more while jobs wait, so long
   jobs start side by side and short ones run on the threads already awake. A slot frees
   once its run is settled, its outcome written and its handler returned.
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
        self._held: dict[Lease, Held] = {}  # by lease: a job can have a zombie run and a new one
        #: The cycle loop sleeps on one of these (``_cycle_waiting``): ``_wake`` while it waits
        #: for jobs too (``wait_for_jobs``, which can wait on a file and ``_wake`` at once, see
        #: wake.py), ``_rest`` while every slot is busy (no file to watch: a plain event).
        self._wake = Wake()
        self._rest = threading.Event()
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
        ``_cycle_waiting``, ``_sleepers``, ``_called``; the rest is the cycle loop's alone."""
        self._ready: deque[Held] = deque()  # claimed, started, waiting for a handler thread
        self._pending: list[Held] = []  # settled, to be written by the next cycle
        self._busy = 0  # claimed and not returned by its handler
        #: The gates of the handler threads waiting for a ready job, the last to wait on top:
        #: a lock each, held while its thread waits, released to wake it.
        self._sleepers: list[threading.Lock] = []
        self._called = False  # a handler thread was woken for a ready job and is not back yet
        self._exiting = threading.Event()  # this start's handler threads return
        #: The event the cycle loop sleeps on (None: it runs a turn): set it for an outcome.
        self._cycle_waiting: threading.Event | None = None
        self._alone: Held | None = None  # an isolated job running alone
        self._isolating = False
        self._maybe_due = True  # claim at once: the last claim filled up, or a wake-up came
        self._lost_claims: list[str] = []  # tokens of claims whose reply may have been lost
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
            self._poke()
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
        # This start's: a stop racing this start stops (and replaces) them.
        cycle, exiting = self._cycle_loop, self._exiting
        cycle.backoff = self.backoff
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
        cycle.start()
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
        """One turn of the cycle loop: write the outcomes queued by now and claim for the free
        handlers, in one transaction, then queue the claimed jobs for the handlers. With
        nothing to write and nothing due, wait for a commit or a wake-up instead."""
        poll = self.config.poll_interval.total_seconds()
        isolated = self._claim_kind()
        if isolated is not None and self._wake.is_set():
            self._wake.clear()  # before the lock (a system call: wake.py), so before any set
        with self._lock:
            if isolated is None:
                limit = 0
            else:
                limit = 1 if isolated else self.config.concurrency - self._busy
            # Until a batch has begun, no slot is free and its outcomes are still arriving:
            # they are written together once it has (``_begun``, ``_wake_cycle``).
            idle = not self._begun() or not (self._pending or (limit and self._maybe_due))
            finished: list[Held] = []
            if idle:
                # Under the lock that outcomes are queued under: one queued from now on sets
                # the event, so the wait below cannot sleep through it.
                self._cycle_waiting = self._wake if limit else self._rest
                if not limit:
                    self._rest.clear()
            else:
                finished, self._pending = self._pending, []
        if idle:
            wake_at = self._rate_wake
            if wake_at is not None:  # a rate window reopens then: no later than that
                left = wake_at - self.clock.monotonic()
                poll = min(poll, max(0.01, left + 0.002))
            try:
                if limit:
                    self.driver.wait_for_jobs(poll, self._wake)  # a commit, or a wake-up
                else:
                    self.clock.sleep(poll, self._rest)  # an outcome, a free slot, a stop
            finally:
                with self._lock:
                    self._cycle_waiting = None
            self._maybe_due = True
            return 0.0
        sent = self.clock.monotonic()  # a lease lasts from when its claim was sent
        try:
            jobs = self._cycle(finished, limit, isolated=bool(isolated))
        except BaseException:
            with self._lock:  # written next turn, in order
                self._pending[:0] = finished
            raise
        if limit:  # full: more may be due at once; short: the queue is drained for now, wait
            self._maybe_due = len(jobs) == limit
        for held in finished:
            held.run.wrote()
        with self._lock:
            for held in finished:
                if held.run.free:
                    self._held.pop(held.lease, None)
        if jobs:
            self._hand([Held(job, self.handles(job.name), sent) for job in jobs], bool(isolated))
        return 0.0

    def _claim_kind(self) -> bool | None:
        """What to claim: None, nothing (the drain, or an isolated job runs, or waits for
        what runs to finish); True, one isolated job alone (nothing else runs); False, one
        job per free handler (counted by the turn, under the lock that handlers return
        under)."""
        if self._stop_claiming.is_set():
            return None
        alone = self._alone
        if alone is not None:
            if not alone.run.free:
                return None
            self._alone = None
            # Another isolated job may wait: look before claiming others, so that isolated
            # jobs run back to back (each is exposed to a crash of the worker while it runs).
            self._next_isolation_check = 0.0
        now = self.clock.monotonic()
        if not self._isolating and now >= self._next_isolation_check:
            poll = self.config.poll_interval.total_seconds()
            self._next_isolation_check = now + min(poll, 1.0)
            self._isolating = self.driver.job_peek_isolated(self.queues, now=self.clock.pinned())
        if self._isolating:
            with self._lock:
                if self._busy:
                    return None  # let what runs finish first
            self._isolating = False
            return True
        return False

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
        with self._lock:
            for held in batch:
                self._held[held.lease] = held
            self._busy += len(batch)
            if self._stop_claiming.is_set():
                # The drain began during this turn: what it claimed goes back at once (the
                # shutdown released what was ready before).
                self._release_ready(batch)
                return
            self._ready.extend(sync)
            self._call_handler()
        for held in batch:
            if held.handle is not None and held.handle.is_async:
                held.run.start()
                loop = self._event_loop()
                held.task = asyncio.run_coroutine_threadsafe(self._async_handler(held), loop)

    def _release_ready(self, batch: list[Held] | deque[Held]) -> None:
        """Under ``_lock``: give back claimed jobs whose handlers never began (attempt
        refunded): the cycle writes the releases."""
        release = Outcome("release")
        waiting = [h for h in batch if h.run.release(release)]
        self._busy -= len(waiting)
        self._pending.extend(waiting)
        self._wake_cycle()

    def _call_handler(self) -> None:
        """Under ``_lock``: wake one waiting handler thread for the ready jobs, unless one is
        on its way already (it wakes the next as it takes a job: see ``_handler_thread``)."""
        if self._ready and not self._called and self._sleepers:
            self._called = True
            self._sleepers.pop().release()  # the last to wait: the likeliest to be running

    def _begun(self) -> bool:
        """Under ``_lock``: has the last batch begun: does no claimed job wait for a handler,
        and is no handler thread woken for one on its way? A woken thread that finds its job
        taken by another goes back to wait: the cycle's turn waits for that, so that the two
        do not take turns at the interpreter's lock in the middle of a transaction."""
        return not self._ready and not self._called

    def _poke(self) -> None:
        """Wake the cycle loop whatever it waits on (a stop, a rescue, a slot freed)."""
        self._wake.set()
        self._rest.set()

    def _wake_cycle(self) -> None:
        """Under ``_lock``: wake the cycle loop if it sleeps (once: a turn that is running
        writes what was queued meanwhile at its next turn). A handler thread calls it when it
        returns and no claimed job waits for a handler: a batch's outcomes are then written
        together (while one waits, a handler is on its way to it: ``_call_handler``). The
        outcomes of short jobs that wait behind a long one on the thread that ran them are
        the heartbeat's to hand over (``Beat._heartbeat_step``)."""
        waiting = self._cycle_waiting
        if waiting is not None:
            self._cycle_waiting = None
            waiting.set()

    # -- handlers ------------------------------------------------------------------------------

    def _handler_thread(self, exiting: threading.Event) -> None:
        """A handler: runs the next ready job and queues its outcome for the cycle loop.
        ``exiting`` is this start's: a thread that outlives its worker's stop (a job past the
        shutdown grace) leaves the state of a restarted worker alone."""
        gate = threading.Lock()
        gate.acquire()
        woken = False
        while True:
            with self._lock:
                if exiting.is_set():
                    return
                if woken:
                    self._called = woken = False
                    if not self._ready:
                        self._wake_cycle()  # called for a job another thread took: the
                        # batch has begun once this thread is back (``_begun``)
                if not self._ready:
                    self._sleepers.append(gate)
                    held = None
                else:
                    held = self._ready.popleft()
                    self._call_handler()  # the next ready job starts beside this one
            if held is None:
                gate.acquire()  # until _call_handler or the shutdown releases it
                woken = True
                continue
            queued = self._run_held(held)
            with self._lock:
                if exiting.is_set():
                    return
                self._busy -= 1
                if queued:
                    self._pending.append(held)
                if self._begun():
                    self._wake_cycle()  # write the outcome, or claim for the free slot
            if not queued:
                self._maybe_free(held)  # its lease was lost, say: nothing to write

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
            outcome = await self._run_async(held, watched=True)
            self._settle(held, outcome)
        except BaseException as exc:
            self._settle(held, self._failed(held, exc))
        finally:
            self._returned(held)

    def _returned(self, held: Held) -> None:
        """An async job is done: its slot (and outcome, if any) is the cycle's."""
        held.run.returned()
        with self._lock:
            self._busy -= 1
            self._wake_cycle()
        self._maybe_free(held, wake=False)

    def _settle(self, held: Held, outcome: Outcome | None) -> None:
        """Offer the run's outcome; the first settler's is queued for the next cycle."""
        if outcome is not None and held.run.settle(outcome):
            with self._lock:
                self._pending.append(held)

    def _maybe_free(self, held: Held, *, wake: bool = True) -> None:
        """Free the slot once nothing runs for the job and its outcome is written (or moot)."""
        if held.run.free:
            self._free(held, wake=wake)

    def _free(self, held: Held, *, wake: bool = True) -> None:
        with self._lock:
            self._held.pop(held.lease, None)
        if wake:
            self._poke()

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
            self._poke()
        return min(pause, self.maintenance.next_in())

    # -- shutdown ------------------------------------------------------------------------------

    def _shutdown(self, grace: float) -> None:
        deadline = self.clock.monotonic() + grace
        with self._lock:  # jobs that never began go back at once (claims are over: _hand)
            self._release_ready(self._ready)
            self._ready.clear()
        # The cycle loop writes outcomes as they come meanwhile.
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
        self._stop_cycle()
        self._final_writes()
        with self._lock:
            self._exiting.set()
            for sleeper in self._sleepers:
                sleeper.release()
            self._sleepers.clear()
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

    def _stop_cycle(self) -> None:
        """Stop the cycle loop after its turn in flight (5 s at most after a hard stop: a turn
        stuck in a database call is not waited for); the shutdown writes what is left."""
        loop = self._cycle_loop
        loop.stopping.set()
        self._poke()
        end: float | None = None
        while not loop.done.is_set() and loop.alive:
            if self._hard_stop.is_set():
                now = self.clock.monotonic()
                end = now + 5.0 if end is None else end
                if now >= end:
                    return
                self.clock.sleep(min(0.05, end - now), loop.done)
            else:
                self.clock.sleep(0.05, loop.done)
        loop.join(5.0)

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
