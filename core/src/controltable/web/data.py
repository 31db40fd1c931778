"""What the status page and ``/metrics`` show, gathered through the core's public API only.

The page is a *reader*: it holds no state of the coordination itself, so any number of pages (the
standalone server, the one mounted in Airflow) can look at the same control table. One
:meth:`StatusSource.snapshot` reads every resource, event table and work list once and returns
plain, JSON-ready dictionaries; the HTML page, the JSON endpoint and the Prometheus collector all
render that one snapshot, so they never disagree.

The grant history (``ControlTable.stats``, ``stats_series``, ``history``) and the slot policies
(``ResourceStatus.rate``, ``Entry.priority``, ``Entry.ahead``) are optional here: a core without
them shows "-" for the missing fields and a note instead of charts, rather than failing.

Event tables and work lists are not registered in the control table, so which ones to show is
configuration (``--events``, ``--worklist``), validated when parsed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping, Optional, Sequence

from ..control import ControlTable
from ..defaults import WEB_ERROR_ROWS
from ..errors import ConfigurationError, ControlTableError
from ..slots import Entry, Rate
from ..validation import check_identifier, check_name
from ..waiting_text import jsonable

#: The chart windows: (label, seconds, buckets).
CHART_WINDOWS: tuple[tuple[str, float, int], ...] = (("hour", 3600.0, 12), ("day", 86400.0, 24))
#: How long event-table samples are kept for the per-minute rates (seconds).
RATE_HORIZON = 300.0
#: How long the page reuses doctor's findings (seconds): they change rarely, and doctor sends a
#: notification and opens probe connections, which a page polled every 2 s should not do each time.
DOCTOR_REFRESH = 60.0


# -- configuration -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EventSpec:
    """An event table to show: ``[SCHEMA.]TABLE:KEY[:ORDER_BY[:TIME_COLUMN]]`` on the command line."""

    table: str
    key: str
    order_by: Optional[str] = None
    time_column: Optional[str] = None
    schema: Optional[str] = None

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table


def parse_event_spec(text: str) -> EventSpec:
    """Parse and validate one ``--events`` value; raises :class:`ConfigurationError` saying the form."""
    form = "[SCHEMA.]TABLE:KEY[:ORDER_BY[:TIME_COLUMN]], e.g. rainfall_events:event_id:event_id:created_at"
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(f"--events needs a value of the form {form}")
    parts = text.strip().split(":")
    if len(parts) < 2 or len(parts) > 4 or not all(parts[:2]):
        raise ConfigurationError(f"--events {text!r}: expected {form} (the key column is needed to read the table)")
    name, key = parts[0], parts[1]
    order_by = parts[2] if len(parts) > 2 and parts[2] else None
    time_column = parts[3] if len(parts) > 3 and parts[3] else None
    schema: Optional[str] = None
    if "." in name:
        schema, name = name.split(".", 1)
        schema = check_identifier("schema", schema)
    return EventSpec(
        table=check_identifier("table", name),
        key=check_identifier("key column", key),
        order_by=check_identifier("order_by column", order_by) if order_by else None,
        time_column=check_identifier("time_column", time_column) if time_column else None,
        schema=schema,
    )


# -- pure helpers (unit-tested without a database) ------------------------------------------------------
def epoch(ts: Optional[datetime]) -> Optional[float]:
    return ts.timestamp() if ts is not None else None


def entry_view(entry: Entry, now: float) -> dict[str, Any]:
    """One holder or waiter as the page shows it (times as epoch seconds and ages on the database clock)."""
    since = epoch(entry.since)
    expires = epoch(entry.expires_at)
    return {
        "holder": entry.holder,
        "mode": entry.mode,
        "slots": entry.slots,
        "state": entry.state,
        "token": entry.token,
        "position": entry.position,
        "since": since,
        "age": None if since is None else max(0.0, now - since),
        "expires_at": expires,
        "expires_in": None if expires is None else expires - now,
        "expired": entry.expired,
        "priority": entry.priority,
        "effective_priority": entry.effective_priority,
        "ahead": list(entry.ahead),
    }


def rate_view(rate: Optional[Rate]) -> Optional[dict[str, Any]]:
    if rate is None:
        return None
    return {"count": rate.count, "per": float(rate.per), "text": f"{rate.count} per {_seconds_text(float(rate.per))}"}


def _seconds_text(seconds: float) -> str:
    for unit, size in (("day", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return unit if n == 1 and unit == "day" else f"{n} {unit}"
    return f"{seconds:g} s"


def stats_view(st: Any) -> dict[str, Any]:
    """A ``ResourceStats`` as a dictionary (any field the core lacks is ``None``)."""
    fields = ("resource", "start", "end", "capacity", "grants", "wait_p50", "wait_p95", "wait_max",
              "utilisation", "grants_per_hour", "expired")
    out: dict[str, Any] = {}
    for name in fields:
        value = getattr(st, name, None)
        out[name] = epoch(value) if isinstance(value, datetime) else value
    return out


def order_by_activity(resources: list[dict[str, Any]], recent_grants: Mapping[str, int]) -> list[dict[str, Any]]:
    """The resources with ``active`` set, active ones first, each group by name (a stable layout).

    Active: a holder or a waiter now, or a grant in the last hour (``recent_grants``). In a
    deployment with many resources most are idle at any time; the page shows the active ones as
    cards and folds the idle ones into one line, so the busy resource is not the ninth card.
    """
    for r in resources:
        r["active"] = bool(r["holders"] or r["waiters"] or recent_grants.get(r["name"], 0))
    return sorted(resources, key=lambda r: (not r["active"], r["name"]))


def per_minute(samples: Sequence[tuple[float, int]], now: float, horizon: float = RATE_HORIZON) -> Optional[float]:
    """The rate per minute of a growing count from ``(time, count)`` samples within ``horizon``.

    ``None`` until two samples at least 1 s apart exist. A count that fell (rows deleted, errors
    retried) restarts the measurement at the fall, so the rate is never negative.
    """
    recent = [(t, c) for t, c in samples if now - t <= horizon]
    start = 0
    for i in range(1, len(recent)):
        if recent[i][1] < recent[i - 1][1]:
            start = i
    recent = recent[start:]
    if len(recent) < 2 or recent[-1][0] - recent[0][0] < 1.0:
        return None
    (t0, c0), (t1, c1) = recent[0], recent[-1]
    return (c1 - c0) * 60.0 / (t1 - t0)


def worklist_blocker(status: Any, active: list[dict[str, Any]], errors: list[dict[str, Any]]) -> Optional[str]:
    """In words, what keeps the next order of a work list from starting (``None`` when finished)."""
    current = getattr(status, "current_order", None)
    if current is None:
        return None
    later = [o.order for o in status.orders if o.order > current]
    nxt = f"order {later[0]}" if later else "the end of the list"
    order = next((o for o in status.orders if o.order == current), None)
    if order is None:
        return None
    reasons = []
    if getattr(status, "blocked_by_errors", False):
        keys = ", ".join(f"#{e['id']}" for e in errors[:5])
        return (f"{nxt} is blocked by {order.error} failed item(s) of order {current} ({keys}): "
                "clear or retry them")
    if order.new:
        reasons.append(f"{order.new} new")
    live = order.active - order.expired
    if live > 0:
        owners = sorted({str(a.get("owner")) for a in active if a.get("owner")})
        reasons.append(f"{live} active" + (f" (held by {', '.join(owners[:5])})" if owners else ""))
    if order.expired:
        reasons.append(f"{order.expired} active with an expired lease (to be reclaimed)")
    if order.error:
        reasons.append(f"{order.error} failed")
    return f"{nxt} waits for order {current}: " + ", ".join(reasons)


# -- the source --------------------------------------------------------------------------------------
class StatusSource:
    """Reads one control table (and the configured event tables and work lists) into snapshots.

    Thread-safe: the ASGI app calls :meth:`snapshot` from worker threads. The event-table rate
    samples are the only state kept between calls.
    """

    def __init__(
        self,
        ct_or_factory: ControlTable | Callable[[], ControlTable],
        *,
        events: Sequence[EventSpec] = (),
        worklists: Sequence[str] = (),
        error_rows: int = WEB_ERROR_ROWS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._factory = ct_or_factory if callable(ct_or_factory) and not isinstance(
            ct_or_factory, ControlTable) else None
        self._ct: Optional[ControlTable] = ct_or_factory if isinstance(ct_or_factory, ControlTable) else None
        self.event_specs = list(events)
        self.worklists = [check_name("work list", w) for w in worklists]
        self.error_rows = error_rows
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[str, deque[tuple[float, int, int]]] = {}
        self._event_tables: dict[str, Any] = {}
        self._doctor: Optional[tuple[float, list[dict[str, str]]]] = None
        self._doctor_lock = threading.Lock()

    @property
    def ct(self) -> ControlTable:
        """The control table, opened on first use (inside Airflow: when the page is first asked for)."""
        if self._ct is None:
            with self._lock:
                if self._ct is None:
                    assert self._factory is not None
                    self._ct = self._factory()
        return self._ct

    # -- pieces --------------------------------------------------------------------------------------
    def resources(self, now: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for st in self.ct.status():
            holders = [entry_view(h, now) for h in st.holders]
            waiters = [entry_view(w, now) for w in st.waiters]
            oldest = max((w["age"] for w in waiters if w["age"] is not None), default=None)
            out.append({
                "name": st.name,
                "capacity": st.capacity,
                "used": st.used,
                "last_token": st.last_token,
                "rate": rate_view(st.rate),
                "rate_opens_in": st.rate_opens_in,
                "aging": st.aging,
                "holders": holders,
                "waiters": waiters,
                "expired_holders": sum(1 for h in holders if h["expired"]),
                "oldest_wait": oldest,
            })
        return order_by_activity(out, self._recent_grants())

    def _recent_grants(self) -> dict[str, int]:
        """Grants per resource in the last hour (empty when the grant history cannot be read: then
        only holders and waiters make a resource active)."""
        try:
            return {s.resource: int(s.grants) for s in self.ct.stats(window=3600.0)}
        except ControlTableError:
            return {}

    def stats(self, names: list[str]) -> dict[str, Any]:
        """Windowed statistics and chart series per resource, or a note saying why there are none."""
        ct = self.ct
        current = {s.resource: stats_view(s) for s in ct.stats(names or None, window=3600.0)} if names else {}
        series: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for name in names:
            series[name] = {label: [stats_view(s) for s in ct.stats_series(name, window=window, buckets=buckets)]
                            for label, window, buckets in CHART_WINDOWS}
        return {"available": True, "current": current, "series": series}

    def waits(self, since: float = 3600.0) -> dict[str, list[float]]:
        """Wait seconds of the grants in the last ``since`` seconds per resource (for the histogram)."""
        out: dict[str, list[float]] = {}
        for rec in self.ct.history(since=since):
            out.setdefault(rec.resource, []).append(float(rec.wait_seconds))
        return out

    def _event_table(self, spec: EventSpec) -> Any:
        table = self._event_tables.get(spec.label)
        if table is None:
            table = self.ct.events(spec.table, key=spec.key, order_by=spec.order_by, table_schema=spec.schema,
                                   time_column=spec.time_column)
            self._event_tables[spec.label] = table
        return table

    def events(self, now: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for spec in self.event_specs:
            try:
                ev = self._event_table(spec)
                st = ev.stats()
                errors = ev.error_rows(self.error_rows) if st.error else []
            except ControlTableError as exc:
                out.append({"table": spec.label, "problem": str(exc)})
                continue
            with self._lock:
                samples = self._samples.setdefault(spec.label, deque(maxlen=600))
                samples.append((now, st.claimed + st.done + st.error, st.done))
                while samples and now - samples[0][0] > RATE_HORIZON:
                    samples.popleft()
                claims = per_minute([(t, c) for t, c, _ in samples], now)
                completions = per_minute([(t, d) for t, _, d in samples], now)
            out.append({
                **st.as_dict(), "table": spec.label,
                "oldest_pending_key": jsonable(st.oldest_pending_key),
                "claims_per_minute": claims, "completions_per_minute": completions,
                "errors": [{**e, "key": jsonable(e["key"])} for e in errors],
            })
        return out

    def worklists_view(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for name in self.worklists:
            try:
                wl = self.ct.worklist(name)
                st = wl.status()
                errors = wl.items_list(state="error", limit=self.error_rows) if st.total("error") else []
                active = wl.items_list(state="active", limit=50) if st.total("active") else []
            except ControlTableError as exc:
                out.append({"name": name, "problem": str(exc)})
                continue
            orders = [{"order": o.order, "new": o.new, "active": o.active, "done": o.done, "error": o.error,
                       "expired": o.expired} for o in st.orders]
            total = sum(o["new"] + o["active"] + o["done"] + o["error"] for o in orders)
            out.append({
                "name": name,
                "orders": orders,
                "current_order": st.current_order,
                "finished": st.finished,
                "done": sum(o["done"] for o in orders),
                "total": total,
                "blocked_by_errors": st.blocked_by_errors,
                "blocker": worklist_blocker(st, active, errors),
                "errors": [{"id": e["id"], "order": e["exec_order"], "attempts": e.get("attempts"),
                            "error": e.get("last_error")} for e in errors],
            })
        return out

    def push(self) -> dict[str, Any]:
        """Whether push wake-ups reach this process (``ControlTable.push_status``)."""
        st = self.ct.push_status()
        return {"active": st.active, "state": st.state, "detail": st.detail, "listen_url": st.listen_url,
                "round_trip_ms": st.round_trip_ms}

    def doctor(self) -> list[dict[str, str]]:
        """``ControlTable.doctor()`` over the configured event tables, reused for :data:`DOCTOR_REFRESH` s."""
        with self._doctor_lock:
            now = self._clock()
            if self._doctor is None or now - self._doctor[0] >= DOCTOR_REFRESH:
                tables = []
                for spec in self.event_specs:
                    try:
                        tables.append(self._event_table(spec))
                    except ControlTableError:
                        continue  # the event table's own card says what is wrong
                self._doctor = (now, [f.as_dict() for f in self.ct.doctor(event_tables=tables)])
            return self._doctor[1]

    # -- the whole picture ---------------------------------------------------------------------------
    def snapshot(self, *, charts: bool = True) -> dict[str, Any]:
        """Everything the page shows, read now; ``charts=False`` skips the history series."""
        ct = self.ct
        now = ct.now()
        resources = self.resources(now)
        # Chart series for the resources that get a card (idle ones are folded into a line).
        active = [r["name"] for r in resources if r["active"]]
        stats = self.stats(active) if charts else {"available": True, "charts": False}
        return {
            "namespace": ct.namespace,
            "database": ct.db.safe_url,
            "now": now,
            "resources": resources,
            "stats": stats,
            "events": self.events(now),
            "worklists": self.worklists_view(),
            "push": self.push(),
            "doctor": self.doctor(),
        }
