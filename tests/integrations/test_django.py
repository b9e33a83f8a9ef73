"""Django: enqueues inside ``atomic()`` write through Django's connection (commit runs the job
once, rollback never, a rolled-back inner ``atomic()`` drops only its jobs), and the
``django.tasks`` backend maps a task's priority, queue and run-after onto the job.

Django's settings are process-wide, so they are configured when this module is imported; each
test points the ``default`` alias at a fresh SQLite file. On Python 3.11 Django 6 cannot be
installed: these tests run Django 5.2 with the ``django-tasks`` backport (the backend imports
``django.tasks`` first when it exists).
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")
from django.db import connection, connections, transaction

from ultimat3.jobs import App, job
from ultimat3.jobs.integrations.django import JobsBackend, django_task, prepare, using
from ultimat3.jobs.records import JobState
from ultimat3.jobs.testing import drain

from .conftest import JOBS, RUNS, deliver, record
from .djangoproject import point_at

try:
    from django.tasks import task  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    from django_tasks import task

TASK_CALLS: list[Any] = []


@task()
def send_mail(to: str, subject: str = "") -> None:
    TASK_CALLS.append((to, subject))


@pytest.fixture(params=["same", "outbox"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    data = tmp_path / "django.sqlite3"
    connection.close()
    connection.settings_dict["NAME"] = str(data)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE orders (id integer)")
    if request.param == "same":
        made = App(f"sqlite:///{data}", modules=[JOBS])
        made.open()  # as `ultimat3-jobs migrate` or a worker's start would, before any request
    else:
        made = App(
            f"sqlite:///{tmp_path / 'jobs.sqlite3'}", modules=[JOBS], outbox=f"sqlite:///{data}"
        )
        made.relay()  # opens and migrates the outbox
    module = types.ModuleType("u3j_django_app")
    module.app = made  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    TASK_CALLS.clear()
    yield made
    sys.modules.pop(module.__name__, None)
    connection.close()
    made.close()


def orders() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM orders")
        return int(cursor.fetchone()[0])


def test_atomic_commit_runs_the_job_once(app: App) -> None:
    with transaction.atomic(), using(app):
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders VALUES (1)")
        record.enqueue({"order": 1})
    assert orders() == 1
    assert deliver(app) == [{"order": 1}]
    assert deliver(app) == [{"order": 1}]


def test_atomic_rollback_never_runs_it(app: App) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(), using(app):
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders VALUES (1)")
        record.enqueue({"order": 1})
        raise RuntimeError("the view fails")
    assert orders() == 0
    assert deliver(app) == []


def test_a_rolled_back_inner_atomic_drops_only_its_jobs(app: App) -> None:
    with transaction.atomic(), using(app):
        record.enqueue({"step": "outer"})
        with pytest.raises(RuntimeError), transaction.atomic():
            record.enqueue({"step": "inner"})
            raise RuntimeError("roll back the savepoint")
    assert [r["step"] for r in deliver(app)] == ["outer"]


def test_outside_atomic_each_enqueue_commits_on_its_own(app: App) -> None:
    with using(app):
        record.enqueue({"step": "autocommit"})
    assert [r["step"] for r in deliver(app)] == ["autocommit"]


def test_the_task_backend_joins_atomic_and_maps_the_options(app: App) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        send_mail.enqueue("lost@example.com")
        raise RuntimeError("the view fails")
    later = datetime.now(UTC) + timedelta(hours=1)
    with transaction.atomic():
        now_result = send_mail.using(priority=7, queue_name="emails").enqueue(
            "a@example.com", subject="hi"
        )
        later_result = send_mail.using(run_after=later).enqueue("b@example.com")
    if app._outbox is not None:
        assert app.relay().tick() == 2
    job = app.get_job(now_result.id)
    assert (job.name, job.queue, job.priority) == (send_mail.module_path, "emails", 7)
    assert job.max_attempts == 1  # Django gives one attempt
    assert app.get_job(later_result.id).run_at == later
    assert app.get_job(later_result.id).state is JobState.SCHEDULED
    backend = send_mail.get_backend()
    assert isinstance(backend, JobsBackend)
    assert backend.get_result(now_result.id).status == "READY"
    drain(app, queues=["default", "emails"])
    assert TASK_CALLS == [("a@example.com", "hi")]
    assert backend.get_result(now_result.id).status == "SUCCESSFUL"
    assert RUNS == []


# -- Django's usual shape: the App is built at import time, and the first request writes
# inside atomic() (on SQLite that takes the write lock) before it enqueues. The schema was
# migrated beforehand (`ultimat3-jobs migrate`, or a worker's start), so opening is a read.


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, App]]:
    alias = f"fresh_{request.param}"
    url = point_at(alias, request, tmp_path / "fresh.sqlite3")
    migrated = App(url)
    migrated.open()
    migrated.close()
    with connections[alias].cursor() as cursor:
        cursor.execute("CREATE TABLE orders (id integer)")
    built_at_import = App(url, modules=[JOBS])  # never opened before the request
    module = types.ModuleType("u3j_django_fresh")
    module.app = built_at_import  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    TASK_CALLS.clear()
    yield alias, built_at_import
    sys.modules.pop(module.__name__, None)
    connections[alias].close()
    built_at_import.close()


def _orders(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM orders")
        return int(cursor.fetchone()[0])


def test_a_fresh_app_joins_the_first_requests_atomic_at_once(fresh: tuple[str, App]) -> None:
    alias, app = fresh
    started = time.monotonic()
    with pytest.raises(RuntimeError), transaction.atomic(using=alias), using(app, alias):
        with connections[alias].cursor() as cursor:
            cursor.execute("INSERT INTO orders VALUES (1)")
        record.enqueue({"order": 1})
        raise RuntimeError("the view fails")
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute("INSERT INTO orders VALUES (2)")
        with using(app, alias):
            record.enqueue({"order": 2})
    assert time.monotonic() - started < 2.0, "nothing waited for the caller's own lock"
    assert _orders(alias) == 1
    assert deliver(app) == [{"order": 2}]


def test_the_task_backend_of_a_fresh_app_joins_the_first_requests_atomic(
    fresh: tuple[str, App],
) -> None:
    alias, app = fresh
    started = time.monotonic()
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute("INSERT INTO orders VALUES (1)")
        send_mail.using(backend=alias).enqueue("lost@example.com")
        raise RuntimeError("the view fails")
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute("INSERT INTO orders VALUES (2)")
        kept = send_mail.using(backend=alias).enqueue("kept@example.com")
    assert time.monotonic() - started < 2.0
    assert [j.id for j in app.list_jobs()] == [kept.id]
    drain(app)
    assert TASK_CALLS == [("kept@example.com", "")]


def test_a_workers_app_runs_each_task_under_its_own_name(fresh: tuple[str, App]) -> None:
    """A worker process has its own App object, which no enqueue registered anything on:
    ``prepare`` (what ``--app ultimat3.jobs.integrations.django`` runs) makes it run the
    tasks, each job named by its task's import path, with the one attempt Django gives."""
    alias, app = fresh
    result = send_mail.using(backend=alias).enqueue("w@example.com")
    # A row of an earlier release, which named every task's job django_task.
    app.register(types.SimpleNamespace(job=django_task))
    app.enqueue(
        django_task,
        {
            "task": send_mail.module_path,
            "args": ["old@example.com"],
            "kwargs": {},
            "backend": alias,
            "enqueued_at": datetime.now(UTC).isoformat(),
        },
        max_attempts=1,
    )
    worker_app = App(app.url)
    sys.modules["u3j_django_fresh"].app = worker_app  # type: ignore[attr-defined]
    try:
        prepare(worker_app, discover=False)
        assert drain(worker_app, queues=["default"]).completed == 2  # as `worker -q default`
        assert sorted(TASK_CALLS) == [("old@example.com", ""), ("w@example.com", "")]
        done = worker_app.get_job(result.id)
        assert (done.name, done.state, done.max_attempts) == (
            send_mail.module_path,
            JobState.COMPLETED,
            1,
        )
        assert worker_app.registry.job_named(send_mail.module_path) is not None
    finally:
        worker_app.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_manage_py_migrate_creates_the_job_tables(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """With the integration in INSTALLED_APPS, ``migrate`` brings the job tables of the App a
    backend names on that alias up to date, through the library's own migrations."""
    from django.apps import apps
    from django.core.management import call_command

    from ultimat3.jobs.drivers import open_driver

    alias = f"fresh_{kind}"
    target = connections[alias]
    target.close()
    if kind == "sqlite":
        target.settings_dict["NAME"] = str(tmp_path / "fresh.sqlite3")
        url = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    else:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(request.getfixturevalue("pg_empty_dsn"))
        target.settings_dict.update(
            NAME=parts["dbname"], USER=parts["user"], HOST=parts["host"], PORT=parts["port"]
        )
        url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    module = types.ModuleType("u3j_django_fresh")
    module.app = App(url)  # type: ignore[attr-defined]  # never opened: it would migrate
    sys.modules[module.__name__] = module
    apps.set_installed_apps(["ultimat3.jobs.integrations.django"])
    try:
        driver = open_driver(url)
        try:
            assert not driver.schema_current()
            call_command("migrate", "ultimat3_jobs", database=alias, verbosity=0)
            assert driver.schema_current()
        finally:
            driver.close()
    finally:
        apps.unset_installed_apps()
        sys.modules.pop(module.__name__, None)
        target.close()


def test_a_task_module_that_fails_to_import_fails_its_job_with_that_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker meets job names no module registered. A module that is missing, or has no
    task of that name, is code this worker lacks: the job waits for one that has it. A module
    that is there but fails to import fails the job with the very error (its traceback names
    the broken line), rather than passing for an unknown name and dead-lettering it as
    ``unknown_job`` an hour later."""
    (tmp_path / "u3j_broken_tasks.py").write_text("import u3j_no_such_dependency\n")
    (tmp_path / "u3j_raising_tasks.py").write_text("raise RuntimeError('SHOP_API_KEY is unset')\n")
    (tmp_path / "u3j_fine_tasks.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = {
        "broken": "u3j_broken_tasks.send",
        "raising": "u3j_raising_tasks.send",
        "no module": "u3j_gone_tasks.send",
        "no package": "u3j_gone_pkg.tasks.send",
        "no task": "u3j_fine_tasks.send",
    }
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    handles = {label: job(name=name)(lambda payload: None) for label, name in names.items()}
    enqueuer = App(
        url, modules=[types.SimpleNamespace(**{f"j{i}": h for i, h in enumerate(handles.values())})]
    )
    ids = {label: enqueuer.enqueue(h, {}, max_attempts=1).id for label, h in handles.items()}
    enqueuer.close()
    worker_app = prepare(App(url), discover=False)
    try:
        stats = drain(worker_app, queues=["default"])
        assert (stats.dead, stats.released, stats.completed) == (2, 3, 0)
        broken = worker_app.get_job(ids["broken"])
        assert broken.state == JobState.DEAD
        (error,) = broken.errors
        assert (error.kind, error.exception_path) == (
            "ModuleNotFoundError",
            "builtins.ModuleNotFoundError",
        )
        assert "u3j_no_such_dependency" in error.message
        assert "u3j_broken_tasks.py" in error.traceback
        assert "the Django task 'u3j_broken_tasks.send'" in error.traceback
        raising = worker_app.get_job(ids["raising"])
        assert raising.state == JobState.DEAD
        assert (raising.errors[0].kind, raising.errors[0].message) == (
            "RuntimeError",
            "SHOP_API_KEY is unset",
        )
        for label in ("no module", "no package", "no task"):
            waiting = worker_app.get_job(ids[label])
            assert (waiting.state, waiting.errors) == (JobState.AVAILABLE, ()), label
    finally:
        worker_app.close()
        sys.modules.pop("u3j_fine_tasks", None)
