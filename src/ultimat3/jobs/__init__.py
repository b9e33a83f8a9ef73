"""ultimat3-jobs: durable background jobs for Python.

Define jobs with ``@job``, cron tasks with ``task(...)``, register the modules that export them
with an ``App``, enqueue inside your database transaction, and run ``ultimat3-jobs worker``.
SQLite with no configuration; PostgreSQL with a URL.

The public names are the ones below (and ``__version__``, from the package metadata);
everything else is private and may change.
``ultimat3.jobs.testing`` holds the helpers for tests.
"""

from importlib import metadata as _metadata

from ultimat3.jobs.app import App
from ultimat3.jobs.clock import Clock, SystemClock
from ultimat3.jobs.errors import (
    ConfigurationError,
    CronError,
    DeserializationError,
    DriverUnavailableError,
    DurationError,
    EnqueueRefusedError,
    InvalidStateError,
    JobFailedError,
    JobNotFoundError,
    JobsError,
    OutboxNoTxError,
    PayloadTooLargeError,
    RegistrationError,
    ResultTimeoutError,
    SerializationError,
)
from ultimat3.jobs.job import Cancel, EnqueueResult, JobContext, JobHandle, Snooze, job
from ultimat3.jobs.limits import Limit, Rate, Unique
from ultimat3.jobs.records import (
    DEFAULT_QUEUE,
    AttemptError,
    FlowState,
    Job,
    JobState,
    QueueInfo,
)
from ultimat3.jobs.retry import DEFAULT_RETRY, Retry, next_retry, retry_schedule
from ultimat3.jobs.serialization import DATE, DATETIME, DECIMAL, UUID, Codec
from ultimat3.jobs.tasks import TaskHandle, task
from ultimat3.jobs.worker import Worker

__all__ = [
    "DATE",
    "DATETIME",
    "DECIMAL",
    "DEFAULT_QUEUE",
    "DEFAULT_RETRY",
    "UUID",
    "App",
    "AttemptError",
    "Cancel",
    "Clock",
    "Codec",
    "ConfigurationError",
    "CronError",
    "DeserializationError",
    "DriverUnavailableError",
    "DurationError",
    "EnqueueRefusedError",
    "EnqueueResult",
    "FlowState",
    "InvalidStateError",
    "Job",
    "JobContext",
    "JobFailedError",
    "JobHandle",
    "JobNotFoundError",
    "JobState",
    "JobsError",
    "Limit",
    "OutboxNoTxError",
    "PayloadTooLargeError",
    "QueueInfo",
    "Rate",
    "RegistrationError",
    "ResultTimeoutError",
    "Retry",
    "SerializationError",
    "Snooze",
    "SystemClock",
    "TaskHandle",
    "Unique",
    "Worker",
    "job",
    "next_retry",
    "retry_schedule",
    "task",
]


def __getattr__(name: str) -> str:
    """``__version__``, read from the installed package's metadata when first asked for."""
    if name == "__version__":
        try:
            return _metadata.version("ultimat3-jobs")
        except _metadata.PackageNotFoundError:
            raise AttributeError(
                "ultimat3.jobs.__version__: the ultimat3-jobs distribution is not installed "
                "(no package metadata); install it, e.g. pip install -e ."
            ) from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
