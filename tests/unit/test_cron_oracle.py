"""The cron plan against an independent brute-force oracle, over tzdata's zones.

The oracle knows nothing of cronsim or of ``ultimat3.jobs.cron``: it builds each schedule from
plain sets of minutes, hours, days and weekdays, walks real time minute by minute in UTC, reads
the wall clock with zoneinfo, and applies the Debian cron DST rule (ARCHITECTURE.md, "Cron") directly:

- an entry whose minute or hour field starts with ``*`` fires when the wall clock shows a
  matching time;
- a fixed-time entry fires when the wall clock shows a matching time it has never shown before
  (so a fold's second pass does not fire), or when the clock jumped over a matching time (a
  gap), at the first instant after the jump.

What it found in cronsim 2.8's own zone handling is listed in ``ultimat3.jobs.cron``'s
docstring; with cronsim used on wall-clock time only, the two agree on every case tried
(including the reverse walk that ``plan`` uses).
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ultimat3.jobs.cron import occurrences_between, schedule

MINUTE = timedelta(minutes=1)
# "localtime" is the host's own zone file, which the library refuses.
ZONES = sorted(zoneinfo.available_timezones() - {"localtime"})
# Longer than any fold in tzdata from 1990 on (Antarctica/Vostok fell back 7 h in 1994), so the
# oracle has seen every wall time a fold repeats before its window opens.
WARM_UP = timedelta(hours=30)


@dataclass(frozen=True)
class Shape:
    """A cron entry as sets the oracle can match without parsing anything."""

    expr: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int] | None  # None: the field is "*"
    weekdays: frozenset[int] | None  # cron numbering, Sunday = 0

    @property
    def fixed_time(self) -> bool:
        minute, hour = self.expr.split()[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        day_ok = self.days is None or wall.day in self.days
        weekday_ok = self.weekdays is None or (wall.weekday() + 1) % 7 in self.weekdays
        if self.days is not None and self.weekdays is not None:
            return day_ok or weekday_ok  # both restricted: Vixie cron's OR
        return day_ok and weekday_ok


def oracle(
    zone: ZoneInfo, shape: Shape, after: datetime, until: datetime, warm_up: timedelta = WARM_UP
) -> list[datetime]:
    t = (after - warm_up).replace(second=0, microsecond=0)
    fires: list[datetime] = []
    newest: datetime | None = None  # the latest wall time shown so far
    while t <= until:
        wall = t.astimezone(zone).replace(tzinfo=None)
        if not shape.fixed_time:
            fire = shape.matches(wall)
        elif newest is not None and wall <= newest:
            fire = False  # shown before: a fold's second pass
        else:
            fire = shape.matches(wall)
            skipped = newest + MINUTE if newest is not None else wall
            while not fire and skipped < wall:
                fire = shape.matches(skipped)
                skipped += MINUTE
        if fire and t > after:
            fires.append(t)
        if newest is None or wall > newest:
            newest = wall
        t += MINUTE
    return fires


@functools.lru_cache(maxsize=4096)
def transitions(name: str, year: int) -> tuple[datetime, ...]:
    """Instants in ``year`` where the zone's UTC offset changes (to the minute)."""
    zone = ZoneInfo(name)
    found: list[datetime] = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    step = timedelta(hours=6)
    offset = t.astimezone(zone).utcoffset()
    while t < end:
        nxt = t + step
        new = nxt.astimezone(zone).utcoffset()
        if new != offset:
            lo, hi = t, nxt
            while hi - lo > MINUTE:
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == offset:
                    lo = mid
                else:
                    hi = mid
            found.append(hi.replace(second=0, microsecond=0))
        offset, t = new, nxt
    return tuple(found)


def field(values: list[int], text: str) -> tuple[frozenset[int], str]:
    return frozenset(values), text


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    minute = draw(
        st.one_of(
            st.integers(0, 59).map(lambda m: field([m], str(m))),
            st.integers(1, 30).map(lambda n: field(list(range(0, 60, n)), f"*/{n}")),
            st.lists(st.integers(0, 59), min_size=2, max_size=3, unique=True).map(
                lambda ms: field(ms, ",".join(map(str, ms)))
            ),
        )
    )
    hour = draw(
        st.one_of(
            st.integers(0, 23).map(lambda h: field([h], str(h))),
            st.tuples(st.integers(0, 23), st.integers(0, 23)).map(
                lambda ab: field(list(range(min(ab), max(ab) + 1)), f"{min(ab)}-{max(ab)}")
            ),
            st.integers(1, 12).map(lambda n: field(list(range(0, 24, n)), f"*/{n}")),
            st.just(field(list(range(24)), "*")),
        )
    )
    days = draw(
        st.one_of(
            st.just(None),
            st.integers(1, 28).map(lambda d: field([d], str(d))),
            st.tuples(st.integers(1, 31), st.integers(1, 31)).map(
                lambda ab: field(list(range(min(ab), max(ab) + 1)), f"{min(ab)}-{max(ab)}")
            ),
        )
    )
    weekdays = draw(
        st.one_of(
            st.just(None),
            st.integers(0, 6).map(lambda d: field([d], str(d))),
            st.tuples(st.integers(0, 6), st.integers(0, 6)).map(
                lambda ab: field(list(range(min(ab), max(ab) + 1)), f"{min(ab)}-{max(ab)}")
            ),
        )
    )
    expr = " ".join(
        [
            minute[1],
            hour[1],
            days[1] if days else "*",
            "*",
            weekdays[1] if weekdays else "*",
        ]
    )
    return Shape(
        expr,
        minute[0],
        hour[0],
        days[0] if days else None,
        weekdays[0] if weekdays else None,
    )


@st.composite
def windows(draw: st.DrawFn) -> tuple[str, datetime, datetime]:
    """A zone and a window of up to three days around one of its transitions, if it has one."""
    name = draw(st.sampled_from(ZONES))
    year = draw(st.integers(1990, 2040))
    near = transitions(name, year)
    if near and draw(st.integers(0, 9)) > 0:
        centre = near[draw(st.integers(0, len(near) - 1))]
    else:
        centre = datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=draw(st.integers(0, 364)))
    # Each end lands near the centre (inside a fold or at a gap, when there is one) or far out.
    ends = st.one_of(st.integers(-90, 90), st.sampled_from([-36 * 60, 36 * 60]))
    after, until = (
        centre + timedelta(minutes=draw(ends), seconds=draw(st.integers(0, 59))) for _ in range(2)
    )
    if until <= after:
        after, until = min(after, until) - timedelta(hours=36), max(after, until)
    return name, after, until


def backwards(expr: str, tz: str, after: datetime, until: datetime) -> Iterator[datetime]:
    for at in schedule(expr, tz).before(until):
        if at <= after:
            return
        yield at


@given(window=windows(), shape=shapes())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_cron_agrees_with_the_oracle(window: tuple[str, datetime, datetime], shape: Shape) -> None:
    name, after, until = window
    expected = oracle(ZoneInfo(name), shape, after, until)
    got = list(occurrences_between(shape.expr, name, after, until))
    assert got == expected, (name, shape.expr)
    assert list(backwards(shape.expr, name, after, until))[::-1] == expected


# Entries that hit the transition hour in most zones (02:30 for spring, 01:30 for autumn), the
# midnight changes some zones use, and wildcards at two granularities.
EVERY_ZONE_SHAPES = [
    Shape("30 1 * * *", frozenset({30}), frozenset({1}), None, None),
    Shape("30 2 * * *", frozenset({30}), frozenset({2}), None, None),
    Shape("15 0 * * *", frozenset({15}), frozenset({0}), None, None),
    Shape("*/20 * * * *", frozenset({0, 20, 40}), frozenset(range(24)), None, None),
    Shape("0 */2 * * *", frozenset({0}), frozenset(range(0, 24, 2)), None, None),
]


def test_every_zone_agrees_around_its_2026_transitions() -> None:
    # Zones whose 2026 transitions have the same instants and offsets (aliases such as
    # US/Eastern, or neighbours sharing rules) behave identically; one of each is checked.
    seen: set[tuple[tuple[datetime, timedelta | None, timedelta | None], ...]] = set()
    checked = 0
    for name in ZONES:
        zone = ZoneInfo(name)
        changes = tuple(
            (t, (t - MINUTE).astimezone(zone).utcoffset(), t.astimezone(zone).utcoffset())
            for t in transitions(name, 2026)
        )
        if not changes or changes in seen:
            continue
        seen.add(changes)
        for centre, _, _ in changes:
            after, until = centre - timedelta(hours=5), centre + timedelta(hours=5)
            for shape in EVERY_ZONE_SHAPES:
                expected = oracle(zone, shape, after, until, warm_up=timedelta(hours=6))
                got = list(occurrences_between(shape.expr, name, after, until))
                assert got == expected, (name, centre, shape.expr)
                checked += 1
    assert (
        checked >= 250
    )  # 30 distinct behaviours in current tzdata, two transitions each, 5 shapes


FOLD_AND_GAP_SHAPES = [
    Shape("*/10 * * * *", frozenset(range(0, 60, 10)), frozenset(range(24)), None, None),
    Shape("5,35 * * * *", frozenset({5, 35}), frozenset(range(24)), None, None),
    Shape("20 0-3 * * *", frozenset({20}), frozenset(range(4)), None, None),
]


def test_windows_that_open_and_close_inside_folds_and_gaps() -> None:
    # Both ends of the window step through the transition, so each falls on either pass of a
    # fold and on either side of a gap; the forward and the backward walks must both agree.
    cases = [
        ("America/New_York", 2026),
        ("Australia/Lord_Howe", 2026),  # 30-minute shifts
        ("Antarctica/Vostok", 1994),  # a 7-hour fold, then a 7-hour gap
    ]
    for name, year in cases:
        zone = ZoneInfo(name)
        for centre in transitions(name, year):
            before, after_change = (
                (t.astimezone(zone).utcoffset() or MINUTE) for t in (centre - MINUTE, centre)
            )
            step = abs(after_change - before) / 6
            for k in range(-7, 8):
                after = centre + k * step + timedelta(seconds=30)
                until = after + 6 * step
                for shape in FOLD_AND_GAP_SHAPES:
                    expected = oracle(zone, shape, after, until, warm_up=timedelta(hours=8))
                    got = list(occurrences_between(shape.expr, name, after, until))
                    assert got == expected, (name, after, shape.expr)
                    assert list(backwards(shape.expr, name, after, until))[::-1] == expected
