"""A live dashboard on 127.0.0.1 over real SQLite and real PostgreSQL, with a real worker
process, and one Chromium (Debian's /usr/bin/chromium, never `playwright install`) for the
session.

The server is uvicorn on a free port in a thread, serving a host Starlette application that
mounts three dashboards of one App: the full one at ``/``, a read-only one at ``/ro`` and a
tenant-scoped one (tenant ``acme``) at ``/t/acme`` (so mounting under a prefix is tested too).
Screenshots go to ``tests/dashboard/screenshots/`` (ignored by git), named
``<backend>-<page>.png``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs import App

HERE = Path(__file__).parent
SCREENSHOTS = HERE / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]
#: The tests' refresh period: a page shows a change within about this long, without a reload.
REFRESH = 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Site:
    backend: str
    url: str  # the job database
    base: str  # http://127.0.0.1:PORT
    app: App
    worker: subprocess.Popen[bytes]
    shots: list[Path] = field(default_factory=list)

    def shot(self, page: Any, name: str) -> None:
        path = SCREENSHOTS / f"{self.backend}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        self.shots.append(path)


@pytest.fixture(scope="session")
def screenshots() -> Path:
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    print(f"\nscreenshots: {SCREENSHOTS}")
    return SCREENSHOTS


# Module-scoped: Playwright's sync API keeps its event loop marked running on this thread while
# it is open, which would break later tests that call asyncio.run().
@pytest.fixture(scope="module")
def browser_context() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium package "
            "(apt-get install chromium; .ci/run does it). Never `playwright install`."
        )
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="u3j-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        context.set_default_timeout(15_000)
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


def _database_url(backend: str, request: pytest.FixtureRequest, tmp: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'jobs.sqlite3'}"
        return
    from psycopg.conninfo import conninfo_to_dict

    server = request.getfixturevalue("pg_server")
    template = request.getfixturevalue("pg_template")
    name = f"u3j_dash_{os.getpid()}_{backend}"
    server.drop_database(name)
    server.create_database(name, template=template)
    parts = conninfo_to_dict(server.dsn(name))
    try:
        yield f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    finally:
        server.drop_database(name)


@pytest.fixture(
    scope="session",
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, screenshots: Path
) -> Iterator[Site]:
    import dashjobs  # type: ignore[import-not-found]
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from ultimat3.jobs.dashboard import create_app

    backend = request.param
    tmp = tmp_path_factory.mktemp(f"dash-{backend}")
    urls = _database_url(backend, request, tmp)
    url = next(urls)
    app = App(url, modules=[dashjobs])
    app.driver  # noqa: B018 - migrate before the worker and the server start
    host = Starlette(
        routes=[
            Mount("/ro", app=create_app(app, read_only=True, refresh=REFRESH)),
            Mount("/t/acme", app=create_app(app, tenant="acme", refresh=REFRESH)),
            Mount("/", app=create_app(app, refresh=REFRESH)),
        ]
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(host, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name=f"dashboard-{backend}", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "uvicorn to start")
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ULTIMAT3_JOBS_URL": url}
    log = (tmp / "worker.log").open("wb")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ultimat3.jobs",
            "--app",
            "dashjobs:app",
            "worker",
            "--poll-interval",
            "100ms",
            "--concurrency",
            "4",
            # The last test leaves a cancelled nap running; the worker would notice the cancel
            # at its next heartbeat, or wait the default 10 s grace at SIGTERM (per backend).
            "--shutdown-grace",
            "1s",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        yield Site(backend, url, f"http://127.0.0.1:{port}", app, worker)
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
        server.should_exit = True
        thread.join(20)
        app.close()
        for _ in urls:
            pass


@pytest.fixture
def page(browser_context: Any) -> Iterator[Any]:
    """A fresh tab; fails the test on any CSP violation or page error it reports."""
    tab = browser_context.new_page()
    problems: list[str] = []
    tab.on(
        "console",
        lambda msg: (
            problems.append(msg.text)
            if msg.type == "error" and "Content Security Policy" in msg.text
            else None
        ),
    )
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    dialogs: list[str] = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    tab.dialogs = dialogs
    try:
        yield tab
    finally:
        tab.close()
    assert not problems, problems
    assert not dialogs, f"a dialog opened (a script ran?): {dialogs}"


sys.path.insert(0, str(HERE))
