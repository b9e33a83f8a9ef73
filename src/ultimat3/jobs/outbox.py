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

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from ultimat3.jobs import events
from ultimat3.jobs.driver import DatabaseId, Driver, Joined
from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.errors import ConfigurationError, OutboxNoTxError
from ultimat3.jobs.ids import uuid7_many
from ultimat3.jobs.job import JobHandle, check_queue_name, valid_priority
from ultimat3.jobs.outbox_store import OutboxStore
from ultimat3.jobs.records import InsertResult, NewJob, NewJobs
from ultimat3.jobs.retry import MAX_ATTEMPTS
from ultimat3.jobs.serialization import Serializer

Mode = Literal["default", "required"]


def reaches(database: DatabaseId, target: Driver | OutboxStore) -> bool:
    """True when ``target`` lives in ``database``. A PostgreSQL identity carries the server's
    start time, so after a restart the cached one is read again before saying no."""
    own = target.identity()
    if database is own or database == own:  # a driver's Joined carries its own identity
        return True
    return database.kind == own.kind and database == target.identity(refresh=True)


class KnownDatabases:
    """The database each caller's connection reaches, worked out once per connection (the
    first ``using()`` on it), held without keeping the connection alive: a connection reaches
    one database for its whole life, so a later join on it costs no look-up and no check. What
    can change between transactions (closed, aborted, in another thread, a converter registered
    since) is checked by the driver before each write it makes on the connection (its
    ``adopt`` of the ``Joined``, or on PostgreSQL the transaction's status).

    A connection that takes weak references (psycopg's) is a key of a ``WeakKeyDictionary``.
    A ``sqlite3.Connection`` takes none, so it is keyed by ``id()``, which a later connection
    may reuse once this one is freed; such an entry stays valid only while a marker it holds
    weakly is alive, and the marker is a SQL function registered on the connection
    (``create_function``), so only the connection keeps it alive: closing or freeing the
    connection ends the entry before its id can be reused. A connection that takes neither
    is looked up each time."""

    _MARK = "ultimat3_jobs_joined"

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, DatabaseId] = weakref.WeakKeyDictionary()
        self._by_id: dict[int, tuple[weakref.ref[_Mark], DatabaseId]] = {}

    def get(self, connection: Any) -> DatabaseId | None:
        # By id first: a sqlite3.Connection, the common case, would raise TypeError (no
        # weak reference) on every join. An entry whose marker lives names this very
        # connection (only it keeps the marker alive), so no other object has its id.
        entry = self._by_id.get(id(connection))
        if entry is not None and entry[0]() is not None:
            return entry[1]
        try:
            return self._weak.get(connection)
        except TypeError:  # takes no weak reference
            return None

    def remember(self, connection: Any, database: DatabaseId) -> None:
        try:
            self._weak[connection] = database
            return
        except TypeError:
            pass
        create = getattr(connection, "create_function", None)
        if create is None:
            return
        mark = _Mark()
        try:
            create(self._MARK, 0, mark)
        except Exception:
            return
        key = id(connection)

        def forget(ref: weakref.ref[_Mark]) -> None:
            entry = self._by_id.get(key)
            if entry is not None and entry[0] is ref:
                del self._by_id[key]

        self._by_id[key] = (weakref.ref(mark, forget), database)


class _Mark:
    """The SQL function ``KnownDatabases`` registers on a connection: it answers 1."""

    __slots__ = ("__weakref__",)

    def __call__(self) -> int:
        return 1


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


@dataclass(frozen=True, slots=True)
class Destination:
    """Where an app's enqueue writes (``App`` works it out, ``enqueue`` writes there): the
    job database's driver, the app's mode, the outbox store when the current transaction may
    be on the outbox's database, and the stand-in of ``testing.inline``, which runs the jobs
    instead. ``driver`` is None only when nothing is written to the database. ``joined``: the
    caller's transaction the enqueue runs in (``driver.current_tx``), None outside any."""

    driver: Driver | None
    mode: Mode = "default"
    store: OutboxStore | None = None
    intercept: Callable[[list[NewJob]], list[InsertResult]] | None = None
    joined: Joined | None = None


def enqueue(
    where: Destination,
    handle: JobHandle[Any],
    inputs: Sequence[Any],
    options: EnqueueOptions,
    *,
    serializer: Serializer,
    now: Callable[[], datetime],
    pinned: datetime | None,
    many: bool,
) -> list[InsertResult]:
    """Build the jobs of ``inputs`` with ``options`` (all checked before anything is written)
    and write them to ``where`` under the one rule (``_insert``), then emit
    ``jobs.job.enqueued`` for each. ``many``: a batch, whose inputs are encoded when a
    driver reads the jobs (``NewJobs``: all before it writes, or a slice at a time inside its
    transaction); ``now`` reads the instant a uniqueness window counts from (once, and only
    for a job that has one), ``pinned`` is the ``now`` of the write (None: the database's
    clock)."""
    builder = Builder(handle, options, serializer=serializer)
    at = now() if handle.unique is not None else None
    jobs = NewJobs(inputs, lambda part: builder(part, at)) if many else builder(inputs, at)
    if not jobs:
        return []
    if where.intercept is not None:
        return where.intercept(list(jobs))
    driver = where.driver
    assert driver is not None
    joined, store = where.joined, where.store
    results = _insert(driver, jobs, where, outbox=options.outbox, now=pinned, label=handle.name)
    if events.wanted("jobs.job.enqueued", events.DEBUG):
        # ``staged``: written to an outbox, published by its relay after commit.
        staged = joined is not None and bool(results) and _on_store(joined.database, driver, store)
        for job, result in zip(jobs, results, strict=True):
            events.debug(
                "jobs.job.enqueued",
                job,
                job_id=result.id,
                job=job.name,
                queue=job.queue,
                tenant=job.tenant_id,
                deduped=result.deduped,
                staged=staged,
            )
    return results


def build_job(
    handle: JobHandle[Any],
    input: Any,
    options: EnqueueOptions,
    *,
    serializer: Serializer,
    now: datetime,
) -> NewJob:
    """Validate and encode one enqueue (``Builder`` of one input)."""
    return Builder(handle, options, serializer=serializer)((input,), now)[0]


class Builder:
    """The options of an enqueue checked once (``__init__`` raises before anything is
    written); calling it encodes, keys and gives ids to inputs with them. Every value it lets
    through is one that every driver stores (the same bounds on SQLite and PostgreSQL)."""

    __slots__ = (
        "_attempts",
        "_delay",
        "_dumps",
        "_given_key",
        "_handle",
        "_key_of",
        "_limit",
        "_limit_max",
        "_name",
        "_priority",
        "_queue",
        "_rate",
        "_run_at",
        "_tenant",
        "_unique",
        "_unique_fields",
    )

    def __init__(
        self, handle: JobHandle[Any], options: EnqueueOptions, *, serializer: Serializer
    ) -> None:
        run_at = options.run_at
        if run_at is not None and options.delay is not None:
            raise ConfigurationError(
                "enqueue got both run_at= and delay=",
                fix="pass one of them: run_at for an instant, delay for a duration",
            )
        if run_at is not None and not isinstance(run_at, datetime):
            raise ConfigurationError(
                f"run_at={run_at!r} is a {type(run_at).__name__}, not a datetime",
                fix="pass an aware datetime, e.g. datetime(2030, 1, 1, tzinfo=UTC), or delay='5m'",
            )
        if run_at is not None and run_at.tzinfo is None:
            raise ConfigurationError(
                f"run_at={run_at!r} has no time zone",
                fix="pass an aware datetime, e.g. datetime.now(UTC) + timedelta(minutes=5), or "
                "delay='5m'",
            )
        delay = to_timedelta(options.delay, name="delay") if options.delay is not None else None
        priority = handle.priority if options.priority is None else options.priority
        if not valid_priority(priority):
            raise ConfigurationError(
                f"priority={priority!r} is not valid", fix="use an int from -100 to 100"
            )
        tenant = options.tenant_id
        if tenant is not None:
            if not tenant:
                raise ConfigurationError(
                    "tenant_id='' is not valid", fix="use a non-empty str, or None for no tenant"
                )
            _check_text(tenant, "tenant_id", TENANT_LIMIT)
        attempts = handle.retry.attempts if options.max_attempts is None else options.max_attempts
        if (
            isinstance(attempts, bool)
            or not isinstance(attempts, int)
            or not 1 <= attempts <= MAX_ATTEMPTS
        ):
            raise ConfigurationError(
                f"max_attempts={attempts!r} is not valid",
                fix=f"use an int from 1 to {MAX_ATTEMPTS}",
            )
        queue = check_queue_name(options.queue) if options.queue is not None else handle.queue
        if options.idempotency_key is not None:
            _check_text(options.idempotency_key, "idempotency_key", KEY_LIMIT)
        rate = handle.rate
        limit = handle.concurrency or (rate.as_limit() if rate is not None else None)
        unique = handle.unique
        self._handle = handle
        self._dumps = serializer.dumps
        self._key_of = handle.idempotency_key
        self._limit = limit
        self._unique = unique
        self._given_key = options.idempotency_key
        self._name, self._queue, self._tenant = handle.name, queue, tenant
        # The fields every job of these options shares, in ``NewJob``'s order around the
        # fields each job has of its own (``_FIELDS``): passed by position, which costs a
        # call far less than by keyword, for each job of a batch.
        self._attempts, self._run_at, self._priority, self._delay = (
            attempts,
            run_at,
            priority,
            delay,
        )
        self._limit_max = 0 if limit is None else limit.max
        self._rate = (0, timedelta(0)) if rate is None else (rate.max, rate.period)
        self._unique_fields = (
            (0, False) if unique is None else (unique.mask, unique.on_conflict == "replace")
        )

    def __call__(self, values: Sequence[Any], now: datetime | None) -> list[NewJob]:
        """The jobs of ``values``, in order (``now``: the instant a uniqueness window counts
        from; None for a job without one)."""
        name, queue, tenant = self._name, self._queue, self._tenant
        dumps, key_of, given_key = self._dumps, self._key_of, self._given_key
        limit, unique = self._limit, self._unique
        attempts, run_at, priority, delay = (
            self._attempts,
            self._run_at,
            self._priority,
            self._delay,
        )
        limit_max, (rate_max, rate_period) = self._limit_max, self._rate
        unique_states, unique_replace = self._unique_fields
        inject = events.trace_context_for  # a tracing integration's, or None
        jobs: list[NewJob] = []
        append = jobs.append
        for job_id, input in zip(uuid7_many(len(values)), values, strict=True):
            payload = dumps(input)
            key = given_key
            if key is None and key_of is not None:
                key = _key_of(self._handle, key_of, input)
            append(
                NewJob(
                    job_id,
                    name,
                    queue,
                    payload,
                    job_id if key is None else f"{name}:{key}",
                    attempts,
                    run_at,
                    priority,
                    tenant,
                    delay,
                    None if inject is None else inject(queue, name, job_id),
                    None
                    if limit is None
                    else limit.key_for(job=name, queue=queue, input=input, tenant_id=tenant),
                    limit_max,
                    rate_max,
                    rate_period,
                    None
                    if unique is None
                    else unique.key_for(
                        job=name, payload=payload, input=input, tenant_id=tenant, now=_at(now)
                    ),
                    unique_states,
                    unique_replace,
                )
            )
        return jobs


#: ``NewJob``'s fields in the order ``Builder`` passes them.
_FIELDS = (
    "id", "name", "queue", "input", "idempotency_key", "max_attempts", "run_at", "priority",
    "tenant_id", "delay", "trace_context", "limit_key", "limit_max", "rate_max", "rate_period",
    "unique_key", "unique_states", "unique_replace",
)  # fmt: skip
if NewJob._fields != _FIELDS:
    raise AssertionError("NewJob's fields moved: update Builder.__call__ and _FIELDS")


def _at(now: datetime | None) -> datetime:
    if now is None:
        raise AssertionError("a job with a uniqueness window was built without now")
    return now


def _key_of(handle: JobHandle[Any], key_of: Callable[[Any], str], input: Any) -> str:
    """The job's idempotency key for ``input``, from its ``idempotency_key`` function."""
    try:
        key = key_of(input)
    except Exception as exc:
        raise ConfigurationError(
            f"the idempotency_key function of job {handle.name!r} raised "
            f"{type(exc).__name__}: {exc}",
            fix="make it return a str for every input it is given, e.g. f\"order-{input['id']}\"",
        ) from exc
    if not isinstance(key, str) or not key:
        raise ConfigurationError(
            f"the idempotency_key function of job {handle.name!r} returned {key!r}",
            fix="return a non-empty str that identifies the input, e.g. f\"order-{input['id']}\"",
        )
    _check_text(key, "idempotency_key", KEY_LIMIT)
    return key


#: Bounds every driver can store: a tenant and a key fit PostgreSQL's b-tree row limit together.
TENANT_LIMIT = 200
KEY_LIMIT = 255


def _check_text(value: object, option: str, limit: int) -> None:
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise ConfigurationError(
            f"{option}={value!r:.80} is not valid",
            fix=f"use a str of at most {limit} characters without NUL characters",
        )


def _on_store(database: DatabaseId, driver: Driver, store: OutboxStore | None) -> bool:
    """Whether a transaction on ``database`` is staged in ``store``: it reaches the outbox's
    database and not the job database. One the store joined (its identity, not the job
    database's) is told at once: ``reaches`` would first ask the job database, in a
    transaction of its own, whether it restarted, on every enqueue."""
    if store is None:
        return False
    if database == store.identity() and database != driver.identity():
        return True
    return not reaches(database, driver) and reaches(database, store)


def _insert(
    driver: Driver,
    jobs: Sequence[NewJob],
    where: Destination,
    *,
    outbox: bool | None,
    now: datetime | None,
    label: str,
) -> list[InsertResult]:
    """Insert built jobs under the one rule: inside a transaction, join it or raise.

    The current transaction is joined when it is on this job database (any App, any driver
    object: identity decides), or staged in ``store`` when it is on the outbox's database.
    A transaction on any other database is an error, never a silent commit of its own."""
    joined, store = where.joined, where.store
    if outbox is False:
        if joined is not None and driver.single_writer and reaches(joined.database, driver):
            raise ConfigurationError(
                f"job {label!r} was enqueued with outbox=False inside a transaction on the same "
                f"{driver.name} database, which allows one writer at a time: its own commit "
                "would wait for the transaction around it",
                fix="enqueue it after the transaction ends, or drop outbox=False to make it "
                "part of the transaction",
            )
        return driver.job_insert_many(jobs, now=now)
    if joined is not None:
        if store is not None and _on_store(joined.database, driver, store):
            limited = next(
                (job for job in jobs if job.limit_key is not None or job.unique_key is not None),
                None,
            )
            if limited is not None:
                raise ConfigurationError(
                    f"job {limited.name!r} has a concurrency limit or a uniqueness window, which "
                    "an outbox on another database cannot carry yet",
                    fix="enqueue it in a transaction on the job database, or outside any "
                    "transaction (outbox=False)",
                )
            # Another database: stage in its x_outbox, in the caller's transaction; the relay
            # publishes after commit. The id is final; whether it dedupes is known only then.
            store.stage(joined, jobs, now=now)
            return [InsertResult(id=job.id, deduped=False) for job in jobs]
        if reaches(joined.database, driver):
            return driver.job_insert_many(jobs, executor=joined, now=now)
        place = joined.database.label or joined.database.kind
        raise ConfigurationError(
            f"job {label!r} was enqueued inside a transaction on {place}, which is neither "
            f"this app's job database ({driver.display_url})"
            + (f" nor its outbox ({store.display_url})" if store is not None else "")
            + ", so it cannot be part of that transaction",
            fix="enqueue through the App whose database that is, give this App an outbox "
            "there (App(..., outbox='URL of that database')), or pass outbox=False for a job "
            "that must commit on its own",
        )
    if where.mode == "required":
        raise OutboxNoTxError(
            f"job {label!r} was enqueued outside any transaction and the app's mode is 'required'"
        )
    return driver.job_insert_many(jobs, now=now)
