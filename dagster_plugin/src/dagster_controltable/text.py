"""Dagster's own text for log lines and metadata: durations, and epoch seconds of a datetime.

Resource names, who is ahead and where a waiter stands read the same in every integration:
:mod:`controltable.waiting_text`.
"""

from typing import Any


def duration(seconds: float) -> str:
    """ "42 s", "7 min", "3.5 h" for a log line."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def timestamp(value: Any) -> float:
    """Epoch seconds of a datetime (or of a number that already is)."""
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)
