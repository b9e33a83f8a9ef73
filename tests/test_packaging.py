"""The package says what it is: its version, its licence, its changelog, and no file outside
the repository it refers to."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import ultimat3.jobs

ROOT = Path(__file__).resolve().parent.parent


def test_version_comes_from_the_package_metadata() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert ultimat3.jobs.__version__ == metadata.version("ultimat3-jobs") == declared
    from ultimat3.jobs import __version__

    assert __version__ == declared


def test_metadata_has_a_licence_classifiers_and_an_author() -> None:
    meta = metadata.metadata("ultimat3-jobs")
    assert meta["License-Expression"] == "MIT"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert meta["Author"] == "The ultimat3-jobs authors"
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License\n\nCopyright (c) 2026 The ultimat3-jobs authors\n")


def test_the_changelog_keeps_a_changelog_and_covers_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "[Keep a Changelog](https://keepachangelog.com/en/1.1.0/)" in text
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.MULTILINE)
    assert sections, "no release section"
    first, date = sections[0]
    # Unreleased work sits on top; a released version carries its date.
    assert first == "Unreleased" or (first == ultimat3.jobs.__version__ and date)
    headings = set(re.findall(r"^### (\w+)$", text, re.MULTILINE))
    assert headings <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_nothing_refers_to_a_design_file_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offenders = [
        path
        for path in tracked
        if path != "tests/test_packaging.py"
        and (ROOT / path).is_file()
        and re.search(r"DESIGN(\.md| §)", (ROOT / path).read_text(errors="replace"))
    ]
    assert offenders == []
