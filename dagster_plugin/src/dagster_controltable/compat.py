"""Renamed arguments: the old name keeps working, with a ``DeprecationWarning`` naming the new one.

Why: the integration speaks the core's and the Airflow provider's vocabulary (``poll_interval``,
``table_schema`` for the event table's schema, ``owner``...), but public names are contracts, so
definitions written against an older release must keep loading.
"""

import inspect
import warnings
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")


def renamed(where: str, old: str, old_value: Optional[T], new: str, new_value: Optional[T]) -> Optional[T]:
    """The value of argument ``new``, taken from ``old`` (with a warning) when only the old name was given."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{where}: give {new}= only ({old}= is its deprecated old name)")
    warnings.warn(f"{where}: {old}= is deprecated, use {new}= (same meaning)", DeprecationWarning, stacklevel=3)
    return old_value


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
