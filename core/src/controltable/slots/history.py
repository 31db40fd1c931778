"""The grant history as figures: records and statistics computed from history rows, no I/O.

Every grant writes one history row in the grant's own transaction (so the rate window, which is
counted from these rows, can never miss a grant), and the release or reap that ends it closes the
row (outcome ``released`` or ``expired``); those statements are in :mod:`.statements`. Here the
rows become :class:`GrantRecord` objects and window statistics, by pure functions tested without
a database.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

from ..clock import utc
from .statements import EXPIRED
from .values import GrantRecord, ResourceStats


def to_record(row: Any) -> GrantRecord:
    granted = utc(float(row.granted_at))
    enqueued = utc(float(row.enqueued_at))
    assert granted is not None and enqueued is not None
    return GrantRecord(
        resource=row.resource, holder=row.holder, mode=row.mode, slots=int(row.slots), priority=int(row.priority),
        token=int(row.token), enqueued_at=enqueued, granted_at=granted,
        ended_at=utc(None if row.ended_at is None else float(row.ended_at)), outcome=row.outcome,
    )


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q`` quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def compute_stats(resource: str, capacity: int, rows: Iterable[Any], start: float, end: float) -> ResourceStats:
    """Statistics of ``[start, end)`` from the history rows that overlap it (see :func:`.statements.overlapping`).

    A grant still held counts as held up to ``end``. Waits and grant counts are of the grants
    made inside the window; utilisation counts every slot-second held inside it.
    """
    waits: list[float] = []
    held = 0.0
    expired = 0
    for row in rows:
        granted = float(row.granted_at)
        ended = end if row.ended_at is None else float(row.ended_at)
        if start <= granted < end:
            waits.append(max(granted - float(row.enqueued_at), 0.0))
        held += int(row.slots) * max(min(ended, end) - max(granted, start), 0.0)
        if row.outcome == EXPIRED and row.ended_at is not None and start <= float(row.ended_at) < end:
            expired += 1
    span = max(end - start, 1e-9)
    s, e = utc(start), utc(end)
    assert s is not None and e is not None
    return ResourceStats(
        resource=resource, start=s, end=e, capacity=capacity, grants=len(waits),
        wait_p50=percentile(waits, 0.5), wait_p95=percentile(waits, 0.95), wait_max=max(waits) if waits else None,
        utilisation=min(held / (capacity * span), 1.0) if capacity > 0 else None,
        grants_per_hour=len(waits) * 3600.0 / span, expired=expired,
    )
