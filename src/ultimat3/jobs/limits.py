"""Flow control: how many jobs of a kind may run at once, across every worker.

``@job(concurrency=Limit(2, key=lambda o: o["account"]))`` allows at most two running jobs per
account, whatever the number of worker processes and machines.

**Where a limit lives.** On the job definition, validated when ``@job`` runs. The claim runs in
the database and cannot call Python, so the partition is computed at enqueue time
(``limit_key``) and stored in the job's row (``x_jobs.limit_key``, the maximum in
``x_jobs.limit_max``). A job without a limit stores NULL; ``limit_key IS NULL`` is the predicate
of the unlimited claim's partial index.

**What holds a slot.** A *running* job of the same key whose lease has not expired; nothing
else is counted or stored, so no counter has to follow every way a job leaves ``running``. The
count is an index probe (``x_jobs_limit_running``), bounded by the limit itself.

**How a claim takes limited jobs** (``ClaimParams.limited``), in the claim's transaction:

1. find up to ``KEYS_PER_CLAIM`` distinct keys with due jobs, per queue: a skip scan over
   ``x_jobs_claim_limited (queue, limit_key, ...)``, starting after the last key this process
   looked at and wrapping around, so a saturated key cannot hide the keys behind it;
2. for each such key, ``free = limit_max - running``, and take its first ``free`` due jobs;
3. merge them with the unlimited due jobs in claim order (priority, run_at, id) and claim the
   best ``ClaimParams.limit``.

The count is exact against concurrent claims: on SQLite every claim runs under the single write
lock; on PostgreSQL the claim first takes a transaction-scoped advisory lock per key (skipping
keys another claim holds) and counts in a later statement of the same transaction, whose
snapshot sees every claim of those keys that committed before (the PostgreSQL driver's
``cycle``); the memory driver holds one lock around everything. A slot that frees wakes the
waiters (a NOTIFY on PostgreSQL, any commit on SQLite), so a worker that found every key
saturated sleeps until then, not in a poll loop. Staging a limited job in an outbox on another
database is refused (the outbox rows do not carry the key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.errors import ConfigurationError

__all__ = [
    "KEYS_PER_CLAIM",
    "LIMIT_KEY_LIMIT",
    "NO_LIMIT",
    "STATE_BITS",
    "Limit",
    "Rate",
    "Unique",
    "keys_to_look",
]

#: The most distinct keys one claim looks at, per queue (step 1 above).
KEYS_PER_CLAIM = 32


def keys_to_look(limit: int) -> int:
    """How many keys a claim of ``limit`` jobs looks at, at most: twice its limit (at least 8,
    at most ``KEYS_PER_CLAIM``), so that its work grows with what it can take, and the full
    keys it passes over are behind the cursor for the next claim."""
    return min(KEYS_PER_CLAIM, max(8, 2 * limit))


#: The longest stored key, so it fits an index entry on every database.
LIMIT_KEY_LIMIT = 300
#: A generous ceiling: a limit above it is no limit worth a claim's count.
_MAX = 100_000
#: The stored concurrency maximum of a job that has only a rate limit.
NO_LIMIT = _MAX


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``max`` jobs running at once, across every worker, per partition.

    The partition is named by ``per`` and ``key``:

    - ``per="job"`` (the default): this job's own limit;
    - ``per="queue"``: shared by every job with ``per="queue"`` in the same queue;
    - any other name (``per="smtp"``): shared by every job that names it.

    ``key`` splits the partition further: a function of the job's input returning a str or an
    int (``key=lambda o: o["account"]``), or the string ``"tenant"`` for the enqueue's
    ``tenant_id``. Jobs that share a partition should agree on ``max``: each job's row carries
    its own, and a claim compares the count with the row it looks at.
    """

    max: int
    key: Callable[[Any], object] | str | None = None
    per: str = "job"

    def __post_init__(self) -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int) or not 1 <= self.max <= _MAX:
            raise ConfigurationError(
                f"Limit(max={self.max!r}) is not valid",
                fix=f"pass an int from 1 to {_MAX}: how many may run at once, e.g. Limit(2)",
            )
        if self.key is not None and self.key != "tenant" and not callable(self.key):
            raise ConfigurationError(
                f"Limit(key={self.key!r}) is not valid",
                fix='pass a function of the input (key=lambda o: o["account"]) or key="tenant"',
            )
        if not isinstance(self.per, str) or not self.per or len(self.per) > 100:
            raise ConfigurationError(
                f"Limit(per={self.per!r}) is not valid",
                fix='use per="job" (the default), per="queue", or a name shared by several jobs',
            )

    def describe(self) -> str:
        """How the CLI shows it: ``2 per job``, ``4 per queue by tenant``."""
        by = ""
        if self.key == "tenant":
            by = " by tenant"
        elif self.key is not None:
            by = " by key"
        return f"{self.max} per {self.per}{by}"

    def key_for(self, *, job: str, queue: str, input: Any, tenant_id: str | None) -> str:
        """The stored key of one enqueue. Raises ``ConfigurationError`` when ``key`` fails."""
        if self.per == "job":
            base = f"job:{job}"
        elif self.per == "queue":
            base = f"queue:{queue}"
        else:
            base = f"name:{self.per}"
        if self.key is None:
            return base
        if self.key == "tenant":
            part: object = "" if tenant_id is None else tenant_id
        else:
            assert callable(self.key)
            part = _call_key(self.key, input, job, "concurrency", 'o["account"]')
        stored = f"{base}={part}"
        if len(stored) > LIMIT_KEY_LIMIT or "\x00" in stored:
            raise ConfigurationError(
                f"the concurrency key {stored[:80]!r} of job {job!r} is not valid",
                fix=f"return a key of at most {LIMIT_KEY_LIMIT - len(base) - 1} characters "
                "without NUL characters",
            )
        return stored


def _call_key(
    fn: Callable[[Any], object], input: Any, job: str, what: str, example: str
) -> str | int:
    """A key function's value for one input: a str or an int, or a ``ConfigurationError``."""
    try:
        value = fn(input)
    except Exception as exc:
        raise ConfigurationError(
            f"the {what} key function of job {job!r} raised {type(exc).__name__}: {exc}",
            fix=f"make it return a str or an int for every input, e.g. {example}",
        ) from exc
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigurationError(
            f"the {what} key function of job {job!r} returned {value!r}",
            fix=f"return a str or an int that names the partition, e.g. {example}",
        )
    return value


#: The bit of each job state in ``x_jobs.unique_states`` (the unique index's predicate spells
#: the same table out in SQL: migration 0006).
STATE_BITS = {
    "scheduled": 1,
    "available": 2,
    "running": 4,
    "completed": 8,
    "dead": 16,
    "cancelled": 32,
}
_WAITING_OR_RUNNING = ("scheduled", "available", "running")


@dataclass(frozen=True, slots=True)
class Unique:
    """At most one job with the same unique key in the given ``states`` (and ``period``).

    - ``key``: a function of the input naming what must be unique (``lambda o: o["user"]``);
      default: the whole input.
    - ``period``: unique per window of this length (``"1h"``: one job per key per clock hour,
      counted from the epoch, by the enqueue's time); default: no window, unique while the
      job is in ``states``.
    - ``states``: which states count; default: scheduled, available and running, plus
      completed when a ``period`` is given (so a finished job still holds its window).
    - ``on_conflict``: ``"existing"`` returns the job already there (``deduped=True``);
      ``"replace"`` (debounce) also replaces its input, ``run_at`` and priority when it is
      still waiting; a running one is returned as it is.

    Enforced by a unique partial index (``x_jobs_unique``) whose predicate reads each row's
    state, so a job leaving ``states`` frees its key in the same write: never a read then a
    write. Keys are scoped to the job's name and tenant.
    """

    key: Callable[[Any], object] | None = None
    period: DurationInput | None = None
    states: tuple[str, ...] | None = None
    on_conflict: Literal["existing", "replace"] = "existing"
    _period: timedelta | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.key is not None and not callable(self.key):
            raise ConfigurationError(
                f"Unique(key={self.key!r}) is not valid",
                fix='pass a function of the input, e.g. key=lambda o: o["user"]',
            )
        period = None if self.period is None else to_timedelta(self.period, name="period")
        if period is not None and period <= timedelta(0):
            raise ConfigurationError(
                f"Unique(period={self.period!r}) is not valid",
                fix='pass a positive duration, e.g. period="1h"',
            )
        object.__setattr__(self, "_period", period)
        states = self.states
        if states is None:
            states = (*_WAITING_OR_RUNNING, "completed") if period else _WAITING_OR_RUNNING
        if isinstance(states, str) or not states or not set(states) <= set(STATE_BITS):
            raise ConfigurationError(
                f"Unique(states={self.states!r}) is not valid",
                fix=f"pass a tuple of some of {', '.join(STATE_BITS)}",
            )
        object.__setattr__(self, "states", tuple(states))
        if self.on_conflict not in ("existing", "replace"):
            raise ConfigurationError(
                f"Unique(on_conflict={self.on_conflict!r}) is not valid",
                fix='use "existing" (return the job already there) or "replace" (debounce)',
            )

    @property
    def mask(self) -> int:
        """The states as ``x_jobs.unique_states`` stores them."""
        mask = 0
        for state in self.states or ():
            mask |= STATE_BITS[state]
        return mask

    def describe(self) -> str:
        """The rule in words, as ``ultimat3-jobs schedule`` prints it."""
        window = f" per {self.period}" if self.period is not None else ""
        return f"unique{window} while {'/'.join(self.states or ())}, on conflict {self.on_conflict}"

    def key_for(
        self, *, job: str, payload: str, input: Any, tenant_id: str | None, now: datetime
    ) -> str:
        """The stored unique key of one enqueue: the job, the tenant, a digest of the key (or
        of the input's JSON text), and the window's number when there is a period."""
        if self.key is None:
            part = payload
        else:
            value = _call_key(self.key, input, job, "unique", 'o["user"]')
            part = f"{type(value).__name__}:{value}"
        digest = hashlib.blake2b(part.encode(), digest_size=16).hexdigest()
        tenant = "" if tenant_id is None else f"={tenant_id}"
        stored = f"{job}{tenant}:{digest}"
        if self._period is not None:
            seconds = self._period.total_seconds()
            stored += f"@{int(now.timestamp() // seconds)}"
        return stored


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``max`` starts per ``per`` (a sliding window), across every worker.

    ``@job(rate=Rate(100, per="1m"))``: a claim counts the starts of the partition within the
    last ``per`` (the ``attempted_at`` of its jobs, kept in the jobs table itself) and skips
    what would exceed ``max``; the skipped jobs wait without losing an attempt, and the worker
    is woken when the window reopens. The partition is the job's concurrency partition when it
    has one (``concurrency=Limit(...)``); otherwise ``key`` and ``scope`` name it the way
    ``Limit``'s ``key`` and ``per`` do. A retried job counts its latest start only, and finished
    rows must outlive the window (``retention`` longer than ``per``).
    """

    max: int
    per: DurationInput
    key: Callable[[Any], object] | str | None = None
    scope: str = "job"
    _period: timedelta = field(init=False, repr=False, compare=False, default=timedelta(0))

    def __post_init__(self) -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int) or not 1 <= self.max <= _MAX:
            raise ConfigurationError(
                f"Rate(max={self.max!r}) is not valid",
                fix=f'pass an int from 1 to {_MAX}: how many may start per period, e.g. Rate(100, per="1m")',
            )
        period = to_timedelta(self.per, name="per")
        if period < timedelta(milliseconds=1):
            raise ConfigurationError(
                f"Rate(per={self.per!r}) is not valid",
                fix='pass a period of at least 1ms, e.g. per="1s" or per="1m"',
            )
        object.__setattr__(self, "_period", period)
        Limit(1, key=self.key, per=self.scope)  # the same checks of key and scope

    @property
    def period(self) -> timedelta:
        """``per`` as a ``timedelta``."""
        return self._period

    def as_limit(self) -> Limit:
        """The partition it counts in, as a ``Limit`` without a concurrency cap."""
        return Limit(NO_LIMIT, key=self.key, per=self.scope)

    def describe(self) -> str:
        """The rule in words, as ``ultimat3-jobs schedule`` prints it."""
        return f"{self.max} starts per {self.per}"
