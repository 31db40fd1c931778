"""Independent checks of recorded hold intervals: capacity, exclusivity and FIFO were never violated.

Workers record wall-clock intervals *inside* their hold (after acquire returned, before release
was called), so a recorded interval is a subset of the real one: any overlap found here is a real
violation. The checks use only those records, not the control table's own bookkeeping, except
for FIFO, which compares the two sequences the database assigns independently: queue tickets
(at enqueue) and fencing tokens (at grant). Strict FIFO means grants happen in ticket order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping


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
