"""The public surface is small, sorted and complete, and importing it pulls in no extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("ultimat3.jobs.prometheus", "prometheus_client", "prometheus"),
        ("ultimat3.jobs.otel", "opentelemetry", "otel"),
        ("ultimat3.jobs.dashboard", "starlette", "dashboard"),
    ],
)
def test_a_feature_without_its_extra_says_which_extra_to_install(
    module: str, missing: str, extra: str
) -> None:
    # The dependency made unimportable, as in a venv without the extra.
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "from ultimat3.jobs.errors import ConfigurationError\n"
        f"try:\n    import {module}\nexcept ConfigurationError as e:\n"
        "    print(e.cause); print(e.fix)\nelse:\n    sys.exit(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    cause, fix = done.stdout.splitlines()
    assert f"needs the [{extra}] extra ({missing} is not installed)" in cause
    assert fix == f"pip install 'ultimat3-jobs[{extra}]'"


def test_every_error_has_a_cause_and_a_fix_field() -> None:
    from ultimat3.jobs import JobsError

    def walk(cls: type[JobsError]) -> list[type[JobsError]]:
        return [cls, *[c for sub in cls.__subclasses__() for c in walk(sub)]]

    for cls in walk(JobsError):
        err = cls()
        assert err.cause, cls
        assert isinstance(err.fix, str)
        assert err.exit_code == 1
