"""`controltable history`: the grant history on the command line, as a table and as JSON."""

from __future__ import annotations

import json
import subprocess

from support import cli

from controltable import ControlTable


def run(url: str, namespace: str, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """``controltable ARGS`` in this process (support/cli.py)."""
    return cli.run(*args, env={"CONTROLTABLE_URL": url, "CONTROLTABLE_NAMESPACE": namespace}, columns=columns)


def test_history_table_json_since_and_unknown_resource(backend_url: str, namespace: str) -> None:
    ct = ControlTable(backend_url, namespace=namespace)
    try:
        ct.install()
        ct.set_capacity("warehouse", 1)
        ct.set_capacity("api", 2)
        ct.acquire("warehouse", holder="nightly-load", timeout=0).release()
        ct.acquire("warehouse", holder="report-refresh", timeout=0, priority=5)  # still held
        ct.acquire("api", holder="export-job", timeout=0).release()
    finally:
        ct.close()

    table = run(backend_url, namespace, "history")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "controltable history" in table.stdout and "outcome" in table.stdout and "priority" in table.stdout
    held = next(line for line in lines if "report-refresh" in line)
    assert "held" in held and "warehouse" in held
    assert "released" in next(line for line in lines if "nightly-load" in line)
    assert "export-job" in table.stdout

    one = run(backend_url, namespace, "history", "warehouse", "--json")
    assert one.returncode == 0, one.stderr
    records = json.loads(one.stdout)
    assert [r["holder"] for r in records] == ["report-refresh", "nightly-load"]  # newest first
    assert [r["outcome"] for r in records] == ["held", "released"]
    assert records[0]["token"] > records[1]["token"] and records[0]["priority"] == 5

    narrow = run(backend_url, namespace, "history", "warehouse", columns=80)
    assert narrow.returncode == 0 and "report-refresh" in narrow.stdout
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80

    assert json.loads(run(backend_url, namespace, "history", "--since", "0.001", "--json").stdout) == []
    assert "no grants in the last 0.001" in run(backend_url, namespace, "history", "--since", "0.001").stdout
    assert len(json.loads(run(backend_url, namespace, "history", "--limit", "1", "--json").stdout)) == 1

    missing = run(backend_url, namespace, "history", "warehuose")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = run(backend_url, namespace, "history", "--since", "soon")
    assert bad.returncode == 2 and "duration" in bad.stderr
