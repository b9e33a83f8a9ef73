"""``ultimat3-jobs healthcheck``: what a container probe asks, each check with its exit code.

The checks run in order and a failed one names what is wrong and how to fix it; the exit code
is the first failed check's (so a probe's log says the most basic cause):

==========  ===================================================================
exit code   failing condition
==========  ===================================================================
0           healthy
3           the database cannot be reached (the later checks are not run)
4           migrations are pending (``ultimat3-jobs migrate``)
5           fewer live workers than ``min_workers`` (a row refreshed within
            ``worker_stale``; see ``ultimat3-jobs workers``)
6           the oldest ready job of a queue that is not paused has waited longer
            than ``max_ready_age``
==========  ===================================================================

Reads only: it never migrates, and on SQLite takes no write lock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs.clock import Clock, SystemClock
from ultimat3.jobs.driver import Driver, Inspection, inspection
from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.errors import JobsError

__all__ = ["EXIT_CODES", "Check", "run_checks"]

#: The exit code of each check when it fails.
EXIT_CODES = {"database": 3, "migrations": 4, "workers": 5, "ready_age": 6}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    #: What was measured: live workers, the oldest ready age in seconds, ...
    value: Any = None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else EXIT_CODES[self.name]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["exit_code"] = self.exit_code
        return data


def run_checks(
    driver: Driver,
    *,
    min_workers: int = 1,
    worker_stale: timedelta = timedelta(minutes=1),
    max_ready_age: timedelta | None = timedelta(minutes=5),
    queues: tuple[str, ...] = (),
    clock: Clock | None = None,
) -> list[Check]:
    """Every check, in order; the ones after an unreachable database are not run. Ages are
    measured on ``clock`` (the host's by default)."""
    at = (clock or SystemClock()).now()
    try:
        current = driver.schema_current()
    except JobsError as exc:
        return [
            Check(
                "database",
                False,
                f"cannot reach {driver.display_url}: {exc.cause}",
                exc.fix or "check the URL, the network and the server",
            )
        ]
    checks = [Check("database", True, f"reached {driver.display_url}")]
    if not current:
        checks.append(
            Check(
                "migrations",
                False,
                "the job tables are missing or older than this version",
                "run `ultimat3-jobs migrate` (or deploy the migrations your way: migrate --sql)",
            )
        )
        return checks
    checks.append(Check("migrations", True, "the schema is current"))
    reads = inspection(driver)
    try:
        checks.append(_workers(reads, min_workers, worker_stale, at))
        checks.append(_ready_age(reads, max_ready_age, queues, at))
    except JobsError as exc:
        checks.append(Check("database", False, f"a read failed: {exc.cause}", exc.fix or "retry"))
    return checks


def _workers(driver: Inspection, least: int, stale: timedelta, at: datetime) -> Check:
    live = [w for w in driver.worker_list() if at - w.heartbeat_at <= stale]
    detail = f"{len(live)} live worker(s) (heartbeat within {format_duration(stale)})"
    if len(live) >= least:
        return Check("workers", True, detail, value=len(live))
    return Check(
        "workers",
        False,
        f"{detail}, fewer than the {least} required",
        "start workers (`ultimat3-jobs worker`), or see why they stopped in their log",
        value=len(live),
    )


def _ready_age(
    driver: Inspection, limit: timedelta | None, queues: tuple[str, ...], at: datetime
) -> Check:
    waited: dict[str, float] = {}
    for queue in driver.queue_list(now=None):
        if queue.paused or queue.oldest_ready_at is None:
            continue
        if queues and queue.name not in queues:
            continue
        waited[queue.name] = max(0.0, (at - queue.oldest_ready_at).total_seconds())
    if not waited:
        return Check("ready_age", True, "no job is waiting to run", value=0.0)
    worst = max(waited, key=waited.__getitem__)
    age = waited[worst]
    detail = f"the oldest ready job waited {age:.1f}s (queue {worst!r})"
    if limit is None or age <= limit.total_seconds():
        return Check("ready_age", True, detail, value=age)
    return Check(
        "ready_age",
        False,
        f"{detail}, longer than {format_duration(limit)}",
        "add workers or concurrency for that queue, or look for slow or stuck jobs",
        value=age,
    )
