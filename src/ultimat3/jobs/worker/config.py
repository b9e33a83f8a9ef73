"""A worker's settings (``WorkerConfig``), counters (``WorkerStats``) and exit codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.maintenance import MaintenanceConfig

__all__ = ["FATAL_EXIT", "StuckError", "WorkerConfig", "WorkerStats"]

#: The exit code of a worker that stopped because a loop could not go on (EX_SOFTWARE).
FATAL_EXIT = 70


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


class StuckError(Exception):
    """Every slot is held by a thread past its timeout, for longer than the stuck limit."""
