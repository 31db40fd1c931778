"""The provider's status-page plugin as Airflow discovers it (the live test checks it in a running api-server)."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the web extra is not installed")


def test_declared_once_as_an_entry_point() -> None:
    from airflow.plugins_manager import AirflowPlugin

    from airflow_controltable.get_provider_info import get_provider_info

    # One registration: Airflow would load a provider-info "plugins" entry as well as the entry point.
    assert "plugins" not in get_provider_info()
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "controltable"]
    cls = ep.load()
    assert issubclass(cls, AirflowPlugin) and cls.name == "controltable"


_LOAD_PLUGINS = """
import json
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"errors": errors, "names": [p.name for p in plugins]}))
"""


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_airflow_loads_it_once_without_import_errors(lazy: str) -> None:
    """Airflow's own plugin loading, in both provider-discovery modes (the home page shows its errors)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": lazy}
    out = subprocess.run([sys.executable, "-c", _LOAD_PLUGINS], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded["errors"] == {}
    assert loaded["names"].count("controltable") == 1


def test_mounted_only_in_the_api_server() -> None:
    from airflow_controltable.plugins.status_page import ControlTableStatusPlugin, running_in_api_server

    assert running_in_api_server(["/venv/bin/airflow", "api-server", "--port", "8080"])
    assert running_in_api_server(["python", "-m", "airflow-core/src/airflow/api_fastapi/main.py"])
    for argv in (["airflow", "scheduler"], ["airflow", "triggerer"], ["airflow", "tasks", "run"], ["pytest"]):
        assert not running_in_api_server(argv)
    # This process (pytest) is not the api-server: nothing mounted, no navigation entry.
    assert ControlTableStatusPlugin.fastapi_apps == [] and ControlTableStatusPlugin.external_views == []


def test_a_missing_connection_shows_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control table is opened on the first request: a missing connection is a 503 naming the fix."""
    import warnings

    from airflow_controltable.plugins.status_page import build_app

    warnings.filterwarnings("ignore", message=".*httpx.*")
    from starlette.testclient import TestClient

    monkeypatch.delenv("AIRFLOW_CONN_CT_STATUS_PAGE_MISSING", raising=False)
    app = build_app({"conn_id": "ct_status_page_missing", "events": [], "worklists": [], "poll_interval": 5.0})
    inner = app.app  # behind AirflowAuth, which needs a running api-server's auth manager
    resp = TestClient(inner).get("/api/status")
    assert resp.status_code == 503
    assert "ct_status_page_missing" in resp.json()["error"] and "status_page_conn_id" in resp.json()["error"]


def test_auth_uses_airflows_auth_manager(airflow_db: object, monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """Airflow's real SimpleAuthManager in front of a real page: no token 401, a bad or foreign token 401,
    a user without the right to read pools 403, a viewer 200 (header or the UI's cookie)."""
    import warnings

    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "a-secret-for-this-test-only")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from airflow_controltable.plugins.status_page import AirflowAuth
    from controltable import ControlTable
    from controltable.web import StatusSource, create_app

    warnings.filterwarnings("ignore", message=".*httpx.*")
    from starlette.testclient import TestClient

    manager = SimpleAuthManager()
    ct = ControlTable(f"sqlite:///{tmp_path}/ct.db", namespace="auth")
    ct.install()
    ct.set_capacity("warehouse", 2)
    client = TestClient(AirflowAuth(create_app(StatusSource(ct)), auth_manager=lambda: manager))
    viewer = manager.generate_jwt(SimpleAuthManagerUser(username="v", role="viewer"))
    nobody = manager.generate_jwt(SimpleAuthManagerUser(username="n", role=None))
    # An admin token whose signature is not this deployment's (forged, or from another deployment).
    header, claims, _ = manager.generate_jwt(SimpleAuthManagerUser(username="v", role="admin")).split(".")
    import base64
    import hashlib
    import hmac

    signature = hmac.new(b"another-deployments-secret", f"{header}.{claims}".encode(), hashlib.sha512).digest()
    foreign = f"{header}.{claims}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"
    try:
        assert client.get("/api/status").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer garbage"}).status_code == 401
        assert client.get("/", headers={"Authorization": f"Bearer {foreign}"}).status_code == 401
        assert client.get("/api/status", headers={"Authorization": f"Bearer {nobody}"}).status_code == 403
        ok = client.get("/api/status", headers={"Authorization": f"Bearer {viewer}"})
        assert ok.status_code == 200 and ok.json()["resources"][0]["name"] == "warehouse"
        client.cookies.set("_token", viewer)
        assert client.get("/static/app.js").status_code == 200
    finally:
        ct.close()
