"""The status page and Prometheus metrics of a control table (``controltable serve``; the ``web`` extra).

* :mod:`controltable.web.data` reads the control table through the public API into snapshots;
* :mod:`controltable.web.app` serves them as a page, as JSON and as ``/metrics`` (Starlette);
* :mod:`controltable.web.metrics` renders a snapshot in the Prometheus text format;
* ``static/`` holds the page, its script and its styles (no CDN: the page works offline).

Import :func:`create_app` and :class:`StatusSource` from here; the Airflow provider mounts the
same app in its api-server.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EventSpec", "StatusSource", "create_app", "parse_event_spec"]


def __getattr__(name: str) -> Any:
    # Lazy: `controltable.web.data` needs no web framework, `app` needs starlette (the extra).
    if name in ("StatusSource", "EventSpec", "parse_event_spec"):
        from . import data

        return getattr(data, name)
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
