"""``Runtime``: what an engine needs from its ``ControlTable`` (database, tables, namespace, wake-ups).

Engines (slots, event tables, work lists) receive this object instead of the ``ControlTable`` that
made them, so dependencies point one way: ``ControlTable`` -> engines -> ``Runtime`` -> database
layer. Value objects (``Lease``, ``Batch``, ``Item``) hold their engine, never the ``ControlTable``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from sqlalchemy.engine import Connection, Engine

from .db import Database
from .errors import ConfigurationError
from .schema import ControlSchema
from .wakeups import Wakeups


@dataclass(frozen=True)
class Runtime:
    """The shared, thread-safe state every engine of one ``ControlTable`` works through."""

    db: Database
    tables: ControlSchema
    namespace: str
    schema: Optional[str]
    prefix: str
    wakeups: Wakeups

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for the caller's own tables, e.g. reflecting an event table)."""
        return self.db.engine

    @property
    def dialect(self) -> str:
        """The backend's dialect name (``postgresql``, ``mysql``, ``mssql``, ``oracle``, ``sqlite``)."""
        return self.db.dialect_name

    def notify(self, conn: Connection, keys: list[str]) -> None:
        """Inside ``conn``'s transaction: wake waiters of ``keys`` when it commits (push on PostgreSQL)."""
        self.wakeups.notify(conn, keys)

    def mark(self, keys: list[str]) -> tuple[int, ...]:
        """A marker of the wake-ups seen so far for ``keys``, to pass to :meth:`wait` as ``since``."""
        return self.wakeups.mark(keys)

    def wait(self, keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> bool:
        """Sleep up to ``seconds``, or less when a wake-up arrives for one of ``keys``; True if woken."""
        return self.wakeups.wait(keys, seconds, since)

    @property
    def push_active(self) -> bool:
        """Whether pushes are being received now; without them waiters poll."""
        return self.wakeups.active


def runtime_of(owner: Any) -> Runtime:
    """The :class:`Runtime` of ``owner``: a ``Runtime`` itself, or a ``ControlTable`` (its ``runtime``).

    Engines accept either, so code that builds ``EventTable(ct, ...)`` by hand keeps working
    while the engine itself depends on the runtime only.
    """
    if isinstance(owner, Runtime):
        return owner
    found = getattr(owner, "runtime", None)
    if isinstance(found, Runtime):
        return found
    raise ConfigurationError(f"expected a ControlTable or its Runtime, not {type(owner).__name__}")
