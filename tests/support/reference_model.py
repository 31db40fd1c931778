"""Pure reference models of slots, event batches and work lists, for the generated-history tests.

Each model says what the product promises, not how it keeps the promise: no SQL, no clock, no
snapshot limits. ``tests/core/test_generated_histories.py`` drives the real API and the model side
by side and compares them after every step.

Slots (:class:`SlotModel`): a resource has a capacity, an optional rate (``count`` grants in a
window longer than any test, so the budget is ``count`` minus every grant made so far) and a queue
of entries. A *pass* (what every change of a queue ends with) first forgets expired entries, then
grants waiters in queue order (higher priority first, equal priorities by ticket: FIFO) while the
head fits: shared requests up to the capacity and never beside an exclusive holder, exclusive
requests alone, and while the rate budget lasts. The head that does not fit stops its queue.
Entries expire only when the test says so (an abandoned client whose short leases ran out on the
database clock); until the next pass on their resource the model keeps them, marked expired.
Tokens are not predicted: the test records the ones it sees and checks their order.
"""

from __future__ import annotations

import copy
import unicodedata
from dataclasses import dataclass, field
from typing import Optional

WAITING = "waiting"
GRANTED = "granted"


def may_be_refused(name: str) -> bool:
    """Whether a backend may refuse ``name`` as one it cannot keep apart from another.

    Blanks at either end (PAD SPACE collations compare ``'etl'`` and ``'etl '`` equal) and text
    that is not in Unicode normal form C (collations that compare canonically equivalent text
    equal): the product refuses such names with a ``ConfigurationError`` on a backend that would
    alias them, and must keep them apart from every other name where it accepts them.
    """
    return name != name.strip() or unicodedata.normalize("NFC", name) != name


@dataclass
class SlotEntry:
    """One request (holder or waiter) on one resource."""

    holder: str
    slots: int
    mode: str
    priority: int
    ticket: int
    state: str = WAITING
    #: Set when its lease or waiter entry has certainly run out (the test waited for it).
    expired: bool = False
    #: The token the test saw for it (grants only; None until seen).
    token: Optional[int] = None
    #: Which grant this is (a fresh one per grant), to tell a stale ``Lease`` object from a live one.
    grant_id: Optional[int] = None
    #: The last ticket issued when it was granted: only waiters queued by then can have been ahead of it.
    granted_at_ticket: int = 0


@dataclass
class SlotResource:
    capacity: int
    rate: Optional[int] = None
    grants: int = 0
    last_ticket: int = 0
    entries: list[SlotEntry] = field(default_factory=list)
    #: Entries expired since the last pass: the next pass must act as if they were gone.
    pending: bool = False
    #: The highest token seen on this resource (every new grant must be above it).
    top_token: int = 0

    def live(self) -> list[SlotEntry]:
        return [e for e in self.entries if not e.expired]

    def holders(self) -> list[SlotEntry]:
        return [e for e in self.live() if e.state == GRANTED]

    def waiters(self) -> list[SlotEntry]:
        """Live waiters in queue order: higher priority first, FIFO (ticket) among equals."""
        return sorted((e for e in self.live() if e.state == WAITING), key=lambda e: (-e.priority, e.ticket))

    def fits(self, entry: SlotEntry) -> bool:
        if self.rate is not None and self.grants >= self.rate:
            return False
        held = self.holders()
        if entry.mode == "exclusive":
            return not held
        if any(h.mode == "exclusive" for h in held):
            return False
        return sum(h.slots for h in held) + entry.slots <= self.capacity


class SlotModel:
    """Resources of one namespace, as the product promises to keep them."""

    def __init__(self) -> None:
        self.resources: dict[str, SlotResource] = {}
        self._grant_ids = 0

    def clone(self) -> SlotModel:
        return copy.deepcopy(self)

    # -- changes (each ends with a pass, as in the product) ------------------------------------
    def set_capacity(self, name: str, capacity: int, rate: Optional[int], keep_rate: bool) -> None:
        res = self.resources.setdefault(name, SlotResource(capacity))
        res.capacity = capacity
        if not keep_rate:
            res.rate = rate
        self.grant_pass(name)

    def entry(self, name: str, holder: str) -> Optional[SlotEntry]:
        """The live entry of ``holder`` on ``name`` (an expired one counts as gone)."""
        return next((e for e in self.resources[name].live() if e.holder == holder), None)

    def enqueue(self, name: str, holder: str, slots: int, mode: str, priority: int) -> SlotEntry:
        """Enter the queue (a new entry at the back of its priority), or find the holder's own; then a pass."""
        res = self.resources[name]
        res.entries = [e for e in res.entries if not (e.holder == holder and e.expired)]
        mine = self.entry(name, holder)
        if mine is None:
            res.last_ticket += 1
            mine = SlotEntry(holder, slots, mode, priority, res.last_ticket)
            res.entries.append(mine)
        self.grant_pass(name)
        return mine

    def remove(self, name: str, holder: str) -> int:
        """Release or withdraw ``holder``'s entry (expired or not); then a pass. Returns entries removed."""
        res = self.resources[name]
        gone = [e for e in res.entries if e.holder == holder]
        res.entries = [e for e in res.entries if e.holder != holder]
        self.grant_pass(name)
        return len(gone)

    def remove_grant(self, name: str, grant_id: int) -> bool:
        """Release one grant (a ``Lease``); False when that grant is no longer there."""
        res = self.resources[name]
        found = [e for e in res.entries if e.grant_id == grant_id]
        if not found:
            return False
        res.entries = [e for e in res.entries if e.grant_id != grant_id]
        self.grant_pass(name)
        return not found[0].expired

    def expire(self, name: str, holders: set[str]) -> None:
        """The entries of ``holders`` ran out (their client was abandoned): no pass yet."""
        res = self.resources[name]
        for e in res.entries:
            if e.holder in holders:
                e.expired = True
                res.pending = True

    # -- the pass ------------------------------------------------------------------------------
    def grant_pass(self, name: str) -> list[SlotEntry]:
        """Forget expired entries, then grant from the head while it fits. Returns the grants, in order."""
        res = self.resources[name]
        res.entries = [e for e in res.entries if not e.expired]
        res.pending = False
        made = []
        for w in res.waiters():
            if not res.fits(w):
                break
            w.state = GRANTED
            self._grant_ids += 1
            w.grant_id = self._grant_ids
            w.granted_at_ticket = res.last_ticket
            res.grants += 1
            made.append(w)
        return made

    def adopt(self, name: str, holders: list[tuple[str, int, str, int, int]],
              waiters: list[tuple[str, int, str, int]]) -> None:
        """Take the database's word for ``name`` (holders: holder, slots, mode, priority, token; waiters
        in queue order: holder, slots, mode, priority), when the test cannot know what a step saw."""
        res = self.resources[name]
        known = {(e.holder, e.token): e.grant_id for e in res.entries if e.state == GRANTED}
        entries = []
        for holder, slots, mode, priority, token in holders:
            res.last_ticket += 1
            grant_id = known.get((holder, token))
            if grant_id is None:
                self._grant_ids += 1
                grant_id = self._grant_ids
            entries.append(SlotEntry(holder, slots, mode, priority, res.last_ticket, GRANTED, token=token,
                                     grant_id=grant_id, granted_at_ticket=res.last_ticket))
        for holder, slots, mode, priority in waiters:
            res.last_ticket += 1
            entries.append(SlotEntry(holder, slots, mode, priority, res.last_ticket))
        res.entries = entries
        res.pending = True  # expired entries the database still keeps may be reaped by the next pass


# -- event batches -------------------------------------------------------------------------------------
PENDING, CLAIMED, DONE = "pending", "claimed", "done"


@dataclass
class EventRow:
    state: str = PENDING
    #: The batch that holds it (claimed rows), and whether that claim's lease has certainly run out.
    batch: Optional[int] = None
    expired: bool = False


class EventModel:
    """An event table's rows 1..n: claimable when pending or claimed under a lease that ran out.

    A claim takes claimable rows only (never one a live batch holds, never a done one); a batch
    completes only when it still holds every one of its rows, else nothing changes (``LeaseLost``).
    """

    def __init__(self, n: int) -> None:
        self.rows = {k: EventRow() for k in range(1, n + 1)}
        #: batch id -> its keys
        self.batches: dict[int, list[int]] = {}

    def claimable(self) -> list[int]:
        return [k for k, r in self.rows.items() if r.state == PENDING or (r.state == CLAIMED and r.expired)]

    def claim(self, batch: int, keys: list[int]) -> None:
        for k in keys:
            self.rows[k] = EventRow(CLAIMED, batch)
        self.batches[batch] = list(keys)

    def holds(self, batch: int) -> bool:
        """Whether ``batch`` still holds every one of its rows (expired or not: nobody took them)."""
        return all(self.rows[k].state == CLAIMED and self.rows[k].batch == batch for k in self.batches[batch])

    def settle(self, batch: int, state: str) -> None:
        for k in self.batches[batch]:
            self.rows[k] = EventRow(state)

    def expire(self, batch: int) -> None:
        for k in self.batches[batch]:
            if self.rows[k].batch == batch:
                self.rows[k].expired = True


# -- work lists ----------------------------------------------------------------------------------------
NEW, ACTIVE, ERROR = "new", "active", "error"


@dataclass
class WorkItem:
    order: int
    priority: int
    state: str = NEW
    #: The allocation (token) that holds it, and whether its lease has certainly run out.
    token: Optional[int] = None
    expired: bool = False


class WorkListModel:
    """Items in orders: the current order is the lowest with an unfinished (new, active or error)
    item; only its new items and its items whose lease ran out may be allocated."""

    def __init__(self) -> None:
        self.items: dict[int, WorkItem] = {}

    def current(self) -> Optional[int]:
        return min((i.order for i in self.items.values() if i.state != DONE), default=None)

    def allocatable(self) -> list[int]:
        cur = self.current()
        return [k for k, i in self.items.items() if i.order == cur
                and (i.state == NEW or (i.state == ACTIVE and i.expired))]

    def holds(self, item_id: int, token: int) -> bool:
        item = self.items[item_id]
        return item.state == ACTIVE and item.token == token
