"""``controltable serve``: check the configuration, then run the status page under uvicorn.

Kept apart from the CLI module so the command stays a thin parser, and so that a missing ``web``
extra is reported as a configuration problem with the install command, not an ImportError.
"""

from __future__ import annotations

import ipaddress
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
    private: bool = False,
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
                      token=token if actions or private else None, poll_interval=poll_interval, private=private)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reached from this machine only (``127.0.0.1``, ``::1``, ``localhost``).

    Any other name or address (``0.0.0.0``, ``::``, a hostname, an interface's address) may be
    reached from the network; a name is not resolved, so it counts as reachable."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure(host: str, token: Optional[str], allow_unauthenticated: bool) -> Optional[str]:
    """The warning to print for where the page listens, or ``None``; refuses an open page on a network.

    The page shows holder ids, resource names, event errors and ``/metrics`` to whoever reaches it:
    beyond loopback without a token that is anyone on the network, so it needs the operator's
    ``--allow-unauthenticated`` (and is announced loudly even then)."""
    if is_loopback(host) or token:
        return None
    if not allow_unauthenticated:
        raise ConfigurationError(
            f"--host {host} serves holders, resources and /metrics to anyone who reaches the port, without "
            f"authentication; set {WEB_TOKEN_ENV} (e.g. `export {WEB_TOKEN_ENV}=$(openssl rand -hex 24)`: every "
            "request then needs it, a browser asks for it as the password, Prometheus sends it with "
            "`authorization: {credentials_file: ...}`), or keep the default --host 127.0.0.1 behind a reverse proxy "
            "that authenticates; --allow-unauthenticated starts it open if that is what you mean")
    return (f"WARNING: the status page listens on {host} WITHOUT AUTHENTICATION (--allow-unauthenticated): "
            f"anyone who reaches the port reads holders, resources, event errors and /metrics; set {WEB_TOKEN_ENV} "
            "to require a token")


def run(
    ct: ControlTable,
    *,
    host: str,
    port: int,
    events: Sequence[str] = (),
    worklists: Sequence[str] = (),
    actions: bool = False,
    poll_interval: float = WEB_POLL_INTERVAL,
    allow_unauthenticated: bool = False,
    announce: Callable[[str], None] = print,
    warn: Callable[[str], None] = print,
) -> None:
    """Serve until interrupted. The token comes from the environment, never the command line (where
    every user of the machine could read it in the process list). With a token set, every request
    needs it (reads too); without one, only loopback is served unless ``allow_unauthenticated``."""
    token = os.environ.get(WEB_TOKEN_ENV) or None
    warning = exposure(host, token, allow_unauthenticated)
    app = build(ct, events=events, worklists=worklists, actions=actions, token=token, poll_interval=poll_interval,
                private=token is not None)
    import uvicorn

    shown = f"[{host}]" if ":" in host else host
    access = "token required for every request" if token else "no authentication"
    announce(f"controltable status page for {ct.db.safe_url} (namespace {ct.namespace}) at http://{shown}:{port}/ "
             f"({'actions enabled' if actions else 'read-only'}, {access}); metrics at /metrics")
    if warning:
        warn(warning)
    uvicorn.run(app, host=host, port=port, log_level="warning")  # type: ignore[arg-type]
