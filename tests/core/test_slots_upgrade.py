"""``install()`` upgrades control tables created by schema version 1, in place, with live holders and waiters."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
import schema_v1
import schema_v2
import sqlalchemy.exc
from sqlalchemy import create_engine, insert, inspect, select

from controltable import ControlTable, ControlTableError, migrations
from controltable.schema import SCHEMA_VERSION, build_schema


@pytest.fixture
def v1_prefix(backend_url: str) -> Iterator[str]:
    prefix = f"v1{uuid.uuid4().hex[:8]}_"
    yield prefix
    engine = create_engine(backend_url)
    schema_v1.build_schema(prefix).metadata.drop_all(engine)
    build_schema(prefix).metadata.drop_all(engine)  # what the upgrade added
    engine.dispose()


def make_v1_installation(url: str, prefix: str, namespace: str) -> None:
    """What a v1 deployment has: v1 DDL, version 1 recorded, a holder and two waiters in a queue."""
    tables = schema_v1.build_schema(prefix)
    engine = create_engine(url)
    tables.metadata.create_all(engine)
    now = 1_800_000_000.0  # far in the future of the database clock: these leases stay live
    with engine.begin() as conn:
        conn.execute(insert(tables.meta).values(key="schema_version", value="1"))
        conn.execute(insert(tables.resource).values(namespace=namespace, name="w", capacity=1, last_token=7,
                                                    created_at=now))
        common = dict(namespace=namespace, resource="w", slots=1, mode="exclusive", lease_seconds=300.0,
                      enqueued_at=now)
        conn.execute(insert(tables.request).values(holder="old-holder", request_key="k1", state="granted", token=7,
                                                   granted_at=now, expires_at=now + 300, **common))
        conn.execute(insert(tables.request).values(holder="old-waiter-1", request_key="k2", state="waiting",
                                                   expires_at=now + 300, **common))
        conn.execute(insert(tables.request).values(holder="old-waiter-2", request_key="k3", state="waiting",
                                                   expires_at=now + 300, **common))
        conn.execute(insert(tables.worklist).values(namespace=namespace, name="wl", last_token=0, created_at=now))
    engine.dispose()


def test_install_upgrades_v1_tables_in_place(backend_url: str, namespace: str, v1_prefix: str) -> None:
    make_v1_installation(backend_url, v1_prefix, namespace)
    ct = ControlTable(backend_url, namespace=namespace, prefix=v1_prefix)
    try:
        assert ct.installed_version() == 1
        assert ct.install() == SCHEMA_VERSION
        assert ct.installed_version() == SCHEMA_VERSION
        assert ct.install() == SCHEMA_VERSION  # idempotent
        cols = {c["name"] for c in inspect(ct.engine).get_columns(f"{v1_prefix}request")}
        assert {"ticket", "attempt", "pickup_seconds"} <= cols
        indexes = {i["name"] for i in inspect(ct.engine).get_indexes(f"{v1_prefix}request")}
        assert f"{v1_prefix}request_order_ix" in indexes
        assert f"{v1_prefix}request_queue_ix" not in indexes and f"{v1_prefix}request_state_ix" not in indexes
        r, q = ct.tables.resource, ct.tables.request
        with ct.engine.connect() as conn:
            tickets = dict(conn.execute(select(q.c.holder, q.c.ticket).where(q.c.namespace == namespace)).all())
            last_ticket = conn.scalar(select(r.c.last_ticket).where(r.c.namespace == namespace))
        assert tickets["old-holder"] < tickets["old-waiter-1"] < tickets["old-waiter-2"] == last_ticket

        # The v1 holder keeps its lease and token; the v1 queue order holds; new requests queue behind.
        lease = ct.find_lease("w", "old-holder")
        assert lease is not None and lease.token == 7
        assert ct.try_acquire("w", holder="new", mode="exclusive") is None
        info = ct.wait_info("w", "new")
        assert info is not None and info.position == 3 and info.ahead == ["old-holder", "old-waiter-1",
                                                                            "old-waiter-2"]
        lease.release()
        assert ct.try_acquire("w", holder="new", mode="exclusive") is None
        first = ct.try_acquire("w", holder="old-waiter-1", mode="exclusive")  # granted on its behalf, picked up
        assert first is not None and first.token == 8
        assert ct.release("w", "old-waiter-2") == 1  # withdrawn before its turn
        first.release()
        new = ct.try_acquire("w", holder="new", mode="exclusive")
        assert new is not None and new.token == 9
        new.release()

        # Work items get ids on the upgraded table too.
        wl = ct.worklist("wl")
        wl.populate(["a"], order=1)
        item = wl.allocate(owner="me")
        assert item is not None
    finally:
        ct.close()


def install_concurrently(backend_url: str, namespace: str, prefix: str, installs: int = 3) -> list[object]:
    """What ``installs`` concurrent ``install()`` calls on one installation return (or raise), one per thread."""
    import threading

    results: list[object] = []

    def install() -> None:
        ct = ControlTable(backend_url, namespace=namespace, prefix=prefix)
        try:
            results.append(ct.install())
        except Exception as exc:  # pragma: no cover - reported by the caller's assertion
            results.append(exc)
        finally:
            ct.close()

    threads = [threading.Thread(target=install) for _ in range(installs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_concurrent_installs_of_a_v1_installation(backend_url: str, namespace: str, v1_prefix: str) -> None:
    make_v1_installation(backend_url, v1_prefix, namespace)
    assert install_concurrently(backend_url, namespace, v1_prefix) == [SCHEMA_VERSION] * 3
    ct = ControlTable(backend_url, namespace=namespace, prefix=v1_prefix)
    assert ct.installed_version() == SCHEMA_VERSION
    ct.close()


@pytest.fixture
def v2_prefix(backend_url: str) -> Iterator[str]:
    prefix = f"v2{uuid.uuid4().hex[:8]}_"
    yield prefix
    engine = create_engine(backend_url)
    build_schema(prefix).metadata.drop_all(engine)
    schema_v2.build_schema(prefix).metadata.drop_all(engine)
    engine.dispose()


def make_v2_installation(url: str, prefix: str, namespace: str) -> None:
    """What a v2 deployment has: v2 DDL, version 2 recorded, a shared holder and two waiters in ticket order."""
    tables = schema_v2.build_schema(prefix)
    engine = create_engine(url)
    tables.metadata.create_all(engine)
    now = 1_800_000_000.0  # far in the future of the database clock: these leases stay live
    with engine.begin() as conn:
        conn.execute(insert(tables.meta).values(key="schema_version", value="2"))
        conn.execute(insert(tables.resource).values(namespace=namespace, name="w", capacity=2, last_token=4,
                                                    last_ticket=6, created_at=now))
        common = dict(namespace=namespace, resource="w", lease_seconds=300.0, enqueued_at=now, expires_at=now + 300)
        conn.execute(insert(tables.request).values(holder="old-holder", request_key="k1", state="granted", token=4,
                                                   granted_at=now, slots=1, mode="shared", ticket=4, **common))
        conn.execute(insert(tables.request).values(holder="old-waiter-1", request_key="k2", state="waiting",
                                                   slots=2, mode="shared", ticket=5, **common))
        conn.execute(insert(tables.request).values(holder="old-waiter-2", request_key="k3", state="waiting",
                                                   slots=1, mode="shared", ticket=6, **common))
    engine.dispose()


def test_install_upgrades_v2_tables_in_place(backend_url: str, namespace: str, v2_prefix: str) -> None:
    make_v2_installation(backend_url, v2_prefix, namespace)
    ct = ControlTable(backend_url, namespace=namespace, prefix=v2_prefix)
    try:
        assert ct.installed_version() == 2
        assert ct.install() == SCHEMA_VERSION
        assert ct.install() == SCHEMA_VERSION  # idempotent
        cols = {c["name"] for c in inspect(ct.engine).get_columns(f"{v2_prefix}request")}
        assert {"priority", "queue_key"} <= cols
        rcols = {c["name"] for c in inspect(ct.engine).get_columns(f"{v2_prefix}resource")}
        assert {"rate_count", "rate_per", "aging"} <= rcols
        indexes = {i["name"] for i in inspect(ct.engine).get_indexes(f"{v2_prefix}request")}
        assert f"{v2_prefix}request_order_ix" in indexes and f"{v2_prefix}request_state_ix" not in indexes
        assert inspect(ct.engine).has_table(f"{v2_prefix}grant_history")
        # v5: the work-item index in allocation order replaces the one without priority and id.
        item_ix = {i["name"]: i["column_names"] for i in inspect(ct.engine).get_indexes(f"{v2_prefix}work_item")}
        assert f"{v2_prefix}work_item_ix" not in item_ix, item_ix
        assert item_ix[f"{v2_prefix}work_item_next_ix"][-2:] == ["priority", "id"], item_ix

        # The v2 holder and queue survive: priority 0, ticket order; the 2-slot head is not overtaken.
        (st,) = ct.status(["w"])
        assert [e.holder for e in st.waiters] == ["old-waiter-1", "old-waiter-2"]
        assert st.waiters[1].ahead == ["old-holder", "old-waiter-1"] and st.waiters[0].priority == 0
        assert st.rate is None and st.aging is None
        assert ct.try_acquire("w", holder="old-waiter-2") is None  # 1 slot free, but the head needs 2
        # A newcomer with a higher priority outranks the old queue and fits beside the v2 holder.
        urgent = ct.try_acquire("w", holder="urgent", priority=5)
        assert urgent is not None and urgent.token == 5
        holder = ct.find_lease("w", "old-holder")
        assert holder is not None and holder.token == 4
        holder.release()  # a v2 grant: no history row to close, which is fine
        info = ct.wait_info("w", "old-waiter-1")
        assert info is not None and info.ahead == ["urgent"]
        urgent.release()
        first = ct.try_acquire("w", holder="old-waiter-1", slots=2)
        assert first is not None and first.token == 6
        first.release()
        second = ct.try_acquire("w", holder="old-waiter-2")
        assert second is not None and second.token == 7
        second.release()
        records = ct.history("w")
        assert [(r.holder, r.outcome) for r in records] == [
            ("old-waiter-2", "released"), ("old-waiter-1", "released"), ("urgent", "released")]
        assert records[-1].priority == 5
    finally:
        ct.close()


def test_concurrent_installs_of_a_v2_installation(backend_url: str, namespace: str, v2_prefix: str) -> None:
    make_v2_installation(backend_url, v2_prefix, namespace)
    assert install_concurrently(backend_url, namespace, v2_prefix) == [SCHEMA_VERSION] * 3
    ct = ControlTable(backend_url, namespace=namespace, prefix=v2_prefix)
    assert ct.installed_version() == SCHEMA_VERSION
    assert [e.holder for e in ct.status(["w"])[0].waiters] == ["old-waiter-1", "old-waiter-2"]
    ct.close()


def test_a_failing_upgrade_step_is_a_controltable_error_and_a_rerun_completes(
    backend_url: str, namespace: str, v2_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Upgrade steps run through the database layer: a driver error in one surfaces as a
    controltable error naming the database (not a bare driver exception), the version stays
    where it was, and the next ``install()`` completes the upgrade (every step is idempotent)."""
    make_v2_installation(backend_url, v2_prefix, namespace)
    ct = ControlTable(backend_url, namespace=namespace, prefix=v2_prefix)
    try:
        real = migrations.add_column_sql
        # The first ADD COLUMN names a table that does not exist: the server rejects it.
        missing = build_schema(f"missing{uuid.uuid4().hex[:6]}_")

        def broken(table: Any, column: Any, dialect: Any) -> Any:
            twin = getattr(missing, table.name[len(v2_prefix):])
            return real(twin, twin.c[column.name], dialect)

        monkeypatch.setattr(migrations, "add_column_sql", broken)
        with pytest.raises(ControlTableError) as caught:
            ct.install()
        assert not isinstance(caught.value, sqlalchemy.exc.SQLAlchemyError)
        assert isinstance(caught.value.__cause__, sqlalchemy.exc.DBAPIError)  # the driver's error, kept as cause
        assert ct.installed_version() == 2
        monkeypatch.setattr(migrations, "add_column_sql", real)
        assert ct.install() == SCHEMA_VERSION
        assert ct.installed_version() == SCHEMA_VERSION
    finally:
        ct.close()


def test_an_upgrade_interrupted_between_the_history_table_and_its_index_is_completed(
    backend_url: str, namespace: str, v2_prefix: str,
) -> None:
    """DDL commits itself on MySQL and Oracle: an upgrade stopped after CREATE TABLE of the grant
    history but before its time index leaves the table without it. The next ``install()`` sees the
    table (so ``checkfirst`` skips it, index and all) and must still create the index."""
    make_v2_installation(backend_url, v2_prefix, namespace)
    history = build_schema(v2_prefix).history
    engine = create_engine(backend_url)
    try:
        with engine.begin() as conn:  # what the interrupted step left: the table alone
            history.create(conn)
            for index in history.indexes:
                index.drop(conn)
        assert not inspect(engine).get_indexes(history.name)
    finally:
        engine.dispose()
    ct = ControlTable(backend_url, namespace=namespace, prefix=v2_prefix)
    try:
        assert ct.install() == SCHEMA_VERSION
        names = {str(i["name"]).lower() for i in inspect(ct.engine).get_indexes(history.name)}
        assert {str(i.name).lower() for i in history.indexes} <= names
    finally:
        ct.close()
