"""Independent checks of recorded hold intervals: capacity, exclusivity and FIFO were never violated.

Workers record wall-clock intervals *inside* their hold (after acquire returned, before release
was called), so a recorded interval is a subset of the real one: any overlap found here is a real
violation. The checks use only those records, not the control table's own bookkeeping, except
for FIFO, which compares the two sequences the database assigns independently: queue tickets
(at enqueue) and fencing tokens (at grant). Strict FIFO means grants happen in ticket order.

The slot policies are checked from the grant history (``ControlTable.history()``): the rate was
never exceeded in any window, no grant passed over a waiter with a higher effective priority,
and with aging no wait exceeded the bound aging implies.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Optional


@dataclass(frozen=True)
class Interval:
    """One grant as a worker saw it."""

    worker: str
    resource: str
    mode: str
    slots: int
    start: float
    end: float
    ticket: int
    token: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_usage(intervals: Iterable[Interval]) -> tuple[int, int]:
    """(peak slots in use at once, peak number of holders at once) over the intervals given."""
    points: list[tuple[float, int, Interval]] = []
    for iv in intervals:
        points.append((iv.start, 1, iv))
        points.append((iv.end, 0, iv))  # ends sort before starts at the same instant
    points.sort(key=lambda p: (p[0], p[1]))
    used = holders = peak_used = peak_holders = 0
    for _, kind, iv in points:
        if kind == 1:
            used += iv.slots
            holders += 1
            peak_used, peak_holders = max(peak_used, used), max(peak_holders, holders)
        else:
            used -= iv.slots
            holders -= 1
    return peak_used, peak_holders


def violations(intervals: Iterable[Interval], capacities: Mapping[str, int]) -> list[str]:
    """Every violation of capacity, exclusivity or FIFO found in the records (empty: all good)."""
    problems: list[str] = []
    by_resource: dict[str, list[Interval]] = {}
    for iv in intervals:
        by_resource.setdefault(iv.resource, []).append(iv)
    for resource, ivs in by_resource.items():
        cap = capacities[resource]
        points: list[tuple[float, int, Interval]] = []
        for iv in ivs:
            if iv.end < iv.start:
                problems.append(f"{resource}: interval of {iv.worker} ends before it starts")
            points.append((iv.start, 1, iv))
            points.append((iv.end, 0, iv))
        points.sort(key=lambda p: (p[0], p[1]))
        active: dict[int, Interval] = {}
        for t, kind, iv in points:
            if kind == 0:
                active.pop(id(iv), None)
                continue
            active[id(iv)] = iv
            shared = sum(a.slots for a in active.values() if a.mode == "shared")
            exclusive = [a for a in active.values() if a.mode == "exclusive"]
            if shared > cap:
                problems.append(f"{resource}: {shared} shared slots in use at {t:.6f}, capacity {cap}")
            if exclusive and len(active) > 1:
                who = ", ".join(sorted(a.worker for a in active.values()))
                problems.append(f"{resource}: exclusive holder not alone at {t:.6f}: {who}")
        tokens = [iv.token for iv in sorted(ivs, key=lambda i: i.ticket)]
        if len(set(tokens)) != len(tokens):
            problems.append(f"{resource}: a fencing token was granted twice")
        for a, b in zip(tokens, tokens[1:]):
            if b <= a:
                problems.append(f"{resource}: FIFO violated: a later ticket was granted token {a} before {b}")
                break
    return problems


# -- slot policies: rate, priority order, aging --------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    """One grant as the grant history recorded it (database clock, epoch seconds).

    Built from :class:`controltable.GrantRecord` with :meth:`from_record`; the policy checks
    below judge the engine's decisions from these records alone.
    """

    resource: str
    holder: str
    priority: int
    enqueued_at: float
    granted_at: float
    slots: int = 1
    mode: str = "shared"

    @classmethod
    def from_record(cls, record: Any) -> Grant:
        return cls(record.resource, record.holder, int(record.priority), record.enqueued_at.timestamp(),
                   record.granted_at.timestamp(), int(record.slots), record.mode)


def rate_violations(grants: Iterable[Grant], rates: Mapping[str, tuple[int, float]]) -> list[str]:
    """Every window of ``per`` seconds that saw more than ``count`` grants of a rate-limited resource.

    ``count + 1`` grants whose first and last are less than ``per`` apart fit in one window.
    """
    problems: list[str] = []
    times: dict[str, list[float]] = {}
    for g in grants:
        times.setdefault(g.resource, []).append(g.granted_at)
    for resource, (count, per) in rates.items():
        ts = sorted(times.get(resource, []))
        for i in range(len(ts) - count):
            if ts[i + count] - ts[i] < per - 1e-6:  # float rounding of the stored clock
                problems.append(f"{resource}: {count + 1} grants within {ts[i + count] - ts[i]:.3f} s "
                                f"(rate {count}/{per:g}s) from {ts[i]:.6f}")
                break
    return problems


def _effective(g: Grant, t: float, aging: Optional[float]) -> float:
    return g.priority + (max(t - g.enqueued_at, 0.0) / aging if aging else 0.0)


def priority_violations(grants: Iterable[Grant], aging: Mapping[str, Optional[float]] | None = None,
                        epsilon: float = 1e-6) -> list[str]:
    """Every grant made while a waiter with a higher effective priority waited on the same resource.

    A waiter (enqueued before the grant, granted after it) that outranks the grant's request
    would have been first in the queue, and the head of a queue is never overtaken (it blocks
    the queue until it fits), so this is stricter than "no waiter that fitted was passed over".
    Equal effective priorities go in queue order, which the records do not hold: not judged.
    """
    aging = aging or {}
    problems: list[str] = []
    by_resource: dict[str, list[Grant]] = {}
    for g in grants:
        by_resource.setdefault(g.resource, []).append(g)
    for resource, gs in by_resource.items():
        a = aging.get(resource)
        for g in gs:
            t = g.granted_at
            for w in gs:
                if w is g or not (w.enqueued_at < t < w.granted_at):
                    continue
                if _effective(w, t, a) > _effective(g, t, a) + epsilon:
                    problems.append(
                        f"{resource}: {g.holder} (effective priority {_effective(g, t, a):.3f}) was granted at "
                        f"{t:.6f} while {w.holder} (effective {_effective(w, t, a):.3f}) waited")
    return problems


def aging_violations(grants: Iterable[Grant], aging: Mapping[str, float], max_priority: int,
                     slack: float) -> list[str]:
    """Waits longer than aging allows: with ``aging`` seconds per step, a waiter of priority ``p``
    outranks every request made ``aging * (max_priority - p)`` seconds after it, so it waits at
    most that long plus ``slack`` (the time the requests already ahead of it take to run)."""
    problems: list[str] = []
    for g in grants:
        a = aging.get(g.resource)
        if a is None:
            continue
        bound = a * max(max_priority - g.priority, 0) + slack
        waited = g.granted_at - g.enqueued_at
        if waited > bound:
            problems.append(f"{g.resource}: {g.holder} (priority {g.priority}) waited {waited:.3f} s, "
                            f"more than aging allows ({bound:.3f} s)")
    return problems
