"""``controltable serve``: check the configuration, then run the status page under uvicorn.

Kept apart from the CLI module so the command stays a thin parser, and so that a missing ``web``
extra is reported as a configuration problem with the install command, not an ImportError.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from ..control import ControlTable
from ..defaults import WEB_POLL_INTERVAL, WEB_TOKEN_ENV
from ..errors import ConfigurationError, NotInstalledError
from .data import StatusSource, parse_event_spec


def require_web_extra() -> None:
    """Raise :class:`ConfigurationError` naming the extra when starlette/uvicorn/prometheus_client are missing."""
    missing = []
    for module in ("starlette", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigurationError(
            f"the status page needs {', '.join(missing)}: pip install 'controltable[web]'")


def build(
    ct: ControlTable,
    *,
    events: Sequence[str] = (),
    worklists: Sequence[str] = (),
    actions: bool = False,
    token: Optional[str] = None,
    poll_interval: float = WEB_POLL_INTERVAL,
) -> object:
    """The app ``serve`` runs: validated options, a reachable and installed control table."""
    require_web_extra()
    specs = [parse_event_spec(e) for e in events]
    if actions and not token:
        raise ConfigurationError(
            f"--actions needs authentication: set {WEB_TOKEN_ENV} to a secret of at least 16 characters "
            f"(e.g. `export {WEB_TOKEN_ENV}=$(openssl rand -hex 24)`); clients send it as "
            "'Authorization: Bearer <token>'")
    if ct.installed_version() is None:
        raise NotInstalledError(f"no control tables in {ct.db.safe_url}; run `controltable init` first")
    from .app import create_app

    return create_app(StatusSource(ct, events=specs, worklists=worklists), actions=actions,
                      token=token if actions else None, poll_interval=poll_interval)


def run(
    ct: ControlTable,
    *,
    host: str,
    port: int,
    events: Sequence[str] = (),
    worklists: Sequence[str] = (),
    actions: bool = False,
    poll_interval: float = WEB_POLL_INTERVAL,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve until interrupted. The token for actions comes from the environment, never the command line
    (where every user of the machine could read it in the process list)."""
    token = os.environ.get(WEB_TOKEN_ENV) or None
    app = build(ct, events=events, worklists=worklists, actions=actions, token=token, poll_interval=poll_interval)
    import uvicorn

    shown = f"[{host}]" if ":" in host else host
    announce(f"controltable status page for {ct.db.safe_url} (namespace {ct.namespace}) at http://{shown}:{port}/ "
             f"({'actions enabled, token required' if actions else 'read-only'}); metrics at /metrics")
    uvicorn.run(app, host=host, port=port, log_level="warning")  # type: ignore[arg-type]
