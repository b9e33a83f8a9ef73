"""Django's documented task-backend behaviours, run against ``JobsBackend``: what Django's own
backends (``ImmediateBackend``, ``DummyBackend``) and the ``django-tasks`` database backend are
tested for, adapted to a backend whose tasks run later in a worker. On SQLite and PostgreSQL,
each with the job tables in the same database as Django's data.

Adaptations, each on purpose: a task runs when a worker takes it (``drain``, or a worker in
background threads), not during ``enqueue``; a failed task is FAILED only once it will not run
again (one attempt unless ``OPTIONS["MAX_ATTEMPTS"]``), so a task with retries reads READY,
its failures in ``errors``, between attempts.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")
from django.db import connections, transaction

from ultimat3.jobs import App, ConfigurationError
from ultimat3.jobs.integrations.django import JobsBackend
from ultimat3.jobs.records import JobState
from ultimat3.jobs.testing import drain

from .djangoproject import point_at

try:  # Django 6; else the django-tasks backport on Django 5.2
    from django.tasks import TaskContext, TaskResultStatus, task, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
except ImportError:
    from django_tasks import (  # type: ignore[no-redef]
        TaskContext,
        TaskResultStatus,
        task,
        task_backends,  # type: ignore[no-redef, attr-defined]
    )
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]

try:
    from django.tasks.signals import logger as _task_logger
except ImportError:
    from django_tasks.signals import logger as _task_logger  # type: ignore[no-redef]

#: Where Django logs its tasks: "django.tasks" (the backport: "django_tasks").
LOGGER = _task_logger.name
CALLS: list[Any] = []
FLAKY: dict[str, int] = {}

# -- the tasks (Django's own test tasks, and a few of ours) -------------------------------------


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    CALLS.append((args, kwargs))


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    CALLS.append((args, kwargs))


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def structured() -> dict[str, Any]:
    return {"answer": 42, "pair": (1, 2), "ünï": "✓"}


@task()
def complex_return_value() -> Any:
    return datetime.now(UTC)  # not JSON


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task(takes_context=True)
def get_task_id(context: Any) -> str:
    return str(context.task_result.id)


@task(takes_context=True)
def check_context(context: Any, attempt: int) -> int:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt, (context.attempt, attempt)
    assert context.task_result.status == TaskResultStatus.RUNNING
    return int(context.attempt)


@task(takes_context=True)
def flaky(context: Any, fails: int) -> int:
    """Fails its first ``fails`` attempts, then returns the attempt it succeeded in."""
    if context.attempt <= fails:
        raise ValueError(f"attempt {context.attempt} fails")
    return int(context.attempt)


@task()
async def async_answer(n: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"n": n * 2, "thread": threading.current_thread().name}


@task()
async def async_failing() -> None:
    await asyncio.sleep(0)
    raise ValueError("async failure")


# -- the project's databases -----------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The conformance databases of this kind, fresh, with an App whose jobs live in the same
    database as Django's data (the ``u3j_django_conform:app`` the backends name)."""
    target = connections[f"conform_{request.param}"]
    url = point_at(target.alias, request, tmp_path / "conform.sqlite3")
    elsewhere = connections["elsewhere"]
    elsewhere.close()
    elsewhere.settings_dict["NAME"] = str(tmp_path / "elsewhere.sqlite3")
    app = App(url)
    app.open()
    module = types.ModuleType("u3j_django_conform")
    module.app = app  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    CALLS.clear()
    yield request.param
    sys.modules.pop(module.__name__, None)
    target.close()
    elsewhere.close()
    app.close()


@pytest.fixture
def alias(kind: str) -> str:
    return f"conform_{kind}"


@pytest.fixture
def backend(alias: str) -> JobsBackend:
    found = task_backends[alias]
    assert isinstance(found, JobsBackend)
    return found


@pytest.fixture
def app(kind: str) -> App:
    return sys.modules["u3j_django_conform"].app  # type: ignore[no-any-return]


def run_tasks(app: App) -> None:
    drain(app, queues=["default", "queue-1"])


# -- enqueue and get_result --------------------------------------------------------------------


def test_backend_capabilities(backend: JobsBackend) -> None:
    assert backend.supports_defer is True
    assert backend.supports_priority is True
    assert backend.supports_get_result is True
    assert backend.supports_async_task is True


def test_enqueue_task(alias: str, backend: JobsBackend) -> None:
    for t in (noop_task, noop_task_async):
        result = t.using(backend=alias).enqueue(1, two=3)
        assert result.status == TaskResultStatus.READY
        assert result.is_finished is False
        assert result.started_at is None and result.finished_at is None
        assert result.last_attempted_at is None
        assert result.enqueued_at is not None
        with pytest.raises(ValueError, match="Task has not finished yet"):
            result.return_value  # noqa: B018
        assert result.task == t.using(backend=alias)
        assert (result.args, result.kwargs) == ([1], {"two": 3})
        assert (result.attempts, result.worker_ids, result.errors) == (0, [], [])
        assert result.backend == alias


def test_enqueue_and_get_result_agree(alias: str, backend: JobsBackend) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    for t in (
        noop_task.using(backend=alias),
        noop_task.using(backend=alias, priority=7, queue_name="queue-1", run_after=later),
        noop_task_async.using(backend=alias),
    ):
        result = t.enqueue((1, 2), key={"nested": (3,)})
        again = backend.get_result(result.id)
        assert again == result
        assert t.get_result(result.id) == result


def test_async_enqueue_and_get_result_agree(alias: str, backend: JobsBackend) -> None:
    async def scenario() -> tuple[Any, Any, Any]:
        result = await noop_task.using(backend=alias).aenqueue(5)
        again = await backend.aget_result(result.id)
        via_task = await noop_task.using(backend=alias).aget_result(result.id)
        return result, again, via_task

    result, again, via_task = asyncio.run(scenario())
    assert result == again == via_task
    assert result.args == [5]


def test_get_missing_result(app: App, backend: JobsBackend) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("123")
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(backend.aget_result("123"))
    from ultimat3.jobs import job

    @job(name="plain")
    def plain(input: Any) -> None: ...

    app.register(types.SimpleNamespace(plain=plain))
    other = plain.enqueue({})
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(other.id)  # a job, but not a Django task's


def test_refresh_result(alias: str, app: App) -> None:
    result = calculate_meaning_of_life.using(backend=alias).enqueue()
    run_tasks(app)
    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    async_result = calculate_meaning_of_life.using(backend=alias).enqueue()
    run_tasks(app)
    asyncio.run(async_result.arefresh())
    assert async_result.return_value == 42


def test_validate_on_enqueue(alias: str) -> None:
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        noop_task.using(backend=alias, queue_name="unknown_queue").enqueue()


def test_arguments_django_refuses_raise_type_error_and_write_nothing(alias: str, app: App) -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        noop_task.using(backend=alias).enqueue(datetime.now(UTC))
    with pytest.raises(TypeError):
        noop_task.using(backend=alias).enqueue(when={"at": object()})
    assert app.list_jobs() == []


# -- running -----------------------------------------------------------------------------------


def test_run_enqueued_task(alias: str, app: App) -> None:
    for t in (noop_task, noop_task_async):
        CALLS.clear()
        result = t.using(backend=alias).enqueue(1, two=3)
        run_tasks(app)
        assert CALLS == [((1,), {"two": 3})]
        done = t.using(backend=alias).get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL
        assert done.is_finished is True
        assert done.return_value is None
        assert done.started_at is not None and done.finished_at is not None
        assert done.last_attempted_at == done.started_at
        assert done.finished_at >= done.started_at >= done.enqueued_at
        assert done.enqueued_at == result.enqueued_at
        assert done.attempts == 1 and len(done.worker_ids) == 1 and done.worker_ids[0]
        assert done.errors == []


def test_return_values_are_kept(alias: str, app: App) -> None:
    answer = calculate_meaning_of_life.using(backend=alias).enqueue()
    rich = structured.using(backend=alias).enqueue()
    run_tasks(app)
    assert answer.status == TaskResultStatus.READY, "the enqueue's result is a snapshot"
    assert calculate_meaning_of_life.using(backend=alias).get_result(answer.id).return_value == 42
    assert structured.using(backend=alias).get_result(rich.id).return_value == {
        "answer": 42,
        "pair": [1, 2],  # normalized to JSON, as Django does
        "ünï": "✓",
    }


def test_complex_return_value_fails_with_type_error(alias: str, app: App) -> None:
    result = complex_return_value.using(backend=alias).enqueue()
    run_tasks(app)
    failed = complex_return_value.using(backend=alias).get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed._return_value is None
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value  # noqa: B018
    assert failed.errors[0].exception_class is TypeError
    assert "Unsupported type" in failed.errors[0].traceback
    assert failed.finished_at is not None


@pytest.mark.parametrize(
    ("failing", "exception", "message"),
    [
        (failing_task_value_error, ValueError, "This task failed due to ValueError"),
        (failing_task_system_exit, SystemExit, "This task failed due to SystemExit"),
    ],
)
def test_catches_exception(
    alias: str,
    app: App,
    caplog: pytest.LogCaptureFixture,
    failing: Any,
    exception: type[BaseException],
    message: str,
) -> None:
    result = failing.using(backend=alias).enqueue()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run_tasks(app)
    errors = [r for r in caplog.records if r.name == LOGGER]
    assert len(errors) == 1
    assert message in caplog.text, "logged with its traceback"
    failed = failing.using(backend=alias).get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED, "one attempt: FAILED at once"
    assert app.get_job(result.id).state is JobState.DEAD
    assert failed.is_finished is True
    assert failed.started_at is not None and failed.finished_at is not None
    assert failed.finished_at >= failed.started_at >= failed.enqueued_at
    assert failed.errors[0].exception_class is exception
    assert failed.errors[0].exception_class_path == (
        f"{exception.__module__}.{exception.__qualname__}"
    )
    assert failed.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
    assert failed.attempts == 1


def test_complex_exception(alias: str, app: App) -> None:
    result = complex_exception.using(backend=alias).enqueue()
    run_tasks(app)
    failed = complex_exception.using(backend=alias).get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in failed.errors[0].traceback


def test_takes_context(alias: str, app: App) -> None:
    result = get_task_id.using(backend=alias).enqueue()
    checked = check_context.using(backend=alias).enqueue(1)
    run_tasks(app)
    assert get_task_id.using(backend=alias).get_result(result.id).return_value == result.id
    assert check_context.using(backend=alias).get_result(checked.id).return_value == 1


def test_cancelled_task_is_failed(alias: str, app: App) -> None:
    result = noop_task.using(backend=alias).enqueue()
    assert app.cancel_job(result.id)
    cancelled = noop_task.using(backend=alias).get_result(result.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.is_finished is True


# -- signals and logs --------------------------------------------------------------------------


def test_enqueue_logs(alias: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result = noop_task.using(backend=alias).enqueue()
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(logged) == 1
    assert "enqueued" in logged[0] and result.id in logged[0]


def test_run_logs(alias: str, app: App, caplog: pytest.LogCaptureFixture) -> None:
    result = noop_task.using(backend=alias).enqueue()
    failing = failing_task_value_error.using(backend=alias).enqueue()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        run_tasks(app)
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert [line for line in logged if result.id in line] == [
        f"Task id={result.id} path={noop_task.module_path} state=RUNNING",
        f"Task id={result.id} path={noop_task.module_path} state=SUCCESSFUL",
    ]
    mine = [line for line in logged if failing.id in line]
    assert [line.rsplit("state=", 1)[1] for line in mine] == ["RUNNING", "FAILED"]
    assert not any("NoneType" in line for line in logged)


def test_signals_carry_the_result(alias: str, app: App) -> None:
    try:
        from django.tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:
        from django_tasks.signals import (  # type: ignore[no-redef]
            task_enqueued,
            task_finished,
            task_started,
        )
    seen: list[tuple[str, Any]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, task_result))

        return receive

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    try:
        result = calculate_meaning_of_life.using(backend=alias).enqueue()
        run_tasks(app)
    finally:
        task_enqueued.disconnect(receivers["enqueued"])
        task_started.disconnect(receivers["started"])
        task_finished.disconnect(receivers["finished"])
    assert [name for name, _ in seen] == ["enqueued", "started", "finished"]
    enqueued, started, finished = (r for _, r in seen)
    assert enqueued == result
    assert (started.id, started.status, started.attempts) == (
        result.id,
        TaskResultStatus.RUNNING,
        1,
    )
    assert (finished.status, finished.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


# -- retries -----------------------------------------------------------------------------------


def test_retries_map_to_ready_until_the_last_attempt(kind: str, app: App, alias: str) -> None:
    """With ``MAX_ATTEMPTS`` 3: READY between attempts (failures already in ``errors``),
    SUCCESSFUL when a later attempt succeeds, FAILED only after the last one; ``worker_ids``
    has one worker per attempt, and the context knows the attempt."""
    retrying = f"retrying_{kind}"
    recovers = flaky.using(backend=retrying).enqueue(fails=1)
    exhausted = flaky.using(backend=retrying).enqueue(fails=5)
    assert app.get_job(recovers.id).max_attempts == 3
    assert app.get_job(flaky.using(backend=alias).enqueue(fails=0).id).max_attempts == 1
    run_tasks(app)
    between = flaky.using(backend=retrying).get_result(exhausted.id)
    assert between.status == TaskResultStatus.READY
    assert between.finished_at is None and between.is_finished is False
    assert between.attempts == 1 and len(between.errors) == 1
    assert between.errors[0].exception_class is ValueError
    for _ in range(2):
        for job_id in (recovers.id, exhausted.id):
            if app.get_job(job_id).state is JobState.SCHEDULED:
                _due_now(app, job_id)
        run_tasks(app)
    done = flaky.using(backend=retrying).get_result(recovers.id)
    assert (done.status, done.return_value, done.attempts) == (TaskResultStatus.SUCCESSFUL, 2, 2)
    failed = flaky.using(backend=retrying).get_result(exhausted.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 3 and len(failed.errors) == 3
    assert len(failed.worker_ids) == 3 and all(failed.worker_ids)
    assert "attempt 3 fails" in failed.errors[-1].traceback


def _due_now(app: App, job_id: str) -> None:
    """Skip the backoff: an operator's retry would not do (the job is not dead), so wait it
    out by moving the job's run_at on its own database."""
    job = app.get_job(job_id)
    assert job.state is JobState.SCHEDULED
    if app.driver.name == "sqlite":
        with app.transaction() as conn:
            conn.execute(
                "UPDATE x_jobs SET state = 'available', run_at = 0 WHERE id = ?", (job_id,)
            )
    else:
        with app.transaction() as conn:
            conn.execute(
                "UPDATE ultimat3_jobs.x_jobs SET state = 'available', run_at = now() WHERE id = %s",
                (job_id,),
            )


def test_bad_max_attempts_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="MAX_ATTEMPTS"):
        JobsBackend("bad", {"OPTIONS": {"APP": "x:app", "MAX_ATTEMPTS": 0}})


# -- async tasks -------------------------------------------------------------------------------


def test_async_tasks_run_on_the_workers_event_loop(alias: str, app: App) -> None:
    result = async_answer.using(backend=alias).enqueue(21)
    failing = async_failing.using(backend=alias).enqueue()
    assert app.get_job(result.id).name == result.task.module_path
    with app.worker(queues=["default"], concurrency=2, poll_interval="100ms"):
        value = app.result(result.id, timeout=60)
        with pytest.raises(Exception, match="async failure"):
            app.result(failing.id, timeout=60)
    assert value["n"] == 42
    assert value["thread"] == "ultimat3-jobs-asyncio", "awaited on the worker's loop"
    done = async_answer.using(backend=alias).get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == value
    failed = async_failing.using(backend=alias).get_result(failing.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is ValueError


def test_aenqueue_does_not_block_the_event_loop(alias: str, backend: JobsBackend) -> None:
    async def scenario() -> tuple[int, Any, Any]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        ticker = asyncio.create_task(tick())
        results = [await noop_task.using(backend=alias).aenqueue(i) for i in range(5)]
        again = await backend.aget_result(results[-1].id)
        ticker.cancel()
        return ticks, results[-1], again

    ticks, result, again = asyncio.run(scenario())
    assert result == again
    assert ticks > 0, "the loop ran while the enqueues waited on their thread"


# -- transactions ------------------------------------------------------------------------------


def test_enqueue_inside_atomic_joins_the_transaction(alias: str, app: App) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        lost = noop_task.using(backend=alias).enqueue("lost")
        raise RuntimeError("the view fails")
    with transaction.atomic(using=alias):
        kept = noop_task.using(backend=alias).enqueue("kept")
    assert [j.id for j in app.list_jobs()] == [kept.id]
    with pytest.raises(TaskResultDoesNotExist):
        task_backends[alias].get_result(lost.id)
    run_tasks(app)
    assert CALLS == [(("kept",), {})]


def test_enqueue_inside_atomic_on_another_database_raises(app: App) -> None:
    """The ``elsewhere`` backend joins a Django database that is not the job database, with
    no outbox: it cannot join, so it raises instead of committing on its own."""
    with pytest.raises(ConfigurationError), transaction.atomic(using="elsewhere"):
        noop_task.using(backend="elsewhere").enqueue()
    assert app.list_jobs() == []
