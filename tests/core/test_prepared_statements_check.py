"""The decision behind server-side prepared statements (:func:`controltable.connect.same_session`), without a server."""

from __future__ import annotations

from sqlalchemy.engine import make_url

from controltable import connect


def test_only_the_server_process_own_id_counts_as_direct() -> None:
    assert connect.same_session(4242, 4242)
    assert not connect.same_session(-953260797, 8897)  # PgBouncer's random cancel key against the server's pid
    assert not connect.same_session(None, 8897)  # the driver did not say: the safe side
    assert not connect.same_session(4242, None)


def test_a_refused_url_stays_refused_whatever_its_password() -> None:
    before = set(connect._PREPARES_REFUSED)
    try:
        url = make_url("postgresql+psycopg://u:secret@pooler.example:6432/db")
        assert connect.prepares_allowed(url)
        assert connect.refuse_prepares(url)
        assert not connect.refuse_prepares(url)  # once
        assert not connect.prepares_allowed(make_url("postgresql+psycopg://u:other@pooler.example:6432/db"))
        assert all("secret" not in key for key in connect._PREPARES_REFUSED)
    finally:
        connect._PREPARES_REFUSED.clear()
        connect._PREPARES_REFUSED.update(before)


def test_a_plan_prepared_before_a_column_changed_type_is_run_again_unprepared() -> None:
    """PostgreSQL refuses a prepared statement whose result changed type since it was prepared (a
    schema upgrade meanwhile): the transaction runs again on connections without that plan."""
    import uuid

    from sqlalchemy import create_engine, text
    from support.live import postgres_url

    from controltable.db import Database

    url = postgres_url("a stale prepared plan")
    table = f"t_stale_{uuid.uuid4().hex[:8]}"  # generated here, not user input
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (a INTEGER)"))
        conn.execute(text(f"INSERT INTO {table} VALUES (1)"))
    database = Database(url)
    calls = []

    def read(conn: object) -> list[object]:
        calls.append(1)
        return list(conn.execute(text(f"SELECT a FROM {table}")).scalars())  # type: ignore[attr-defined]

    try:
        with database.engine.connect() as conn:
            assert conn.connection.driver_connection.prepare_threshold == connect.PREPARE_THRESHOLD  # type: ignore[union-attr]
        for _ in range(8):  # prepared on the pooled connection from the 6th run
            assert database.run(read) == [1]
        with admin.begin() as conn:
            conn.execute(text(f"ALTER TABLE {table} ALTER COLUMN a TYPE BIGINT"))
        calls.clear()
        assert database.run(read) == [1]
        assert len(calls) == 2, "the stale plan was not met: the test proves nothing"
    finally:
        database.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP TABLE {table}"))
        admin.dispose()
