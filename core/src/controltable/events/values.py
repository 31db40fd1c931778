"""The event engine's value objects: ``Batch`` (rows claimed under one token) and ``EventStats``.

A :class:`Batch` holds the engine that claimed it (never the ``ControlTable``) and finishes
through the small :class:`BatchEngine` interface, so this module imports nothing of the workflow.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator, Optional, Protocol, Sequence

from sqlalchemy.engine import Connection

from .. import tracing
from ..clock import utc
from ..db import Database
from ..errors import LeaseLost
from ..leaseclock import bounded_release, local_expiry, within_lease
from ..renewal import BackgroundRenewal
from ..validation import check_batch_size, check_seconds
from .statements import Where


class BatchEngine(Protocol):
    """What a :class:`Batch` needs of the engine that claimed it (an :class:`~controltable.EventTable`)."""

    name: str
    key: str
    order_by: str
    table_schema: Optional[str]
    lease: float
    db: Database

    @property
    def qualified_name(self) -> str: ...

    def _complete(self, conn: Connection, token: int, keys: Sequence[Any], *, whole: bool = False) -> int: ...

    def _claim_run(self, size: int, owner: str, lease_s: float, where: Where,
                   complete: Optional[tuple[int, list[Any]]] = None,
                   deadline: Optional[float] = None) -> Optional[Batch]: ...

    def _fail(self, token: int, keys: Sequence[Any], reason: str) -> int: ...

    def _release(self, token: int, keys: Sequence[Any]) -> int: ...

    def _renew(self, token: int, keys: Sequence[Any], seconds: float) -> float: ...


@dataclass
class EventStats:
    """Counts per claim state of an event table."""

    table: str
    pending: int = 0
    claimed: int = 0
    expired: int = 0
    done: int = 0
    error: int = 0
    oldest_pending_key: Any = None
    oldest_pending_age: Optional[float] = None

    @property
    def total(self) -> int:
        return self.pending + self.claimed + self.done + self.error

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "table", "pending", "claimed", "expired", "done", "error", "total",
            "oldest_pending_key", "oldest_pending_age")}


@dataclass
class Batch(BackgroundRenewal):
    """Rows claimed by one worker under one token. Finish it with complete, fail or release.

    ``attempts`` (per key, this claim included), ``claimed_at`` and ``lease_seconds`` are the
    batch's history: :meth:`handle` carries them and :meth:`EventTable.batch` rebuilds them, so
    a batch finished in another process renews, fails and hands on with its own numbers.
    """

    events: BatchEngine
    owner: str
    token: int
    rows: list[dict[str, Any]]
    attempts: dict[Any, int]
    claimed_at: float
    _expires_at: float
    _settled: set[Any] = field(default_factory=set)
    #: The batch's lease length (seconds): renewals without an argument, the renewal interval
    #: and the batch ``complete_and_claim`` hands on all keep it.
    lease_seconds: float = 0.0
    #: When the claim runs out at the latest on this machine's monotonic clock (see
    #: :mod:`controltable.leaseclock`): its length after this object was made (after the claim:
    #: a rebuilt batch counts a whole lease from its rebuilding), then after each renewal's send.
    _local_expires: float = field(default=0.0, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            self.lease_seconds = max(self._expires_at - self.claimed_at, 0.0) or self.events.lease
        if not self._local_expires:
            self._local_expires = local_expiry(time.monotonic(), self.lease_seconds)

    @property
    def finished(self) -> bool:
        """Whether every row of the batch was completed, failed or released (in one call or several)."""
        return self._settled >= set(self.keys)

    def _settle(self, keys: Optional[Sequence[Any]]) -> None:
        self._settled.update(self.keys if keys is None else keys)
        if self.finished:
            self.stop_renewing()

    def _renew_interval(self) -> float:
        return max(self.lease_seconds, 0.3) / 3.0

    def _unsettled(self) -> list[Any]:
        return [k for k in self.keys if k not in self._settled]

    def check(self) -> None:
        """Raise :class:`LeaseLost` if background renewal found the batch taken over, or once its
        lease has run out unrenewed (on this machine's clock, see :mod:`controltable.leaseclock`):
        its rows may be claimed by another worker from then on."""
        if self.lost is not None:
            raise self.lost
        if time.monotonic() >= self._local_expires and not self.finished:
            raise LeaseLost(
                f"the claim of batch {self.token} on {self.events.qualified_name!r} expired without a renewal "
                "reaching the database, so its rows must be presumed claimed by another worker; renew more "
                "often than the lease (start_renewing()/renewing()) or check the path to the database",
                keys=self._unsettled())

    @property
    def keys(self) -> list[Any]:
        return [row[self.events.key] for row in self.rows]

    @property
    def expires_at(self) -> datetime:
        value = utc(self._expires_at)
        assert value is not None
        return value

    def __len__(self) -> int:
        return len(self.rows)

    def handle(self) -> dict[str, Any]:
        """A JSON-serialisable reference (for XCom or Dagster metadata).

        Table, key column, keys, token and owner, plus the batch's history: ``attempts`` (a list
        parallel to ``keys``, as JSON object keys would turn integer keys into strings),
        ``claimed_at``, ``expires_at`` and ``lease`` (seconds); the event table's schema is ``table_schema``.
        ``ControlTable.events(h["table"], key=h["key"], ...).batch(h)`` rebuilds the batch elsewhere.
        """
        return {
            "table": self.events.name,
            "table_schema": self.events.table_schema,
            "key": self.events.key,
            "order_by": self.events.order_by,
            "keys": self.keys,
            "token": self.token,
            "owner": self.owner,
            "attempts": [self.attempts.get(k, 1) for k in self.keys],
            "claimed_at": self.claimed_at,
            "expires_at": self._expires_at,
            "lease": self.lease_seconds,
        }

    @contextmanager
    @tracing.completes("done")
    def transaction(self, keys: Optional[Sequence[Any]] = None) -> Iterator[Connection]:
        """A transaction for the caller's own writes that commits together with the completion.

        On exit the batch (or ``keys``) is completed in the same transaction; if the lease was
        lost, :class:`LeaseLost` is raised and the caller's writes roll back with it.
        """
        with self.events.db.begin() as conn:
            yield conn
            if keys is None:
                self.events._complete(conn, self.token, self._unsettled(), whole=True)
            else:
                self.events._complete(conn, self.token, list(keys))
        self._settle(keys)

    @tracing.completes("done")
    def complete(self, keys: Optional[Sequence[Any]] = None) -> int:
        """Mark the batch (or ``keys`` of it) done. Raises :class:`LeaseLost` naming rows taken over.

        Safe to retry: rows already done under this batch's token count as completed, so a retry
        after a commit whose reply was lost succeeds instead of reporting the lease lost.
        """
        if keys is None:
            self.stop_renewing()
        todo = list(keys) if keys is not None else self._unsettled()
        n = self.events.db.run(lambda conn: self.events._complete(conn, self.token, todo, whole=keys is None))
        self._settle(keys)
        return n

    @tracing.completes("done")
    def complete_and_claim(
        self, size: Optional[int] = None, *, lease: Optional[float] = None, where: Where = None
    ) -> Optional[Batch]:
        """Complete this batch and claim the next one for the same owner, in one transaction.

        For drain loops: one commit per batch instead of two. The completion is fenced exactly as
        :meth:`complete`; if it raises :class:`LeaseLost`, nothing is claimed. Returns the next
        batch, or ``None`` when nothing is claimable (this batch is completed either way). The
        next batch gets ``lease`` or, by default, this batch's own lease length.
        """
        n = check_batch_size(size) if size is not None else max(len(self.rows), 1)
        lease_s = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert lease_s is not None
        todo = self._unsettled()
        self.stop_renewing()
        following = self.events._claim_run(n, self.owner, lease_s, where, complete=(self.token, todo))
        self._settle(None)
        return following

    @tracing.completes("failed")
    def fail(self, reason: str, keys: Optional[Sequence[Any]] = None) -> int:
        """Give rows back for a retry after a back-off; after ``max_attempts`` they go to error.

        The decision is made in SQL from the attempts stored in each row, so a batch rebuilt
        from a handle (another task, another process) counts exactly like the original.
        """
        if keys is None:
            self.stop_renewing()
        todo = list(keys) if keys is not None else self.keys
        n = self.events._fail(self.token, todo, str(reason))
        self._settle(keys)
        return n

    @tracing.completes("released")
    def release(self) -> int:
        """Give the rows back untouched (the attempt is not counted). Lost rows are ignored."""
        self.stop_renewing()
        with bounded_release(self.events.db):
            n = self.events._release(self.token, self.keys)
        self._settle(None)
        return n

    def renew(self, lease: Optional[float] = None) -> Batch:
        """Extend the claim to ``lease`` seconds from now (default: the batch's own lease length).

        :class:`LeaseLost` names rows taken over. A given ``lease`` becomes the batch's lease.
        """
        seconds = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert seconds is not None
        sent = time.monotonic()
        what = f"batch {self.token} on {self.events.qualified_name!r}"
        with within_lease(self.events.db, self._local_expires, what):
            self._expires_at = self.events._renew(self.token, self.keys, seconds)
        self._local_expires = local_expiry(sent, seconds)
        self.lease_seconds = seconds
        return self
