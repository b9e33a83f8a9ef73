"""Code blocks of Markdown pages, and how each is checked.

A fenced block is run unless the line before it is a mark (an HTML comment, invisible on the
rendered page) that says otherwise:

- ``<!-- test: file shop/jobs.py -->``: the block is that file of the page's project folder
  (parent packages get an ``__init__.py``); later blocks and commands import it.
- ``<!-- test: fragment, REASON -->``: the block cannot run on its own (REASON says why); it is
  compiled (Python), split into words (shell) or parsed (TOML), so it is at least well formed.
- ``<!-- test: background -->``: a shell block of one long-running command (``worker``,
  ``scheduler``, ``run``, ``relay``, ``dashboard``), started and left running while the page goes on; at the
  page's end it gets SIGTERM and must exit 0.
- ``<!-- test: stop, REASON -->``: the page's background commands get SIGTERM (and must exit
  0) before the block runs, as the page tells the reader to stop them (REASON says where).
- ``<!-- test: retry 30s -->``: the block is run again until it passes or the time is up (a
  check that waits for a background worker).
- ``<!-- test: postgres -->``: the page runs with ``$ULTIMAT3_JOBS_URL`` on a PostgreSQL
  database (the test fixtures' throwaway server).

Python blocks of a page share one module namespace and run in order, in a fresh project folder
that is the working directory. Shell blocks run each line: ``ultimat3-jobs ...`` and
``python ...`` lines run for real (a long-running command without ``background`` is started,
stopped with SIGTERM once it has said it is up, and must exit 0), anything else must be in a
fragment. ``text`` blocks are prose (output shown to the reader). Any other language is an
error, so that no block goes unchecked by accident.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^`]*$")
MARK = re.compile(r"^\s*<!--\s*test:\s*(?P<marks>.*?)\s*-->\s*$")
CODE_LANGUAGES = {"python", "sh", "toml"}
PROSE_LANGUAGES = {"text"}
LONG_RUNNING = {"worker", "scheduler", "run", "relay", "dashboard"}


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


MARK_WORDS = ("file", "fragment", "background", "stop", "retry", "postgres")


def parse_marks(text: str) -> dict[str, str]:
    """``fragment, REASON; postgres`` -> {"fragment": "REASON", "postgres": ""}: marks are
    separated by "; " before a mark word, so a reason may hold semicolons of its own."""
    marks: dict[str, str] = {}
    for part in re.split(r";\s*(?=(?:" + "|".join(MARK_WORDS) + r")\b)", text):
        word, _, rest = part.strip().partition(" ")
        word = word.rstrip(",")
        if word not in MARK_WORDS:
            raise ValueError(f"unknown test mark {word!r} in <!-- test: {text} -->")
        marks[word] = rest.strip()
    return marks


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().split("\n")
    i = 0
    previous = ""
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            if lines[i].strip():
                previous = lines[i]
            i += 1
            continue
        indent, fence, lang = match["indent"], match["fence"], match["lang"]
        body: list[str] = []
        start = i
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start + 1}: unclosed code block")
        mark = MARK.match(previous)
        marks = parse_marks(mark["marks"]) if mark else {}
        found.append(Block(page, start + 1, lang, "\n".join(body) + "\n", marks))
        previous = ""
        i += 1
    return found


def commands(block: Block) -> list[list[str]]:
    """The shell block's commands as words (continuation lines joined, comments dropped)."""
    joined = block.code.replace("\\\n", " ")
    words: list[list[str]] = []
    for line in joined.split("\n"):
        for command in re.split(r"\s&&\s", line):
            parts = shlex.split(command, comments=True)
            if parts:
                words.append(parts)
    return words
