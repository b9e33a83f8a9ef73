"""Durations: one way in (``to_timedelta``), one way out (``format_duration``).

Guarantees:

- Every duration the library accepts becomes a non-negative ``timedelta``; anything else raises
  ``DurationError`` quoting the bad value, before anything is written.
- Text is a sequence of ``<number><unit>`` parts with units ``d``, ``h``, ``m``, ``s``, ``ms``,
  largest first, each at most once, spaces allowed between parts: ``"250ms"``, ``"90s"``,
  ``"1h30m"``, ``"1h 30m"``, ``"1.5s"``, ``"2d"``. Decimals are read exactly (no float error)
  and rounded to the microsecond, half to even, as ``timedelta`` itself does.
- Numbers are seconds; ``bool``, NaN, infinities and negatives are refused.
- Nothing longer than ``MAX_DURATION`` (10 years) is accepted: a lease, delay or snooze that
  long is a mistake (it would never expire, or land past year 9999).
- ``to_timedelta(format_duration(td)) == td`` for every ``timedelta`` from 0 to
  ``MAX_DURATION``, to the microsecond.

Limits: no ISO 8601 (``PT5M``), no months or years (their length depends on a calendar), no
unit-less text (``"30"`` is refused: write ``"30s"``), lower-case units only (``"5M"`` would be
ambiguous).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from fractions import Fraction
from typing import TypeAlias

from ultimat3.jobs.errors import DurationError

__all__ = ["MAX_DURATION", "DurationInput", "format_duration", "suggest", "to_timedelta"]

DurationInput: TypeAlias = str | int | float | timedelta

_US_PER_UNIT = {
    "d": 86_400_000_000,
    "h": 3_600_000_000,
    "m": 60_000_000,
    "s": 1_000_000,
    "ms": 1_000,
}
_UNIT_RANK = {unit: rank for rank, unit in enumerate(_US_PER_UNIT)}
# "ms" is listed before "m" and "s" so the alternation never splits it in two; a unit followed
# by a letter ("5 minutes") is not a unit, so the error names the whole word.
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|d|h|m|s)(?![A-Za-z])\s*", re.ASCII)
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
# Unit words people write, for the suggestion in an error (never accepted as input).
_WORD_UNITS = {
    **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds"), "ms"),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), "m"),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), "h"),
    **dict.fromkeys(("d", "day", "days"), "d"),
    **dict.fromkeys(("w", "week", "weeks"), "w"),
}
_WORD_PART = re.compile(_NUMBER + r"\s*([A-Za-z]*)[\s,]*(?:and\s+)?", re.ASCII)
#: The longest duration any setting accepts: 10 years (3,653 days). Longer leases, delays or
#: snoozes are mistakes (a lease that can never expire, a date past year 9999), refused early.
MAX_DURATION = timedelta(days=3653)
_MAX_US = MAX_DURATION // timedelta(microseconds=1)


def to_timedelta(value: DurationInput, *, name: str | None = None) -> timedelta:
    """The ``timedelta`` for a duration given as text, seconds, or a ``timedelta``.

    Raises ``DurationError`` (a ``ConfigurationError``) whose cause quotes ``value`` and, when
    given, the option's ``name``; durations over ``MAX_DURATION`` (10 years) are refused.
    """
    try:
        return _to_timedelta(value)
    except DurationError as exc:
        if name is None:
            raise
        cause = exc.cause.replace(f"duration {value!r}", f"{name}={value!r}", 1)
        raise DurationError(cause, fix=exc.fix, **exc.context) from None


def _to_timedelta(value: DurationInput) -> timedelta:
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise _error(value, "is negative")
        if value > MAX_DURATION:
            raise _error(value, "is longer than 10 years")
        return value
    if isinstance(value, bool):
        raise _error(value, "is a bool, not a duration")
    if isinstance(value, int):
        if value < 0:
            raise _error(value, "is negative")
        return _from_us(value * 1_000_000, value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _error(value, "is not a finite number")
        if value < 0:
            raise _error(value, "is negative")
        if value > _MAX_US / 1_000_000:
            raise _error(value, "is longer than 10 years")
        return timedelta(seconds=value)
    if isinstance(value, str):
        return _parse(value)
    raise _error(value, f"is a {type(value).__name__}, not text, a number or a timedelta")


def format_duration(td: timedelta) -> str:
    """Compact text for ``td`` that ``to_timedelta`` reads back exactly.

    ``"1h30m"``, ``"250ms"``, ``"2.5s"``, ``"2d"``, ``"0s"``; a negative ``td`` (never accepted
    as a setting, but possible as a difference) is printed with a leading ``-``.
    """
    total_us = td // timedelta(microseconds=1)
    if total_us < 0:
        return "-" + format_duration(-td)
    if total_us == 0:
        return "0s"
    days, rest = divmod(total_us, _US_PER_UNIT["d"])
    hours, rest = divmod(rest, _US_PER_UNIT["h"])
    minutes, rest = divmod(rest, _US_PER_UNIT["m"])
    seconds, micros = divmod(rest, _US_PER_UNIT["s"])
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if n]
    if seconds:
        parts.append(f"{seconds}{_fraction(micros, 6)}s")
    elif micros:
        whole_ms, micros_left = divmod(micros, 1000)
        parts.append(f"{whole_ms}{_fraction(micros_left, 3)}ms")
    return "".join(parts)


def _fraction(value: int, digits: int) -> str:
    """``value`` as the decimals of a number with ``digits`` places: 250000, 6 -> ".25"."""
    if not value:
        return ""
    return "." + f"{value:0{digits}d}".rstrip("0")


def _parse(text: str) -> timedelta:
    total = Fraction(0)
    pos = 0
    last_rank = -1
    stripped = text.strip()
    if not stripped:
        raise _error(text, "is empty")
    if stripped.startswith("-"):
        raise _error(text, "is negative")
    while pos < len(stripped):
        match = _PART.match(stripped, pos)
        if match is None:
            raise _error(text, _why_unreadable(stripped[pos:].strip()), suggestion=suggest(text))
        number, unit = match.groups()
        rank = _UNIT_RANK[unit]
        if rank <= last_rank:
            raise _error(text, f'repeats a unit or lists "{unit}" after a smaller one')
        last_rank = rank
        total += Fraction(number) * _US_PER_UNIT[unit]
        pos = match.end()
    return _from_us(round(total), text)


def _why_unreadable(rest: str) -> str:
    """Why the text stopped parsing at ``rest``, its unread tail."""
    if re.fullmatch(r"[\d.]+", rest, re.ASCII):
        return f'has a number without a unit: "{rest}"'
    word = re.match(_NUMBER + r"\s*([A-Za-z]+)", rest, re.ASCII)
    unknown = word.group(2) if word else rest
    return f'has an unknown part: "{unknown}" (units are d, h, m, s, ms)'


def suggest(text: str) -> str | None:
    """The duration text that a refused ``text`` most likely meant, for an error's fix:
    ``"30"`` -> ``"30s"``, ``"5 minutes"`` -> ``"5m"``, ``"1.5 hours"`` -> ``"1h30m"``,
    ``"1 week"`` -> ``"7d"``. None when no guess is safe (``"5M"``: minutes or months?)."""
    stripped = text.strip()
    total = Fraction(0)
    pos = 0
    while pos < len(stripped):
        match = _WORD_PART.match(stripped, pos)
        if match is None or match.end() == pos:
            return None
        number, word = match.groups()
        # One-letter units are case-sensitive ("M" is not minutes); words are not.
        unit = _WORD_UNITS.get(word if len(word) <= 1 else word.lower())
        if word == "":
            if pos or match.end() < len(stripped):
                return None  # a bare number is seconds only when it is all there is
            unit = "s"
        if unit is None:
            return None
        us_per = 7 * _US_PER_UNIT["d"] if unit == "w" else _US_PER_UNIT[unit]
        total += Fraction(number) * us_per
        pos = match.end()
    if pos == 0 or round(total) > _MAX_US:
        return None
    guess = format_duration(timedelta(microseconds=round(total)))
    return None if guess == stripped else guess


def _from_us(us: int, original: object) -> timedelta:
    if us > _MAX_US:
        raise _error(original, "is longer than 10 years")
    return timedelta(microseconds=us)


_FORMS = 'a number of seconds, a timedelta, or text such as "250ms", "90s", "1h30m", "2d"'
_TOO_LONG_FIX = (
    'use a duration of at most 3653d, such as "90s", "1h" or "30d"; for a job that should '
    "wait longer, schedule it nearer the time"
)


def _error(value: object, why: str, suggestion: str | None = None) -> DurationError:
    """The error for ``value``; its context keeps ``why`` and the ``suggestion`` (if any), so
    the command line can word the same mistake for an option."""
    fix = _TOO_LONG_FIX if "longer than 10 years" in why else None
    if suggestion is not None:
        fix = f'write "{suggestion}" (a duration is {_FORMS})'
    context: dict[str, str] = {"value": repr(value), "why": why}
    if suggestion is not None:
        context["suggestion"] = suggestion
    return DurationError(f"duration {value!r} {why}", fix=fix, **context)
