"""The cron plan: golden DST cases (reliability.md R14), catch-up (R13), validation."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultimat3.jobs import cron
from ultimat3.jobs.cron import (
    MISSED_COUNT_LIMIT,
    Occurrence,
    Plan,
    explain,
    occurrences_between,
    plan,
    schedule,
)
from ultimat3.jobs.errors import ConfigurationError, CronError

NY = "America/New_York"
LONDON = "Europe/London"
TINY = timedelta(microseconds=1)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def local_day(tz: str, day: date) -> tuple[datetime, datetime]:
    """``(after, until)`` covering the local calendar day, for ``occurrences_between``."""
    zone = ZoneInfo(tz)
    start = datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)
    nxt = day + timedelta(days=1)
    end = datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).astimezone(UTC)
    return start - TINY, end - TINY


def on_local_day(cron_expr: str, tz: str, day: date) -> list[datetime]:
    return list(occurrences_between(cron_expr, tz, *local_day(tz, day)))


# -- R14: golden DST table --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "expr", "day", "expected"),
    [
        (NY, "30 2 * * *", date(2026, 3, 8), [utc(2026, 3, 8, 7, 0)]),
        (NY, "30 1 * * *", date(2026, 11, 1), [utc(2026, 11, 1, 5, 30)]),
        (LONDON, "30 1 * * *", date(2026, 3, 29), [utc(2026, 3, 29, 1, 0)]),
        (LONDON, "30 1 * * *", date(2026, 10, 25), [utc(2026, 10, 25, 0, 30)]),
    ],
)
def test_fixed_time_entries_fire_once_across_transitions(
    tz: str, expr: str, day: date, expected: list[datetime]
) -> None:
    assert on_local_day(expr, tz, day) == expected


@pytest.mark.parametrize(("day", "count"), [(date(2026, 3, 8), 23), (date(2026, 11, 1), 25)])
def test_hourly_wildcard_follows_real_time(day: date, count: int) -> None:
    fires = on_local_day("0 * * * *", NY, day)
    assert len(fires) == count
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(fires))


def test_quarter_hourly_fires_sixteen_times_in_the_four_hours_around_the_fold() -> None:
    fires = list(
        occurrences_between(
            "*/15 * * * *", NY, utc(2026, 11, 1, 4) - TINY, utc(2026, 11, 1, 8) - TINY
        )
    )
    assert len(fires) == 16
    assert fires[0] == utc(2026, 11, 1, 4, 0)
    assert fires[-1] == utc(2026, 11, 1, 7, 45)


@pytest.mark.parametrize("tz", [NY, LONDON])
def test_midnight_fires_once_per_local_day_across_both_transitions(tz: str) -> None:
    for month, first in ((3, 1), (10, 20)):
        for offset in range(20):
            day = date(2026, month, first) + timedelta(days=offset)
            fires = on_local_day("0 0 * * *", tz, day)
            local = [f.astimezone(ZoneInfo(tz)) for f in fires]
            assert [(t.date(), t.hour, t.minute) for t in local] == [(day, 0, 0)]


def test_debian_fixed_time_test_on_the_fold_day() -> None:
    # `0 0-3` is fixed-time: 01:00 fires on the first pass only.
    fires = on_local_day("0 0-3 * * *", NY, date(2026, 11, 1))
    assert fires == [
        utc(2026, 11, 1, 4),
        utc(2026, 11, 1, 5),
        utc(2026, 11, 1, 7),
        utc(2026, 11, 1, 8),
    ]
    # `*/15 1` is not: both passes of 01:xx fire.
    fires = on_local_day("*/15 1 * * *", NY, date(2026, 11, 1))
    assert len(fires) == 8
    assert fires[0] == utc(2026, 11, 1, 5, 0)
    assert fires[-1] == utc(2026, 11, 1, 6, 45)


def test_debian_fixed_time_test_on_the_gap_day() -> None:
    # 02:00 does not exist: it fires at 03:00 EDT, the same instant as 03:00 itself, once.
    fires = on_local_day("0 0-3 * * *", NY, date(2026, 3, 8))
    assert fires == [utc(2026, 3, 8, 5), utc(2026, 3, 8, 6), utc(2026, 3, 8, 7)]
    # A wildcard hour in the gap does not fire at all.
    assert on_local_day("*/15 2 * * *", NY, date(2026, 3, 8)) == []


def test_several_gap_times_collapse_into_one_instant() -> None:
    assert on_local_day("0,20,40 2 * * *", NY, date(2026, 3, 8)) == [utc(2026, 3, 8, 7)]


def test_thirty_minute_shift_lord_howe() -> None:
    tz = "Australia/Lord_Howe"  # +10:30 <-> +11 at 02:00 local
    # Gap 2026-10-04 02:00 -> 02:30: 02:15 fires at 02:30 (15:30Z the day before).
    assert on_local_day("15 2 * * *", tz, date(2026, 10, 4)) == [utc(2026, 10, 3, 15, 30)]
    # Fold 2026-04-05 02:00 -> 01:30: 01:45 fires on its first pass only.
    assert on_local_day("45 1 * * *", tz, date(2026, 4, 5)) == [utc(2026, 4, 4, 14, 45)]
    assert len(on_local_day("*/15 * * * *", tz, date(2026, 4, 5))) == 24 * 4 + 2


def test_a_skipped_day_is_a_gap_too() -> None:
    # Samoa skipped 2011-12-30; the 02:30 of that day fires when the 31st begins.
    fires = list(
        occurrences_between("30 2 * * *", "Pacific/Apia", utc(2011, 12, 28), utc(2011, 12, 31))
    )
    local = [f.astimezone(ZoneInfo("Pacific/Apia")).strftime("%m-%d %H:%M") for f in fires]
    assert local == ["12-28 02:30", "12-29 02:30", "12-31 00:00", "12-31 02:30"]


def test_six_field_expressions_follow_the_same_rule() -> None:
    # Seconds first. Fixed minute and hour: the gap's 02:30:xx collapse to 03:00:00.
    assert on_local_day("10,20 30 2 * * *", NY, date(2026, 3, 8)) == [utc(2026, 3, 8, 7)]
    assert on_local_day("10 30 1 * * *", NY, date(2026, 11, 1)) == [utc(2026, 11, 1, 5, 30, 10)]
    assert len(on_local_day("0 0 * * * *", NY, date(2026, 11, 1))) == 25


# -- next_after, occurrences_between -------------------------------------------------------


def test_next_after_is_strictly_after_and_utc() -> None:
    at = schedule("30 2 * * *", NY).next_after(utc(2026, 6, 1, 6, 30))
    assert at == utc(2026, 6, 2, 6, 30)
    assert at.tzinfo is UTC
    assert schedule("30 2 * * *", NY).next_after(
        utc(2026, 6, 1, 6, 29, 59) + timedelta(microseconds=999999)
    ) == utc(2026, 6, 1, 6, 30)


def test_next_after_from_inside_the_second_pass_of_a_fold() -> None:
    # 01:30 already had its first pass (05:30Z); the next is the following day's. cronsim's own
    # aware mode returns 05:30Z here, before the instant it was given.
    assert schedule("30 1 * * *", NY).next_after(utc(2026, 11, 1, 6, 0)) == utc(2026, 11, 2, 6, 30)
    # A wildcard entry asked from the first pass still sees the second pass of earlier minutes.
    assert schedule("15 * * * *", NY).next_after(utc(2026, 11, 1, 5, 45)) == utc(2026, 11, 1, 6, 15)


def test_next_after_accepts_other_zones_for_its_argument() -> None:
    after = datetime(2026, 6, 1, 2, 30, tzinfo=ZoneInfo(NY))
    assert schedule("30 2 * * *", NY).next_after(after) == utc(2026, 6, 2, 6, 30)


def test_occurrences_between_is_half_open() -> None:
    fires = list(occurrences_between("0 * * * *", "UTC", utc(2026, 1, 1, 0), utc(2026, 1, 1, 3)))
    assert fires == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2), utc(2026, 1, 1, 3)]
    assert (
        list(occurrences_between("0 * * * *", "UTC", utc(2026, 1, 1, 3), utc(2026, 1, 1, 1))) == []
    )


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule("0 * * * *", "UTC").next_after(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        list(occurrences_between("0 * * * *", "UTC", utc(2026, 1, 1), datetime(2026, 1, 2)))


def test_last_day_and_nth_weekday_extensions() -> None:
    assert schedule("0 12 L * *", "UTC").next_after(utc(2026, 2, 1)) == utc(2026, 2, 28, 12)
    assert schedule("0 12 * * MON#2", "UTC").next_after(utc(2026, 2, 1)) == utc(2026, 2, 9, 12)


def test_explain() -> None:
    assert explain("30 2 * * *") == "At 02:30 every day"
    assert explain("  */15   *  * * *") == "Every 15th minute of every hour"


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("60 * * * *", "Bad minute"),
        ("* * * *", "4 fields"),
        ("@daily", "1 fields"),
        ("0 0 30 2 *", "Bad day-of-month"),
        ("", "empty"),
        ("0 0 * * * * *", "7 fields"),
    ],
)
def test_bad_expressions_raise_cron_error_with_reason_and_fix(expr: str, reason: str) -> None:
    with pytest.raises(CronError) as info:
        schedule(expr, "UTC")
    assert reason in info.value.cause
    assert "*/15 * * * *" in info.value.fix
    if expr:
        assert repr(expr) in info.value.cause


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "localtime", "../etc/passwd", "/etc/localtime"])
def test_bad_zones_raise_cron_error_with_fix(tz: str) -> None:
    with pytest.raises(CronError) as info:
        schedule("0 * * * *", tz)
    assert "America/New_York" in info.value.fix
    assert "UTC" in info.value.fix


def test_schedule_knows_fixed_time_entries() -> None:
    assert schedule("0 0-3 * * *", "UTC").fixed_time
    assert not schedule("*/15 1 * * *", "UTC").fixed_time
    assert not schedule("0 */2 * * *", "UTC").fixed_time
    assert schedule("* 30 2 * * *", "UTC").fixed_time  # six fields: seconds do not count
    assert not schedule("0 * 2 * * *", "UTC").fixed_time


@given(st.text(alphabet="0123456789*/,-LW#? ABCDEFGHIJKLMNOPQRSTUVWXYZ", max_size=30))
@settings(max_examples=300, deadline=None)
def test_any_text_is_a_schedule_or_a_cron_error(expr: str) -> None:
    try:
        s = schedule(expr, "UTC")
    except CronError:
        return
    assert s.next_after(utc(2026, 1, 1)) > utc(2026, 1, 1)


# -- plan: R13, catch-up ------------------------------------------------------------------------

T0 = utc(2026, 5, 1, 12, 0)
EVERY_MINUTE = "*/1 * * * *"


def minute(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


def plan_every_minute(**kwargs: object) -> Plan:
    args: dict[str, object] = {
        "last_fired": T0,
        "catch_up": "skip",
        "max_catch_up": 10,
        "started_at": T0 - timedelta(days=1),
    }
    args.update(kwargs)
    return plan(EVERY_MINUTE, "UTC", **args)  # type: ignore[arg-type]


def restart(p: Plan, **kwargs: object) -> Plan:
    """The plan of the next start, after persisting what ``p`` fired or skipped."""
    last = p.fire[-1].at if p.fire else p.skip_to
    assert last is not None
    return plan_every_minute(last_fired=last, **kwargs)


# Down across T1..T10; restarted 30 s after T10 with a 10 s tick: all ten are late.
LATE = {"now": minute(10) + timedelta(seconds=30), "grace": timedelta(seconds=10)}


def test_r13_skip_backfills_nothing() -> None:
    p = plan_every_minute(catch_up="skip", **LATE)
    assert p.fire == ()
    assert p.missed == 10
    assert p.skip_to == minute(10)
    assert p.next_at == minute(11)
    again = restart(p, catch_up="skip", **LATE)
    assert again == Plan(fire=(), missed=0, next_at=minute(11))


def test_r13_run_once_fires_the_latest_missed() -> None:
    p = plan_every_minute(catch_up="run-once", **LATE)
    assert p.fire == (Occurrence(minute(10), catch_up=True),)
    assert p.missed == 9
    assert p.skip_to is None
    assert restart(p, catch_up="run-once", **LATE).fire == ()


def test_r13_run_all_fires_each_missed_oldest_first() -> None:
    p = plan_every_minute(catch_up="run-all", **LATE)
    assert p.fire == tuple(Occurrence(minute(n), catch_up=True) for n in range(1, 11))
    assert len({o.at for o in p.fire}) == 10
    assert p.missed == 0
    assert restart(p, catch_up="run-all", **LATE).fire == ()


def test_r13_run_all_keeps_the_most_recent_max_catch_up() -> None:
    p = plan_every_minute(catch_up="run-all", max_catch_up=3, **LATE)
    assert [o.at for o in p.fire] == [minute(8), minute(9), minute(10)]
    assert p.missed == 7
    assert restart(p, catch_up="run-all", max_catch_up=3, **LATE).fire == ()


@pytest.mark.parametrize(
    ("policy", "catch_ups", "missed"),
    [("skip", [], 10), ("run-once", [10], 9), ("run-all", list(range(1, 11)), 0)],
)
def test_r13_restarted_on_time_for_the_next_occurrence(
    policy: str, catch_ups: list[int], missed: int
) -> None:
    # Down across T1..T10, back 5 s after T11: T11 fires normally, T1..T10 were missed.
    now = minute(11) + timedelta(seconds=5)
    p = plan_every_minute(catch_up=policy, now=now)
    expected = [Occurrence(minute(n), catch_up=True) for n in catch_ups]
    assert p.fire == (*expected, Occurrence(minute(11), catch_up=False))
    assert p.missed == missed
    assert p.next_at == minute(12)
    assert restart(p, catch_up=policy, now=now) == Plan(fire=(), missed=0, next_at=minute(12))


def test_an_ordinary_tick_fires_the_one_due_occurrence() -> None:
    p = plan_every_minute(last_fired=minute(4), now=minute(5) + timedelta(seconds=1))
    assert p == Plan(fire=(Occurrence(minute(5), catch_up=False),), missed=0, next_at=minute(6))
    # Exactly at the occurrence, too.
    p = plan_every_minute(last_fired=minute(4), now=minute(5))
    assert p.fire == (Occurrence(minute(5), catch_up=False),)


def test_nothing_due_before_the_next_occurrence() -> None:
    p = plan_every_minute(last_fired=minute(5), now=minute(5) + timedelta(seconds=59))
    assert p == Plan(fire=(), missed=0, next_at=minute(6))


def test_a_new_task_owes_nothing_from_before_it_was_known() -> None:
    started = minute(3) + timedelta(seconds=30)
    p = plan_every_minute(
        last_fired=None,
        started_at=started,
        now=minute(4) + timedelta(seconds=2),
        catch_up="run-all",
    )
    assert p.fire == (Occurrence(minute(4), catch_up=False),)
    assert p.missed == 0
    p = plan_every_minute(last_fired=None, started_at=started, now=started)
    assert p == Plan(fire=(), missed=0, next_at=minute(4))


def test_the_latest_due_late_counts_as_missed() -> None:
    def daily(policy: cron.CatchUp) -> Plan:
        return plan(
            "30 2 * * *",
            "UTC",
            last_fired=utc(2026, 5, 1, 2, 30),
            now=utc(2026, 5, 2, 9),
            catch_up=policy,
            max_catch_up=10,
            started_at=T0,
        )

    p = daily("skip")
    assert p == Plan(
        fire=(), missed=1, next_at=utc(2026, 5, 3, 2, 30), skip_to=utc(2026, 5, 2, 2, 30)
    )
    p = daily("run-once")
    assert p.fire == (Occurrence(utc(2026, 5, 2, 2, 30), catch_up=True),)
    assert p.missed == 0


def test_grace_is_inclusive() -> None:
    daily = {
        "catch_up": "skip",
        "max_catch_up": 10,
        "started_at": T0,
        "last_fired": utc(2026, 5, 1, 2, 30),
    }
    due = utc(2026, 5, 2, 2, 30)
    p = plan("30 2 * * *", "UTC", now=due + timedelta(seconds=60), **daily)  # type: ignore[arg-type]
    assert p.fire == (Occurrence(due, catch_up=False),)
    p = plan("30 2 * * *", "UTC", now=due + timedelta(seconds=60, microseconds=1), **daily)  # type: ignore[arg-type]
    assert p.fire == ()
    assert p.skip_to == due
    p = plan(
        "30 2 * * *",
        "UTC",
        now=due + timedelta(minutes=5),
        grace=timedelta(minutes=5),
        **daily,  # type: ignore[arg-type]
    )
    assert p.fire == (Occurrence(due, catch_up=False),)


def test_last_fired_in_the_future_plans_nothing_and_waits_past_it() -> None:
    p = plan_every_minute(last_fired=minute(30), now=minute(10))
    assert p == Plan(fire=(), missed=0, next_at=minute(31))


def test_years_of_downtime_are_bounded_work() -> None:
    started = time.perf_counter()
    p = plan(
        "* * * * *",
        "America/New_York",
        last_fired=utc(2016, 1, 1),
        now=utc(2026, 1, 1, 0, 0, 30),
        catch_up="run-all",
        max_catch_up=5,
        started_at=utc(2015, 1, 1),
    )
    elapsed = time.perf_counter() - started
    assert [o.at for o in p.fire][-1] == utc(2026, 1, 1)
    assert len(p.fire) == 6
    assert p.missed == MISSED_COUNT_LIMIT
    assert elapsed < 5  # ~0.1 s measured; a full walk of ten years of minutes takes minutes


def test_plan_across_the_fold_fires_each_pass_of_a_wildcard_entry() -> None:
    p = plan(
        "*/30 * * * *",
        NY,
        last_fired=utc(2026, 11, 1, 4, 30),
        now=utc(2026, 11, 1, 7, 0, 10),
        catch_up="run-all",
        max_catch_up=10,
        started_at=T0,
    )
    assert [o.at for o in p.fire] == [
        utc(2026, 11, 1, 5) + timedelta(minutes=30 * n) for n in range(5)
    ]
    assert [o.catch_up for o in p.fire] == [True] * 4 + [False]


def test_plan_validates_its_policy() -> None:
    with pytest.raises(ConfigurationError, match="catch_up"):
        plan_every_minute(catch_up="all", now=minute(1))
    with pytest.raises(ConfigurationError, match="max_catch_up"):
        plan_every_minute(max_catch_up=0, now=minute(1))
    with pytest.raises(ValueError, match="timezone-aware"):
        plan_every_minute(now=datetime(2026, 1, 1))


# -- plan against a reference that walks every due occurrence ------------------------------------


def reference_plan(
    expr: str,
    tz: str,
    last_fired: datetime | None,
    now: datetime,
    policy: str,
    cap: int,
    started_at: datetime,
    grace: timedelta,
) -> tuple[list[Occurrence], int]:
    since = last_fired if last_fired is not None else started_at
    due = list(occurrences_between(expr, tz, since, now))
    if not due:
        return [], 0
    on_time = now - due[-1] <= grace
    missed = due[:-1] if on_time else due
    chosen = {"skip": [], "run-once": missed[-1:], "run-all": missed[-cap:]}[policy]
    fire = [Occurrence(at, True) for at in chosen] + (
        [Occurrence(due[-1], False)] if on_time else []
    )
    return fire, len(due) - len(fire)


@given(
    expr=st.sampled_from(["*/7 * * * *", "30 1 * * *", "0 */3 * * *", "15,45 0-4 * * 1-5"]),
    tz=st.sampled_from(["UTC", NY, LONDON, "Australia/Lord_Howe"]),
    start=st.datetimes(datetime(2026, 3, 1), datetime(2026, 11, 30)),
    since_back=st.integers(0, 3 * 24 * 60),
    now_back=st.integers(0, 3 * 24 * 60),
    never_fired=st.booleans(),
    policy=st.sampled_from(cron.CATCH_UP_POLICIES),
    cap=st.integers(1, 12),
    grace_s=st.integers(0, 600),
)
@settings(max_examples=150, deadline=None)
def test_plan_matches_the_reference(
    expr: str,
    tz: str,
    start: datetime,
    since_back: int,
    now_back: int,
    never_fired: bool,
    policy: cron.CatchUp,
    cap: int,
    grace_s: int,
) -> None:
    now = start.replace(tzinfo=UTC)
    since = now - timedelta(minutes=since_back)
    last_fired = None if never_fired else since
    started_at = since if never_fired else now - timedelta(minutes=now_back)
    grace = timedelta(seconds=grace_s)
    p = plan(
        expr,
        tz,
        last_fired=last_fired,
        now=now,
        catch_up=policy,
        max_catch_up=cap,
        started_at=started_at,
        grace=grace,
    )
    fire, missed = reference_plan(expr, tz, last_fired, now, policy, cap, started_at, grace)
    assert list(p.fire) == fire
    assert p.missed == missed
    assert p.next_at == schedule(expr, tz).next_after(max(now, since))
    settled = p.fire[-1].at if p.fire else p.skip_to
    due = list(occurrences_between(expr, tz, since, now))
    assert settled == (due[-1] if due else None)
    if settled is not None:
        again = plan(
            expr,
            tz,
            last_fired=settled,
            now=now,
            catch_up=policy,
            max_catch_up=cap,
            started_at=started_at,
            grace=grace,
        )
        assert again.fire == ()
        assert again.missed == 0


@pytest.mark.parametrize(
    ("expr", "minutes"),
    [
        ("29-29/2 * * * *", [29]),  # a one-value range stepped is that value, as in Debian cron
        ("5-5/10 * * * *", [5]),
        ("50-59/5 * * * *", [50, 55]),
    ],
)
def test_a_stepped_range_fires_only_inside_the_range(expr: str, minutes: list[int]) -> None:
    start = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
    fires = list(itertools.islice(schedule(expr, "UTC").after(start - timedelta(seconds=1)), 6))
    assert sorted({f.minute for f in fires}) == minutes
