"""The work list's value objects: ``Item`` (one allocated item under its token) and ``WorkListStatus``.

An :class:`Item` holds the engine that allocated it (never the ``ControlTable``) and finishes
through the small :class:`ItemEngine` interface, so this module imports nothing of the workflow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional, Protocol

from .. import tracing
from ..clock import utc
from ..db import Database
from ..defaults import DEFAULT_ITEM_LEASE
from ..errors import ControlTableError, LeaseLost
from ..leaseclock import bounded_release, local_expiry, within_lease
from ..renewal import BackgroundRenewal
from ..validation import check_seconds, fail_reason
from .statements import DONE, ERROR, NEW


class WorkListBlocked(ControlTableError):
    """The lowest unfinished order has only errored items: clear or retry them to go on."""


class ItemEngine(Protocol):
    """What an :class:`Item` needs of the engine that allocated it (a :class:`~controltable.WorkList`)."""

    name: str
    db: Database

    def _finish(self, item: Item, state: str, error: Optional[str]) -> None: ...

    def _renew(self, item: Item, seconds: float) -> float: ...


@dataclass
class Item(BackgroundRenewal):
    """An allocated work item. Finish it with complete, fail or release."""

    worklist: ItemEngine
    id: int
    payload: Any
    order: int
    priority: int
    owner: str
    token: int
    attempts: int
    _expires_at: float
    lease_seconds: float = DEFAULT_ITEM_LEASE
    #: When the lease runs out at the latest on this machine's monotonic clock (see
    #: :mod:`controltable.leaseclock`): its length after this object was made (after the
    #: allocation), then after each renewal's send.
    _local_expires: float = field(default=0.0, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._local_expires:
            self._local_expires = local_expiry(time.monotonic(), self.lease_seconds)

    @property
    def expires_at(self) -> datetime:
        value = utc(self._expires_at)
        assert value is not None
        return value

    def handle(self) -> dict[str, Any]:
        """A JSON-serialisable reference to this item (for XCom or metadata)."""
        return {"worklist": self.worklist.name, "id": self.id, "token": self.token, "owner": self.owner,
                "order": self.order, "payload": self.payload}

    @tracing.completes("done")
    def complete(self) -> None:
        """Mark done. Raises :class:`LeaseLost` if the lease expired and the item was re-allocated.

        Safe to retry: an item already done under this item's token counts as completed.
        """
        self.stop_renewing()
        self.worklist._finish(self, DONE, None)

    @tracing.completes("failed")
    def fail(self, reason: str) -> None:
        """Mark as error; it blocks later orders until cleared (``clear_error``) or reset."""
        self.stop_renewing()
        self.worklist._finish(self, ERROR, fail_reason(reason))  # cut and cleaned: never refused

    @tracing.completes("released")
    def release(self) -> None:
        """Give the item back untouched, for another worker (as ``Batch.release`` and ``Lease.release`` do)."""
        self.stop_renewing()
        with bounded_release(self.worklist.db):
            self.worklist._finish(self, NEW, None)

    def _renew_interval(self) -> float:
        return self.lease_seconds / 3.0

    def renew(self, lease: Optional[float] = None) -> Item:
        """Extend the lease to ``lease`` seconds (default: the item's lease length) from now.

        :class:`LeaseLost` if the item was re-allocated, or if the database could not be reached
        before the lease would have expired (see :mod:`controltable.leaseclock`); before that a
        failure is a :class:`~controltable.errors.DatabaseUnavailableError` (retry).
        """
        seconds = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert seconds is not None
        sent = time.monotonic()
        with within_lease(self.worklist.db, self._local_expires, f"work item {self.id} of {self.worklist.name!r}"):
            self._expires_at = self.worklist._renew(self, seconds)
        self._local_expires = local_expiry(sent, seconds)
        return self

    def check(self) -> None:
        """Raise :class:`LeaseLost` if background renewal found the item lost, or once its lease
        has run out unrenewed (on this machine's clock): it may be allocated to another worker."""
        if self.lost is not None:
            raise self.lost
        if time.monotonic() >= self._local_expires:
            raise LeaseLost(
                f"the lease of work item {self.id} of {self.worklist.name!r} expired without a renewal "
                "reaching the database, so it must be presumed allocated to another worker; renew more "
                "often than the lease (start_renewing()/renewing()) or check the path to the database")


@dataclass
class OrderStatus:
    order: int
    new: int = 0
    active: int = 0
    done: int = 0
    error: int = 0
    expired: int = 0


@dataclass
class WorkListStatus:
    """Counts per order and state, and what the list is waiting for."""

    name: str
    orders: list[OrderStatus] = field(default_factory=list)
    current_order: Optional[int] = None
    blocked_by_errors: bool = False

    @property
    def finished(self) -> bool:
        return self.current_order is None

    def total(self, state: str) -> int:
        return sum(getattr(o, state) for o in self.orders)


def status_from_counts(name: str, rows: list[tuple[Any, Any, Any, Any]]) -> WorkListStatus:
    """The status of a list from ``(order, state, count, expired)`` rows: a pure decision.

    The current order is the lowest with new, active or errored items; the list is blocked
    when that order has errored items and nothing else that could still finish (no new items,
    no active ones with a live lease).
    """
    st = WorkListStatus(name)
    by_order: dict[int, OrderStatus] = {}
    for order, state, count, expired in rows:
        o = by_order.setdefault(int(order), OrderStatus(int(order)))
        setattr(o, state, int(count))
        o.expired += int(expired or 0)
    st.orders = [by_order[k] for k in sorted(by_order)]
    for o in st.orders:
        if o.new or o.active or o.error:
            st.current_order = o.order
            st.blocked_by_errors = o.error > 0 and o.new == 0 and (o.active - o.expired) <= 0
            break
    return st
