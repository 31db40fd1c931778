"""``Runtime``: what an engine needs from its ``ControlTable`` (database, tables, namespace, wake-ups).

Engines (slots, event tables, work lists) receive this object instead of the ``ControlTable`` that
made them, so dependencies point one way: ``ControlTable`` -> engines -> ``Runtime`` -> database
layer. Value objects (``Lease``, ``Batch``, ``Item``) hold their engine, never the ``ControlTable``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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


def check_runtime(value: object) -> Runtime:
    """``value`` itself when it is a :class:`Runtime`; else a :class:`ConfigurationError` naming the fix.

    Engines take the runtime, never the ``ControlTable`` (dependencies point one way); a caller
    that hands them the ``ControlTable`` learns to build them through it instead.
    """
    if isinstance(value, Runtime):
        return value
    raise ConfigurationError(
        f"expected a controltable Runtime, not {type(value).__name__}: build engines with ct.events(...) or "
        "ct.worklist(...), or pass ct.runtime"
    )
