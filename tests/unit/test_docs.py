"""The documentation's code blocks: every ``python`` block compiles, and every other block is
marked on its first line as a config fragment (a URL, an ini file, a shell line, a log line),
so no block reads as runnable code that nothing checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
PAGES = sorted(DOCS.glob("*.md"))


def blocks(page: Path) -> list[tuple[str, str, int]]:
    text = page.read_text()
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)
    ]


def test_there_are_pages_with_code() -> None:
    assert DOCS / "production-postgres.md" in PAGES
    assert any(lang == "python" for lang, _, _ in blocks(DOCS / "production-postgres.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_compile_and_the_rest_are_marked_fragments(page: Path) -> None:
    found = blocks(page)
    assert found, f"{page.name} has no code block"
    for lang, body, line in found:
        where = f"{page.name}:{line}"
        if lang == "python":
            compile(body, where, "exec")
        else:
            first = body.splitlines()[0] if body else ""
            assert lang and "config fragment" in first, (
                f"{where}: a ```{lang} block must be python (compiled by this test) or start "
                "with a comment saying it is a config fragment"
            )
