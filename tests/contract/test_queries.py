"""Reading jobs: ``job_get``, ``job_list`` (every ``JobFilter`` field, newest id first, keyset
paging) and ``job_count``, with tenant scoping."""

from __future__ import annotations

from collections import Counter

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import Cancellation, Job, JobFilter, JobState

from .helpers import at, claim, complete, fail, get, insert, new_job

_TARGETS = [
    JobState.AVAILABLE,
    JobState.SCHEDULED,
    JobState.RUNNING,
    JobState.COMPLETED,
    JobState.DEAD,
    JobState.CANCELLED,
]
_TENANTS = [None, "t1", "t2", ""]
_CLAIMED = {JobState.RUNNING, JobState.COMPLETED, JobState.DEAD}


@pytest.fixture
def jobs(driver: Driver) -> list[Job]:
    """24 jobs spread over two queues, two names, four tenants and all six states."""
    targets: dict[str, JobState] = {}
    new = []
    for i in range(24):
        target = _TARGETS[i % 6]
        job = new_job(
            queue=f"q{(i // 3) % 2 + 1}",
            name="ab"[(i // 4) % 2],
            tenant_id=_TENANTS[i % 4],
            priority=10 if target in _CLAIMED else 0,
            run_at=at(100) if target is JobState.SCHEDULED else None,
        )
        targets[job.id] = target
        new.append(job)
    insert(driver, *new, now=at(0))
    running = claim(driver, at(1), queues=["q1", "q2"], limit=12)
    assert {job.id for job in running} == {j for j, t in targets.items() if t in _CLAIMED}
    for held in running:
        if targets[held.id] is JobState.COMPLETED:
            assert complete(driver, [held.lease], now=at(2)) == {held.id}
        elif targets[held.id] is JobState.DEAD:
            assert fail(driver, held, at(2), retry_in=None) == {held.id}
    for job_id, target in targets.items():
        if target is JobState.CANCELLED:
            assert driver.job_cancel(Cancellation(job_id, "test"), now=at(2))
    stored = [get(driver, job.id) for job in new]
    assert [job.state for job in stored] == [targets[job.id] for job in stored]
    return stored


def _matches(job: Job, where: JobFilter) -> bool:
    return (
        (where.states is None or job.state in where.states)
        and (where.queue is None or job.queue == where.queue)
        and (where.name is None or job.name == where.name)
        and (where.tenant_id is None or job.tenant_id == where.tenant_id)
        and (where.ids is None or job.id in where.ids)
    )


def _filters(jobs: list[Job]) -> list[JobFilter]:
    some_ids = (jobs[0].id, jobs[5].id, jobs[17].id, uuid7())
    return [
        JobFilter(),
        *(JobFilter(states=frozenset({state})) for state in JobState),
        JobFilter(states=frozenset({JobState.DEAD, JobState.CANCELLED})),
        JobFilter(states=frozenset()),
        JobFilter(queue="q1"),
        JobFilter(queue="missing"),
        JobFilter(name="a"),
        JobFilter(name="b"),
        JobFilter(tenant_id="t1"),
        JobFilter(tenant_id=""),
        JobFilter(tenant_id="nobody"),
        JobFilter(ids=some_ids),
        JobFilter(ids=()),
        JobFilter(states=frozenset({JobState.AVAILABLE, JobState.RUNNING}), queue="q2"),
        JobFilter(states=frozenset(JobState), queue="q1", name="a", tenant_id="t2", ids=some_ids),
        JobFilter(queue="q2", name="b", tenant_id=""),
    ]


def test_list_applies_every_filter_field(driver: Driver, jobs: list[Job]) -> None:
    for where in _filters(jobs):
        expected = sorted((job for job in jobs if _matches(job, where)), key=lambda j: j.id)
        listed = driver.job_list(where, limit=1000)
        assert [job.id for job in listed] == [job.id for job in reversed(expected)], where
    assert driver.job_list(JobFilter(), limit=1000) == sorted(
        jobs, key=lambda j: j.id, reverse=True
    ), "listed records equal the stored ones"


def test_count_applies_every_filter_field(driver: Driver, jobs: list[Job]) -> None:
    for where in _filters(jobs):
        expected = Counter((job.queue, job.state) for job in jobs if _matches(job, where))
        counts = {key: n for key, n in driver.job_count(where).items() if n}
        assert counts == dict(expected), where


def test_list_limit_and_keyset_paging(driver: Driver, jobs: list[Job]) -> None:
    newest_first = sorted((job.id for job in jobs), reverse=True)
    assert [job.id for job in driver.job_list(JobFilter(), limit=5)] == newest_first[:5]
    assert len(driver.job_list(JobFilter())) == 24, "the default limit is above 24"
    pages: list[list[str]] = []
    before: str | None = None
    while True:
        page = [job.id for job in driver.job_list(JobFilter(), limit=7, before_id=before)]
        if not page:
            break
        pages.append(page)
        before = page[-1]
    assert [len(page) for page in pages] == [7, 7, 7, 3]
    assert [job_id for page in pages for job_id in page] == newest_first

    where = JobFilter(tenant_id="t1")
    mine = [job.id for job in driver.job_list(where, limit=1000)]
    middle = mine[1]
    assert [job.id for job in driver.job_list(where, before_id=middle)] == mine[2:]


def test_get_is_tenant_scoped(driver: Driver, jobs: list[Job]) -> None:
    for job in jobs:
        assert driver.job_get(job.id) == job
        assert driver.job_get(job.id, tenant_id=job.tenant_id) == job
        other = "t2" if job.tenant_id == "t1" else "t1"
        assert driver.job_get(job.id, tenant_id=other) is None


def test_get_unknown_ids(driver: Driver) -> None:
    assert driver.job_get(uuid7()) is None
    # Ids are text at the seam; a malformed one is just not found (the CLI passes user input).
    assert driver.job_get("no-such-job") is None


def test_empty_database(driver: Driver) -> None:
    assert driver.job_list(JobFilter()) == []
    assert not any(driver.job_count(JobFilter()).values())
