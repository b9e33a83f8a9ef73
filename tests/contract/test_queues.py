"""Queues: pause and resume, and ``queue_list`` with per-state counts."""

from __future__ import annotations

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import JobState, QueueInfo

from .helpers import at, claim, claim_one, complete, insert, new_job


def _listed(driver: Driver) -> dict[str, tuple[bool, dict[JobState, int]]]:
    queues = driver.queue_list()
    assert [q.name for q in queues] == sorted(q.name for q in queues), "sorted by name"
    assert all(isinstance(q, QueueInfo) for q in queues)
    return {q.name: (q.paused, {s: n for s, n in q.counts.items() if n}) for q in queues}


def test_queue_list_counts_jobs_per_state(driver: Driver) -> None:
    assert _listed(driver) == {}
    insert(
        driver,
        new_job(queue="mail", priority=1),
        new_job(queue="mail", priority=1),
        new_job(queue="mail"),
        new_job(queue="mail", run_at=at(60)),
        new_job(queue="reports"),
    )
    a, b = claim(driver, at(1), queues=["mail"], limit=2)
    complete(driver, [a.lease], now=at(2))
    assert _listed(driver) == {
        "mail": (
            False,
            {
                JobState.COMPLETED: 1,
                JobState.RUNNING: 1,
                JobState.AVAILABLE: 1,
                JobState.SCHEDULED: 1,
            },
        ),
        "reports": (False, {JobState.AVAILABLE: 1}),
    }
    assert b.state is JobState.RUNNING


def test_pause_and_resume(driver: Driver) -> None:
    insert(driver, new_job(queue="mail"), new_job(queue="mail"))
    running = claim_one(driver, at(1), queues=["mail"])
    driver.queue_set_paused("mail", True)
    driver.queue_set_paused("mail", True)  # idempotent
    driver.queue_set_paused("empty", True)  # a queue with no jobs yet
    listed = _listed(driver)
    assert listed["mail"][0] is True
    assert listed["empty"] == (True, {})

    assert claim(driver, at(2), queues=["mail", "empty"]) == []
    assert complete(driver, [running.lease], now=at(3)) == {running.id}, (
        "running jobs of a paused queue finish"
    )
    insert(driver, new_job(queue="empty"), now=at(3))
    assert claim(driver, at(4), queues=["empty"]) == []

    driver.queue_set_paused("mail", False)
    driver.queue_set_paused("empty", False)
    listed = _listed(driver)
    assert listed["mail"][0] is False
    assert listed["empty"][0] is False
    assert len(claim(driver, at(5), queues=["mail", "empty"])) == 2


def test_resuming_a_queue_never_paused_is_harmless(driver: Driver) -> None:
    insert(driver, new_job(queue="mail"))
    driver.queue_set_paused("mail", False)
    assert _listed(driver)["mail"] == (False, {JobState.AVAILABLE: 1})
    assert len(claim(driver, at(1), queues=["mail"])) == 1
