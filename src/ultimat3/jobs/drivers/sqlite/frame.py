"""Steps of the host's wall clock, repaired in the file: the frame of the wall time a driver
writes (``clock.Frame``) is stored in ``x_clock``, and the first write transaction after a
step moves the stored future times by it (``align``). It knows nothing of jobs beyond the
three statements that move their times."""

from __future__ import annotations

import logging
import sqlite3

from ultimat3.jobs.clock import STEP, Frame
from ultimat3.jobs.sql import queries

_Q = queries("sqlite")
_STEP_US = int(STEP * 1e6)
_log = logging.getLogger("ultimat3.jobs.drivers.sqlite")


def unaligned_step(conn: sqlite3.Connection, frame: Frame | None) -> int:
    """How far (microseconds) the host's clock stepped since the frame stored in the file,
    which no write has moved the stored times by yet: 0 within ``STEP``, after a reboot, or
    with no frame. A read compares a stored time ``t`` with ``now - step`` where a write
    would first move ``t`` to ``t + step`` (``align``): the same answer, without the write."""
    if frame is None:
        return 0
    row = conn.execute(_Q["clock_frame"]).fetchone()
    if row is None or row[0] != frame.boot:
        return 0
    by: int = frame.offset - row[1]
    return 0 if -_STEP_US <= by <= _STEP_US else by


def align(conn: sqlite3.Connection, frame: Frame | None, path: str) -> None:
    """First thing in every write transaction, under the write lock: compare the frame of
    the host's clock (``clock.Frame``) with the one stored in the file, and on a step (a
    change over ``STEP``) move the stored future times by it and store the new frame.
    Under the write lock, so exactly once per file, and no row is written in the new time
    before the move. A changed boot id (a reboot) is stored without moving anything."""
    if frame is None:
        return
    row = conn.execute(_Q["clock_frame"]).fetchone()
    if row is not None and row[0] == frame.boot:
        by = frame.offset - row[1]
        if -_STEP_US <= by <= _STEP_US:
            return
        args = {"by": by, "now": frame.at}
        jobs = conn.execute(_Q["clock_shift_jobs"], args).rowcount
        conn.execute(_Q["clock_shift_leaders"], args)
        conn.execute(_Q["clock_shift_workers"], args)
        _log.warning(
            "jobs.sqlite.clock-step: the host's wall clock stepped by %+.3f s; the due "
            "times and lease expiries of %d job(s) in %s moved with it",
            by / 1e6,
            jobs,
            path,
            extra={
                "event": "jobs.sqlite.clock-step",
                "path": path,
                "by_seconds": by / 1e6,
                "jobs": jobs,
            },
        )
    conn.execute(
        _Q["clock_frame_set"], {"boot": frame.boot, "offset": frame.offset, "now": frame.at}
    )
