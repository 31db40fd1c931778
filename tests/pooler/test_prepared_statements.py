"""Server-side prepared statements: on for a connection that reaches the server itself, off behind a pooler.

A new psycopg connection starts without them and compares the process id it was handed at login
with ``pg_backend_pid()`` (:func:`controltable.connect.same_session`): PgBouncer hands out its own
id in either pool mode, so a pooled connection never prepares. If a pooler fools that check, the
first clash of prepared statements (SQLSTATE 42P05 / 26000) turns them off for the URL and the
transaction runs again.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import text
from support.live import postgres_url

from controltable import ControlTable, connect


def _threshold(ct: ControlTable) -> Any:
    with ct.db.engine.connect() as conn:
        return conn.connection.driver_connection.prepare_threshold  # type: ignore[union-attr]


def _prepared_on_the_connection(ct: ControlTable) -> int:
    """Run one statement seven times on one pooled connection, then count its server-side prepares."""
    with ct.db.engine.connect() as conn:
        for _ in range(7):
            conn.execute(text("SELECT count(*) FROM ct_resource WHERE namespace = :ns"), {"ns": ct.namespace})
        count = conn.scalar(text("SELECT count(*) FROM pg_prepared_statements"))
        conn.rollback()
    return int(count or 0)


@pytest.fixture
def forget_refusals() -> Iterator[None]:
    before = set(connect._PREPARES_REFUSED)
    yield
    connect._PREPARES_REFUSED.clear()
    connect._PREPARES_REFUSED.update(before)


def test_a_direct_connection_prepares_and_a_pooled_one_does_not(
    pgbouncer_url: Callable[[str], str], pool_mode: str
) -> None:
    direct = ControlTable(postgres_url("prepared statements"), namespace=f"t_{uuid.uuid4().hex[:12]}")
    pooled = ControlTable(pgbouncer_url(pool_mode), namespace=direct.namespace)
    try:
        direct.install()
        assert _threshold(direct) == connect.PREPARE_THRESHOLD
        assert _prepared_on_the_connection(direct) >= 1
        assert _threshold(pooled) is None, f"PgBouncer in {pool_mode} mode was taken for the server itself"
        direct.set_capacity("r", 1)
        for _ in range(12):  # more than the threshold, through the pooler: no clash
            pooled.acquire("r", timeout=5).release()
    finally:
        pooled.close()
        direct.close()


def test_the_url_decides_when_it_sets_prepare_threshold() -> None:
    url = postgres_url("prepared statements")
    off = ControlTable(url + ("&" if "?" in url else "?") + "prepare_threshold=off", namespace="t_prep_off")
    try:
        assert _threshold(off) is None
        assert _prepared_on_the_connection(off) == 0
    finally:
        off.close()


def test_a_pooler_that_fools_the_check_turns_prepares_off_and_the_call_runs_again(
    pgbouncer_url: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, forget_refusals: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two processes' worth of clients through one transaction pooler, each believing it is direct:
    their prepared statements meet on shared server connections (the clash issue 22 first saw).
    Every call still succeeds; the URL is refused from then on."""
    monkeypatch.setattr(connect, "same_session", lambda handed, server: True)
    url = pgbouncer_url("transaction")
    ns = f"t_{uuid.uuid4().hex[:12]}"
    cts = [ControlTable(url, namespace=ns) for _ in range(2)]
    try:
        cts[0].install()
        cts[0].set_capacity("r", 1)
        assert _threshold(cts[0]) == connect.PREPARE_THRESHOLD  # fooled, as an undetected pooler would
        for _ in range(30):
            for ct in cts:
                ct.acquire("r", timeout=5).release()
                ct.status()
        assert not connect.prepares_allowed(cts[0].db.engine.url), "no clash was met: the test proves nothing"
        assert "prepared statement met a connection pooler" in caplog.text
        for ct in cts:
            assert _threshold(ct) is None  # new connections: the refusal holds
    finally:
        for ct in cts:
            ct.close()
