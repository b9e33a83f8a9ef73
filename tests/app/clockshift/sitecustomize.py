"""Shifts this process's wall clock (never the machine's) by the nanoseconds written in the file
named by ``CLOCKSHIFT_FILE``, read again at most every 20 ms: writing the file steps the wall
clock of every process started with it at once, as a host-wide ``date -s`` would. Monotonic
time is left alone. Loaded by Python at start-up from ``PYTHONPATH`` (``sitecustomize``)."""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("CLOCKSHIFT_FILE", "")

if _PATH:
    _real_time_ns = time.time_ns
    _monotonic = time.monotonic
    _state = [0, -1.0]  # the offset in ns, when it was read (monotonic)

    def _offset() -> int:
        now = _monotonic()
        if now - _state[1] > 0.02:
            _state[1] = now
            try:
                with open(_PATH) as f:
                    _state[0] = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return _state[0]

    def _time_ns() -> int:
        return _real_time_ns() + _offset()

    def _time() -> float:
        return _time_ns() / 1e9

    time.time_ns = _time_ns
    time.time = _time
