"""The control tables exactly as schema version 2 declared them (a frozen copy, for the upgrade tests).

Times are UTC epoch seconds read from the database clock (see :class:`dialects.db_now`), stored
as double precision so that lease arithmetic is the same on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import oracle

from controltable.defaults import NAME_LENGTH, NAMESPACE_LENGTH
from controltable.dialects import StateString, name_type, text_type

#: Bumped whenever the control tables change; ``install()`` records it in the meta table and
#: later releases migrate from the recorded version.
SCHEMA_VERSION = 2
#: What each version added, for the migration in ``ControlTable.install()``:
#: 2 - per-resource queue tickets (``resource.last_ticket``, ``request.ticket``), attempts and
#:     pickup deadlines on requests, the (state, ticket) queue index, identities for Oracle.


#: Epoch seconds need double precision: MySQL's plain FLOAT is single precision (about two
#: minutes of resolution at today's epoch). FLOAT(53) is a double on every backend.
EpochSeconds = Float(precision=53).with_variant(oracle.BINARY_DOUBLE(), "oracle")

# SQLite only makes INTEGER PRIMARY KEY columns auto-increment.
_Id = BigInteger().with_variant(Integer(), "sqlite")


def _identity() -> Identity:
    """An ordered identity: Oracle needs one for ids omitted from inserts (other backends ignore ORDER)."""
    try:
        return Identity(oracle_order=True)  # type: ignore[call-arg]  # SQLAlchemy 2.1 spelling
    except TypeError:  # pragma: no cover - SQLAlchemy 1.4 / 2.0
        return Identity(order=True)


@dataclass(frozen=True)
class ControlSchema:
    """The control tables of one installation (one prefix in one database schema)."""

    metadata: MetaData
    meta: Table
    resource: Table
    request: Table
    worklist: Table
    item: Table

    @property
    def tables(self) -> list[Table]:
        return [self.meta, self.resource, self.request, self.worklist, self.item]


def build_schema(prefix: str = "ct_", schema: Optional[str] = None) -> ControlSchema:
    """Declare the control tables for ``prefix`` (e.g. ``ct_``) in database schema ``schema``."""
    md = MetaData(schema=schema)
    meta = Table(
        f"{prefix}meta",
        md,
        Column("key", String(64), primary_key=True),
        Column("value", String(255), nullable=False),
    )
    resource = Table(
        f"{prefix}resource",
        md,
        Column("namespace", name_type(NAMESPACE_LENGTH), nullable=False),
        Column("name", name_type(NAME_LENGTH), nullable=False),
        Column("capacity", Integer, nullable=False),
        # Fencing counter: the token of the latest grant; strictly increases per resource.
        Column("last_token", BigInteger, nullable=False, default=0),
        Column("created_at", EpochSeconds, nullable=False),
        # Queue ticket counter: bumped under this row's lock, so ticket order is exactly the order
        # in which requests entered the queue, on every backend (identities may be unordered).
        Column("last_ticket", BigInteger, nullable=False, server_default=text("0")),
        PrimaryKeyConstraint("namespace", "name", name=f"{prefix}resource_pk"),
    )
    request = Table(
        f"{prefix}request",
        md,
        Column("id", _Id, _identity(), primary_key=True, autoincrement=True),
        Column("namespace", name_type(NAMESPACE_LENGTH), nullable=False),
        Column("resource", name_type(NAME_LENGTH), nullable=False),
        Column("holder", name_type(NAME_LENGTH), nullable=False),
        # Groups the per-resource rows of one all-or-nothing request.
        Column("request_key", String(64), nullable=False),
        Column("slots", Integer, nullable=False),
        Column("mode", String(10), nullable=False),
        Column("state", StateString(10), nullable=False),  # waiting | granted
        Column("token", BigInteger, nullable=True),
        Column("lease_seconds", EpochSeconds, nullable=False),
        Column("enqueued_at", EpochSeconds, nullable=False),
        Column("granted_at", EpochSeconds, nullable=True),
        Column("expires_at", EpochSeconds, nullable=False),
        # The queue ticket, from the resource's counter (taken under its lock). A multi-resource
        # request takes one ticket per resource, all while holding every resource's lock.
        Column("ticket", BigInteger, nullable=False, server_default=text("0")),
        # The caller's attempt number (a retried task): a higher attempt gets a new token in place.
        Column("attempt", Integer, nullable=True),
        # How long a grant made on this waiter's behalf waits to be picked up (NULL: the default).
        Column("pickup_seconds", EpochSeconds, nullable=True),
        UniqueConstraint("namespace", "resource", "holder", name=f"{prefix}request_holder_uq"),
        # The queue and the holders of a resource, in ticket order: a grant pass reads only the
        # head of the waiting queue and the (at most capacity) holders through it.
        Index(f"{prefix}request_state_ix", "namespace", "resource", "state", "ticket"),
        Index(f"{prefix}request_key_ix", "request_key"),
        sqlite_autoincrement=True,
    )
    worklist = Table(
        f"{prefix}worklist",
        md,
        Column("namespace", name_type(NAMESPACE_LENGTH), nullable=False),
        Column("name", name_type(NAME_LENGTH), nullable=False),
        Column("last_token", BigInteger, nullable=False, default=0),
        Column("created_at", EpochSeconds, nullable=False),
        PrimaryKeyConstraint("namespace", "name", name=f"{prefix}worklist_pk"),
    )
    item = Table(
        f"{prefix}work_item",
        md,
        Column("id", _Id, _identity(), primary_key=True, autoincrement=True),
        Column("namespace", name_type(NAMESPACE_LENGTH), nullable=False),
        Column("worklist", name_type(NAME_LENGTH), nullable=False),
        Column("exec_order", Integer, nullable=False),
        Column("priority", Integer, nullable=False, default=0),
        Column("payload", text_type(), nullable=False),
        Column("state", StateString(10), nullable=False),  # new | active | done | error
        Column("owner", name_type(NAME_LENGTH), nullable=True),
        Column("token", BigInteger, nullable=True),
        Column("attempts", Integer, nullable=False, default=0),
        Column("last_error", text_type(), nullable=True),
        Column("created_at", EpochSeconds, nullable=False),
        Column("started_at", EpochSeconds, nullable=True),
        Column("finished_at", EpochSeconds, nullable=True),
        Column("expires_at", EpochSeconds, nullable=True),
        Index(f"{prefix}work_item_ix", "namespace", "worklist", "state", "exec_order"),
        sqlite_autoincrement=True,
    )
    return ControlSchema(md, meta, resource, request, worklist, item)
