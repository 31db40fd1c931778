"""Who is granted next: the slot grant decision as a pure function over a snapshot of the locked queues.

The grant pass (:meth:`.passes.GrantPasses.grant_pass`) locks the resource rows, reads their holders
and the *head* of each waiting queue, and asks :func:`decide` which waiters may now run. No I/O happens here, so the
rules are tested without a database:

* Queue order per resource: higher effective priority first, equal ones in ticket order (FIFO).
  A waiter's effective priority is its priority plus, when the resource has ``aging``, one for
  every ``aging`` seconds it has waited. Waiters are considered in that order, and the first one
  that does not fit stops its queue (a waiting exclusive request blocks later requests that do
  not outrank it; a big request blocks smaller ones behind it: no starvation).
* Rate: a resource with a rate has a budget, the grants its window still allows; a spent budget
  stops the queue like a head that does not fit (nobody overtakes the head). The engine counts
  the budget from the recorded grant times; :func:`next_opening` says when it grows again.
* A shared request fits when no exclusive holder is present and the slots in use plus its own
  stay within the capacity; an exclusive request fits when nobody holds the resource.
* A multi-resource request is granted all-or-nothing, only when it is first in *every* queue it
  waits in and fits in each. If one of its resources is not in the snapshot (not locked), the
  decision says which locks it needs instead of guessing.

Two more decisions live here: :func:`assemble` turns the rows a grant pass read under its locks
into the :class:`Queue` objects :func:`decide` takes, and :func:`waiter_runs_pass` is a waiter's
rule for running a grant pass itself (it is at the head and fits, or a holder ran out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from .keys import key_size
from .statements import GRANTED

#: A waiter behind the head reaps an expired holder itself once it is this many seconds overdue
#: (the head, which does it at once, may be dead).
REAP_GRACE = 2.0
#: ... or sooner: this many seconds per position behind the head (up to ``REAP_GRACE``), so the
#: waiter right behind a dead head (a process that died in the queue) takes over within moments.
#: Every waiter times the holders' earliest expiry (a grant's pickup deadline included), so an
#: expiry wakes the next live waiter at once instead of at its next refresh.
BEHIND_GRACE = 0.25


@dataclass(frozen=True)
class Waiter:
    """One waiting request, as seen in the queue of one resource."""

    key: str  # the request key (shared by the rows of a multi-resource request)
    ticket: int
    slots: int
    mode: str  # "shared" | "exclusive"
    #: Every resource of the request (one name for most requests).
    resources: frozenset[str]
    priority: int = 0
    #: When it entered the queue (database clock, epoch seconds); what aging counts from.
    enqueued_at: float = 0.0


@dataclass
class Queue:
    """A locked resource: its capacity, its live holders' usage and the head of its waiting queue."""

    name: str
    capacity: int
    used: int = 0
    exclusive_held: bool = False
    #: Waiting requests in ticket order, from the head; possibly only the first few.
    head: list[Waiter] = field(default_factory=list)
    #: Whether ``head`` is the whole waiting queue (else more wait behind the last one read).
    complete: bool = True
    #: Seconds of waiting worth one priority step (None: no aging).
    aging: Optional[float] = None
    #: Grants the rate window still allows now (None: no rate limit).
    budget: Optional[int] = None


@dataclass
class Decision:
    #: Request keys to grant, in grant order (the order their tokens are taken in).
    grant: list[str] = field(default_factory=list)
    #: Resources whose locks are needed to decide about a multi-resource request at a head.
    need: set[str] = field(default_factory=set)
    #: Per resource, the first request left waiting (the new head), if any was read.
    heads: dict[str, str] = field(default_factory=dict)
    #: Resources whose every read waiter was granted while more wait unread: run the pass again.
    more: set[str] = field(default_factory=set)


def queue_key(priority: int, enqueued_at: float, aging: Optional[float]) -> float:
    """The static sort key of a waiter (smaller goes first; ties in ticket order).

    With aging ``a`` the effective priority at time ``t`` is ``p + (t - e) / a``; ordering by
    it (descending) is ordering by ``e - p * a`` (ascending) at every ``t``, a key fixed at
    enqueue that an index can serve. Without aging it is ``-p``.
    """
    if aging is None:
        return float(-priority)
    return enqueued_at - priority * aging


def effective_priority(priority: int, enqueued_at: float, now: float, aging: Optional[float]) -> float:
    """``priority`` plus one per ``aging`` seconds waited (just ``priority`` without aging)."""
    if aging is None:
        return float(priority)
    return priority + max(now - enqueued_at, 0.0) / aging


def order(waiters: Sequence[Waiter], aging: Optional[float]) -> list[Waiter]:
    """Waiters in grant order: by :func:`queue_key`, then ticket (FIFO among equals)."""
    return sorted(waiters, key=lambda w: (queue_key(w.priority, w.enqueued_at, aging), w.ticket))


def rate_budget(count: int, per: float, grant_times: Sequence[float], now: float) -> int:
    """Grants allowed now: ``count`` minus the grants in the window ``(now - per, now]``."""
    return max(count - sum(1 for t in grant_times if t > now - per), 0)


def next_opening(count: int, per: float, grant_times: Sequence[float], now: float) -> Optional[float]:
    """When the rate window next allows a grant (``now`` if it does; None without grants).

    With ``k >= count`` grants in the window, the budget grows when the ``(k - count + 1)``-th
    oldest of them leaves it, ``per`` seconds after it was made.
    """
    inside = sorted(t for t in grant_times if t > now - per)
    if len(inside) < count:
        return now
    return inside[len(inside) - count] + per


def opens_in(count: int, per: float, grant_times: Sequence[float], now: float) -> Optional[float]:
    """Seconds until the rate window allows the next grant; None while it allows one now."""
    opening = next_opening(count, per, grant_times, now)
    return None if opening is None or opening <= now else opening - now


def fits(queue: Queue, slots: int, mode: str) -> bool:
    """Whether a request for ``slots`` in ``mode`` can run now beside the current holders (and the rate)."""
    if queue.budget is not None and queue.budget <= 0:
        return False
    if mode == "exclusive":
        return queue.used == 0 and not queue.exclusive_held
    return not queue.exclusive_held and queue.used + slots <= queue.capacity


def _take(queue: Queue, slots: int, mode: str) -> None:
    queue.used += slots
    if mode == "exclusive":
        queue.exclusive_held = True
    if queue.budget is not None:
        queue.budget -= 1


def decide(queues: dict[str, Queue]) -> Decision:
    """Grant, in queue order, every waiter of the locked ``queues`` that may now run.

    ``queues`` is changed in place (usage grows and budgets shrink by what was granted, heads are
    put in queue order), so a caller can apply the decision and inspect what is left.
    """
    for queue in queues.values():
        queue.head = order(queue.head, queue.aging)
    out = Decision()
    granted: set[str] = set()
    blocked: set[str] = set()  # queues whose head cannot run now
    progress = True
    while progress:
        progress = False
        for name in sorted(queues):
            if name in blocked:
                continue
            queue = queues[name]
            while True:
                front = next((w for w in queue.head if w.key not in granted), None)
                if front is None:
                    break
                if not fits(queue, front.slots, front.mode):
                    blocked.add(name)
                    break
                if len(front.resources) == 1:
                    granted.add(front.key)
                    out.grant.append(front.key)
                    _take(queue, front.slots, front.mode)
                    progress = True
                    continue
                missing = front.resources - queues.keys()
                if missing:
                    out.need |= missing
                    blocked.add(name)
                    break
                ok = True
                for other in front.resources - {name}:
                    oq = queues[other]
                    ofront = next((w for w in oq.head if w.key not in granted), None)
                    if ofront is None or ofront.key != front.key or not fits(oq, ofront.slots, ofront.mode):
                        ok = False
                        break
                if not ok:
                    # Not yet first (or not fitting) in another queue: it waits, and so does this
                    # queue behind it. A later pass over the other queue may unblock it.
                    break
                granted.add(front.key)
                out.grant.append(front.key)
                for res in sorted(front.resources):
                    w = next(x for x in queues[res].head if x.key == front.key)
                    _take(queues[res], w.slots, w.mode)
                progress = True
    for name, queue in queues.items():
        left = next((w for w in queue.head if w.key not in granted), None)
        if left is not None:
            out.heads[name] = left.key
        elif not queue.complete:
            # Every waiter read was granted, or none was left to grant (the ones read had expired
            # and were reaped): the live entries behind them are unread. Read on.
            out.more.add(name)
    return out


def read_again(decision: Decision, *, granted: int, reaped: int) -> bool:
    """Whether a grant pass reads the queues again after a round that granted ``granted`` requests
    and reaped ``reaped`` expired entries.

    Only where :func:`decide` saw more waiting behind the rows it read (``decision.more``), and only
    after a round that changed the queue: a round that reaped a page of expired entries and
    granted nobody read no live waiter yet, and the next page may hold it. Without a change the
    same rows would be read again (a page of partly removed multi-resource requests, skipped).
    Each page is bounded (the head size), and so is the number of rounds of a pass.
    """
    return bool(decision.more) and (granted > 0 or reaped > 0)


# -- the decision's input: queues from the rows a grant pass read ------------------------------------
@dataclass
class Assembly:
    """The locked queues as :func:`decide` takes them, and the rows behind each waiting request."""

    queues: dict[str, Queue]
    #: The waiting rows of each request in the heads (one per resource), by request key.
    rows_by_key: dict[str, list[Any]]
    #: Per resource, the first request in queue order before the decision (the head it had).
    first_before: dict[str, str]


def waiting_multi(rows: Iterable[Any]) -> list[str]:
    """The keys of the waiting requests among ``rows`` that span several resources (sorted): the
    pass reads which resources each spans (see :func:`.keys.key_size`)."""
    return sorted({row.request_key for row in rows if row.state != GRANTED and key_size(row.request_key) > 1})


def waiting_read(rows: Iterable[Any]) -> dict[str, int]:
    """How many waiting rows a snapshot read per queue (each row once), whether they turn out
    live or expired: what says if a queue was read to its end (:func:`assemble`'s ``read``)."""
    seen: dict[str, set[Any]] = {}
    for row in rows:
        if row.state != GRANTED:
            seen.setdefault(row.resource, set()).add(row.id)
    return {name: len(ids) for name, ids in seen.items()}


def assemble(queues: dict[str, Queue], rows: Iterable[Any], spans: Mapping[str, set[str]],
             head_sizes: Mapping[str, int], read: Optional[Mapping[str, int]] = None) -> Assembly:
    """Fill the empty ``queues`` (capacity, aging and budget set) from the live rows of a snapshot.

    ``rows`` are request rows (resource, state, slots, mode, request_key, ticket, priority,
    enqueued_at): holders count towards a queue's usage, waiters form its head. ``spans`` names the
    resources of each multi-resource request; one whose rows were partly removed (expired or
    withdrawn: fewer rows than its key says) is never granted and is left out. A queue is
    ``complete`` when fewer than ``head_sizes[name]`` of its waiters were read: ``read[name]`` of
    them (:func:`waiting_read` of the snapshot, the expired ones the pass reaped included: a page
    of expired entries is a full read with nothing live in it), else the waiting ``rows``.
    """
    waiting: dict[str, list[Any]] = {name: [] for name in queues}
    for row in rows:
        if row.state == GRANTED:
            queue = queues[row.resource]
            queue.used += int(row.slots)
            queue.exclusive_held = queue.exclusive_held or row.mode == "exclusive"
        else:
            waiting[row.resource].append(row)
    rows_by_key: dict[str, list[Any]] = {}
    first_before: dict[str, str] = {}
    for name, rs in waiting.items():
        rs.sort(key=lambda row: int(row.ticket))
        queue = queues[name]
        queue.complete = (len(rs) if read is None else max(read.get(name, 0), len(rs))) < head_sizes[name]
        for row in rs:
            span = spans.get(row.request_key, {name})
            if len(span) != key_size(row.request_key):
                continue  # partly removed (expired or withdrawn): never granted, expires whole
            queue.head.append(Waiter(row.request_key, int(row.ticket), int(row.slots), row.mode,
                                     frozenset(span), int(row.priority), float(row.enqueued_at)))
            rows_by_key.setdefault(row.request_key, []).append(row)
        queue.head = order(queue.head, queue.aging)
        if queue.head:
            first_before[name] = queue.head[0].key
    return Assembly(queues, rows_by_key, first_before)


# -- a snapshot read in the statement that changed the queue ----------------------------------------
def merge_entered(snapshot: Iterable[Any], entered: Iterable[Any], head_sizes: Mapping[str, int]) -> list[Any]:
    """The rows :func:`~controltable.slots.statements.snapshot` would read after the INSERT of the
    waiting rows ``entered``, from a snapshot read in the INSERT's own statement (which cannot see
    them): the holders, and per queue the first ``head_sizes[name]`` waiters in queue order
    (``queue_key``, ``ticket``). The first n of (table + new rows) are among (the table's first n) +
    (new rows), so nothing the later read would return is missing."""
    snapshot = list(snapshot)
    rows = [row for row in snapshot if row.state == GRANTED]
    waiting: dict[str, list[Any]] = {}
    for row in [*snapshot, *entered]:
        if row.state != GRANTED:
            waiting.setdefault(row.resource, []).append(row)
    for name in sorted(waiting):
        queue = sorted(waiting[name], key=lambda row: (float(row.queue_key), int(row.ticket)))
        rows.extend(queue[:head_sizes[name]])
    return rows


def after_removal(snapshot: Iterable[Any], removed: Iterable[Any]) -> Optional[list[Any]]:
    """The rows a snapshot read after deleting ``removed`` would return, from one read in the
    DELETE's own statement (which still shows them): the same rows without them. None when a
    removed row was waiting: that queue's head was read one short, so the caller reads again."""
    gone = list(removed)
    if any(row.state != GRANTED for row in gone):
        return None
    ids = {int(row.id) for row in gone}
    return [row for row in snapshot if int(row.id) not in ids]


# -- a waiter's own rule: run a grant pass itself ----------------------------------------------------
def behind_grace(position: int) -> float:
    """Seconds a holder's expiry may be overdue before the waiter at ``position`` (1: the head)
    reaps it itself: ``BEHIND_GRACE`` per position behind the head, at most ``REAP_GRACE``."""
    return min(REAP_GRACE, BEHIND_GRACE * (position - 1))


def rate_rescue(left_at: Optional[float], per: float, now: float) -> bool:
    """Whether the waiter behind a head stopped by the rate window runs the pass: the window
    opened (its grant at ``left_at`` left it, ``per`` seconds later) over ``REAP_GRACE`` ago, and
    the head, which times that opening, did not run it (it may be dead)."""
    return left_at is not None and now - (left_at + per) > REAP_GRACE


def waiter_runs_pass(*, head: bool, fits_all: bool, holder_expiry_in: Optional[float], position: int,
                     rescue: bool) -> bool:
    """Whether a waiter runs a grant pass itself rather than wait to be granted.

    ``holder_expiry_in``: seconds until the earliest lease (or grant pickup) of its queues' holders
    runs out, negative once it has (None: no holders); ``position``: its furthest position (1: the
    head of every queue); ``rescue``: :func:`rate_rescue`. The head runs it when it fits (nobody
    else would grant it) or a holder ran out; a waiter behind it once the expiry is
    :func:`behind_grace` overdue (the head may be dead), or to rescue a rate-stopped head.
    """
    expired_holder = holder_expiry_in is not None and holder_expiry_in < 0
    behind_expired = expired_holder and holder_expiry_in is not None and holder_expiry_in < -behind_grace(position)
    return (head and (expired_holder or fits_all)) or behind_expired or rescue
