"""The records that cross the driver seam."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from ultimat3.jobs.records import NewJob


def test_a_sibling_is_the_job_with_its_six_own_fields_replaced_and_stays_frozen() -> None:
    first = NewJob(
        id="a",
        name="send",
        queue="mail",
        input='{"n":1}',
        idempotency_key="send:1",
        max_attempts=7,
        run_at=datetime(2030, 1, 1, tzinfo=UTC),
        priority=-3,
        tenant_id="t1",
        delay=timedelta(seconds=5),
        trace_context="00-aa-bb-01",
        limit_key="k1",
        limit_max=2,
        rate_max=10,
        rate_period=timedelta(minutes=1),
        unique_key="u1",
        unique_states=5,
        unique_replace=True,
    )
    sibling = first.sibling("b", '{"n":2}', "send:2", None, "k2", None)
    assert sibling == dataclasses.replace(
        first,
        id="b",
        input='{"n":2}',
        idempotency_key="send:2",
        trace_context=None,
        limit_key="k2",
        unique_key=None,
    )
    # Every field is set (a field added to NewJob but not to sibling() would be unset here).
    assert all(hasattr(sibling, f.name) for f in dataclasses.fields(NewJob))
    with pytest.raises(dataclasses.FrozenInstanceError):
        sibling.id = "c"  # type: ignore[misc]
