"""Renamed public names: the one way every surface (core, CLI, Airflow, Dagster) keeps an old name working.

Why: public names are contracts. When a name changes for one vocabulary across the surfaces
(``table_schema`` for an event table's schema, ``owner``, ``poll_interval``, ``release``), the old
name keeps working with a ``DeprecationWarning`` naming the new one, and giving both is an error.
"""

from __future__ import annotations

import warnings
from typing import Optional, TypeVar

from .errors import ConfigurationError

T = TypeVar("T")


def deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (``stacklevel`` points at the caller's caller)."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel)


def renamed(where: str, old: str, old_value: Optional[T], new: str, new_value: Optional[T]) -> Optional[T]:
    """The value of argument ``new``, taken from ``old`` (with a warning) when only the old name was given."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ConfigurationError(f"{where}: give {new}= only ({old}= is its deprecated old name)")
    warnings.warn(f"{where}: {old}= is deprecated, use {new}= (same meaning)", DeprecationWarning, stacklevel=3)
    return old_value
