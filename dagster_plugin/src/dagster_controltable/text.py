"""Text for log lines, messages and metadata: resource names, who is ahead, durations, JSON-safe keys."""

from typing import Any, Mapping, Union

from . import defaults


def names_list(resource: Union[str, Mapping[str, int]]) -> list[str]:
    """The resource names of ``resource`` (one name, or the keys of a mapping of names to slots)."""
    return [resource] if isinstance(resource, str) else [str(k) for k in resource]


def names(resource: Union[str, Mapping[str, int]]) -> str:
    """ "'a'", "'a', 'b'" for a log line."""
    return ", ".join(repr(n) for n in names_list(resource))


def ahead_text(ahead: list[str]) -> str:
    """ "a", "a and b", "a, b and c", "a, b, c, d, e and 7 more"."""
    if not ahead:
        return "nobody"
    if len(ahead) > defaults.AHEAD_SHOWN:
        return ", ".join(ahead[:defaults.AHEAD_SHOWN]) + f" and {len(ahead) - defaults.AHEAD_SHOWN} more"
    return ahead[0] if len(ahead) == 1 else ", ".join(ahead[:-1]) + " and " + ahead[-1]


def duration(seconds: float) -> str:
    """ "42 s", "7 min", "3.5 h" for a log line."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def jsonable(value: Any) -> Any:
    """``value`` itself if JSON has it (number, text, bool, null), else its text: a key for metadata."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def timestamp(value: Any) -> float:
    """Epoch seconds of a datetime (or of a number that already is)."""
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)
