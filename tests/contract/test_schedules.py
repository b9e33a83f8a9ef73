"""Cron state and leadership: ``schedule_state``, ``schedule_fire`` (compare-and-set plus the
occurrence's jobs in one transaction), ``leader_elect`` and ``leader_resign``."""

from __future__ import annotations

import threading
from datetime import timedelta

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import Fire, Leadership

from .helpers import T0, get, new_job

TTL = timedelta(seconds=15)


def test_state_is_created_once_with_first_seen(driver: Driver) -> None:
    first = driver.schedule_state(["a", "b"], now=T0)
    assert set(first) == {"a", "b"}
    assert first["a"].first_seen_at == T0 and first["a"].last_fired_at is None
    later = driver.schedule_state(["a", "c"], now=T0 + timedelta(hours=1))
    assert later["a"].first_seen_at == T0
    assert later["c"].first_seen_at == T0 + timedelta(hours=1)


def test_fire_inserts_jobs_and_moves_state_forward(driver: Driver) -> None:
    driver.schedule_state(["nightly"], now=T0)
    job = new_job()
    results = driver.schedule_fire(Fire("nightly", T0 + timedelta(minutes=1), [job]), now=T0)
    assert results is not None and [r.id for r in results] == [job.id]
    assert get(driver, job.id).name == job.name
    state = driver.schedule_state(["nightly"], now=T0)["nightly"]
    assert state.last_fired_at == T0 + timedelta(minutes=1)


def test_an_occurrence_fires_once(driver: Driver) -> None:
    driver.schedule_state(["t"], now=T0)
    at = T0 + timedelta(minutes=5)
    assert driver.schedule_fire(Fire("t", at, [new_job()]), now=T0) is not None
    again = new_job()
    assert driver.schedule_fire(Fire("t", at, [again]), now=T0) is None
    assert driver.job_get(again.id) is None, "a refused fire writes no job"
    older = new_job()
    assert driver.schedule_fire(Fire("t", at - timedelta(minutes=1), [older]), now=T0) is None
    assert driver.job_get(older.id) is None
    assert driver.schedule_fire(Fire("t", at + timedelta(minutes=1)), now=T0) == []


def test_racing_fires_of_one_occurrence_have_one_winner(driver: Driver) -> None:
    driver.schedule_state(["race"], now=T0)
    at = T0 + timedelta(minutes=1)
    wins: list[bool] = []
    jobs = [new_job() for _ in range(8)]

    def fire(i: int) -> None:
        wins.append(driver.schedule_fire(Fire("race", at, [jobs[i]]), now=T0) is not None)

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(wins) == 1
    assert sum(driver.job_get(j.id) is not None for j in jobs) == 1


def test_leadership(driver: Driver) -> None:
    assert driver.leader_elect(Leadership("scheduler", "a", TTL), now=T0)
    assert not driver.leader_elect(Leadership("scheduler", "b", TTL), now=T0 + timedelta(seconds=5))
    assert driver.leader_elect(Leadership("scheduler", "a", TTL), now=T0 + timedelta(seconds=10)), (
        "renew"
    )
    assert not driver.leader_elect(
        Leadership("scheduler", "b", TTL), now=T0 + timedelta(seconds=20)
    )
    assert driver.leader_elect(Leadership("scheduler", "b", TTL), now=T0 + timedelta(seconds=25)), (
        "expired, at the very end of the lease"
    )
    assert not driver.leader_elect(
        Leadership("scheduler", "a", TTL), now=T0 + timedelta(seconds=27)
    )
    assert driver.leader_elect(Leadership("other", "a", TTL), now=T0), "names are independent"
    driver.leader_resign(Leadership("scheduler", "a", TTL))  # not the holder: nothing changes
    assert not driver.leader_elect(
        Leadership("scheduler", "a", TTL), now=T0 + timedelta(seconds=28)
    )
    driver.leader_resign(Leadership("scheduler", "b", TTL))
    assert driver.leader_elect(Leadership("scheduler", "a", TTL), now=T0 + timedelta(seconds=29))
