"""The cron scheduler: turns each task's occurrences into jobs, exactly once.

Guarantees:

- **Exactly once per occurrence, across any number of schedulers.** Each occurrence is
  dispatched by ``driver.schedule_fire``, which in one transaction moves the task's persisted
  ``last_fired_at`` forward (compare-and-set) and inserts the occurrence's jobs. Two schedulers
  that both believe they lead cannot both win the compare-and-set, and a crash cannot separate
  the state from the jobs. Each job also carries the idempotency key ``task@occurrence``.
- **Leader election only saves work.** One scheduler (the leader) computes plans; the others
  idle. A leader that cannot renew its lease in time steps down before it expires. Correctness
  never depends on there being exactly one leader.
- **Catch-up after downtime** follows the task's policy (``skip``, ``run-once``, ``run-all``
  bounded by ``max_catch_up``) over the persisted state; nothing is owed for the time before a
  task was first seen. Skipped occurrences move the state forward, so a restart adds nothing.
- **DST** follows Debian cron (``ultimat3.jobs.cron``): a fixed-time entry in the spring gap
  fires once right after it, in the autumn fold once at the first instant.

Time: plans are computed on the database's clock (``Driver.database_now``: PostgreSQL's
``now()``, the host's clock for SQLite; the fake clock's under test), so on PostgreSQL a
scheduler host whose clock is off fires on time. The scheduler's time is continuous: it
follows the database's clock as it moves with the monotonic clock, and a step of that clock
(the two move apart by more than ``clock.STEP``, 1 s) is followed only once it has held for
``step_hold`` (default 10 minutes): a clock stepped forward by mistake and corrected within
that fires nothing early, and one stepped back fires nothing late. A step held that long is
taken as a correction: a forward one then counts as downtime (the catch-up policy), and a
task whose last-fired time lies in the future of the new time is brought back to it
(``schedule_rewind``), so it fires again within one period.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.clock import STEP, Backoff, Clock
from ultimat3.jobs.driver import Driver, check_clock_skew
from ultimat3.jobs.errors import JobsError
from ultimat3.jobs.ids import token
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.records import Fire, InsertResult, Leadership, NewJob, Rewind, ScheduleState
from ultimat3.jobs.supervise import BACKOFF, Loop
from ultimat3.jobs.tasks import TaskHandle

#: Builds the job row for one (handle, input) of an occurrence, with its idempotency key.
JobBuilder = Callable[[JobHandle[Any], Any, str], NewJob]


@dataclass(frozen=True, slots=True)
class DispatchedJob:
    job: str
    result: InsertResult


@dataclass(frozen=True, slots=True)
class DispatchedOccurrence:
    """What one occurrence enqueued (seed ``DispatchedOccurrence``)."""

    task: str
    occurrence: datetime
    jobs: tuple[DispatchedJob, ...]
    catch_up: bool


class SoleLeader:
    """Single node: always the leader (seed ``soleLeader``)."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        return None


class DatabaseLeader:
    """Leadership as a lease row in the job database (SQLite or PostgreSQL).

    The holder renews every tick; it steps down on its own when it has not renewed within
    ``ttl - margin`` of its monotonic clock, so it stops acting before another node can take
    over, whatever the wall clocks say.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        name: str = "scheduler",
        ttl: timedelta = timedelta(seconds=15),
        clock: Clock,
        holder: str | None = None,
    ) -> None:
        self.driver = driver
        self.name = name
        self.ttl = ttl
        self.clock = clock
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{token()[:8]}"
        self._renewed_at: float | None = None

    def acquire(self) -> bool:
        started = self.clock.monotonic()
        try:
            won = self.driver.leader_elect(self._leadership(), now=self.clock.pinned())
        except JobsError as exc:
            events.warning("jobs.scheduler.leader-unknown", holder=self.holder, error=exc.cause)
            won = False
        if won:
            if self._renewed_at is None:
                events.info("jobs.scheduler.leader-elected", holder=self.holder)
            self._renewed_at = started
            return True
        if self._renewed_at is not None:
            events.info("jobs.scheduler.leader-lost", holder=self.holder)
        self._renewed_at = None
        return False

    def _leadership(self) -> Leadership:
        return Leadership(self.name, self.holder, self.ttl)

    @property
    def is_leader(self) -> bool:
        """True while the last renewal is recent enough to act on (a margin of a third)."""
        if self._renewed_at is None:
            return False
        return self.clock.monotonic() - self._renewed_at < self.ttl.total_seconds() * 2 / 3

    def release(self) -> None:
        if self._renewed_at is not None:
            try:
                self.driver.leader_resign(self._leadership())
            except JobsError:
                pass
        self._renewed_at = None


class Scheduler:
    """Dispatches cron tasks. ``tick()`` does one round and returns what it enqueued."""

    def __init__(
        self,
        *,
        driver: Driver,
        tasks: Mapping[str, TaskHandle],
        build: JobBuilder,
        clock: Clock,
        leader: SoleLeader | DatabaseLeader,
        tick_interval: timedelta = timedelta(seconds=1),
        grace: timedelta = timedelta(seconds=60),
        step_hold: timedelta = timedelta(minutes=10),
        backoff: Backoff = BACKOFF,
    ) -> None:
        self.driver = driver
        self.tasks = dict(tasks)
        self.build = build
        self.clock = clock
        self.leader = leader
        self.tick_interval = tick_interval
        self.grace = grace
        self.step_hold = step_hold
        #: The pause after a failed tick, doubling (``supervise.Loop``'s).
        self.backoff = backoff
        self._loop: Loop | None = None
        #: The scheduler's time is ``anchor[0] + (monotonic - anchor[1])`` (``time()``).
        self._anchor: tuple[datetime, float] | None = None
        #: When (monotonic) the database's clock moved apart from ours, while it stays apart.
        self._apart_since: float | None = None
        #: The database's time at the last ``time()``.
        self._database_time: datetime | None = None

    def time(self) -> datetime:
        """The scheduler's time: the database's clock, except while it has stepped away from
        the time this scheduler keeps (for less than ``step_hold``: see the module)."""
        if self._anchor is None:  # the first reading: the host's clock is compared with it once
            db = check_clock_skew(self.driver, self.clock, service="scheduler")
        else:
            db = self.driver.database_now(now=self.clock.pinned())
        self._database_time = db
        mono = self.clock.monotonic()
        if self._anchor is None:
            self._anchor = (db, mono)
            return db
        ours = self._anchor[0] + timedelta(seconds=mono - self._anchor[1])
        apart = (db - ours).total_seconds()
        if abs(apart) <= STEP:
            if self._apart_since is not None:
                events.info("jobs.scheduler.clock-back", database_time=db.isoformat())
            self._anchor, self._apart_since = (db, mono), None
            return db
        if self._apart_since is None:
            self._apart_since = mono
            events.warning(
                "jobs.scheduler.clock-stepped",
                by=round(apart, 3),
                database_time=db.isoformat(),
                scheduler_time=ours.isoformat(),
                hold=str(self.step_hold),
            )
        if mono - self._apart_since < self.step_hold.total_seconds():
            return ours
        events.warning(
            "jobs.scheduler.clock-followed", by=round(apart, 3), database_time=db.isoformat()
        )
        self._anchor, self._apart_since = (db, mono), None
        return db

    def tick(self) -> list[DispatchedOccurrence]:
        if not self.tasks:
            return []
        # Kept by every scheduler, leader or not, so a new leader's time is as continuous.
        now = self.time()
        if not self.leader.acquire():
            return []
        states = self.driver.schedule_state(sorted(self.tasks), now=self.clock.pinned())
        dispatched: list[DispatchedOccurrence] = []
        for name in sorted(self.tasks):
            if isinstance(self.leader, DatabaseLeader) and not self.leader.is_leader:
                break  # stepped down mid-round: stop acting; the next leader carries on
            try:
                dispatched.extend(self._dispatch(name, self.tasks[name], states[name], now))
            except Exception as exc:
                # One bad task (its enqueue raises, its job is not registered) must not stop
                # the others: it is logged every tick until fixed, and retried each time.
                events.error(
                    "jobs.scheduler.task-failed",
                    exc=exc,
                    task=name,
                    error=type(exc).__name__,
                    cause=getattr(exc, "cause", None) or str(exc),
                )
        return dispatched

    def _dispatch(
        self, name: str, handle: TaskHandle, state: ScheduleState, now: datetime
    ) -> list[DispatchedOccurrence]:
        last = state.last_fired_at
        if last is not None and (last - now).total_seconds() > STEP:
            # Fired ahead of our time (by a clock that stepped back since, or another host's):
            # keeping it would leave the task silent until then. Bring it back to now.
            if self.driver.schedule_rewind(Rewind(name, last, now)):
                events.warning(
                    "jobs.scheduler.rewound",
                    task=name,
                    last_fired=last.isoformat(),
                    to=now.isoformat(),
                )
            last = now
        p = handle.plan(
            last_fired=last,
            now=now,
            started_at=state.first_seen_at,
            grace=self.grace,
        )
        out: list[DispatchedOccurrence] = []
        if p.missed:
            events.warning(
                "jobs.scheduler.missed", task=name, missed=p.missed, policy=handle.catch_up
            )
        for occurrence in p.fire:
            key = f"{name}@{occurrence.at.isoformat()}"
            entries = handle.entries()
            # Due at the occurrence (or now, if the database's clock is behind the scheduler's):
            # a time on the scheduler's clock, so a job fired while the database's clock stood
            # ahead (a step corrected later) is not left waiting for that clock to come back.
            due = min(occurrence.at, self._database_time or occurrence.at)
            jobs = [
                job._replace(run_at=due) if job.run_at is None and job.delay is None else job
                for job in (self.build(job_handle, value, key) for job_handle, value in entries)
            ]
            fire = Fire(name, occurrence.at, jobs)
            results = self.driver.schedule_fire(fire, now=self.clock.pinned())
            if results is None:
                continue  # another scheduler fired it (or a later one) first
            out.append(
                DispatchedOccurrence(
                    task=name,
                    occurrence=occurrence.at,
                    jobs=tuple(
                        DispatchedJob(j.name, r) for j, r in zip(jobs, results, strict=True)
                    ),
                    catch_up=occurrence.catch_up,
                )
            )
            events.info(
                "jobs.scheduler.fired",
                task=name,
                occurrence=occurrence.at.isoformat(),
                jobs=len(jobs),
                catch_up=occurrence.catch_up,
            )
        if p.skip_to is not None and (not out or out[-1].occurrence < p.skip_to):
            # Skipped occurrences are settled too, so the next round does not see them again.
            self.driver.schedule_fire(Fire(name, p.skip_to), now=self.clock.pinned())
        return out

    # -- running -----------------------------------------------------------------------------

    def start(self) -> None:
        """Tick on a supervised thread (``supervise.Loop``) until ``stop()``. Idempotent."""
        if self._loop is not None:
            return
        self._loop = Loop("scheduler", self._step, clock=self.clock, backoff=self.backoff)
        self._loop.start()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
        self.leader.release()

    def _step(self) -> float:
        self.tick()
        return self.tick_interval.total_seconds()
