"""Reading the slots: ``status``, ``wait_info``, ``find_lease``, the grant history and its statistics; pruning it.

:class:`Reports` reads; it takes no resource lock and needs only the database, the tables and the
namespace, plus the :class:`~.values.LeaseEngine` that the leases ``find_lease`` rebuilds renew and
release through. :class:`HistoryPruner` deletes old history in short batches (``prune_history``, and
now and then after a release). The figures are computed by :mod:`.history` and :mod:`.grants`.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Mapping, Optional

from sqlalchemy.engine import Connection

from .. import dialects
from ..clock import read_now, utc
from ..db import Database
from ..defaults import HISTORY_PRUNE_BATCH, HISTORY_PRUNE_INTERVAL, HISTORY_RETENTION
from ..errors import UnknownResourceError
from . import grants
from .history import compute_stats, to_record
from .statements import GRANTED, WAITING, SlotStatements
from .values import Entry, GrantRecord, Lease, LeaseEngine, Rate, ResourceStats, ResourceStatus, WaitInfo

log = logging.getLogger("controltable")


class Reports:
    """Where holders and waiters stand, and what the grant history says."""

    def __init__(self, db: Database, statements: SlotStatements, leases: LeaseEngine) -> None:
        self.db = db
        self.sql = statements
        self.ns = statements.ns
        #: What the leases :meth:`find_lease` rebuilds renew and release through.
        self.leases = leases

    # -- where a holder stands -----------------------------------------------------------------
    def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        """Where ``holder`` stands on ``resource``: None when it neither holds nor waits."""
        def fn(conn: Connection) -> tuple[float, Optional[Any], list[Any]]:
            now = read_now(conn)
            mine = conn.execute(*self.sql.own_entry(resource, holder)).first()
            if mine is None or mine.state == GRANTED:
                return now, mine, []
            return now, mine, list(conn.execute(*self.sql.ahead_of(resource, mine)).all())

        now, mine, ahead = self.db.run(fn)
        if mine is None or float(mine.expires_at) < now:
            return None
        live = [row for row in ahead if float(row.expires_at) >= now]
        waiting_ahead = sum(1 for row in live if row.state == WAITING)
        return WaitInfo(
            resource=resource,
            holder=holder,
            state=str(mine.state),
            position=0 if mine.state == GRANTED else waiting_ahead + 1,
            ahead=[str(row.holder) for row in live],
            waiting_since=utc(float(mine.enqueued_at)),
            token=None if mine.token is None or mine.state != GRANTED else int(mine.token),
            expires_at=utc(float(mine.expires_at)),
        )

    def find_lease(self, resource: str, holder: str) -> Optional[Lease]:
        """The live lease ``holder`` has on ``resource``, rebuilt from the table (for other processes)."""
        def fn(conn: Connection) -> list[Any]:
            key = conn.scalar(*self.sql.granted_key(resource, holder))
            if key is None:
                return []
            return list(conn.execute(*self.sql.request_by_key(key)).all())

        rows = self.db.run(fn)
        if not rows:
            return None
        return Lease(
            self.leases,
            resources={row.resource: int(row.slots) for row in rows},
            mode=rows[0].mode,
            holder=holder,
            request_key=rows[0].request_key,
            tokens={row.resource: int(row.token) for row in rows},
            lease_seconds=float(rows[0].lease_seconds),
            expires_at=float(rows[0].expires_at),
            granted_at=float(rows[0].granted_at),
            ticket=int(rows[0].ticket),
            attempt=None if rows[0].attempt is None else int(rows[0].attempt),
        )

    # -- observing ---------------------------------------------------------------------------
    def status(self, names: Optional[list[str]] = None) -> list[ResourceStatus]:
        def fn(conn: Connection) -> tuple[float, list[Any], list[Any], dict[str, list[float]]]:
            now = read_now(conn)
            resources = list(conn.execute(*self.sql.resources(names)).all())
            # The rate window's grant times, for the resources that have a rate (when it next opens).
            times = {res.name: [float(t) for t in conn.execute(
                *self.sql.window_times(res.name, now - float(res.rate_per))).scalars()]
                for res in resources if res.rate_count is not None and res.rate_per is not None}
            return now, resources, list(conn.execute(*self.sql.requests(names)).all()), times

        now, resources, requests, times = self.db.run(fn)
        out = []
        for res in resources:
            aging = None if res.aging is None else float(res.aging)
            rate = None if res.rate_count is None else Rate(int(res.rate_count), float(res.rate_per))
            st = ResourceStatus(res.name, int(res.capacity), 0, int(res.last_token), rate=rate, aging=aging)
            if rate is not None:
                st.rate_opens_in = grants.opens_in(rate.count, rate.per, times.get(res.name, []), now)
            mine = [row for row in requests if row.resource == res.name]
            waiting = sorted((row for row in mine if row.state != GRANTED),
                             key=lambda row: (grants.queue_key(int(row.priority), float(row.enqueued_at), aging),
                                              int(row.ticket)))
            live_ahead: list[str] = []
            for row in mine:
                if row.state != GRANTED:
                    continue
                expired = float(row.expires_at) < now
                eff = grants.effective_priority(int(row.priority), float(row.enqueued_at), float(row.granted_at), aging)
                st.holders.append(Entry(row.holder, int(row.slots), row.mode, row.state, utc(row.granted_at),
                                        utc(row.expires_at), int(row.token), 0, expired, int(row.priority), eff))
                if not expired:
                    st.used += int(row.slots)
                    live_ahead.append(row.holder)
            pos = 0
            for row in waiting:
                expired = float(row.expires_at) < now
                pos += 0 if expired else 1
                eff = grants.effective_priority(int(row.priority), float(row.enqueued_at), now, aging)
                st.waiters.append(Entry(row.holder, int(row.slots), row.mode, row.state, utc(row.enqueued_at),
                                        utc(row.expires_at), None, pos, expired, int(row.priority), eff,
                                        list(live_ahead)))
                if not expired:
                    live_ahead.append(row.holder)
            out.append(st)
        return out

    # -- history -----------------------------------------------------------------------------
    def history(self, resource: Optional[str], since: float, limit: int) -> list[GrantRecord]:
        def fn(conn: Connection) -> list[Any]:
            return list(conn.execute(*self.sql.records(resource, read_now(conn) - since, limit)).all())

        return [to_record(row) for row in self.db.run(fn)]

    def stats(self, names: Optional[list[str]], window: float) -> list[ResourceStats]:
        """Per resource (all when ``names`` is None), statistics of the last ``window`` seconds."""

        def fn(conn: Connection) -> list[ResourceStats]:
            now = read_now(conn)
            out = []
            for row in conn.execute(*self.sql.capacities(names)).all():
                rows = conn.execute(*self.sql.overlapping(row.name, now - window, now)).all()
                out.append(compute_stats(row.name, int(row.capacity), rows, now - window, now))
            return out

        return self.db.run(fn)

    def stats_series(self, name: str, window: float, buckets: int) -> list[ResourceStats]:
        def fn(conn: Connection) -> list[ResourceStats]:
            now = read_now(conn)
            capacity = conn.scalar(*self.sql.capacity_of(name))
            if capacity is None:
                raise UnknownResourceError(
                    f"resource {name!r} does not exist in namespace {self.ns!r}; check the name and namespace")
            start = now - window
            rows = conn.execute(*self.sql.overlapping(name, start, now)).all()
            step = window / buckets
            return [compute_stats(name, int(capacity), rows, start + i * step, start + (i + 1) * step)
                    for i in range(buckets)]

        return self.db.run(fn)


class HistoryPruner:
    """Deletes ended grants from the history in short batches, on demand and now and then after a release."""

    def __init__(self, db: Database, statements: SlotStatements) -> None:
        self.db = db
        self.sql = statements
        self.t = statements.t
        #: When this process next prunes a batch after a release (``time.monotonic()``): at a random
        #: moment per process, so processes started together do not prune together.
        self.next_prune = time.monotonic() + HISTORY_PRUNE_INTERVAL * random.random()

    def pause(self) -> None:
        """Never prune after a release from now on (``prune_history`` still prunes): for a session
        whose statements must not depend on when pruning happens (``controltable sql``)."""
        self.next_prune = float("inf")

    def prune_history(self, older_than: float, names: Optional[list[str]] = None,
                      max_batches: Optional[int] = None) -> int:
        """Delete ended grants made more than ``older_than`` seconds ago, in batches of
        ``HISTORY_PRUNE_BATCH`` rows per transaction (each short; grants interleave).

        Never those inside a resource's rate window: its budget is counted from them, so a rate
        period longer than ``older_than`` (up to 30 days against 7 of retention) keeps its grants
        for the whole period."""
        if names is None:
            names = [row[0] for row in self.db.run(lambda c: c.execute(*self.sql.resource_names()).all())]
        total = 0
        for name in names:
            batches = 0
            while max_batches is None or batches < max_batches:
                def fn(conn: Connection, name: str = name) -> int:
                    period = conn.scalar(*self.sql.rate_period(name))
                    before = read_now(conn) - max(older_than, float(period or 0.0))
                    edge = conn.scalar(*self.sql.prune_edge(name, before, HISTORY_PRUNE_BATCH))
                    if edge is None:  # fewer than a batch left: the rest
                        stmt, values = self.sql.delete_ended(name, before, False)
                    else:
                        stmt, values = self.sql.delete_ended(name, float(edge), True)
                    return dialects.changed_rows(conn, stmt, self.t.history.c.token, self.db.traits, values)

                n = self.db.run(fn)
                total += n
                batches += 1
                if n < HISTORY_PRUNE_BATCH:
                    break
        return total

    def maybe_prune(self, names: Mapping[str, int]) -> None:
        """Now and then (once per ``HISTORY_PRUNE_INTERVAL`` per process), after a release, prune
        one batch of the released resources' history: pruning keeps pace with the grants
        without a job to schedule, and never runs on the grant path."""
        if time.monotonic() < self.next_prune:
            return
        self.next_prune = time.monotonic() + HISTORY_PRUNE_INTERVAL
        try:
            self.prune_history(HISTORY_RETENTION, sorted(names), max_batches=1)
        except Exception as exc:  # pruning is housekeeping: never fail a release for it
            log.warning("controltable: pruning the grant history failed (%s); it is retried later", exc)
