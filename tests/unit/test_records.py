"""The records that cross the driver seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
