"""Resource slots: FIFO semaphores (shared) and reader/writer locks (exclusive), with leases and fencing tokens.

The grant model: *whoever changes a queue grants*. Every transaction that releases, enqueues,
withdraws, reaps an expired holder or raises a capacity locks the resource rows (in name order,
so multi-resource requests cannot deadlock), then runs a grant pass: it reads the holders and
only the head of the waiting queue through the (namespace, resource, state, queue_key, ticket) index, asks
:func:`grants.decide` who may run now (strict FIFO, all-or-nothing across resources), and grants
them on their behalf - state granted, the next fencing token, and a short pickup deadline.

A waiter reads only its own entry (no locks): woken by a push on PostgreSQL, polling elsewhere.
It picks its grant up by extending it to its lease; a grant not picked up in time lapses and the
next pass hands it on, so a dead waiter delays its queue by at most the pickup deadline. Expired
holders are reaped by the next pass, or by the head waiter when the first holder's lease runs
out. Tickets come from a per-resource counter bumped under the resource lock: exact FIFO on
every backend. Expiry is judged by the database clock, and a DELETE that re-checks it is the
only judge: a holder whose renewal wins the race keeps its slot, one that loses gets LeaseLost.

Where things are: :mod:`.statements` builds every statement (pure functions over the control
tables), :mod:`.grants` decides who is granted next (a pure function), :mod:`.history` turns the
grant history into records and statistics, :mod:`.keys` names requests and their wake-ups,
:mod:`.workflow` is the workflow (:class:`SlotEngine`), composed of collaborators: :mod:`.passes`
(locks and the grant pass), :mod:`.entering` (entering a queue, a waiter's look), :mod:`.holding`
(renew, release), :mod:`.waiting` (``acquire`` and its wait) and :mod:`.reports` (status, history);
:mod:`.values` holds the value objects (:class:`Lease`, :class:`ResourceStatus`, :class:`Rate`, ...).
"""

from ..defaults import (  # noqa: F401 - re-exported, as the single slots module did
    DEFAULT_LEASE,
    DEFAULT_MODE,
    DEFAULT_PICKUP,
    DEFAULT_WAITER_TTL,
    HISTORY_PRUNE_BATCH,
    HISTORY_PRUNE_INTERVAL,
    HISTORY_RETENTION,
)
from .keys import head_key, holder_key, key_size, request_key, slot_key
from .values import (
    Entry,
    GrantRecord,
    Lease,
    LeaseEngine,
    Rate,
    ResourceStats,
    ResourceStatus,
    SlotBlock,
    WaitInfo,
    check_rate,
    parse_duration,
    parse_rate,
)
from .workflow import PolicyChange, SlotEngine

__all__ = [
    "Entry",
    "GrantRecord",
    "Lease",
    "LeaseEngine",
    "PolicyChange",
    "Rate",
    "ResourceStats",
    "ResourceStatus",
    "SlotBlock",
    "SlotEngine",
    "WaitInfo",
    "check_rate",
    "head_key",
    "holder_key",
    "key_size",
    "parse_duration",
    "parse_rate",
    "request_key",
    "slot_key",
]
