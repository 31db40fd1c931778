"""The PgBouncer fixture itself: it pools in the mode asked for, and refuses startup options as a stock one does."""

from __future__ import annotations

from typing import Callable

import psycopg
import pytest
from sqlalchemy.engine import make_url


def _connect(url: str, **kw: object) -> psycopg.Connection:
    u = make_url(url)
    return psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database, connect_timeout=5,
                           prepare_threshold=None, **kw)  # type: ignore[arg-type]


def test_pooler_runs_in_the_mode_asked_for(pgbouncer_url: Callable[[str], str], pool_mode: str) -> None:
    url = pgbouncer_url(pool_mode)
    with _connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchall() == [(1,)]
    admin_url = make_url(url).set(database="pgbouncer").render_as_string(hide_password=False)
    with _connect(admin_url, autocommit=True) as admin:  # pgbouncer's admin console
        config = {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}
    assert config["pool_mode"] == pool_mode


def test_startup_options_are_refused_as_by_a_stock_pooler(pgbouncer_url: Callable[[str], str]) -> None:
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        _connect(pgbouncer_url("transaction"), options="-c statement_timeout=1000").close()
