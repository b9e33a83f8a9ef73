"""The dashboard as an ASGI application (Starlette routes, Jinja2 pages, htmx refresh).

``create_app(app)`` returns an ASGI app to mount anywhere (Starlette ``Mount``, FastAPI
``app.mount``, Litestar ``asgi`` handler) or to serve alone (``ultimat3-jobs dashboard``).
Every page is a GET that changes nothing; every change is a POST that carries the CSRF token,
and a ``read_only`` dashboard has no button that would post and answers every POST with 405.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ultimat3.jobs.app import App
from ultimat3.jobs.dashboard import views
from ultimat3.jobs.dashboard.chart import throughput_svg
from ultimat3.jobs.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SECURITY_HEADERS,
    BasicAuth,
    csrf_matches,
    new_csrf_token,
)
from ultimat3.jobs.duration import format_duration
from ultimat3.jobs.errors import ConfigurationError, JobsError
from ultimat3.jobs.records import JobState

__all__ = ["HTMX_SHA256", "HTMX_VERSION", "create_app"]

HTMX_VERSION = "2.0.11"
"""The version of htmx the dashboard ships (static/htmx.min.js, from the npm package
htmx.org)."""
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"
"""The SHA-256 of that file: a test checks the vendored copy against it."""

_STATIC = files("ultimat3.jobs.dashboard").joinpath("static")
_ASSETS = {"htmx.min.js": "text/javascript", "dashboard.css": "text/css"}
_ACTIONS = ("retry", "discard")


def create_app(
    app: App,
    *,
    read_only: bool = False,
    tenant: str | None = None,
    auth: BasicAuth | None = None,
    refresh: float = 3.0,
    budget: views.Budget = views.DEFAULT_BUDGET,
) -> ASGIApp:
    """The dashboard of ``app`` as an ASGI application.

    ``read_only`` shows everything and changes nothing (no button; a POST answers 405).
    ``tenant`` scopes every page to that tenant's jobs: another tenant's job answers 404, and
    the pages about shared things (cron tasks, workers, pausing queues) are left out.
    ``auth`` checks HTTP basic auth on every request; leave it None only where the host
    application's own auth stands in front (or on a loopback bind). ``refresh`` is how often,
    in seconds, a page refreshes its live part (0: never). ``budget`` bounds what one request
    reads or changes (``Budget``: a text search's time, a filter's window, a bulk action's size).
    """
    if not isinstance(app, App):
        raise ConfigurationError(
            f"create_app needs an App, got {type(app).__name__}",
            fix="pass the App your jobs are registered on: create_app(app)",
        )
    if tenant is not None and not tenant:
        raise ConfigurationError(
            "tenant='' names no tenant", fix="pass the tenant id, or tenant=None for all jobs"
        )
    if refresh < 0:
        raise ConfigurationError(
            f"refresh={refresh!r} is negative", fix="pass seconds >= 0 (0: no live refresh)"
        )
    if not isinstance(budget, views.Budget):
        raise ConfigurationError(
            f"budget= must be a Budget, got {type(budget).__name__}",
            fix="pass budget=Budget(scan_seconds=0.04, window=10_000, bulk_limit=1_000)",
        )
    site = _Site(app, read_only=read_only, tenant=tenant, refresh=refresh, budget=budget)
    routes = [
        Route("/", site.overview, name="overview"),
        Route("/jobs", site.jobs, name="jobs"),
        Route("/jobs/{job_id}", site.job, name="job"),
        Route("/dead", site.dead, name="dead"),
        Route("/queues", site.queues, name="queues"),
        Route("/static/{asset}", site.asset, name="static"),
    ]
    if tenant is None:
        routes += [
            Route("/cron", site.cron, name="cron"),
            Route("/workers", site.workers, name="workers"),
        ]
    if read_only:
        routes.append(Route("/actions/{what:path}", site.refuse_change, methods=["POST"]))
    else:
        routes.append(Route("/actions/jobs", site.act_jobs, methods=["POST"]))
        if tenant is None:
            routes.append(Route("/actions/queues", site.act_queue, methods=["POST"]))
    starlette = Starlette(
        routes=routes,
        exception_handlers={
            JobsError: site.error,
            404: site.not_found,
            405: site.not_allowed,
        },
    )
    return _Guard(starlette, auth)


class _Guard:
    """Basic auth (when configured) before anything, and the security headers on every
    response."""

    def __init__(self, inner: ASGIApp, auth: BasicAuth | None) -> None:
        self.inner = inner
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for key, value in SECURITY_HEADERS.items():
                    if key.encode() not in present:
                        headers.append((key.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        if self.auth is not None:
            header = dict(scope.get("headers", [])).get(b"authorization")
            if not self.auth.accepts(header.decode("latin-1") if header else None):
                response = Response(
                    "authentication required\n",
                    status_code=401,
                    media_type="text/plain",
                    headers={"www-authenticate": f'Basic realm="{self.auth.realm}"'},
                )
                await response(scope, receive, send_with_headers)
                return
        await self.inner(scope, receive, send_with_headers)


def _ago(delta: timedelta | None) -> str:
    if delta is None:
        return "-"
    seconds = int(delta.total_seconds())
    if seconds < 1:
        return "now"
    return format_duration(timedelta(seconds=seconds))


_Action = Callable[["_Site", Request, FormData], Awaitable[Response]]


def _checked(action: _Action) -> Callable[[_Site, Request], Awaitable[Response]]:
    """A POST endpoint that runs only once the form's CSRF token matches its cookie; any other
    POST is refused with 403 before its fields are looked at."""

    @functools.wraps(action)
    async def endpoint(site: _Site, request: Request) -> Response:
        form = await request.form()
        submitted = form.get(CSRF_FIELD)
        cookie = request.cookies.get(CSRF_COOKIE)
        if not csrf_matches(cookie, submitted if isinstance(submitted, str) else None):
            return Response(
                "refused: the form's CSRF token is missing or does not match (reload the page "
                "and submit again)\n",
                status_code=403,
                media_type="text/plain",
            )
        return await action(site, request, form)

    return endpoint


class _Site:
    def __init__(
        self,
        app: App,
        *,
        read_only: bool,
        tenant: str | None,
        refresh: float,
        budget: views.Budget,
    ) -> None:
        self.app = app
        self.read_only = read_only
        self.tenant = tenant
        self.refresh = refresh
        self.budget = budget
        self.env = Environment(
            loader=PackageLoader("ultimat3.jobs.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["ts"] = _ts
        self.env.filters["ago"] = _ago
        self.env.filters["duration"] = format_duration
        self.env.globals["states"] = [s.value for s in JobState]

    # -- rendering ---------------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        token = request.cookies.get(CSRF_COOKIE)
        fresh = not token
        if not token:
            token = new_csrf_token()
        base = _base(request)

        def url(path: str, **query: str) -> str:
            q = {k: v for k, v in query.items() if v}
            return base + path + ("?" + urlencode(q) if q else "")

        html = self.env.get_template(template).render(
            request=request,
            base=base,
            url=url,
            here=request.url.path + ("?" + request.url.query if request.url.query else ""),
            csrf=Markup(
                f'<input type="hidden" name="{CSRF_FIELD}" value="{Markup.escape(token)}">'
            ),
            **{
                "read_only": self.read_only,
                "tenant": self.tenant,
                "refresh": self.refresh,
                "htmx_version": HTMX_VERSION,
                "rendered_at": _ts(self.app.clock.now()),
                **context,
            },
        )
        response = HTMLResponse(html, status_code=status_code)
        response.headers["cache-control"] = "no-store"
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                path=base or "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    async def error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, JobsError)
        status = 400 if isinstance(exc, ConfigurationError) else 503
        return self.render(request, "error.html", status, title="Error", error=exc)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        return self.render(request, "error.html", 404, title="Not found", error=None)

    async def not_allowed(self, request: Request, exc: Exception) -> Response:
        detail = "this dashboard is read-only" if self.read_only else "method not allowed"
        return Response(detail + "\n", status_code=405, media_type="text/plain")

    async def refuse_change(self, request: Request) -> Response:
        return Response(
            "this dashboard is read-only: it changes nothing\n",
            status_code=405,
            media_type="text/plain",
            headers={"allow": "GET"},
        )

    # -- pages -------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        data = await run_in_threadpool(views.overview, self.app, self.tenant)
        chart = throughput_svg(
            data.starts, data.completed, data.dead, label="jobs ended per minute, last hour"
        )
        sparks = {
            q.name: throughput_svg(
                data.starts,
                q.completed,
                q.dead,
                label=f"{q.name}: jobs ended per minute, last hour",
                width=180,
                height=24,
                axes=False,
            )
            for q in data.queues
        }
        return self.render(
            request, "overview.html", title="Overview", data=data, chart=chart, sparks=sparks
        )

    async def jobs(self, request: Request) -> Response:
        return await self._list(request, dead=False)

    async def dead(self, request: Request) -> Response:
        return await self._list(request, dead=True)

    async def _list(self, request: Request, *, dead: bool) -> Response:
        filters = views.Filters.parse(request.query_params, tenant=self.tenant)
        if dead and not filters.state:
            filters = replace(filters, state="dead")
        before = request.query_params.get("before") or None
        page = await run_in_threadpool(views.jobs_page, self.app, filters, before, self.budget)
        return self.render(
            request,
            "jobs.html",
            title="Dead letters" if dead else "Jobs",
            dead=dead,
            filters=filters,
            page=page,
            path="/dead" if dead else "/jobs",
            scan_ms=round(self.budget.scan_seconds * 1000),
            bulk_limit=self.budget.bulk_limit,
        )

    async def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = await run_in_threadpool(self.app.driver.job_get, job_id, tenant_id=self.tenant)
        if job is None:
            return await self.not_found(request, LookupError(job_id))
        detail = await run_in_threadpool(views.job_detail, self.app, job)
        return self.render(request, "job.html", title=f"Job {job.id}", d=detail)

    async def queues(self, request: Request) -> Response:
        rows = await run_in_threadpool(views.queue_rows, self.app, self.tenant)
        queues = [rows[name] for name in sorted(rows)]
        return self.render(request, "queues.html", title="Queues", queues=queues)

    async def cron(self, request: Request) -> Response:
        rows = await run_in_threadpool(views.cron_rows, self.app)
        return self.render(request, "cron.html", title="Cron", rows=rows)

    async def workers(self, request: Request) -> Response:
        rows = await run_in_threadpool(views.workers, self.app)
        return self.render(request, "workers.html", title="Workers", rows=rows)

    async def asset(self, request: Request) -> Response:
        name = request.path_params["asset"]
        if name not in _ASSETS:
            return await self.not_found(request, LookupError(name))
        body = _STATIC.joinpath(name).read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        headers = {"cache-control": "public, max-age=3600", "etag": etag}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type=_ASSETS[name], headers=headers)

    # -- actions (POST only, CSRF-checked) -----------------------------------------------------

    @_checked
    async def act_jobs(self, request: Request, form: FormData) -> Response:
        action = str(form.get("action", ""))
        if action not in _ACTIONS:
            raise ConfigurationError(
                f"unknown action {action!r}", fix="use the dashboard's retry or discard buttons"
            )
        filters = views.Filters.parse(form, tenant=self.tenant)
        back = _local(str(form.get("next", "")), request)
        partial = False
        if form.get("scope") == "all":
            ids, partial = await run_in_threadpool(
                views.bulk_ids, self.app, filters, action, self.budget
            )
            scope = "all"
        else:
            ids = [str(v) for v in form.getlist("ids") if str(v)]
            scope = "ids"
            if not ids:
                raise ConfigurationError(
                    "no job was selected",
                    fix="use a job's Retry or Discard button, or the ones for all that match",
                )
        if form.get("confirmed") != "yes":
            return self.render(
                request,
                "confirm.html",
                title=f"Confirm {action}",
                action=action,
                ids=ids,
                scope=scope,
                filters=filters,
                back=back,
                partial=partial,
                refresh=0,  # a confirmation is a POST's answer: nothing to refresh
            )
        verb = self.app.retry_jobs if action == "retry" else self.app.discard_jobs
        changed = await run_in_threadpool(verb, ids, tenant_id=self.tenant)
        done = {"done": action, "n": str(len(changed)), "of": str(len(ids))}
        if back.startswith(("/jobs/", f"{_base(request)}/jobs/")) and action == "discard":
            back = _base(request) + "/dead"
        sep = "&" if "?" in back else "?"
        return RedirectResponse(back + sep + urlencode(done), status_code=303)

    @_checked
    async def act_queue(self, request: Request, form: FormData) -> Response:
        name = str(form.get("queue", ""))
        action = str(form.get("action", ""))
        if not name or action not in ("pause", "resume"):
            raise ConfigurationError(
                "a queue action needs a queue and pause or resume",
                fix="use the dashboard's pause and resume buttons",
            )
        change: Callable[[str], None] = (
            self.app.pause_queue if action == "pause" else self.app.resume_queue
        )
        await run_in_threadpool(change, name)
        query = urlencode({"done": action, "queue": name})
        return RedirectResponse(f"{_base(request)}/queues?{query}", status_code=303)


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _local(path: str, request: Request) -> str:
    """A redirect target inside this dashboard: a path under its root, never another site."""
    base = _base(request)
    inside = not base or path == base or path.startswith(base + "/")
    if path.startswith("/") and not path.startswith("//") and "\\" not in path and inside:
        # Without the notice of an earlier action, so notices do not pile up in the URL.
        where, _, query = path.partition("?")
        kept = [(k, v) for k, v in parse_qsl(query) if k not in ("done", "n", "of")]
        return where + ("?" + urlencode(kept) if kept else "")
    return base + "/dead"


def _ts(moment: datetime | None) -> str:
    """A time to the second: ``Z`` for UTC, the offset for a zone's local time."""
    if moment is None:
        return "-"
    text = moment.isoformat(sep=" ", timespec="seconds")
    return text.removesuffix("+00:00") + "Z" if moment.utcoffset() == timedelta(0) else text
