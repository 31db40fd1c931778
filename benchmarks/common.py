"""What every scenario shares: configuration, result rows, event tables, anchors and small statistics.

Every figure is reported next to an anchor measured in the same run on the same database, and as
the ratio of the two: the machine is shared and noisy, so absolute numbers drift between runs
while ratios against a same-run anchor stay comparable.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from sqlalchemy import BigInteger, Column, MetaData, String, Table, create_engine, event, text, update
from sqlalchemy.engine import URL, Connection, Engine, make_url

from controltable import ControlTable
from controltable import dialects as ct_dialects

#: The database the benchmarks create on each server, so that other users of the server (test
#: suites running beside us) neither disturb the tables nor the transaction counters we read.
BENCH_DATABASE = "controltable_bench"

EVENT_PREFIX = "ct_"
PENDING, CLAIMED, DONE = 0, 1, 2


@dataclass
class Config:
    """Command-line settings, passed to every scenario."""

    quick: bool
    postgres_url: Optional[str]
    mysql_url: Optional[str]
    sqlite_url: Optional[str]
    out_dir: str

    def scale(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def scale_f(self, full: float, quick: float) -> float:
        return quick if self.quick else full


@dataclass
class Row:
    """One line of the results table: a figure, its same-run anchor and their ratio."""

    scenario: str
    backend: str
    figure: str
    value: float
    unit: str
    anchor: str
    anchor_value: float
    anchor_unit: str
    #: ``value / anchor_value`` for times ("x slower than the anchor"), or rate over anchor rate.
    ratio: float
    goal: Optional[str] = None
    met: Optional[bool] = None
    note: str = ""


@dataclass
class Report:
    """Collects rows and extra data; prints progress as the run goes."""

    started: float = field(default_factory=time.monotonic)
    rows: list[Row] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", flush=True)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        goal = f"  goal {row.goal}: {'met' if row.met else 'MISSED'}" if row.goal else ""
        self.log(
            f"  {row.scenario} [{row.backend}] {row.figure} = {fmt(row.value)} {row.unit}; "
            f"anchor {row.anchor} = {fmt(row.anchor_value)} {row.anchor_unit}; ratio {row.ratio:.3g}{goal}"
        )
        return row

    def to_json(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "extra": self.extra, "errors": self.errors}


def fmt(value: float) -> str:
    if value == 0 or math.isnan(value):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) by linear interpolation between order statistics."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- databases ---------------------------------------------------------------------------------------
def backend_of(url: str) -> str:
    name = make_url(url).get_backend_name()
    return {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}.get(name, name)


def bench_url(url: str, report: Report) -> str:
    """Create the benchmark's own database on the server of ``url`` and return its URL.

    Falls back to ``url`` itself (with a note) when the role may not create databases.
    SQLite URLs are returned unchanged.
    """
    parsed = make_url(url)
    backend = backend_of(url)
    if backend == "sqlite":
        return url
    try:
        engine = create_engine(parsed, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            if backend == "postgres":
                found = conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": BENCH_DATABASE})
                if not found:
                    conn.execute(text(f'CREATE DATABASE "{BENCH_DATABASE}"'))
            else:
                conn.execute(text(f"CREATE DATABASE IF NOT EXISTS `{BENCH_DATABASE}`"))
        engine.dispose()
        return parsed.set(database=BENCH_DATABASE).render_as_string(hide_password=False)
    except Exception as exc:  # no CREATEDB right: share the given database
        report.errors.append(f"could not create database {BENCH_DATABASE} on {backend}: {exc}; using {url}")
        report.log(f"  note: using {parsed.database} itself ({exc.__class__.__name__})")
        return url


def admin_engine(url: str) -> Engine:
    """An engine for set-up statements and anchors (autocommit, no controltable configuration)."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    if backend_of(url) == "sqlite":

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, record: Any) -> None:
            dbapi_conn.execute("PRAGMA busy_timeout = 60000")

    return engine


def asyncpg_dsn(url: str) -> str:
    """The plain libpq URL of a SQLAlchemy PostgreSQL URL (for asyncpg and psycopg)."""
    parsed: URL = make_url(url).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


def server_version(url: str) -> str:
    engine = admin_engine(url)
    try:
        with engine.connect() as conn:
            backend = backend_of(url)
            if backend == "postgres":
                return str(conn.scalar(text("SHOW server_version")))
            if backend == "mysql":
                return str(conn.scalar(text("SELECT VERSION()")))
            return "SQLite " + str(conn.scalar(text("SELECT sqlite_version()")))
    finally:
        engine.dispose()


# -- event tables ------------------------------------------------------------------------------------
def event_table(name: str) -> Table:
    """The user's event table before ``prepare()``: a key and a small payload."""
    return Table(
        name,
        MetaData(),
        Column("event_id", BigInteger, primary_key=True, autoincrement=False),
        Column("payload", String(64), nullable=False),
    )


def create_event_table(url: str, name: str) -> None:
    """(Re)create ``name`` and let controltable add its claim columns and claim index."""
    engine = admin_engine(url)
    table = event_table(name)
    table.drop(engine, checkfirst=True)
    table.create(engine)
    engine.dispose()
    ct = ControlTable(url)
    try:
        ct.events(name, key="event_id").prepare()
    finally:
        ct.close()


def fresh_events(url: str, name: str, pending: int) -> None:
    """``name`` as a user meets it: their rows first, then ``prepare()`` (claim columns, claim
    indexes, and the statistics refresh prepare() does itself). No ANALYZE of our own here, so the
    figures include whatever a user's first drain after prepare() would pay."""
    backend = backend_of(url)
    engine = admin_engine(url)
    table = event_table(name)
    table.drop(engine, checkfirst=True)
    table.create(engine)
    with engine.connect() as conn:
        if backend == "postgres":
            conn.execute(text(f"INSERT INTO {name} (event_id, payload) SELECT g, 'event ' || g "
                              f"FROM generate_series(1, {pending}) AS g"))
        elif backend == "mysql":
            conn.execute(text(f"INSERT INTO {name} (event_id, payload) SELECT seq, CONCAT('event ', seq) "
                              f"FROM seq_1_to_{pending}"))
        else:
            conn.execute(text(
                f"WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {pending}) "
                f"INSERT INTO {name} (event_id, payload) SELECT g, 'event ' || g FROM s"))
    engine.dispose()
    ct = ControlTable(url)
    try:
        ct.events(name, key="event_id").prepare()
    finally:
        ct.close()


def fill_events(url: str, name: str, pending: int, done: int = 0) -> None:
    """Empty ``name`` and insert ``done`` done rows (keys 1..done) then ``pending`` pending rows.

    One set-based ``INSERT ... SELECT`` over a generated series, then statistics refreshed.
    """
    total = pending + done
    backend = backend_of(url)
    engine = admin_engine(url)
    state = f"CASE WHEN g <= {done} THEN {DONE} ELSE {PENDING} END"
    cols = f"(event_id, payload, {EVENT_PREFIX}state, {EVENT_PREFIX}done_at)"
    with engine.connect() as conn:
        if backend == "postgres":
            conn.execute(text(f"TRUNCATE {name}"))
            done_at = f"CASE WHEN g <= {done} THEN extract(epoch from now())::float8 END"
            conn.execute(text(
                f"INSERT INTO {name} {cols} SELECT g, 'event ' || g, {state}, {done_at} "
                f"FROM generate_series(1, {total}) AS g"))
            conn.execute(text(f"VACUUM ANALYZE {name}"))
        elif backend == "mysql":
            conn.execute(text(f"TRUNCATE TABLE {name}"))
            done_at = f"CASE WHEN g <= {done} THEN UNIX_TIMESTAMP() END"
            conn.execute(text(
                f"INSERT INTO {name} {cols} SELECT g, CONCAT('event ', g), {state}, {done_at} "
                f"FROM (SELECT seq AS g FROM seq_1_to_{total}) AS s"))
            conn.execute(text(f"ANALYZE TABLE {name}"))
        else:
            conn.execute(text(f"DELETE FROM {name}"))
            done_at = f"CASE WHEN g <= {done} THEN CAST(strftime('%s','now') AS REAL) END"
            conn.execute(text(
                f"WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {total}) "
                f"INSERT INTO {name} {cols} SELECT g, 'event ' || g, {state}, {done_at} FROM s"))
            conn.execute(text("ANALYZE"))
    engine.dispose()


def set_based_update(url: str, name: str) -> tuple[float, int]:
    """The throughput anchor: ONE statement marking every pending row done, as ``complete()`` marks.

    Same SET list as controltable's completion (state, done_at from the database clock, lease and
    error cleared) without claiming or fencing. Returns (seconds including commit, rows).
    """
    engine = create_engine(url)
    t = Table(name, MetaData(), autoload_with=engine)
    stmt = update(t).where(t.c[f"{EVENT_PREFIX}state"] == PENDING).values({
        f"{EVENT_PREFIX}state": DONE, f"{EVENT_PREFIX}done_at": ct_dialects.db_now(),
        f"{EVENT_PREFIX}expires_at": None, f"{EVENT_PREFIX}error": None})
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))  # connected and warm before the clock starts
        conn.commit()
        start = time.perf_counter()
        with conn.begin():
            rows = conn.execute(stmt).rowcount
        elapsed = time.perf_counter() - start
    engine.dispose()
    return elapsed, int(rows)


def count_state(url: str, name: str, state: int) -> int:
    engine = admin_engine(url)
    with engine.connect() as conn:
        n = int(conn.scalar(text(f"SELECT COUNT(*) FROM {name} WHERE {EVENT_PREFIX}state = {state}")) or 0)
    engine.dispose()
    return n


# -- raw round trips (anchors) -----------------------------------------------------------------------
def raw_connection(url: str) -> Any:
    """A driver connection in autocommit mode, outside SQLAlchemy (the cheapest client there is)."""
    parsed = make_url(url)
    backend = backend_of(url)
    if backend == "postgres":
        import psycopg

        return psycopg.connect(asyncpg_dsn(url), autocommit=True)
    if backend == "mysql":
        import pymysql

        return pymysql.connect(host=parsed.host or "127.0.0.1", port=parsed.port or 3306, user=parsed.username,
                               password=parsed.password or "", database=parsed.database, autocommit=True)
    import sqlite3

    conn = sqlite3.connect(parsed.database or "", isolation_level=None, timeout=60)
    conn.execute("PRAGMA journal_mode = WAL")
    return conn


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def select_one(conn: Any) -> None:
    cur = conn.cursor()
    cur.execute("SELECT 1")
    cur.fetchall()
    cur.close()


# -- output ------------------------------------------------------------------------------------------
def write_json(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, default=str)
        fh.write("\n")


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            kb = int(fh.readline().split()[1])
        info["memory_gib"] = round(kb / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    return info


def in_conn(url: str, fn: Callable[[Connection], Any]) -> Any:
    engine = admin_engine(url)
    try:
        with engine.connect() as conn:
            return fn(conn)
    finally:
        engine.dispose()


def settle_control_tables(ct: Any) -> None:
    """Vacuum and analyze the slot tables, as autovacuum does on a production server, before measuring.

    The shared servers here run with autovacuum off: without this, the control tables keep the dead
    rows and the missing statistics of every earlier run, and a figure measures that history. (Seen
    on 2026-11-25: after some 13,000 dead request rows and never an ANALYZE, a release's history
    close chose the (namespace, resource, granted_at) index over the primary key and read every
    history row of the resource: 0.8 -> 4 ms a statement, growing with each run.)
    """
    tables = [ct.tables.request.name, ct.tables.resource.name, ct.tables.history.name]
    backend = backend_of(str(ct.db.engine.url.render_as_string(hide_password=False)))
    if backend == "sqlite":
        return
    engine = admin_engine(ct.db.engine.url.render_as_string(hide_password=False))
    try:
        with engine.connect() as conn:
            for name in tables:  # our own table names (the installation's prefix), not user input
                conn.execute(text(f"VACUUM ANALYZE {name}" if backend == "postgres" else f"ANALYZE TABLE {name}"))
    finally:
        engine.dispose()
