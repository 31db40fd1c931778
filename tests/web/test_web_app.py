"""The status page's JSON, /metrics and actions against live control tables (SQLite, PostgreSQL, MariaDB).

Everything is read from real holders, waiters, event rows and work items made through the public
API; the Prometheus output is parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert

from controltable import ControlTable
from controltable.cli.group import cli
from controltable.errors import ConfigurationError
from controltable.web import StatusSource, create_app, parse_event_spec

warnings.filterwarnings("ignore", message=".*httpx.*")
from starlette.testclient import TestClient  # noqa: E402

TOKEN = "s3cret-token-for-the-tests"


@pytest.fixture
def event_table(ct: ControlTable) -> Iterator[Table]:
    """An event table of 5 rows with a time column; row 1 ends in the error state, row 2 done."""
    table = Table(f"web_ev_{ct.namespace}", MetaData(), Column("id", Integer, primary_key=True, autoincrement=False),
                  Column("created_at", Float(53), nullable=False), Column("body", String(50)))
    table.create(ct.engine)
    now = ct.now()
    with ct.engine.begin() as conn:
        conn.execute(insert(table), [{"id": i, "created_at": now - 100 * i, "body": f"e{i}"} for i in range(1, 6)])
    ev = ct.events(table.name, key="id", order_by="id", max_attempts=1)
    ev.prepare()
    batch = ev.claim(2, owner="web-test")
    assert batch is not None and batch.keys == [1, 2]
    batch.fail("disk full on host 'a'", keys=[1])
    batch.complete(keys=[2])
    try:
        yield table
    finally:
        table.drop(ct.engine, checkfirst=True)


#: Rounding of stored times against the database clock read apart (not machine speed).
CLOCK_SLACK = 0.01


@dataclass(frozen=True)
class Busy:
    """The ``busy`` set-up: its control table and when (database clock) its waiters queued."""

    ct: ControlTable
    #: Just before the first waiter (load-c) queued, and just after it had: its wait began in between.
    queued_after: float
    queued_before: float

    def oldest_wait_bounds(self, first_now: float, last_now: float) -> tuple[float, float]:
        """The oldest wait a snapshot read between ``first_now`` and ``last_now`` can show: load-c's."""
        return first_now - self.queued_before - CLOCK_SLACK, last_now - self.queued_after + CLOCK_SLACK


@pytest.fixture
def busy(ct: ControlTable) -> Iterator[Busy]:
    """Resource ``wh`` (capacity 2) held by two holders with two waiters behind; ``idle`` with nobody."""
    ct.set_capacity("wh", 2)
    ct.set_capacity("idle", 3)
    ct.acquire("wh", holder="load-a", lease=120)
    ct.acquire("wh", holder="load-b", lease=120)
    queued_after = ct.now()
    assert ct.try_acquire("wh", holder="load-c", waiter_ttl=120) is None
    queued_before = ct.now()
    assert ct.try_acquire("wh", holder="load-d", mode="exclusive", waiter_ttl=120) is None
    yield Busy(ct, queued_after, queued_before)
    ct.release_holders("load-")


def client(ct: ControlTable, **kw: Any) -> TestClient:
    source = StatusSource(ct, events=kw.pop("events", ()), worklists=kw.pop("worklists", ()))
    return TestClient(create_app(source, **kw))


def test_status_json_shows_holders_waiters_events_and_worklists(busy: Busy, event_table: Table) -> None:
    ct = busy.ct
    wl = ct.worklist("nightly")
    wl.populate([{"t": 1}, {"t": 2}], order=1)
    wl.populate([{"t": 3}], order=2)
    item = wl.allocate("worker-7")
    assert item is not None
    c = client(ct, events=[parse_event_spec(f"{event_table.name}:id:id:created_at")], worklists=["nightly"])
    data = c.get("/api/status").json()
    assert data["namespace"] == ct.namespace
    wh = {r["name"]: r for r in data["resources"]}["wh"]
    assert (wh["capacity"], wh["used"]) == (2, 2)
    assert [h["holder"] for h in wh["holders"]] == ["load-a", "load-b"]
    assert all(h["token"] and h["expires_in"] > 60 and h["since"] for h in wh["holders"])
    assert [(w["holder"], w["position"], w["mode"]) for w in wh["waiters"]] == [
        ("load-c", 1, "shared"), ("load-d", 2, "exclusive")]
    # FIFO: the second waiter waits behind both holders and the first waiter.
    assert wh["waiters"][1]["ahead"] == ["load-a", "load-b", "load-c"]
    # The oldest wait is load-c's, queued in the set-up, on the database clock of the snapshot.
    low, high = busy.oldest_wait_bounds(data["now"], data["now"])
    assert wh["oldest_wait"] is not None and low <= wh["oldest_wait"] <= high, (low, wh["oldest_wait"], high)
    assert wh["oldest_wait"] == pytest.approx(data["now"] - wh["waiters"][0]["since"], abs=1e-6)
    idle = {r["name"]: r for r in data["resources"]}["idle"]
    assert idle["holders"] == [] and idle["waiters"] == []
    assert wh["rate_opens_in"] is None and idle["rate_opens_in"] is None  # no rate limit

    (ev,) = data["events"]
    assert (ev["pending"], ev["done"], ev["error"]) == (3, 1, 1)
    assert ev["errors"] == [{"key": 1, "attempts": 1, "error": "disk full on host 'a'"}]
    assert ev["oldest_pending_key"] == 3 and 250 < ev["oldest_pending_age"] < 400

    (w,) = data["worklists"]
    assert (w["done"], w["total"], w["current_order"]) == (0, 3, 1)
    assert "order 2 waits for order 1" in w["blocker"] and "worker-7" in w["blocker"]


def test_status_json_says_when_a_spent_rate_window_opens(ct: ControlTable) -> None:
    """One grant per 60 s taken: the waiter behind it is told when the next grant can come."""
    ct.set_capacity("api", 3, rate=(1, 60.0))
    before = time.monotonic()
    ct.acquire("api", holder="first", timeout=0).release()
    assert ct.try_acquire("api", holder="second", waiter_ttl=120) is None  # capacity free, budget spent
    try:
        api = {r["name"]: r for r in client(ct).get("/api/status").json()["resources"]}["api"]
        # 60 s after the grant, less what has passed since (a loaded run took over 10 s here; 1 s of slack
        # for the clocks' resolution), never more than the window.
        since = time.monotonic() - before
        assert api["rate"]["count"] == 1 and 60 - since - 1 <= api["rate_opens_in"] <= 60, (api, since)
        assert [w["holder"] for w in api["waiters"]] == ["second"]
    finally:
        ct.release_holders("second")


def test_page_is_self_contained_and_relative(ct: ControlTable) -> None:
    c = client(ct)
    html = c.get("/").text
    assert '<base href="/">' in html and 'src="static/app.js"' in html
    # Nothing is loaded from another host; the only links out are the alerts' docs, opened apart.
    import re

    assert not re.search(r'<(script|link|img|iframe)[^>]*(src|href)="(https?:)?//', html), html
    assert "http://" not in html
    outside = re.findall(r'<a [^>]*href="https://[^"]*"[^>]*>', html)
    assert all('rel="noopener"' in a and "/docs/operations.md" in a for a in outside), outside
    resp = c.get("/static/app.js")
    assert resp.status_code == 200 and "api/status" in resp.text
    assert "default-src 'self'" in c.get("/").headers["content-security-policy"]
    # Mounted under a prefix (as in Airflow's api-server) the page points at its own prefix.
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = TestClient(Starlette(routes=[Mount("/controltable", app=create_app(StatusSource(ct)))]))
    assert '<base href="/controltable/">' in outer.get("/controltable/").text
    assert outer.get("/controltable/api/status").json()["namespace"] == ct.namespace


def test_metrics_parse_with_the_prometheus_parser(busy: Busy, event_table: Table) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    ct = busy.ct
    c = client(ct, events=[parse_event_spec(f"{event_table.name}:id::created_at")])
    before = ct.now()
    resp = c.get("/metrics")
    after = ct.now()
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    families = {}
    for family in text_string_to_metric_families(resp.text):
        families[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    res = (("resource", "wh"),)
    assert samples[("controltable_resource_capacity", res)] == 2
    assert samples[("controltable_resource_used_slots", res)] == 2
    assert samples[("controltable_resource_holders", res)] == 2
    assert samples[("controltable_resource_waiters", res)] == 2
    assert samples[("controltable_resource_waiters", (("resource", "idle"),))] == 0
    assert samples[("controltable_resource_grants_total", res)] == 2  # two fencing tokens handed out
    assert families["controltable_resource_grants"] == "counter"
    low, high = busy.oldest_wait_bounds(before, after)
    assert low <= samples[("controltable_resource_oldest_wait_seconds", res)] <= high
    assert samples[("controltable_resource_oldest_wait_seconds", (("resource", "idle"),))] == 0, "nobody waits"
    table = event_table.name
    assert samples[("controltable_events_rows", (("state", "pending"), ("table", table)))] == 3
    assert samples[("controltable_events_rows", (("state", "error"), ("table", table)))] == 1
    # Row 3 (created 300 s before the set-up) is the oldest pending one.
    assert 300 - CLOCK_SLACK <= samples[("controltable_events_oldest_pending_age_seconds", (("table", table),))] < 400
    assert families["controltable_resource_wait_seconds"] == "histogram"
    # The two grants of the last hour (load-a, load-b) were immediate: they waited nothing.
    assert samples[("controltable_resource_wait_seconds_count", res)] == 2
    assert samples[("controltable_resource_wait_seconds_sum", res)] == 0


def test_an_unreadable_event_table_is_reported_not_fatal(ct: ControlTable) -> None:
    ct.set_capacity("r", 1)
    c = client(ct, events=[parse_event_spec("no_such_table_here:id")])
    data = c.get("/api/status").json()
    assert data["resources"][0]["name"] == "r"
    assert "no_such_table_here" in data["events"][0]["problem"]
    assert "controltable_events_readable{table=\"no_such_table_here\"} 0.0" in c.get("/metrics").text


def test_actions_are_off_by_default_and_need_the_token(busy: Busy) -> None:
    ct = busy.ct
    assert client(ct).post("/api/release", json={"resource": "wh", "holder": "load-a"}).status_code in (404, 405)
    with pytest.raises(ConfigurationError, match="authentication"):
        create_app(StatusSource(ct), actions=True)
    with pytest.raises(ConfigurationError, match="at least 16"):
        create_app(StatusSource(ct), actions=True, token="guessable")
    c = client(ct, actions=True, token=TOKEN)
    assert c.post("/api/release", json={"resource": "wh", "holder": "load-a"}).status_code == 401
    wrong = {"Authorization": "Bearer " + TOKEN[:-1] + "x"}
    assert c.post("/api/release", json={"resource": "wh", "holder": "load-a"}, headers=wrong).status_code == 401
    ok = {"Authorization": f"Bearer {TOKEN}"}
    resp = c.post("/api/release", json={"resource": "wh", "holder": "load-a"}, headers=ok)
    assert resp.json() == {"ok": True, "released": 1}
    holders = [h.holder for h in ct.status(["wh"])[0].holders]
    assert "load-a" not in holders and "load-c" in holders  # the freed slot went to the next in line
    assert c.post("/api/capacity", json={"resource": "wh", "capacity": 0}, headers=ok).status_code == 400
    assert c.post("/api/capacity", json={"resource": "nope", "capacity": 2}, headers=ok).status_code == 400
    assert c.post("/api/capacity", json={"resource": "wh", "capacity": 5}, headers=ok).json()["capacity"] == 5
    assert ct.status(["wh"])[0].capacity == 5


@pytest.mark.backends("sqlite")
def test_serve_refuses_actions_without_a_token_and_bad_event_specs(backend_url: str, monkeypatch: Any) -> None:
    runner = CliRunner()
    monkeypatch.delenv("CONTROLTABLE_WEB_TOKEN", raising=False)
    assert runner.invoke(cli, ["--url", backend_url, "init"]).exit_code == 0
    result = runner.invoke(cli, ["--url", backend_url, "serve", "--actions"])
    assert result.exit_code == 2 and "CONTROLTABLE_WEB_TOKEN" in result.output
    result = runner.invoke(cli, ["--url", backend_url, "serve", "--events", "events;drop"])
    assert result.exit_code == 2 and "TABLE:KEY" in result.output
    result = runner.invoke(cli, ["--url", backend_url, "serve", "--events", "bad name:id"])
    assert result.exit_code == 2


def test_parse_event_spec() -> None:
    spec = parse_event_spec("raw.rainfall_events:event_id:seq:created_at")
    assert (spec.schema, spec.table, spec.key, spec.order_by, spec.time_column) == (
        "raw", "rainfall_events", "event_id", "seq", "created_at")
    assert parse_event_spec("ev:id").label == "ev"
    for bad in ("", "ev", "ev:", ":id", "ev:id:a:b:c", "e v:id", "ev:i-d", 'ev":id'):
        with pytest.raises(ConfigurationError):
            parse_event_spec(bad)


# -- on a network: a token, or the operator's explicit --allow-unauthenticated --------------------
@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("ct-status.example", False),
])
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    from controltable.web.serve import is_loopback

    assert is_loopback(host) is loopback


def _serve_cli(backend_url: str, monkeypatch: Any, *args: str) -> tuple[Any, list[dict[str, Any]]]:
    """``controltable serve ARGS`` with uvicorn.run recording what it was given instead of listening."""
    import uvicorn

    started: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append({"app": app, **kw}))
    result = CliRunner().invoke(cli, ["--url", backend_url, "serve", *args])
    return result, started


@pytest.mark.backends("sqlite")
def test_serve_beyond_loopback_needs_a_token_or_the_operators_word(backend_url: str, monkeypatch: Any) -> None:
    monkeypatch.delenv("CONTROLTABLE_WEB_TOKEN", raising=False)
    assert CliRunner().invoke(cli, ["--url", backend_url, "init"]).exit_code == 0
    refused, started = _serve_cli(backend_url, monkeypatch, "--host", "0.0.0.0")
    assert refused.exit_code == 2 and not started, refused.output
    text = " ".join(refused.output.split())
    assert "without authentication" in text and "CONTROLTABLE_WEB_TOKEN" in text and "--allow-unauthenticated" in text
    loopback, started = _serve_cli(backend_url, monkeypatch)  # the default 127.0.0.1: as before, no warning
    assert loopback.exit_code == 0 and started[0]["host"] == "127.0.0.1" and "WARNING" not in loopback.output
    meant, started = _serve_cli(backend_url, monkeypatch, "--host", "0.0.0.0", "--allow-unauthenticated")
    assert meant.exit_code == 0 and started[0]["host"] == "0.0.0.0", meant.output
    assert "WITHOUT AUTHENTICATION" in meant.output  # said loudly at start (stderr)
    assert TestClient(started[0]["app"]).get("/api/status").status_code == 200


@pytest.mark.backends("sqlite")
def test_with_a_token_every_request_needs_it(backend_url: str, monkeypatch: Any) -> None:
    import base64

    monkeypatch.setenv("CONTROLTABLE_WEB_TOKEN", TOKEN)
    assert CliRunner().invoke(cli, ["--url", backend_url, "init"]).exit_code == 0
    result, started = _serve_cli(backend_url, monkeypatch, "--host", "0.0.0.0")
    assert result.exit_code == 0 and "WARNING" not in result.output, result.output
    assert "token required for every request" in " ".join(result.output.split())
    c = TestClient(started[0]["app"])
    for path in ("/", "/api/status", "/metrics", "/static/app.js"):
        denied = c.get(path)
        assert denied.status_code == 401, path
        assert denied.headers["www-authenticate"].startswith("Basic"), path  # a browser asks for it
        assert c.get(path, headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"}).status_code == 401
        assert c.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        assert c.get(path, headers={"Authorization": f"Basic {basic}"}).status_code == 200, path
    assert c.get("/api/status", headers={"Authorization": "Basic !!notbase64"}).status_code == 401


def test_actions_take_the_bearer_token_and_json_only(busy: Busy) -> None:
    """A cross-site form can post ``text/plain`` with the browser's cached Basic login, never an
    ``Authorization: Bearer`` header nor ``application/json`` (that needs a CORS preflight): an
    action accepts neither Basic nor another content type, so such a form changes nothing."""
    import base64

    ct = busy.ct
    c = client(ct, actions=True, token=TOKEN, private=True)
    basic = {"Authorization": "Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode()}
    assert c.get("/api/status", headers=basic).status_code == 200  # reads still take the browser's login
    body = '{"resource": "wh", "holder": "load-a"}'
    forged = c.post("/api/release", content=body, headers={**basic, "Content-Type": "text/plain"})
    assert forged.status_code == 401, forged.text
    assert "Bearer" in forged.json()["error"]
    as_json = c.post("/api/release", content=body, headers={**basic, "Content-Type": "application/json"})
    assert as_json.status_code == 401, as_json.text
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    plain = c.post("/api/release", content=body, headers={**bearer, "Content-Type": "text/plain"})
    assert plain.status_code == 415 and "application/json" in plain.json()["error"], plain.text
    assert c.post("/api/capacity", content='{"resource": "wh", "capacity": 7}',
                  headers={**bearer, "Content-Type": "text/plain"}).status_code == 415
    assert "load-a" in [h.holder for h in ct.status(["wh"])[0].holders]
    assert ct.status(["wh"])[0].capacity == 2  # nothing changed so far
    ok = c.post("/api/release", content=body, headers={**bearer, "Content-Type": "application/json; charset=utf-8"})
    assert ok.json() == {"ok": True, "released": 1}


@pytest.mark.backends("sqlite")
def test_the_page_sends_actions_with_the_bearer_token_it_was_given(ct: ControlTable) -> None:
    """Actions refuse the browser's Basic login, so the page must send the token typed into its
    field as a Bearer header, as JSON, and never post without one."""
    script = client(ct).get("/static/app.js").text
    act = script[script.index("async function act("):]
    act = act[:act.index("\n  }\n")]
    assert '"Authorization"] = "Bearer " + token' in act
    assert '"Content-Type": "application/json"' in act
    assert act.index("if (!token)") < act.index("fetch(")  # no request without the token


def test_idle_resources_follow_the_active_ones_without_chart_series(busy: Busy) -> None:
    """`idle` (nobody holding or waiting, no grant in the last hour) comes after the active ones and
    gets no chart series; a resource granted within the hour stays active after its release."""
    ct = busy.ct
    ct.set_capacity("aa_recent", 1)
    ct.acquire("aa_recent", holder="quick").release()
    ct.set_capacity("ab_never", 1)
    data = client(ct).get("/api/status").json()
    order = [(r["name"], r["active"]) for r in data["resources"]]
    assert order == [("aa_recent", True), ("wh", True), ("ab_never", False), ("idle", False)], order
    assert set(data["stats"]["series"]) == {"aa_recent", "wh"}
