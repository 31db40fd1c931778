"""The control tables exactly as schema version 1 declared them (a frozen copy, for the upgrade tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import oracle

NAME_LENGTH = 200
NAMESPACE_LENGTH = 100

#: Bumped whenever the control tables change; ``install()`` records it in the meta table and
#: later releases migrate from the recorded version.
SCHEMA_VERSION = 1


#: Epoch seconds need double precision: MySQL's plain FLOAT is single precision (about two
#: minutes of resolution at today's epoch). FLOAT(53) is a double on every backend.
EpochSeconds = Float(precision=53).with_variant(oracle.BINARY_DOUBLE(), "oracle")

# SQLite only makes INTEGER PRIMARY KEY columns auto-increment.
_Id = BigInteger().with_variant(Integer(), "sqlite")


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
        Column("namespace", String(NAMESPACE_LENGTH), nullable=False),
        Column("name", String(NAME_LENGTH), nullable=False),
        Column("capacity", Integer, nullable=False),
        # Fencing counter: the token of the latest grant; strictly increases per resource.
        Column("last_token", BigInteger, nullable=False, default=0),
        Column("created_at", EpochSeconds, nullable=False),
        PrimaryKeyConstraint("namespace", "name", name=f"{prefix}resource_pk"),
    )
    request = Table(
        f"{prefix}request",
        md,
        # The queue ticket. Assigned while the requested resources' rows are locked, so ticket
        # order is the order in which requests entered every queue they share.
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("namespace", String(NAMESPACE_LENGTH), nullable=False),
        Column("resource", String(NAME_LENGTH), nullable=False),
        Column("holder", String(NAME_LENGTH), nullable=False),
        # Groups the per-resource rows of one all-or-nothing request.
        Column("request_key", String(64), nullable=False),
        Column("slots", Integer, nullable=False),
        Column("mode", String(10), nullable=False),
        Column("state", String(10), nullable=False),  # waiting | granted
        Column("token", BigInteger, nullable=True),
        Column("lease_seconds", EpochSeconds, nullable=False),
        Column("enqueued_at", EpochSeconds, nullable=False),
        Column("granted_at", EpochSeconds, nullable=True),
        Column("expires_at", EpochSeconds, nullable=False),
        UniqueConstraint("namespace", "resource", "holder", name=f"{prefix}request_holder_uq"),
        Index(f"{prefix}request_queue_ix", "namespace", "resource", "id"),
        Index(f"{prefix}request_key_ix", "request_key"),
        sqlite_autoincrement=True,
    )
    worklist = Table(
        f"{prefix}worklist",
        md,
        Column("namespace", String(NAMESPACE_LENGTH), nullable=False),
        Column("name", String(NAME_LENGTH), nullable=False),
        Column("last_token", BigInteger, nullable=False, default=0),
        Column("created_at", EpochSeconds, nullable=False),
        PrimaryKeyConstraint("namespace", "name", name=f"{prefix}worklist_pk"),
    )
    item = Table(
        f"{prefix}work_item",
        md,
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("namespace", String(NAMESPACE_LENGTH), nullable=False),
        Column("worklist", String(NAME_LENGTH), nullable=False),
        Column("exec_order", Integer, nullable=False),
        Column("priority", Integer, nullable=False, default=0),
        Column("payload", Text, nullable=False),
        Column("state", String(10), nullable=False),  # new | active | done | error
        Column("owner", String(NAME_LENGTH), nullable=True),
        Column("token", BigInteger, nullable=True),
        Column("attempts", Integer, nullable=False, default=0),
        Column("last_error", Text, nullable=True),
        Column("created_at", EpochSeconds, nullable=False),
        Column("started_at", EpochSeconds, nullable=True),
        Column("finished_at", EpochSeconds, nullable=True),
        Column("expires_at", EpochSeconds, nullable=True),
        Index(f"{prefix}work_item_ix", "namespace", "worklist", "state", "exec_order"),
        sqlite_autoincrement=True,
    )
    return ControlSchema(md, meta, resource, request, worklist, item)
