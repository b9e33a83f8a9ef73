"""The cron plan: when a schedule fires, and what a scheduler owes after downtime. Pure, no I/O.

Guarantees:

- Every instant returned is an aware UTC ``datetime``; every function takes the time it reasons
  about as an argument (``after``, ``now``) and never reads a clock.
- Zones are IANA names, always required, spelt as tzdata spells them (``"utc"`` is refused
  with the hint ``"UTC"``); a task's zone must be ``"UTC"`` or a Region/City name
  (``region_zone``). An unknown zone or a bad expression raises ``CronError`` with the cause
  and a fix, before anything fires.
- DST follows Debian cron (ARCHITECTURE.md, "Invariants"; docs/cron.md has the golden table).
  An entry is *fixed-time* when neither its minute nor its hour field starts with ``*``
  (``0 0-3 * * *`` is fixed-time, ``*/15 1 * * *`` is not).
  A fixed-time entry whose wall time falls in a spring-forward gap fires once, at the first
  instant after the gap (several gap times collapse into that one instant); a wall time that
  the autumn fold shows twice fires once, at its first instant. Any other entry follows real
  elapsed time: it fires whenever the wall clock actually shows a matching time, so in a gap it
  does not fire and in a fold it fires on both passes.
- ``occurrences_between`` yields strictly increasing instants, each once, in ``(after, until]``.
- ``plan`` bounds its work: it walks back from ``now`` over at most
  ``max_catch_up + MISSED_COUNT_LIMIT + 1`` occurrences, however long the downtime.

How cronsim is used, and why not its own zone handling: cronsim parses the expression and
finds matching *wall-clock* times (it iterates naive datetimes, where it has no DST logic at
all); the mapping of wall times to instants under the rule above is done here. Checked with the
brute-force oracle of tests/unit/test_cron_oracle.py (an ad-hoc run over every zone, two random
1990–2040 transitions each, twelve entries), cronsim 2.8's own aware-datetime mode matched the
rule for fixed-time entries there, and differed from it in these ways:

- entries with a ``*`` minute or hour field miss real occurrences around transitions that are
  not on the hour (America/Caracas 2016-05-01, a 30-minute gap: ``0 * * * *`` skips 07:00Z;
  America/St_Johns 2002-04-07, a gap at 00:01: ``* 1 * * *`` misses the whole hour after it;
  Asia/Pyongyang 2015-08-14, a 30-minute fold before midnight: ``* 0 * * *`` misses 00:00 to
  00:29 after it);
- the same entries can hang: ``*/20 1 * * *`` in Asia/Colombo from 1996-10-25 10:00Z and
  ``0 */2 * * *`` in America/St_Johns around 1991-10-27 did not return within 30 s;
- a fixed-time entry asked for the next run from inside the second pass of a fold returns an
  instant *before* the one it was given (``30 1 * * *`` in New York after 2026-11-01 06:00Z
  returns 05:30Z);
- six-field expressions (seconds first) get no DST treatment at all; here the minute and hour
  fields decide as for five fields.

Limits: Debian cron treats a jump of more than three hours as a clock correction and runs no
skipped fixed-time jobs; here a zone's gap of any size is a gap (Pacific/Apia skipped
2011-12-30: a ``30 2 * * *`` entry fires at 00:00 on the 31st, then at 02:30). Transitions are
assumed to be more than a fold's length apart, as they are in tzdata.
"""

from __future__ import annotations

import difflib
import functools
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ultimat3.jobs.errors import ConfigurationError, CronError

__all__ = [
    "CATCH_UP_POLICIES",
    "DEFAULT_GRACE",
    "MISSED_COUNT_LIMIT",
    "CatchUp",
    "Occurrence",
    "Plan",
    "Schedule",
    "explain",
    "occurrences_between",
    "plan",
    "region_zone",
    "schedule",
]

CatchUp = Literal["skip", "run-once", "run-all"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = get_args(CatchUp)

#: How late an occurrence may be planned and still count as on time: one scheduler tick.
DEFAULT_GRACE = timedelta(seconds=60)

#: ``Plan.missed`` counts up to this many occurrences; a value equal to it means "at least".
MISSED_COUNT_LIMIT = 10_000

_CRON_EXAMPLE = 'write five fields, e.g. "30 2 * * *" (02:30 every day) or "*/15 * * * *"'
_ZONE_EXAMPLE = 'use an IANA zone name such as "UTC", "America/New_York" or "Europe/London"'
# A fixed reference for the definition-time check that an expression fires at all.
_PROBE = datetime(2000, 1, 1)

_NORMAL, _GAP, _FOLD = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Schedule:
    """A validated cron expression in a zone. Build it with ``schedule(cron, tz)``."""

    cron: str
    tz: str
    zone: ZoneInfo
    #: Debian's test: neither the minute nor the hour field starts with ``*``.
    fixed_time: bool

    def after(self, after: datetime) -> Iterator[datetime]:
        """Occurrences strictly after ``after``, ascending, without end."""
        after = _utc(after, "after")
        wall = _wall(after, self.zone)
        # Start at the beginning of a fold we are inside: its earlier wall times come round
        # again on the second pass, after ``after``.
        last = after
        for at in self._walk(wall - _fold_length(wall, self.zone), reverse=False):
            if at > last:
                yield at
                last = at

    def before(self, before: datetime) -> Iterator[datetime]:
        """Occurrences at or before ``before``, descending, without end."""
        before = _utc(before, "before")
        wall = _wall(before, self.zone)
        # Start past the end of a fold we are inside: its later wall times were shown on the
        # first pass, before ``before``. cronsim's reverse walk excludes its start, hence +1 s.
        start = wall + _fold_length(wall, self.zone) + timedelta(seconds=1)
        last = before + timedelta(microseconds=1)  # ``before`` itself may be returned
        for at in self._walk(start, reverse=True):
            if at < last:
                yield at
                last = at

    def _walk(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        """The instants of cronsim's wall times from ``start`` in walk order (ascending, or
        descending with ``reverse``), a repeat or a step back included: the callers drop
        those. A fold's pass the walk reaches second (the second pass ascending, the first
        descending) is held until the walk is past the fold."""
        pending: list[datetime] = []
        for w in _safe(CronSim(self.cron, start, reverse=reverse)):
            kind, first, second = _classify(w, self.zone)
            reached, later = (second, first) if reverse else (first, second)
            if pending and (
                kind != _FOLD or (reached <= pending[0] if reverse else reached >= pending[0])
            ):
                yield from pending
                pending.clear()
            if kind == _GAP:
                if self.fixed_time:
                    yield _gap_end(self.zone, second, first)
            elif kind == _FOLD and not self.fixed_time:
                yield reached
                pending.append(later)
            else:
                yield first
        yield from pending

    def next_after(self, after: datetime) -> datetime:
        """The first occurrence strictly after ``after`` (aware), in UTC."""
        for at in self.after(after):
            return at
        raise CronError(
            f"cron {self.cron!r} in {self.tz} has no occurrence within 50 years after "
            f"{after.isoformat()}",
            fix=_CRON_EXAMPLE,
            cron=self.cron,
        )


@functools.lru_cache(maxsize=512)
def schedule(cron: str, tz: str) -> Schedule:
    """Validate ``cron`` (five fields, or six with seconds first) and ``tz`` (an IANA name)."""
    if not isinstance(cron, str) or not cron.strip():
        raise CronError(f"the cron expression is empty: {cron!r}", fix=_CRON_EXAMPLE, cron="")
    expr = " ".join(cron.split())
    fields = expr.split(" ")
    if len(fields) not in (5, 6):
        raise CronError(
            f"cron {cron!r} has {len(fields)} fields; five are needed (six with seconds first), "
            "and @daily-style nicknames are not supported",
            fix=_CRON_EXAMPLE,
            cron=cron,
        )
    try:
        probe = CronSim(expr, _PROBE)
    except CronSimError as exc:
        raise CronError(f"cron {cron!r} is not valid: {exc}", fix=_CRON_EXAMPLE, cron=cron) from exc
    except Exception as exc:  # cronsim's own parser bugs must still reach users as CronError
        raise CronError(
            f"cron {cron!r} is not valid: {type(exc).__name__}: {exc}", fix=_CRON_EXAMPLE, cron=cron
        ) from exc
    if next(_safe(probe), None) is None:
        raise CronError(
            f"cron {cron!r} never fires (no date matches its day, month and weekday fields)",
            fix=_CRON_EXAMPLE,
            cron=cron,
        )
    minute, hour = fields[-5], fields[-4]
    return Schedule(
        cron=expr,
        tz=tz,
        zone=_zone(tz),
        fixed_time=not minute.startswith("*") and not hour.startswith("*"),
    )


def occurrences_between(cron: str, tz: str, after: datetime, until: datetime) -> Iterator[datetime]:
    """Every occurrence ``t`` with ``after < t <= until``, ascending, in UTC."""
    until = _utc(until, "until")
    for at in schedule(cron, tz).after(after):
        if at > until:
            return
        yield at


def explain(cron: str) -> str:
    """cronsim's English reading of the expression, e.g. "At 02:30 every day"."""
    expr = schedule(cron, "UTC").cron
    return str(CronSim(expr, _PROBE).explain())


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence to fire. ``catch_up`` marks one owed from downtime, not fired on time."""

    at: datetime
    catch_up: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """What one scheduler tick should do for one task.

    ``fire``: occurrences to enqueue, oldest first. ``missed``: due occurrences that the policy
    does not fire (capped at ``MISSED_COUNT_LIMIT``). ``next_at``: the next occurrence after
    ``now`` and after the last fired one. ``skip_to``: set when the latest due occurrence does
    not fire (``skip`` with it late); persist it as the task's last-fired instant so the skipped
    occurrences are settled and never counted again. Otherwise ``None``: the last of ``fire``
    is the latest due occurrence.
    """

    fire: tuple[Occurrence, ...]
    missed: int
    next_at: datetime
    skip_to: datetime | None = None


def plan(
    cron: str,
    tz: str,
    *,
    last_fired: datetime | None,
    now: datetime,
    catch_up: CatchUp,
    max_catch_up: int,
    started_at: datetime,
    grace: timedelta = DEFAULT_GRACE,
) -> Plan:
    """Decide which occurrences to fire at ``now``.

    Due: occurrences in ``(last_fired, now]``; for a task that never fired
    (``last_fired is None``), in ``(started_at, now]``: nothing is owed from before the task
    was first known. The latest due occurrence is *on time* when ``now - it <= grace``; then it
    fires normally (``catch_up=False``) and only the ones before it are *missed*. When it is
    late, every due occurrence is missed. Missed ones, by policy:

    - ``skip``: none fire;
    - ``run-once``: the latest missed one fires, marked ``catch_up=True``;
    - ``run-all``: the most recent ``max_catch_up`` missed ones fire, oldest first, marked
      ``catch_up=True``.

    ``missed`` counts the due occurrences that do not fire. Planning again at the same ``now``
    with ``last_fired`` set to the last of ``fire`` (or to ``skip_to``) plans nothing.
    """
    sched = schedule(cron, tz)
    check_catch_up(catch_up, max_catch_up)
    now = _utc(now, "now")
    since = _utc(last_fired, "last_fired") if last_fired is not None else None
    if since is None:
        since = _utc(started_at, "started_at")
    if grace < timedelta(0):
        raise ValueError(f"grace must not be negative, got {grace}")

    keep = {"skip": 1, "run-once": 2, "run-all": max_catch_up + 1}[catch_up]
    recent: list[datetime] = []  # the latest due occurrences, newest first
    due = 0
    for at in sched.before(now):
        if at <= since or due >= keep + MISSED_COUNT_LIMIT:
            break
        due += 1
        if len(recent) < keep:
            recent.append(at)

    next_at = sched.next_after(max(now, since))
    if not recent:
        return Plan(fire=(), missed=0, next_at=next_at)

    latest = recent[0]
    on_time = now - latest <= grace
    missed_recent = recent[1:] if on_time else recent
    if catch_up == "skip":
        chosen: list[datetime] = []
    elif catch_up == "run-once":
        chosen = missed_recent[:1]
    else:
        chosen = missed_recent[:max_catch_up]
    fire = [Occurrence(at, catch_up=True) for at in reversed(chosen)]
    if on_time:
        fire.append(Occurrence(latest, catch_up=False))
    missed = min(due - len(fire), MISSED_COUNT_LIMIT)
    skip_to = None if fire and fire[-1].at == latest else latest
    return Plan(fire=tuple(fire), missed=missed, next_at=next_at, skip_to=skip_to)


def check_catch_up(catch_up: object, max_catch_up: object) -> None:
    """``ConfigurationError`` unless ``catch_up`` is a policy and ``max_catch_up`` an int >= 1."""
    if catch_up not in CATCH_UP_POLICIES:
        raise ConfigurationError(
            f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {catch_up!r}",
            fix='pass catch_up="skip" (the default), "run-once" or "run-all"',
        )
    if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or max_catch_up < 1:
        raise ConfigurationError(
            f"max_catch_up must be an int >= 1, got {max_catch_up!r}",
            fix="pass max_catch_up=10 (the default) or another positive bound",
        )


def _zone(tz: str) -> ZoneInfo:
    if not isinstance(tz, str) or not tz.strip():
        raise CronError(
            f"a time zone is required, got {tz!r}", fix=f"pass tz=...; {_ZONE_EXAMPLE}", tz=""
        )
    if tz == "localtime":
        # The host's zone file: two scheduler hosts could disagree on when a task fires.
        raise CronError(
            'tz="localtime" names the host\'s zone, not an IANA zone',
            fix=_ZONE_EXAMPLE,
            tz=tz,
        )
    known = _known_zones()
    if tz not in known:
        # A case-insensitive file system may open "utc" as UTC; two hosts would then disagree.
        same = [name for name in known if name.lower() == tz.lower()]
        if same:
            raise CronError(
                f'unknown time zone {tz!r}; zone names are case-sensitive: "{same[0]}"',
                fix=f'write tz="{same[0]}"',
                tz=tz,
            )
        near = difflib.get_close_matches(tz, known, n=1, cutoff=0.8)
        hint = f'; did you mean "{near[0]}"?' if near else ""
        raise CronError(f"unknown time zone {tz!r}{hint}", fix=_ZONE_EXAMPLE, tz=tz)
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"unknown time zone {tz!r}", fix=_ZONE_EXAMPLE, tz=tz) from exc


@functools.cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


#: The first part of a Region/City zone name (tzdata's geographic areas).
REGIONS = frozenset(
    {
        "Africa",
        "America",
        "Antarctica",
        "Arctic",
        "Asia",
        "Atlantic",
        "Australia",
        "Europe",
        "Indian",
        "Pacific",
    }
)
_UTC_ALIASES = frozenset(
    {"Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "UCT", "Universal", "Zulu"}
    | {"Etc/GMT", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "Etc/Greenwich", "GMT", "GMT0"}
    | {"GMT+0", "GMT-0", "Greenwich"}
)
# The region a legacy or abbreviated name most often stands for, for the fix of a refusal.
_REGION_FOR = {
    **dict.fromkeys(("EST", "EST5EDT", "US/Eastern"), "America/New_York"),
    "US/East-Indiana": "America/Indiana/Indianapolis",
    **dict.fromkeys(("CST6CDT", "US/Central"), "America/Chicago"),
    **dict.fromkeys(("MST7MDT", "US/Mountain", "Navajo"), "America/Denver"),
    **dict.fromkeys(("MST", "US/Arizona"), "America/Phoenix"),
    **dict.fromkeys(("PST8PDT", "US/Pacific"), "America/Los_Angeles"),
    **dict.fromkeys(("HST", "US/Hawaii"), "Pacific/Honolulu"),
    "US/Alaska": "America/Anchorage",
    **dict.fromkeys(("CET", "MET"), "Europe/Paris"),
    "EET": "Europe/Athens",
    "WET": "Europe/Lisbon",
    **dict.fromkeys(("GB", "GB-Eire"), "Europe/London"),
    "Japan": "Asia/Tokyo",
    "PRC": "Asia/Shanghai",
}


def region_zone(tz: str) -> ZoneInfo:
    """The zone of a cron task: ``"UTC"`` or a Region/City name (``"Europe/London"``).

    Stricter than ``schedule``, which reckons in any tzdata zone: a task's zone says whose
    clock it follows, and a fixed offset (``"EST"`` is UTC-5 all year, with no daylight saving
    time), a POSIX rule (``"EST5EDT"``) or an alias (``"US/Eastern"``, ``"Etc/UTC"``) is a
    common way to get that wrong. Raises ``CronError`` naming the zone to write instead.
    """
    zone = _zone(tz)
    if tz == "UTC" or tz.split("/", 1)[0] in REGIONS:
        return zone
    if tz in _UTC_ALIASES:
        why, instead = "an alias of UTC", "UTC"
    elif tz.startswith("Etc/"):
        why, instead = "a fixed offset (its sign is the opposite of ISO 8601's)", None
    elif tz in _REGION_FOR:
        why, instead = _ZONE_KINDS.get(tz, "a legacy alias"), _REGION_FOR[tz]
    else:
        why, instead = "a legacy alias", None
    fix = (
        f'write tz="{instead}"'
        if instead
        else 'write a Region/City name such as "America/New_York" or "Europe/London", or "UTC"'
    )
    if tz.startswith("GMT") or tz.endswith("GMT"):
        fix += ', or tz="Europe/London" for the time in Britain, with its summer time'

    raise CronError(
        f"time zone {tz!r} is {why}, not a Region/City zone: a cron task needs the zone "
        "whose clock it follows",
        fix=fix,
        tz=tz,
    )


_ZONE_KINDS = {
    **dict.fromkeys(("EST", "MST", "HST"), "a fixed offset with no daylight saving time"),
    **dict.fromkeys(("EST5EDT", "CST6CDT", "MST7MDT", "PST8PDT"), "a POSIX-style rule"),
}


def _utc(value: datetime, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _wall(at: datetime, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time ``zone`` shows at ``at``, to the second (cronsim's resolution)."""
    return at.astimezone(zone).replace(tzinfo=None, microsecond=0, fold=0)


def _classify(wall: datetime, zone: ZoneInfo) -> tuple[int, datetime, datetime]:
    """Whether ``wall`` is shown once, never (a gap) or twice (a fold), with the two instants
    zoneinfo maps it to (fold=0 and fold=1): in a fold, the first and second pass; in a gap,
    the instants at the offsets before and after the transition, which lies between them."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return _NORMAL, first, first
    if first < second:
        return _FOLD, first, second
    return _GAP, first, second


def _fold_length(wall: datetime, zone: ZoneInfo) -> timedelta:
    kind, first, second = _classify(wall, zone)
    return second - first if kind == _FOLD else timedelta(0)


@functools.lru_cache(maxsize=256)
def _gap_end(zone: ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The first instant after the transition in ``(low, high]``: the end of a gap."""
    offset = low.astimezone(zone).utcoffset()
    lo, hi = 0, int((high - low).total_seconds())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (low + timedelta(seconds=mid)).astimezone(zone).utcoffset() == offset:
            lo = mid
        else:
            hi = mid
    return low + timedelta(seconds=hi)


def _safe(walls: CronSim) -> Iterator[datetime]:
    """cronsim's iterator, ended rather than raising when it runs out of 50-year search room
    or past the calendar's ends."""
    while True:
        try:
            yield next(walls)
        except (StopIteration, OverflowError):
            return
