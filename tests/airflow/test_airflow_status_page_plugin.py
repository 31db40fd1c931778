"""The provider's status-page plugin as Airflow discovers it (the live test checks it in a running api-server)."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("starlette", reason="the web extra is not installed")


def test_declared_the_provider_way() -> None:
    from airflow.plugins_manager import AirflowPlugin

    from airflow_controltable.get_provider_info import get_provider_info

    (plugin,) = get_provider_info()["plugins"]
    module, _, name = plugin["plugin-class"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, AirflowPlugin) and cls.name == plugin["name"] == "controltable"
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "controltable"]
    assert [ep.value.replace(":", ".") for ep in eps] == [plugin["plugin-class"]]


def test_mounted_only_in_the_api_server() -> None:
    from airflow_controltable.plugins.status_page import ControlTableStatusPlugin, running_in_api_server

    assert running_in_api_server(["/venv/bin/airflow", "api-server", "--port", "8080"])
    assert running_in_api_server(["python", "-m", "airflow-core/src/airflow/api_fastapi/main.py"])
    for argv in (["airflow", "scheduler"], ["airflow", "triggerer"], ["airflow", "tasks", "run"], ["pytest"]):
        assert not running_in_api_server(argv)
    # This process (pytest) is not the api-server: nothing mounted, no navigation entry.
    assert ControlTableStatusPlugin.fastapi_apps == [] and ControlTableStatusPlugin.external_views == []
