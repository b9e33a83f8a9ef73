"""Every error the library raises on purpose, under one root.

Each error says what went wrong (``cause``) and what to do about it (``fix``), and carries the
exit code the command line uses for it. A class's docstring is its default message.

    JobsError
    ├── ConfigurationError          bad URL, bad option, bad duration, bad cron or zone
    │   ├── DurationError
    │   ├── CronError
    │   └── RegistrationError       a name or handle registered twice, an unknown job
    ├── SerializationError          input that does not survive a JSON round trip
    │   └── PayloadTooLargeError
    ├── DeserializationError        a stored payload that cannot be decoded
    ├── OutboxNoTxError             mode="required" and no transaction to join
    ├── DriverUnavailableError      the database cannot be reached or used
    │   └── EnqueueRefusedError     a write of ours failed in your transaction, which goes on
    │                               (retryable=False: in_callers_transaction)
    ├── JobNotFoundError
    ├── InvalidStateError           an action that the job's state does not allow
    ├── JobFailedError              a result asked of a job that ended dead or cancelled
    └── ResultTimeoutError          a result not there in time (also a TimeoutError)

Control flow is not an error: ``Snooze`` and ``Cancel`` (``ultimat3.jobs.job``) sit outside
this tree because a handler raises them to ask for something, not to report a failure.
"""

from __future__ import annotations

from typing import Any, ClassVar


class JobsError(Exception):
    """Something went wrong in ultimat3-jobs."""

    exit_code: ClassVar[int] = 1
    default_fix: ClassVar[str] = ""

    def __init__(self, cause: str | None = None, *, fix: str | None = None, **context: Any) -> None:
        self.cause = cause or (type(self).__doc__ or "").strip().splitlines()[0]
        self.fix = fix if fix is not None else self.default_fix
        self.context = context
        super().__init__(self.cause)

    def __str__(self) -> str:
        if self.fix:
            return f"{self.cause}\n  fix: {self.fix}"
        return self.cause

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON-ready data, for ``--json`` output and logs."""
        return {
            "error": type(self).__name__,
            "cause": self.cause,
            "fix": self.fix,
            **{k: v for k, v in self.context.items() if isinstance(v, str | int | float | bool)},
        }


class ConfigurationError(JobsError):
    """The configuration is not valid."""


def missing_extra(needs: str, extra: str, exc: ImportError) -> ConfigurationError:
    """The error of a feature whose optional dependency is not installed: ``needs`` says who
    needs it ("the dashboard"), ``extra`` names the extra that brings it."""
    return ConfigurationError(
        f"{needs} needs the [{extra}] extra ({exc.name or exc} is not installed)",
        fix=f"pip install 'ultimat3-jobs[{extra}]'",
    )


class DurationError(ConfigurationError):
    """The duration is not valid."""

    default_fix = (
        'write a number of seconds, a timedelta, or text such as "250ms", "90s", "1h30m", "2d"'
    )


class CronError(ConfigurationError):
    """The cron expression or time zone is not valid."""


class RegistrationError(ConfigurationError):
    """A job or task is registered in a way that cannot work."""


class SerializationError(JobsError, TypeError):
    """The job input cannot be stored as JSON.

    Also a ``TypeError``, as Python's ``json.dumps`` raises for the same values (and as
    Django's tasks contract expects of arguments it cannot store)."""

    def __init__(
        self, cause: str | None = None, *, path: str = "input", fix: str | None = None
    ) -> None:
        self.path = path
        super().__init__(cause, fix=fix, path=path)


class PayloadTooLargeError(SerializationError):
    """The job input is larger than the payload limit."""

    default_fix = (
        "store large data elsewhere (a table, a file, object storage) and pass its id, "
        "or raise the limit with App(payload_limit=...)"
    )


class DeserializationError(JobsError):
    """A stored job payload cannot be decoded."""

    default_fix = "inspect the row with `ultimat3-jobs jobs show ID`; it was written by another version or by hand"


class OutboxNoTxError(JobsError):
    """An enqueue ran outside any transaction while the outbox mode is "required"."""

    default_fix = (
        "enqueue inside `with app.transaction():` or `with app.using(conn):`, "
        "or pass outbox=False for an enqueue that must not wait for a transaction"
    )


class DriverUnavailableError(JobsError):
    """The job database cannot be used."""

    def __init__(
        self,
        cause: str | None = None,
        *,
        driver: str = "",
        fix: str | None = None,
        retryable: bool = True,
    ) -> None:
        self.driver = driver
        #: True when the same call may succeed later (the server is back, the lock is free,
        #: the standby was promoted); False when only a change (a migration, a fix) can help.
        self.retryable = retryable
        super().__init__(cause, fix=fix, driver=driver, retryable=retryable)


#: What every failure of an enqueue (or completion) inside a caller's transaction adds to its
#: fix: the library's write ran in a savepoint, which was rolled back (the rule of
#: ARCHITECTURE.md, "The life of a job").
KEPT_TRANSACTION = (
    "your transaction is still usable and holds nothing of this call (its savepoint was rolled "
    "back): go on with it, commit or roll back; retrying the call inside that same transaction "
    "is not the remedy, retry the whole transaction once the cause is gone"
)
#: What the fix says instead when the transaction did not survive the failure.
LOST_TRANSACTION = (
    "your whole transaction is lost (the database rolled it back, or it can only be rolled "
    "back now): roll it back if it is still open, and run it again from the start"
)


class EnqueueRefusedError(DriverUnavailableError):
    """A write of the library inside your transaction failed; your transaction goes on.

    An enqueue (or a completion) that joins your transaction writes in a savepoint of it. When
    the database refuses that write (another transaction holds the same idempotency key past
    your ``lock_timeout``, a ``statement_timeout``, a deadlock, a serialization failure, a row
    refused by a constraint or trigger of yours), the library rolls back to the savepoint and
    raises this error: ``cause`` names what happened, and your transaction goes on, holding
    nothing of the call, so you may commit your own rows or roll back. ``retryable`` is
    False: retrying the call inside the same transaction would meet the same cause; retry the
    whole transaction. A subclass of ``DriverUnavailableError``, so handlers of that catch it
    too. Rarely the transaction does not survive (SQLite rolls it back itself after a disk full
    or an I/O error); ``fix`` then says so."""

    def __init__(
        self, cause: str | None = None, *, driver: str = "", fix: str | None = None
    ) -> None:
        super().__init__(cause, driver=driver, fix=fix, retryable=False)


def in_callers_transaction(
    cause: str, *, driver: str, fix: str, kept: bool = True
) -> EnqueueRefusedError:
    """The error of a write of ours that failed inside a caller's transaction: an
    ``EnqueueRefusedError`` (``retryable=False``: the transaction is the caller's to retry, not
    ours), with ``KEPT_TRANSACTION`` after ``fix``; ``kept=False`` when the transaction did not
    survive (SQLite rolled it back itself after a full disk or an I/O error; PostgreSQL could
    not roll back to the savepoint), which the fix then says."""
    tail = KEPT_TRANSACTION if kept else LOST_TRANSACTION
    return EnqueueRefusedError(cause, driver=driver, fix=f"{fix}; {tail}" if fix else tail)


class JobNotFoundError(JobsError):
    """No job has that id."""

    default_fix = "list jobs with `ultimat3-jobs jobs list`; ids of pruned jobs are gone"


class InvalidStateError(JobsError):
    """The job's state does not allow this action."""


class JobFailedError(JobsError):
    """The job ended without a result (dead or cancelled).

    ``job`` is the job as read (``job.state``, ``job.errors[-1]`` for the last error,
    ``job.cancel_reason``); ``last_error`` is its last error, if any."""

    default_fix = "see every attempt with `ultimat3-jobs jobs show ID`"

    def __init__(
        self, cause: str | None = None, *, fix: str | None = None, job: Any = None
    ) -> None:
        self.job = job
        self.last_error = job.errors[-1] if job is not None and job.errors else None
        super().__init__(cause, fix=fix, **_about(job))


class ResultTimeoutError(JobsError, TimeoutError):
    """The job did not finish within the timeout.

    ``job`` is the job as last read (still scheduled, available or running)."""

    default_fix = "wait longer (timeout=...), or check that a worker serves the job's queue"

    def __init__(
        self, cause: str | None = None, *, fix: str | None = None, job: Any = None
    ) -> None:
        self.job = job
        super().__init__(cause, fix=fix, **_about(job))


def _about(job: Any) -> dict[str, Any]:
    """The context a result error carries about its job (a ``records.Job``, or None)."""
    return {} if job is None else {"job_id": job.id, "state": job.state.value}
