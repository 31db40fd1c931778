"""Schema versions: ``install()`` records version 1, refuses newer tables, and upgrades older ones in place.

Version 1 is the first release's tables, so the upgrade path is proved on a synthetic version 2
(``migration_workers.py``: a column with a default and an index): applied to an installed version
1 with a live holder, idempotent, safe with two installer processes at once, and a failing step
leaves the recorded version for a rerun to complete.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import migration_workers
import pytest
import sqlalchemy.exc
from migration_workers import NEXT_VERSION, install_v2, v2_tables
from sqlalchemy import create_engine, event, inspect, select

from controltable import ControlTable, ControlTableError, NotInstalledError, migrations
from controltable.schema import SCHEMA_VERSION

WORKER = Path(__file__).with_name("migration_workers.py")
#: Hang detector for one installer process (an upgrade of empty tables takes well under a second).
INSTALL_HANG = 120


@pytest.fixture
def prefix(backend_url: str) -> Iterator[str]:
    """Control tables of their own (the shared ``ct_`` tables must not get the synthetic column)."""
    name = f"m{uuid.uuid4().hex[:8]}_"
    yield name
    engine = create_engine(backend_url)
    v2_tables(name).metadata.drop_all(engine)
    engine.dispose()


@pytest.fixture
def v1(backend_url: str, namespace: str, prefix: str) -> Iterator[ControlTable]:
    """An installation of this package (version 1) with a resource and a live holder."""
    ct = ControlTable(backend_url, namespace=namespace, prefix=prefix)
    assert ct.install() == SCHEMA_VERSION == 1
    ct.set_capacity("w", 2)
    yield ct
    ct.close()


def _ddl_seen(ct: ControlTable) -> list[str]:
    sent: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("ALTER", "CREATE")):
            sent.append(statement)

    event.listen(ct.db.engine, "before_cursor_execute", seen)
    return sent


def test_a_new_installation_records_version_1(v1: ControlTable) -> None:
    assert v1.installed_version() == 1
    assert v1.install() == 1  # idempotent


def test_install_upgrades_version_1_to_the_next_in_place(v1: ControlTable, namespace: str, prefix: str) -> None:
    lease = v1.acquire("w", holder="old-holder", lease=300, timeout=5)
    assert install_v2(v1) == NEXT_VERSION
    assert v1.installed_version() == NEXT_VERSION
    r = v2_tables(prefix).resource
    assert "weight" in {c["name"].lower() for c in inspect(v1.engine).get_columns(r.name)}
    assert f"{prefix}resource_weight_ix" in {str(i["name"]).lower() for i in inspect(v1.engine).get_indexes(r.name)}
    with v1.engine.connect() as conn:  # the row from version 1 got the column's default
        assert conn.scalar(select(r.c.weight).where(r.c.namespace == namespace, r.c.name == "w")) == 1
    found = v1.find_lease("w", "old-holder")  # the holder's lease and token survive the upgrade
    assert found is not None and found.token == lease.token
    lease.release()

    ddl = _ddl_seen(v1)
    assert install_v2(v1) == NEXT_VERSION  # idempotent: every step finds its change made
    assert [s for s in ddl if s.lstrip().upper().startswith("ALTER")] == [], ddl
    assert not any("resource_weight_ix" in s for s in ddl), ddl


def test_a_fresh_installation_of_the_next_version_runs_no_step(backend_url: str, prefix: str) -> None:
    with ControlTable(backend_url, prefix=prefix) as ct:
        assert migrations.install(ct.db, v2_tables(prefix), version=NEXT_VERSION, upgrades={}) == NEXT_VERSION
        assert ct.installed_version() == NEXT_VERSION
        assert "weight" in {c["name"].lower() for c in inspect(ct.engine).get_columns(f"{prefix}resource")}


def test_tables_newer_than_the_package_are_refused(v1: ControlTable) -> None:
    """A package at version 1 meeting tables a version 2 installed: a controltable error that says
    what to do, never a guess at columns it does not know."""
    assert install_v2(v1) == NEXT_VERSION
    with pytest.raises(NotInstalledError, match=r"schema version 2, newer than this controltable \(1\); "
                                                r"upgrade the controltable package") as caught:
        v1.install()
    assert isinstance(caught.value, ControlTableError)
    assert v1.installed_version() == NEXT_VERSION  # refused, not rewritten


def test_two_installer_processes_upgrade_the_same_tables_at_once(v1: ControlTable, backend_url: str,
                                                                  prefix: str) -> None:
    """Both check, both may ALTER: the one that loses the race sees "already applied" by its error
    code and goes on, so both end at version 2 with one column and one index."""
    procs = [subprocess.Popen([sys.executable, str(WORKER), backend_url, prefix], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:  # both connected and waiting: start them together
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=INSTALL_HANG) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: an installer process did not finish within {INSTALL_HANG} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [json.loads(out.strip().splitlines()[-1]) for out, _err in outputs]
    assert results == [{"version": NEXT_VERSION}] * 2, (results, [err for _out, err in outputs])
    assert v1.installed_version() == NEXT_VERSION
    columns = [c["name"].lower() for c in inspect(v1.engine).get_columns(f"{prefix}resource")]
    assert columns.count("weight") == 1
    indexes = [str(i["name"]).lower() for i in inspect(v1.engine).get_indexes(f"{prefix}resource")]
    assert indexes.count(f"{prefix}resource_weight_ix") == 1


def test_a_failing_step_is_a_controltable_error_and_a_rerun_completes(
    v1: ControlTable, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps run through the database layer: a driver error surfaces as a controltable error (the
    driver's error kept as its cause), the recorded version stays, and the next install completes."""
    real = migrations.add_column_sql
    missing = v2_tables(f"missing{uuid.uuid4().hex[:6]}_")

    def broken(table: Any, column: Any, dialect: Any) -> Any:  # the ALTER names a table that does not exist
        twin = getattr(missing, table.name[len(prefix):])
        return real(twin, twin.c[column.name], dialect)

    monkeypatch.setattr(migrations, "add_column_sql", broken)
    with pytest.raises(ControlTableError) as caught:
        install_v2(v1)
    assert not isinstance(caught.value, sqlalchemy.exc.SQLAlchemyError)
    assert isinstance(caught.value.__cause__, sqlalchemy.exc.DBAPIError)
    assert v1.installed_version() == 1
    monkeypatch.setattr(migrations, "add_column_sql", real)
    assert install_v2(v1) == NEXT_VERSION
    assert v1.installed_version() == NEXT_VERSION


def test_the_package_has_no_upgrade_step_yet() -> None:
    """Version 1 is the first: a step exists for every version below the package's, and none beyond."""
    assert sorted(migrations.UPGRADES) == list(range(1, SCHEMA_VERSION))
    assert sorted(migration_workers.UPGRADES) == list(range(1, NEXT_VERSION))
