"""``ultimat3-jobs dashboard``: the dashboard on its own port, served by uvicorn.

The socket is bound here, before uvicorn starts, so a port in use is a clear error and the
address printed is the real one (``--port 0`` picks a free port)."""

from __future__ import annotations

import signal
import socket

import click

from ultimat3.jobs.app import App
from ultimat3.jobs.dashboard.security import BasicAuth, check_bind
from ultimat3.jobs.dashboard.web import create_app
from ultimat3.jobs.errors import ConfigurationError, missing_extra

__all__ = ["serve"]


def serve(
    app: App, *, host: str, port: int, read_only: bool, tenant: str | None, refresh: float
) -> None:
    """Serve ``app``'s dashboard until SIGTERM or Ctrl-C. Refuses a non-loopback ``host``
    unless basic auth is configured in the environment."""
    auth = BasicAuth.from_env()
    check_bind(host, auth)
    try:
        import uvicorn
    except ImportError as exc:
        raise missing_extra("serving the dashboard", "dashboard", exc) from exc
    asgi = create_app(app, read_only=read_only, tenant=tenant, auth=auth, refresh=refresh)
    display_url = app.driver.display_url  # opens (and checks) the database first
    sock = _listen(host.strip("[]"), port)
    bound = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    notes = [
        note
        for note in (
            "read-only" if read_only else "",
            f"tenant {tenant}" if tenant else "",
            "basic auth" if auth else "",
        )
        if note
    ]
    extra = f" ({', '.join(notes)})" if notes else ""
    click.echo(f"dashboard of {display_url} on http://{shown}:{bound}/{extra}", err=True)
    config = uvicorn.Config(asgi, log_level="warning", lifespan="off")
    # uvicorn stops gracefully on SIGTERM or SIGINT, then re-raises the signal to the handler
    # that was there before it: this one, so a stop by signal exits 0 as the worker does.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


def _stopped(signum: int, frame: object) -> None:
    """The signal that stopped the server, re-raised by uvicorn once it has stopped."""


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            fix="pick another --port (0: any free port), or stop what holds this one",
        ) from exc
    sock.listen(128)
    return sock
