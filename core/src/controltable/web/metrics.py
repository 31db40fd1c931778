"""``/metrics``: the snapshot of :mod:`controltable.web.data` in the Prometheus text format.

A custom collector rather than module-level gauges: every scrape reads the control table afresh
(the page keeps no counters of its own), and resources that disappear stop being exported instead
of freezing at their last value. Metric names start with ``controltable_``; labels are the resource,
event table or work list name (Prometheus escapes label values itself).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

#: Upper bounds (seconds) of the wait-time histogram buckets.
WAIT_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)


def histogram_buckets(values: list[float], bounds: tuple[float, ...] = WAIT_BUCKETS) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, ending with ``+Inf`` (a pure function, unit-tested)."""
    out = [(floatToGoString(b), float(sum(1 for v in values if v <= b))) for b in bounds]
    out.append(("+Inf", float(len(values))))
    return out


class SnapshotCollector:
    """Turns one snapshot (plus grant waits from the history, when the core records it) into metrics."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], waits: Callable[[], dict[str, list[float]]]) -> None:
        self._snapshot = snapshot
        self._waits = waits

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        res = snap["resources"]
        r = ["resource"]
        capacity = GaugeMetricFamily("controltable_resource_capacity", "Slots a resource has", labels=r)
        used = GaugeMetricFamily("controltable_resource_used_slots", "Slots held now", labels=r)
        holders = GaugeMetricFamily("controltable_resource_holders", "Holders now", labels=r)
        expired = GaugeMetricFamily("controltable_resource_expired_holders",
                                    "Holders whose lease ran out and that are not reaped yet (died)", labels=r)
        waiters = GaugeMetricFamily("controltable_resource_waiters", "Requests waiting in the queue", labels=r)
        oldest = GaugeMetricFamily("controltable_resource_oldest_wait_seconds",
                                   "How long the longest-waiting request has waited", labels=r)
        tokens = CounterMetricFamily("controltable_resource_grants",
                                     "Grants made since the resource was created (its last fencing token)",
                                     labels=r)
        for item in res:
            n = [item["name"]]
            capacity.add_metric(n, item["capacity"])
            used.add_metric(n, item["used"])
            holders.add_metric(n, len(item["holders"]))
            expired.add_metric(n, item["expired_holders"])
            waiters.add_metric(n, len(item["waiters"]))
            oldest.add_metric(n, item["oldest_wait"] or 0.0)
            tokens.add_metric(n, item["last_token"])
        yield from (capacity, used, holders, expired, waiters, oldest, tokens)

        stats = snap.get("stats") or {}
        if stats.get("available"):
            grants = GaugeMetricFamily("controltable_resource_grants_last_hour", "Grants in the last hour", labels=r)
            lease_expiries = GaugeMetricFamily(
                "controltable_resource_lease_expiries_last_hour",
                "Holders whose lease expired (holders that died) in the last hour", labels=r)
            util = GaugeMetricFamily("controltable_resource_utilisation_last_hour",
                                     "Share of the capacity held over the last hour (0..1)", labels=r)
            p50 = GaugeMetricFamily("controltable_resource_wait_p50_seconds",
                                    "Median wait of the grants of the last hour", labels=r)
            p95 = GaugeMetricFamily("controltable_resource_wait_p95_seconds",
                                    "95th percentile wait of the grants of the last hour", labels=r)
            for name, st in sorted(stats.get("current", {}).items()):
                for family, key in ((grants, "grants"), (lease_expiries, "expired"), (util, "utilisation"),
                                    (p50, "wait_p50"), (p95, "wait_p95")):
                    if st.get(key) is not None:
                        family.add_metric([name], float(st[key]))
            yield from (grants, lease_expiries, util, p50, p95)

        waits = self._waits()
        hist = HistogramMetricFamily("controltable_resource_wait_seconds",
                                     "Wait before each grant of the last hour", labels=r)
        for name in sorted(set(waits) | {item["name"] for item in res}):
            values = waits.get(name, [])
            hist.add_metric([name], histogram_buckets(values), sum_value=sum(values))
        yield hist

        ev_rows = GaugeMetricFamily("controltable_events_rows", "Rows of an event table per claim state",
                                    labels=["table", "state"])
        ev_age = GaugeMetricFamily("controltable_events_oldest_pending_age_seconds",
                                   "Age of the oldest pending row (needs the table's time column)",
                                   labels=["table"])
        ev_up = GaugeMetricFamily("controltable_events_readable", "1 if the event table could be read",
                                  labels=["table"])
        for ev in snap.get("events", []):
            ok = "problem" not in ev
            ev_up.add_metric([ev["table"]], 1.0 if ok else 0.0)
            if not ok:
                continue
            for state in ("pending", "claimed", "expired", "done", "error"):
                ev_rows.add_metric([ev["table"], state], ev[state])
            if ev.get("oldest_pending_age") is not None:
                ev_age.add_metric([ev["table"]], float(ev["oldest_pending_age"]))
        yield from (ev_rows, ev_age, ev_up)

        wl_items = GaugeMetricFamily("controltable_worklist_items", "Work-list items per state",
                                     labels=["worklist", "state"])
        wl_order = GaugeMetricFamily("controltable_worklist_current_order",
                                     "The order being worked on (absent when finished)", labels=["worklist"])
        for wl in snap.get("worklists", []):
            if "problem" in wl:
                continue
            for state in ("new", "active", "done", "error"):
                wl_items.add_metric([wl["name"], state], sum(o[state] for o in wl["orders"]))
            if wl["current_order"] is not None:
                wl_order.add_metric([wl["name"]], wl["current_order"])
        yield from (wl_items, wl_order)

        push = snap.get("push")
        if push is not None:
            yield GaugeMetricFamily("controltable_push_active",
                                    "1 if push wake-ups reach this process (else waiters poll: set listen_url "
                                    "behind a pooler in transaction mode)", value=1.0 if push["active"] else 0.0)
        if snap.get("doctor") is not None:
            findings = GaugeMetricFamily("controltable_doctor_findings", "doctor's findings per level",
                                         labels=["level"])
            for level in ("ok", "info", "warning", "error"):
                findings.add_metric([level], float(sum(1 for f in snap["doctor"] if f["level"] == level)))
            yield findings


def render(snapshot: Callable[[], dict[str, Any]], waits: Callable[[], dict[str, list[float]]]) -> bytes:
    """The text exposition of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, waits))  # type: ignore[arg-type]
    return generate_latest(registry)
