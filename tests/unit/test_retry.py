from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ultimat3.jobs.errors import ConfigurationError, DurationError
from ultimat3.jobs.retry import (
    DEFAULT_RETRY,
    Backoff,
    Retry,
    RetryDecision,
    backoff_delay,
    next_retry,
    retry_schedule,
)

S = timedelta(seconds=1)


def never() -> float:
    raise AssertionError("random must not be called")


def test_default_policy() -> None:
    assert Retry() == DEFAULT_RETRY
    assert DEFAULT_RETRY.attempts == 3
    assert DEFAULT_RETRY.backoff == "exponential"
    assert DEFAULT_RETRY.delay == S
    assert DEFAULT_RETRY.max_delay == timedelta(hours=1)
    assert DEFAULT_RETRY.jitter is True  # the seed's doc, not its `=== true`
    assert DEFAULT_RETRY.dead_letter is True
    assert retry_schedule(DEFAULT_RETRY) == [1 * S, 2 * S]


@pytest.mark.parametrize(
    ("backoff", "delay", "max_delay", "expected"),
    [
        ("exponential", "1s", "10s", [1, 2, 4, 8, 10]),
        ("exponential", "1s", "1h", [1, 2, 4, 8, 16]),
        ("linear", "1s", "10s", [1, 2, 3, 4, 5]),
        ("linear", "1s", "3s", [1, 2, 3, 3, 3]),
        ("fixed", "2s", "10s", [2, 2, 2, 2, 2]),
        ("fixed", "10s", "10s", [10, 10, 10, 10, 10]),
    ],
)
def test_seed_schedules(backoff: Backoff, delay: str, max_delay: str, expected: list[int]) -> None:
    policy = Retry(attempts=6, backoff=backoff, delay=delay, max_delay=max_delay)
    assert retry_schedule(policy) == [n * S for n in expected]


def test_durations_are_normalised() -> None:
    policy = Retry(delay=0.5, max_delay=timedelta(minutes=1))
    assert policy.delay == timedelta(milliseconds=500)
    assert policy.max_delay == timedelta(minutes=1)
    assert Retry(delay="1s", max_delay=3600) == DEFAULT_RETRY


def test_frozen_and_replaceable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_RETRY.attempts = 5  # type: ignore[misc]
    changed = dataclasses.replace(DEFAULT_RETRY, attempts=5)
    assert changed.attempts == 5
    assert changed.delay == S
    assert hash(Retry()) == hash(DEFAULT_RETRY)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": -1}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"attempts": 1.5}, "attempts"),
        ({"attempts": "3"}, "attempts"),
        ({"backoff": "exp"}, "backoff"),
        ({"backoff": None}, "backoff"),
        ({"jitter": "yes"}, "jitter"),
        ({"dead_letter": 1}, "dead_letter"),
    ],
)
def test_bad_policy(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Retry(**kwargs)
    assert fragment in info.value.cause
    assert info.value.fix


@pytest.mark.parametrize("kwargs", [{"delay": "soon"}, {"max_delay": -1}])
def test_bad_duration(kwargs: dict[str, Any]) -> None:
    with pytest.raises(DurationError):
        Retry(**kwargs)


def test_jitter_is_equal_jitter() -> None:
    assert backoff_delay(DEFAULT_RETRY, 1, random=lambda: 0.0) == timedelta(milliseconds=500)
    assert backoff_delay(DEFAULT_RETRY, 1, random=lambda: 0.5) == timedelta(milliseconds=750)
    assert backoff_delay(DEFAULT_RETRY, 2, random=lambda: 0.5) == timedelta(milliseconds=1500)
    assert backoff_delay(DEFAULT_RETRY, 1, random=lambda: 0.9999) == timedelta(milliseconds=1000)


def test_jitter_defaults_to_the_stdlib_random() -> None:
    seen = {backoff_delay(DEFAULT_RETRY, 3) for _ in range(50)}
    assert len(seen) > 1
    assert all(2 * S <= d <= 4 * S for d in seen)


def test_jitter_off_never_rolls() -> None:
    policy = Retry(jitter=False)
    assert backoff_delay(policy, 3, random=never) == 4 * S


def test_rounding_is_half_up_like_math_round() -> None:
    off = Retry(jitter=False, delay="1.5ms", backoff="fixed")
    assert backoff_delay(off, 1) == timedelta(milliseconds=2)
    off = Retry(jitter=False, delay="2.5ms", backoff="fixed")  # banker's rounding would say 2
    assert backoff_delay(off, 1) == timedelta(milliseconds=3)
    on = Retry(delay="1ms", backoff="fixed")  # 0.5 + 0.5 * 0 = 0.5 -> 1
    assert backoff_delay(on, 1, random=lambda: 0.0) == timedelta(milliseconds=1)


def test_attempt_below_one_counts_as_one() -> None:
    policy = Retry(jitter=False)
    assert backoff_delay(policy, 0) == S
    assert backoff_delay(policy, -5) == S


def test_a_delay_longer_than_its_cap_is_refused() -> None:
    # The seed would cap a 20s delay at max_delay 10s silently; here the mistake is named.
    with pytest.raises(ConfigurationError) as raised:
        Retry(delay="1h30m")
    assert "max_delay='1h'" in raised.value.cause
    assert "max_delay='1h30m'" in raised.value.fix


def test_attempts_are_bounded() -> None:
    with pytest.raises(ConfigurationError, match="from 1 to 10000"):
        Retry(attempts=2**70)


def test_huge_attempt_is_capped_quickly() -> None:
    policy = Retry(jitter=False, attempts=10_000)
    assert backoff_delay(policy, 10**9) == timedelta(hours=1)
    linear = Retry(jitter=False, backoff="linear", max_delay="2d")
    assert backoff_delay(linear, 10**15) == timedelta(days=2)


def test_random_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="random"):
        backoff_delay(DEFAULT_RETRY, 1, random=lambda: 1.5)


def test_next_retry_before_exhaustion() -> None:
    policy = Retry(jitter=False)
    assert next_retry(policy, 1) == RetryDecision(
        retry=True, delay=S, dead_letter=False, next_attempt=2
    )
    assert next_retry(policy, 2) == RetryDecision(
        retry=True, delay=2 * S, dead_letter=False, next_attempt=3
    )
    jittered = next_retry(DEFAULT_RETRY, 2, random=lambda: 0.0)
    assert jittered.delay == S


@pytest.mark.parametrize("dead_letter", [True, False])
def test_next_retry_at_exhaustion(dead_letter: bool) -> None:
    policy = Retry(attempts=3, dead_letter=dead_letter)
    for attempt in (3, 4):
        decision = next_retry(policy, attempt, random=never)
        assert decision == RetryDecision(
            retry=False, delay=timedelta(0), dead_letter=dead_letter, next_attempt=attempt
        )


def test_one_attempt_means_no_retry() -> None:
    policy = Retry(attempts=1)
    assert retry_schedule(policy) == []
    decision = next_retry(policy, 1, random=never)
    assert decision.retry is False
    assert decision.dead_letter is True


def test_schedule_ignores_jitter() -> None:
    assert retry_schedule(Retry(attempts=4, jitter=True)) == [S, 2 * S, 4 * S]


policies = st.builds(
    Retry,
    attempts=st.integers(min_value=1, max_value=40),
    backoff=st.sampled_from(["exponential", "linear", "fixed"]),
    delay=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=1)),
    max_delay=st.timedeltas(min_value=timedelta(days=1), max_value=timedelta(days=30)),
)


def _rounded_ms(us: float) -> timedelta:
    return timedelta(milliseconds=math.floor(us / 1000 + 0.5))


@given(
    policies,
    st.integers(min_value=-2, max_value=200),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_jittered_delay_lies_between_half_and_full(
    policy: Retry, attempt: int, roll: float
) -> None:
    off = dataclasses.replace(policy, jitter=False)
    full = backoff_delay(off, attempt)
    raw_us = policy.delay // timedelta(microseconds=1)
    step = max(1, attempt)
    multiplier = {"fixed": 1, "linear": step, "exponential": 2 ** (step - 1)}[policy.backoff]
    capped_us = min(raw_us * multiplier, policy.max_delay // timedelta(microseconds=1))
    assert full == _rounded_ms(capped_us)
    jittered = backoff_delay(dataclasses.replace(policy, jitter=True), attempt, lambda: roll)
    assert _rounded_ms(capped_us / 2) <= jittered <= full


@given(policies)
def test_schedule_is_monotonic_and_capped(policy: Retry) -> None:
    schedule = retry_schedule(policy)
    assert len(schedule) == policy.attempts - 1
    assert schedule == sorted(schedule)
    assert all(d <= policy.max_delay + timedelta(microseconds=500) for d in schedule)
    assert all(d.microseconds % 1000 == 0 for d in schedule)
