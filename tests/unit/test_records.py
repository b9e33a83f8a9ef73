"""The records that cross the driver seam."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from ultimat3.jobs.records import NewJob, NewJobs


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
