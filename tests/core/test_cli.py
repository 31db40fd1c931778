"""The ``controltable`` command: its commands in-process (click's runner, the same entry and exit statuses), and as
a real ``python -m controltable.cli`` process where the process is the point (exit statuses, signals, a child's
output, standard input's bytes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import cli
from support.live import wait_until

from controltable import ControlTable

CLI = [sys.executable, "-m", "controltable.cli"]


def run(url: str, namespace: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``controltable ARGS`` in this process (support/cli.py), on ``url`` in ``namespace``."""
    return cli.run(*args, env={"CONTROLTABLE_URL": url, "CONTROLTABLE_NAMESPACE": namespace}, input=input)


def run_process(
    url: str, namespace: str, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m controltable.cli ARGS`` as a real process, for what only a process shows."""
    env = dict(os.environ, CONTROLTABLE_URL=url, CONTROLTABLE_NAMESPACE=namespace, COLUMNS="200")
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, input=input, timeout=timeout)


def test_init_capacity_status_acquire_release(backend_url: str, namespace: str) -> None:
    assert run(backend_url, namespace, "init").returncode == 0
    assert run(backend_url, namespace, "capacity", "set", "warehouse", "2").returncode == 0
    got = run(backend_url, namespace, "acquire", "warehouse", "--holder", "nightly", "--timeout", "0")
    assert got.returncode == 0 and int(got.stdout.strip()) >= 1
    st = run(backend_url, namespace, "status")
    assert st.returncode == 0 and "warehouse" in st.stdout and "nightly" in st.stdout and "holding" in st.stdout
    data = json.loads(run(backend_url, namespace, "status", "--json").stdout)
    assert data[0]["name"] == "warehouse" and data[0]["used"] == 1
    # A shared slot by default: a second holder fits beside the first; an exclusive one does not.
    second = run(backend_url, namespace, "acquire", "warehouse", "--holder", "second", "--timeout", "0")
    assert second.returncode == 0 and int(second.stdout.strip()) > int(got.stdout.strip())
    busy = run(backend_url, namespace, "acquire", "warehouse", "--holder", "other", "--exclusive", "--timeout", "0")
    assert busy.returncode == 3 and "not granted" in busy.stderr
    assert run(backend_url, namespace, "release", "warehouse", "--holder", "second").returncode == 0
    assert run(backend_url, namespace, "renew", "warehouse", "--holder", "nightly").returncode == 0
    assert run(backend_url, namespace, "release", "warehouse", "--holder", "nightly").returncode == 0
    again = run(backend_url, namespace, "release", "warehouse", "--holder", "nightly")
    assert again.returncode == 6 and "held nothing" in again.stderr
    listing = run(backend_url, namespace, "capacity", "list")
    assert "warehouse" in listing.stdout
    assert run(backend_url, namespace, "capacity", "delete", "warehouse").returncode == 0
    assert run(backend_url, namespace, "capacity", "delete", "warehouse").returncode == 2


def test_bad_input_exit_codes(backend_url: str, namespace: str) -> None:
    """The exit statuses as a shell sees them: a real ``python -m controltable.cli`` process each."""
    run_process(backend_url, namespace, "init")
    unknown = run_process(backend_url, namespace, "acquire", "nope", "--holder", "h", "--timeout", "0")
    assert unknown.returncode == 2 and "set_capacity" in unknown.stderr
    zero = run_process(backend_url, namespace, "capacity", "set", "w", "0")
    assert zero.returncode == 2 and "at least 1" in zero.stderr
    down = run_process("mysql+pymysql://nobody@127.0.0.1:1/x", namespace, "status")
    assert down.returncode == 4 and "cannot reach" in down.stderr
    assert "Traceback" not in unknown.stderr + zero.stderr + down.stderr


def test_run_holds_the_slot_and_passes_the_exit_code(backend_url: str, namespace: str, tmp_path: Path) -> None:
    run(backend_url, namespace, "init")
    run(backend_url, namespace, "capacity", "set", "db", "1")
    marker, done = tmp_path / "inside", tmp_path / "done"
    # The command runs until the test has looked (a fixed 1.5 s once ended before a loaded machine's
    # status call); its own wait is bounded (a hang detector: exit 9, not 7).
    script = (f"import pathlib,sys,time; pathlib.Path({str(marker)!r}).write_text('x'); end = time.time() + 300\n"
              f"while not pathlib.Path({str(done)!r}).exists() and time.time() < end: time.sleep(0.05)\n"
              f"sys.exit(7 if pathlib.Path({str(done)!r}).exists() else 9)")
    result: dict[str, subprocess.CompletedProcess[str]] = {}
    t = threading.Thread(target=lambda: result.setdefault("r", run_process(
        backend_url, namespace, "run", "--resource", "db", "--holder", "job", "--lease", "30", "--",
        sys.executable, "-c", script)))
    t.start()
    wait_until(marker.exists, 60, "the command to start under the slot", interval=0.05)
    ct = ControlTable(backend_url, namespace=namespace)
    try:
        (st,) = ct.status(["db"])
    finally:
        done.touch()
    assert [h.holder for h in st.holders] == ["job"], "the slot is held while the command runs"
    t.join(300)
    assert result["r"].returncode == 7
    assert ct.status(["db"])[0].holders == []


def test_run_releases_when_terminated(backend_url: str, namespace: str, tmp_path: Path) -> None:
    run(backend_url, namespace, "init")
    run(backend_url, namespace, "capacity", "set", "db", "1")
    marker = tmp_path / "inside"
    env = dict(os.environ, CONTROLTABLE_URL=backend_url, CONTROLTABLE_NAMESPACE=namespace)
    script = f"import pathlib,time; pathlib.Path({str(marker)!r}).write_text('x'); time.sleep(60)"
    proc = subprocess.Popen([*CLI, "run", "--resource", "db", "--", sys.executable, "-c", script], env=env)
    wait_until(marker.exists, 60, "the command to start under the slot", interval=0.05)
    proc.terminate()
    assert proc.wait(30) != 0
    ct = ControlTable(backend_url, namespace=namespace)
    assert ct.status(["db"])[0].holders == []


@pytest.mark.backends("sqlite")
def test_sql_prints_hints_for_mssql(backend_url: str, namespace: str) -> None:
    out = run(backend_url, namespace, "sql", "--dialect", "mssql")
    assert out.returncode == 0
    assert "WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK)" in out.stdout and "CREATE TABLE ct_request" in out.stdout


def test_events_and_worklist_commands(backend_url: str, namespace: str, tmp_path: Path) -> None:
    from sqlalchemy import Column, Integer, MetaData, String, Table

    run(backend_url, namespace, "init")
    ct = ControlTable(backend_url, namespace=namespace)
    name = f"ev_{namespace[-8:]}"
    md = MetaData()
    t = Table(name, md, Column("id", Integer, primary_key=True), Column("v", String(10)))
    md.create_all(ct.engine)
    try:
        with ct.engine.begin() as conn:
            conn.execute(t.insert(), [{"id": i, "v": "x"} for i in range(1, 11)])
        dry = run(backend_url, namespace, "events", "prepare", name, "--key", "id", "--dry-run")
        assert dry.returncode == 0 and "ALTER TABLE" in dry.stdout
        assert run(backend_url, namespace, "events", "prepare", name, "--key", "id").returncode == 0
        stats = json.loads(run(backend_url, namespace, "events", "stats", name, "--key", "id", "--json").stdout)
        assert stats["pending"] == 10
        assert run(backend_url, namespace, "events", "retry-errors", name, "--key", "id").returncode == 0
    finally:
        md.drop_all(ct.engine)

    wl = f"wl_{namespace[-8:]}"
    lines = "\n".join(json.dumps({"n": i}) for i in range(5))
    assert run(backend_url, namespace, "worklist", "populate", wl, "--order", "100", input=lines).returncode == 0
    (tmp_path / "later.json").write_text(json.dumps([{"n": 99}]))
    assert run(backend_url, namespace, "worklist", "populate", wl, "--order", "200",
               "--file", str(tmp_path / "later.json")).returncode == 0
    bad = run(backend_url, namespace, "worklist", "populate", wl, input="{not json")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr
    handle = json.loads(run(backend_url, namespace, "worklist", "allocate", wl, "--owner", "sh").stdout)
    assert handle["order"] == 100
    assert run(backend_url, namespace, "worklist", "complete", wl, str(handle["id"]),
               "--token", str(handle["token"])).returncode == 0
    again = run(backend_url, namespace, "worklist", "complete", wl, str(handle["id"]), "--token", str(handle["token"]))
    assert again.returncode == 6
    handle = json.loads(run(backend_url, namespace, "worklist", "allocate", wl).stdout)
    assert run(backend_url, namespace, "worklist", "fail", wl, str(handle["id"]), "--reason", "boom").returncode == 0
    status = run(backend_url, namespace, "worklist", "status", wl)
    assert "200" in status.stdout and "blocked" not in status.stdout  # other order-100 items are still new
    assert run(backend_url, namespace, "worklist", "clear-errors", wl).returncode == 0
    assert run(backend_url, namespace, "worklist", "reset", wl).returncode == 0
    assert run(backend_url, namespace, "worklist", "drop", wl, "--yes").returncode == 0
    assert run(backend_url, namespace, "worklist", "allocate", wl).returncode == 5


def test_policies_from_the_command_line(backend_url: str, namespace: str) -> None:
    """capacity set --rate/--aging, acquire --priority, status "waits behind", stats as a table and JSON."""
    run(backend_url, namespace, "init")
    made = run(backend_url, namespace, "capacity", "set", "api", "1", "--rate", "100/60s", "--aging", "30")
    assert made.returncode == 0 and "rate 100/60s" in made.stdout and "aging 30s" in made.stdout
    kept = run(backend_url, namespace, "capacity", "set", "api", "2")
    assert "rate 100/60s" in kept.stdout  # left out: kept
    assert "rate" not in run(backend_url, namespace, "capacity", "set", "api", "1", "--rate", "none").stdout
    bad = run(backend_url, namespace, "capacity", "set", "api", "1", "--rate", "fast")
    assert bad.returncode == 2 and "COUNT/PERIOD" in bad.stderr
    assert run(backend_url, namespace, "acquire", "api", "--holder", "first", "--timeout", "0").returncode == 0
    ct = ControlTable(backend_url, namespace=namespace)
    assert ct.try_acquire("api", holder="low-waiter") is None
    assert ct.try_acquire("api", holder="high-waiter", priority=7) is None
    st = run(backend_url, namespace, "status", "api")
    assert st.returncode == 0 and "aging 30s" in st.stdout
    high_line = next(line for line in st.stdout.splitlines() if "high-waiter" in line)
    low_line = next(line for line in st.stdout.splitlines() if "low-waiter" in line)
    assert "waiting #1" in high_line and "first" in high_line
    assert "waiting #2" in low_line and "first, high-waiter" in low_line
    data = json.loads(run(backend_url, namespace, "status", "--json", "api").stdout)
    assert data[0]["aging"] == 30.0 and data[0]["waiters"][1]["ahead"] == ["first", "high-waiter"]
    ct.release("api", "low-waiter")
    ct.release("api", "high-waiter")
    ct.close()
    late = run(backend_url, namespace, "acquire", "api", "--holder", "urgent", "--priority", "9", "--timeout", "0.5")
    assert late.returncode == 3  # "first" still holds the only slot
    assert run(backend_url, namespace, "release", "api", "--holder", "first").returncode == 0
    # A real process: ``run`` hands its COMMAND the process's own standard output.
    ran = run_process(backend_url, namespace, "run", "--resource", "api", "--priority", "3", "--", sys.executable,
                      "-c", "print('ran')")
    assert ran.returncode == 0 and "ran" in ran.stdout
    table = run(backend_url, namespace, "stats", "--window", "1h")
    assert table.returncode == 0 and "api" in table.stdout and "wait p95" in table.stdout
    (stats,) = json.loads(run(backend_url, namespace, "stats", "api", "--json").stdout)
    assert stats["resource"] == "api" and stats["grants"] == 2 and stats["capacity"] == 1
    missing = run(backend_url, namespace, "stats", "nope")
    assert missing.returncode == 2


def test_populate_from_a_file_that_cannot_be_read_or_decoded(backend_url: str, namespace: str, tmp_path: Path) -> None:
    """Bad input files are usage errors (exit 2) that say what is wrong, never "a bug in controltable"."""
    assert run(backend_url, namespace, "init").returncode == 0
    missing = run(backend_url, namespace, "worklist", "populate", "wl", "--file", "/nonexistent.json")
    assert missing.returncode == 2, missing.stderr
    assert "cannot read /nonexistent.json" in missing.stderr and "No such file" in missing.stderr
    assert "a bug in controltable" not in missing.stderr
    directory = run(backend_url, namespace, "worklist", "populate", "wl", "--file", str(tmp_path))
    assert directory.returncode == 2 and "cannot read" in directory.stderr
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('[{"city": "Zürich"}]'.encode("latin-1"))
    bad = run(backend_url, namespace, "worklist", "populate", "wl", "--file", str(latin1))
    assert bad.returncode == 2, bad.stderr
    assert "is not UTF-8 text" in bad.stderr and "offset 12" in bad.stderr and "save it as UTF-8" in bad.stderr
    assert "a bug in controltable" not in bad.stderr
    piped = subprocess.run([*CLI, "worklist", "populate", "wl"], input=b'{"n": "\xff"}\n', capture_output=True,
                           env=dict(os.environ, CONTROLTABLE_URL=backend_url, CONTROLTABLE_NAMESPACE=namespace),
                           timeout=120)
    assert piped.returncode == 2 and b"- is not UTF-8 text" in piped.stderr
    nothing = json.loads(run(backend_url, namespace, "worklist", "status", "wl", "--json").stdout)
    assert nothing["orders"] == []  # nothing was added
    # A UTF-8 file (with a byte order mark, as some editors write) is read as given.
    good = tmp_path / "good.json"
    good.write_bytes('\ufeff[{"city": "Zürich 🙂"}]'.encode())
    ok = run(backend_url, namespace, "worklist", "populate", "wl", "--file", str(good))
    assert ok.returncode == 0 and "added 1 items" in ok.stdout
    assert ControlTable(backend_url, namespace=namespace).worklist("wl").items_list()[0]["payload"] == {
        "city": "Zürich 🙂"}


def test_exit_codes_of_the_database_setup_errors() -> None:
    """A pooler in the way or a server at its connection limit is a database problem (exit 4), not bad input."""
    from controltable import ConfigurationError, PoolerError, TooManyConnectionsError
    from controltable.cli.group import _exit_code
    from controltable.errors import EXIT_DATABASE, EXIT_USAGE

    assert _exit_code(PoolerError("pooler")) == EXIT_DATABASE
    assert _exit_code(TooManyConnectionsError("limit")) == EXIT_DATABASE
    assert _exit_code(ConfigurationError("bad input")) == EXIT_USAGE
