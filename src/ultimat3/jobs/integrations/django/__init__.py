"""Django: enqueues inside ``atomic()`` write through Django's own connection, and a
``django.tasks`` backend.

Joining a transaction::

    from ultimat3.jobs.integrations.django import using

    with transaction.atomic(), using(app):
        Order.objects.create(id=42)
        send_receipt.enqueue({"id": 42})     # same transaction, same connection

The job row (or, with ``App(outbox=...)``, its ``x_outbox`` row) is written on the DBAPI
connection under Django's ``connections[alias]``, in a savepoint: it commits with the
outermost ``atomic()``, and a nested ``atomic()`` that rolls back takes the jobs enqueued in it
along. Outside ``atomic()`` (Django's autocommit) each enqueue commits on its own, as a
Django ``save()`` does. Unlike ``transaction.on_commit(lambda: ...)``, nothing is lost when
the process dies right after the commit.

The task backend (Django 6 ``django.tasks``; on older Django the ``django-tasks`` backport)::

    TASKS = {"default": {
        "BACKEND": "ultimat3.jobs.integrations.django.JobsBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"APP": "myproject.jobs:app"},     # optional DATABASE: the alias to join
    }}                                                 # optional MAX_ATTEMPTS: default 1

``task.enqueue(...)`` becomes one job named by the task's import path
(``shop.tasks.total``: so it reads in ``jobs list``, ``schedule``, the dashboard and the
metrics), whose attempts are the backend's and whose input is that path, its JSON arguments,
the backend's alias and the time of the enqueue; an ``async def`` task runs on the worker's
event loop. Django's ``priority`` (-100..100, higher first), ``queue_name`` and ``run_after``
map to the job's priority, queue and ``run_at``. Inside ``atomic()`` on the ``DATABASE`` alias
it joins the transaction, as above; outside it commits at once. ``get_result(id)`` reads the
job and returns a result equal to the one ``enqueue()`` returned while nothing has happened to
it. Rows of earlier releases (``django_task``, ``django_task_async``) still run.

The worker, and every other command, finds the App through the settings::

    DJANGO_SETTINGS_MODULE=myproject.settings ultimat3-jobs --app ultimat3.jobs.integrations.django worker

``app``, read from this module, runs ``django.setup()``, takes the one App that the ``TASKS``
backends name and ``prepare``s it: each task of the installed applications' ``tasks`` modules
is registered under its import path, and a task defined elsewhere is registered when a worker
first meets its name (``App._add_job_resolver``); a module that is there but fails to import
fails that job with its error, where a missing one leaves it to a worker that has the code. With ``"ultimat3.jobs.integrations.django"``
in ``INSTALLED_APPS``, ``manage.py migrate`` creates the job tables: its migration runs the
library's own migrations, through the library's connection, on each alias a backend names.

Django's contract, kept:

- the return value is stored (``result.return_value``); one that is not JSON fails the task
  with Django's ``TypeError`` ("Unsupported type"), as Django's own backends do;
- ``task_enqueued`` is sent where the task is enqueued, ``task_started`` and
  ``task_finished`` in the worker (``task_finished`` inside the exception handler of a failed
  attempt, so Django's log line carries the traceback), so ``django.tasks`` logs as usual;
- a task that takes its context sees its result's id and the attempt it is in;
- errors keep the exception's module path (``builtins.ValueError``); an attempt that ended
  without an exception of the task's (a timeout, a lost worker) reads as
  ``builtins.TimeoutError`` or ``builtins.RuntimeError``, its traceback saying which;
- ``worker_ids`` holds one worker per attempt, so ``attempts`` counts every attempt;
- arguments Django refuses raise ``TypeError`` (Django's own check runs first;
  ``SerializationError`` is a ``TypeError`` too).

Retries: Django has no notion of them, so a task gets **one attempt** unless the backend's
``OPTIONS`` set ``MAX_ATTEMPTS`` (the backoff is the default policy's: exponential from 1 s,
jittered). Statuses: READY while the job waits (also between attempts, its failures already in
``errors``), RUNNING, SUCCESSFUL, and FAILED only once it will not run again: dead (attempts
used up, or a return value that cannot be stored) or cancelled. ``task_finished`` is sent for
the attempt that ends the task, not for one that a retry follows. An operator's ``jobs retry``
makes a FAILED task READY again.

Limits: workers must serve the tasks' queues (``worker -q default -q emails``); a worker
started with ``--app myproject.jobs:app`` rather than this module knows Django's tasks only
if that module calls ``prepare(app)`` after ``django.setup()``. ``started_at`` is the start of
the latest attempt (as ``last_attempted_at``). No signal is sent for an attempt that the worker
ends itself (a timeout, a lost worker). ``atomic()`` is sync-only in Django; from async views,
``aenqueue`` runs the enqueue through ``sync_to_async``, as Django's base backend does. On
SQLite, give the database ``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` (Django 5.1+): a
deferred ``atomic()`` that reads before it enqueues can be refused the write lock, which only a
retry of the whole transaction fixes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any, cast

from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections  # type: ignore[import-untyped]
from django.utils import timezone  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from ultimat3.jobs import events
from ultimat3.jobs.drivers import open_driver
from ultimat3.jobs.errors import ConfigurationError, JobNotFoundError
from ultimat3.jobs.job import JobContext, JobHandle, current_app, job
from ultimat3.jobs.records import AttemptError, Job, JobState
from ultimat3.jobs.retry import Retry


def _tasks(path: str) -> Any:
    """A module of Django 6's ``django.tasks``, else of the ``django-tasks`` backport."""
    try:
        return importlib.import_module(f"django.tasks{path}")
    except ImportError:
        return importlib.import_module(f"django_tasks{path}")


_base = _tasks(".base")
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskResultDoesNotExist: Any = _tasks(".exceptions").TaskResultDoesNotExist
BaseTaskBackend: Any = _tasks(".backends.base").BaseTaskBackend
_signals = _tasks(".signals")
try:
    from django.utils.json import normalize_json  # type: ignore[import-untyped, unused-ignore]
except ImportError:  # Django < 6: the backport's
    normalize_json = importlib.import_module("django_tasks.utils").normalize_json

if TYPE_CHECKING:
    from ultimat3.jobs.app import App

__all__ = ["JobsBackend", "django_task", "django_task_async", "prepare", "using"]

#: The names of the two jobs that run Django tasks.
_JOB_NAMES = frozenset({"django_task", "django_task_async"})

_STATUS = {
    JobState.SCHEDULED: TaskResultStatus.READY,
    JobState.AVAILABLE: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.DEAD: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}
#: What an attempt that ended without an exception of the task's reads as in ``errors``.
_NO_EXCEPTION = {"timeout": "builtins.TimeoutError"}


@contextmanager
def using(app: App, alias: str | None = None) -> Iterator[Any]:
    """Enqueues in the block write through Django's connection ``alias`` (default
    ``"default"``): inside ``atomic()`` as part of it, outside it each on its own."""
    connection = connections[alias or DEFAULT_DB_ALIAS]
    connection.ensure_connection()
    with app.using(connection.connection):
        yield connection


# -- the jobs that run Django tasks, in the worker ------------------------------------------


def _run(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Run one ``django.tasks`` task: ``{"task": import path, "args": [...], "kwargs": {...},
    "backend": alias, "enqueued_at": ISO time}``; returns what the task returns."""
    task, running = _start(payload, ctx)
    close_old_connections()
    try:
        try:
            value = task.call(*_args(task, running), **running.kwargs)
            return _succeeded(running, value)
        except BaseException:
            _failed(running, ctx)
            raise
    finally:
        close_old_connections()


async def _run_async(payload: dict[str, Any], ctx: JobContext) -> Any:
    """``_run`` for an ``async def`` task, awaited on the worker's event loop (what touches
    the database, reading the job and the signals' receivers, runs on a thread)."""
    task, running = await asyncio.to_thread(_start, payload, ctx)
    try:
        value = await task.func(*_args(task, running), **running.kwargs)
        return await asyncio.to_thread(_succeeded, running, value)
    except asyncio.CancelledError:
        raise  # the worker gave up on this run (a timeout, a shutdown): not the task's failure
    except BaseException:
        _failed(running, ctx)
        raise


#: The job that ran every ``def`` Django task in earlier releases: its rows still run.
django_task = job(name="django_task", retry=Retry(attempts=1))(_run)
#: The job that ran every ``async def`` Django task in earlier releases: its rows still run.
django_task_async = job(name="django_task_async", retry=Retry(attempts=1))(_run_async)


def _start(payload: dict[str, Any], ctx: JobContext) -> tuple[Any, Any]:
    """The task and its RUNNING result (this attempt's worker among its ``worker_ids``), after
    ``task_started`` was sent."""
    app = cast("App", current_app.get())
    running = _task_result(app, app.get_job(ctx.id), payload.get("backend", DEFAULT_DB_ALIAS))
    _signals.task_started.send(sender=JobsBackend, task_result=running)
    return running.task, running


def _args(task: Any, running: Any) -> tuple[Any, ...]:
    """The positional arguments of the call: the task's context first when it takes one."""
    args = tuple(running.args)
    return (TaskContext(task_result=running), *args) if task.takes_context else args


def _succeeded(running: Any, value: Any) -> Any:
    """The value to store, once it is known to be storable (else the ``TypeError`` Django
    raises, and the attempt fails); ``task_finished`` sent with the SUCCESSFUL result."""
    normalized = normalize_json(value)
    app = cast("App", current_app.get())
    app.serializer.dumps(normalized, path="result")  # over the limit, say: fail now, not later
    finished = _replace(running, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
    object.__setattr__(finished, "_return_value", normalized)
    _signals.task_finished.send(sender=JobsBackend, task_result=finished)
    return normalized


def _failed(running: Any, ctx: JobContext) -> None:
    """In the exception handler of a failed attempt: ``task_finished`` (FAILED) when no retry
    follows, so Django logs it with its traceback."""
    if ctx.is_last_attempt:
        failed = _replace(running, status=TaskResultStatus.FAILED, finished_at=timezone.now())
        _signals.task_finished.send(sender=JobsBackend, task_result=failed)


def _replace(result: Any, **changes: Any) -> Any:
    """``result`` with ``changes``, its return value kept (``dataclasses.replace`` resets it:
    it is no ``__init__`` field)."""
    fresh = dataclasses.replace(result, **changes)
    object.__setattr__(fresh, "_return_value", result._return_value)
    return fresh


# -- results --------------------------------------------------------------------------------


def _task_error(error: AttemptError) -> Any:
    path = error.exception_path or _NO_EXCEPTION.get(error.kind, "builtins.RuntimeError")
    traceback = error.traceback or f"{error.kind}: {error.message}\n"
    return TaskError(exception_class_path=path, traceback=traceback)


def _worker_ids(found: Job) -> list[str]:
    """One worker per attempt: the failed ones from the error history, then the attempt that
    is running or ended without an error (completed, or cancelled while it ran)."""
    ids = [e.worker_id for e in found.errors]
    if found.attempt > len(found.errors) and found.worker_id is not None:
        ids.append(found.worker_id)
    return ids


def _task_result(app: App, found: Job, alias: str) -> Any:
    """The ``TaskResult`` of a ``django_task`` job, as ``get_result`` returns it."""
    payload = app.decode_input(found)
    task = import_string(payload["task"]).using(
        priority=found.priority,
        queue_name=found.queue,
        run_after=_time(payload.get("run_after")),
        backend=alias,
    )
    enqueued = _time(payload.get("enqueued_at")) or found.created_at
    result = TaskResult(
        task=task,
        id=found.id,
        status=_STATUS[found.state],
        enqueued_at=enqueued,
        started_at=found.attempted_at,
        finished_at=found.finished_at,
        last_attempted_at=found.attempted_at,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=alias,
        errors=[_task_error(e) for e in found.errors],
        worker_ids=_worker_ids(found),
    )
    if found.state is JobState.COMPLETED and found.result is not None:
        object.__setattr__(result, "_return_value", app.serializer.loads(found.result))
    return result


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


class JobsBackend(BaseTaskBackend):  # type: ignore[misc]  # Django's classes are untyped
    """A ``django.tasks`` backend that stores tasks as ultimat3 jobs; see the module."""

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._app_ref: str | None = self.options.get("APP")
        self._database: str = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        attempts = self.options.get("MAX_ATTEMPTS", 1)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
            raise ConfigurationError(
                f"the task backend {alias!r} has OPTIONS['MAX_ATTEMPTS'] = {attempts!r}",
                fix="use a whole number from 1 (the default: no retry, as Django expects) to 100",
            )
        self._max_attempts: int = attempts

    @property
    def app(self) -> App:
        """The App of ``OPTIONS["APP"]`` (``module:attribute``), which knows how to run Django
        tasks (``prepare``)."""
        from ultimat3.jobs.app import App

        if not self._app_ref:
            raise ConfigurationError(
                f"the task backend {self.alias!r} names no App",
                fix='add "OPTIONS": {"APP": "myproject.jobs:app"} to its TASKS entry',
            )
        module_name, _, attr = self._app_ref.partition(":")
        value = getattr(importlib.import_module(module_name), attr or "app", None)
        if not isinstance(value, App):
            raise ConfigurationError(
                f"OPTIONS['APP'] = {self._app_ref!r} is not an App",
                fix="point it at a module attribute holding App(...), e.g. myproject.jobs:app",
            )
        prepare(value, discover=False)
        return value

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Enqueue a Django task as a job (``task.enqueue()`` calls it): inside ``atomic()`` on
        the job database it joins that transaction; returns the ``TaskResult``."""
        self.validate_task(task)
        enqueued_at = timezone.now()
        # Django's own check first: what it refuses raises its TypeError ("Unsupported type").
        payload: dict[str, Any] = {
            "task": task.module_path,
            "args": normalize_json(list(args)),
            "kwargs": normalize_json(dict(kwargs)),
            "backend": self.alias,
            "enqueued_at": enqueued_at.isoformat(),
        }
        run_at = task.run_after
        if run_at is not None:
            payload["run_after"] = run_at.isoformat()
            if timezone.is_naive(run_at):
                run_at = timezone.make_aware(run_at)
        app = self.app
        handle = _task_handle(app, task, self._max_attempts)
        options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": task.priority,
            "run_at": run_at,
            "max_attempts": self._max_attempts,
        }
        joined = connections[self._database].in_atomic_block
        with using(app, self._database) if joined else nullcontext():
            done = app.enqueue(handle, payload, **options)
        result = TaskResult(
            task=task,
            id=done.id,
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        _signals.task_enqueued.send(sender=type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The ``TaskResult`` of an enqueued task, from its job as it stands now;
        ``TaskResultDoesNotExist`` when there is none."""
        app = self.app
        try:
            found = app.get_job(result_id)
        except JobNotFoundError:
            raise TaskResultDoesNotExist(result_id) from None
        if found.name not in _JOB_NAMES and app.decode_input(found).get("task") != found.name:
            raise TaskResultDoesNotExist(result_id)  # not a Django task's job
        return _task_result(app, found, self.alias)


# -- each task its own job ------------------------------------------------------------------

_lock = threading.Lock()


def _task_handle(app: App, task: Any, attempts: int) -> JobHandle[Any]:
    """The job of ``task`` on ``app``, named by its import path (registered on first use):
    its queue is the task's, its attempts ``attempts`` (its backend's)."""
    name = task.module_path
    found = app.registry.job_named(name)
    if found is not None:
        return found
    with _lock:
        found = app.registry.job_named(name)
        if found is not None:
            return found
        run = _run_async if iscoroutinefunction(task.func) else _run
        made = job(name=name, queue=task.queue_name, retry=Retry(attempts=attempts))(run)
        app.register(types.SimpleNamespace(job=made))
        return made


def _our_backends() -> list[JobsBackend]:
    """The ``TASKS`` backends that are ``JobsBackend``s, by alias."""
    from django.conf import settings  # type: ignore[import-untyped]

    task_backends = _tasks("").task_backends
    found = [task_backends[alias] for alias in sorted(getattr(settings, "TASKS", {}))]
    return [backend for backend in found if isinstance(backend, JobsBackend)]


def _resolve(app: App, name: str) -> JobHandle[Any] | None:
    """The job of a name no module registered, when it is the import path of a Django task
    (a worker meets it on a claimed job; the job's input names the backend it was enqueued
    through, and its row the attempts that backend gave).

    None (the worker's unknown-job path: given back for a worker that has the code) only when
    this process lacks the code: the module is missing (a ``ModuleNotFoundError`` for the
    name's own module or a package above it) or has no task of that name. A module that is
    there but fails to import (a broken import inside it, an error at its top level) gives a
    job that fails each attempt with that very error, traceback included, under the row's
    attempts: the failure is the job's, visible in ``jobs show``, the logs and Django's
    ``result.errors``, rather than an hour's wait for a worker that knows the name."""
    if name in _JOB_NAMES:  # a row of an earlier release
        legacy = django_task if name == "django_task" else django_task_async
        app.register(types.SimpleNamespace(job=legacy))
        return legacy
    module_path, _, attr = name.rpartition(".")
    if not module_path:
        return None
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_path == missing or module_path.startswith(f"{missing}.")):
            return None
        return _unimportable(name, exc)
    except Exception as exc:
        return _unimportable(name, exc)
    found = getattr(module, attr, None)
    if not isinstance(found, _base.Task):
        return None
    task_backends = _tasks("").task_backends
    # An alias the settings lost: the row's own max_attempts still holds.
    backend = task_backends[found.backend] if found.backend in task_backends.settings else None
    return _task_handle(
        app, found, backend._max_attempts if isinstance(backend, JobsBackend) else 1
    )


def _unimportable(name: str, error: Exception) -> JobHandle[Any]:
    """A job named ``name`` whose every attempt raises ``error``, what importing its task's
    module raised. Not registered: the next job of the name tries the import again."""
    error.add_note(f"(raised by importing the module of the Django task {name!r} in the worker)")

    def fail(payload: Any) -> Any:
        raise error

    return job(name=name)(fail)


def prepare(app: App, *, discover: bool = True) -> App:
    """Make ``app`` run Django tasks: each task under its own import path when a worker meets
    it (and the rows of earlier releases, named ``django_task``), and, with ``discover``, the tasks
    of every installed application's ``tasks`` module registered now (so ``schedule`` and
    ``worker`` without ``-q`` see them). Idempotent."""
    app._add_job_resolver(_resolve)
    if discover:
        from django.apps import apps  # type: ignore[import-untyped]
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("tasks")
        mine = {b.alias: b for b in _our_backends() if b.app is app}
        for config in apps.get_app_configs():
            module = sys.modules.get(f"{config.name}.tasks")
            for value in vars(module).values() if module is not None else ():
                if isinstance(value, _base.Task) and value.backend in mine:
                    _task_handle(app, value, mine[value.backend]._max_attempts)
    return app


def _settings_app() -> App:
    """The App of the Django settings' ``TASKS`` (see ``app`` in the module), prepared."""
    import django  # type: ignore[import-untyped]
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]

    try:
        if not apps.ready:
            django.setup()
        backends = _our_backends()
    except ImproperlyConfigured as exc:
        raise ConfigurationError(
            f"Django is not configured: {exc}",
            fix="set DJANGO_SETTINGS_MODULE (e.g. DJANGO_SETTINGS_MODULE=myproject.settings)",
        ) from exc
    found: dict[int, App] = {}
    for backend in backends:
        found.setdefault(id(backend.app), backend.app)
    if len(found) != 1:
        named = ", ".join(f"{b.alias}: {b._app_ref}" for b in backends) or "none"
        raise ConfigurationError(
            f"the Django settings' TASKS name {len(found)} Apps through JobsBackend ({named})",
            fix="name one App in every JobsBackend's OPTIONS['APP'], or point --app at your "
            "App's module and call ultimat3.jobs.integrations.django.prepare(app) there",
        )
    return prepare(next(iter(found.values())))


def __getattr__(name: str) -> Any:
    """``app``: the App your Django settings' ``TASKS`` name, after ``django.setup()``, ready
    to run their tasks (``prepare``): ``ultimat3-jobs --app ultimat3.jobs.integrations.django``."""
    if name == "app":
        return _settings_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _migrate_job_tables(apps: Any, schema_editor: Any) -> None:
    """The Django migration's step: the job tables of every App that a ``JobsBackend`` on
    this database alias names, created or brought up to date by the library's own migrations
    (on a connection of the library's, outside Django's transaction)."""
    alias = schema_editor.connection.alias
    done: set[str] = set()
    for backend in _our_backends():
        if backend._database != alias:
            continue
        target = backend.app
        if target.url is None:
            target.open()
            continue
        if target.url in done:
            continue
        done.add(target.url)
        driver = open_driver(target.url, clock=target.clock)
        try:
            applied = driver.migrate()
        finally:
            driver.close()
        if applied:
            events.info("jobs.migrated", versions=applied)
