"""Checks on every name and number a caller passes in, with errors that say how to fix them.

Numbers: non-finite values (``inf``, ``nan``) are always refused, and every number has a
documented upper bound in :mod:`controltable.defaults` (durations up to ``MAX_SECONDS``, whole
numbers that are stored within a 32-bit signed INTEGER). Text: it must be encodable as UTF-8
(a lone surrogate is not). The Airflow and Dagster adapters call these same functions.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping, Optional, Union

from . import defaults
from .errors import ConfigurationError
from .schema import NAME_LENGTH, NAMESPACE_LENGTH

MODES = ("exclusive", "shared")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
IDENTIFIER_LENGTH = 63  # the shortest limit among the backends (PostgreSQL)


def check_name(kind: str, value: object, limit: int = NAME_LENGTH) -> str:
    """A resource, holder, work-list, owner or namespace name: a non-empty printable string up to
    ``limit``, without whitespace at either end.

    Why no blank at either end: MySQL/MariaDB's PAD SPACE collations (``utf8mb4_bin`` included) and
    every SQL Server collation compare ``'etl'`` and ``'etl '`` as equal, so the database would make
    two names a caller tells apart one (one lease, one token, two holders). One rule for every
    backend keeps a name valid on one valid on all; leading blanks go with trailing ones, because a
    name that differs from another only by invisible blanks is one a reader cannot tell apart.
    Case and Unicode normalisation need no rule: every backend compares names by code point
    (binary collations), so ``Etl``/``etl`` and NFC/NFD forms stay distinct names everywhere.
    """
    if not isinstance(value, str):
        raise ConfigurationError(f"{kind} name must be a string, got {type(value).__name__}: {value!r}")
    if not value.strip():
        raise ConfigurationError(f"{kind} name must not be empty; pass a name such as 'warehouse'")
    check_encodable(f"{kind} name", value)
    if len(value) > limit:
        raise ConfigurationError(
            f"{kind} name is {len(value)} characters long, the limit is {limit}: {value[:40]!r}...; use a shorter name"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ConfigurationError(f"{kind} name {value!r} contains control characters; use printable characters only")
    if value[0].isspace() or value[-1].isspace():
        raise ConfigurationError(
            f"{kind} name {value!r} begins or ends with whitespace; MySQL/MariaDB and SQL Server compare "
            f"names ignoring trailing blanks, so {value.strip()!r} and {value!r} would be one name there and "
            f"share one lease; names with blanks at either end are refused on every backend: pass "
            f"{value.strip()!r}"
        )
    return value


def check_prefix(kind: str, value: object) -> str:
    """A prefix of names (``release_holders``): a name's start, so it may end with a blank (the
    prefix ``"etl "`` of ``"etl job"``) but not begin with one (no name does)."""
    if isinstance(value, str) and value and value[-1].isspace() and value.strip():
        check_name(kind, value.rstrip() + "x")  # every other rule of a name holds for the prefix
        return value
    return check_name(kind, value)


def check_names(kind: str, value: object) -> list[str]:
    """A list of names (``status(["a", "b"])``); a single string is taken as one name.

    A single string is what a caller means by ``status("warehouse")``: iterating it would ask for
    the resources ``w``, ``a``, ``r``... (or fail deep inside SQLAlchemy), so it is accepted as the
    one-element list. Anything else must be an iterable of names (list, tuple, set).
    """
    if isinstance(value, str):
        return [check_name(kind, value)]
    if isinstance(value, (bytes, bytearray, Mapping)) or not hasattr(value, "__iter__"):
        raise ConfigurationError(
            f"{kind} names must be a list of names (or one name as a string), got {type(value).__name__} "
            f"{_show(value)}; e.g. [\"warehouse\", \"orders\"]"
        )
    return [check_name(kind, v) for v in value]  # type: ignore[attr-defined]


def check_namespace(value: object) -> str:
    return check_name("namespace", value, NAMESPACE_LENGTH)


def check_identifier(kind: str, value: object) -> str:
    """A SQL identifier (table, column, schema, prefix) given by a user.

    Identifiers are always quoted by SQLAlchemy; this check keeps them portable across the five
    backends and rejects anything that looks like an attempt to smuggle SQL in.
    """
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigurationError(
            f"{kind} {value!r} is not a valid identifier: use letters, digits and underscores, starting with a letter"
        )
    if len(value) > IDENTIFIER_LENGTH:
        raise ConfigurationError(f"{kind} {value!r} is longer than {IDENTIFIER_LENGTH} characters")
    return value


def check_encodable(kind: str, value: str) -> str:
    """Text every database can store: encodable as UTF-8 (no lone surrogates) and without NUL."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{kind} {_preview(value)} contains a character that cannot be encoded as UTF-8 "
            f"({exc.reason} at position {exc.start}); pass valid Unicode text"
        ) from None
    if "\x00" in value:
        raise ConfigurationError(f"{kind} {_preview(value)} contains a NUL character, which databases cannot store")
    return value


FAIL_MARKER = "... [cut: {n} more characters]"


def fail_reason(reason: object, limit: int = defaults.FAIL_REASON_LENGTH) -> str:
    """A failure reason every backend stores, by one rule for ``Item.fail()`` and ``Batch.fail()``.

    Pure: ``str(reason)`` (an exception is a fine reason), NUL bytes written as ``\\x00`` (PostgreSQL
    refuses them in text), characters UTF-8 cannot encode (lone surrogates) escaped, and text
    beyond ``limit`` characters (or ``2 * limit`` UTF-8 bytes, at most 4,000: Oracle's VARCHAR2)
    cut with a marker saying how much was cut. Failing a work item or a batch never fails because
    of what the reason says, so an item is never left allocated by a reason the database refused.
    """
    text = reason if isinstance(reason, str) else str(reason)
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    max_bytes = min(2 * limit, 4000)
    if len(text) <= limit and len(text.encode("utf-8")) <= max_bytes:
        return text
    keep = limit - len(FAIL_MARKER.format(n=len(text))) - 1
    while True:
        head = text[:keep]
        out = head + FAIL_MARKER.format(n=len(text) - len(head))
        if len(out.encode("utf-8")) <= max_bytes or keep <= 0:
            return out
        keep -= max(1, (len(out.encode("utf-8")) - max_bytes) // 4)


def _preview(value: str) -> str:
    return ascii(value[:40]) + ("..." if len(value) > 40 else "")


def check_int(kind: str, value: object, *, minimum: int, maximum: int) -> int:
    """A whole number within ``[minimum, maximum]`` (``bool`` is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{kind} must be a whole number, got {_show(value)}")
    if value < minimum:
        raise ConfigurationError(f"{kind} must be at least {minimum}, got {_show(value)}")
    if value > maximum:
        raise ConfigurationError(f"{kind} must be at most {maximum}, got {_show(value)}")
    return int(value)


def check_positive_int(kind: str, value: object, *, minimum: int = 1, maximum: int = defaults.MAX_INT) -> int:
    return check_int(kind, value, minimum=minimum, maximum=maximum)


def check_order(value: object) -> int:
    """A work-list execution order: ``MIN_ORDER`` (1) up to ``MAX_ORDER``."""
    return check_int("order", value, minimum=defaults.MIN_ORDER, maximum=defaults.MAX_ORDER)


def check_priority(value: object) -> int:
    """A work-list priority within an order: a 32-bit signed whole number."""
    return check_int("priority", value, minimum=defaults.MIN_PRIORITY, maximum=defaults.MAX_PRIORITY)


def check_batch_size(value: object, kind: str = "size") -> int:
    return check_int(kind, value, minimum=1, maximum=defaults.MAX_BATCH_SIZE)


def _show(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"a number of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_seconds(
    kind: str,
    value: object,
    *,
    allow_none: bool = False,
    allow_zero: bool = False,
    maximum: float = defaults.MAX_SECONDS,
    minimum: Optional[float] = None,
) -> Optional[float]:
    """A duration in seconds: finite, positive (or zero when allowed), at least ``minimum`` and at
    most ``maximum``. ``minimum`` defaults to the bound ``defaults.MIN_SECONDS`` sets for ``kind``
    (``lease``, ``waiter_ttl``, ``pickup``): below it the value cannot work (see there)."""
    if value is None:
        if allow_none:
            return None
        raise ConfigurationError(f"{kind} must be a number of seconds, got None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{kind} must be a number of seconds, got {_show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(
            f"{kind} must be a finite number of seconds, got {value}"
            + ("; pass None to wait without a limit" if allow_none else f" (at most {maximum:g})")
        )
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigurationError(f"{kind} must be {'at least' if allow_zero else 'more than'} 0 seconds, got {value}")
    if value > maximum:
        raise ConfigurationError(
            f"{kind} must be at most {maximum:g} seconds, got {_show(value)}"
            + ("; pass None to wait without a limit" if allow_none else "")
        )
    least = defaults.MIN_SECONDS.get(kind) if minimum is None else minimum
    if least is not None and value < least and not (value == 0 and allow_zero):
        raise ConfigurationError(
            f"{kind} must be at least {least:g} seconds, got {_show(value)}; a shorter {kind} cannot work "
            f"(it runs out before the database round trips that use it), pass {least:g} or more"
        )
    return float(value)


def check_poll_interval(kind: str, value: object) -> float:
    """A poll interval: from ``MIN_POLL_SECONDS`` (no busy loop) up to ``MAX_POLL_SECONDS``."""
    out = check_seconds(kind, value, maximum=defaults.MAX_POLL_SECONDS, minimum=defaults.MIN_POLL_SECONDS)
    assert out is not None
    return out


def check_timeout_setting(kind: str, value: object, *, allow_none: bool) -> Any:
    """``connect_timeout`` (required) or ``statement_timeout`` (``None`` or 0: the server's own)."""
    if kind == "statement_timeout":
        if value is None or (value == 0 and not isinstance(value, bool)):
            return None
        return check_seconds(kind, value, maximum=defaults.MAX_STATEMENT_TIMEOUT)
    return check_seconds(kind, value, allow_none=allow_none, maximum=defaults.MAX_CONNECT_TIMEOUT)


def check_retries(value: object) -> int:
    return check_int("retries", value, minimum=0, maximum=defaults.MAX_RETRIES)


def check_where(value: object) -> Any:
    """A claim filter: ``None``, a SQLAlchemy expression, or a callable taking the table.

    A plain string (or number) is refused: SQL text from a string is exactly what this package
    never runs. Use ``lambda t: t.c.region == "eu"`` or ``sqlalchemy.text(...)`` explicitly.
    """
    from sqlalchemy.sql.elements import ClauseElement

    if value is None or callable(value) or isinstance(value, ClauseElement):
        return value
    raise ConfigurationError(
        f"where= must be a SQLAlchemy expression or a callable taking the table, got "
        f"{type(value).__name__} {_show(value)}; e.g. where=lambda t: t.c.region == 'eu'"
    )


def where_clause(value: Any, table: Any) -> Any:
    """The expression a ``where=`` value stands for on ``table``, or a clear ConfigurationError."""
    from sqlalchemy.sql.elements import ClauseElement, ColumnElement, TextClause

    check_where(value)
    if callable(value) and not isinstance(value, ClauseElement):
        fn: Callable[[Any], Any] = value
        try:
            value = fn(table)
        except Exception as exc:
            raise ConfigurationError(
                f"the where= callable raised {type(exc).__name__}: {str(exc)[:200]}; it is given the "
                "event table (a sqlalchemy Table) and must return an expression such as t.c.region == 'eu'"
            ) from exc
    if not isinstance(value, (ColumnElement, TextClause)):
        raise ConfigurationError(
            f"where= must give a SQLAlchemy boolean expression, got {type(value).__name__} {_show(value)}"
        )
    return value


def check_mode(mode: object) -> str:
    """``mode`` checked: "shared" (beside other holders, up to the capacity) or "exclusive" (alone).

    One word per idea: the conventional shared/exclusive pair of reader/writer locks, which is also
    what the control tables store and every JSON output says, so there is no second name to accept.
    """
    if mode not in MODES:
        raise ConfigurationError(f"mode must be 'shared' (the default) or 'exclusive', got {mode!r}")
    return str(mode)


def normalize_request(resource: Union[str, Mapping[str, int]], slots: int) -> dict[str, int]:
    """Turn ``"warehouse"`` + ``slots`` or ``{"warehouse": 2, "orders": 1}`` into a checked mapping."""
    if isinstance(resource, str):
        return {check_name("resource", resource): check_positive_int("slots", slots, maximum=defaults.MAX_CAPACITY)}
    if isinstance(resource, Mapping):
        if not resource:
            raise ConfigurationError("request names no resource; pass a name or a mapping such as {'warehouse': 1}")
        return {
            check_name("resource", k): check_positive_int(f"slots for {k!r}", v, maximum=defaults.MAX_CAPACITY)
            for k, v in resource.items()
        }
    raise ConfigurationError(
        f"resource must be a name or a mapping of names to slots, got {type(resource).__name__}"
    )


def check_attempt(value: object) -> Optional[int]:
    """An attempt number (a task's try number): None, or a whole number from 0 up."""
    if value is None:
        return None
    return check_int("attempt (the task's try number)", value, minimum=0, maximum=defaults.MAX_INT)
