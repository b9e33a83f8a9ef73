"""The dashboard's reads: ``job_finished_counts`` (throughput buckets), ``schedule_read`` (a
read that creates nothing), ``JobFilter.min_id`` and ``job_id_below`` (windows of the id
order)."""

from __future__ import annotations

from datetime import timedelta

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import FinishedCount, Fire, JobState

from .helpers import T0, at, claim, complete, fail, insert, new_job

MINUTE = timedelta(minutes=1)


def test_finished_counts_bucket_each_end_by_queue_state_and_minute(driver: Driver) -> None:
    jobs = [
        new_job(queue="a" if i < 4 else "b", tenant_id="t1" if i % 2 else None) for i in range(6)
    ]
    insert(driver, *jobs, now=at(0))
    running = {j.id: j for j in claim(driver, at(1), queues=["a", "b"], limit=6)}
    ordered = [running[j.id] for j in jobs]
    # a: two completed in minute 0, one completed in minute 2, one dead in minute 2; b: two
    # completed in minute 1.
    assert complete(driver, [ordered[0].lease, ordered[1].lease], now=at(10))
    assert complete(driver, [ordered[2].lease], now=at(130))
    assert fail(driver, ordered[3], at(150), retry_in=None)
    assert complete(driver, [ordered[4].lease, ordered[5].lease], now=at(70))
    found = driver.job_finished_counts(T0, MINUTE)
    assert sorted(found, key=lambda c: (c.queue, c.start, c.state)) == [
        FinishedCount("a", JobState.COMPLETED, T0, 2),
        FinishedCount("a", JobState.COMPLETED, T0 + 2 * MINUTE, 1),
        FinishedCount("a", JobState.DEAD, T0 + 2 * MINUTE, 1),
        FinishedCount("b", JobState.COMPLETED, T0 + MINUTE, 2),
    ]
    # Only what ended since the start; only the tenant's with tenant_id.
    later = driver.job_finished_counts(T0 + 2 * MINUTE, MINUTE)
    assert sum(c.count for c in later) == 2
    tenant = driver.job_finished_counts(T0, MINUTE, tenant_id="t1")
    assert sum(c.count for c in tenant) == 3  # jobs 1, 3 and 5
    assert driver.job_finished_counts(T0 + 10 * MINUTE, MINUTE) == []


def test_schedule_read_creates_nothing(driver: Driver) -> None:
    assert driver.schedule_read(["nightly"]) == {}
    assert driver.schedule_read([]) == {}
    driver.schedule_state(["nightly"], now=T0)
    assert driver.schedule_read(["nightly", "other"]) == driver.schedule_state(["nightly"], now=T0)
    assert driver.schedule_fire(Fire("nightly", at(60), [new_job()]), now=T0) is not None
    state = driver.schedule_read(["nightly", "other"])
    assert list(state) == ["nightly"] and state["nightly"].last_fired_at == at(60)
    assert state["nightly"].first_seen_at == T0


def test_min_id_bounds_a_window_of_the_id_order(driver: Driver) -> None:
    from ultimat3.jobs.records import JobFilter

    ids = insert(driver, *(new_job(queue="a" if i % 3 else "b") for i in range(10)), now=T0)
    newest_first = sorted(ids, reverse=True)
    window = JobFilter(min_id=newest_first[6])  # the 7 newest
    assert [j.id for j in driver.job_list(window)] == newest_first[:7]
    assert [j.id for j in driver.job_list(window, before_id=newest_first[2])] == newest_first[3:7]
    in_b = JobFilter(queue="b", min_id=newest_first[6])
    assert {j.id for j in driver.job_list(in_b)} == {
        i
        for i in newest_first[:7]
        if driver.job_get(i).queue == "b"  # type: ignore[union-attr]
    }
    counts = driver.job_count(window)
    assert sum(counts.values()) == 7


def test_id_below_counts_along_the_id_order(driver: Driver) -> None:
    ids = sorted(insert(driver, *(new_job() for _ in range(5)), now=T0), reverse=True)
    assert driver.job_id_below(None, 0) == ids[0]
    assert driver.job_id_below(None, 4) == ids[4]
    assert driver.job_id_below(None, 5) is None
    assert driver.job_id_below(ids[1], 0) == ids[2]
    assert driver.job_id_below(ids[1], 2) == ids[4]
    assert driver.job_id_below(ids[1], 3) is None
    assert driver.job_id_below(None, -1) is None


def test_running_lists_every_running_job_by_lease_expiry(driver: Driver) -> None:
    ids = insert(driver, *(new_job() for _ in range(4)), now=T0)
    first = claim(driver, at(1), limit=2, lease_for=timedelta(seconds=60))
    second = claim(driver, at(2), limit=1, lease_for=timedelta(seconds=10))
    assert complete(driver, [first[1].lease], now=at(3)) == {first[1].id}
    running = driver.job_list_running(limit=10)
    # The later claim expires first (at 12 s), then the earlier one (at 61 s).
    assert [j.id for j in running] == [second[0].id, first[0].id]
    assert all(j.state is JobState.RUNNING and j.worker_id == "worker-1" for j in running)
    assert [j.id for j in driver.job_list_running(limit=1)] == [second[0].id]
    assert driver.job_list_running(limit=0) == []
    assert len(set(ids)) == 4


def test_oldest_ready_counts_limited_jobs_too(driver: Driver) -> None:
    # Limited jobs (migration 6) live in their own claim index; the dashboard's "oldest ready"
    # must see them, alone in a queue or older than the unlimited ones of theirs.

    def limited(**options: object) -> object:
        return new_job(**options)._replace(limit_key="k", limit_max=1)  # type: ignore[arg-type]

    insert(
        driver,
        limited(queue="only", run_at=at(10)),  # type: ignore[arg-type]
        new_job(queue="mixed", run_at=at(30)),
        limited(queue="mixed", run_at=at(20)),  # type: ignore[arg-type]
        limited(queue="mixed", run_at=at(900)),  # type: ignore[arg-type]
        now=T0,
    )
    found = {q.name: q.oldest_ready_at for q in driver.queue_list(now=at(100))}
    assert found == {"only": at(10), "mixed": at(20)}
    early = {q.name: q.oldest_ready_at for q in driver.queue_list(now=at(25))}
    assert early == {"only": at(10), "mixed": at(20)}
    none_due = {q.name: q.oldest_ready_at for q in driver.queue_list(now=at(5))}
    assert none_due == {"only": None, "mixed": None}
