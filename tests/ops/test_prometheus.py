"""The operations kit: alerting rules, their recorded-series tests, /metrics and the Grafana dashboard.

promtool (Debian's ``prometheus`` package) checks the rules, runs their tests and lints the /metrics text
of a status page over a populated SQLite control table. Without promtool these tests skip, unless
``CONTROLTABLE_TEST_REQUIRE`` contains "promtool" (CI sets it): then they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
RULES = OPS / "prometheus" / "alerts.yml"
RULE_TESTS = OPS / "prometheus" / "alerts_test.yml"
DASHBOARD = OPS / "grafana" / "controltable.json"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
DOCS_URL = "https://github.com/controltable/controltable/blob/main/docs/operations.md"
_METRIC = re.compile(r"\bcontroltable_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if "promtool" in os.environ.get("CONTROLTABLE_TEST_REQUIRE", ""):
            pytest.fail("promtool is required (CONTROLTABLE_TEST_REQUIRE) but not installed: "
                        "apt-get install prometheus (the Makefile's install step does it)")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return found


def _run(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd)


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def test_the_alerting_rules_are_valid(promtool: str) -> None:
    got = _run(promtool, "check", "rules", str(RULES))
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in got.stdout


def test_each_alert_fires_on_its_recorded_series_and_only_there(promtool: str) -> None:
    got = _run(promtool, "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "SUCCESS" in got.stdout


def test_a_wrong_expectation_fails_promtool(promtool: str, tmp_path: Path) -> None:
    """The rule tests can fail: the holder series of alerts_test.yml, expected quiet where it fires."""
    tests = yaml.safe_load(RULE_TESTS.read_text())
    first = tests["tests"][0]
    for case in first["alert_rule_test"]:
        case["exp_alerts"] = []
    (tmp_path / "alerts.yml").write_text(RULES.read_text())
    (tmp_path / "wrong_test.yml").write_text(yaml.safe_dump({**tests, "tests": [first]}))
    got = _run(promtool, "test", "rules", "wrong_test.yml", cwd=tmp_path)
    assert got.returncode != 0 and "ControlTableHolderPastLease" in got.stdout + got.stderr


def test_every_alert_is_tested_documented_and_linked() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    firing = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if not case["exp_alerts"]}
    doc = OPERATIONS_DOC.read_text()
    page = (ROOT / "core" / "src" / "controltable" / "web" / "static" / "index.html").read_text()
    alerts = _alerts()
    assert len(alerts) >= 5
    for rule in alerts:
        name = rule["alert"]
        assert name in firing and name in quiet, f"{name}: alerts_test.yml must show it firing and quiet"
        anchor = name.lower()
        assert rule["annotations"]["runbook_url"] == f"{DOCS_URL}#{anchor}", name
        assert f"\n### {name}\n" in doc, f"docs/operations.md has no section for {name}"
        assert f'href="{DOCS_URL}#{anchor}"' in page, f"the status page does not link to {name}'s docs"
    assert "controltable_push_active == 0" in RULES.read_text()


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """/metrics of a status page over a control table with every kind of figure in it."""
    pytest.importorskip("starlette")
    pytest.importorskip("prometheus_client")
    from sqlalchemy import Column, Float, Integer, MetaData, Table, insert

    from controltable import ControlTable
    from controltable.web import StatusSource, create_app, parse_event_spec

    warnings.filterwarnings("ignore", message=".*httpx.*")
    from starlette.testclient import TestClient

    url = f"sqlite:///{tmp_path_factory.mktemp('metrics') / 'ct.db'}"
    ct = ControlTable(url)
    try:
        ct.install()
        ct.set_capacity("warehouse", 2)
        ct.set_capacity("idle", 1)
        ct.acquire("warehouse", holder="load-a", lease=120)
        ct.acquire("warehouse", holder="load-b", lease=120).release()
        assert ct.try_acquire("warehouse", holder="writer", mode="exclusive", waiter_ttl=120) is None
        table = Table("orders_events", MetaData(), Column("id", Integer, primary_key=True),
                      Column("created_at", Float(53), nullable=False))
        table.create(ct.engine)
        now = ct.now()
        with ct.engine.begin() as conn:
            conn.execute(insert(table), [{"id": i, "created_at": now - 60 * i} for i in range(1, 6)])
        events = ct.events("orders_events", key="id", max_attempts=1)
        events.prepare()
        batch = events.claim(2, owner="worker-1")
        assert batch is not None
        batch.fail("disk full", keys=[batch.keys[0]])
        batch.complete(keys=[batch.keys[1]])
        worklist = ct.worklist("weekly")
        worklist.populate([{"t": 1}, {"t": 2}], order=100)
        item = worklist.allocate("worker-1")
        assert item is not None
        item.fail("bad input")
        source = StatusSource(ct, events=[parse_event_spec("orders_events:id:id:created_at"),
                                          parse_event_spec("missing_events:id")], worklists=["weekly"])
        response = TestClient(create_app(source)).get("/metrics")
        assert response.status_code == 200
        yield response.text
    finally:
        ct.close()


def test_metrics_pass_promtool_check_metrics(promtool: str, metrics_text: str) -> None:
    got = _run(promtool, "check", "metrics", stdin=metrics_text)
    assert got.returncode == 0 and not (got.stdout + got.stderr).strip(), got.stdout + got.stderr
    assert 'controltable_events_rows{state="error",table="orders_events"} 1.0' in metrics_text
    assert 'controltable_events_readable{table="missing_events"} 0.0' in metrics_text


def _exported(metrics_text: str) -> set[str]:
    names = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            names.update({"counter": [f"{name}_total"], "histogram": [f"{name}_bucket", f"{name}_sum",
                                                                       f"{name}_count"]}.get(kind, []))
    return names


def test_the_rules_and_the_dashboard_read_metrics_that_exist(metrics_text: str) -> None:
    exported = _exported(metrics_text)
    in_rules = set(_METRIC.findall(" ".join(rule["expr"] for rule in _alerts())))
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    in_dashboard = set(_METRIC.findall(" ".join(exprs)))
    assert in_rules and not in_rules - exported, f"rules read metrics /metrics does not export: {in_rules - exported}"
    assert not in_dashboard - exported, f"the dashboard reads unknown metrics: {in_dashboard - exported}"
    families = {name for name in exported if not name.endswith(("_total", "_bucket", "_sum", "_count"))}
    shown = {name for name in families if any(name in m for m in in_dashboard)}
    assert shown == families, f"families the dashboard does not show: {families - shown}"


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "controltable" and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] not in ("row", "alertlist"):
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["description"], f"panel {p['title']!r} says nothing about what it shows"
