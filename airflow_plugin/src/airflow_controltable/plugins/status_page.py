"""The controltable status page inside Airflow's UI: the core's app mounted in the api-server.

* ``fastapi_apps`` mounts :func:`controltable.web.create_app` at ``/controltable`` (read-only:
  no actions inside Airflow);
* ``external_views`` adds a "controltable" entry to the navigation (Airflow 3.1+), which shows the
  page in the UI's frame;
* ``listeners`` (every process): :mod:`airflow_controltable.plugins.work_ended`, the marker a task
  leaves for the sensor + teardown pattern's release when its work has ended.

**Authentication.** Airflow mounts plugin apps as they are: nothing in front of them checks who
asks. So every request to the mounted app passes :class:`AirflowAuth` first, which does what
Airflow's own API does for its routes: it takes the JWT from ``Authorization: Bearer`` or else from
the ``_token`` cookie the UI sets at login (the frame sends it, being the same origin), has the
auth manager validate it (signature, expiry, revocation), and asks the auth manager whether that
user may read pools (``is_authorized_pool(method="GET")``: a controltable resource is the pools of
every orchestrator at once). No token: 401; a token for a user without that right: 403. The static
files and ``/metrics`` are behind the same check (scrape with a bearer token).

Loaded only in the api-server (the scheduler, workers and triggerer never import the web extra),
and only when the ``[controltable] status_page`` option is true (the default) and the ``web`` extra
is installed. The control table comes from the Airflow connection named by
``[controltable] status_page_conn_id`` (default ``controltable_default``), opened on the first
request, so a missing connection shows as an error on the page instead of breaking the api-server.
Event tables and work lists to show: ``[controltable] status_page_events`` (comma-separated
``[SCHEMA.]TABLE:KEY[:ORDER_BY[:TIME_COLUMN]]``) and ``status_page_worklists`` (comma-separated names).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Callable, Optional

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

from airflow_controltable.plugins import work_ended

log = logging.getLogger(__name__)

URL_PREFIX = "/controltable"
SECTION = "controltable"


def running_in_api_server(argv: Optional[list[str]] = None) -> bool:
    """Whether this process is Airflow's api-server (the one process that serves plugin apps)."""
    args = sys.argv if argv is None else argv
    return (len(args) > 1 and args[1] == "api-server") or (
        len(args) > 2 and args[2].endswith("airflow/api_fastapi/main.py"))


def _options() -> dict[str, Any]:
    def items(key: str) -> list[str]:
        return [x.strip() for x in conf.get(SECTION, key, fallback="").split(",") if x.strip()]

    return {
        "enabled": conf.getboolean(SECTION, "status_page", fallback=True),
        "conn_id": conf.get(SECTION, "status_page_conn_id", fallback="controltable_default"),
        "events": items("status_page_events"),
        "worklists": items("status_page_worklists"),
        "poll_interval": conf.getfloat(SECTION, "status_page_poll_interval", fallback=5.0),
    }


def _base_path(path: str) -> str:
    """``path`` under the api-server's base URL path (as the UI's links need it)."""
    base = conf.get("api", "base_url", fallback="/") or "/"
    if base.startswith(("http://", "https://")):
        from urllib.parse import urlparse

        base = urlparse(base).path
    return base.rstrip("/") + path


class AirflowAuth:
    """ASGI middleware: let a request through only for a user Airflow's auth manager authenticates and
    allows to read pools. ``auth_manager`` is looked up per request (it is created after plugins load)."""

    def __init__(self, app: Any, auth_manager: Optional[Callable[[], Any]] = None) -> None:
        self.app = app
        self._auth_manager = auth_manager

    def manager(self) -> Any:
        if self._auth_manager is not None:
            return self._auth_manager()
        from airflow.api_fastapi.app import get_auth_manager

        return get_auth_manager()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request
        from starlette.responses import Response

        request = Request(scope)
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        token = credential.strip() if scheme.lower() == "bearer" and credential.strip() else None
        if token is None:
            token = request.cookies.get("_token")
        status, message = 200, ""
        if not token:
            status, message = 401, "Not authenticated: log in to Airflow (or send 'Authorization: Bearer <JWT>')"
        else:
            manager = self.manager()
            try:
                user = await manager.get_user_from_token(token)
            except Exception as exc:  # jwt's ExpiredSignatureError / InvalidTokenError, a revoked token, ...
                status, message = 401, f"Airflow did not accept the token ({type(exc).__name__}); log in again"
            else:
                if not manager.is_authorized_pool(method="GET", user=user):
                    status, message = 403, "Forbidden: reading the controltable status needs the right to read pools"
        if status != 200:
            await Response(json.dumps({"detail": message}), status_code=status, media_type="application/json")(
                scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(options: Optional[dict[str, Any]] = None) -> Any:
    """The mounted app: the core's status page over the configured connection, behind :class:`AirflowAuth`."""
    from controltable.web import StatusSource, create_app, parse_event_spec

    opts = options or _options()

    def open_control_table() -> Any:
        from airflow_controltable.exceptions import ControlTableAirflowError
        from airflow_controltable.hooks.controltable import ControlTableHook
        from controltable import ConfigurationError

        try:
            return ControlTableHook(opts["conn_id"]).get_control_table()
        except ControlTableAirflowError as exc:  # shown on the page (503), retried on the next request
            raise ConfigurationError(
                f"{exc} (the status page uses the connection named by [{SECTION}] status_page_conn_id)") from exc

    source = StatusSource(open_control_table, events=[parse_event_spec(e) for e in opts["events"]],
                          worklists=opts["worklists"])
    app = create_app(source, actions=False, poll_interval=opts["poll_interval"], title="controltable")
    return AirflowAuth(app)


def _plugin_parts() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(fastapi_apps, external_views) for this process: empty unless the page should be served here."""
    if not running_in_api_server():
        return [], []
    try:
        opts = _options()
        if not opts["enabled"]:
            return [], []
        app = build_app(opts)
    except ImportError as exc:
        log.warning("controltable status page not mounted: %s (pip install 'controltable[web]')", exc)
        return [], []
    except Exception:  # a bad option must not keep the api-server from starting
        log.exception("controltable status page not mounted: its configuration is invalid")
        return [], []
    apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "controltable status page"}]
    views = [{
        "name": "controltable",
        "href": _base_path(URL_PREFIX + "/"),
        "destination": "nav",
        "category": "browse",
        "url_route": "controltable",
        "icon": _base_path(URL_PREFIX + "/static/icon.svg"),
    }]
    return apps, views


_APPS, _VIEWS = _plugin_parts()


class ControlTableStatusPlugin(AirflowPlugin):
    """Mounts the controltable status page in the api-server and links it from the UI's navigation."""

    name = "controltable"
    fastapi_apps = _APPS
    external_views = _VIEWS
    #: In task processes: tasks before a ``ReleaseSlotOperator`` record that their work ended (see
    #: :mod:`airflow_controltable.plugins.work_ended`), so the teardown waits a kill grace only when needed.
    listeners = [work_ended]
