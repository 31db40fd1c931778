"""The control tables, declared once as SQLAlchemy ``Table`` objects, and their schema version.

Times are UTC epoch seconds read from the database clock (see :class:`dialects.db_now`), stored
as double precision so that lease arithmetic is the same on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from sqlalchemy import (
    BigInteger,
    Column,
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

from .defaults import DEFAULT_PREFIX, NAME_LENGTH, NAMESPACE_LENGTH  # noqa: F401 - re-exported
from .dialects import StateString, epoch_seconds_type, id_type, name_type, text_type, utf8mb4_table_options

#: Bumped whenever the control tables change; ``install()`` records it in the meta table and
#: brings tables of an older version up, one step per version (``migrations.UPGRADES``). Version 1
#: is the first release's tables, as declared below.
SCHEMA_VERSION = 1

#: MySQL / MariaDB character set and collation of the control tables, whatever the database's
#: default: utf8mb4 stores every name a caller may pass, and the binary collation compares names
#: exactly, as every other backend does ('Warehouse' and 'warehouse' are two resources; with a
#: case-insensitive default they would clash in the primary key). A latin1 default would refuse
#: such names or fail comparisons with "Illegal mix of collations".
MYSQL_CHARSET = "utf8mb4"
MYSQL_COLLATION = "utf8mb4_bin"
#: The table options that say so (the MariaDB dialect of SQLAlchemy 2 reads its own prefix only).
_TABLE_OPTIONS: dict[str, Any] = utf8mb4_table_options(MYSQL_CHARSET, MYSQL_COLLATION)


#: Epoch seconds need double precision: MySQL's plain FLOAT is single precision (about two
#: minutes of resolution at today's epoch). FLOAT(53) is a double on every backend.
EpochSeconds = epoch_seconds_type()

# SQLite only makes INTEGER PRIMARY KEY columns auto-increment.
_Id = id_type()


def _identity(ordered: bool = True) -> Identity:
    """An identity: Oracle needs one for ids omitted from inserts. ``ordered`` (Oracle ``ORDER``,
    which other backends ignore) only where ids order something: work items of equal order and
    priority are allocated by id. Requests are queued by their per-resource ticket, so their ids
    need no order, which on RAC would cost a cross-instance round trip per id."""
    if not ordered:
        return Identity()
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
    history: Table

    @property
    def tables(self) -> list[Table]:
        return [self.meta, self.resource, self.request, self.worklist, self.item, self.history]


def build_schema(prefix: str = DEFAULT_PREFIX, schema: Optional[str] = None) -> ControlSchema:
    """Declare the control tables for ``prefix`` (e.g. ``ct_``) in database schema ``schema``."""
    md = MetaData(schema=schema)
    meta = Table(
        f"{prefix}meta",
        md,
        Column("key", name_type(64), primary_key=True),  # looked up by a bound string: see request_key
        Column("value", String(255), nullable=False),
        **_TABLE_OPTIONS,
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
        # Rate limit: at most rate_count grants in any window of rate_per seconds (NULL: none).
        Column("rate_count", Integer, nullable=True),
        Column("rate_per", EpochSeconds, nullable=True),
        # Aging: a waiter's effective priority rises by one per `aging` seconds waited (NULL: off).
        Column("aging", EpochSeconds, nullable=True),
        PrimaryKeyConstraint("namespace", "name", name=f"{prefix}resource_pk"),
        **_TABLE_OPTIONS,
    )
    request = Table(
        f"{prefix}request",
        md,
        Column("id", _Id, _identity(ordered=False), primary_key=True, autoincrement=True),
        Column("namespace", name_type(NAMESPACE_LENGTH), nullable=False),
        Column("resource", name_type(NAME_LENGTH), nullable=False),
        Column("holder", name_type(NAME_LENGTH), nullable=False),
        # Groups the per-resource rows of one all-or-nothing request. A name type: on SQL Server
        # NVARCHAR like the parameters drivers send, so a lookup by key seeks ct_request_key_ix
        # (a VARCHAR column would be converted and scanned, under the U locks of a grant pass).
        Column("request_key", name_type(64), nullable=False),
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
        # The request's priority (higher is granted first) and its place in the queue order:
        # -priority without aging, enqueued_at - priority * aging with it (an effective priority
        # priority + waited / aging orders exactly like that static key, so the order stays an
        # index order). Rewritten for the waiting rows when a resource's aging changes.
        Column("priority", Integer, nullable=False, server_default=text("0")),
        Column("queue_key", EpochSeconds, nullable=False, server_default=text("0")),
        UniqueConstraint("namespace", "resource", "holder", name=f"{prefix}request_holder_uq"),
        # The queue and the holders of a resource, in queue order (ties in ticket order): a grant
        # pass reads only the head of the waiting queue and the (at most capacity) holders.
        Index(f"{prefix}request_order_ix", "namespace", "resource", "state", "queue_key", "ticket"),
        Index(f"{prefix}request_key_ix", "request_key"),
        sqlite_autoincrement=True,
        **_TABLE_OPTIONS,
    )
    worklist = Table(
        f"{prefix}worklist",
        md,
        Column("namespace", name_type(NAMESPACE_LENGTH), nullable=False),
        Column("name", name_type(NAME_LENGTH), nullable=False),
        Column("last_token", BigInteger, nullable=False, default=0),
        Column("created_at", EpochSeconds, nullable=False),
        PrimaryKeyConstraint("namespace", "name", name=f"{prefix}worklist_pk"),
        **_TABLE_OPTIONS,
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
        sqlite_autoincrement=True,
        **_TABLE_OPTIONS,
    )
    # The next item of an order is the first of this index's range (state, order) in allocation
    # order (priority high first, then id): read in index order, never a sort of the whole order.
    # Its prefix serves the current order's min(exec_order) and the status counts too.
    Index(f"{prefix}work_item_next_ix", item.c.namespace, item.c.worklist, item.c.state, item.c.exec_order,
          item.c.priority.desc(), item.c.id)
    history = Table(
        f"{prefix}grant_history",
        md,
        # One row per grant, written in the grant's transaction; the token is unique per resource
        # (the fencing counter), so (namespace, resource, token) names a grant.
        Column("namespace", name_type(NAMESPACE_LENGTH), nullable=False),
        Column("resource", name_type(NAME_LENGTH), nullable=False),
        Column("token", BigInteger, nullable=False),
        Column("holder", name_type(NAME_LENGTH), nullable=False),
        Column("mode", String(10), nullable=False),
        Column("slots", Integer, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("enqueued_at", EpochSeconds, nullable=False),
        Column("granted_at", EpochSeconds, nullable=False),
        Column("ended_at", EpochSeconds, nullable=True),
        Column("outcome", StateString(10), nullable=False),  # held | released | expired
        PrimaryKeyConstraint("namespace", "resource", "token", name=f"{prefix}grant_history_pk"),
        # Rate windows, statistics and pruning read a resource's grants by time.
        Index(f"{prefix}grant_history_time_ix", "namespace", "resource", "granted_at"),
        **_TABLE_OPTIONS,
    )
    return ControlSchema(md, meta, resource, request, worklist, item, history)
