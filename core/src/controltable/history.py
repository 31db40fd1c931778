"""Slot policies' value types and the grant history: records, statistics, and the statements behind them.

Every grant writes one history row in the grant's own transaction (so the rate window, which is
counted from these rows, can never miss a grant), and the release or reap that ends it updates the
row (outcome ``released`` or ``expired``). Statistics are computed here from the rows by pure
functions; the statements are built by pure functions too. Pruning deletes in bounded batches,
resource by resource through the (namespace, resource, granted_at) index, so it never holds many
locks and never makes a grant wait long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Optional, Sequence, Union

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.sql import Delete, Insert, Select, Update

from .errors import ConfigurationError
from .schema import ControlSchema
from .validation import check_positive_int, check_seconds

#: The outcomes of a grant: still held, given back, or its lease ran out (the holder died or
#: stopped renewing; a grant made on a waiter's behalf that was never picked up also ends so).
HELD, RELEASED, EXPIRED = "held", "released", "expired"


@dataclass(frozen=True)
class Rate:
    """At most ``count`` grants in any window of ``per`` seconds (beside the capacity)."""

    count: int
    per: float

    def __str__(self) -> str:
        return f"{self.count}/{self.per:g}s"


def check_rate(value: Union[Rate, tuple[int, float], None]) -> Optional[Rate]:
    """A rate from a :class:`Rate`, a ``(count, per)`` pair or None (no rate)."""
    if value is None:
        return None
    if isinstance(value, Rate):
        count, per = value.count, value.per
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        count, per = value
    else:
        raise ConfigurationError(
            f"rate must be Rate(count, per) or a (count, per) pair such as (100, 60), got {value!r}")
    n = check_positive_int("rate count", count)
    seconds = check_seconds("rate period", per)
    assert seconds is not None
    return Rate(n, seconds)


def parse_rate(text: str) -> Rate:
    """``"100/60s"``, ``"100/60"``, ``"100/1m"`` or ``"10/1h"`` as a :class:`Rate` (for the CLI)."""
    count, sep, per = text.partition("/")
    if not sep:
        raise ConfigurationError(f"rate {text!r} must look like COUNT/PERIOD, e.g. 100/60s")
    try:
        n = int(count)
    except ValueError:
        raise ConfigurationError(f"rate {text!r}: {count!r} is not a whole number; write e.g. 100/60s") from None
    return check_rate((n, parse_duration(per)))  # type: ignore[return-value]


def parse_duration(text: str) -> float:
    """``"30"``, ``"30s"``, ``"5m"``, ``"1h"`` or ``"2d"`` in seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    raw = text.strip().lower()
    factor = units.get(raw[-1:])
    number = raw[:-1] if factor is not None else raw
    try:
        value = float(number) * (factor or 1.0)
    except ValueError:
        raise ConfigurationError(f"duration {text!r} must be a number of seconds or e.g. 30s, 5m, 1h") from None
    seconds = check_seconds("duration", value)
    assert seconds is not None
    return seconds


def utc(ts: Optional[float]) -> Optional[datetime]:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


@dataclass(frozen=True)
class GrantRecord:
    """One grant of a slot request on one resource, from the history table."""

    resource: str
    holder: str
    mode: str
    slots: int
    priority: int
    token: int
    enqueued_at: datetime
    granted_at: datetime
    ended_at: Optional[datetime]
    outcome: str  # "held" | "released" | "expired"

    @property
    def wait_seconds(self) -> float:
        """How long the request waited in the queue before it was granted."""
        return max((self.granted_at - self.enqueued_at).total_seconds(), 0.0)


@dataclass(frozen=True)
class ResourceStats:
    """What a resource's grants looked like over a window (from the grant history)."""

    resource: str
    start: datetime
    end: datetime
    capacity: int
    #: Grants made in the window.
    grants: int
    #: Queue waits of those grants (seconds); None without grants.
    wait_p50: Optional[float]
    wait_p95: Optional[float]
    wait_max: Optional[float]
    #: Slot-seconds held within the window / (capacity * window length), 0..1.
    utilisation: Optional[float]
    grants_per_hour: float
    #: Leases that ran out within the window (holders that died or stopped renewing).
    expired: int


# -- statements (pure) ------------------------------------------------------------------------------
def record_grant(t: ControlSchema, namespace: str, resource: str, token: int, row: Any, priority: int,
                 now: float) -> Insert:
    """The history row of a grant just made (``row``: the request row granted)."""
    return insert(t.history).values(
        namespace=namespace, resource=resource, token=token, holder=row.holder, mode=row.mode,
        slots=int(row.slots), priority=priority, enqueued_at=float(row.enqueued_at), granted_at=now,
        ended_at=None, outcome=HELD,
    )


def end_grant(t: ControlSchema, namespace: str, resource: str, token: int, outcome: str, now: float) -> Update:
    """Close a grant's history row (only once: a row already closed keeps its outcome)."""
    h = t.history
    return (
        update(h)
        .where(h.c.namespace == namespace, h.c.resource == resource, h.c.token == token, h.c.outcome == HELD)
        .values(outcome=outcome, ended_at=now)
    )


def retoken_grant(t: ControlSchema, namespace: str, resource: str, old: int, new: int) -> Update:
    """A newer attempt took a new fencing token for the same grant: the row follows it."""
    h = t.history
    return update(h).where(h.c.namespace == namespace, h.c.resource == resource, h.c.token == old).values(token=new)


def window_count(t: ControlSchema, namespace: str, resource: str, since: float) -> Select:  # type: ignore[type-arg]
    """Grants of ``resource`` made after ``since`` (the rate window), through the time index."""
    h = t.history
    return select(func.count()).select_from(h).where(
        h.c.namespace == namespace, h.c.resource == resource, h.c.granted_at > since)


def window_times(t: ControlSchema, namespace: str, resource: str, since: float) -> Select:  # type: ignore[type-arg]
    """The grant times of ``resource`` after ``since``, oldest first (to find the next opening)."""
    h = t.history
    return (select(h.c.granted_at).where(h.c.namespace == namespace, h.c.resource == resource,
                                         h.c.granted_at > since).order_by(h.c.granted_at))


def last_left(t: ControlSchema, namespace: str, resource: str, before: float) -> Select:  # type: ignore[type-arg]
    """The newest grant time at or before ``before`` (the grant that last left the window)."""
    h = t.history
    return select(func.max(h.c.granted_at)).where(
        h.c.namespace == namespace, h.c.resource == resource, h.c.granted_at <= before)


def records_query(t: ControlSchema, namespace: str, resource: Optional[str], since: float,
                  limit: int) -> Select:  # type: ignore[type-arg]
    h = t.history
    query = select(h).where(h.c.namespace == namespace, h.c.granted_at >= since)
    if resource is not None:
        query = query.where(h.c.resource == resource)
    return query.order_by(h.c.granted_at.desc(), h.c.token.desc()).limit(limit)


def overlapping(t: ControlSchema, namespace: str, resource: str, start: float, end: float) -> Select:  # type: ignore[type-arg]
    """Grants of ``resource`` that overlap ``[start, end)`` (made before its end, not ended before its start)."""
    h = t.history
    return select(h.c.slots, h.c.enqueued_at, h.c.granted_at, h.c.ended_at, h.c.outcome).where(
        h.c.namespace == namespace, h.c.resource == resource, h.c.granted_at < end,
        or_(h.c.ended_at.is_(None), h.c.ended_at > start),
    )


def prune_edge(t: ControlSchema, namespace: str, resource: str, before: float, batch: int) -> Select:  # type: ignore[type-arg]
    """The grant time of the ``batch``-th oldest ended grant made before ``before`` (None: fewer)."""
    h = t.history
    return (
        select(h.c.granted_at)
        .where(h.c.namespace == namespace, h.c.resource == resource, h.c.granted_at < before, h.c.outcome != HELD)
        .order_by(h.c.granted_at)
        .offset(batch - 1)
        .limit(1)
    )


def delete_ended(t: ControlSchema, namespace: str, resource: str, upto: float, inclusive: bool) -> Delete:
    """Delete the ended grants of ``resource`` made before (or at) ``upto``: a range of the time
    index, so the plan does not depend on the table's statistics (a list of keys may be scanned)."""
    h = t.history
    edge = h.c.granted_at <= upto if inclusive else h.c.granted_at < upto
    return delete(h).where(h.c.namespace == namespace, h.c.resource == resource, edge, h.c.outcome != HELD)


def delete_resource(t: ControlSchema, namespace: str, resource: str) -> Delete:
    """A deleted resource's history goes with it (a new resource of that name restarts its tokens)."""
    h = t.history
    return delete(h).where(h.c.namespace == namespace, h.c.resource == resource)


# -- pure computations ------------------------------------------------------------------------------
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
    """Statistics of ``[start, end)`` from the history rows that overlap it (see :func:`overlapping`).

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
