"""Job definitions, the handle an app enqueues through, and the registry of names.

``@job`` turns a function of one JSON input into a ``JobHandle``. Names come from where the
handle is exported: ``app.register(module)`` names each handle after the module attribute that
holds it (seed ``registerJobs``), unless ``@job(name=...)`` fixed one. A handle exported under
two names, or two handles under one name, is an error with a fix, never a silent pick.

``handle.enqueue(input)`` works wherever it is called from: it asks the current app (the one
running the job, or the one entered with ``with app:``), else the one app that registered the
handle. With none, or several and no current one, it raises ``RegistrationError`` saying which
app to use.

Control flow raised by handlers sits outside the error tree: ``Snooze`` puts the job back to
wait without consuming an attempt, ``Cancel`` ends it as cancelled.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
    cast,
    overload,
)

if TYPE_CHECKING:
    from ultimat3.jobs.tasks import TaskHandle

from ultimat3.jobs.duration import DurationInput, to_timedelta
from ultimat3.jobs.errors import ConfigurationError, RegistrationError
from ultimat3.jobs.limits import Limit, Rate, Unique
from ultimat3.jobs.records import DEFAULT_QUEUE, EnqueueResult
from ultimat3.jobs.retry import DEFAULT_RETRY, Retry
from ultimat3.jobs.serialization import input_type

__all__ = [
    "Cancel",
    "EnqueueKwargs",
    "EnqueueResult",
    "JobContext",
    "JobHandle",
    "Registered",
    "Registry",
    "Snooze",
    "check_queue_name",
    "current_app",
    "job",
]

InputT = TypeVar("InputT")
F = TypeVar("F", bound=Callable[..., Any])

#: What a job, task or queue name may hold, so names read alike in keys and logs.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-:")


class EnqueueKwargs(TypedDict, total=False):
    """The options of one enqueue (``app.enqueue`` and ``handle.enqueue``)."""

    #: When to run (an aware datetime); or ``delay``, a duration from now. Default: now.
    run_at: datetime | None
    delay: DurationInput | None
    tenant_id: str | None
    #: Overrides the job's queue, priority, or attempts for this one enqueue.
    queue: str | None
    priority: int | None
    max_attempts: int | None
    #: Overrides the job's idempotency key function: a duplicate returns the existing job.
    idempotency_key: str | None
    #: False: commit on its own even inside a transaction (the seed's escape hatch).
    outbox: bool | None


class Enqueuer(Protocol):
    """What a handle needs from an app (the app implements it)."""

    def enqueue(
        self, handle: JobHandle[Any], input: Any, /, **options: Unpack[EnqueueKwargs]
    ) -> EnqueueResult: ...

    async def enqueue_async(
        self, handle: JobHandle[Any], input: Any, /, **options: Unpack[EnqueueKwargs]
    ) -> EnqueueResult: ...

    def knows(self, handle: JobHandle[Any]) -> bool: ...

    def result(
        self, job_id: str, *, timeout: DurationInput | None = None, tenant_id: str | None = None
    ) -> Any: ...

    async def result_async(
        self, job_id: str, *, timeout: DurationInput | None = None, tenant_id: str | None = None
    ) -> Any: ...


#: The app whose job is running, or that the caller entered with ``with app:``.
current_app: ContextVar[Enqueuer | None] = ContextVar("ultimat3_jobs_current_app", default=None)


class Snooze(Exception):
    """Raised by a handler: run me again after ``delay``, without consuming an attempt."""

    def __init__(self, delay: DurationInput = 0) -> None:
        self.delay = to_timedelta(delay)
        super().__init__(f"snooze for {self.delay}")


class Cancel(Exception):
    """Raised by a handler: stop retrying; the job ends ``cancelled`` with ``reason``."""

    def __init__(self, reason: str = "cancelled by the job") -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass
class JobContext:
    """What a handler that asks for it (a second parameter) knows about its run."""

    id: str
    name: str
    queue: str
    attempt: int
    max_attempts: int
    tenant_id: str | None
    enqueued_at: datetime
    _heartbeat: Callable[[], bool] = field(repr=False, default=lambda: True)
    _cancelled: Callable[[], bool] = field(repr=False, default=lambda: False)

    def heartbeat(self) -> bool:
        """Ask the worker to renew the lease now (it also does on its own schedule) and say
        whether it is still held as far as the worker knows. Never blocks: safe on the event
        loop of an ``async def`` job."""
        return self._heartbeat()

    @property
    def cancelled(self) -> bool:
        """True once the worker gave up on this run (timeout, shutdown, lost lease): a
        long-running sync handler should check it and return."""
        return self._cancelled()

    @property
    def is_last_attempt(self) -> bool:
        """True on the job's last attempt: if it fails now, it goes to dead-letter."""
        return self.attempt >= self.max_attempts


class JobHandle(Generic[InputT]):
    """A registered unit of work. Call it to run the function directly; ``enqueue`` to run it
    in a worker."""

    kind: Literal["job"] = "job"

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        queue: str | None = None,
        retry: Retry | None = None,
        idempotency_key: Callable[[InputT], str] | None = None,
        timeout: DurationInput | None = None,
        priority: int = 0,
        concurrency: Limit | None = None,
        unique: Unique | None = None,
        rate: Rate | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(
                f"@job needs a function, got {type(fn).__name__}",
                fix="put @job directly above a `def` or `async def` that takes one input",
            )
        self.fn = fn
        self._name = check_name(name, "job") if name is not None else None
        self._explicit_name = name is not None
        self.queue = check_name(queue, "queue") if queue is not None else DEFAULT_QUEUE
        self.retry = retry if retry is not None else DEFAULT_RETRY
        if not isinstance(self.retry, Retry):
            raise ConfigurationError(
                f"retry= must be a Retry, got {type(retry).__name__}",
                fix="write retry=Retry(attempts=5, backoff='exponential', delay='1s')",
            )
        self.idempotency_key = idempotency_key
        self.timeout = to_timedelta(timeout) if timeout is not None else None
        if not valid_priority(priority):
            raise ConfigurationError(
                f"priority must be an int from -100 to 100, got {priority!r}",
                fix="higher runs first; the default is 0",
            )
        self.priority = priority
        for option, value, kind, example in (
            ("concurrency", concurrency, Limit, 'Limit(2, key=lambda o: o["account"])'),
            ("unique", unique, Unique, 'Unique(period="1h", key=lambda o: o["user"])'),
            ("rate", rate, Rate, 'Rate(100, per="1m")'),
        ):
            if value is not None and not isinstance(value, kind):
                raise ConfigurationError(
                    f"{option}= must be a {kind.__name__}, got {type(value).__name__}",
                    fix=f"write {option}={example}",
                )
        self.concurrency = concurrency
        self.unique = unique
        if rate is not None and concurrency is not None and (rate.key, rate.scope) != (None, "job"):
            raise ConfigurationError(
                "rate= names its own partition, but a job with concurrency= counts its starts "
                "in the concurrency partition",
                fix="drop key= and scope= from the Rate (it counts per concurrency key); two "
                "partitions on one job are not supported yet",
            )
        self.rate = rate
        self.is_async = inspect.iscoroutinefunction(fn)
        self.input_type = input_type(fn)
        self.wants_context = _wants_context(fn)
        self._apps: weakref.WeakSet[Any] = weakref.WeakSet()
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def name(self) -> str:
        """The job's registered name (its export name, or ``@job(name=...)``);
        ``RegistrationError`` before it is registered."""
        if self._name is None:
            qual = getattr(self.fn, "__qualname__", repr(self.fn))
            raise unregistered(self, qual) or RegistrationError(
                f"job {qual} has no name yet: it is not registered with any app",
                fix="call app.register(module) with the module that exports it, or pass @job(name=...)",
            )
        return self._name

    @property
    def bound_name(self) -> str | None:
        """The registered name, or None before registration (``name`` raises then)."""
        return self._name

    def _bind_name(self, name: str) -> None:
        if self._name is None:
            self._name = check_name(name, "job")
        elif self._name != name and not self._explicit_name:
            raise RegistrationError(
                f"one job handle is exported under two names: {self._name!r} and {name!r}",
                fix=f"export it under one name, or fix its name with @job(name={self._name!r})",
            )

    def _bind_app(self, app: Enqueuer) -> None:
        self._apps.add(app)

    def _unbind_app(self, app: Enqueuer) -> None:
        self._apps.discard(app)

    def __call__(self, input: InputT, *args: Any, **kwargs: Any) -> Any:
        return self.fn(input, *args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<JobHandle {self._name or getattr(self.fn, '__qualname__', '?')} queue={self.queue}>"
        )

    def _app(self) -> Enqueuer:
        app = current_app.get()
        if app is not None and app.knows(self):
            return app
        apps = list(self._apps)
        if len(apps) == 1:
            return apps[0]  # type: ignore[no-any-return]
        label = self._name or getattr(self.fn, "__qualname__", "?")
        if not apps:
            raise unregistered(self, label) or RegistrationError(
                f"job {label!r} is not registered with any app, so it cannot be enqueued",
                fix="create an App and call app.register(your_jobs_module) before enqueuing",
            )
        raise RegistrationError(
            f"job {label!r} is registered with {len(apps)} apps and none is current",
            fix="call app.enqueue(handle, input), or enqueue inside `with app:`",
        )

    def enqueue(self, input: InputT, **options: Unpack[EnqueueKwargs]) -> EnqueueResult:
        """Enqueue through the current app; joins the current transaction (see ``App``)."""
        return self._app().enqueue(self, input, **options)

    async def enqueue_async(self, input: InputT, **options: Unpack[EnqueueKwargs]) -> EnqueueResult:
        """``enqueue`` for async code (see ``App.enqueue_async``)."""
        return await self._app().enqueue_async(self, input, **options)

    def result(
        self,
        job: EnqueueResult | str,
        *,
        timeout: DurationInput | None = None,
        tenant_id: str | None = None,
    ) -> Any:
        """What the job (an ``enqueue`` result or a job id) returned, once it completes: see
        ``App.result``."""
        job_id = job.id if isinstance(job, EnqueueResult) else job
        return self._app().result(job_id, timeout=timeout, tenant_id=tenant_id)

    async def result_async(
        self,
        job: EnqueueResult | str,
        *,
        timeout: DurationInput | None = None,
        tenant_id: str | None = None,
    ) -> Any:
        """``result`` for async code: the event loop is never blocked."""
        job_id = job.id if isinstance(job, EnqueueResult) else job
        return await self._app().result_async(job_id, timeout=timeout, tenant_id=tenant_id)


@overload
def job(fn: F, /) -> JobHandle[Any]: ...


@overload
def job(
    *,
    name: str | None = None,
    queue: str | None = None,
    retry: Retry | None = None,
    idempotency_key: Callable[[Any], str] | None = None,
    timeout: DurationInput | None = None,
    priority: int = 0,
    concurrency: Limit | None = None,
    unique: Unique | None = None,
    rate: Rate | None = None,
) -> Callable[[F], JobHandle[Any]]: ...


def job(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    retry: Retry | None = None,
    idempotency_key: Callable[[Any], str] | None = None,
    timeout: DurationInput | None = None,
    priority: int = 0,
    concurrency: Limit | None = None,
    unique: Unique | None = None,
    rate: Rate | None = None,
) -> JobHandle[Any] | Callable[[F], JobHandle[Any]]:
    """Define a job: ``@job`` or ``@job(queue="mail", retry=Retry(attempts=5))``.

    The function takes one JSON input (a dict, list, str, number, bool or None; or a dataclass
    or pydantic model when annotated so) and, optionally, a ``JobContext`` second (annotated
    so, or named ``ctx`` or ``context``); a function of any other shape is a
    ``ConfigurationError`` here, at definition, not at run time. ``def``
    handlers run on the worker's threads, ``async def`` handlers on its event loop.
    ``concurrency=Limit(...)`` bounds how many run at once across every worker, and
    ``rate=Rate(...)`` how many start per period, and ``unique=Unique(...)`` how many may exist
    at once (``limits``).
    """

    def wrap(f: Callable[..., Any]) -> JobHandle[Any]:
        return JobHandle(
            f,
            name=name,
            queue=queue,
            retry=retry,
            idempotency_key=idempotency_key,
            timeout=timeout,
            priority=priority,
            concurrency=concurrency,
            unique=unique,
            rate=rate,
        )

    if fn is not None:
        return wrap(fn)
    return wrap


@dataclass(frozen=True, slots=True)
class Registered:
    """One name that ``register`` bound (seed ``RegisteredPrimitive``)."""

    kind: Literal["job", "task"]
    name: str
    module: str


class Registry:
    """Names to handles, for one app. Not thread-safe for registration; register at start-up."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobHandle[Any]] = {}
        self.tasks: dict[str, TaskHandle] = {}

    def register(self, *modules: ModuleType | object) -> list[Registered]:
        """Register every job and task handle a module exports, under its export name.

        Names are taken in sorted order; ``__all__`` limits them when the module defines it.
        A plain object (a class, a namespace) works too: its public attributes are the exports.
        """
        registered: list[Registered] = []
        for module in modules:
            mod_name = getattr(module, "__name__", type(module).__name__)
            if isinstance(module, ModuleType):
                _registered_modules.add(mod_name)
            for attr in _export_names(module):
                value = getattr(module, attr, None)
                if isinstance(value, JobHandle):
                    registered.append(self.add_job(value, attr, mod_name))
                elif getattr(value, "kind", None) == "task":
                    registered.append(self.add_task(cast("TaskHandle", value), attr, mod_name))
        return registered

    def add_job(self, handle: JobHandle[Any], export_name: str, module: str = "") -> Registered:
        name = handle.bound_name if handle._explicit_name else export_name
        assert name is not None
        _check_unique(self.jobs, handle, name, "job", "@job(name={!r})")
        handle._bind_name(name)
        self.jobs[name] = handle
        return Registered("job", name, module)

    def add_task(self, handle: TaskHandle, export_name: str, module: str = "") -> Registered:
        name = handle.name or export_name
        _check_unique(self.tasks, handle, name, "task", "task(..., name={!r})")
        handle._bind_name(name)
        self.tasks[name] = handle
        return Registered("task", name, module)

    def job_named(self, name: str) -> JobHandle[Any] | None:
        return self.jobs.get(name)

    def knows(self, handle: JobHandle[Any]) -> bool:
        name = handle.bound_name
        return name is not None and self.jobs.get(name) is handle


def _check_unique(
    table: Mapping[str, object], handle: object, name: str, kind: str, naming: str
) -> None:
    """One name per handle and one handle per name, or a RegistrationError with a fix."""
    for other_name, other in table.items():
        if other is handle and other_name != name:
            raise RegistrationError(
                f"one {kind} handle is exported under two names: {other_name!r} and {name!r}",
                fix=f"export it once, or fix its name with {naming.format(other_name)}",
            )
    existing = table.get(name)
    if existing is not None and existing is not handle:
        raise RegistrationError(
            f"two different {kind}s are registered under the name {name!r}",
            fix=f"rename one of them, or give one an explicit {naming.format('...')}",
        )


#: The modules some App has registered (``Registry.register``), by name: a handle defined in
#: one of them that is not registered was defined below the ``App(...)`` that registered it.
_registered_modules: set[str] = set()


def unregistered(handle: JobHandle[Any], label: object) -> RegistrationError | None:
    """The error for an unregistered handle whose module an App did register: the cause is
    where the job is defined (below ``App(modules=[...])``, or left out of ``__all__``), not
    a missing ``app.register`` call. None when the module was never registered."""
    if len(handle._apps):
        return None  # registered with another app: not a question of where it is defined
    module_name = getattr(handle.fn, "__module__", None)
    module = sys.modules.get(module_name or "")
    if module is None or module_name not in _registered_modules:
        return None
    names = [n for n, v in vars(module).items() if v is handle]
    if not names:
        return None
    declared = getattr(module, "__all__", None)
    if declared is not None and not set(names) & set(declared):
        return RegistrationError(
            f"job {label!r} is not in {module_name}.__all__, so the App that registered "
            f"{module_name} left it out",
            fix=f"add {names[0]!r} to __all__ in {module_name}",
        )
    return RegistrationError(
        f"job {label!r} is defined below the App(...) that registered its module "
        f"{module_name}: an App takes the jobs a module holds when App(...) runs",
        fix=f"move `App(...)` below the last @job and task(...) in {module_name} (or define "
        f"{names[0]} above it)",
    )


def _export_names(module: object) -> Sequence[str]:
    declared: Iterable[str] | None = getattr(module, "__all__", None)
    names = declared if declared is not None else (n for n in dir(module) if not n.startswith("_"))
    return sorted(set(names))


def valid_priority(priority: object) -> bool:
    """An int (not a bool) from -100 to 100."""
    return type(priority) is not bool and isinstance(priority, int) and -100 <= priority <= 100


def check_name(
    name: str, what: str, error: type[ConfigurationError | RegistrationError] = ConfigurationError
) -> str:
    """``name`` when it is 1-200 characters of ``_NAME_CHARS``, else ``error`` saying so."""
    if not isinstance(name, str) or not name or len(name) > 200 or not set(name) <= _NAME_CHARS:
        raise error(
            f"{what} name {name!r} is not valid",
            fix=f"use 1-200 characters of letters, digits and _ . - : for a {what} name",
        )
    return name


def check_queue_name(name: str) -> str:
    return check_name(name, "queue")


#: The names a context parameter may have when it is not annotated ``JobContext``.
CONTEXT_NAMES = frozenset({"ctx", "context"})

_SHAPES = (
    "a job function takes its JSON input, then optionally its context: "
    "`def send(order: dict)`, `def send(order: dict, ctx: JobContext)` or "
    "`def send(order, ctx)` (a second parameter is the context when it is annotated "
    "JobContext or named ctx or context); further parameters need defaults and must be "
    "keyword-only (after a `*`)"
)


def _wants_context(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a ``JobContext`` second, checked at definition so that a function
    of another shape (``def send(to, subject)``) fails at import, not at run time."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    qual = getattr(fn, "__qualname__", repr(fn))
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) == 0:
        raise ConfigurationError(
            f"job function {qual!r} takes no input parameter",
            fix=_SHAPES,
        )
    extra = [
        p
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ] + [
        p
        for p in params
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if len(positional) > 2 or extra:
        names = ", ".join(p.name for p in params)
        raise ConfigurationError(
            f"job function {qual!r} takes ({names}): a worker passes it one input and, "
            "optionally, a JobContext",
            fix=_SHAPES,
        )
    if len(positional) == 1:
        return False
    second = positional[1]
    if _is_context_annotation(second.annotation) or second.name in CONTEXT_NAMES:
        return True
    raise ConfigurationError(
        f"job function {qual!r} takes a second parameter {second.name!r} that is not a "
        "JobContext: the worker would pass its context there",
        fix=_SHAPES,
    )


def _is_context_annotation(annotation: object) -> bool:
    if annotation is JobContext:
        return True
    # ``from __future__ import annotations`` leaves the annotation as its source text.
    return isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "JobContext"
