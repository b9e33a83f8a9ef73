"""The dashboard outside the browser: the command (its bind rule, basic auth from the
environment, the headers of a real response), the pinned htmx file, and the pieces."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path

import pytest
from click.testing import CliRunner

from ultimat3.jobs import App
from ultimat3.jobs.cli import cli
from ultimat3.jobs.dashboard import HTMX_SHA256, HTMX_VERSION, BasicAuth, create_app
from ultimat3.jobs.dashboard.chart import throughput_svg
from ultimat3.jobs.dashboard.security import CSP, ENV_PASSWORD, ENV_USER, is_loopback
from ultimat3.jobs.errors import ConfigurationError

from .conftest import HERE, free_port, wait_until


def test_the_vendored_htmx_is_the_pinned_one() -> None:
    body = files("ultimat3.jobs.dashboard").joinpath("static", "htmx.min.js").read_bytes()
    assert hashlib.sha256(body).hexdigest() == HTMX_SHA256
    assert HTMX_VERSION.startswith("2.")


def test_basic_auth_from_the_environment() -> None:
    assert BasicAuth.from_env({}) is None
    auth = BasicAuth.from_env({ENV_USER: "ops", ENV_PASSWORD: "s3cret"})
    assert auth == BasicAuth("ops", "s3cret")
    assert "s3cret" not in repr(auth)
    with pytest.raises(ConfigurationError) as raised:
        BasicAuth.from_env({ENV_USER: "ops"})
    assert raised.value.cause == (
        f"${ENV_PASSWORD} is not set (or empty), but its partner is: basic auth needs both"
    )
    good = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert auth is not None and auth.accepts(good)
    for header in (
        None,
        "",
        "Basic !!",
        "Bearer x",
        "Basic " + base64.b64encode(b"ops:no").decode(),
    ):
        assert not auth.accepts(header), header


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("192.168.1.4", False),
        ("example.com", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_command_refuses_a_public_bind_without_auth(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    App(url).driver.close()
    env = {k: v for k, v in os.environ.items() if k not in (ENV_USER, ENV_PASSWORD)}
    result = CliRunner(env=env).invoke(cli, ["--url", url, "dashboard", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "refusing to serve the dashboard on '0.0.0.0' without auth" in result.stderr
    assert f"fix: set ${ENV_USER} and ${ENV_PASSWORD} (basic auth)" in result.stderr


def test_the_command_names_a_missing_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nothing.sqlite3'}"
    result = CliRunner().invoke(cli, ["--url", url, "dashboard"])
    assert result.exit_code == 1
    assert "no job database at" in result.stderr
    assert not (tmp_path / "nothing.sqlite3").exists()


def test_create_app_checks_its_arguments() -> None:
    app = App("memory://")
    with pytest.raises(ConfigurationError, match="tenant='' names no tenant"):
        create_app(app, tenant="")
    with pytest.raises(ConfigurationError, match="create_app needs an App, got str"):
        create_app("memory://")  # type: ignore[arg-type]


def test_the_command_serves_with_basic_auth_and_the_security_headers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    App(url).driver.close()
    port = free_port()
    env = {**os.environ, ENV_USER: "ops", ENV_PASSWORD: "s3cret", "PYTHONPATH": str(HERE)}
    log = (tmp_path / "dashboard.log").open("wb")
    # 0.0.0.0 is allowed once auth is configured.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ultimat3.jobs",
            "--app",
            "dashjobs:app",
            "--url",
            url,
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--read-only",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def status(path: str, auth: str | None = None) -> int:
            request = urllib.request.Request(base + path)
            if auth:
                request.add_header(
                    "Authorization", "Basic " + base64.b64encode(auth.encode()).decode()
                )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)
            except OSError:
                return 0

        wait_until(lambda: status("/") != 0, 30, "the dashboard to listen")
        assert status("/") == 401
        assert status("/", "ops:wrong") == 401
        assert status("/static/htmx.min.js") == 401  # nothing is served without auth
        request = urllib.request.Request(base + "/cron")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"ops:s3cret").decode())
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
            assert response.headers["content-security-policy"] == CSP
            assert response.headers["x-frame-options"] == "DENY"
            assert "HttpOnly" in response.headers["set-cookie"]
            assert "SameSite=strict" in response.headers["set-cookie"]
            page = response.read().decode()
        assert "nightly" in page and "<script>" not in page.replace(
            '<script src="/static/htmx.min.js" defer></script>', ""
        )
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
    assert "dashboard of sqlite:///" in (tmp_path / "dashboard.log").read_text()


def test_the_chart_escapes_its_label_and_stacks_its_bars() -> None:
    start = datetime(2031, 1, 1, tzinfo=UTC)
    starts = [start + timedelta(minutes=i) for i in range(3)]
    svg = throughput_svg(starts, [1, 0, 4], [1, 0, 0], label="<script>x</script>")
    assert "<script>" not in svg and "&lt;script&gt;x&lt;/script&gt;" in svg
    assert svg.count('class="bar-completed"') == 2 and svg.count('class="bar-dead"') == 1
    assert "peak 4/min" in svg
    with pytest.raises(ValueError, match="one completed and one dead count per bucket"):
        throughput_svg(starts, [1], [1, 2, 3], label="x")


def test_the_command_says_when_its_port_is_taken(tmp_path: Path) -> None:
    import socket

    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    App(url).driver.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["--url", url, "dashboard", "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "fix: pick another --port (0: any free port)" in result.stderr


def test_create_app_takes_the_budget_of_a_request() -> None:
    import asyncio

    from ultimat3.jobs.dashboard import Budget

    app = App("memory://")
    with pytest.raises(ConfigurationError, match="budget= must be a Budget, got dict"):
        create_app(app, budget={"bulk_limit": 7})  # type: ignore[arg-type]
    asgi = create_app(app, budget=Budget(bulk_limit=7))
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/dead",
        "raw_path": b"/dead",
        "query_string": b"",
        "headers": [],
        "scheme": "http",
        "server": ("test", 80),
        "client": ("127.0.0.1", 1),
        "root_path": "",
        "http_version": "1.1",
    }
    asyncio.run(asgi(scope, receive, send))  # type: ignore[arg-type]
    body = b"".join(m.get("body", b"") for m in sent)  # type: ignore[misc]
    assert sent[0]["status"] == 200
    assert b"(at most 7 per confirmation)" in body
