"""The library's messages for a newcomer's first mistakes: each says what to write instead."""

from __future__ import annotations

import inspect
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

import ultimat3.jobs
import ultimat3.jobs.testing
from ultimat3.jobs import (
    DATETIME,
    App,
    CronError,
    DurationError,
    Retry,
    SerializationError,
    job,
    task,
)
from ultimat3.jobs.duration import suggest, to_timedelta


@pytest.mark.parametrize(
    ("text", "cause", "fix"),
    [
        (
            "5 minutes",
            """Retry(delay)='5 minutes' has an unknown part: "minutes" (units are d, h, m, s, ms)""",
            'write "5m" (a duration is a number of seconds, a timedelta, or text such as '
            '"250ms", "90s", "1h30m", "2d")',
        ),
        (
            "30",
            """Retry(delay)='30' has a number without a unit: "30\"""",
            'write "30s" (a duration is a number of seconds, a timedelta, or text such as '
            '"250ms", "90s", "1h30m", "2d")',
        ),
        (
            "5M",
            """Retry(delay)='5M' has an unknown part: "M" (units are d, h, m, s, ms)""",
            'write a number of seconds, a timedelta, or text such as "250ms", "90s", "1h30m", "2d"',
        ),
    ],
)
def test_a_bad_duration_names_the_unknown_word_and_the_text_to_write(
    text: str, cause: str, fix: str
) -> None:
    with pytest.raises(DurationError) as raised:
        Retry(delay=text)
    assert (raised.value.cause, raised.value.fix) == (cause, fix)


@pytest.mark.parametrize(
    ("text", "meant"),
    [
        ("30", "30s"),
        ("5 minutes", "5m"),
        ("1.5 hours", "1h30m"),
        ("1h 30 minutes", "1h30m"),
        ("2 days, 3 hours", "2d3h"),
        ("1 week", "7d"),
        ("10 secs", "10s"),
        ("250 milliseconds", "250ms"),
        ("5M", None),  # minutes or months: no guess
        ("abc", None),
        ("1h30", None),  # 1h30m or 1h30s: no guess
        ("30 30", None),
    ],
)
def test_suggestions_are_what_the_text_meant(text: str, meant: str | None) -> None:
    assert suggest(text) == meant
    if meant is not None:
        assert to_timedelta(meant) > to_timedelta(0)


@pytest.mark.parametrize(
    ("tz", "cause", "fix"),
    [
        (
            "utc",
            """unknown time zone 'utc'; zone names are case-sensitive: "UTC\"""",
            'write tz="UTC"',
        ),
        (
            "america/new_york",
            """unknown time zone 'america/new_york'; zone names are case-sensitive: "America/New_York\"""",
            'write tz="America/New_York"',
        ),
        (
            "America/New_Yrok",
            """unknown time zone 'America/New_Yrok'; did you mean "America/New_York"?""",
            'use an IANA zone name such as "UTC", "America/New_York" or "Europe/London"',
        ),
        (
            "EST",
            "time zone 'EST' is a fixed offset with no daylight saving time, not a Region/City "
            "zone: a cron task needs the zone whose clock it follows",
            'write tz="America/New_York"',
        ),
        (
            "PST8PDT",
            "time zone 'PST8PDT' is a POSIX-style rule, not a Region/City zone: a cron task "
            "needs the zone whose clock it follows",
            'write tz="America/Los_Angeles"',
        ),
        (
            "US/Eastern",
            "time zone 'US/Eastern' is a legacy alias, not a Region/City zone: a cron task "
            "needs the zone whose clock it follows",
            'write tz="America/New_York"',
        ),
        (
            "Etc/GMT+5",
            "time zone 'Etc/GMT+5' is a fixed offset (its sign is the opposite of ISO 8601's), "
            "not a Region/City zone: a cron task needs the zone whose clock it follows",
            'write a Region/City name such as "America/New_York" or "Europe/London", or "UTC"',
        ),
        (
            "GMT",
            "time zone 'GMT' is an alias of UTC, not a Region/City zone: a cron task needs the "
            "zone whose clock it follows",
            'write tz="UTC", or tz="Europe/London" for the time in Britain, with its summer time',
        ),
    ],
)
def test_a_task_zone_is_utc_or_a_region(tz: str, cause: str, fix: str) -> None:
    with pytest.raises(CronError) as raised:
        task("30 2 * * *", tz=tz, enqueue=list)
    assert (raised.value.cause, raised.value.fix) == (cause, fix)


@pytest.mark.parametrize("tz", ["UTC", "America/New_York", "Europe/Kyiv", "Asia/Kolkata"])
def test_utc_and_regions_are_accepted(tz: str) -> None:
    assert task("30 2 * * *", tz=tz, enqueue=list).tz == tz


@job
def remind(input: dict[str, object]) -> None: ...


def memory_app(**options: Any) -> App:
    """An App on the memory driver that knows this module's jobs."""
    return App("memory://", modules=[sys.modules[__name__]], **options)


def test_the_datetime_fix_names_the_public_codec() -> None:
    app = memory_app()
    with pytest.raises(SerializationError) as raised:
        app.enqueue(remind, {"at": datetime(2030, 1, 1, tzinfo=UTC)})
    assert raised.value.fix == (
        "pass App(..., codecs=[DATETIME]) (from ultimat3.jobs import DATETIME), or pass "
        "value.isoformat()"
    )
    app.close()
    fixed = memory_app(codecs=[DATETIME])
    assert fixed.enqueue(remind, {"at": datetime(2030, 1, 1, tzinfo=UTC)}).deduped is False
    fixed.close()


def test_an_enqueue_result_shows_its_public_name() -> None:
    app = memory_app()
    result = app.enqueue(remind, {})
    assert repr(result) == f"EnqueueResult(id={result.id!r}, deduped=False)"
    assert type(result) is ultimat3.jobs.EnqueueResult
    app.close()


def test_public_docstrings_speak_to_users() -> None:
    """No wording from the project's own history (the "seed" it was ported from) in help()."""
    leaks = []
    for module in (ultimat3.jobs, ultimat3.jobs.testing):
        for name in module.__all__:
            value = getattr(module, name)
            docs = [(name, inspect.getdoc(value) or "")]
            if inspect.isclass(value):
                docs += [
                    (f"{name}.{attr}", member.__doc__)
                    for attr, member in vars(value).items()
                    if isinstance(getattr(member, "__doc__", None), str)
                ]
            leaks += [where for where, doc in docs if "seed" in doc.lower()]
    assert leaks == []
    assert "seed" not in (task.__doc__ or "")


def _two_strings(to: str, subject: str) -> None: ...


def _three(order: dict[str, Any], ctx: Any, extra: int) -> None: ...


def _keyword_required(order: dict[str, Any], *, region: str) -> None: ...


def _star_args(*args: Any) -> None: ...


@pytest.mark.parametrize("fn", [_two_strings, _three, _keyword_required, _star_args])
def test_a_job_function_of_another_shape_is_refused_at_definition(fn: Any) -> None:
    with pytest.raises(ultimat3.jobs.ConfigurationError) as raised:
        job(fn)
    assert fn.__qualname__ in raised.value.cause
    assert "def send(order: dict, ctx: JobContext)" in (raised.value.fix or "")
    assert "named ctx or context" in (raised.value.fix or "")


def _annotated(order: dict[str, Any], run: ultimat3.jobs.JobContext) -> None: ...


def _named(order: dict[str, Any], ctx) -> None: ...  # type: ignore[no-untyped-def]


def _alone(order: dict[str, Any], *, dry_run: bool = False) -> None: ...


@pytest.mark.parametrize(("fn", "wants"), [(_annotated, True), (_named, True), (_alone, False)])
def test_the_accepted_shapes_say_whether_they_take_the_context(fn: Any, wants: bool) -> None:
    assert job(fn).wants_context is wants
