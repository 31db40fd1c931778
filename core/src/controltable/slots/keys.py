"""The names a slot request goes by: its request key, and the wake-up keys its grant is pushed under.

A request key is chosen by the client before its first transaction (so a retried COMMIT can
recognise its own work); wake-up keys name what a waiter listens for (see :mod:`controltable.wakeups`).
"""

from __future__ import annotations

import uuid
from typing import Mapping


def slot_key(resource: str) -> str:
    """The wake-up key of a resource's queue (pushed on every change of the queue)."""
    return f"slot:{resource}"


def holder_key(resource: str, holder: str) -> str:
    """The wake-up key of one request: pushed when it is granted or becomes the head of its queue.

    A multi-resource request is keyed by its first resource in name order.
    """
    return f"slot:{resource}\x1e{holder}"


def head_key(resource: str, holder: str) -> str:
    """The wake-up key pushed when a request becomes the head of its queue (it then times the
    holders' leases); kept apart from :func:`holder_key` so a busy head is not woken twice."""
    return f"{holder_key(resource, holder)}\x1ehead"


def request_key(parts: Mapping[str, int]) -> str:
    """A new request key, chosen by the client before its first transaction.

    A multi-resource key carries its number of resources (``m2-...``), so a grant pass knows
    without another read that a waiter at its head needs more than the one queue, and can tell
    a request whose rows were partly removed (never granted then).
    """
    hexkey = uuid.uuid4().hex
    return hexkey if len(parts) == 1 else f"m{len(parts)}-{hexkey}"


def key_size(key: str) -> int:
    """How many resources the request with this key spans (1 for keys without a count)."""
    if key.startswith("m") and "-" in key:
        head = key[1:key.index("-")]
        if head.isdigit():
            return int(head)
    return 1
