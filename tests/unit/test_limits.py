"""``Limit`` and ``Unique``: validated at definition time, and the keys they store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ultimat3.jobs import Limit, job
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.limits import STATE_BITS, Unique

NOW = datetime(2031, 1, 1, 12, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Limit(0), "Limit(max=0) is not valid"),
        (lambda: Limit(True), "Limit(max=True) is not valid"),
        (lambda: Limit(2, key=5), "Limit(key=5) is not valid"),  # type: ignore[arg-type]
        (lambda: Limit(2, per=""), "Limit(per='') is not valid"),
        (lambda: Unique(period="0s"), "Unique(period='0s') is not valid"),
        (lambda: Unique(states=("queued",)), "Unique(states=('queued',)) is not valid"),
        (lambda: Unique(states="running"), "Unique(states='running') is not valid"),  # type: ignore[arg-type]
        (lambda: Unique(on_conflict="merge"), "Unique(on_conflict='merge') is not valid"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_limit_fails_where_it_is_written(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        make()
    assert str(raised.value).startswith(message), raised.value
    assert raised.value.fix


def test_job_refuses_what_is_not_a_limit() -> None:
    with pytest.raises(ConfigurationError, match="concurrency= must be a Limit, got int"):
        job(concurrency=2)(lambda i: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="unique= must be a Unique, got bool"):
        job(unique=True)(lambda i: None)  # type: ignore[arg-type]


def test_limit_keys_name_their_partition() -> None:
    def key(limit: Limit, input: Any = None, tenant: str | None = None) -> str:
        return limit.key_for(job="send", queue="mail", input=input, tenant_id=tenant)

    assert key(Limit(2)) == "job:send"
    assert key(Limit(2, per="queue")) == "queue:mail"
    assert key(Limit(2, per="smtp")) == "name:smtp"
    assert key(Limit(2, key=lambda o: o["account"]), {"account": 42}) == "job:send=42"
    assert key(Limit(2, key="tenant"), tenant="acme") == "job:send=acme"
    with pytest.raises(ConfigurationError, match="returned None"):
        key(Limit(2, key=lambda o: o.get("account")), {})
    with pytest.raises(ConfigurationError, match="raised KeyError"):
        key(Limit(2, key=lambda o: o["account"]), {})
    assert Limit(4, key="tenant", per="queue").describe() == "4 per queue by tenant"


def test_unique_keys_and_states() -> None:
    def key(unique: Unique, input: Any, *, now: datetime = NOW, tenant: str | None = None) -> str:
        return unique.key_for(
            job="sync", payload=repr(input), input=input, tenant_id=tenant, now=now
        )

    plain = Unique()
    assert plain.states == ("scheduled", "available", "running")
    assert plain.mask == STATE_BITS["scheduled"] | STATE_BITS["available"] | STATE_BITS["running"]
    assert key(plain, {"a": 1}) == key(plain, {"a": 1}) != key(plain, {"a": 2})
    assert key(plain, 1, tenant="t") != key(plain, 1)
    by_user = Unique(key=lambda o: o["user"])
    assert key(by_user, {"user": 1, "x": 1}) == key(by_user, {"user": 1, "x": 2})
    assert key(by_user, {"user": 1}) != key(by_user, {"user": "1"}), "an int is not its text"
    hourly = Unique(period="1h")
    assert "completed" in (hourly.states or ())
    later = NOW.replace(minute=59)
    next_hour = NOW.replace(hour=13, minute=0)
    assert key(hourly, 1) == key(hourly, 1, now=later) != key(hourly, 1, now=next_hour)
