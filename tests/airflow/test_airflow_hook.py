"""ControlTableHook: connection types, the URL it builds, and clear errors for bad connections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from airflow_helpers import make_context, set_connection

pytestmark = pytest.mark.usefixtures("airflow_db")


def test_controltable_connection_gives_a_working_table(conn_id: str, ct: Any, namespace: str) -> None:
    from airflow_controltable.hooks.controltable import ControlTableHook

    ct.set_capacity("warehouse", 2)
    table = ControlTableHook(conn_id).get_control_table()
    assert table.namespace == namespace
    assert [s.name for s in table.status()] == ["warehouse"]
    assert ControlTableHook(conn_id).get_control_table() is table  # one pool per process
    ok, message = ControlTableHook(conn_id).test_connection()
    assert ok and "schema version" in message


def test_url_in_host_password_field_and_namespace_override(
    airflow_db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_controltable.hooks.controltable import ControlTableHook

    conn = set_connection(monkeypatch, "ct_host", conn_type="controltable", host=f"sqlite:///{tmp_path}/h.db",
                          extra={"namespace": "from_extra", "install": True})
    table = ControlTableHook(conn).get_control_table()
    assert table.namespace == "from_extra"
    assert table.installed_version() is not None  # the install extra created the tables
    assert ControlTableHook(conn, namespace="other").get_control_table().namespace == "other"

    set_connection(monkeypatch, "ct_pw", conn_type="controltable", password="s3cret",
                   extra={"url": "postgresql+psycopg://alice@db.example:5432/wh"})
    assert ControlTableHook("ct_pw").get_uri() == "postgresql+psycopg://alice:s3cret@db.example:5432/wh"


def test_sqlite_connection_type_is_accepted(airflow_db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_controltable.hooks.controltable import ControlTableHook

    conn = set_connection(monkeypatch, "my_sqlite", conn_type="sqlite", host=str(tmp_path / "existing.db"))
    table = ControlTableHook(conn, namespace="ns1").get_control_table()
    table.install()
    table.set_capacity("r", 1)
    assert table.acquire("r", holder="h", timeout=0).token == 1


@pytest.mark.backends("postgres")
def test_existing_postgres_connection_is_accepted(
    airflow_db: Path, monkeypatch: pytest.MonkeyPatch, backend_url: str, namespace: str
) -> None:
    """A plain Airflow `postgres` connection (PostgresHook, a DbApiHook) is used as it is."""
    from sqlalchemy.engine import make_url

    from airflow_controltable.hooks.controltable import ControlTableHook

    url = make_url(backend_url)
    conn = set_connection(monkeypatch, "warehouse_pg", conn_type="postgres", host=url.host, port=url.port,
                          login=url.username, password=url.password, schema=url.database)
    hook = ControlTableHook(conn, namespace=namespace)
    assert hook.get_uri().startswith("postgresql+psycopg://")
    table = hook.get_control_table()
    table.install()
    table.set_capacity("pg_resource", 1)
    assert table.try_acquire("pg_resource", holder="h") is not None


def test_unknown_connection_id_is_a_clear_error(airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_controltable.exceptions import ControlTableConnectionNotFound
    from airflow_controltable.hooks import controltable as hook_module
    from airflow_controltable.operators.slots import ReleaseSlotOperator

    monkeypatch.setattr(hook_module, "reads_stored_connections", lambda: True)  # as in a task

    op = ReleaseSlotOperator(task_id="release", resource="warehouse", conn_id="no_such_conn")
    with pytest.raises(ControlTableConnectionNotFound, match="'no_such_conn' is not defined") as info:
        op.execute(make_context())
    assert isinstance(info.value, AirflowException)
    assert "AIRFLOW_CONN_NO_SUCH_CONN" in str(info.value)


def test_a_plain_script_is_told_it_cannot_read_stored_connections(airflow_db: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a task (this test process: no supervisor, no Airflow process context) Airflow 3 reads
    no connection from the metadata database: the error says so, and how the script gets one."""
    from airflow_controltable.exceptions import ControlTableConnectionNotFound
    from airflow_controltable.hooks.controltable import ControlTableHook, reads_stored_connections

    monkeypatch.delenv("_AIRFLOW_PROCESS_CONTEXT", raising=False)
    assert not reads_stored_connections()
    with pytest.raises(ControlTableConnectionNotFound) as info:
        ControlTableHook("stored_in_the_ui").get_control_table()
    text = str(info.value)
    assert "not an Airflow task" in text and "cannot read connections stored in the metadata database" in text
    assert "AIRFLOW_CONN_STORED_IN_THE_UI=" in text and "controltable.ControlTable(" in text
    assert "is not defined in Airflow" not in text  # it may well be defined: the script cannot see it
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")  # the api-server, the scheduler: they can
    assert reads_stored_connections()


def test_the_form_puts_the_url_first_in_every_airflow_version(airflow_db: Path, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """The URL is the Host field, relabelled (standard fields come first in the form; extras are folded),
    for Airflow 3.2+ (provider info) and older UIs (the hook's get_ui_field_behaviour) alike; a
    connection made with `airflow connections add --conn-host URL` works."""
    from airflow_controltable.get_provider_info import get_provider_info
    from airflow_controltable.hooks.controltable import ControlTableHook

    (conn,) = get_provider_info()["connection-types"]
    behaviour = conn["ui-field-behaviour"]
    assert behaviour["relabeling"]["host"] == "SQLAlchemy URL" and "host" not in behaviour["hidden-fields"]
    assert "url" not in conn["conn-fields"]  # one URL field in the form
    assert {"listen_url", "install"} <= set(conn["conn-fields"])
    old_style = ControlTableHook.get_ui_field_behaviour()
    assert old_style["relabeling"] == behaviour["relabeling"]
    assert old_style["hidden_fields"] == behaviour["hidden-fields"]
    in_host = set_connection(monkeypatch, "ct_in_host", conn_type="controltable", host=f"sqlite:///{tmp_path}/h.db",
                             extra={"namespace": "hostns", "install": True})
    table = ControlTableHook(in_host).get_control_table()
    assert table.namespace == "hostns" and table.installed_version() is not None


@pytest.mark.parametrize(
    ("conn_type", "expected"),
    [("smtp", "is not a SQL hook"), ("generic", "has no usable hook")],
)
def test_non_sql_connection_is_a_clear_error(
    airflow_db: Path, monkeypatch: pytest.MonkeyPatch, conn_type: str, expected: str
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_controltable.exceptions import ControlTableConnectionError
    from airflow_controltable.sensors.slots import SlotSensor

    conn = set_connection(monkeypatch, f"not_sql_{conn_type}", conn_type=conn_type, host="mail.example", port=25)
    sensor = SlotSensor(task_id="acquire", resource="warehouse", conn_id=conn)
    with pytest.raises(ControlTableConnectionError, match=expected) as info:
        sensor.poke(make_context())
    assert isinstance(info.value, AirflowFailException)  # retrying cannot fix a wrong connection


def test_controltable_connection_without_url(airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_controltable.exceptions import ControlTableConnectionError
    from airflow_controltable.hooks.controltable import ControlTableHook

    conn = set_connection(monkeypatch, "ct_no_url", conn_type="controltable", extra={"namespace": "x"})
    with pytest.raises(ControlTableConnectionError, match="has no SQLAlchemy URL"):
        ControlTableHook(conn).get_control_table()


@pytest.mark.parametrize("url", [
    "://user:s3cr3t-pw@db-host/db",  # no scheme
    "postgres ql://user:s3cr3t-pw@db-host/db",  # a typo in the scheme
    "postgresql://user:s3cr3t-pw@db-host:port/db",  # a port that is not a number
])
def test_a_url_that_does_not_parse_is_named_without_its_password(
    airflow_db: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    from airflow_controltable.exceptions import ControlTableConnectionError
    from airflow_controltable.hooks.controltable import ControlTableHook

    conn = set_connection(monkeypatch, "ct_bad_url", conn_type="controltable", extra={"url": url})
    with pytest.raises(ControlTableConnectionError, match="is not a SQLAlchemy URL") as info:
        ControlTableHook(conn).get_control_table()
    text = str(info.value)
    assert "s3cr3t-pw" not in text and "db-host" in text, text  # the URL is still recognisable
    listen = set_connection(monkeypatch, "ct_bad_listen", conn_type="controltable", password="pw-field",
                            extra={"url": "sqlite://", "listen_url": url})
    with pytest.raises(ControlTableConnectionError, match="listen_url .* is not a SQLAlchemy URL") as info:
        ControlTableHook(listen).get_control_table()
    assert "s3cr3t-pw" not in str(info.value) and "db-host" in str(info.value), str(info.value)


def test_provider_info_is_registered() -> None:
    from importlib.metadata import entry_points

    from airflow_controltable.get_provider_info import get_provider_info

    eps = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_controltable")]
    assert len(eps) == 1
    info = eps[0].load()()
    assert info == get_provider_info()
    assert info["package-name"] == "airflow-provider-controltable"
    assert info["connection-types"][0]["connection-type"] == "controltable"


def test_airflow_providers_list_shows_the_provider(airflow_db: Path) -> None:
    import subprocess

    from airflow_helpers import airflow_bin

    out = subprocess.run([airflow_bin(), "providers", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "airflow-provider-controltable" in out.stdout


def test_provider_info_declares_the_connection_form_and_the_task_decorator() -> None:
    """Airflow 3.2+ builds the form from provider info (no FAB); the schema Airflow ships validates it."""
    import json as _json
    from pathlib import Path as _Path

    import airflow
    import jsonschema

    from airflow_controltable.get_provider_info import get_provider_info

    info = get_provider_info()
    schema = _json.loads((_Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    (conn,) = info["connection-types"]
    assert set(conn["conn-fields"]) >= {"namespace", "schema", "prefix", "listen_url", "install"}
    assert conn["ui-field-behaviour"]["relabeling"]["host"] == "SQLAlchemy URL"

    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    widgets = pm.connection_form_widgets
    assert "extra__controltable__namespace" in widgets and "extra__controltable__listen_url" in widgets
    assert pm.field_behaviours["controltable"]["relabeling"]["host"] == "SQLAlchemy URL"

    from airflow.sdk import task

    from airflow_controltable.decorators import controltable_slot_task

    assert task.controltable_slot is controltable_slot_task


def test_form_extras_and_the_test_button(airflow_db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_controltable.hooks.controltable import ControlTableHook

    good = set_connection(monkeypatch, "ct_form", conn_type="controltable",
                          extra={"extra__controltable__url": f"sqlite:///{tmp_path}/f.db",
                                 "extra__controltable__namespace": "formns", "schema": ""})
    table = ControlTableHook(good).get_control_table()
    assert table.namespace == "formns" and table.schema is None
    ok, message = ControlTableHook(good).test_connection()
    assert ok and "not installed yet" in message
    table.install()
    ok, message = ControlTableHook(good).test_connection()
    assert ok and "schema version" in message

    bad_url = set_connection(monkeypatch, "ct_bad_url", conn_type="controltable", extra={"url": "not a url"})
    ok, message = ControlTableHook(bad_url).test_connection()
    assert not ok and "SQLAlchemy URL" in message
    down = set_connection(monkeypatch, "ct_down", conn_type="controltable",
                          extra={"url": "postgresql+psycopg://nobody@127.0.0.1:1/none"})
    ok, message = ControlTableHook(down).test_connection()
    assert not ok and "127.0.0.1" in message and "s3cret" not in message


@pytest.mark.backends("postgres")
def test_listen_url_extra_reaches_the_listener(airflow_db: Path, monkeypatch: pytest.MonkeyPatch, backend_url: str,
                                               namespace: str) -> None:
    """The ``listen_url`` extra (a field of the connection form) is the listener's direct URL."""
    from sqlalchemy.engine import make_url

    from airflow_controltable.get_provider_info import get_provider_info
    from airflow_controltable.hooks.controltable import ControlTableHook

    fields = get_provider_info()["connection-types"][0]["conn-fields"]
    assert "listen_url" in fields
    direct = make_url(backend_url)
    conn = set_connection(monkeypatch, "ct_listen", conn_type="controltable", password="pw",
                          extra={"url": backend_url, "namespace": namespace, "listen_url": backend_url})
    table = ControlTableHook(conn).get_control_table()
    assert table.wakeups.listen_url == direct.set(password="pw").render_as_string(hide_password=False)


def test_the_documented_connections_add_gives_a_working_connection(airflow_db: Path, tmp_path: Path) -> None:
    """docs/airflow.md's `airflow connections add` (the URL as --conn-host), read from the metadata
    database as Airflow's own components read it: in a process of its own with the server context (the
    suite's process may have Airflow's settings bound to what earlier tests configured)."""
    import json
    import os
    import re
    import subprocess
    import sys

    from airflow_helpers import airflow_bin

    page = (Path(__file__).resolve().parents[2] / "docs" / "airflow.md").read_text()
    (command,) = re.findall(r"^airflow connections add .*?(?<!\\)$", page, re.M | re.S)
    args = [a for a in re.split(r"\s+", command.replace("\\\n", " ")) if a]
    assert args[:5] == ["airflow", "connections", "add", "controltable_default", "--conn-type"], args
    url = f"sqlite:///{tmp_path}/added.db"
    conn_id = f"ct_documented_add_{tmp_path.name}"  # unique: a metadata database kept from an earlier run
    env = dict(os.environ)  # with the suite's AIRFLOW_HOME (tests/airflow/conftest.py sets it)
    got = subprocess.run([airflow_bin(), "connections", "add", conn_id, "--conn-type", "controltable",
                          "--conn-host", url, "--conn-extra", '{"namespace": "prod", "install": true}'],
                         env=env, capture_output=True, text=True, timeout=600)  # hang detector: Airflow starts
    assert got.returncode == 0, got.stderr[-2000:]
    reader = ("import json, sys\n"
              "from airflow_controltable.hooks.controltable import ControlTableHook\n"
              "table = ControlTableHook(sys.argv[1]).get_control_table()\n"
              "print(json.dumps({'namespace': table.namespace, 'version': table.installed_version()}))\n")
    read = subprocess.run([sys.executable, "-c", reader, conn_id], env={**env, "_AIRFLOW_PROCESS_CONTEXT": "server"},
                          capture_output=True, text=True, timeout=600)
    assert read.returncode == 0, read.stderr[-2000:]
    found = json.loads(read.stdout.strip().splitlines()[-1])
    assert found["namespace"] == "prod" and found["version"] is not None, found
