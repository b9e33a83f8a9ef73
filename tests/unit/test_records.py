"""The records that cross the driver seam."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ultimat3.jobs.records import NewJob, NewJobs


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


def test_new_jobs_are_built_whole_on_any_read_or_a_slice_at_a_time_by_stream() -> None:
    calls: list[list[int]] = []

    def build(inputs: Sequence[Any]) -> list[NewJob]:
        calls.append(list(inputs))
        return [
            NewJob(
                id=str(n), name="j", queue="q", input="{}", idempotency_key=str(n), max_attempts=1
            )
            for n in inputs
        ]

    whole = NewJobs(list(range(5)), build)
    assert len(whole) == 5 and calls == []  # the length needs no build
    assert whole[1].id == "1" and calls == [[0, 1, 2, 3, 4]]  # one read builds all
    assert [j.id for j in whole] == ["0", "1", "2", "3", "4"] and len(calls) == 1

    calls.clear()
    streamed = NewJobs(list(range(5)), build)
    slices = streamed.stream(2)
    assert [j.id for j in next(slices)] == ["0", "1"] and calls == [[0, 1]]
    assert [j.id for j in next(slices)] == ["2", "3"] and calls == [[0, 1], [2, 3]]
    assert [j.id for j in streamed] == ["0", "1", "2", "3", "4"]  # a read builds the rest
    assert calls == [[0, 1], [2, 3], [4]]
    assert [j.id for j in next(slices)] == ["4"] and len(calls) == 3  # built once
    assert next(slices, None) is None


def test_a_plain_batch_is_kept_as_columns_and_read_as_the_same_jobs() -> None:
    encoded: list[list[int]] = []

    def encode(inputs: Sequence[Any]) -> tuple[list[str], list[str]]:
        encoded.append(list(inputs))
        return [f"id{n}" for n in inputs], [f'{{"n":{n}}}' for n in inputs]

    template = NewJob(
        id="", name="j", queue="q", input="", idempotency_key="", max_attempts=2, tenant_id="t"
    )
    batch = NewJobs(list(range(5)), template=template, encode=encode)
    columns = batch.columns(2)
    assert next(columns) == (["id0", "id1"], ['{"n":0}', '{"n":1}']) and encoded == [[0, 1]]
    # Read as jobs: those encoded already are the same ids; the rest are encoded once.
    assert batch[4] == dataclasses.replace(
        template, id="id4", input='{"n":4}', idempotency_key="id4"
    )
    assert [j.id for j in batch] == ["id0", "id1", "id2", "id3", "id4"]
    assert encoded == [[0, 1], [2, 3, 4]]
    assert next(columns) == (["id2", "id3"], ['{"n":2}', '{"n":3}']) and len(encoded) == 2
    assert batch.ids() == ["id0", "id1", "id2", "id3", "id4"]

    fresh = NewJobs(list(range(3)), template=template, encode=encode)
    assert fresh.ids() == ["id0", "id1", "id2"]
    assert [[j.id for j in part] for part in fresh.stream(2)] == [["id0", "id1"], ["id2"]]
    with pytest.raises(TypeError):
        NewJobs([1], template=template)  # neither build nor encode


def test_the_columns_and_ids_of_a_plain_batch_make_no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    sibling = NewJob.sibling
    monkeypatch.setattr(NewJob, "sibling", lambda self, *a: made.append(a[0]) or sibling(self, *a))
    template = NewJob(id="", name="j", queue="q", input="", idempotency_key="", max_attempts=1)
    batch = NewJobs(["a", "b"], template=template, encode=lambda part: (list(part), list(part)))
    assert list(batch.columns(1)) == [(["a"], ["a"]), (["b"], ["b"])]
    assert batch.ids() == ["a", "b"] and made == []
    assert [j.input for j in batch] == ["a", "b"] and made == ["a", "b"]
