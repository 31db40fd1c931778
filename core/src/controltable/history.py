"""Deprecated import path of the slot policies' values and history figures: use :mod:`controltable.slots`
(or the package root for ``Rate``, ``GrantRecord``, ``ResourceStats``).

Kept so that code written against the earlier layout keeps importing; it warns once on import.
"""

from __future__ import annotations

from .clock import utc  # noqa: F401 - re-exported
from .compat import deprecated
from .slots.history import compute_stats, percentile, to_record  # noqa: F401 - re-exported
from .slots.statements import EXPIRED, HELD, RELEASED  # noqa: F401 - re-exported (grant outcomes)
from .slots.values import GrantRecord, Rate, ResourceStats, check_rate, parse_duration, parse_rate  # noqa: F401

deprecated("controltable.history", "controltable.slots", stacklevel=2)
