"""Checks on every name and number a caller passes in, with errors that say how to fix them."""

from __future__ import annotations

import re
from typing import Mapping, Optional, Union

from .errors import ConfigurationError
from .schema import NAME_LENGTH, NAMESPACE_LENGTH

MODES = ("exclusive", "shared")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
IDENTIFIER_LENGTH = 63  # the shortest limit among the backends (PostgreSQL)


def check_name(kind: str, value: object, limit: int = NAME_LENGTH) -> str:
    """A resource, holder, work-list or namespace name: a non-empty printable string up to ``limit``."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{kind} name must be a string, got {type(value).__name__}: {value!r}")
    if not value.strip():
        raise ConfigurationError(f"{kind} name must not be empty; pass a name such as 'warehouse'")
    if len(value) > limit:
        raise ConfigurationError(
            f"{kind} name is {len(value)} characters long, the limit is {limit}: {value[:40]!r}...; use a shorter name"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ConfigurationError(f"{kind} name {value!r} contains control characters; use printable characters only")
    return value


def check_namespace(value: object) -> str:
    return check_name("namespace", value, NAMESPACE_LENGTH)


def check_identifier(kind: str, value: object) -> str:
    """A SQL identifier (table, column, schema, prefix) given by a user.

    Identifiers are always quoted by SQLAlchemy; this check keeps them portable across the five
    backends and rejects anything that looks like an attempt to smuggle SQL in.
    """
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise ConfigurationError(
            f"{kind} {value!r} is not a valid identifier: use letters, digits and underscores, starting with a letter"
        )
    if len(value) > IDENTIFIER_LENGTH:
        raise ConfigurationError(f"{kind} {value!r} is longer than {IDENTIFIER_LENGTH} characters")
    return value


def check_positive_int(kind: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{kind} must be a whole number, got {value!r}")
    if value < minimum:
        raise ConfigurationError(f"{kind} must be at least {minimum}, got {value}")
    return value


def check_seconds(kind: str, value: object, *, allow_none: bool = False, allow_zero: bool = False) -> Optional[float]:
    if value is None:
        if allow_none:
            return None
        raise ConfigurationError(f"{kind} must be a number of seconds, got None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{kind} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigurationError(f"{kind} must be {'at least' if allow_zero else 'more than'} 0 seconds, got {value}")
    return float(value)


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ConfigurationError(f"mode must be 'exclusive' or 'shared', got {mode!r}")
    return str(mode)


def normalize_request(resource: Union[str, Mapping[str, int]], slots: int) -> dict[str, int]:
    """Turn ``"warehouse"`` + ``slots`` or ``{"warehouse": 2, "orders": 1}`` into a checked mapping."""
    if isinstance(resource, str):
        return {check_name("resource", resource): check_positive_int("slots", slots)}
    if isinstance(resource, Mapping):
        if not resource:
            raise ConfigurationError("request names no resource; pass a name or a mapping such as {'warehouse': 1}")
        return {check_name("resource", k): check_positive_int(f"slots for {k!r}", v) for k, v in resource.items()}
    raise ConfigurationError(
        f"resource must be a name or a mapping of names to slots, got {type(resource).__name__}"
    )
