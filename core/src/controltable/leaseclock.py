"""A held lease's expiry on this machine's monotonic clock, and the bound it puts on renew/check.

The database decides when a lease (slot, batch, work item) runs out, on its own clock. A holder
whose path to the database goes silent cannot ask it, so it keeps its own conservative estimate:
the lease's length after the grant or the last renewal was *sent* (the database's expiry can
only be later). Its renew and check then run under :meth:`~controltable.db.Database.deadline` of
that estimate plus :data:`~controltable.defaults.LEASE_CALL_GRACE`: a call that could not reach the
database before the lease would have expired raises :class:`~controltable.errors.LeaseLost`
(another holder may have it by now), never later than the expiry plus
:data:`~controltable.defaults.TIMEOUT_MARGIN`. Before the expiry a failure stays a
:class:`~controltable.errors.DatabaseUnavailableError`, which the background renewer retries.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Optional

from .db import Database
from .defaults import LEASE_CALL_GRACE, STATEMENT_TIMEOUT
from .errors import DatabaseUnavailableError, LeaseLost


def local_expiry(sent: float, seconds: float) -> float:
    """When a lease granted or renewed by a call sent at ``sent`` (monotonic) runs out at the latest."""
    return sent + max(float(seconds), 0.0)


@contextmanager
def within_lease(db: Database, expires: float, what: str, deadline: Optional[float] = None) -> Iterator[None]:
    """Run the block's statements before the lease ``expires`` (monotonic) plus a grace.

    A call begun after the estimate still gets the grace to hear the database's own answer (the
    estimate is conservative: the lease may well still be held). ``deadline``: the caller's own,
    if nearer. A failure to reach the database once the estimate has passed is a ``LeaseLost``.
    """
    until = max(expires, time.monotonic()) + LEASE_CALL_GRACE
    if deadline is not None:
        until = min(until, deadline)
    try:
        with db.deadline(until):
            yield
    except DatabaseUnavailableError as exc:
        if time.monotonic() < expires:
            raise
        raise LeaseLost(
            f"{what}: the database could not be reached before the lease expired ({exc}), so "
            "the lease must be presumed taken over by another holder; stop the work and check the path "
            "to the database"
        ) from exc


@contextmanager
def bounded_release(db: Database) -> Iterator[None]:
    """A release's statements end within one statement timeout in all (a silent network cannot hang it)."""
    with db.deadline(time.monotonic() + (db.statement_timeout or STATEMENT_TIMEOUT)):
        yield
