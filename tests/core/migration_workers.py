"""A synthetic schema version 2 for the migration tests, and an installer process (run as a script).

  python migration_workers.py URL PREFIX     print "ready", wait for a line on stdin, then install
                                             version 2 and print {"version": ...} or {"error": ...}

Version 2 adds ``resource.weight`` (INTEGER NOT NULL DEFAULT 1, so existing rows get a value) and
an index on (namespace, weight): the two kinds of change a real next version is made of, through
the same pieces (``migrations.add_column``, ``migrations.ensure_index``).
"""

from __future__ import annotations

import json
import sys
from typing import Optional

from sqlalchemy import Column, Index, Integer, text

from controltable import ControlTable, migrations
from controltable.db import Database
from controltable.schema import ControlSchema, build_schema

NEXT_VERSION = 2


def v2_tables(prefix: str, schema: Optional[str] = None) -> ControlSchema:
    """The control tables as version 2 declares them: version 1's plus the weight column and its index."""
    tables = build_schema(prefix, schema)
    r = tables.resource
    r.append_column(Column("weight", Integer, nullable=False, server_default=text("1")))
    Index(f"{prefix}resource_weight_ix", r.c.namespace, r.c.weight)  # attaches itself to the table
    return tables


def upgrade_v1_to_v2(db: Database, tables: ControlSchema) -> None:
    """The synthetic step: the column, then its index, each check-then-act."""
    r = tables.resource
    migrations.add_column(db, r, "weight")
    migrations.ensure_index(db, r, next(i for i in r.indexes if str(i.name).endswith("resource_weight_ix")))


UPGRADES = {1: upgrade_v1_to_v2}


def install_v2(ct: ControlTable) -> int:
    """``install()`` as a package at version 2 would run it."""
    return migrations.install(ct.db, v2_tables(ct.runtime.prefix, ct.schema), version=NEXT_VERSION,
                              upgrades=UPGRADES)


def main(url: str, prefix: str) -> None:
    ct = ControlTable(url, prefix=prefix)
    try:
        print("ready", flush=True)
        sys.stdin.readline()  # the test starts every installer at once
        try:
            print(json.dumps({"version": install_v2(ct)}), flush=True)
        except Exception as exc:  # reported to the test, which asserts there is none
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    finally:
        ct.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
