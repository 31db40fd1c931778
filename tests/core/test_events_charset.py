"""Claim columns store any Unicode whatever the event table's character set (issue 33, item 5).

MariaDB/MySQL: a column added by ``ALTER TABLE ... ADD`` takes the table's default character set, so
on a latin1 table ``claim(owner="ü名前🙂")`` and ``Batch.fail("…名前")`` were refused with a
``ConfigurationError`` telling the user to run ``controltable init`` (which never touches user
tables), and the failed ``fail()`` left the batch claimed until its lease ran out. Now ``prepare()``
declares the claim columns' own character set (utf8mb4) and converts those of a table prepared
before; until it is run, a value the column cannot store is stored escaped instead of refused.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, text
from sqlalchemy.engine import make_url
from support import event_tables

from controltable import ControlTable

OWNER = "ü名前🙂"
REASON = "échec … 名前 🙂"


@pytest.fixture
def latin1_ct() -> Iterator[ControlTable]:
    """A ControlTable on a throwaway database created with latin1 as its default (shared MariaDB)."""
    server = os.environ.get("CONTROLTABLE_TEST_MYSQL_URL")
    if not server:
        pytest.skip("CONTROLTABLE_TEST_MYSQL_URL not set")
    name = f"ct_latin1_ev_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET latin1 COLLATE latin1_swedish_ci")
    ct = ControlTable(make_url(server).set(database=name).render_as_string(hide_password=False), namespace="ev")
    try:
        ct.install()
        yield ct
    finally:
        ct.close()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def _latin1_table(ct: ControlTable, n: int) -> Table:
    t = Table(f"ev_{uuid.uuid4().hex[:8]}", MetaData(), Column("id", Integer, primary_key=True, autoincrement=False),
              Column("payload", String(50), nullable=False), mysql_charset="latin1")
    t.create(ct.engine)
    with ct.engine.begin() as conn:
        conn.execute(insert(t), [{"id": i, "payload": f"Zürich {i}"} for i in range(1, n + 1)])
    return t


def _charsets(ct: ControlTable, table: str) -> dict[str, str]:
    """The character set of each text column of ``table``, from information_schema."""
    with ct.engine.connect() as conn:
        rows = conn.execute(text("SELECT column_name, character_set_name FROM information_schema.columns WHERE "
                                 "table_schema = database() AND table_name = :t AND character_set_name IS NOT NULL"),
                            {"t": table}).all()
    return {str(r[0]): str(r[1]) for r in rows}


def _stored(ct: ControlTable, table: str, column: str, key: int) -> Any:
    return event_tables.rows(ct, table)[key][column]


def test_claim_columns_of_a_latin1_table_store_any_unicode(latin1_ct: ControlTable) -> None:
    t = _latin1_table(latin1_ct, 3)
    events = latin1_ct.events(t.name, key="id", backoff=0)
    events.prepare()
    charsets = _charsets(latin1_ct, t.name)
    assert charsets["payload"] == "latin1"  # the user's own columns are left alone
    assert charsets["ct_owner"] == charsets["ct_error"] == "utf8mb4"
    batch = events.claim(2, owner=OWNER)
    assert batch is not None and batch.owner == OWNER
    assert _stored(latin1_ct, t.name, "ct_owner", 1) == OWNER
    assert batch.fail(REASON) == 2
    assert [r["error"] for r in events.error_rows()] == [] and events.stats().pending == 3  # given back
    assert _stored(latin1_ct, t.name, "ct_error", 1) == REASON


def _prepared_before(ct: ControlTable, t: Table) -> None:
    """What a prepare() of an earlier version left: claim columns in the table's latin1."""
    with ct.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE `{t.name}` MODIFY ct_owner VARCHAR(200) CHARACTER SET latin1 NULL, "
                             "MODIFY ct_error VARCHAR(2000) CHARACTER SET latin1 NULL")
    assert {c: s for c, s in _charsets(ct, t.name).items() if c.startswith("ct_")} == {
        "ct_owner": "latin1", "ct_error": "latin1"}


def test_a_table_prepared_before_never_refuses_an_owner_or_a_reason(latin1_ct: ControlTable) -> None:
    """Until prepare() converts its claim columns, a value they cannot store is stored escaped: a claim
    is not refused for its owner's name, and fail() gives the rows back whatever the reason says."""
    t = _latin1_table(latin1_ct, 3)
    latin1_ct.events(t.name, key="id").prepare()
    _prepared_before(latin1_ct, t)
    events = latin1_ct.events(t.name, key="id", backoff=0, max_attempts=1)
    batch = events.claim(2, owner=OWNER)
    assert batch is not None and batch.keys == [1, 2] and batch.owner == OWNER
    assert _stored(latin1_ct, t.name, "ct_owner", 1) == OWNER.encode("ascii", "backslashreplace").decode()
    assert batch.fail(REASON) == 2
    stats = events.stats()
    assert stats.claimed == 0 and stats.error == 2  # not left claimed until the lease ends
    assert [r["error"] for r in events.error_rows()] == [REASON.encode("ascii", "backslashreplace").decode()] * 2


def test_prepare_converts_the_claim_columns_of_a_table_prepared_before(latin1_ct: ControlTable) -> None:
    t = _latin1_table(latin1_ct, 3)
    events = latin1_ct.events(t.name, key="id", backoff=0)
    events.prepare()
    _prepared_before(latin1_ct, t)
    planned = [str(s.compile(dialect=latin1_ct.engine.dialect)) for s in events.prepare_statements()]
    assert len(planned) == 1, planned  # one statement: the server copies the table once
    assert "MODIFY ct_owner VARCHAR(200) CHARACTER SET utf8mb4" in planned[0], planned
    assert "MODIFY ct_error VARCHAR(2000) CHARACTER SET utf8mb4" in planned[0], planned
    done = events.prepare()
    assert any("CHARACTER SET utf8mb4" in s for s in done), done
    charsets = _charsets(latin1_ct, t.name)
    assert charsets["ct_owner"] == charsets["ct_error"] == "utf8mb4" and charsets["payload"] == "latin1"
    assert events.prepare() == []  # idempotent
    events = latin1_ct.events(t.name, key="id", backoff=0)
    batch = events.claim(1, owner=OWNER)
    assert batch is not None and batch.fail(REASON) == 1
    assert _stored(latin1_ct, t.name, "ct_owner", 1) is None
    assert _stored(latin1_ct, t.name, "ct_error", 1) == REASON
