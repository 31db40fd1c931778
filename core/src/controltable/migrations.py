"""Installing the control tables and upgrading them from an older schema version, one idempotent step at a time.

``ControlTable.install()`` runs :func:`install`: it creates missing tables, records the schema
version, refuses tables newer than this package, and brings older ones up step by step
(``UPGRADES``). Every DDL statement of a step runs in its own transaction (a DDL holds a schema
lock on the table until it commits) through the database layer (``Database.run``: its retry
policy, and driver errors turned into controltable errors that name the fix), and is skipped when
an earlier or concurrent run already applied it, so two processes installing at once, or an
upgrade interrupted half-way, both end in the same tables. Statements are built by pure functions
from the declared tables: identifiers are quoted by the dialect, no user value is ever formatted
into SQL.

Version 1 is the first: no upgrade exists yet. The first change of the tables adds
``UPGRADES[1]`` (built from :func:`add_column` and :func:`ensure_index`) and raises
``schema.SCHEMA_VERSION``; ``tests/core/test_migrations.py`` runs such a step on a synthetic
version 2. Upgrade with the old release's workers stopped.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Mapping, Optional

from sqlalchemy import Column, Index, Table, insert, inspect, select, text, update
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.elements import TextClause

from . import errorcodes
from .db import Database
from .defaults import INSTALL_BUSY_WINDOW
from .dialects import traits
from .errors import ControlTableError, DatabaseBusyError, NotInstalledError
from .schema import SCHEMA_VERSION, ControlSchema

#: An upgrade step: brings the tables from one version to the next; idempotent.
Step = Callable[[Database, ControlSchema], None]

#: ``from_version -> step`` bringing the tables to ``from_version + 1``. Empty: version 1 is the first.
UPGRADES: Mapping[int, Step] = {}

#: Whether a DDL error means "a concurrent or earlier run did this already" (by error code).
_ALREADY = errorcodes.is_already_applied


def install(db: Database, tables: ControlSchema, *, version: int = SCHEMA_VERSION,
            upgrades: Mapping[int, Step] = UPGRADES) -> int:
    """Create the missing tables, record ``version`` on new ones, upgrade older ones; returns ``version``.

    ``version`` and ``upgrades`` are this package's (the tests pass a synthetic next version).
    Tables recorded at a newer version than ``version`` are refused with :class:`NotInstalledError`:
    this package does not know their columns.
    """
    # A new SQLite connection sets its journal mode, which meets a concurrent install's lock at once.
    _retry_busy(db.ping)
    _retry_busy(lambda: _create(db, tables))
    meta = tables.meta

    def read(conn: Connection) -> Optional[int]:
        found = conn.scalar(select(meta.c.value).where(meta.c.key == "schema_version"))
        return None if found is None else int(found)

    installed = db.run(read)
    if installed is None:
        try:
            db.run(lambda c: c.execute(insert(meta).values(key="schema_version", value=str(version))))
        except Exception as exc:
            if not errorcodes.is_unique_violation(exc):
                raise
            installed = db.run(read)  # a concurrent install recorded it first
    if installed is not None and installed > version:
        raise NotInstalledError(
            f"the control tables have schema version {installed}, newer than this controltable "
            f"({version}); upgrade the controltable package"
        )
    for step in range(installed or version, version):
        upgrade = upgrades[step]
        _retry_busy(lambda: upgrade(db, tables))  # noqa: B023 - called at once
        record = update(meta).where(meta.c.key == "schema_version").values(value=str(step + 1))
        db.run(lambda c: c.execute(record))  # noqa: B023 - called at once
    return version


def _create(db: Database, tables: ControlSchema) -> None:
    for attempt in range(3):
        try:
            with db.translating():  # e.g. no CREATE privilege: PermissionDeniedError, not a driver error
                tables.metadata.create_all(db.engine, checkfirst=True)
            return
        except Exception as exc:
            # A concurrent install created a table between the check and the CREATE (on
            # PostgreSQL a unique violation in the catalog): the next check sees it.
            raced = any(errorcodes.is_unique_violation(e) or _ALREADY(e)
                        for e in (exc, exc.__cause__) if e is not None)
            if attempt == 2 or not raced:
                raise


def _retry_busy(fn: Callable[[], object], within: float = INSTALL_BUSY_WINDOW) -> None:
    """Run an idempotent DDL step again when a concurrent one held the database (SQLite reports
    "database is locked" at once when two installs both try to upgrade to a write lock).

    Bounded by time, not by a count of attempts: several installs upgrading at once on a loaded
    machine can each meet the lock more often than a fixed count allows, and installs are rare.
    """
    deadline = time.monotonic() + within
    delay = 0.1
    while True:
        try:
            fn()
            return
        except DatabaseBusyError:
            pause = delay * (0.5 + random.random())
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            delay = min(delay * 2, 2.0)


# -- the pieces of an upgrade step ---------------------------------------------------------------
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


def add_column(db: Database, table: Table, name: str) -> None:
    """Add the declared column ``table.c[name]`` unless the installed table has it (check-then-act)."""
    dialect: Dialect = db.engine.dialect

    def add(conn: Connection) -> None:
        if name.lower() not in {c["name"].lower() for c in inspect(conn).get_columns(table.name, schema=table.schema)}:
            conn.execute(add_column_sql(table, table.c[name], dialect))

    _ddl(db, add)


def ensure_index(db: Database, table: Table, index: Index) -> None:
    """Create ``index`` of ``table`` unless it exists (check-then-act)."""

    def create(conn: Connection) -> None:
        have = inspect(conn).get_indexes(table.name, schema=table.schema)
        if str(index.name).lower() not in {str(i["name"]).lower() for i in have if i["name"]}:
            index.create(conn)

    _ddl(db, create)


def _ddl(db: Database, step: Callable[[Connection], None]) -> None:
    """One idempotent DDL step in its own transaction, through the database layer's retry policy;
    a concurrent installer having done it already is fine (recognised by error code)."""
    try:
        db.run(step)
    except ControlTableError as exc:
        if any(e is not None and _ALREADY(e) for e in (exc, exc.__cause__)):
            return
        raise
