"""``controltable doctor``: whether this setup keeps controltable's promises, one finding per check.

The promises (FIFO grants, fencing tokens, leases on the database clock, pushes within
milliseconds) hold on one primary reached directly. What users put between themselves and that
primary (a connection pooler, asynchronous replication, a Galera cluster, a read-only replica)
weakens some of them silently; doctor says which, and what to set.

The module is cut like the engines: the probe statements are pure builders (constants and
SQLAlchemy Core over the control tables, nothing formatted from a user's value), the decisions are
pure functions over what the probes read (unit-tested on fake rows), and :func:`run_checks` runs
the probes. A check that cannot run (a privilege missing, a view absent) becomes a finding of its
own, never an exception: doctor is what a user runs when something is wrong.
"""

from __future__ import annotations

import functools
import operator
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

from sqlalchemy import Table, delete, false, insert, literal, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import TextClause

from .db import Database
from .dialects import SUPPORTED_DIALECTS, server_label, traits
from .errors import ControlTableError
from .schema import SCHEMA_VERSION, ControlSchema
from .wakeups import Wakeups

if TYPE_CHECKING:
    from .events import EventTable

#: Finding levels, mildest first. ``ok``: as it should be; ``info``: worth knowing, nothing to do;
#: ``warning``: a promise is weakened (exit 1); ``error``: a promise is broken or work fails (exit 2).
LEVELS = ("ok", "info", "warning", "error")
NOTHING = "nothing to do"
_SET_LISTEN_URL = ("set listen_url (ControlTable(url, listen_url=...), CONTROLTABLE_LISTEN_URL or --listen-url) to a "
                   "direct URL of the PostgreSQL server")


class Checked(Protocol):
    """What the checks read of the ``ControlTable`` they check (it passes itself and its wake-ups).

    A protocol, not the class: ``control`` imports this module for ``ControlTable.doctor()``, so
    this one names only what it reads, and the import goes one way.
    """

    @property
    def db(self) -> Database: ...

    @property
    def tables(self) -> ControlSchema: ...

    def installed_version(self) -> Optional[int]: ...

    def now(self) -> float: ...


@dataclass(frozen=True)
class Finding:
    """One check's result: what was checked, how serious, what was seen, and what to do."""

    check: str
    level: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level, "message": self.message, "fix": self.fix}


def worst(findings: Sequence[Finding]) -> str:
    """The most serious level among ``findings`` (``ok`` for none)."""
    return max((f.level for f in findings), key=LEVELS.index, default="ok")


def exit_code(findings: Sequence[Finding]) -> int:
    """The CLI's exit code: 0 all good (or informational), 1 a warning, 2 an error."""
    return {"warning": 1, "error": 2}.get(worst(findings), 0)


# -- statements (pure builders: constants with bound parameters) --------------------------------------------
#: The server's version string, per dialect (its ``Traits.version_sql``).
VERSION = {name: text(sql) for name in SUPPORTED_DIALECTS if (sql := traits(name).version_sql)}
#: Whether this server is a standby (PostgreSQL) or read-only (MariaDB/MySQL) (``Traits.read_only_sql``).
READ_ONLY = {name: text(sql) for name in SUPPORTED_DIALECTS if (sql := traits(name).read_only_sql)}
PG_BACKEND = text("SELECT pg_backend_pid(), inet_server_port()")
PG_SET_PROBE = text("SELECT set_config('controltable.doctor_probe', :value, false)")
PG_READ_PROBE = text("SELECT current_setting('controltable.doctor_probe', true)")
PG_SYNC_SETTINGS = text("SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')")
PG_REPLICAS = text("SELECT application_name, state, sync_state FROM pg_stat_replication")
#: Column statistics (``pg_stats``) exist once ANALYZE ran, and are visible when its transaction
#: commits (``pg_stat_user_tables.last_analyze`` reaches other sessions up to a second later, and
#: ``pg_class.reltuples`` is also set by CREATE INDEX, which gathers no column statistics).
PG_TABLE_STATS = text(
    "SELECT c.reltuples, s.n_mod_since_analyze, "
    "EXISTS (SELECT 1 FROM pg_stats p WHERE p.schemaname = n.nspname AND p.tablename = c.relname) "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = to_regclass(:name)")
MYSQL_TABLE_ROWS = text(
    "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) "
    "AND TABLE_NAME = :name")
SQLITE_TABLE_STATS = text("SELECT COUNT(*) FROM sqlite_master WHERE name = 'sqlite_stat1'")
SQLITE_TABLE_ROWS = text("SELECT COUNT(*) FROM sqlite_stat1 WHERE tbl = :name")
GALERA_VARIABLES = text("SELECT @@GLOBAL.wsrep_on, @@SESSION.wsrep_sync_wait")
GALERA_STATUS = text(
    "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
    "WHERE VARIABLE_NAME IN ('WSREP_CLUSTER_SIZE', 'WSREP_LOCAL_STATE_COMMENT', 'WSREP_READY')")
MYSQL_HAS_WSREP = text("SELECT COUNT(*) FROM information_schema.GLOBAL_VARIABLES WHERE VARIABLE_NAME = 'WSREP_ON'")


def privilege_probes(table: Table) -> dict[str, Any]:
    """One statement per privilege the engine needs on ``table``, each touching no row (``WHERE false``).

    The server checks privileges when it plans a statement, whether or not a row matches, so
    running these proves the rights without changing anything.
    """
    cols = list(table.columns)
    first = cols[0]
    return {
        "SELECT": select(literal(1)).select_from(table).where(false()),
        "INSERT": insert(table).from_select([c.name for c in cols], select(*cols).where(false())),
        "UPDATE": update(table).where(false()).values({first.name: first}),
        "DELETE": delete(table).where(false()),
    }


# -- decisions (pure) -----------------------------------------------------------------------------------------
def server_finding(dialect: str, version: str) -> Finding:
    return Finding("server", "ok", f"{server_label(dialect, version)} {version}", NOTHING)


@dataclass(frozen=True)
class PoolerProbe:
    """What the PostgreSQL pooler probe read: backend pids and the session setting across transactions."""

    url_port: Optional[int]
    server_port: Optional[int]
    #: Backend pid of client A's first transaction, of client B's transaction (while A is idle), and
    #: of A's second transaction (while B holds its transaction open).
    pid_first: int
    pid_other: int
    pid_second: int
    #: Whether a session setting made in A's first transaction was seen in its second.
    setting_kept: bool


def pooler_finding(probe: PoolerProbe, push_active: bool, listen_url: bool) -> Finding:
    """A pooler in transaction mode, one in session mode (or another proxy), or a direct connection.

    Two client sessions that meet the same backend, or one session whose backend or settings change
    between transactions, can only be a pooler handing server connections out per transaction.
    """
    shared = probe.pid_other == probe.pid_first
    moved = probe.pid_second != probe.pid_first or not probe.setting_kept
    if shared or moved:
        seen = []
        if shared:
            seen.append("two client connections were served by the same server backend")
        if probe.pid_second != probe.pid_first:
            seen.append("one client connection moved to another backend between transactions")
        if not probe.setting_kept:
            seen.append("a session setting was lost between transactions")
        message = ("a connection pooler in transaction mode (PgBouncer, RDS Proxy, Supavisor, pgcat): "
                   + "; ".join(seen) + ". controltable keeps no session state, so work goes through it")
        if push_active and listen_url:
            return Finding("pooler", "info", message + "; push wake-ups go through listen_url", NOTHING)
        return Finding("pooler", "info", message + "; LISTEN does not survive it",
                       _SET_LISTEN_URL + ", for push wake-ups")
    if probe.server_port is not None and probe.url_port is not None and probe.server_port != probe.url_port:
        message = (f"a proxy or a pooler in session mode: the URL's port is {probe.url_port}, the server's "
                   f"{probe.server_port}; each client keeps its server connection, so sessions behave as direct")
        if push_active:
            return Finding("pooler", "info", message + "; push wake-ups go through listen_url", NOTHING)
        # The listener cannot tell this from a transaction pooler before it LISTENs, and LISTEN through
        # one breaks it: it stays off this path, so pushes need listen_url here too.
        return Finding("pooler", "info", message + "; the listener does not LISTEN through it",
                       _SET_LISTEN_URL + ", for push wake-ups")
    return Finding("pooler", "ok", "no connection pooler in transaction mode between this client and the server",
                   NOTHING)


def push_finding(state: str, detail: str, round_trip_ms: Optional[float], listen_url: bool = False) -> Finding:
    """From a :class:`~controltable.wakeups.PushStatus`: ``detail``'s first sentence is the finding."""
    if state == "unavailable":
        return Finding("push", "info", "push wake-ups exist on PostgreSQL only: waiters poll (tens of ms per handoff)",
                       NOTHING)
    if state == "active" and round_trip_ms is not None:
        return Finding("push", "ok", f"push wake-ups delivered: round trip {round_trip_ms:.1f} ms", NOTHING)
    if state == "active":
        return Finding("push", "warning", "the listener is connected but a notification sent now did not arrive",
                       "check that listen_url points at the same server as the URL (not a replica)")
    seen = detail.split(". ", 1)[0].rstrip(".") + "."
    if listen_url:
        return Finding("push", "warning", seen, "point listen_url at the PostgreSQL server itself (the same server "
                       "the URL reaches, not a pooler or a replica); until then waiters poll")
    return Finding("push", "warning", seen, _SET_LISTEN_URL + "; until then waiters poll")


def role_finding(dialect: str, read_only: Optional[bool]) -> Finding:
    if read_only is None:
        return Finding("role", "ok", "a single database file: no replicas", NOTHING)
    if traits(dialect).standby and read_only:
        return Finding("role", "error", "this server is a standby (in recovery): every write fails",
                       "point the URL at the primary, e.g. with several hosts and target_session_attrs=read-write")
    if read_only:
        return Finding("role", "error", "this server is read-only (read_only=ON, a replica): writes fail",
                       "point the URL at the primary (the node with read_only=OFF)")
    return Finding("role", "ok", "primary (accepts writes)", NOTHING)


def replication_finding(synchronous_commit: str, standby_names: str,
                        replicas: Sequence[tuple[Any, Any, Any]], in_recovery: bool) -> Finding:
    """Whether a commit on this PostgreSQL waits for a standby, so a failover cannot lose a grant."""
    if in_recovery:
        return Finding("replication", "info", "this is a standby; replication is the primary's to check",
                       "run doctor against the primary")
    sync_rows = [r for r in replicas if str(r[2]) in ("sync", "quorum")]
    waits = synchronous_commit in ("on", "remote_apply", "remote_write") and standby_names.strip() != ""
    if not replicas:
        if standby_names.strip() and synchronous_commit not in ("off", "local"):
            return Finding("replication", "error",
                           f"synchronous_standby_names = '{standby_names}' but no standby is connected: "
                           "every commit waits (until the statement timeout)",
                           "start the standby, or clear synchronous_standby_names while it is away")
        return Finding("replication", "info",
                       "no streaming standby is connected (or pg_stat_replication is not visible to this user)",
                       "with a standby for failover, make commits wait for it: synchronous_standby_names and "
                       "synchronous_commit = on (managed services: choose their synchronous mode)")
    names = ", ".join(str(r[0]) for r in replicas)
    if waits and sync_rows:
        level = "ok" if synchronous_commit in ("on", "remote_apply") else "info"
        return Finding("replication", level,
                       f"commits wait for a synchronous standby ({', '.join(str(r[0]) for r in sync_rows)}; "
                       f"synchronous_commit = {synchronous_commit})",
                       NOTHING if level == "ok" else "synchronous_commit = on also survives a crash of the standby")
    return Finding("replication", "warning",
                   f"replication is asynchronous (standbys: {names}; synchronous_commit = {synchronous_commit}, "
                   f"synchronous_standby_names = '{standby_names}'): a failover can lose the last committed grants",
                   "on the primary set synchronous_standby_names = 'ANY 1 (<standby names>)' and "
                   "synchronous_commit = on (or remote_apply), then SELECT pg_reload_conf()")


def skew_finding(skew_seconds: float) -> Finding:
    where = "ahead of" if skew_seconds > 0 else "behind"
    message = f"the database clock is {abs(skew_seconds) * 1000:.0f} ms {where} this client's"
    if abs(skew_seconds) < 1.0:
        return Finding("clock", "ok", message + " (leases use the database clock)", NOTHING)
    return Finding("clock", "info", message + "; leases and times use the database clock, so this only shows in "
                   "the client's own logs", "keep NTP running on clients and servers")


def isolation_finding(dialect: str, level: str) -> Finding:
    expected = traits(dialect).isolation_level
    if level.upper().replace("-", " ").replace("_", " ") == expected:
        return Finding("isolation", "ok", f"transactions run at {expected}", NOTHING)
    return Finding("isolation", "warning", f"transactions run at {level}, expected {expected}",
                   "pass a URL (not your own engine) or let controltable set the isolation level per connection")


def version_finding(installed: Optional[int], package: int = SCHEMA_VERSION) -> Finding:
    if installed is None:
        return Finding("control tables", "error", "the control tables are not installed",
                       "run `controltable init` (or ControlTable.install()) with DDL rights")
    if installed > package:
        return Finding("control tables", "error",
                       f"schema version {installed} is newer than this controltable's ({package})",
                       "upgrade the controltable package")
    if installed < package:
        return Finding("control tables", "warning",
                       f"schema version {installed}; {package - installed} upgrade step(s) pending to {package}",
                       "run `controltable init` (or ControlTable.install()); each step is idempotent")
    return Finding("control tables", "ok", f"schema version {installed}, current", NOTHING)


def privileges_finding(check: str, label: str, denied: dict[str, str]) -> Finding:
    """``denied``: what was refused (e.g. ``"UPDATE on ct_resource"``) and the server's message."""
    if not denied:
        return Finding(check, "ok", f"SELECT, INSERT, UPDATE and DELETE on {label} granted", NOTHING)
    return Finding(check, "error", f"denied: {', '.join(sorted(denied))}",
                   "GRANT SELECT, INSERT, UPDATE, DELETE on those tables to the URL's user")


def statistics_finding(label: str, dialect: str, rows: Optional[int], analyzed: Optional[bool],
                       modified: Optional[int], actual: int) -> Finding:
    """Whether the planner's statistics of an event table are there and roughly current."""
    check = f"event table {label}"
    fix = f"ANALYZE the table ({traits(dialect).analyze_keyword} {label})"
    if analyzed is False and actual > 0:
        return Finding(check, "warning", f"{actual} rows but never analyzed: claims may not use the claim index",
                       fix)
    if modified is not None and actual > 1000 and modified > max(actual, rows or 0):
        return Finding(check, "warning", f"{modified} rows changed since the last ANALYZE of {actual}", fix)
    if rows is not None and actual > 1000 and (rows * 10 < actual or rows > actual * 10):
        return Finding(check, "warning", f"the statistics estimate {rows} rows, the table has {actual}", fix)
    return Finding(check, "ok", f"claim columns and indexes present; statistics current ({actual} rows)", NOTHING)


def galera_finding(wsrep_on: Optional[bool], sync_wait: Optional[int], status: dict[str, str]) -> Finding:
    """What controltable needs of a Galera node: synced, in a quorum of 3+, causal reads of lease state."""
    if not wsrep_on:
        return Finding("galera", "ok", "not a Galera cluster node", NOTHING)
    size = int(status.get("WSREP_CLUSTER_SIZE", "0") or 0)
    state = status.get("WSREP_LOCAL_STATE_COMMENT", "?")
    ready = status.get("WSREP_READY", "OFF").upper() == "ON"
    if not ready or state != "Synced":
        return Finding("galera", "error", f"this node is not ready (wsrep_ready={status.get('WSREP_READY')}, "
                       f"state {state}): it refuses or delays work",
                       "connect to a Synced node of the primary component")
    if not sync_wait or not (sync_wait & 1):
        return Finding("galera", "warning",
                       f"wsrep_sync_wait = {sync_wait or 0}: a read of lease state on this node may miss commits "
                       "made on another node", "SET GLOBAL wsrep_sync_wait = 1 (causal reads) on every node")
    if size < 3:
        return Finding("galera", "warning", f"a cluster of {size}: losing one node loses the quorum",
                       "run 3 nodes (or 2 and garbd)")
    return Finding("galera", "ok", f"Galera cluster of {size}, node Synced, wsrep_sync_wait = {sync_wait}",
                   "write through one node at a time where you can (fewer certification failures; "
                   "controltable retries them)")


# -- running the checks ----------------------------------------------------------------------------------------
def run_checks(ct: Checked, wakeups: Wakeups, *, event_tables: Sequence[EventTable] = ()) -> list[Finding]:
    """Every check against ``ct``'s database, in a stable order; each failure is a finding of its own.

    ``wakeups`` is ``ct``'s push listener: the pooler and push checks probe it and read its listen URL.
    A database that cannot be reached at all raises :class:`DatabaseUnavailableError` (the CLI's exit 4).
    """
    db = ct.db
    dialect = db.dialect_name
    # Unreachable is one answer, not a dozen findings that each wait for the connect timeout.
    db.ping()
    findings: list[Finding] = []

    def check(name: str, fn: Callable[[], list[Finding]]) -> None:
        try:
            findings.extend(fn())
        except ControlTableError as exc:
            findings.append(_unchecked(name, exc))

    def one(stmt: TextClause, **params: Any) -> Any:
        return db.run(lambda conn: conn.execute(stmt, params).first())

    if dialect in VERSION:
        check("server", lambda: [server_finding(dialect, str(one(VERSION[dialect])[0]))])
    else:  # SQL Server, Oracle: what the dialect read when it connected
        known = db.engine.dialect.server_version_info or ()
        findings.append(server_finding(dialect, ".".join(str(part) for part in known) or "(version unknown)"))
    if traits(dialect).listen_notify:
        check("pooler", lambda: [pooler_finding(_pooler_probe(ct), wakeups.active, wakeups.listen_url is not None)])
    check("push", lambda: [_push(wakeups)])
    read_only: Optional[bool] = None
    if dialect in READ_ONLY:
        try:
            read_only = bool(int(one(READ_ONLY[dialect])[0]))
            findings.append(role_finding(dialect, read_only))
        except ControlTableError as exc:
            findings.append(_unchecked("role", exc))
    elif traits(dialect).file_database:
        findings.append(role_finding(dialect, None))
    if traits(dialect).standby:
        check("replication", lambda: [_replication(ct, bool(read_only))])
    check("clock", lambda: [_skew(ct)])
    check("isolation", lambda: [isolation_finding(dialect, str(db.run(lambda c: c.get_isolation_level())))])
    installed: Optional[int] = None
    try:
        installed = ct.installed_version()
        findings.append(version_finding(installed))
    except ControlTableError as exc:
        findings.append(_unchecked("control tables", exc))
    if installed is not None:
        def control_privileges() -> list[Finding]:
            denied = {f"{p} on {t.name}": why for t in ct.tables.tables for p, why in _denied(ct, t).items()}
            return [privileges_finding("privileges", "the control tables", denied)]

        check("privileges", control_privileges)
    if traits(dialect).galera:
        check("galera", lambda: [_galera(ct)])
    for ev in event_tables:
        label = f"{ev.table_schema}.{ev.name}" if ev.table_schema else ev.name
        check(f"event table {label}", functools.partial(_event_table, ct, ev, label))
    return findings


def _unchecked(check: str, exc: ControlTableError) -> Finding:
    """A check that could not run is an error of its own: doctor needs what the engine needs, and
    read access to the server's views (``pg_stat_replication``, ``information_schema``)."""
    return Finding(check, "error", f"could not check: {exc}", "fix what the message names, then run doctor again")


def _pooler_probe(ct: Checked) -> PoolerProbe:
    """Two client connections and three transactions; see :func:`pooler_finding` for what they prove."""
    engine = ct.db.engine
    value = uuid.uuid4().hex
    with ct.db.translating():
        a = engine.connect()
        b = engine.connect()
        try:
            with a.begin():
                pid_first, server_port = a.execute(PG_BACKEND).one()
                a.execute(PG_SET_PROBE, {"value": value})
            with b.begin():
                pid_other = b.execute(PG_BACKEND).one()[0]
                with a.begin():  # while B holds a server connection
                    pid_second = a.execute(PG_BACKEND).one()[0]
                    kept = a.scalar(PG_READ_PROBE) == value
        finally:
            for conn in (a, b):  # the session setting must not outlive the probe on a pooled connection
                conn.invalidate()
                conn.close()
    port = engine.url.port or (5432 if engine.url.host else None)
    return PoolerProbe(port, None if server_port is None else int(server_port), int(pid_first), int(pid_other),
                       int(pid_second), kept)


def _push(wakeups: Wakeups) -> Finding:
    status = wakeups.status()
    round_trip = None
    if status.active:
        seconds = wakeups.probe()
        round_trip = None if seconds is None else seconds * 1000.0
    return push_finding(status.state, status.detail, round_trip, wakeups.listen_url is not None)


def _replication(ct: Checked, in_recovery: bool) -> Finding:
    def read(conn: Connection) -> tuple[str, str, list[tuple[Any, Any, Any]]]:
        commit, names = conn.execute(PG_SYNC_SETTINGS).one()
        rows = [tuple(r) for r in conn.execute(PG_REPLICAS)]
        return str(commit), str(names or ""), rows  # type: ignore[misc]

    commit, names, rows = ct.db.run(read)
    return replication_finding(commit, names, rows, in_recovery)


def _skew(ct: Checked) -> Finding:
    before = time.time()
    database = ct.now()
    after = time.time()
    return skew_finding(database - (before + after) / 2)


def _denied(ct: Checked, table: Table) -> dict[str, str]:
    from .errors import PermissionDeniedError

    denied: dict[str, str] = {}
    for privilege, stmt in privilege_probes(table).items():
        try:
            ct.db.run(operator.methodcaller("execute", stmt))
        except PermissionDeniedError as exc:
            denied[privilege] = str(exc)
    return denied


def _event_table(ct: Checked, ev: EventTable, label: str) -> list[Finding]:
    check = f"event table {label}"
    missing = ev.prepare_statements()
    if missing:
        return [Finding(check, "warning", f"{len(missing)} claim column(s) or index(es) missing",
                        f"run `controltable events prepare {label} --key {ev.key}` (or EventTable.prepare())")]
    table = ev.table
    out = [privileges_finding(f"{check}: privileges", label, _denied(ct, table))]
    actual = ev.stats().total
    dialect = ct.db.dialect_name
    rows: Optional[int] = None
    analyzed: Optional[bool] = None
    modified: Optional[int] = None
    stats = traits(dialect).table_stats
    if stats == "pg_stats":
        name = ct.db.engine.dialect.identifier_preparer.format_table(table)
        found = ct.db.run(lambda c: c.execute(PG_TABLE_STATS, {"name": name}).first())
        if found is not None:
            rows = max(int(found[0]), 0)
            modified = None if found[1] is None else int(found[1])
            analyzed = bool(found[2])
    elif stats == "table_rows":
        found = ct.db.run(lambda c: c.execute(MYSQL_TABLE_ROWS, {"schema": ev.table_schema, "name": ev.name}).first())
        rows = None if found is None or found[0] is None else int(found[0])
    elif stats == "sqlite_stat1":
        def read(c: Connection) -> bool:
            return bool(c.scalar(SQLITE_TABLE_STATS)) and bool(c.scalar(SQLITE_TABLE_ROWS, {"name": ev.name}))

        analyzed = ct.db.run(read)
    out.append(statistics_finding(label, dialect, rows, analyzed, modified, actual))
    return out


def _galera(ct: Checked) -> Finding:
    def read(conn: Connection) -> tuple[Optional[bool], Optional[int], dict[str, str]]:
        if not conn.scalar(MYSQL_HAS_WSREP):
            return None, None, {}
        on, sync_wait = conn.execute(GALERA_VARIABLES).one()
        status = {str(k).upper(): str(v) for k, v in conn.execute(GALERA_STATUS)}
        return bool(int(on)), int(sync_wait), status

    return galera_finding(*ct.db.run(read))
