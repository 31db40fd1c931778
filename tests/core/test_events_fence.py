"""Claims by key are fenced and counted; string keys go through every keyed statement (issue 33, item 6).

Live on every backend, through the path MySQL/MariaDB, SQL Server and Oracle take (a locking select,
then updates by key), so what the compiled-SQL tests check for SQL Server and Oracle also runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pytest
from sqlalchemy import Column, Integer, String, Table, insert, select

PENDING, CLAIMED, DONE = 0, 1, 2


def test_a_claim_never_takes_a_row_its_select_no_longer_describes(
        ct: Any, event_table: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The locking select stands in for one whose lock did not hold (Oracle locks a skip-locked row
    only when the cursor fetches it): it returns a done row beside a pending one. The update by
    keys repeats the select's condition, so the done row is neither claimed nor counted."""
    ev = event_table(3)
    first = ev.claim(1, owner="w")
    assert first is not None and first.keys == [1] and first.complete() == 1
    monkeypatch.setattr(ev.sql, "traits", replace(ev.sql.traits, update_returning=False))
    monkeypatch.setattr(ev.sql, "claim_select",
                        lambda size, condition, where=None: select(ev.table).where(ev.table.c.id.in_([1, 2])))
    batch = ev.claim(5, owner="late")
    assert batch is not None and batch.keys == [2], batch.keys if batch else None
    stats = ev.stats()
    assert (stats.done, stats.claimed, stats.pending) == (1, 1, 1)


@pytest.mark.parametrize("rows_per_statement", [None, 2])
def test_string_keys_through_every_keyed_statement(
        ct: Any, tables: Callable[..., Table], monkeypatch: pytest.MonkeyPatch, rows_per_statement: Any) -> None:
    """A VARCHAR key (cast to its column's type on SQL Server) through claims by key, completion,
    fail, renew, a batch rebuilt from its handle and the admin pages (``rows_per_statement``: SQL
    Server's paging by ``key > last``, run here on the live backend)."""
    t = tables(Column("code", String(20), primary_key=True), Column("n", Integer, nullable=False))
    with ct.engine.begin() as conn:
        conn.execute(insert(t), [{"code": f"k{i:02d}", "n": i} for i in range(1, 8)])
    ev = ct.events(t.name, key="code", backoff=0)
    ev.prepare()
    # The event table's statements are bound to the backend's traits: claims by key, and (with a
    # cap) SQL Server's row cap per statement.
    monkeypatch.setattr(ev.sql, "traits", replace(ev.sql.traits, update_returning=False,
                                                  rows_per_statement=rows_per_statement))
    if rows_per_statement:
        monkeypatch.setattr(ev.sql, "key_chunk", rows_per_statement)
    batch = ev.claim(3, owner="w")
    assert batch is not None and batch.keys == ["k01", "k02", "k03"]
    again = ev.batch(batch.handle())
    assert again.keys == batch.keys
    again.renew()
    assert again.complete(["k01"]) == 1
    assert again.fail("boom", ["k02", "k03"]) == 2
    assert ev.stats().done == 1 and ev.stats().pending == 6
    assert ev.reset() == 7 and ev.stats().pending == 7
    rest = ev.claim(10, owner="w")
    assert rest is not None and rest.keys == [f"k{i:02d}" for i in range(1, 8)]
    assert rest.complete() == 7
