"""The enqueue path, and the transactional outbox that is ON by default.

Guarantee: an enqueue made inside a transaction becomes visible if and only if that
transaction commits. When the caller's transaction is on the job database (``with
app.transaction():``, or ``with app.using(conn):`` on the caller's own connection), the job row
is inserted on that connection, in that transaction: a rollback takes the job with it, and a
crash after the commit cannot lose it, because there is nothing left to do after the commit.

Without a transaction the insert commits on its own (seed ``createJobsFacade``), unless the
app's mode is ``"required"``, which raises ``OutboxNoTxError`` instead. ``outbox=False`` is the
per-call escape hatch for an enqueue that must happen whatever the caller's transaction does.

Every job carries an idempotency key fixed when it is built: the caller's (namespaced by the
job name, so two jobs can use the same business key), or, without one, the job's own fresh id,
so identical inputs are never merged but a re-publish of the same built job collapses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ultimat3.jobs.driver import Driver, Executor
from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.errors import ConfigurationError, OutboxNoTxError
from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.job import JobHandle, check_queue_name
from ultimat3.jobs.outbox_store import OutboxStore
from ultimat3.jobs.records import InsertResult, NewJob
from ultimat3.jobs.serialization import Serializer

Mode = Literal["default", "required"]


@dataclass(frozen=True, slots=True)
class TxBinding:
    """A transaction that enqueues join: the job database it is on (``driver``), or, when it is
    on another database, the outbox store that stages jobs there (``store``); and the executor
    (the caller's connection)."""

    driver: Driver | None
    executor: Executor
    store: OutboxStore | None = None


#: The transaction the current code runs in, set by ``app.transaction()`` / ``app.using()``.
current_tx: ContextVar[TxBinding | None] = ContextVar("ultimat3_jobs_current_tx", default=None)


@contextmanager
def bind(binding: TxBinding) -> Iterator[Executor]:
    token = current_tx.set(binding)
    try:
        yield binding.executor
    finally:
        current_tx.reset(token)


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    run_at: datetime | None = None
    delay: DurationInput | None = None
    tenant_id: str | None = None
    queue: str | None = None
    priority: int | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None
    outbox: bool | None = None


def build_job(
    handle: JobHandle[Any],
    input: Any,
    options: EnqueueOptions,
    *,
    serializer: Serializer,
    now: datetime,
) -> NewJob:
    """Validate and encode one enqueue. Raises before anything is written."""
    payload = serializer.dumps(input)
    job_id = uuid7()
    key = options.idempotency_key
    if key is None and handle.idempotency_key is not None:
        key = handle.idempotency_key(input)
        if not isinstance(key, str) or not key:
            raise ConfigurationError(
                f"the idempotency_key function of job {handle.name!r} returned {key!r}",
                fix="return a non-empty str that identifies the input, e.g. f\"order-{input['id']}\"",
            )
    stored_key = f"{handle.name}:{key}" if key is not None else job_id
    run_at = options.run_at
    if run_at is not None and options.delay is not None:
        raise ConfigurationError(
            "enqueue got both run_at= and delay=",
            fix="pass one of them: run_at for an instant, delay for a duration",
        )
    if run_at is not None and run_at.tzinfo is None:
        raise ConfigurationError(
            f"run_at={run_at!r} has no time zone",
            fix="pass an aware datetime, e.g. datetime.now(UTC) + timedelta(minutes=5), or delay='5m'",
        )
    if options.delay is not None:
        run_at = now + to_timedelta(options.delay)
    priority = handle.priority if options.priority is None else options.priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ConfigurationError(
            f"priority={priority!r} is not valid", fix="use an int from -100 to 100"
        )
    tenant = options.tenant_id
    if tenant is not None and (not isinstance(tenant, str) or not tenant or len(tenant) > 200):
        raise ConfigurationError(
            f"tenant_id={tenant!r} is not valid",
            fix="use a non-empty str of at most 200 characters, or None",
        )
    attempts = handle.retry.attempts if options.max_attempts is None else options.max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"max_attempts={attempts!r} is not valid", fix="use an int >= 1")
    return NewJob(
        id=job_id,
        name=handle.name,
        queue=check_queue_name(options.queue) if options.queue is not None else handle.queue,
        input=payload,
        idempotency_key=stored_key,
        max_attempts=attempts,
        run_at=run_at,
        priority=priority,
        tenant_id=tenant,
    )


def insert(
    driver: Driver,
    jobs: Sequence[NewJob],
    *,
    mode: Mode,
    outbox: bool | None,
    now: datetime | None,
    label: str,
) -> list[InsertResult]:
    """Insert built jobs, joining the current transaction when it is on this job database."""
    binding = current_tx.get()
    if outbox is False:
        if binding is not None and binding.driver is driver and driver.single_writer:
            raise ConfigurationError(
                f"job {label!r} was enqueued with outbox=False inside a transaction on the same "
                f"{driver.name} database, which allows one writer at a time: its own commit "
                "would wait for the transaction around it",
                fix="enqueue it after the transaction ends, or drop outbox=False to make it "
                "part of the transaction",
            )
        binding = None
    if binding is not None and binding.driver is driver:
        return driver.job_insert_many(jobs, executor=binding.executor, now=now)
    if binding is not None and binding.store is not None:
        # Another database: stage in its x_outbox, in the caller's transaction; the relay
        # publishes after commit. The id is final; whether it dedupes is known only then.
        binding.store.stage(binding.executor, jobs, now=now)
        return [InsertResult(id=job.id, deduped=False) for job in jobs]
    if mode == "required" and outbox is not False:
        raise OutboxNoTxError(
            f"job {label!r} was enqueued outside any transaction and the app's mode is 'required'"
        )
    return driver.job_insert_many(jobs, now=now)
