"""Why a statement is shaped as it is on one backend: the notes the golden SQL files print above it.

A statement builder says it next to its code, one short line per backend whose statement differs
for a reason (``@sql_notes(mssql="...", oracle="...")``). The decorator returns the function
unchanged, so building a statement costs nothing more; the notes are kept by the function's code
object, which is what :mod:`controltable.sqlscript` sees when the builder returns a statement (the
statement's name in ``core/sql/<dialect>.sql`` is the builder's ``__name__``, found the same way).
"""

from __future__ import annotations

from types import CodeType
from typing import Any, Callable, TypeVar

from .dialect_traits import SUPPORTED_DIALECTS
from .errors import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])

#: builder code -> {backend: why}
_NOTES: dict[CodeType, dict[str, str]] = {}


def sql_notes(**why: str) -> Callable[[F], F]:
    """Record, per backend, one line on why ``fn``'s statement is shaped so there."""
    unknown = sorted(set(why) - set(SUPPORTED_DIALECTS))
    if unknown:
        raise ConfigurationError(f"sql_notes: {', '.join(unknown)} is not a backend; name one of "
                                 f"{', '.join(SUPPORTED_DIALECTS)}")
    for backend, line in why.items():
        if not line.strip() or "\n" in line:
            raise ConfigurationError(f"sql_notes: the note for {backend} must be one line of text (the golden "
                                     "files print one line per backend)")

    def record(fn: F) -> F:
        _NOTES[fn.__code__] = dict(why)
        return fn

    return record


def notes_of(code: CodeType) -> dict[str, str]:
    """The notes recorded for the builder whose code is ``code`` (none: an empty mapping)."""
    return _NOTES.get(code, {})
