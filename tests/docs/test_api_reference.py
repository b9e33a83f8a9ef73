"""The API reference covers the public API, each name once, under its public path, and nothing
else; every public name has a docstring; the command-line reference prints no sentinel.

The public API is each public module's ``__all__`` (``PUBLIC_MODULES``), and the public methods
and properties of the classes in it. The reference is the site ``mkdocs build`` makes (the
headings mkdocstrings writes), so a name missing from ``docs/api*.md``, or hidden because it
has no docstring, fails here; docstrings are read by Griffe, as the reference reads them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .examples import ROOT, blocks, pages

griffe = pytest.importorskip("griffe", reason="the docs tools: pip install -e '.[docs]'")
pytest.importorskip("mkdocs", reason="the docs tools: pip install -e '.[docs]'")

#: The modules whose ``__all__`` is public (ultimat3.jobs' docstring: everything else is
#: private). A page that imports from any other module fails ``test_pages_import_public_modules``.
PUBLIC_MODULES = (
    "ultimat3.jobs",
    "ultimat3.jobs.testing",
    "ultimat3.jobs.dashboard",
    "ultimat3.jobs.events",
    "ultimat3.jobs.otel",
    "ultimat3.jobs.prometheus",
    "ultimat3.jobs.integrations.sqlalchemy",
    "ultimat3.jobs.integrations.django",
    "ultimat3.jobs.integrations.psycopg",
)

#: Public by name, private by nature: left out of the reference, each with the reason. A
#: name here that stops existing fails ``test_not_api_names_exist``.
NOT_API = {}

HEADING = re.compile(r'<h[1-6] id="(?P<id>ultimat3[\w.]*)" class="doc doc-heading"')
IMPORT = re.compile(
    r"^\s*(?:from\s+(ultimat3\.jobs[\w.]*)\s+import|import\s+(ultimat3\.jobs[\w.]*))", re.M
)


def load_package() -> Any:
    """``ultimat3`` as the reference sees it (with the docs' Griffe extension)."""
    spec = importlib.util.spec_from_file_location(
        "docs_griffe_public", ROOT / "docs" / "hooks" / "griffe_public.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loader = griffe.GriffeLoader(
        extensions=griffe.load_extensions(module.PublicPaths()),
        search_paths=[str(ROOT / "src")],
        docstring_parser=griffe.Parser("sphinx"),
    )
    loader.load("ultimat3")
    loader.resolve_aliases()
    return loader.modules_collection


def public_members(cls: Any, public_classes: set[str]) -> list[Any]:
    """The methods and properties of a class, without private names and dunders: those it
    defines, and those it inherits from a private class (one inherited from a public class
    is documented there)."""
    found = []
    for name, member in cls.all_members.items():
        if name.startswith("_"):
            continue
        if member.inherited and member.target.parent.path in public_classes:
            continue
        if member.is_function or (member.is_attribute and "property" in member.labels):
            found.append(member)
    return found


def public_api() -> dict[str, Any]:
    """Public path -> Griffe object, for every public name and public class member."""
    collection = load_package()
    api: dict[str, Any] = {}
    for module_path in PUBLIC_MODULES:
        module = collection.get_member(module_path)
        exports = module.exports
        assert exports, f"{module_path} has no __all__"
        for name in exports:
            api[f"{module_path}.{name}"] = module.members[name]
    public_classes = {obj.canonical_path for obj in api.values() if obj.is_class}
    for path, obj in list(api.items()):
        if obj.is_class:
            for member in public_members(obj, public_classes):
                api[f"{path}.{member.name}"] = member
    return api


@pytest.fixture(scope="module")
def everything() -> dict[str, Any]:
    return public_api()


@pytest.fixture(scope="module")
def api(everything: dict[str, Any]) -> dict[str, Any]:
    return {path: obj for path, obj in everything.items() if path not in NOT_API}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out


def reference_headings(site: Path) -> Counter[str]:
    found: Counter[str] = Counter()
    for page in site.rglob("*.html"):
        found.update(m["id"] for m in HEADING.finditer(page.read_text()))
    return found


def test_every_public_name_has_a_docstring(api: dict[str, Any]) -> None:
    missing = sorted(
        path for path, obj in api.items() if not (obj.docstring and obj.docstring.value.strip())
    )
    assert not missing, f"public names without a docstring: {missing}"


def test_every_public_name_is_in_the_reference_once(api: dict[str, Any], site: Path) -> None:
    headings = reference_headings(site)
    missing = sorted(path for path in api if headings[path] == 0)
    assert not missing, f"public names the reference does not show: {missing}"
    twice = sorted(path for path, n in headings.items() if n > 1)
    assert not twice, f"shown more than once: {twice}"


def test_not_api_names_exist(everything: dict[str, Any]) -> None:
    stale = sorted(set(NOT_API) - set(everything))
    assert not stale, f"NOT_API names that no longer exist (remove them): {stale}"


def test_the_reference_shows_nothing_private(api: dict[str, Any], site: Path) -> None:
    """Each heading is a public module, a public name under its public path, or a member of
    a public class (its methods, and attributes or enum members its docstrings describe)."""
    classes = tuple(f"{path}." for path, obj in api.items() if obj.is_class)
    allowed = set(PUBLIC_MODULES) | set(api)
    private = sorted(
        heading
        for heading in reference_headings(site)
        if heading in NOT_API or (heading not in allowed and not heading.startswith(classes))
    )
    assert not private, f"the reference shows private names or paths: {private}"


def test_pages_import_public_modules() -> None:
    """The pages teach imports from the modules the reference covers, and no other."""
    outside = sorted(
        f"{block.where}: {module}"
        for page in pages()
        for block in blocks(page)
        if block.lang == "python"
        for match in IMPORT.finditer(block.code)
        for module in [match[1] or match[2]]
        if module not in PUBLIC_MODULES
    )
    assert not outside, f"pages import from modules outside the reference: {outside}"


def test_cli_reference_has_no_sentinel(site: Path) -> None:
    page = (site / "cli" / "index.html").read_text()
    assert "Sentinel" not in page and "UNSET" not in page
    assert "<td><code>--app</code></td>" in page  # the options table is there at all


def test_the_reference_speaks_to_users(site: Path) -> None:
    """No wording from the project's history (the "seed" it was ported from, its
    ``registerJobs``) on a reference page."""
    leaks = [
        str(page.relative_to(site))
        for page in site.glob("api*/index.html")
        if re.search(r"\bseed\b|registerJobs", page.read_text(), re.I)
    ]
    assert not leaks
