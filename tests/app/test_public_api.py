"""The public surface is small, sorted and complete, and importing it pulls in no extra."""

from __future__ import annotations

import subprocess
import sys

import ultimat3.jobs
import ultimat3.jobs.testing


def test_all_is_sorted_and_complete() -> None:
    for module in (ultimat3.jobs, ultimat3.jobs.testing):
        names = list(module.__all__)
        # isort-style, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then functions.
        style = sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
        assert names == style, module.__name__
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_import_pulls_in_no_optional_dependency() -> None:
    code = (
        "import sys, ultimat3.jobs, ultimat3.jobs.cli, ultimat3.jobs.worker; "
        "bad = [m for m in ('psycopg', 'psycopg_pool', 'pydantic', 'starlette', 'jinja2', "
        "'uvicorn', 'sqlalchemy', 'prometheus_client', 'opentelemetry') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_error_has_a_cause_and_a_fix_field() -> None:
    from ultimat3.jobs import JobsError

    def walk(cls: type[JobsError]) -> list[type[JobsError]]:
        return [cls, *[c for sub in cls.__subclasses__() for c in walk(sub)]]

    for cls in walk(JobsError):
        err = cls()
        assert err.cause, cls
        assert isinstance(err.fix, str)
        assert err.exit_code == 1
