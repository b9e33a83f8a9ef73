"""The App: one job database, the jobs and tasks registered with it, and how to reach both.

``App()`` with no argument uses ``$ULTIMAT3_JOBS_URL``, else a SQLite file named
``ultimat3-jobs.sqlite3`` in the working directory (its path is logged when it is opened).
The database is opened and migrated on first use, so creating an App costs nothing.

Enqueueing joins the current transaction (see ``ultimat3.jobs.outbox``)::

    with app.transaction() as conn:          # a connection to the job database, in BEGIN
        conn.execute("insert into orders ...")
        send_receipt.enqueue({"order": 42})  # same transaction: no order, no receipt

There are no hidden globals: an App is an object, several can live in one process, and a
handle finds its app from context (the one running the job, or ``with app:``) or from the one
app that registered it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import Token
from datetime import timedelta
from types import ModuleType
from typing import Any, Literal, Protocol, TypeVar, Unpack

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock, SystemClock
from ultimat3.jobs.driver import Driver, Joined, current_tx, inspection
from ultimat3.jobs.drivers import canonical_url, default_url, open_driver, url_from_env
from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.errors import ConfigurationError, JobNotFoundError, RegistrationError
from ultimat3.jobs.job import (
    EnqueueKwargs,
    Enqueuer,
    EnqueueResult,
    JobHandle,
    Registered,
    Registry,
    current_app,
    unregistered,
)
from ultimat3.jobs.maintenance import MaintenanceConfig
from ultimat3.jobs.outbox import (
    Destination,
    EnqueueOptions,
    KnownDatabases,
    Mode,
    build_job,
    enqueue,
)
from ultimat3.jobs.outbox_store import OutboxStore
from ultimat3.jobs.outboxes import open_store
from ultimat3.jobs.records import (
    Cancellation,
    FlowState,
    Job,
    JobFilter,
    JobState,
    NewJob,
    QueueInfo,
    WorkerInfo,
)
from ultimat3.jobs.relay import Relay
from ultimat3.jobs.results import wait_result, wait_result_async
from ultimat3.jobs.scheduler import DatabaseLeader, Scheduler, SoleLeader
from ultimat3.jobs.serialization import Codec, Serializer
from ultimat3.jobs.worker import Worker, WorkerConfig

DEFAULT_PAYLOAD_LIMIT = 1_048_576
#: The job database each caller's connection reaches, once it has joined (``App._join``).
_KNOWN = KnownDatabases()


class Ambient(Protocol):
    """Where an enqueue outside any ``using()`` block finds the transaction it runs in: a
    framework's own notion of one (an integration's ``install``, e.g. a SQLAlchemy session's
    transaction). Returns it joined (``App._join``), or None when the code runs in none."""

    def joined(self, app: App) -> Joined | None: ...

    async def joined_async(self, app: App) -> Joined | None:
        """The same, on the event loop, before ``enqueue_async`` leaves it."""
        ...


class App(Enqueuer):
    """A job database and the jobs registered with it."""

    def __init__(
        self,
        url: str | None = None,
        *,
        modules: Sequence[ModuleType | object] = (),
        driver: Driver | None = None,
        mode: Mode = "default",
        codecs: Sequence[Codec[Any]] = (),
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
        clock: Clock | None = None,
        migrate: bool = True,
        outbox: OutboxStore | str | None = None,
    ) -> None:
        if mode not in ("default", "required"):
            raise ConfigurationError(
                f"mode={mode!r} is not valid",
                fix='use mode="default" (enqueue outside a transaction commits on its own) or "required"',
            )
        if driver is not None and url is not None:
            raise ConfigurationError("App got both url= and driver=", fix="pass one of them")
        url = url or (None if driver is not None else url_from_env() or default_url())
        self.url = canonical_url(url) if url is not None else None
        self.mode: Mode = mode
        if clock is not None and not isinstance(clock, Clock):
            missing = [
                m
                for m in ("now", "pinned", "monotonic", "sleep", "stepped_at")
                if not callable(getattr(clock, m, None))
            ]
            raise ConfigurationError(
                f"clock={type(clock).__name__} lacks {', '.join(missing)} of the Clock protocol",
                fix="give it the methods of ultimat3.jobs.clock.Clock (stepped_at() may return "
                "-inf for a clock that never steps), or pass a FakeClock from "
                "ultimat3.jobs.testing",
            )
        self.clock: Clock = clock or SystemClock()
        self.serializer = Serializer(codecs=codecs, payload_limit=payload_limit)
        self.registry = Registry()
        self._driver = driver
        self._migrate = migrate
        self._opened = False
        self._open_lock = threading.Lock()
        self._entered: list[Token[Enqueuer | None]] = []
        #: Set by ``testing.inline``: runs jobs instead of writing them.
        self._intercept: Callable[[list[NewJob]], list[EnqueueResult]] | None = None
        #: Where enqueues stage jobs when your transaction is on another database (a store or
        #: its URL; opened and migrated on first use).
        self._outbox: OutboxStore | str | None = outbox
        self._outbox_opened = False
        #: Transactions found without ``using()`` (``_add_ambient``: an integration's install).
        self._ambient: tuple[Ambient, ...] = ()
        #: Asked, in order, for the handle of a job name no module registered (a worker meets
        #: it on a claimed job): an integration's jobs, named at enqueue (``_add_job_resolver``).
        self._job_resolvers: tuple[Callable[[App, str], JobHandle[Any] | None], ...] = ()
        if modules:
            self.register(*modules)

    # -- set-up ------------------------------------------------------------------------------

    @property
    def driver(self) -> Driver:
        """The driver, opened and migrated on first use. Migrating reads the schema version
        first, so an app whose schema is current takes no write lock to open."""
        if self._opened and self._driver is not None:
            return self._driver
        with self._open_lock:
            if self._driver is None:
                assert self.url is not None
                self._driver = open_driver(self.url, clock=self.clock)
            if not self._opened:
                if self._migrate:
                    applied = self._driver.migrate()
                    if applied:
                        events.info("jobs.migrated", versions=applied)
                events.info("jobs.opened", url=self._driver.display_url)
                self._opened = True
            return self._driver

    def open(self) -> Driver:
        """Open and migrate the database now, rather than on first use."""
        return self.driver

    def _use_url(self, url: str, *, label: str) -> None:
        """Point this app at another job database before it is opened (the command line's
        ``--url`` with ``--app``): the same jobs and tasks, another database."""
        if self._driver is not None:
            how = (
                "was built with driver="
                if self.url is None
                else f"already opened {self._driver.display_url} (when its module was imported)"
            )
            raise ConfigurationError(
                f"--url cannot point {label} at another database: the app {how}",
                fix="drop --url, or build the App without opening it at import time (no "
                "app.open() or enqueue at module level), so that --url can choose its database",
            )
        self.url = canonical_url(url)

    def _unopened_driver(self) -> Driver:
        """The driver, opened but not yet migrated (to identify a connection first)."""
        if self._driver is None:
            with self._open_lock:
                if self._driver is None:
                    assert self.url is not None
                    self._driver = open_driver(self.url, clock=self.clock)
        return self._driver

    def register(self, *modules: ModuleType | object) -> list[Registered]:
        """Register every job and task a module exports, named by its export name."""
        registered = self.registry.register(*modules)
        for item in registered:
            if item.kind == "job":
                self.registry.jobs[item.name]._bind_app(self)
        return registered

    def knows(self, handle: JobHandle[Any]) -> bool:
        """Whether ``handle`` is one of this app's registered jobs."""
        return self.registry.knows(handle)

    def _job_named(self, name: str) -> JobHandle[Any] | None:
        """The handle of the job ``name``: registered, or found by a resolver (which registers
        it); None when neither knows it."""
        found = self.registry.job_named(name)
        if found is None:
            for resolve in self._job_resolvers:
                found = resolve(self, name)
                if found is not None:
                    break
        return found

    def _add_job_resolver(self, resolve: Callable[[App, str], JobHandle[Any] | None]) -> None:
        if resolve not in self._job_resolvers:
            self._job_resolvers = (*self._job_resolvers, resolve)

    def close(self) -> None:
        """Close the database and stop being the app that handles enqueue through."""
        for handle in self.registry.jobs.values():
            handle._unbind_app(self)
        if self._driver is not None:
            self._driver.close()
        self._opened = False
        if self._outbox is not None and not isinstance(self._outbox, str):
            self._outbox.close()
        self._outbox_opened = False

    def __enter__(self) -> App:
        """Make this the current app for ``handle.enqueue()`` in this context."""
        self._entered.append(current_app.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        current_app.reset(self._entered.pop())

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(
        self, handle: JobHandle[Any], input: Any, /, **options: Unpack[EnqueueKwargs]
    ) -> EnqueueResult:
        """Enqueue one job; inside a transaction, as part of it (see the module docstring).

        Options: ``run_at`` or ``delay``, ``tenant_id``, ``queue``, ``priority``,
        ``max_attempts``, ``idempotency_key``, ``outbox`` (see ``EnqueueKwargs``).
        """
        return self._enqueue(handle, (input,), EnqueueOptions(**options), many=False)[0]

    def enqueue_many(
        self, handle: JobHandle[Any], inputs: Iterable[Any], /, **options: Unpack[EnqueueKwargs]
    ) -> list[EnqueueResult]:
        """Enqueue one job per input, in one transaction: all are written, or none."""
        opts = EnqueueOptions(**options)
        if opts.idempotency_key is not None:
            raise ConfigurationError(
                "enqueue_many got one idempotency_key for many jobs",
                fix="give the job an idempotency_key function of its input, or enqueue one by one",
            )
        values = inputs if isinstance(inputs, list | tuple) else list(inputs)
        return self._enqueue(handle, values, opts, many=True)

    async def enqueue_async(
        self, handle: JobHandle[Any], input: Any, /, **options: Unpack[EnqueueKwargs]
    ) -> EnqueueResult:
        """``enqueue`` for async code: the same logic, off the event loop's thread. Inside an
        async connection's transaction, calls run one at a time on it (``asyncio.gather`` of
        many is safe), each as part of the transaction."""
        return await self._in_ambient_off_loop(lambda: self.enqueue(handle, input, **options))

    async def enqueue_many_async(
        self, handle: JobHandle[Any], inputs: Iterable[Any], /, **options: Unpack[EnqueueKwargs]
    ) -> list[EnqueueResult]:
        """``enqueue_many`` for async code: the event loop is never blocked; inside an async
        connection's transaction the jobs are part of it, as with ``enqueue_async``."""
        values = list(inputs)
        return await self._in_ambient_off_loop(lambda: self.enqueue_many(handle, values, **options))

    async def _in_ambient_off_loop(self, call: Callable[[], _R]) -> _R:
        """``_off_loop(call)`` inside the ambient transaction, when one is found here (on the
        event loop, where an async session can still reach its connection)."""
        joined = None
        if current_tx.get() is None:
            for source in self._ambient:
                if (joined := await source.joined_async(self)) is not None:
                    break
        with _joining(joined):
            return await _off_loop(call)

    def _add_ambient(self, source: Ambient) -> None:
        """Have enqueues outside ``using()`` ask ``source`` for the transaction they run in."""
        if source not in self._ambient:
            self._ambient = (*self._ambient, source)

    def _remove_ambient(self, source: Ambient) -> None:
        self._ambient = tuple(s for s in self._ambient if s is not source)

    def _enqueue(
        self,
        handle: JobHandle[Any],
        inputs: Sequence[Any],
        options: EnqueueOptions,
        *,
        many: bool,
    ) -> list[EnqueueResult]:
        """Work out where an enqueue writes (the transaction it joins, its database, the
        outbox), then hand it down to ``outbox.enqueue``, which builds the jobs
        and writes them there. Outside ``using()``, an integration's transaction (an
        ``Ambient``) is the one joined."""
        if not isinstance(handle, JobHandle):
            raise RegistrationError(
                f"enqueue needs a job handle, got {type(handle).__name__}",
                fix="decorate the function with @job and register its module with app.register()",
            )
        self._check_registered(handle)
        intercept = self._intercept
        joined = current_tx.get()
        token = None
        if joined is None and inputs and intercept is None and self._ambient:
            joined = next((j for s in self._ambient if (j := s.joined(self)) is not None), None)
            if joined is not None:
                token = current_tx.set(joined)  # for the driver, as inside ``using()``
        try:
            if intercept is not None or not inputs:  # nothing is written to the database
                where = Destination(None, self.mode, intercept=intercept)
            else:
                store = None
                if self._outbox is not None and joined is not None:
                    store = self._open_outbox()
                where = Destination(self.driver, self.mode, store, joined=joined)
            clock = self.clock
            return enqueue(
                where,
                handle,
                inputs,
                options,
                serializer=self.serializer,
                now=clock.now,
                pinned=clock.pinned(),
                many=many,
            )
        finally:
            if token is not None:
                current_tx.reset(token)

    def _check_registered(self, handle: JobHandle[Any]) -> None:
        if not self.registry.knows(handle):
            label = handle.bound_name or getattr(handle.fn, "__qualname__", "?")
            raise unregistered(handle, label) or RegistrationError(
                f"job {label!r} is not registered with this app",
                fix="call app.register(module) with the module that exports it before enqueuing",
            )

    # -- transactions ------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A connection to the job database inside a transaction, for business SQL; every
        enqueue in the block joins it, and this app is the current one for ``handle.enqueue``.
        Commits on normal exit, rolls back on an exception."""
        with self.driver.transaction() as joined, self._current(joined, joined.connection):
            yield joined.connection

    def using(self, connection: Any) -> AbstractContextManager[Any]:
        """Join a transaction on your own connection (``sqlite3``, psycopg): enqueues in the
        block become part of it and commit or roll back with it, and this app is the current
        one for ``handle.enqueue``. You commit it, as usual.

        On the job database the job rows are inserted on your connection. On another
        database, given ``App(outbox=...)`` for it, each enqueue stages an ``x_outbox`` row on
        your connection instead, and the relay (``app.relay()``, ``ultimat3-jobs relay``)
        publishes it after your commit. SQLAlchemy sessions, Django and async connections go
        through ``ultimat3.jobs.integrations``. Any other App on the same database joins the
        same transaction: joining is decided by database identity."""
        return self._using(connection, None)

    def _using(self, connection: Any, serial: asyncio.Lock | None) -> AbstractContextManager[Any]:
        return _Current(self, self._join(connection, serial=serial), connection)

    def _current(self, joined: Joined, value: Any) -> AbstractContextManager[Any]:
        """For the block (which gets ``value``), ``joined`` is the transaction every enqueue
        joins and this app the current one (``_Current``)."""
        return _Current(self, joined, value)

    def _join(self, connection: Any, *, serial: asyncio.Lock | None = None) -> Joined:
        """The caller's connection as a ``Joined`` on the job database or the outbox's. The
        database a connection reaches (the job database, or the outbox's) is worked out on
        its first join only (``_KNOWN``); the driver or the store checks the rest on each."""
        driver = self._unopened_driver()
        known = None if isinstance(connection, Joined) else _KNOWN.get(connection)
        if known is not None:
            if self._outbox_opened:
                store = self._open_outbox()
                if known == store.identity():
                    return self._serial(store.adopt(Joined(connection, known)), serial)
            if known == driver.identity():
                # What can change since the connection's first join (closed, another
                # thread, a converter, an aborted transaction) is checked by the driver
                # before each write in the transaction (its adopt of the ``Joined``).
                return self._serial(Joined(connection, known), serial)
        try:
            if known is not None:
                joined = driver.adopt(Joined(connection, known))
            else:
                joined = driver.adopt(connection)
                if not isinstance(connection, Joined):
                    _KNOWN.remember(connection, joined.database)
        except ConfigurationError as exc:
            if self._outbox is None:
                raise ConfigurationError(
                    exc.cause,
                    fix=f"{exc.fix}; or, when your data lives in another database, give the "
                    "app an outbox there: App(..., outbox='postgresql://.../your-db') (or "
                    "sqlite:///your-data.sqlite3) and run the relay",
                ) from exc
            store = self._open_outbox()
            try:
                joined = store.adopt(connection)
            except ConfigurationError as store_exc:
                raise ConfigurationError(
                    f"{exc.cause}; and the outbox ({store.display_url}) cannot join it "
                    f"either: {store_exc.cause}",
                    fix=store_exc.fix,
                ) from store_exc
            if not isinstance(connection, Joined):
                _KNOWN.remember(connection, joined.database)
        return self._serial(joined, serial)

    @staticmethod
    def _serial(joined: Joined, serial: asyncio.Lock | None) -> Joined:
        return joined if serial is None else Joined(joined.connection, joined.database, serial)

    def _open_outbox(self) -> OutboxStore:
        """The outbox store, opened and migrated on first use."""
        if self._outbox is None:
            raise ConfigurationError(
                "this app has no outbox",
                fix="pass App(..., outbox='postgresql://.../your-db') (or sqlite:///file, or "
                "an OutboxStore) for the database your business transactions run on",
            )
        driver = self.driver  # before the lock: opening the driver takes it too
        with self._open_lock:
            if isinstance(self._outbox, str):
                self._outbox = open_store(self._outbox)
            store = self._outbox
            if not self._outbox_opened:
                if store.display_url == driver.display_url and store.name != "memory":
                    raise ConfigurationError(
                        f"the outbox ({store.display_url}) is the job database itself",
                        fix="drop outbox=: on the job database, app.using(conn) inserts the "
                        "job rows in your transaction directly",
                    )
                if self._migrate:
                    applied = store.migrate()
                    if applied:
                        events.info("jobs.outbox.migrated", versions=applied)
                self._outbox_opened = True
            return store

    def relay(self, *, batch_size: int = 100, interval: DurationInput = "200ms") -> Relay:
        """The relay that publishes this app's outbox to the job database (``tick()`` for one
        pass; ``start()``/``stop()`` or ``with app.relay():`` to run it on a thread)."""
        return Relay(
            store=self._open_outbox(),
            driver=self.driver,
            clock=self.clock,
            batch_size=batch_size,
            interval=to_timedelta(interval),
        )

    # -- workers -----------------------------------------------------------------------------

    def worker(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        lease: DurationInput = "30s",
        poll_interval: DurationInput = "1s",
        shutdown_grace: DurationInput = "10s",
        rescue_interval: DurationInput = "5s",
        prune_interval: DurationInput = "10s",
        retention: DurationInput = "1d",
        dead_retention: DurationInput | None = None,
        heartbeat: DurationInput | None = None,
        stuck_limit: DurationInput | None = "5m",
        unknown_grace: DurationInput = "1h",
    ) -> Worker:
        """A worker for this app's jobs (``worker.run()`` blocks; ``with worker:`` runs it in
        background threads). Settings that cannot work are refused here, naming the option:
        a heartbeat of more than half the lease, a duration over 10 years."""
        chosen = tuple(queues) if queues else self.queues_of_jobs()
        if not chosen:
            raise ConfigurationError(
                "the worker has no queue to serve: no job is registered",
                fix="register your jobs module (App(modules=[...]) or --app module:app), or pass queues=",
            )

        def maybe(value: DurationInput | None, name: str) -> timedelta | None:
            return None if value is None else to_timedelta(value, name=name)

        config = WorkerConfig(
            queues=chosen,
            concurrency=concurrency,
            lease=to_timedelta(lease, name="lease"),
            heartbeat=maybe(heartbeat, "heartbeat"),
            poll_interval=to_timedelta(poll_interval, name="poll_interval"),
            shutdown_grace=to_timedelta(shutdown_grace, name="shutdown_grace"),
            rescue_interval=to_timedelta(rescue_interval, name="rescue_interval"),
            prune_interval=to_timedelta(prune_interval, name="prune_interval"),
            stuck_limit=maybe(stuck_limit, "stuck_limit"),
            unknown_grace=to_timedelta(unknown_grace, name="unknown_grace"),
            maintenance=MaintenanceConfig(
                retention=to_timedelta(retention, name="retention"),
                dead_retention=maybe(dead_retention, "dead_retention"),
            ),
        )
        bound = getattr(self.driver, "statement_timeout", None)
        if (
            isinstance(bound, int | float)
            and not isinstance(bound, bool)
            and bound >= config.lease.total_seconds()
        ):
            # Not refused: fencing and the heartbeat's give-up keep jobs safe; but a reply as
            # late as the statement timeout could arrive after the lease it was about.
            events.warning(
                "jobs.worker.bounds",
                cause=f"the database's statement_timeout ({bound:g}s) is not shorter than the "
                f"lease ({config.lease})",
                fix="lower ?statement_timeout= in the URL (to a third of the lease, say), or "
                "use a longer lease",
            )
        return Worker(
            driver=self.driver,
            handles=self._job_named,
            queues=chosen,
            serializer=self.serializer,
            clock=self.clock,
            app=self,
            config=config,
            registered=lambda: sorted(self.registry.jobs),
            limited=any(
                h.concurrency is not None or h.rate is not None for h in self.registry.jobs.values()
            ),
        )

    def scheduler(
        self,
        *,
        leader: Literal["sole", "database"] = "sole",
        leader_ttl: DurationInput = "15s",
        tick_interval: DurationInput = "1s",
    ) -> Scheduler:
        """The cron scheduler for this app's registered tasks (``start()``/``stop()``, or
        ``tick()`` to dispatch once). ``leader="database"`` elects one active scheduler among
        many through a lease row; either way each occurrence fires exactly once."""
        driver = self.driver
        chosen: SoleLeader | DatabaseLeader
        if leader == "sole":
            chosen = SoleLeader()
        elif leader == "database":
            chosen = DatabaseLeader(driver, ttl=to_timedelta(leader_ttl), clock=self.clock)
        else:
            raise ConfigurationError(
                f"leader={leader!r} is not valid",
                fix='use "sole" (one scheduler process) or "database" (elect one among many)',
            )

        def build(handle: JobHandle[Any], value: Any, key: str) -> NewJob:
            if not self.registry.knows(handle):
                raise RegistrationError(
                    f"a task enqueues job {handle.bound_name or handle.fn!r}, which this app has not registered",
                    fix="register the module that exports the job with the same app as the task",
                )
            return build_job(
                handle,
                value,
                EnqueueOptions(idempotency_key=key),
                serializer=self.serializer,
                now=self.clock.now(),
            )

        return Scheduler(
            driver=driver,
            tasks=self.registry.tasks,
            build=build,
            clock=self.clock,
            leader=chosen,
            tick_interval=to_timedelta(tick_interval),
        )

    def queues_of_jobs(self) -> tuple[str, ...]:
        """The queues of the registered jobs, sorted: what a worker serves by default."""
        return tuple(sorted({h.queue for h in self.registry.jobs.values()}))

    # -- inspecting and operating ------------------------------------------------------------

    def get_job(self, job_id: str, *, tenant_id: str | None = None) -> Job:
        """The job with this id, as it stands now; ``JobNotFoundError`` when there is none (or
        it was pruned)."""
        found = self.driver.job_get(job_id, tenant_id=tenant_id)
        if found is None:
            raise JobNotFoundError(f"no job has the id {job_id!r}")
        return found

    def job_flow(self, job_id: str) -> FlowState | None:
        """Where the partition of a job's limits stands now (``FlowState.why_waiting()`` says
        what holds it back), or None for a job without limits."""
        return inspection(self.driver).job_flow(job_id, now=self.clock.pinned())

    def list_jobs(
        self,
        *,
        state: JobState | str | Iterable[JobState | str] | None = None,
        queue: str | None = None,
        name: str | None = None,
        tenant_id: str | None = None,
        limit: int = 50,
        before_id: str | None = None,
    ) -> list[Job]:
        """Jobs, newest id first, filtered by state (one or several), queue, job name and tenant:
        at most ``limit``, older than ``before_id`` (the last id of the previous page)."""
        return inspection(self.driver).job_list(
            _filter(state, queue, name, tenant_id), limit=limit, before_id=before_id
        )

    def count_jobs(
        self,
        *,
        state: JobState | str | Iterable[JobState | str] | None = None,
        queue: str | None = None,
        name: str | None = None,
        tenant_id: str | None = None,
    ) -> int:
        """How many jobs match the filters (as ``list_jobs``'s, without paging)."""
        counts = inspection(self.driver).job_count(_filter(state, queue, name, tenant_id))
        return sum(counts.values())

    def result(
        self, job_id: str, *, timeout: DurationInput | None = None, tenant_id: str | None = None
    ) -> Any:
        """What the job's handler returned (decoded from its stored JSON), once the job has
        completed: waits for it on the database's wake-ups, without busy-polling, for up to
        ``timeout`` (None: as long as it takes). Raises ``JobFailedError`` when it ended dead
        or cancelled (with its last error), ``ResultTimeoutError`` when it has not finished in
        time, ``JobNotFoundError`` when there is no such job (or it was pruned)."""
        return wait_result(
            self.driver, self.serializer, job_id, timeout=timeout, tenant_id=tenant_id
        )

    async def result_async(
        self, job_id: str, *, timeout: DurationInput | None = None, tenant_id: str | None = None
    ) -> Any:
        """``result`` for async code: the event loop is never blocked."""
        return await wait_result_async(
            self.driver, self.serializer, job_id, timeout=timeout, tenant_id=tenant_id
        )

    def decode_input(self, job: Job) -> Any:
        """A job's input as plain JSON data (codecs applied)."""
        return self.serializer.loads(job.input)

    def retry_jobs(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        """Give dead or cancelled jobs one more attempt, now."""
        return inspection(self.driver).job_retry(
            list(ids), tenant_id=tenant_id, now=self.clock.pinned()
        )

    def discard_jobs(self, ids: Sequence[str], *, tenant_id: str | None = None) -> list[str]:
        """Delete dead or cancelled jobs."""
        return self.driver.job_discard(list(ids), tenant_id=tenant_id)

    def cancel_job(
        self, job_id: str, *, reason: str = "cancelled by an operator", tenant_id: str | None = None
    ) -> bool:
        """Cancel a scheduled, available or running job (a running one loses its lease)."""
        cancel = Cancellation(job_id, reason, tenant_id=tenant_id)
        return self.driver.job_cancel(cancel, now=self.clock.pinned())

    def pause_queue(self, queue: str) -> None:
        """Stop workers from claiming the queue's jobs (running ones finish; enqueues go on)
        until ``resume_queue``."""
        inspection(self.driver).queue_set_paused(queue, True)

    def resume_queue(self, queue: str) -> None:
        """Let workers claim a paused queue's jobs again."""
        inspection(self.driver).queue_set_paused(queue, False)

    def queues(self) -> list[QueueInfo]:
        """Every queue that has jobs or a pause setting, with its jobs counted by state."""
        return inspection(self.driver).queue_list()

    def workers(self) -> list[WorkerInfo]:
        """The live worker processes (their rows in the workers table), by id."""
        return inspection(self.driver).worker_list()


def _filter(
    state: JobState | str | Iterable[JobState | str] | None,
    queue: str | None,
    name: str | None,
    tenant_id: str | None,
) -> JobFilter:
    states: frozenset[JobState] | None
    if state is None:
        states = None
    elif isinstance(state, str):
        states = frozenset({_state(state)})
    else:
        states = frozenset(_state(s) for s in state)
    return JobFilter(states=states, queue=queue, name=name, tenant_id=tenant_id)


def _state(value: JobState | str) -> JobState:
    try:
        return JobState(value)
    except ValueError:
        raise ConfigurationError(
            f"{value!r} is not a job state",
            fix="use one of: " + ", ".join(s.value for s in JobState),
        ) from None


_R = TypeVar("_R")


@contextmanager
def _joining(joined: Joined | None) -> Iterator[None]:
    """``joined`` is the transaction enqueues join in the block (nothing changes for None)."""
    if joined is None:
        yield
        return
    token = current_tx.set(joined)
    try:
        yield
    finally:
        current_tx.reset(token)


class _Current:
    """``App.using`` and ``App.transaction``'s block: ``joined`` is the transaction every
    enqueue joins and ``app`` the current one. Both context variables are set here, in one
    object rather than nested context managers: a request pays for this on every enqueue
    in a transaction."""

    __slots__ = ("_app", "_joined", "_tokens", "_value")

    def __init__(self, app: App, joined: Joined, value: Any) -> None:
        self._app, self._joined, self._value = app, joined, value
        self._tokens: tuple[Token[Joined | None], Token[Enqueuer | None]] | None = None

    def __enter__(self) -> Any:
        if self._tokens is not None:
            raise RuntimeError("a using() or transaction() block cannot be entered twice at once")
        app = self._app
        tokens = (current_tx.set(self._joined), current_app.set(app))
        try:
            if app._migrate:
                # A read when the schema is current (through ``joined`` on SQLite); raises at
                # once otherwise. Already done for ``transaction()``.
                app.open()
        except BaseException:
            current_app.reset(tokens[1])
            current_tx.reset(tokens[0])
            raise
        self._tokens = tokens
        return self._value

    def __exit__(self, *exc: object) -> None:
        assert self._tokens is not None
        tx, app = self._tokens
        self._tokens = None
        current_app.reset(app)
        current_tx.reset(tx)


async def _off_loop(call: Callable[[], _R]) -> _R:
    """Run a sync enqueue on a thread (the context, and so the current transaction, goes
    along); one at a time on a connection an event loop shares with us."""
    joined = current_tx.get()
    if joined is not None and joined.serial is not None:
        async with joined.serial:
            return await asyncio.to_thread(call)
    return await asyncio.to_thread(call)
