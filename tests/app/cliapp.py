"""The command line as a test meets it: an app module written to a temporary folder and
importable by ``--app name:app``, and ``run`` (the CLI in process, its exit code and
outputs)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ultimat3.jobs.cli import cli


def app_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, prefix: str
) -> Iterator[str]:
    """Write ``source`` (its ``URL`` replaced by a SQLite file in ``tmp_path``) as a module of
    its own and yield its ``--app`` reference; the module is forgotten afterwards."""
    name = f"{prefix}_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(
        source.replace("URL", repr(f"sqlite:///{tmp_path / 'cli.sqlite3'}"))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:app"
    sys.modules.pop(name, None)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr
