from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ultimat3.jobs.duration import MAX_DURATION, format_duration, to_timedelta
from ultimat3.jobs.errors import ConfigurationError, DurationError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250ms", timedelta(milliseconds=250)),
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h 30m", timedelta(hours=1, minutes=30)),
        ("2d", timedelta(days=2)),
        ("1.5s", timedelta(seconds=1, milliseconds=500)),
        ("0.1s", timedelta(milliseconds=100)),
        (".5s", timedelta(milliseconds=500)),
        ("0s", timedelta(0)),
        ("  2m  ", timedelta(minutes=2)),
        ("1d2h3m4s5ms", timedelta(days=1, hours=2, minutes=3, seconds=4, milliseconds=5)),
        ("0.5ms", timedelta(microseconds=500)),
        ("1.25h", timedelta(hours=1, minutes=15)),
        ("0.0000015s", timedelta(microseconds=2)),  # half to even, as timedelta rounds
    ],
)
def test_text(text: str, expected: timedelta) -> None:
    assert to_timedelta(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, timedelta(0)),
        (90, timedelta(seconds=90)),
        (1.5, timedelta(seconds=1.5)),
        (0.25, timedelta(milliseconds=250)),
        (timedelta(minutes=3), timedelta(minutes=3)),
        (timedelta(0), timedelta(0)),
    ],
)
def test_numbers_are_seconds_and_timedelta_passes(value: Any, expected: timedelta) -> None:
    assert to_timedelta(value) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (True, "bool"),
        (False, "bool"),
        (math.nan, "not a finite number"),
        (math.inf, "not a finite number"),
        (-math.inf, "not a finite number"),
        (-1, "negative"),
        (-0.5, "negative"),
        (timedelta(seconds=-1), "negative"),
        ("", "empty"),
        ("   ", "empty"),
        ("30", "without a unit"),
        ("1h30", "without a unit"),
        ("-5s", "negative"),
        ("5M", "unknown part"),
        ("5 minutes", "unknown part"),
        ("1e3s", "unknown part"),
        ("1m1h", "after a smaller one"),
        ("1m30m", "repeats a unit"),
        ("abc", "unknown part"),
        ("٥s", "unknown part"),  # a non-ASCII digit
        ("99999999999d", "longer than 10 years"),
        (1e300, "longer than 10 years"),
        (None, "NoneType"),
        ([1], "list"),
    ],
)
def test_rejects_with_the_value_quoted(value: Any, why: str) -> None:
    with pytest.raises(DurationError) as info:
        to_timedelta(value)
    assert isinstance(info.value, ConfigurationError)
    assert repr(value) in info.value.cause
    assert why in info.value.cause
    assert "90s" in info.value.fix


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(seconds=2), "2s"),
        (timedelta(0), "0s"),
        (timedelta(days=2), "2d"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(seconds=2, milliseconds=500), "2.5s"),
        (timedelta(microseconds=500), "0.5ms"),
        (timedelta(microseconds=1), "0.001ms"),
        (timedelta(days=1, seconds=1, microseconds=1), "1d1.000001s"),
        (timedelta(hours=1), "1h"),
        (timedelta(seconds=-5), "-5s"),
    ],
)
def test_format(td: timedelta, text: str) -> None:
    assert format_duration(td) == text


@given(st.integers(min_value=0, max_value=MAX_DURATION // timedelta(milliseconds=1)))
def test_round_trip_at_millisecond_precision(ms: int) -> None:
    td = timedelta(milliseconds=ms)
    assert to_timedelta(format_duration(td)) == td


@given(st.timedeltas(min_value=timedelta(0), max_value=MAX_DURATION))
def test_round_trip_at_microsecond_precision(td: timedelta) -> None:
    assert to_timedelta(format_duration(td)) == td


@given(st.floats(min_value=0, max_value=MAX_DURATION.total_seconds(), allow_nan=False))
def test_float_seconds_match_timedelta(seconds: float) -> None:
    assert to_timedelta(seconds) == timedelta(seconds=seconds)


def test_durations_over_ten_years_are_refused_with_the_option_name() -> None:
    with pytest.raises(DurationError) as raised:
        to_timedelta("3654d", name="lease")
    assert raised.value.cause == "lease='3654d' is longer than 10 years"
    assert "3653d" in raised.value.fix
    assert to_timedelta("3653d") == MAX_DURATION
