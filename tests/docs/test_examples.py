"""Every code block of README.md and docs/ runs (or, marked as a fragment, is well formed).

How blocks are marked and run: ``tests/docs/examples.py``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
import types
from pathlib import Path

import pytest

from .examples import (
    CODE_LANGUAGES,
    LONG_RUNNING,
    PROSE_LANGUAGES,
    ROOT,
    Block,
    blocks,
    commands,
    pages,
)

PAGES = pages()
START_TIME = 1.5
ON_POSTGRES = [p for p in PAGES if any("postgres" in b.marks for b in blocks(p))]
#: Pages whose project needs Django 6 (``django.tasks``); also run by
#: ``tests/integrations/test_guides.py`` in CI's Django 6 environment.
ON_DJANGO_6 = [ROOT / "docs" / "guides" / "django.md"]


def django_6() -> bool:
    try:
        import django
    except ImportError:
        return False
    return django.VERSION >= (6,)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


class Background(subprocess.Popen[str]):
    """A long-running command whose stderr a thread reads into ``lines`` as it comes: a worker
    writes a line per job, and an unread pipe (64 KiB) would block it inside its logging."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        super().__init__(argv, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._first = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.stderr is not None
        for line in self.stderr:
            self.lines.append(line)
            self._first.set()
        self._first.set()  # ended without a line

    def banner(self) -> str:
        """The first line, printed once the command's signal handlers are in place (cli/worker.py),
        so a SIGTERM from then on stops it gracefully."""
        if not self._first.wait(60):
            raise AssertionError(f"no banner within 60 s from {self.args}")
        return self.lines[0] if self.lines else ""

    def output(self) -> str:
        """Everything it wrote to stderr (once it has ended)."""
        self._reader.join(timeout=10)
        if not self._reader.is_alive() and self.stderr is not None:
            self.stderr.close()
        return "".join(self.lines)


class Project:
    """One page's folder, namespace and background processes."""

    def __init__(self, page: Path, folder: Path, env: dict[str, str]) -> None:
        self.page = page
        self.folder = folder
        self.env = env
        name = "docs_page_" + "".join(c if c.isalnum() else "_" for c in page_id(page))
        self.module = types.ModuleType(name)
        self.module.__file__ = str(folder / "__page__.py")
        sys.modules[name] = self.module
        self.background: list[tuple[Block, Background]] = []

    def run(self, block: Block) -> None:
        if block.lang not in CODE_LANGUAGES | PROSE_LANGUAGES:
            raise AssertionError(
                f"{block.where}: a {block.lang or 'plain'} block is neither run nor checked; "
                f"use one of {sorted(CODE_LANGUAGES | PROSE_LANGUAGES)}"
            )
        if block.lang in PROSE_LANGUAGES:
            return
        if "stop" in block.marks:
            while self.background:
                self.stop(*self.background.pop())
        retry = block.marks.get("retry")
        deadline = time.monotonic() + float(retry.rstrip("s")) if retry else 0.0
        while True:
            try:
                self._run(block)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _run(self, block: Block) -> None:
        fragment = "fragment" in block.marks
        if block.lang == "toml":
            tomllib.loads(block.code)
        elif block.lang == "python" and "file" in block.marks:
            self.write_file(block)
        elif block.lang == "python":
            code = compile(block.code, block.where, "exec")
            if not fragment:
                exec(code, self.module.__dict__)
        elif fragment:
            commands(block)  # well-formed shell words
        else:
            for words in commands(block):
                self.command(block, words)

    def write_file(self, block: Block) -> None:
        compile(block.code, block.where, "exec")
        path = self.folder / block.marks["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(self.folder).parents:
            if parent != Path(".") and not (self.folder / parent / "__init__.py").exists():
                (self.folder / parent / "__init__.py").write_text("")
        path.write_text(block.code)
        dotted = ".".join(path.relative_to(self.folder).with_suffix("").parts)
        sys.modules.pop(dotted, None)

    def command(self, block: Block, words: list[str]) -> None:
        env = dict(self.env)
        while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
            name, _, value = words[0].partition("=")  # NAME=value before the command
            env[name] = value
            words = words[1:]
        if words[0] == "ultimat3-jobs":
            argv = [sys.executable, "-m", "ultimat3.jobs", *words[1:]]
        elif words[0] == "python":
            argv = [sys.executable, *words[1:]]
        else:
            raise AssertionError(
                f"{block.where}: {words[0]!r} cannot run here; mark the block "
                "<!-- test: fragment, REASON -->"
            )
        subcommand = next((w for w in words[1:] if w in LONG_RUNNING), None)
        if subcommand is None:
            done = subprocess.run(
                argv, cwd=self.folder, env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, f"{block.where}: {shlex_join(words)}\n{done.stderr}"
            return
        proc = Background(argv, cwd=self.folder, env=env)
        banner = proc.banner()  # the command says it is up, or why it is not
        if subcommand == "dashboard":
            # uvicorn installs its signal handlers only once it serves, after the banner: a
            # SIGTERM before that would be lost, so give the start the time it takes.
            time.sleep(START_TIME)
        if "background" in block.marks:
            self.background.append((block, proc))
            if proc.poll() is not None:
                raise AssertionError(f"{block.where}: {shlex_join(words)} ended: {banner}")
            return
        self.stop(block, proc)

    def stop(self, block: Block, proc: Background) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait()
            raise AssertionError(
                f"{block.where}: did not stop within 30 s of SIGTERM\n{proc.output()}"
            ) from None
        output = proc.output()
        assert proc.returncode == 0, f"{block.where}: exit {proc.returncode}\n{output}"

    def close(self) -> None:
        from ultimat3.jobs import App

        for block, proc in self.background:
            self.stop(block, proc)
        modules = [self.module] + [
            m
            for m in list(sys.modules.values())
            if str(getattr(m, "__file__", "") or "").startswith(str(self.folder))
        ]
        for module in modules:
            for value in list(vars(module).values()):
                if isinstance(value, App):
                    value.close()
                elif type(value).__name__ == "Engine" and hasattr(value, "dispose"):
                    value.dispose()  # a page's SQLAlchemy engine: its connections closed now
        for name, module in list(sys.modules.items()):
            if module in modules:
                del sys.modules[name]


def shlex_join(words: list[str]) -> str:
    return shlex.join(words)


@pytest.fixture
def project_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("ULTIMAT3_JOBS_URL", "ULTIMAT3_JOBS_APP"):
        monkeypatch.delenv(name, raising=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ULTIMAT3_JOBS_")}
    env["PYTHONPATH"] = str(tmp_path)
    return env


def run_page(page: Path, folder: Path, env: dict[str, str]) -> None:
    project = Project(page, folder, env)
    try:
        for block in blocks(page):
            project.run(block)
    finally:
        project.close()


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ON_POSTGRES], ids=page_id)
def test_page_examples_run(page: Path, tmp_path: Path, project_env: dict[str, str]) -> None:
    if page in ON_DJANGO_6 and not django_6():
        pytest.skip("this page's project needs Django 6 (Python 3.12+)")
    run_page(page, tmp_path, project_env)


@pytest.mark.parametrize("page", ON_POSTGRES, ids=page_id)
def test_page_examples_run_on_postgres(
    page: Path,
    tmp_path: Path,
    project_env: dict[str, str],
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_dsn)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    monkeypatch.setenv("ULTIMAT3_JOBS_URL", url)
    project_env["ULTIMAT3_JOBS_URL"] = url
    run_page(page, tmp_path, project_env)


def test_every_page_has_a_checked_block() -> None:
    """The collector sees the pages' blocks (a parser that found none would pass them all)."""
    found = {page_id(p): len(blocks(p)) for p in PAGES}
    assert found["README.md"] >= 4
    assert all(n > 0 for name, n in found.items() if name not in NO_CODE), found


#: Pages that are prose or generated references, with no code block of their own.
NO_CODE = {
    "docs/cli.md",
    "docs/api.md",
    "docs/api-integrations.md",
    "docs/api-events.md",
    "docs/api-tracing.md",
    "docs/api-metrics.md",
    "docs/cron.md",
    "docs/guarantees.md",
}


def test_a_background_command_that_writes_much_to_stderr_is_not_blocked(tmp_path: Path) -> None:
    """A worker writes a line per job: far more than a pipe holds (64 KiB) must not block it."""
    code = (
        "import sys; print('up', file=sys.stderr, flush=True); "
        "sys.stderr.write('a job line\\n' * 50_000)"
    )
    proc = Background([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ))
    assert proc.banner() == "up\n"
    assert proc.wait(timeout=30) == 0
    assert len(proc.output().splitlines()) == 50_001
