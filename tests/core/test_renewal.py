"""Background renewal of batches and work items: long work keeps its claim."""

from __future__ import annotations

import time

from sqlalchemy import Column, Integer, MetaData, Table

from controltable import ControlTable


def test_batch_renews_in_background(ct: ControlTable, namespace: str) -> None:
    md = MetaData()
    t = Table(f"ev_{namespace[-8:]}", md, Column("id", Integer, primary_key=True))
    md.create_all(ct.engine)
    try:
        with ct.engine.begin() as conn:
            conn.execute(t.insert(), [{"id": i} for i in range(1, 4)])
        ev = ct.events(t.name, key="id")
        ev.prepare()
        batch = ev.claim(3, owner="slow", lease=0.6)
        assert batch is not None
        batch.start_renewing()
        time.sleep(1.6)  # well past the original lease: only renewal keeps the rows
        assert ev.claim(3, owner="thief") is None
        batch.check()
        assert batch.complete() == 3
        assert batch._renewer is None
    finally:
        md.drop_all(ct.engine)


def test_work_item_renews_in_background(ct: ControlTable) -> None:
    wl = ct.worklist("renew")
    wl.populate([{"n": 1}])
    item = wl.allocate("slow", lease=0.6)
    assert item is not None
    item.start_renewing()
    time.sleep(1.6)
    assert wl.allocate("thief", lease=0.6) is None
    item.complete()
    assert wl.status().finished
