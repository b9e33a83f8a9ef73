"""The worker's two state machines, pure (no I/O, no clock, no threads of their own):
``Run``, the run of one claimed job, and ``Life``, the worker's own lifecycle.

``Run``::

    CLAIMED ──start()──> STARTED ──returned()──┐
       │                    │                   │
       │ release(outcome)   │ settle(outcome)   │  (both needed, and the outcome written,
       v                    v                   v   before the slot is free)
    RELEASED             SETTLED ──wrote()───> FREE

Each transition succeeds at most once (its docstring says from where): exactly one outcome is
ever written per run, whoever gets there first (the handler returning, a lost lease, shutdown),
and a job goes back to the queue (attempt refunded) only if its handler never began. The slot
(and the lease) is held until the run is settled or released, its outcome written, *and*, if
it started, its handler has returned: a sync handler past its timeout keeps its lease while
its thread runs on, so its retry can never overlap it.

``Life`` is the worker's state, changed only by ``transition(life, event)``: STOPPED ──Start──>
RUNNING ──Stop, StopNow, Signal, Fatal──> DRAINING ──Stopped──> STOPPED. A stop is *hard*
(in-flight jobs released at once) after ``StopNow``, ``Fatal`` or a second ``Signal``; ``Skip``
records a job name this worker lacks and passes over until a time (``skipped``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Generic, TypeVar

__all__ = [
    "Fatal",
    "Life",
    "Phase",
    "Run",
    "RunState",
    "Signal",
    "Skip",
    "Start",
    "Stop",
    "StopNow",
    "Stopped",
    "skipped",
    "transition",
]

_O = TypeVar("_O")


class RunState(Enum):
    CLAIMED = "claimed"
    STARTED = "started"
    SETTLED = "settled"
    RELEASED = "released"


class Run(Generic[_O]):
    """Who owns a claimed job at each step; every transition is one call under one lock."""

    __slots__ = (
        "_lock",
        "_returned",
        "_state",
        "confirmed",
        "lost",
        "outcome",
        "started_once",
        "timed_out",
        "written",
    )

    def __init__(self, confirmed: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._state = RunState.CLAIMED
        self._returned = False
        self.started_once = False
        #: The outcome of ``settle()`` or ``release()``: written by exactly one caller.
        self.outcome: _O | None = None
        self.timed_out = False
        self.lost = False
        #: The outcome is in the database (or there is nothing left to write).
        self.written = False
        #: When the request that last set the lease's expiry was sent (monotonic seconds).
        self.confirmed = confirmed

    @property
    def state(self) -> RunState:
        return self._state

    def start(self) -> bool:
        """CLAIMED -> STARTED; False when the run was released or settled first."""
        with self._lock:
            if self._state is not RunState.CLAIMED:
                return False
            self._state = RunState.STARTED
            self.started_once = True
            return True

    def settle(self, outcome: _O) -> bool:
        """Record the run's one outcome; False when it was settled or released already."""
        with self._lock:
            return self._settle(outcome)

    def _settle(self, outcome: _O) -> bool:
        if self._state in (RunState.SETTLED, RunState.RELEASED):
            return False
        self._state = RunState.SETTLED
        self.outcome = outcome
        return True

    def release(self, outcome: _O) -> bool:
        """CLAIMED -> RELEASED (back to the queue with ``outcome``, attempt refunded); False
        once started or settled."""
        with self._lock:
            if self._state is not RunState.CLAIMED:
                return False
            self._state = RunState.RELEASED
            self.outcome = outcome
            return True

    def returned(self) -> None:
        """The handler's thread (or task) is done with the job."""
        with self._lock:
            self._returned = True

    def time_out(self) -> bool:
        """The deadline passed while the run was unsettled: True the first time only; its
        outcome is then a timeout, whatever the handler returns."""
        with self._lock:
            if self.timed_out or self._state in (RunState.SETTLED, RunState.RELEASED):
                return False
            self.timed_out = True
            return True

    def lose(self, moot: _O) -> bool:
        """The lease is gone (a renewal refused or unconfirmed too long, a write fenced out):
        True the first time only. An unsettled run is settled with ``moot``, with nothing to
        write."""
        with self._lock:
            if self.lost:
                return False
            self.lost = True
            if self._settle(moot):
                self.written = True
            return True

    def confirm(self, at: float) -> None:
        """A renewal sent at ``at`` (monotonic seconds) was confirmed: the lease lasts at least
        until then plus the lease, whatever the clocks say."""
        with self._lock:
            self.confirmed = max(self.confirmed, at)

    def wrote(self) -> None:
        """The outcome is in the database (or was refused)."""
        with self._lock:
            self.written = True

    @property
    def settled(self) -> bool:
        return self._state in (RunState.SETTLED, RunState.RELEASED)

    @property
    def free(self) -> bool:
        """True when nothing runs for this job any more and nothing is left to write: its slot
        and lease can go."""
        with self._lock:
            if not self.written:
                return False
            if self._state is RunState.RELEASED:
                return True
            if self._state is not RunState.SETTLED:
                return False
            return self._returned or not self.started_once


# -- the worker's lifecycle ----------------------------------------------------------------------


class Phase(Enum):
    STOPPED = "stopped"
    RUNNING = "running"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Life:
    """The worker's state (``transition`` makes the next one)."""

    phase: Phase = Phase.STOPPED
    #: Release in-flight jobs at once (``StopNow``, ``Fatal``, a second signal).
    hard: bool = False
    #: The drain's grace in seconds, fixed by the event that began it.
    grace: float = 0.0
    #: Signals received (SIGTERM, SIGINT).
    signals: int = 0
    #: 0 after a clean stop; the code of ``Fatal`` when a loop could not go on.
    exit_code: int = 0
    #: Job names this worker lacks, passed over in its claims until (monotonic seconds).
    skipping: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Start:
    pass


@dataclass(frozen=True, slots=True)
class Stop:
    grace: float


@dataclass(frozen=True, slots=True)
class StopNow:
    grace: float


@dataclass(frozen=True, slots=True)
class Signal:
    grace: float


@dataclass(frozen=True, slots=True)
class Fatal:
    code: int
    grace: float


@dataclass(frozen=True, slots=True)
class Stopped:
    pass


@dataclass(frozen=True, slots=True)
class Skip:
    name: str
    until: float


Event = Start | Stop | StopNow | Signal | Fatal | Stopped | Skip


def _drain(life: Life, grace: float, *, hard: bool) -> Life:
    if life.phase is Phase.RUNNING:
        life = replace(life, phase=Phase.DRAINING, grace=grace)
    return replace(life, hard=life.hard or hard)


def transition(life: Life, event: Event) -> Life:
    """The worker's one transition function."""
    match event:
        case Start():
            if life.phase is not Phase.STOPPED:
                return life
            return replace(life, phase=Phase.RUNNING, hard=False, exit_code=0)
        case Stop(grace=grace):
            return _drain(life, grace, hard=False)
        case StopNow(grace=grace):
            return _drain(life, grace, hard=True)
        case Signal(grace=grace):
            life = replace(life, signals=life.signals + 1)
            return _drain(life, grace, hard=life.signals > 1)
        case Fatal(code=code, grace=grace):
            return _drain(replace(life, exit_code=code), grace, hard=True)
        case Stopped():
            if life.phase is Phase.STOPPED:
                return life
            return replace(life, phase=Phase.STOPPED)
        case Skip(name=name, until=until):
            return replace(life, skipping=MappingProxyType({**life.skipping, name: until}))


def skipped(life: Life, now: float) -> tuple[str, ...]:
    """The job names passed over at ``now`` (monotonic seconds)."""
    return tuple(sorted(name for name, until in life.skipping.items() if until > now))
