"""The operator's reads sit beside the job-processing seam, in the optional ``Inspection``
protocol: every shipped driver offers it, and a driver without it is refused with a cause and a
fix where the operator's views ask for it, not deep inside a read."""

from __future__ import annotations

from typing import Any

import pytest

from ultimat3.jobs.driver import Driver, Inspection, inspection
from ultimat3.jobs.drivers.memory import MemoryDriver
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.records import JobFilter

from .helpers import insert, new_job


def test_every_driver_offers_inspection(driver: Driver) -> None:
    [job_id] = insert(driver, new_job())
    reads = inspection(driver)
    assert reads is driver
    assert [job.id for job in reads.job_list(JobFilter())] == [job_id]


class _ProcessingOnly:
    """A driver with the job-processing seam only: the memory driver's, through its
    ``Driver`` methods and nothing of ``Inspection``."""

    def __init__(self) -> None:
        self._inner = MemoryDriver()
        self.name = "processing-only"

    def __getattr__(self, name: str) -> Any:
        if name in vars(Inspection):
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_driver_without_inspection_is_refused_with_a_fix() -> None:
    driver: Any = _ProcessingOnly()
    insert(driver, new_job())  # it still takes jobs
    with pytest.raises(ConfigurationError, match="offers no inspection") as raised:
        inspection(driver)
    assert "the dashboard and the jobs/queues/workers commands need it" in raised.value.cause
    assert "job_list" in raised.value.cause
    assert raised.value.fix
