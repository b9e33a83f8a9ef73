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
    }}

``task.enqueue(...)`` becomes one ``django_task`` job whose input is the task's import path and
its JSON arguments; Django's ``priority`` (-100..100, higher first), ``queue_name`` and
``run_after`` map to the job's priority, queue and ``run_at``. Inside ``atomic()`` on the
``DATABASE`` alias it joins the transaction, as above; outside it commits at once.
``get_result(id)`` reads the job's state (READY, RUNNING, SUCCESSFUL, FAILED).

Limits: return values are not stored (``return_value`` is always None); an exception's class
is recorded by name only. Workers must serve the tasks' queues (``ultimat3-jobs worker -q
emails``) and import a module that calls ``django.setup()`` before the App is built. Async
tasks are not supported (``supports_async_task = False``). ``atomic()`` is sync-only in Django;
from async views, enqueue through ``sync_to_async``. On SQLite, give the database
``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` (Django 5.1+): a deferred ``atomic()`` that
reads before it enqueues can be refused the write lock, which only a retry of the whole
transaction fixes.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections  # type: ignore[import-untyped]
from django.utils import timezone  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from ultimat3.jobs.errors import ConfigurationError, JobNotFoundError
from ultimat3.jobs.job import job
from ultimat3.jobs.records import Job, JobState


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

if TYPE_CHECKING:
    from ultimat3.jobs.app import App

__all__ = ["JobsBackend", "django_task", "using"]

_STATUS = {
    JobState.SCHEDULED: TaskResultStatus.READY,
    JobState.AVAILABLE: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.DEAD: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}


@contextmanager
def using(app: App, alias: str | None = None) -> Iterator[Any]:
    """Enqueues in the block write through Django's connection ``alias`` (default
    ``"default"``): inside ``atomic()`` as part of it, outside it each on its own."""
    connection = connections[alias or DEFAULT_DB_ALIAS]
    connection.ensure_connection()
    with app.using(connection.connection):
        yield connection


@job(name="django_task")
def django_task(payload: dict[str, Any]) -> None:
    """Run one ``django.tasks`` task: ``{"task": import path, "args": [...], "kwargs": {...}}``."""
    task = import_string(payload["task"])
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    close_old_connections()
    try:
        if task.takes_context:
            task.call(
                TaskContext(task_result=_result(task, "", TaskResultStatus.RUNNING, args, kwargs)),
                *args,
                **kwargs,
            )
        else:
            task.call(*args, **kwargs)
    finally:
        close_old_connections()


def _result(
    task: Any,
    result_id: str,
    status: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    alias: str = "default",
    enqueued_at: datetime | None = None,
    source: Job | None = None,
) -> Any:
    return TaskResult(
        task=task,
        id=result_id,
        status=status,
        enqueued_at=enqueued_at,
        started_at=None if source is None else source.attempted_at,
        finished_at=None if source is None else source.finished_at,
        last_attempted_at=None if source is None else source.attempted_at,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=[]
        if source is None
        else [TaskError(exception_class_path=e.kind, traceback=e.traceback) for e in source.errors],
        worker_ids=[] if source is None or source.worker_id is None else [source.worker_id],
    )


class JobsBackend(BaseTaskBackend):  # type: ignore[misc]  # Django's classes are untyped
    """A ``django.tasks`` backend that stores tasks as ultimat3 jobs; see the module."""

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._app_ref: str | None = self.options.get("APP")
        self._database: str = self.options.get("DATABASE", DEFAULT_DB_ALIAS)

    @property
    def app(self) -> App:
        """The App of ``OPTIONS["APP"]`` (``module:attribute``), with ``django_task``
        registered on it."""
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
        if not value.knows(django_task):
            value.register(_Exports)
        return value

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        app = self.app
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):
            run_at = timezone.make_aware(run_at)
        payload = {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs)}
        options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": task.priority,
            "run_at": run_at,
        }
        if connections[self._database].in_atomic_block:
            with using(app, self._database):
                done = app.enqueue(django_task, payload, **options)
        else:
            done = app.enqueue(django_task, payload, **options)
        return _result(
            task,
            done.id,
            TaskResultStatus.READY,
            payload["args"],
            payload["kwargs"],
            alias=self.alias,
            enqueued_at=timezone.now(),
        )

    def get_result(self, result_id: str) -> Any:
        app = self.app
        try:
            found = app.get_job(result_id)
        except JobNotFoundError:
            raise TaskResultDoesNotExist(result_id) from None
        if found.name != "django_task":
            raise TaskResultDoesNotExist(result_id)
        payload = app.decode_input(found)
        return _result(
            import_string(payload["task"]),
            found.id,
            _STATUS[found.state],
            payload.get("args", []),
            payload.get("kwargs", {}),
            alias=self.alias,
            enqueued_at=found.created_at,
            source=found,
        )


class _Exports:
    """What ``app.register`` takes from this module: the one job that runs Django tasks."""

    django_task = django_task
