"""Upgrades of installed control tables from an older schema version, step by step, each step idempotent.

``ControlTable.install()`` runs them. Every DDL statement runs in its own transaction (a DDL holds
a schema lock on the table until it commits) through the database layer (``Database.run``: its
retry policy, and driver errors turned into controltable errors that name the fix), and is skipped
when an earlier or concurrent run already applied it, so two processes installing at once, or an
upgrade interrupted half-way, both end in the same tables. Statements are built by pure functions
from the declared tables: identifiers are quoted by the dialect, no user value is ever formatted
into SQL.

Upgrade with the old release's workers stopped: a v1 worker does not know the ticket counter.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sqlalchemy import Column, Index, Sequence, Table, column, func, inspect, literal, select, text, update
from sqlalchemy import table as table_clause
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.schema import CreateSequence
from sqlalchemy.sql.elements import TextClause

from .db import Database
from .dialects import traits
from .errorcodes import is_already_applied
from .errors import ControlTableError
from .schema import MYSQL_CHARSET, MYSQL_COLLATION, ControlSchema, build_schema

log = logging.getLogger("controltable")

#: Whether a DDL error means "a concurrent or earlier run did this already" (by error code).
_ALREADY = is_already_applied


def add_column_sql(table: Table, column: Column, dialect: Dialect) -> TextClause:
    """``ALTER TABLE t ADD c type [DEFAULT d] [NOT NULL]`` for ``dialect``, from the declared column."""
    prep = dialect.identifier_preparer
    coltype = column.type.compile(dialect=dialect)
    default = ""
    if column.server_default is not None:
        arg: object = getattr(column.server_default, "arg", None)
        default = f" DEFAULT {getattr(arg, 'text', arg)}"
    null = "" if column.nullable else " NOT NULL"
    keyword = traits(dialect.name).add_column_keyword
    return text(f"ALTER TABLE {prep.format_table(table)} {keyword} {prep.quote(column.name)} {coltype}{default}{null}")


def _columns(conn: Connection, table: Table) -> set[str]:
    return {c["name"].lower() for c in inspect(conn).get_columns(table.name, schema=table.schema)}


def _indexes(conn: Connection, table: Table) -> set[str]:
    return {str(i["name"]).lower() for i in inspect(conn).get_indexes(table.name, schema=table.schema) if i["name"]}


def _ddl(db: Database, step: Callable[[Connection], None]) -> None:
    """One idempotent DDL step in its own transaction, through the database layer's retry policy;
    a concurrent installer having done it already is fine (recognised by error code)."""
    try:
        db.run(step)
    except ControlTableError as exc:
        if any(e is not None and _ALREADY(e) for e in (exc, exc.__cause__)):
            return
        raise


def _ensure_index(db: Database, table: Table, index: Index) -> None:
    """Create ``index`` of ``table`` unless it exists (a check-then-act DDL step)."""

    def create(conn: Connection) -> None:
        if str(index.name).lower() not in _indexes(conn, table):
            index.create(conn)

    _ddl(db, create)


def id_sequence(table: Table) -> Sequence:
    """Oracle: the sequence that generates ``table``'s ids where an upgrade found none (v1 tables
    had no identity; an existing column cannot be made one, ORA-30673)."""
    return Sequence(f"{table.name}_id_seq", schema=table.schema)


def id_default_sql(table: Table, sequence: Sequence, dialect: Dialect) -> TextClause:
    """Oracle 12c+: ``ALTER TABLE t MODIFY (id DEFAULT ON NULL <seq>.NEXTVAL)``, so inserts that
    leave the id out (every insert of the engine) get one instead of failing with ORA-01400."""
    prep = dialect.identifier_preparer
    return text(f"ALTER TABLE {prep.format_table(table)} MODIFY ({prep.quote('id')} DEFAULT ON NULL "
                f"{prep.format_sequence(sequence)}.NEXTVAL)")


def ensure_oracle_ids(db: Database, table: Table) -> None:
    """Give an Oracle table whose ``id`` has neither identity nor default a sequence default: two
    check-then-act steps (the sequence, starting above every id; then the default)."""
    dialect: Dialect = db.engine.dialect
    if not traits(dialect.name).sequence_ids:
        return
    seq = id_sequence(table)

    def generated(conn: Connection) -> bool:
        col = next(c for c in inspect(conn).get_columns(table.name, schema=table.schema) if c["name"].lower() == "id")
        return bool(col.get("identity") or col.get("default"))

    def create_sequence(conn: Connection) -> None:
        if generated(conn) or dialect.has_sequence(conn, seq.name, schema=table.schema):
            return
        start = int(conn.scalar(select(func.coalesce(func.max(table.c.id), 0))) or 0) + 1
        conn.execute(CreateSequence(Sequence(seq.name, schema=table.schema, start=start)))

    def set_default(conn: Connection) -> None:
        if not generated(conn):
            conn.execute(id_default_sql(table, seq, dialect))

    _ddl(db, create_sequence)
    _ddl(db, set_default)


def upgrade_v1_to_v2(db: Database, tables: ControlSchema) -> None:
    """Tickets from the per-resource counter, attempts and pickup deadlines, the (state, ticket) index."""
    r, q = tables.resource, tables.request
    dialect: Dialect = db.engine.dialect
    for table, name in ((r, "last_ticket"), (q, "ticket"), (q, "attempt"), (q, "pickup_seconds")):

        def add(conn: Connection, table: Table = table, name: str = name) -> None:
            if name not in _columns(conn, table):
                conn.execute(add_column_sql(table, table.c[name], dialect))

        _ddl(db, add)

    def backfill(conn: Connection) -> None:
        # v1 tickets were the request ids (one sequence for all resources): keep their order.
        conn.execute(update(q).where(q.c.ticket == 0).values(ticket=q.c.id))
        top = (
            select(func.coalesce(func.max(q.c.ticket), 0))
            .where(q.c.namespace == r.c.namespace, q.c.resource == r.c.name)
            .scalar_subquery()
        )
        conn.execute(update(r).values(last_ticket=top))

    db.run(backfill)  # idempotent: tickets still 0 and the counters' maxima
    # v1 ids had no identity: on Oracle every insert failed (ORA-01400) until they get a default.
    for with_ids in (q, tables.item):
        ensure_oracle_ids(db, with_ids)

    # The v2 index (state, ticket); v2 -> v3 replaces it in turn (built on a scratch copy, as
    # it is no longer part of the declared schema).
    v2_name = q.name[: -len("request")] + "request_state_ix"
    v2_scratch = build_schema(q.name[: -len("request")], q.schema).request
    new_index = Index(v2_name, v2_scratch.c.namespace, v2_scratch.c.resource, v2_scratch.c.state, v2_scratch.c.ticket)

    def create_index(conn: Connection) -> None:
        if v2_name.lower() not in _indexes(conn, q):
            new_index.create(conn)

    _ddl(db, create_index)

    # The v1 queue index (namespace, resource, id) is superseded; built on a scratch copy of the
    # tables so that it never becomes part of the declared schema.
    scratch = build_schema(q.name[: -len("request")], q.schema).request
    old_name = q.name[: -len("request")] + "request_queue_ix"
    old = Index(old_name, scratch.c.namespace, scratch.c.resource, scratch.c.id)

    def drop_old(conn: Connection) -> None:
        if old_name.lower() in _indexes(conn, q):
            old.drop(conn)

    try:
        _ddl(db, drop_old)
    except Exception as exc:  # harmless to keep: only costs a little on inserts
        log.warning("controltable: could not drop the old index %s (%s); it is unused now", old_name, exc)


def upgrade_v2_to_v3(db: Database, tables: ControlSchema) -> None:
    """Rate limits and aging on resources, priorities and the queue order on requests, the grant history.

    Existing requests get priority 0 and queue key 0 (the column defaults): the queue order of
    a v2 installation is its ticket order, which the new (state, queue_key, ticket) index keeps.
    Its live holders get no history rows (their grants predate it); their releases find none
    to close, which is harmless.
    """
    r, q, h = tables.resource, tables.request, tables.history
    dialect: Dialect = db.engine.dialect
    for table, name in ((r, "rate_count"), (r, "rate_per"), (r, "aging"), (q, "priority"), (q, "queue_key")):

        def add(conn: Connection, table: Table = table, name: str = name) -> None:
            if name not in _columns(conn, table):
                conn.execute(add_column_sql(table, table.c[name], dialect))

        _ddl(db, add)

    def create_history(conn: Connection) -> None:
        h.create(conn, checkfirst=True)  # with its time index when the table is new

    _ddl(db, create_history)
    # The table's indexes are steps of their own too: DDL commits itself on MySQL and Oracle, so a
    # step that failed (and was retried) or an install interrupted between the CREATE TABLE and the
    # CREATE INDEX leaves a table without its index, which checkfirst above would not notice.
    for index in h.indexes:
        _ensure_index(db, h, index)
    _ensure_index(db, q, next(i for i in q.indexes if i.name and i.name.endswith("request_order_ix")))

    # The v2 queue index (state, ticket) is superseded by the (state, queue_key, ticket) one.
    scratch = build_schema(q.name[: -len("request")], q.schema).request
    old_name = q.name[: -len("request")] + "request_state_ix"
    old = Index(old_name, scratch.c.namespace, scratch.c.resource, scratch.c.state, scratch.c.ticket)

    def drop_old(conn: Connection) -> None:
        if old_name.lower() in _indexes(conn, q):
            old.drop(conn)

    try:
        _ddl(db, drop_old)
    except Exception as exc:  # harmless to keep: only costs a little on inserts
        log.warning("controltable: could not drop the old index %s (%s); it is unused now", old_name, exc)


def convert_charset_sql(table: Table, dialect: Dialect) -> TextClause:
    """``ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin`` (MySQL / MariaDB).

    The table name is quoted by the dialect; the character set and collation are constants of
    :mod:`controltable.schema`, never a caller's value."""
    prep = dialect.identifier_preparer
    return text(f"ALTER TABLE {prep.format_table(table)} CONVERT TO CHARACTER SET {MYSQL_CHARSET} "
                f"COLLATE {MYSQL_COLLATION}")


def charset_pending(table: Table) -> Any:
    """How many of ``table``'s text columns (or the table's own default) are not yet utf8mb4_bin,
    from ``information_schema`` (MySQL / MariaDB); 0 means converted."""
    tables = _info_schema("TABLES")
    cols = _info_schema("COLUMNS")
    where_db = func.coalesce(literal(table.schema), func.database())
    off_table = (
        select(func.count()).select_from(tables)
        .where(tables.c["TABLE_SCHEMA"] == where_db, tables.c["TABLE_NAME"] == table.name,
               tables.c["TABLE_COLLATION"] != MYSQL_COLLATION)
        .scalar_subquery()
    )
    off_columns = (
        select(func.count()).select_from(cols)
        .where(cols.c["TABLE_SCHEMA"] == where_db, cols.c["TABLE_NAME"] == table.name,
               cols.c["COLLATION_NAME"].is_not(None), cols.c["COLLATION_NAME"] != MYSQL_COLLATION)
        .scalar_subquery()
    )
    return select(off_table + off_columns)


def _info_schema(name: str) -> Any:
    """An ``information_schema`` view with the columns :func:`charset_pending` reads."""
    names = {"TABLES": ("TABLE_SCHEMA", "TABLE_NAME", "TABLE_COLLATION"),
             "COLUMNS": ("TABLE_SCHEMA", "TABLE_NAME", "COLLATION_NAME")}[name]
    return table_clause(name, *(column(n) for n in names), schema="information_schema")


def upgrade_v3_to_v4(db: Database, tables: ControlSchema) -> None:
    """MySQL / MariaDB: every control table converted to utf8mb4 with the binary collation.

    Tables created in a database whose default is latin1 (or a case-insensitive collation) get
    the character set and collation ``install()`` now declares. One table per DDL step, each
    check-then-act (``information_schema`` says whether anything is left to convert), so a rerun or
    a concurrent install converts nothing twice. The conversion copies the table: on a large
    grant history it takes a while, during which the table is read-only; upgrade with workers
    stopped, as for every upgrade. Other backends: nothing to do (they compare names exactly and
    store any Unicode already).
    """
    dialect: Dialect = db.engine.dialect
    if not traits(dialect.name).utf8mb4_tables:
        return
    for tbl in tables.tables:

        def convert(conn: Connection, tbl: Table = tbl) -> None:
            if int(conn.scalar(charset_pending(tbl)) or 0):
                conn.execute(convert_charset_sql(tbl, dialect))

        _ddl(db, convert)


def ensure_indexes(db: Database, tables: ControlSchema) -> None:
    """Indexes added without a new schema version, ensured by every ``install()``.

    An index changes no statement's result, so clients of one version work with or without it;
    a version bump would make every worker not yet upgraded refuse the tables. Now: the work-item
    index in allocation order (``work_item_next_ix``), which replaces ``work_item_ix`` (its
    prefix). Each is a check-then-act step; one that fails (a user with DML rights only, whose DBA
    ran the printed DDL) is logged and left: the statements work without it, only slower.
    """
    items = tables.item
    prefix = items.name[: -len("work_item")]
    scratch = build_schema(prefix, items.schema).item
    old_name = prefix + "work_item_ix"
    old = Index(old_name, scratch.c.namespace, scratch.c.worklist, scratch.c.state, scratch.c.exec_order)

    def drop_old(conn: Connection) -> None:
        if old_name.lower() in _indexes(conn, items):
            old.drop(conn)

    try:
        _ensure_index(db, items, next(i for i in items.indexes if i.name and i.name.endswith("work_item_next_ix")))
        _ddl(db, drop_old)
    except ControlTableError as exc:
        log.warning("controltable: could not bring the indexes of %s up to date (%s); allocations work "
                    "without them, only slower: run the CREATE INDEX of `controltable sql`", items.name, exc)


#: ``from_version -> step`` bringing the tables to ``from_version + 1``.
UPGRADES: dict[int, Callable[[Database, ControlSchema], None]] = {
    1: upgrade_v1_to_v2, 2: upgrade_v2_to_v3, 3: upgrade_v3_to_v4,
}
