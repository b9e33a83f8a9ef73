"""``ultimat3-jobs dashboard``: the dashboard on its own port, served by uvicorn."""

from __future__ import annotations

import click

from ultimat3.jobs.app import App
from ultimat3.jobs.dashboard.security import BasicAuth, check_bind
from ultimat3.jobs.dashboard.web import create_app
from ultimat3.jobs.errors import ConfigurationError

__all__ = ["serve"]


def serve(
    app: App, *, host: str, port: int, read_only: bool, tenant: str | None, refresh: float
) -> None:
    """Serve ``app``'s dashboard until interrupted. Refuses a non-loopback ``host`` unless
    basic auth is configured in the environment."""
    auth = BasicAuth.from_env()
    check_bind(host, auth)
    try:
        import uvicorn
    except ImportError as exc:
        raise ConfigurationError(
            "serving the dashboard needs uvicorn, part of the [dashboard] extra",
            fix="pip install 'ultimat3-jobs[dashboard]'",
        ) from exc
    asgi = create_app(app, read_only=read_only, tenant=tenant, auth=auth, refresh=refresh)
    app.driver  # open (and check) the database before announcing the address  # noqa: B018
    shown = f"[{host}]" if ":" in host else host
    notes = [
        n
        for n in (
            "read-only" if read_only else "",
            f"tenant {tenant}" if tenant else "",
            "basic auth" if auth else "",
        )
        if n
    ]
    extra = f" ({', '.join(notes)})" if notes else ""
    click.echo(f"dashboard of {app.driver.display_url} on http://{shown}:{port}/{extra}", err=True)
    uvicorn.run(asgi, host=host, port=port, log_level="warning", lifespan="off")
