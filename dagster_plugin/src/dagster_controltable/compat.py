"""Arguments named differently across core releases: pass each under the name the installed core accepts.

``renamed`` (the old name keeps working with a ``DeprecationWarning``) is the core's
:func:`controltable.compat.renamed`, re-exported here.

Why: the integration speaks the core's and the Airflow provider's vocabulary (``poll_interval``,
``table_schema`` for the event table's schema, ``owner``...), but public names are contracts, so
definitions written against an older release must keep loading.
"""

import inspect
from typing import Any, Callable

from controltable.compat import renamed

__all__ = ["keyword_for", "renamed"]


def keyword_for(fn: Callable[..., Any], *names: str) -> str:
    """The first of ``names`` that ``fn`` accepts (the core's current name for an argument).

    Lets the integration pass an argument whichever release of the core is installed, without a
    deprecation warning from a core that renamed it.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return names[-1]
    for name in names:
        if name in params:
            return name
    return names[-1]
