"""Retry arithmetic, pure, so a schedule is testable and printable (seed ``retry.ts``).

``ultimat3-jobs schedule`` prints ``retry_schedule()`` verbatim: anyone can see when attempt 5
lands without running a queue.

Guarantees:

- ``next_retry`` is the one place that decides retry against dead-letter; workers and the
  rescuer call it and never re-derive the rule. Attempts are 1-based and count the first run:
  ``attempts=1`` means no retry, and the job is exhausted once ``attempt >= attempts``.
- A delay is the seed's: exponential ``delay * 2**(n-1)``, linear ``delay * n``, fixed
  ``delay``; capped at ``max_delay``; then, with ``jitter`` (on by default), equal jitter
  ``capped/2 + capped/2 * roll`` so a burst of failures does not retry in lockstep; rounded to a
  whole millisecond, half up (JavaScript's ``Math.round``), so ``[capped/2, capped]`` holds to
  the millisecond.
- ``Retry`` is frozen and checked when built: a bad policy raises ``ConfigurationError`` at
  import time of the job that declares it, not at its first failure.

Deviation from the seed: its code applies jitter only when ``jitter === true``, against its own
doc ("equal jitter by default"); here the field defaults to ``True``, as the doc says.

Limits: no jitter strategy other than equal jitter; ``retry_schedule`` lists every delay, so a
policy with millions of attempts yields a list that long.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, TypeAlias, get_args

from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.errors import ConfigurationError

__all__ = [
    "DEFAULT_RETRY",
    "MAX_ATTEMPTS",
    "Backoff",
    "Random",
    "Retry",
    "RetryDecision",
    "backoff_delay",
    "next_retry",
    "retry_schedule",
]

Backoff: TypeAlias = Literal["exponential", "linear", "fixed"]
#: A source of rolls in ``[0, 1)``, such as ``random.random`` or a seeded ``Random().random``.
Random: TypeAlias = Callable[[], float]

_BACKOFFS: tuple[str, ...] = get_args(Backoff)
#: The most attempts a job may have (a bound every driver stores; a schedule stays printable).
MAX_ATTEMPTS = 10_000
_US = timedelta(microseconds=1)


@dataclass(frozen=True, init=False)
class Retry:
    """How a job is retried.

    ``attempts`` counts every run including the first; ``delay`` is the base delay and
    ``max_delay`` the ceiling of any one delay (text such as ``"90s"``, seconds, or a
    ``timedelta``; stored as ``timedelta``); ``jitter`` spreads retries (equal jitter);
    ``dead_letter`` parks an exhausted job in the ``dead`` state (``False`` discards it).
    """

    attempts: int
    backoff: Backoff
    delay: timedelta
    max_delay: timedelta
    jitter: bool
    dead_letter: bool

    def __init__(
        self,
        attempts: int = 3,
        backoff: Backoff = "exponential",
        delay: DurationInput = "1s",
        max_delay: DurationInput = "1h",
        jitter: bool = True,
        dead_letter: bool = True,
    ) -> None:
        # A hand-written __init__ (not __post_init__) lets the fields be typed ``timedelta``
        # while the constructor takes any DurationInput.
        if (
            isinstance(attempts, bool)
            or not isinstance(attempts, int)
            or not 1 <= attempts <= MAX_ATTEMPTS
        ):
            raise ConfigurationError(
                f"Retry(attempts={attempts!r}): attempts must be a whole number from 1 to "
                f"{MAX_ATTEMPTS}",
                fix="write attempts=1 for no retry, attempts=3 to retry twice",
            )
        if backoff not in _BACKOFFS:
            raise ConfigurationError(
                f"Retry(backoff={backoff!r}) is not a known backoff",
                fix='write backoff="exponential", "linear" or "fixed"',
            )
        for name, flag in (("jitter", jitter), ("dead_letter", dead_letter)):
            if not isinstance(flag, bool):
                raise ConfigurationError(
                    f"Retry({name}={flag!r}) must be True or False",
                    fix=f"write {name}=True or {name}=False",
                )
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "backoff", backoff)
        base = to_timedelta(delay, name="Retry(delay)")
        cap = to_timedelta(max_delay, name="Retry(max_delay)")
        if cap < base:
            raise ConfigurationError(
                f"Retry(delay={delay!r}) is longer than max_delay={max_delay!r}, which caps "
                "every delay, so the delay you wrote would never be used",
                fix=f"raise the cap too: Retry(delay={delay!r}, max_delay={delay!r}) or more",
            )
        object.__setattr__(self, "delay", base)
        object.__setattr__(self, "max_delay", cap)
        object.__setattr__(self, "jitter", jitter)
        object.__setattr__(self, "dead_letter", dead_letter)


DEFAULT_RETRY = Retry()
"""The retry policy of a job that names none: ``Retry()``'s defaults (``ultimat3-jobs schedule``
prints its delays)."""


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """What to do after a failed attempt: retry after ``delay`` as ``next_attempt``, or stop
    (``retry=False``) and park the job in ``dead`` when ``dead_letter``."""

    retry: bool
    delay: timedelta
    dead_letter: bool
    next_attempt: int


def backoff_delay(policy: Retry, attempt: int, random: Random | None = None) -> timedelta:
    """The delay after ``attempt`` failed (1-based: after the first run, ``attempt=1``).

    ``random`` is called once, only when ``policy.jitter``; it defaults to ``random.random``.
    """
    return _delay(policy, attempt, jitter=policy.jitter, random=random)


def next_retry(policy: Retry, attempt: int, random: Random | None = None) -> RetryDecision:
    """Retry or give up after ``attempt`` failed; the one place that decides it."""
    if attempt >= policy.attempts:
        return RetryDecision(
            retry=False, delay=timedelta(0), dead_letter=policy.dead_letter, next_attempt=attempt
        )
    return RetryDecision(
        retry=True,
        delay=backoff_delay(policy, attempt, random),
        dead_letter=False,
        next_attempt=attempt + 1,
    )


def retry_schedule(policy: Retry) -> list[timedelta]:
    """Every delay of the policy in order, jitter off, for docs and ``--json`` output."""
    return [_delay(policy, n, jitter=False, random=None) for n in range(1, policy.attempts)]


def _delay(policy: Retry, attempt: int, *, jitter: bool, random: Random | None) -> timedelta:
    base = policy.delay // _US
    cap = policy.max_delay // _US
    step = max(1, attempt)
    if policy.backoff == "fixed":
        raw = base
    elif policy.backoff == "linear":
        raw = base * step
    else:
        # Any shift past 62 bits already exceeds timedelta.max, so the cap applies; bounding
        # it keeps attempt=10**9 from building a billion-bit integer.
        raw = base << min(step - 1, 63)
    capped = min(raw, cap)
    if not jitter:
        return timedelta(milliseconds=(capped + 500) // 1000)
    roll = (random or _random.random)()
    if not 0.0 <= roll <= 1.0:
        raise ValueError(f"random() returned {roll!r}; it must return a number in [0, 1)")
    # Float arithmetic, like the seed: exact to well below a millisecond up to timedelta.max.
    half = capped / 2000
    return timedelta(milliseconds=math.floor(half + half * roll + 0.5))
