"""``job_insert_many``: stored fields, states by ``run_at``, ordering of results, and dedupe on
(tenant_id, idempotency_key).

Tenant semantics (pinned by the memory driver): ``None`` is "no tenant" and dedupes with other
jobs without a tenant, as if it were a value; ``""`` is an ordinary tenant, distinct from None.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.ids import uuid7_many
from ultimat3.jobs.records import (
    ClaimParams,
    InsertResult,
    JobFilter,
    JobState,
    NewJob,
    NewJobs,
    Prune,
)

from .helpers import (
    LEASE,
    T0,
    assert_utc,
    at,
    claim,
    claim_one,
    claim_with,
    complete,
    get,
    insert,
    new_job,
)


def test_insert_one_stores_every_field(driver: Driver) -> None:
    job = new_job(
        key="welcome:42",
        queue="mail",
        name="mail.send_welcome",
        input='{"b":1,"a":[1,2.5,null],"s":"ü✓ \\"q\\""}',
        priority=7,
        tenant_id="acme",
        max_attempts=5,
    )
    assert driver.job_insert_many([job], now=T0) == [InsertResult(job.id, deduped=False)]

    stored = get(driver, job.id)
    assert_utc(stored)
    assert (stored.id, stored.name, stored.queue) == (job.id, "mail.send_welcome", "mail")
    assert stored.input == job.input, "input is stored as the exact text given"
    assert (stored.tenant_id, stored.idempotency_key) == ("acme", "welcome:42")
    assert (stored.priority, stored.max_attempts, stored.attempt) == (7, 5, 0)
    assert stored.state is JobState.AVAILABLE
    assert stored.run_at == T0
    assert stored.created_at == T0
    assert stored.attempted_at is None
    assert stored.finished_at is None
    assert stored.lease_token is None
    assert stored.lease_expires_at is None
    assert stored.worker_id is None
    assert stored.cancel_reason is None
    assert stored.errors == ()


def test_insert_many_returns_results_in_order(driver: Driver) -> None:
    jobs = [new_job(name=f"job.{n}") for n in range(5)]
    results = driver.job_insert_many(list(reversed(jobs)), now=T0)
    assert results == [InsertResult(job.id, deduped=False) for job in reversed(jobs)]
    assert [get(driver, job.id).name for job in jobs] == [f"job.{n}" for n in range(5)]


def test_insert_nothing(driver: Driver) -> None:
    assert driver.job_insert_many([], now=T0) == []


def test_state_follows_run_at(driver: Driver) -> None:
    future, due, past = new_job(run_at=at(60)), new_job(run_at=T0), new_job(run_at=at(-60))
    insert(driver, future, due, past, now=T0)
    assert (get(driver, future.id).state, get(driver, future.id).run_at) == (
        JobState.SCHEDULED,
        at(60),
    )
    assert (get(driver, due.id).state, get(driver, due.id).run_at) == (JobState.AVAILABLE, T0)
    assert (get(driver, past.id).state, get(driver, past.id).run_at) == (
        JobState.AVAILABLE,
        at(-60),
    )


def test_run_at_none_means_now(driver: Driver) -> None:
    [job_id] = insert(driver, new_job(run_at=None), now=at(5))
    assert get(driver, job_id).run_at == at(5)
    assert get(driver, job_id).state is JobState.AVAILABLE


def test_without_now_the_driver_clock_is_used(driver: Driver) -> None:
    before = datetime.now(UTC)
    results = driver.job_insert_many([new_job()])
    stored = get(driver, results[0].id)
    assert_utc(stored)
    # The database clock may differ from this host's a little (and PostgreSQL's now() is the
    # transaction's start), so only a loose window is asserted.
    slack = timedelta(minutes=1)
    assert before - slack <= stored.created_at <= datetime.now(UTC) + slack
    assert stored.run_at == stored.created_at
    # Claiming on the driver's clock (now=None) finds it due.
    claimed = claim_with(
        driver, ClaimParams(queues=("default",), limit=1, lease_for=LEASE, worker_id="w")
    )
    assert [job.id for job in claimed] == [stored.id]


def test_the_usual_job_on_the_driver_clock_is_stored_like_any_other(driver: Driver) -> None:
    """A job due now on the driver's clock, with no limit and no uniqueness window, is the
    usual enqueue, and PostgreSQL writes it with a statement of its own (``job_insert_plain``).
    Every field must come out as the general statement stores it: here, the same job with a
    delay of zero."""
    fields = {
        "name": "mail.send",
        "queue": "mail",
        "input": '{"to":"ü@example.com"}',
        "priority": -3,
        "tenant_id": "acme",
        "max_attempts": 4,
        "trace_context": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    usual, delayed = (
        _keyless()._replace(**fields),  # type: ignore[arg-type]
        _keyless()._replace(delay=timedelta(0), **fields),  # type: ignore[arg-type]
    )
    assert driver.job_insert_many([usual]) == [InsertResult(usual.id, deduped=False)]
    assert driver.job_insert_many([delayed]) == [InsertResult(delayed.id, deduped=False)]

    def stored(job_id: str) -> dict[str, object]:
        job = get(driver, job_id)
        assert job.run_at == job.created_at
        assert job.state is JobState.AVAILABLE
        return {
            name: getattr(job, name)
            for name in (*fields, "attempt", "errors", "lease_token", "finished_at")
        }

    assert stored(usual.id) == stored(delayed.id)
    # Inserted again (a relay's re-publish): the same job, keyless or keyed.
    assert driver.job_insert_many([usual]) == [InsertResult(usual.id, deduped=True)]
    keyed = new_job(key="mail:1")
    insert(driver, keyed, now=T0)
    assert driver.job_insert_many([new_job(key="mail:1")]) == [InsertResult(keyed.id, deduped=True)]
    assert sum(driver.job_count(JobFilter()).values()) == 3


def test_duplicate_key_returns_the_existing_job(driver: Driver) -> None:
    first = new_job(key="k", input='{"v":1}')
    insert(driver, first)
    again = new_job(key="k", input='{"v":2}', queue="other", priority=9)
    assert driver.job_insert_many([again], now=at(1)) == [InsertResult(first.id, deduped=True)]
    assert driver.job_get(again.id) is None
    stored = get(driver, first.id)
    assert (stored.input, stored.queue, stored.priority) == ('{"v":1}', "default", 0)
    assert sum(driver.job_count(JobFilter()).values()) == 1


def test_duplicate_key_within_one_batch(driver: Driver) -> None:
    a, b, c = new_job(key="same"), new_job(key="same"), new_job(key="other")
    assert driver.job_insert_many([a, b, c], now=T0) == [
        InsertResult(a.id, deduped=False),
        InsertResult(a.id, deduped=True),
        InsertResult(c.id, deduped=False),
    ]
    assert driver.job_get(b.id) is None


def test_dedupe_holds_while_the_row_is_retained(driver: Driver) -> None:
    first = new_job(key="k")
    insert(driver, first)
    job = claim_one(driver, at(1))
    assert complete(driver, [job.lease], now=at(2)) == {first.id}
    assert driver.job_insert_many([new_job(key="k")], now=at(3)) == [
        InsertResult(first.id, deduped=True)
    ]


def test_same_key_in_two_tenants_gives_two_jobs(driver: Driver) -> None:
    a, b = new_job(key="k", tenant_id="a"), new_job(key="k", tenant_id="b")
    insert(driver, a, b)
    assert driver.job_insert_many([new_job(key="k", tenant_id="b")], now=T0) == [
        InsertResult(b.id, deduped=True)
    ]


def test_no_tenant_dedupes_with_no_tenant_and_empty_string_is_a_tenant(driver: Driver) -> None:
    none = new_job(key="k", tenant_id=None)
    insert(driver, none)
    assert driver.job_insert_many([new_job(key="k", tenant_id=None)], now=T0) == [
        InsertResult(none.id, deduped=True)
    ]
    empty = new_job(key="k", tenant_id="")
    assert driver.job_insert_many([empty], now=T0) == [InsertResult(empty.id, deduped=False)]
    assert get(driver, none.id).tenant_id is None
    assert get(driver, empty.id).tenant_id == ""
    assert driver.job_get(none.id, tenant_id="") is None
    assert [job.id for job in driver.job_list(JobFilter(tenant_id=""))] == [empty.id]


def test_prune_frees_the_key(driver: Driver) -> None:
    first = new_job(key="k")
    insert(driver, first)
    job = claim_one(driver, at(1))
    complete(driver, [job.lease], now=at(2))
    pruned = driver.job_prune(Prune(frozenset({JobState.COMPLETED}), at(3), 10))
    assert pruned == 1
    second = new_job(key="k")
    assert driver.job_insert_many([second], now=at(4)) == [InsertResult(second.id, deduped=False)]


def test_inserted_jobs_are_claimable_in_their_queue_only(driver: Driver) -> None:
    job = new_job(queue="reports")
    insert(driver, job)
    assert claim(driver, at(1)) == []
    assert [j.id for j in claim(driver, at(1), queues=["reports"])] == [job.id]


def _keyless(**fields: object) -> NewJob:
    """A job enqueued without a key: its key is its id (``outbox.Builder``), so it is
    deduped by its primary key alone, not by the index of callers' keys (migration 9)."""
    job = new_job(**fields)  # type: ignore[arg-type]
    return job._replace(idempotency_key=job.id)


@pytest.mark.parametrize("size", [1, 3, 250])  # one statement, a batch, PostgreSQL's COPY
def test_a_keyless_job_inserted_again_is_the_same_job(driver: Driver, size: int) -> None:
    jobs = [_keyless() for _ in range(size)]
    assert driver.job_insert_many(jobs, now=T0) == [InsertResult(j.id, False) for j in jobs]
    again = driver.job_insert_many([*jobs[:2], _keyless(), *jobs[2:]], now=at(1))
    assert [r.deduped for r in again] == [True] * min(size, 2) + [False] + [True] * (size - 2)
    assert [r.id for r in again][:1] == [jobs[0].id]
    assert sum(driver.job_count(JobFilter()).values()) == size + 1


def test_a_keyless_job_repeated_within_one_batch(driver: Driver) -> None:
    a, b = _keyless(), _keyless()
    assert driver.job_insert_many([a, b, a], now=T0) == [
        InsertResult(a.id, deduped=False),
        InsertResult(b.id, deduped=False),
        InsertResult(a.id, deduped=True),
    ]


def test_a_keyed_jobs_id_inserted_again_without_its_key_is_refused(driver: Driver) -> None:
    keyed = new_job(key="k")
    insert(driver, keyed)
    with pytest.raises(ValueError, match="already stored under another key"):
        driver.job_insert_many([keyed._replace(idempotency_key=keyed.id)], now=at(1))
    assert driver.job_insert_many([new_job(key="k")], now=at(3)) == [
        InsertResult(keyed.id, deduped=True)
    ]


def _plain_batch(texts: list[str], **fields: object) -> NewJobs:
    """A batch as a plain enqueue makes it: every job is the template with its own id and JSON
    text, and its id for its key."""
    template = new_job(job_id="", **fields)  # type: ignore[arg-type]
    return NewJobs(
        texts,
        lambda part: [
            template._replace(id=job_id, input=text, idempotency_key=job_id)
            for job_id, text in zip(uuid7_many(len(part)), part, strict=True)
        ],
    )


@pytest.mark.parametrize("size", [2, 600])  # a batch statement, PostgreSQL's COPY
@pytest.mark.parametrize(
    "odd",
    ['{"s":"back\\\\slash \\"q\\""}', '{\t"tab":1}', '{"n":\n1}', '{"cr":\r1}'],
    ids=["backslash", "tab", "newline", "return"],
)
def test_a_plain_batch_is_stored_like_its_jobs_and_dedupes_when_published_again(
    driver: Driver, size: int, odd: str
) -> None:
    # JSON texts with a character COPY escapes (raw whitespace is valid JSON between tokens)
    # among plain ones, each kind on its own, and a tenant that needs escapes too: each is
    # stored as the exact text given.
    texts = [odd if i % 3 == 1 else '{"n":1}' for i in range(size)]
    batch = _plain_batch(texts, tenant_id="t\\en\tant", queue="mail", priority=3)
    results = driver.job_insert_many(batch, now=T0)
    ids = [job.id for job in batch]  # read as jobs afterwards: the same ids
    assert results == [InsertResult(i, False) for i in ids] and len(set(ids)) == size
    assert all(job.idempotency_key == job.id for job in batch)
    stored = {job.id: job for job in driver.job_list(JobFilter(), limit=size + 1)}
    assert sorted(stored) == sorted(ids)
    for job_id, text in zip(ids, texts, strict=True):
        got = stored[job_id]
        assert (got.input, got.idempotency_key, got.tenant_id) == (text, job_id, "t\\en\tant")
        assert (got.queue, got.priority, got.state, got.run_at) == (
            "mail",
            3,
            JobState.AVAILABLE,
            T0,
        )
    again = driver.job_insert_many(batch, now=at(1))
    assert again == [InsertResult(i, True) for i in ids]
    assert sum(driver.job_count(JobFilter()).values()) == size


def test_a_delayed_plain_batch_is_scheduled(driver: Driver) -> None:
    batch = _plain_batch(['{"n":1}'] * 300, run_at=at(60))
    driver.job_insert_many(batch, now=T0)
    assert driver.job_count(JobFilter()) == {("default", JobState.SCHEDULED): 300}
    assert {get(driver, job.id).run_at for job in batch[:3]} == {at(60)}
