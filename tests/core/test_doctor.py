"""``controltable doctor`` / ``ControlTable.doctor()``: findings on the live backends, through a real
PgBouncer, and the decisions on fake rows (standbys, Galera, statistics) that no server here shows."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text
from support.pgbouncer import pgbouncer_url  # noqa: F401 - a fixture

from controltable import ControlTable, Finding
from controltable import doctor as doc
from controltable.cli.group import cli

EXPECTED = {
    "sqlite": {"server", "push", "role", "clock", "isolation", "control tables", "privileges"},
    "postgres": {"server", "pooler", "push", "role", "replication", "clock", "isolation", "control tables",
                 "privileges"},
    "mysql": {"server", "push", "role", "clock", "isolation", "control tables", "privileges", "galera"},
}


def by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


# -- live backends --------------------------------------------------------------------------------------------
def test_doctor_on_a_healthy_setup_reports_every_check_with_a_fix(ct: ControlTable, backend: str) -> None:
    findings = ct.doctor()
    found = by_check(findings)
    assert EXPECTED[backend] <= set(found), sorted(found)
    assert all(f.level in doc.LEVELS and f.message and f.fix for f in findings), findings
    assert found["control tables"].level == "ok" and found["privileges"].level == "ok"
    assert found["isolation"].level == "ok", found["isolation"]
    assert found["role"].level == "ok" and "primary" in found["role"].message or backend == "sqlite"
    assert {"sqlite": "SQLite", "postgres": "PostgreSQL", "mysql": "MariaDB"}[backend] in found["server"].message
    assert "database clock" in found["clock"].message
    if backend == "postgres":
        assert found["push"].level == "ok" and "round trip" in found["push"].message
        assert found["pooler"].level == "ok", found["pooler"]
    else:
        assert found["push"].level == "info" and "poll" in found["push"].message
    assert doc.exit_code(findings) == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        findings[0].level = "error"  # type: ignore[misc]


def test_doctor_reports_missing_control_tables_as_an_error(backend_url: str) -> None:
    fresh = ControlTable(backend_url, prefix=f"nd{uuid.uuid4().hex[:6]}_")
    try:
        findings = fresh.doctor()
    finally:
        fresh.close()
    tables = by_check(findings)["control tables"]
    assert tables.level == "error" and "controltable init" in tables.fix
    assert "privileges" not in by_check(findings)
    assert doc.exit_code(findings) == 2


def test_doctor_checks_event_tables_claim_indexes_and_statistics(ct: ControlTable, event_table: Any) -> None:
    prepared = event_table(50)
    unprepared = event_table(5, prepare=False)
    findings = ct.doctor(event_tables=[prepared, unprepared])
    ok = [f for f in findings if f.check.startswith(f"event table {prepared.name}")]
    assert ok and all(f.level == "ok" for f in ok), ok
    missing = by_check(findings)[f"event table {unprepared.name}"]
    assert missing.level == "warning" and "events prepare" in missing.fix, missing
    assert doc.exit_code(findings) == 1


@pytest.mark.backends("postgres")
def test_a_check_that_cannot_run_is_a_finding_and_the_others_still_run(ct: ControlTable,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doc, "PG_REPLICAS", text("SELECT application_name, state, sync_state FROM no_such_view"))
    findings = by_check(ct.doctor())
    assert findings["replication"].level == "error" and "could not check" in findings["replication"].message
    assert "run doctor again" in findings["replication"].fix
    assert findings["clock"].level == "ok" and findings["privileges"].level == "ok"


@pytest.mark.backends("postgres", "sqlite")
def test_doctor_warns_about_an_event_table_never_analyzed(ct: ControlTable, event_table: Any) -> None:
    ev = event_table(3000, prepare=False)
    ev.prepare(analyze=False)
    stats = by_check(ct.doctor(event_tables=[ev]))[f"event table {ev.name}"]
    assert stats.level == "warning" and "never analyzed" in stats.message and "ANALYZE" in stats.fix, stats
    ev.prepare(analyze=True)  # nothing to add, so it analyzes nothing: ANALYZE by hand, as the fix says
    with ct.engine.begin() as conn:
        conn.execute(text(f'ANALYZE "{ev.name}"'))
    assert by_check(ct.doctor(event_tables=[ev]))[f"event table {ev.name}"].level == "ok"


def test_cli_doctor_prints_a_table_and_exits_by_the_worst_level(ct: ControlTable, backend_url: str,
                                                                 namespace: str, event_table: Any) -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["--url", backend_url, "--namespace", namespace, "doctor"])
    assert ok.exit_code == 0, ok.output
    assert "controltable doctor" in ok.output and "control tables" in ok.output
    unprepared = event_table(3, prepare=False)
    warned = runner.invoke(cli, ["--url", backend_url, "--namespace", namespace, "doctor", "--json",
                                 "--events", f"{unprepared.name}:id"])
    assert warned.exit_code == 1, warned.output
    rows = json.loads(warned.output)
    assert {"check", "level", "message", "fix"} == set(rows[0])
    assert any(r["check"] == f"event table {unprepared.name}" and r["level"] == "warning" for r in rows)


def test_status_page_shows_doctor_and_push(ct: ControlTable, backend: str) -> None:
    pytest.importorskip("prometheus_client")
    from controltable.web import metrics
    from controltable.web.data import StatusSource

    source = StatusSource(ct)
    snap = source.snapshot(charts=False)
    assert {f["check"] for f in snap["doctor"]} >= EXPECTED[backend]
    assert snap["push"]["active"] is (backend == "postgres")
    body = metrics.render(lambda: snap, lambda: {}).decode()
    assert f"controltable_push_active {1.0 if backend == 'postgres' else 0.0}" in body
    assert 'controltable_doctor_findings{level="error"} 0.0' in body


@pytest.mark.backends("postgres")
def test_doctor_names_the_privileges_a_read_only_user_lacks(backend_url: str) -> None:
    prefix = f"dp{uuid.uuid4().hex[:6]}_"
    role = f"ct_doctor_{uuid.uuid4().hex[:8]}"
    owner = ControlTable(backend_url, prefix=prefix)
    owner.install()
    admin = create_engine(backend_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
            for table in owner.tables.tables:
                conn.execute(text(f'GRANT SELECT ON "{table.name}" TO "{role}"'))
        reader = ControlTable(owner.engine.url.set(username=role), prefix=prefix)
        try:
            findings = reader.doctor()
        finally:
            reader.close()
        privileges = by_check(findings)["privileges"]
        assert privileges.level == "error", privileges
        assert f"UPDATE on {prefix}resource" in privileges.message and "SELECT" not in privileges.message
        assert "GRANT" in privileges.fix and doc.exit_code(findings) == 2
    finally:
        owner.close()
        with admin.connect() as conn:
            for table in owner.tables.tables:
                conn.execute(text(f'DROP TABLE IF EXISTS "{table.name}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


# -- through PgBouncer ----------------------------------------------------------------------------------------
@pytest.fixture
def bounced(pgbouncer_url: Any, backend_url: str, namespace: str) -> Iterator[Any]:  # noqa: F811 - the fixture
    made: list[ControlTable] = []

    def make(mode: str, *, listen: bool) -> ControlTable:
        ct = ControlTable(pgbouncer_url(mode), namespace=namespace, listen_url=backend_url if listen else None)
        made.append(ct)
        ct.install()
        return ct

    yield make
    for ct in made:
        ct.close()


@pytest.mark.backends("postgres")
def test_doctor_through_pgbouncer_in_transaction_mode_reports_the_pooler_and_inactive_push(bounced: Any) -> None:
    findings = by_check(bounced("transaction", listen=False).doctor())
    assert "transaction mode" in findings["pooler"].message, findings["pooler"]
    assert "listen_url" in findings["pooler"].fix
    assert findings["push"].level == "warning" and "inactive" in findings["push"].message
    assert "listen_url" in findings["push"].fix
    assert doc.exit_code(list(findings.values())) == 1


@pytest.mark.backends("postgres")
def test_doctor_through_pgbouncer_with_listen_url_reports_push_active(bounced: Any) -> None:
    findings = by_check(bounced("transaction", listen=True).doctor())
    assert "transaction mode" in findings["pooler"].message and findings["pooler"].level == "info"
    assert findings["push"].level == "ok" and "round trip" in findings["push"].message


@pytest.mark.backends("postgres")
def test_doctor_through_pgbouncer_in_session_mode_sees_a_proxy_that_keeps_sessions(bounced: Any) -> None:
    findings = by_check(bounced("session", listen=False).doctor())
    assert "session mode" in findings["pooler"].message and findings["pooler"].level == "info"
    # The listener does not LISTEN through a pooler it cannot tell from a transaction pooler: push
    # needs listen_url here too, and both findings say so.
    assert findings["push"].level == "warning" and "listen_url" in findings["push"].fix
    assert "listen_url" in findings["pooler"].fix
    with_listener = by_check(bounced("session", listen=True).doctor())
    assert with_listener["push"].level == "ok"
    assert "push wake-ups go through listen_url" in with_listener["pooler"].message


# -- the decisions on fake rows --------------------------------------------------------------------------------
def test_replication_decisions() -> None:
    standby = [("standby1", "streaming", "async")]
    asynchronous = doc.replication_finding("on", "", standby, in_recovery=False)
    assert asynchronous.level == "warning" and "asynchronous" in asynchronous.message
    assert "synchronous_standby_names" in asynchronous.fix and "synchronous_commit" in asynchronous.fix
    local = doc.replication_finding("local", "standby1", [("standby1", "streaming", "sync")], in_recovery=False)
    assert local.level == "warning", "synchronous_commit=local does not wait for the standby"
    synced = doc.replication_finding("on", "ANY 1 (standby1)", [("standby1", "streaming", "quorum")], False)
    assert synced.level == "ok" and "standby1" in synced.message
    assert doc.replication_finding("remote_write", "s", [("s", "streaming", "sync")], False).level == "info"
    gone = doc.replication_finding("on", "standby1", [], in_recovery=False)
    assert gone.level == "error" and "waits" in gone.message
    assert doc.replication_finding("on", "", [], in_recovery=False).level == "info"
    assert doc.replication_finding("on", "", [], in_recovery=True).level == "info"


def test_push_decisions() -> None:
    lost = doc.push_finding("inactive", "push wake-ups are inactive: nothing came back. Set listen_url.", None)
    assert lost.level == "warning" and lost.message == "push wake-ups are inactive: nothing came back."
    assert "listen_url" in lost.fix
    wrong = doc.push_finding("inactive", "push wake-ups are inactive: x. Waiters poll.", None, listen_url=True)
    assert "point listen_url at the PostgreSQL server itself" in wrong.fix
    assert doc.push_finding("active", "", 3.0).level == "ok"
    assert doc.push_finding("active", "", None).level == "warning", "connected, yet the probe sent now was lost"
    assert doc.push_finding("unavailable", "", None).level == "info"


def test_role_decisions() -> None:
    assert doc.role_finding("postgresql", True).level == "error"
    assert "target_session_attrs=read-write" in doc.role_finding("postgresql", True).fix
    assert doc.role_finding("mysql", True).level == "error"
    assert doc.role_finding("mysql", False).level == "ok"


def test_pooler_decisions() -> None:
    direct = doc.PoolerProbe(5432, 5432, 10, 11, 10, True)
    assert doc.pooler_finding(direct, True, False).level == "ok"
    shared = doc.PoolerProbe(6432, 5432, 10, 10, 12, False)
    found = doc.pooler_finding(shared, False, False)
    assert "transaction mode" in found.message and "listen_url" in found.fix
    assert doc.pooler_finding(shared, True, True).fix == doc.NOTHING
    lost_setting_only = doc.PoolerProbe(6432, 5432, 10, 11, 10, False)
    assert "session setting was lost" in doc.pooler_finding(lost_setting_only, False, False).message
    session = doc.PoolerProbe(6432, 5432, 10, 11, 10, True)
    assert "session mode" in doc.pooler_finding(session, True, False).message


def test_galera_decisions() -> None:
    synced = {"WSREP_CLUSTER_SIZE": "3", "WSREP_LOCAL_STATE_COMMENT": "Synced", "WSREP_READY": "ON"}
    assert doc.galera_finding(None, None, {}).level == "ok"
    assert doc.galera_finding(True, 1, synced).level == "ok"
    stale = doc.galera_finding(True, 0, synced)
    assert stale.level == "warning" and "wsrep_sync_wait = 1" in stale.fix
    assert doc.galera_finding(True, 2, synced).level == "warning", "bit 1 (reads) must be set"
    assert doc.galera_finding(True, 1, {**synced, "WSREP_CLUSTER_SIZE": "2"}).level == "warning"
    donor = doc.galera_finding(True, 1, {**synced, "WSREP_LOCAL_STATE_COMMENT": "Donor/Desynced"})
    assert donor.level == "error"


def test_statistics_version_skew_and_exit_decisions() -> None:
    assert doc.statistics_finding("ev", "postgresql", 0, False, 0, 5000).level == "warning"
    assert doc.statistics_finding("ev", "postgresql", 5000, True, 9000, 5000).level == "warning"
    assert doc.statistics_finding("ev", "mysql", 10, None, None, 50_000).level == "warning"
    assert doc.statistics_finding("ev", "mysql", 48_000, None, None, 50_000).level == "ok"
    assert doc.version_finding(2, 3).level == "warning" and "1 upgrade step" in doc.version_finding(2, 3).message
    assert doc.version_finding(4, 3).level == "error"
    assert doc.skew_finding(0.2).level == "ok" and doc.skew_finding(-5.0).level == "info"
    assert "behind" in doc.skew_finding(-5.0).message
    assert doc.isolation_finding("postgresql", "REPEATABLE READ").level == "warning"
    findings = [Finding("a", "ok", "m", "f"), Finding("b", "info", "m", "f")]
    assert doc.exit_code(findings) == 0
    assert doc.exit_code([*findings, Finding("c", "warning", "m", "f")]) == 1
    assert doc.exit_code([*findings, Finding("c", "error", "m", "f"), Finding("d", "warning", "m", "f")]) == 2


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "mysql+pymysql"])
def test_cli_doctor_on_an_unreachable_database_exits_4_at_once(driver: str) -> None:
    # The SQLAlchemy 1.4 environment has PyMySQL only.
    pytest.importorskip("psycopg" if driver.endswith("psycopg") else "pymysql")
    result = CliRunner().invoke(cli, ["--url", f"{driver}://nobody@127.0.0.1:1/none",
                                      "--connect-timeout", "2", "doctor"])
    assert result.exit_code == 4, result.output
    assert "cannot reach the database" in result.output and result.output.count("cannot reach") == 1


# -- a throwaway primary and streaming standby ----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.backends("postgres")
def test_doctor_on_a_streaming_pair_warns_until_commits_wait_for_the_standby(backend: str) -> None:
    from faults.replication import ReplicatedPostgres
    from faults.servers import postgres_bin

    if postgres_bin() is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_basebackup) are not installed")
    pair = ReplicatedPostgres(synchronous=False)
    tables: list[ControlTable] = []
    try:
        pair.wait_streaming()
        primary = ControlTable(pair.primary.url())
        tables.append(primary)
        primary.install()
        found = by_check(primary.doctor())
        assert found["role"].level == "ok"
        assert found["replication"].level == "warning" and "asynchronous" in found["replication"].message
        assert "synchronous_standby_names" in found["replication"].fix

        admin = create_engine(pair.primary.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:  # what the warning says to set
            conn.execute(text("ALTER SYSTEM SET synchronous_standby_names = '*'"))
            conn.execute(text("SELECT pg_reload_conf()"))
        admin.dispose()
        pair.synchronous = True
        pair.wait_streaming()
        found = by_check(primary.doctor())
        assert found["replication"].level == "ok" and "synchronous standby" in found["replication"].message

        standby = ControlTable(pair.standby.url(), statement_timeout=10)
        tables.append(standby)
        found = by_check(standby.doctor())
        assert found["role"].level == "error" and "standby" in found["role"].message
        assert "target_session_attrs=read-write" in found["role"].fix
        assert found["replication"].level == "info"
        assert doc.exit_code(list(found.values())) == 2
    finally:
        for ct in tables:
            ct.close()
        pair.close()


# -- a throwaway Galera cluster -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.backends("mysql")
def test_doctor_on_a_galera_node_reads_sync_wait_and_cluster_size(backend: str) -> None:
    from faults.galera import GaleraCluster, galera_missing

    missing = galera_missing()
    if missing is not None:
        pytest.skip(missing)
    cluster = GaleraCluster(nodes=2)
    try:
        cluster.start()
        url = cluster.nodes[0].url()
        first = ControlTable(url)
        try:
            first.install()
            galera = by_check(first.doctor())["galera"]
        finally:
            first.close()
        assert galera.level == "warning" and "wsrep_sync_wait = 0" in galera.message, galera
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:  # what the warning says to set
            conn.execute(text("SET GLOBAL wsrep_sync_wait = 1"))
        admin.dispose()
        second = ControlTable(url)  # new connections take the new global value
        try:
            galera = by_check(second.doctor())["galera"]
        finally:
            second.close()
        assert galera.level == "warning" and "a cluster of 2" in galera.message and "garbd" in galera.fix, galera
    finally:
        cluster.close()
