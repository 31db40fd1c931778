"""The slot engine (``SlotEngine``): its collaborators put together, capacity, removing holders, reaping.

The engine is made of collaborators, each built here with what it needs, and each depending only
on those before it: :class:`~.passes.GrantPasses` (transactions under the resource locks in name
order, the grant pass, removal), :class:`~.entering.Entering` (entering a queue, looking at one's
own entry) over the passes, :class:`~.holding.Holding` (renew, release: what a ``Lease`` holds) over
the passes, :class:`~.waiting.Waiter` (``acquire``'s wait) over entering, the wake-ups and the
holding, and :class:`~.reports.Reports` and :class:`~.reports.HistoryPruner` over the database.
``ControlTable`` waits through ``engine.waiter`` itself; the engine forwards the reports and what a
``Lease`` holds, and capacity, removing a holder's requests and reaping are its own (short changes
under the locks, through the passes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Union

from sqlalchemy.engine import Connection

from .. import dialects, errorcodes
from ..errors import ConfigurationError, UnknownResourceError
from ..runtime import Runtime, check_runtime
from .entering import Entering
from .holding import Holding
from .passes import GrantPasses, Locked
from .reports import HistoryPruner, Reports
from .values import GrantRecord, Lease, Rate, ResourceStats, ResourceStatus, WaitInfo
from .waiting import Waiter


@dataclass(frozen=True)
class PolicyChange:
    """What ``set_capacity`` changes besides the capacity: each policy only when its ``set_`` flag is
    true (a policy left out of the call is kept; None clears it)."""

    set_rate: bool = False
    rate: Optional[Rate] = None
    set_aging: bool = False
    aging: Optional[float] = None


class SlotEngine:
    """Resource slots for one namespace of one installation: the collaborators, and what is its own
    (the grant model, made by whoever changes a queue: see :mod:`controltable.slots`).

    ``passes`` and ``entering`` may be given (a test's fake of one collaborator); by default they
    are built from ``runtime``.
    """

    def __init__(self, runtime: Runtime, *, passes: Optional[GrantPasses] = None,
                 entering: Optional[Entering] = None) -> None:
        runtime = check_runtime(runtime)
        self.db = runtime.db
        self.t = runtime.tables
        self.ns = runtime.namespace
        self.passes = passes if passes is not None else GrantPasses.of(runtime)
        #: The engine's one statements object, bound to its tables and namespace (the passes' own).
        self.sql = self.passes.sql
        self.entering = entering if entering is not None else Entering(self.passes)
        self.pruner = HistoryPruner(self.db, self.sql)
        self.holding = Holding(self.passes, self.pruner.maybe_prune)
        self.waiter = Waiter(self.entering, runtime.wakeups, self.holding)
        self.reports = Reports(self.db, self.sql, self.holding)

    # -- capacity ----------------------------------------------------------------------------
    def set_capacity(self, name: str, capacity: int, policy: PolicyChange = PolicyChange()) -> None:
        """Create or change a resource, and the policies ``policy`` sets (the others are kept)."""

        def create(conn: Connection) -> None:
            if conn.execute(*self.sql.lock_resource_name(name)).first() is None:
                conn.execute(*self.sql.create_resource(name, capacity))

        try:
            self.db.run(create)
        except Exception as exc:  # a concurrent insert of the same name: the row exists now
            if not errorcodes.is_unique_violation(exc):
                raise

        def change(conn: Connection, res: Locked, now: float) -> None:
            values: dict[str, Union[int, float, None]] = dict(capacity=capacity)
            if policy.set_rate:
                rate = policy.rate
                res[name].rate_count = None if rate is None else rate.count
                res[name].rate_per = None if rate is None else rate.per
                values.update(rate_count=res[name].rate_count, rate_per=res[name].rate_per)
            if policy.set_aging and policy.aging != res[name].aging:
                aging = policy.aging
                values["aging"] = aging
                res[name].aging = aging
                # The queue order's key depends on aging: rewrite it for the waiters (under the lock).
                conn.execute(*self.sql.reorder_queue(name, aging))
            conn.execute(*self.sql.change_resource(name, values))
            res[name].capacity = capacity  # a larger capacity grants the waiters that now fit

        self.passes.with_pass({name}, change)

    def delete_resource(self, name: str, *, force: bool = False) -> bool:
        def fn(conn: Connection) -> bool:
            if conn.execute(*self.sql.lock_resource_name(name)).first() is None:
                return False
            live = conn.scalar(*self.sql.live_request(name))
            if live is not None and not force:
                raise ConfigurationError(
                    f"resource {name!r} still has holders or waiters; release them, wait for their leases "
                    "to expire, or delete with force=True (--force)"
                )
            conn.execute(*self.sql.delete_resource_requests(name))
            conn.execute(*self.sql.delete_history(name))
            conn.execute(*self.sql.delete_resource(name))
            return True

        return self.db.run(fn)

    # -- holding (what a Lease calls) ---------------------------------------------------------------
    def renew(self, lease: Lease, seconds: float) -> float:
        return self.holding.renew(lease, seconds)

    def release(self, lease: Lease) -> None:
        self.holding.release(lease)

    def is_held(self, lease: Lease) -> bool:
        return self.holding.is_held(lease)

    # -- reading (the reports) -------------------------------------------------------------------
    def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        return self.reports.wait_info(resource, holder)

    def find_lease(self, resource: str, holder: str) -> Optional[Lease]:
        return self.reports.find_lease(resource, holder)

    def status(self, names: Optional[list[str]] = None) -> list[ResourceStatus]:
        return self.reports.status(names)

    def history(self, resource: Optional[str], since: float, limit: int) -> list[GrantRecord]:
        return self.reports.history(resource, since, limit)

    def stats(self, names: Optional[list[str]], window: float) -> list[ResourceStats]:
        return self.reports.stats(names, window)

    def stats_series(self, name: str, window: float, buckets: int) -> list[ResourceStats]:
        return self.reports.stats_series(name, window, buckets)

    def prune_history(self, older_than: float, names: Optional[list[str]] = None,
                      max_batches: Optional[int] = None) -> int:
        return self.pruner.prune_history(older_than, names, max_batches)

    # -- removing requests and reaping ---------------------------------------------------------------
    def release_holder(self, resource: str, holder: str) -> int:
        """Release whatever ``holder`` holds or waits for on ``resource`` (for shell scripts).

        Returns the requests removed: 0 means nothing was held. An unknown resource is an error.
        """
        def known(conn: Connection) -> None:
            if conn.scalar(*self.sql.resource_name(resource)) is None:
                raise UnknownResourceError(
                    f"resource {resource!r} does not exist in namespace {self.ns!r}; check the name and namespace"
                )

        return self.passes.remove(self.sql.holder_match(resource, holder), known)

    def release_holders(self, prefix: str) -> int:
        """Release every holder and withdraw every waiter whose holder id starts with ``prefix``.

        For run-status sensors and teardown of a whole scope (a DAG run, a Dagster run). The
        prefix is matched literally (``%`` and ``_`` are escaped). Returns the requests removed.
        """
        return self.passes.remove(self.sql.prefix_match(prefix))

    def reap(self) -> int:
        """Remove expired holders and waiters of this namespace, passing freed capacity on."""
        names = {row[0] for row in self.db.run(lambda c: c.execute(*self.sql.expired_resources()).all())}
        if not names:
            return 0

        def action(conn: Connection, res: Locked, now: float) -> int:
            # Waiters anywhere in the queues (a pass only looks at the head); holders go in the pass.
            stmt, values = self.sql.delete_expired_waiters(sorted(res), now)
            n = dialects.changed_rows(conn, stmt, self.t.request.c.id, self.db.traits, values)
            return n + self.passes.grant_pass(conn, res, now)

        return self.passes.in_lock_order(names, action)

    def iter_names(self) -> Iterator[str]:  # pragma: no cover - convenience
        for st in self.status():
            yield st.name
