"""A worker's heartbeat: the loops that keep what it holds alive and watched.

- **heartbeat** (never waits for the database): marks jobs past their timeout on the worker's
  clock (``Run.time_out``, ``ctx.cancelled``) and cancels an async job's task (the one
  timeout of both kinds of job), logs ``jobs.worker.stuck`` (and exits past ``stuck_limit``)
  and an event loop blocked by an async job, gives up leases whose renewal has gone
  unconfirmed for ``lease - heartbeat/2`` (``Run.lose``: before the database can have expired
  them, so before they can have been rescued elsewhere; not on a single-writer database,
  where a stall holds the rescuer too), and asks the renew loop to go every heartbeat, or at
  once after a step of the wall clock.
- **renew**: renews every held lease (``lease_extend``); a lease the database no longer
  grants is lost (``jobs.lease.lost``). A renewal stalled on the database blocks this loop
  only.
- **presence** (a step of the maintenance loop): writes the worker's row, and compares the
  host's clock with the database's once.

It reads the worker's held runs and changes them only through their ``Run`` events.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import Driver, check_clock_skew
from ultimat3.jobs.errors import JobsError
from ultimat3.jobs.presence import Presence
from ultimat3.jobs.records import Lease
from ultimat3.jobs.worker.config import StuckError, WorkerConfig, WorkerStats
from ultimat3.jobs.worker.handlers import Held, Outcome

__all__ = ["Beat"]


class Beat:
    """The heartbeat, renew and presence steps of a ``Worker`` (which is one)."""

    driver: Driver
    clock: Clock
    config: WorkerConfig
    stats: WorkerStats
    presence: Presence
    worker_id: str
    #: An event loop that has not run a callback for this long is reported as blocked.
    loop_blocked_after: float
    _lock: threading.Lock
    _held: dict[Lease, Held]
    _halt: threading.Event
    _renew_now: threading.Event
    _ready: deque[Held]
    _pending: list[Held]
    _next_beat: float
    _seen_step: float
    _stuck_since: float | None
    _loop: asyncio.AbstractEventLoop | None
    _loop_seen: float
    _loop_blocked: bool
    _clock_checked: bool

    def _free(self, held: Held, *, wake: bool = True) -> None:
        raise NotImplementedError

    def _fatal(self, loop: str, exc: BaseException) -> None:
        raise NotImplementedError

    def _wake_cycle(self) -> None:
        raise NotImplementedError

    def _begun(self) -> bool:
        raise NotImplementedError

    def _heartbeat_step(self) -> float:
        every = self.config.heartbeat_every()
        now = self.clock.monotonic()
        with self._lock:
            held = list(self._held.values())
        cancelled: list[Held] = []
        for h in held:
            if h.deadline is not None and now >= h.deadline and h.run.time_out():
                h.cancelled.set()
                if h.running is not None:
                    _cancel(h.running)
                    cancelled.append(h)
                events.warning(
                    "jobs.job.timeout",
                    job_id=h.job.id,
                    job=h.job.name,
                    timeout=str(h.handle.timeout if h.handle else None),
                )
        with self._lock:
            if self._pending and self._begun():
                # Outcomes of short jobs wait behind a long one on the thread that ran them
                # (the cycle loop is woken when a handler returns): write them now.
                self._wake_cycle()
        # An async job cancelled just now has until the next beat to return.
        self._check_stuck([h for h in held if h not in cancelled], now)
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

    def _check_leases(self, held: list[Held], now: float) -> None:
        """Give up leases whose renewal has not been confirmed for ``lease - heartbeat/2``:
        the database may expire them half a heartbeat later, and then rescue the job (unless
        a stall of ours is every writer's: see the module docstring)."""
        if self.driver.single_writer:
            return
        limit = self.config.lease.total_seconds() - self.config.heartbeat_every() / 2
        for h in held:
            confirmed = h.run.confirmed
            if not h.run.lost and not h.run.settled and now - confirmed >= limit:
                self._lose(h, unconfirmed_for=round(now - confirmed, 3))

    def _renew_step(self) -> float:
        """Renew every held lease when the heartbeat asks (on the renew loop's own thread,
        so a call stalled on the database holds up nothing else)."""
        self.clock.sleep(self.config.heartbeat_every(), self._renew_now)
        self._renew_now.clear()
        if self._halt.is_set():
            return 0.0
        with self._lock:
            held = [h for h in self._held.values() if not h.run.settled and not h.run.lost]
        self._renew(held)
        return 0.0

    def _renew(self, held: list[Held]) -> None:
        if not held:
            return
        sent = self.clock.monotonic()
        try:
            kept = self.driver.lease_extend(
                [h.lease for h in held], self.config.lease, now=self.clock.pinned()
            )
        except JobsError:
            self._next_beat = self.clock.monotonic() + min(1.0, self.config.heartbeat_every())
            raise
        for h in held:
            if h.job.id in kept:
                h.run.confirm(sent)
            elif not h.run.settled:  # settled meanwhile: its write is fenced, and tells
                # Rescued elsewhere or cancelled by an operator: whatever the handler does next
                # is fenced; tell it to stop.
                self._lose(h)

    def _lose(self, h: Held, **why: Any) -> None:
        """The lease is gone (or may be): count it once, tell the handler, write nothing."""
        if not h.run.lose(Outcome("release")):
            return
        with self._lock:
            self.stats.lost += 1
        h.cancelled.set()
        if h.task is not None:
            h.task.cancel()
        events.warning("jobs.lease.lost", job_id=h.job.id, job=h.job.name, **why)
        if h.run.free:
            self._free(h)

    def _check_stuck(self, held: list[Held], now: float) -> None:
        """Every slot held by a job past its timeout: a sync job's thread runs on, an async
        job's task did not return at its cancellation."""
        stuck = [h for h in held if h.run.timed_out and h.started_at is not None]
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

    def _check_event_loop(self, held: list[Held], now: float) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if now - self._loop_seen > self.loop_blocked_after:
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
        self._loop_seen = self.clock.monotonic()

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


def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` on its event loop, from another thread: its coroutine gets
    ``CancelledError`` at its await point."""
    try:
        task.get_loop().call_soon_threadsafe(task.cancel)
    except RuntimeError:
        pass  # its loop is closed: the task is over
