"""The web dashboard: see and steer the queues in a browser (extra ``[dashboard]``).

Serve it alone with ``ultimat3-jobs dashboard`` (127.0.0.1 by default), or mount the ASGI app
``create_app(app)`` in a Starlette, FastAPI or Litestar application. See ``docs/dashboard.md``.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    from ultimat3.jobs.errors import missing_extra

    raise missing_extra("the dashboard", "dashboard", exc) from exc

from ultimat3.jobs.dashboard.security import BasicAuth
from ultimat3.jobs.dashboard.views import Budget
from ultimat3.jobs.dashboard.web import HTMX_SHA256, HTMX_VERSION, create_app

__all__ = ["HTMX_SHA256", "HTMX_VERSION", "BasicAuth", "Budget", "create_app"]
