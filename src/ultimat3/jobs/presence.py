"""A worker's row in the workers table: written when it starts, refreshed with its
heartbeat, deleted when it exits cleanly (a killed one's row is pruned by the maintenance
node once stale, see ``maintenance.Maintenance.prune_workers``).

The row is for operators (``ultimat3-jobs workers``, ``jobs show``, the health check and
the metrics); nothing about a job's safety depends on it, so a failed refresh is retried
on the next beat and never stops the worker.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from datetime import datetime
from functools import cache
from importlib import metadata

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.driver import Driver
from ultimat3.jobs.errors import JobsError
from ultimat3.jobs.records import WorkerInfo


@cache
def library_version() -> str:
    try:
        return metadata.version("ultimat3-jobs")
    except metadata.PackageNotFoundError:
        return "unknown"


class Presence:
    """The row of one worker (``worker_id`` is the one it writes into the jobs it runs)."""

    def __init__(
        self,
        driver: Driver,
        clock: Clock,
        *,
        worker_id: str,
        queues: tuple[str, ...],
        concurrency: int,
        every: float,
    ) -> None:
        self.driver = driver
        self.clock = clock
        self.every = every
        self.info = WorkerInfo(
            id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=queues,
            concurrency=concurrency,
            started_at=clock.now(),
            heartbeat_at=clock.now(),
            version=library_version(),
        )
        self._failing = False

    def restarted(self, at: datetime) -> None:
        """A new start of the same worker: its row says when."""
        self.info = replace(self.info, pid=os.getpid(), started_at=at, heartbeat_at=at)

    def beat(self) -> float:
        """Write the row (a ``supervise.Loop`` step): seconds until the next beat."""
        try:
            self.driver.worker_beat(self.info, now=self.clock.pinned())
        except JobsError as exc:
            if not self._failing:
                events.warning(
                    "jobs.worker.beat-failed", worker_id=self.info.id, error=type(exc).__name__
                )
            self._failing = True
            return min(self.every, 1.0)
        self._failing = False
        return self.every

    def leave(self) -> None:
        """Delete the row (a clean exit). A database that is away leaves it to be pruned."""
        try:
            self.driver.worker_remove(self.info.id)
        except JobsError as exc:
            events.warning(
                "jobs.worker.leave-failed", worker_id=self.info.id, error=type(exc).__name__
            )
