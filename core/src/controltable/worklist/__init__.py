"""Ordered work lists: every item of one order is done before the next order starts.

Where things are: :mod:`.statements` builds every statement (:class:`WorkListStatements`, bound
once per list), :mod:`.workflow` is the engine (:class:`WorkList`: transactions, waiting, fencing),
:mod:`.values` the value objects (:class:`Item`, :class:`WorkListStatus`) and the pure status decision.
"""

from ..defaults import DEFAULT_ITEM_LEASE
from .statements import ACTIVE, DONE, ERROR, NEW, UNFINISHED, WorkListStatements
from .values import Item, OrderStatus, WorkListBlocked, WorkListStatus, status_from_counts
from .workflow import WorkList

__all__ = [
    "ACTIVE",
    "DEFAULT_ITEM_LEASE",
    "DONE",
    "ERROR",
    "Item",
    "NEW",
    "OrderStatus",
    "UNFINISHED",
    "WorkList",
    "WorkListBlocked",
    "WorkListStatements",
    "WorkListStatus",
    "status_from_counts",
]
