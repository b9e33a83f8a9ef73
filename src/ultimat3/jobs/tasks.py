"""Cron task definitions: ``task(cron, tz=..., enqueue=...)`` returns a ``TaskHandle``.

Guarantees:

- A handle is valid when it exists: the expression (cronsim: five fields, or six with seconds
  first), the zone (``"UTC"`` or a Region/City name), the catch-up policy and
  ``max_catch_up`` are checked by ``task()``, which raises ``CronError`` or
  ``ConfigurationError`` with a fix. ``tz`` has no default: a
  schedule without a zone is a ``TypeError`` at the call, never a silent UTC.
- A handle's name is bound once: given to ``task(name=...)`` or taken from its export name when
  an app registers the module. Binding it to a second, different name raises
  ``RegistrationError``.
- ``entries()`` calls ``enqueue`` and returns what it gave as a tuple of ``(job handle, input)``
  pairs, or raises ``RegistrationError`` when it gave something else.

Limits: the handle knows nothing of apps, drivers or clocks; when it fires is
``ultimat3.jobs.cron``'s business, and firing it is the scheduler's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from ultimat3.jobs import cron as _cron
from ultimat3.jobs.errors import ConfigurationError, RegistrationError
from ultimat3.jobs.job import check_name

__all__ = ["CatchUp", "TaskHandle", "task"]

CatchUp = _cron.CatchUp

_ENQUEUE_FIX = (
    "make enqueue return a list of (job, input) pairs, e.g. `lambda: [(send_digest, {})]`"
)


class TaskHandle:
    """A cron task: when to fire (``cron`` in ``tz``) and what to enqueue each time."""

    kind: Literal["task"] = "task"

    def __init__(
        self,
        cron: str,
        *,
        tz: str,
        enqueue: Callable[[], Sequence[tuple[Any, Any]]],
        catch_up: CatchUp = "skip",
        max_catch_up: int = 10,
        name: str | None = None,
    ) -> None:
        _cron.region_zone(tz)
        self._schedule = _cron.schedule(cron, tz)
        if not callable(enqueue):
            raise ConfigurationError(
                f"enqueue= must be a function, got {type(enqueue).__name__}", fix=_ENQUEUE_FIX
            )
        _cron.check_catch_up(catch_up, max_catch_up)
        self.cron = self._schedule.cron
        self.tz = tz
        self.enqueue = enqueue
        self.catch_up: CatchUp = catch_up
        self.max_catch_up = max_catch_up
        self._name = check_name(name, "task", RegistrationError) if name is not None else None

    @property
    def name(self) -> str | None:
        """The task's name, or None until it is registered (or named with ``name=``)."""
        return self._name

    def _bind_name(self, name: str) -> None:
        if self._name is None:
            self._name = check_name(name, "task", RegistrationError)
        elif self._name != name:
            raise RegistrationError(
                f"task {self._name!r} cannot also be named {name!r}",
                fix=f"export it under one name, or fix its name with task(..., name={self._name!r})",
            )

    def entries(self) -> tuple[tuple[Any, Any], ...]:
        """Call ``enqueue`` and return its (job handle, input) pairs."""
        produced = self.enqueue()
        if isinstance(produced, str | bytes) or not isinstance(produced, Sequence):
            raise RegistrationError(
                f"task {self._name or self.cron!r}: enqueue returned "
                f"{type(produced).__name__}, not a list of (job, input) pairs",
                fix=_ENQUEUE_FIX,
            )
        pairs: list[tuple[Any, Any]] = []
        for entry in produced:
            if not isinstance(entry, tuple | list) or len(entry) != 2:
                raise RegistrationError(
                    f"task {self._name or self.cron!r}: enqueue returned the entry {entry!r}, "
                    "not a (job, input) pair",
                    fix=_ENQUEUE_FIX,
                )
            pairs.append((entry[0], entry[1]))
        return tuple(pairs)

    def explain(self) -> str:
        """The schedule in English (cronsim), e.g. "At 02:30 every day"."""
        return _cron.explain(self.cron)

    def next_runs(self, after: datetime, count: int = 5) -> list[datetime]:
        """The next ``count`` occurrences after ``after``, in UTC (``ultimat3-jobs schedule``)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        return list(itertools.islice(self._schedule.after(after), count))

    def plan(
        self,
        *,
        last_fired: datetime | None,
        now: datetime,
        started_at: datetime,
        grace: timedelta = _cron.DEFAULT_GRACE,
    ) -> _cron.Plan:
        """``ultimat3.jobs.cron.plan`` with this task's schedule and catch-up policy."""
        return _cron.plan(
            self.cron,
            self.tz,
            last_fired=last_fired,
            now=now,
            catch_up=self.catch_up,
            max_catch_up=self.max_catch_up,
            started_at=started_at,
            grace=grace,
        )

    def __repr__(self) -> str:
        return f"<TaskHandle {self._name or '?'} {self.cron!r} tz={self.tz}>"


def task(
    cron: str,
    *,
    tz: str,
    enqueue: Callable[[], Sequence[tuple[Any, Any]]],
    catch_up: CatchUp = "skip",
    max_catch_up: int = 10,
    name: str | None = None,
) -> TaskHandle:
    """Define a cron task: ``enqueue`` runs at each occurrence of ``cron`` in the zone ``tz``.

    ``tz`` is required: ``"UTC"`` or a Region/City name such as ``"America/New_York"``
    (``"EST"``, a fixed offset, and aliases such as ``"US/Eastern"`` are refused with the name
    to write). ``enqueue``
    returns the ``(job handle, input)`` pairs to enqueue at each occurrence. ``catch_up`` says
    what happens to occurrences missed while no scheduler ran: ``"skip"`` (default),
    ``"run-once"`` (the latest one), ``"run-all"`` (each, at most ``max_catch_up``).
    """
    return TaskHandle(
        cron, tz=tz, enqueue=enqueue, catch_up=catch_up, max_catch_up=max_catch_up, name=name
    )
