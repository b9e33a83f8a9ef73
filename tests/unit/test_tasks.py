"""Task definitions: validation at definition time, names, entries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ultimat3.jobs.cron import Occurrence, Plan
from ultimat3.jobs.errors import ConfigurationError, CronError, RegistrationError
from ultimat3.jobs.tasks import TaskHandle, task

SEND_DIGEST = object()  # stands in for a job handle: tasks only carry it


def nothing() -> list[tuple[Any, Any]]:
    return []


def digest() -> list[tuple[Any, Any]]:
    return [(SEND_DIGEST, {"kind": "daily"})]


def test_task_holds_its_definition() -> None:
    t = task("30 2 * * *", tz="America/New_York", enqueue=digest)
    assert isinstance(t, TaskHandle)
    assert t.kind == "task"
    assert (t.cron, t.tz, t.catch_up, t.max_catch_up, t.name) == (
        "30 2 * * *",
        "America/New_York",
        "skip",
        10,
        None,
    )
    assert t.entries() == ((SEND_DIGEST, {"kind": "daily"}),)
    assert t.explain() == "At 02:30 every day"


def test_options() -> None:
    t = task(
        "*/5 * * * *",
        tz="UTC",
        enqueue=nothing,
        catch_up="run-all",
        max_catch_up=3,
        name="sweep",
    )
    assert (t.catch_up, t.max_catch_up, t.name) == ("run-all", 3, "sweep")
    assert t.entries() == ()


def test_tz_is_required() -> None:
    with pytest.raises(TypeError, match="tz"):
        task("30 2 * * *", enqueue=digest)  # type: ignore[call-arg]


def test_empty_tz_is_a_cron_error() -> None:
    with pytest.raises(CronError) as info:
        task("30 2 * * *", tz="", enqueue=digest)
    assert "time zone is required" in info.value.cause
    assert "America/New_York" in info.value.fix


def test_unknown_zone_is_a_cron_error_with_a_fix() -> None:
    with pytest.raises(CronError) as info:
        task("30 2 * * *", tz="America/Gotham", enqueue=digest)
    assert "America/Gotham" in info.value.cause
    assert '"UTC"' in info.value.fix
    assert '"America/New_York"' in info.value.fix
    assert "fix:" in str(info.value)


def test_bad_cron_names_the_expression_the_reason_and_a_fix() -> None:
    with pytest.raises(CronError) as info:
        task("61 2 * * *", tz="UTC", enqueue=digest)
    assert "'61 2 * * *'" in info.value.cause
    assert "Bad minute" in info.value.cause  # cronsim's reason
    assert '"30 2 * * *"' in info.value.fix  # an example
    assert info.value.to_dict()["cron"] == "61 2 * * *"


def test_six_fields_with_seconds_are_accepted() -> None:
    t = task("15 30 2 * * *", tz="UTC", enqueue=digest)
    assert t.next_runs(datetime(2026, 1, 1, tzinfo=UTC), count=1) == [
        datetime(2026, 1, 1, 2, 30, 15, tzinfo=UTC)
    ]


def test_next_runs() -> None:
    t = task("0 9 * * MON-FRI", tz="America/New_York", enqueue=digest)
    friday = datetime(2026, 1, 2, 15, tzinfo=UTC)  # after 09:00 EST
    assert t.next_runs(friday) == [datetime(2026, 1, d, 14, tzinfo=UTC) for d in (5, 6, 7, 8, 9)]
    assert t.next_runs(friday, count=0) == []
    with pytest.raises(ValueError, match="count"):
        t.next_runs(friday, count=-1)


@pytest.mark.parametrize("policy", ["never", "run_once", "", None])
def test_unknown_catch_up_policy(policy: Any) -> None:
    with pytest.raises(ConfigurationError, match="catch_up") as info:
        task("30 2 * * *", tz="UTC", enqueue=digest, catch_up=policy)
    assert "run-once" in info.value.fix


@pytest.mark.parametrize("cap", [0, -1, True, 2.5, "3"])
def test_max_catch_up_must_be_a_positive_int(cap: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_catch_up"):
        task("30 2 * * *", tz="UTC", enqueue=digest, max_catch_up=cap)


def test_enqueue_must_be_callable() -> None:
    with pytest.raises(ConfigurationError, match="enqueue"):
        task("30 2 * * *", tz="UTC", enqueue=[(SEND_DIGEST, {})])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "produced",
    [None, "job", (SEND_DIGEST, {}, 3), [(SEND_DIGEST,)], [SEND_DIGEST]],
)
def test_entries_that_are_not_pairs_are_refused(produced: Any) -> None:
    t = task("30 2 * * *", tz="UTC", enqueue=lambda: produced, name="digest")
    with pytest.raises(RegistrationError) as info:
        t.entries()
    assert "'digest'" in info.value.cause
    assert "(job, input)" in info.value.fix


def test_entries_call_enqueue_each_time() -> None:
    calls: list[int] = []

    def fresh() -> list[tuple[Any, Any]]:
        calls.append(1)
        return [[SEND_DIGEST, {"n": len(calls)}]]  # type: ignore[list-item]

    t = task("30 2 * * *", tz="UTC", enqueue=fresh)
    assert t.entries() == ((SEND_DIGEST, {"n": 1}),)
    assert t.entries() == ((SEND_DIGEST, {"n": 2}),)


def test_name_binds_once() -> None:
    t = task("30 2 * * *", tz="UTC", enqueue=digest)
    t._bind_name("nightly_digest")
    assert t.name == "nightly_digest"
    t._bind_name("nightly_digest")  # the same name again is fine
    with pytest.raises(RegistrationError) as info:
        t._bind_name("digest_again")
    assert "'nightly_digest'" in info.value.cause
    assert "'digest_again'" in info.value.cause
    assert "name='nightly_digest'" in info.value.fix
    assert t.name == "nightly_digest"


def test_an_explicit_name_wins_and_cannot_be_rebound() -> None:
    t = task("30 2 * * *", tz="UTC", enqueue=digest, name="digest")
    with pytest.raises(RegistrationError):
        t._bind_name("export_name")


@pytest.mark.parametrize("name", ["", "has space", "x" * 201, "naïve"])
def test_bad_names(name: str) -> None:
    with pytest.raises(RegistrationError, match="task name"):
        task("30 2 * * *", tz="UTC", enqueue=digest, name=name)
    with pytest.raises(RegistrationError, match="task name"):
        task("30 2 * * *", tz="UTC", enqueue=digest)._bind_name(name)


def test_plan_uses_the_tasks_policy() -> None:
    t = task("*/1 * * * *", tz="UTC", enqueue=digest, catch_up="run-once")
    start = datetime(2026, 5, 1, 12, tzinfo=UTC)
    p = t.plan(last_fired=start, now=start + timedelta(minutes=5, seconds=1), started_at=start)
    assert p == Plan(
        fire=(
            Occurrence(start + timedelta(minutes=4), catch_up=True),
            Occurrence(start + timedelta(minutes=5), catch_up=False),
        ),
        missed=3,
        next_at=start + timedelta(minutes=6),
    )


def test_repr_names_the_task() -> None:
    t = task("30 2 * * *", tz="UTC", enqueue=digest, name="digest")
    assert repr(t) == "<TaskHandle digest '30 2 * * *' tz=UTC>"
