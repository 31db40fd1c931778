"""The status page as an ASGI app (Starlette): the HTML page, its JSON, ``/metrics`` and, on request, actions.

Routes (relative to wherever the app is mounted, so the same app serves ``controltable serve`` at
``/`` and Airflow's api-server at ``/controltable``):

* ``GET /`` the page (static HTML + our own JS/CSS; nothing is loaded from another host);
* ``GET /api/status`` the snapshot the page polls (``?charts=0`` skips the history series), with
  the push state and ``doctor``'s findings, which the page shows in its "Setup" section;
* ``GET /metrics`` the Prometheus text format (``controltable_push_active`` says whether push
  wake-ups arrive, ``controltable_doctor_findings`` counts doctor's findings per level);
* ``POST /api/release`` and ``POST /api/capacity`` only when built with ``actions=True``, which
  needs a token: every action request must carry ``Authorization: Bearer <token>`` (HTTP Basic is
  refused there) and ``Content-Type: application/json``. A browser sends its cached Basic login with
  any site's form, and a form can post JSON as ``text/plain``; it can never add a Bearer header, nor
  send ``application/json`` to another origin without a CORS preflight this app never answers. So no
  other site can release holders or change capacities through a logged-in browser (CSRF).

Built with ``private=True`` (``controltable serve`` with a token set), every route needs the token:
``Authorization: Bearer <token>`` (Prometheus' ``authorization`` block, curl), or HTTP Basic with
the token as the password (a browser asks for it once and sends it with the page's requests;
reads only: the page sends actions with the token typed into its field, as a Bearer header).

Reading the control table is blocking database work, so it runs in Starlette's thread pool and the
event loop stays free for other requests (in Airflow's api-server too).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from html import escape
from importlib import resources
from typing import Any, Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..defaults import MAX_CAPACITY, WEB_POLL_INTERVAL
from ..errors import ConfigurationError, ControlTableError, UnknownResourceError
from ..validation import check_name, check_positive_int
from . import metrics
from .data import StatusSource

STATIC = resources.files("controltable.web") / "static"

#: Our own scripts and styles only; the page may be framed by the same origin (Airflow's UI).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, default=str), status_code=status, media_type="application/json",
                    headers=SECURITY_HEADERS)


def create_app(
    source: StatusSource,
    *,
    actions: bool = False,
    token: Optional[str] = None,
    poll_interval: float = WEB_POLL_INTERVAL,
    title: str = "controltable",
    private: bool = False,
) -> Starlette:
    """Build the app over ``source``. ``actions=True`` needs ``token`` (refused without one);
    ``private=True`` needs it for every request, reads included (refused without one)."""
    if private and not token:
        raise ConfigurationError("a private status page needs a token (CONTROLTABLE_WEB_TOKEN for controltable serve)")
    if actions and not token:
        raise ConfigurationError(
            "actions (release a holder, change a capacity) need authentication: set a token "
            "(controltable serve reads it from CONTROLTABLE_WEB_TOKEN) or leave actions off")
    if token is not None and len(token) < 16:
        raise ConfigurationError("the action token must be at least 16 characters; e.g. `openssl rand -hex 24`")
    page = (STATIC / "index.html").read_text(encoding="utf-8")

    async def index(request: Request) -> Response:
        root = request.scope.get("root_path", "").rstrip("/")
        html = (page.replace("{{BASE}}", escape(root + "/", quote=True))
                .replace("{{TITLE}}", escape(title))
                .replace("{{POLL_MS}}", str(int(poll_interval * 1000)))
                .replace("{{ACTIONS}}", "true" if actions else "false"))
        return HTMLResponse(html, headers=SECURITY_HEADERS)

    async def status(request: Request) -> Response:
        charts = request.query_params.get("charts", "1") != "0"
        try:
            snap = await run_in_threadpool(source.snapshot, charts=charts)
        except ControlTableError as exc:
            return _json({"error": str(exc)}, 503)
        snap["actions"] = actions
        snap["poll_interval"] = poll_interval
        return _json(snap)

    async def metrics_endpoint(request: Request) -> Response:
        def scrape() -> bytes:
            return metrics.render(lambda: source.snapshot(charts=False) | {"stats": _current_stats(source)},
                                  source.waits)
        try:
            body = await run_in_threadpool(scrape)
        except ControlTableError as exc:
            return Response(f"# controltable: {exc}\n", status_code=503, media_type="text/plain")
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def action(request: Request, run: Any) -> Response:
        if not _carries(request, token, basic=False):
            return _json({"error": "an action needs the header 'Authorization: Bearer <token>' (a browser's "
                                   "login is not enough: type the token into the page's token field)"}, 401)
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            return _json({"error": f"an action's body must be sent as 'Content-Type: application/json', "
                                   f"not {media_type or 'none'!r}"}, 415)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ConfigurationError("the request body must be a JSON object")
            result = await run_in_threadpool(run, body)
        except (ValueError, ConfigurationError, UnknownResourceError) as exc:
            return _json({"error": str(exc)}, 400)
        except ControlTableError as exc:
            return _json({"error": str(exc)}, 503)
        return _json({"ok": True, **result})

    async def release(request: Request) -> Response:
        def run(body: dict[str, Any]) -> dict[str, Any]:
            resource = check_name("resource", body.get("resource"))
            holder = check_name("holder", body.get("holder"))
            return {"released": source.ct.release(resource, holder)}
        return await action(request, run)

    async def capacity(request: Request) -> Response:
        def run(body: dict[str, Any]) -> dict[str, Any]:
            resource = check_name("resource", body.get("resource"))
            value = check_positive_int("capacity", body.get("capacity"), maximum=MAX_CAPACITY)
            if resource not in {s.name for s in source.ct.status([resource])}:
                raise UnknownResourceError(f"resource {resource!r} does not exist; the page changes capacities "
                                           "of existing resources only")
            source.ct.set_capacity(resource, value)
            return {"capacity": value}
        return await action(request, run)

    routes = [
        Route("/", index),
        Route("/api/status", status),
        Route("/metrics", metrics_endpoint),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
    if actions:
        routes += [Route("/api/release", release, methods=["POST"]),
                   Route("/api/capacity", capacity, methods=["POST"])]
    app = Starlette(routes=routes, middleware=[Middleware(_Private, token=str(token))] if private else [])
    app.state.source = source
    return app


def _carries(request: Request, token: Optional[str], *, basic: bool = True) -> bool:
    """Whether ``request`` carries ``token``: as a bearer token, or (``basic``) as the password of
    HTTP Basic. Actions pass ``basic=False``: a browser attaches a cached Basic login to any site's
    request, a Bearer header only to its own page's."""
    if not token:
        return False
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "basic" and basic:
        try:
            value = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


class _Private:
    """The app behind the token: a request without it gets 401 and a Basic challenge (so a browser
    asks for it), before any route reads the control table."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not _carries(Request(scope), self.token):
            response = Response("this status page needs its token: 'Authorization: Bearer <token>', or the "
                                "token as the password of a browser's login prompt\n", status_code=401,
                                media_type="text/plain",
                                headers={"WWW-Authenticate": 'Basic realm="controltable", charset="UTF-8"'})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _current_stats(source: StatusSource) -> dict[str, Any]:
    """The last hour's statistics per resource without the chart series (cheaper, for scrapes)."""
    from .data import stats_view

    return {"available": True, "current": {s.resource: stats_view(s) for s in source.ct.stats(window=3600.0)}}


__all__ = ["create_app"]
