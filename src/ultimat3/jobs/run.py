"""The run of one claimed job, as a small state machine with one lock.

::

    CLAIMED ──start()──> STARTED ──returned()──┐
       │                    │                   │
       │ release()          │ settle(outcome)   │  (both needed before the slot is free)
       v                    v                   v
    RELEASED             SETTLED ───────────> FREE

- ``start()`` succeeds only from CLAIMED: a released run can never start, and a run starts at
  most once (the shutdown race of an earlier design, where a run being released could still
  start, cannot happen).
- ``settle()`` succeeds once, from CLAIMED or STARTED: exactly one outcome is ever written per
  run, whoever gets there first (the handler returning, a lost lease, shutdown).
- ``release()`` succeeds only from CLAIMED: a job goes back to the queue (attempt refunded)
  only if its handler never began.
- The slot (and the lease) is held until the run is settled or released *and*, if it started,
  its handler has returned: a sync handler past its timeout keeps its lease while its thread
  runs on, so its retry can never overlap it.

Pure: no I/O, no clock; the worker calls these under its own threads.
"""

from __future__ import annotations

import threading
from enum import Enum
from typing import Generic, TypeVar

__all__ = ["Run", "RunState"]

_O = TypeVar("_O")


class RunState(Enum):
    CLAIMED = "claimed"
    STARTED = "started"
    SETTLED = "settled"
    RELEASED = "released"


class Run(Generic[_O]):
    """Who owns a claimed job at each step; every transition is one call under one lock."""

    __slots__ = ("_lock", "_returned", "_state", "outcome", "started_once")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = RunState.CLAIMED
        self._returned = False
        self.started_once = False
        #: The outcome of ``settle()``: written by exactly one caller.
        self.outcome: _O | None = None

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
            if self._state in (RunState.SETTLED, RunState.RELEASED):
                return False
            self._state = RunState.SETTLED
            self.outcome = outcome
            return True

    def release(self) -> bool:
        """CLAIMED -> RELEASED (back to the queue, attempt refunded); False once started."""
        with self._lock:
            if self._state is not RunState.CLAIMED:
                return False
            self._state = RunState.RELEASED
            return True

    def returned(self) -> None:
        """The handler's thread (or task) is done with the job."""
        with self._lock:
            self._returned = True

    @property
    def settled(self) -> bool:
        return self._state in (RunState.SETTLED, RunState.RELEASED)

    @property
    def free(self) -> bool:
        """True when nothing runs for this job any more: its slot and lease can go."""
        with self._lock:
            if self._state is RunState.RELEASED:
                return True
            if self._state is not RunState.SETTLED:
                return False
            return self._returned or not self.started_once
