"""Deprecated import path of the grant decision: use :mod:`controltable.slots.grants`.

Kept so that code written against the earlier layout keeps importing; it warns once on import.
"""

from __future__ import annotations

from .compat import deprecated
from .slots.grants import (  # noqa: F401 - re-exported
    Decision,
    Queue,
    Waiter,
    decide,
    effective_priority,
    fits,
    next_opening,
    opens_in,
    order,
    queue_key,
    rate_budget,
)

deprecated("controltable.grants", "controltable.slots.grants", stacklevel=2)
