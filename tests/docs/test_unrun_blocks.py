"""docs/index.md lists the code blocks the tests do not run (the fragments), page by page and
reason by reason, so that "every page's code is run by the tests" says exactly what it means."""

from __future__ import annotations

from collections import Counter

from .examples import ROOT, blocks, pages

INDEX = ROOT / "docs" / "index.md"
HEADING = "## What the tests do not run"
HEADER = "| page | blocks | why it is not run |"


def fragments() -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    for page in pages():
        for block in blocks(page):
            if "fragment" in block.marks:
                found[str(page.relative_to(ROOT)), block.marks["fragment"]] += 1
    return found


def table(found: Counter[tuple[str, str]]) -> str:
    rows = [HEADER, "|---|---|---|"]
    for (page, reason), n in sorted(found.items()):
        rows.append(f"| `{page}` | {n} | {reason.replace('|', '&#124;')} |")
    return "\n".join(rows)


def listed() -> str:
    text = INDEX.read_text()
    assert HEADING in text, f"docs/index.md has no section {HEADING!r}"
    section = text[text.index(HEADING) :]
    start = section.index(HEADER)
    lines = []
    for line in section[start:].split("\n"):
        if not line.startswith("|"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_index_lists_every_block_not_run() -> None:
    expected = table(fragments())
    assert listed() == expected, (
        "docs/index.md's table of the blocks the tests do not run is out of date; "
        f"replace it with:\n\n{expected}\n"
    )


def test_fragments_give_a_reason() -> None:
    blank = [
        block.where
        for page in pages()
        for block in blocks(page)
        if "fragment" in block.marks and not block.marks["fragment"].strip()
    ]
    assert not blank, f"fragments without a reason: {blank}"
