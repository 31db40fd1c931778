"""First steps of a new user with the ``controltable`` command, each a paper cut that was fixed.

Run on SQLite files in a temporary directory (the working directory matters: the default database is relative
to it), in-process (support/cli.py) but for ``--version`` and the demo (worker processes), which run as real
``python -m controltable.cli`` processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import cli as in_process

import controltable
from controltable import ControlTable, ControlTableError
from controltable.cli.output import percent

CLI = [sys.executable, "-m", "controltable.cli"]
READ_ONLY_COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["stats"],
    ["history"],
    ["doctor"],
    ["capacity", "list"],
    ["events", "stats", "rainfall_events", "--key", "event_id"],
    ["worklist", "status", "weekly"],
    ["reap"],
    ["release", "warehouse", "--holder", "h"],
]


def cli(cwd: Path, *args: str, url: str | None = None, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """``controltable ARGS`` in ``cwd``, in this process, with no ``CONTROLTABLE_*`` variable but ``url``."""
    env = in_process.without_controltable_env(CONTROLTABLE_URL=url)
    return in_process.run(*args, env=env, cwd=cwd, columns=columns)


def cli_process(cwd: Path, *args: str, url: str | None = None, columns: int = 200,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m controltable.cli ARGS`` as a real process in ``cwd``, for what only a process shows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLTABLE_")}
    env["COLUMNS"] = str(columns)
    if url is not None:
        env["CONTROLTABLE_URL"] = url
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_version_is_the_installed_release(tmp_path: Path) -> None:
    got = cli_process(tmp_path, "--version")
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"controltable {controltable.__version__}"
    assert not list(tmp_path.iterdir())  # --version opens no database


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
def test_a_command_without_the_database_refuses_and_creates_nothing(tmp_path: Path, command: list[str]) -> None:
    got = cli(tmp_path, *command)
    assert got.returncode == 4, (got.stdout, got.stderr)
    message = " ".join(got.stderr.split())  # rich wraps long lines
    assert str(tmp_path / "controltable.db") in message and "controltable init" in message
    assert "Traceback" not in got.stderr
    assert not list(tmp_path.iterdir()), "a command other than init created the database"


def test_init_prints_the_absolute_database_path_that_other_directories_then_use(tmp_path: Path) -> None:
    got = cli(tmp_path, "init")
    assert got.returncode == 0, got.stderr
    database = tmp_path / "controltable.db"
    assert database.exists()
    assert f"database file: {database}" in got.stdout
    assert f"CONTROLTABLE_URL=sqlite:///{database}" in " ".join(got.stdout.split())
    elsewhere = tmp_path / "cron"
    elsewhere.mkdir()
    assert cli(elsewhere, "capacity", "set", "warehouse", "2", url=f"sqlite:///{database}").returncode == 0
    assert "warehouse" in cli(tmp_path, "status").stdout  # the same control table, seen from the first directory


def test_run_checks_the_command_before_queueing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ct.db'}"
    assert cli(tmp_path, "init", url=url).returncode == 0
    assert cli(tmp_path, "capacity", "set", "warehouse", "1", url=url).returncode == 0
    not_executable = tmp_path / "load.sh"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    for program, why in (("./missing.sh", "no such file"), ("no-such-program-4711", "not found on PATH"),
                         ("./load.sh", "not executable"), (str(tmp_path), "directory")):
        got = cli(tmp_path, "run", "--resource", "warehouse", "--timeout", "5", "--", program, url=url)
        assert got.returncode == 127, (program, got.stdout, got.stderr)
        assert why in got.stderr and "nothing was queued" in " ".join(got.stderr.split())
    ct = ControlTable(url)
    try:
        (stats,) = ct.stats(["warehouse"])
        assert stats.grants == 0  # no grant was made and recorded for a command that could not start
        lease = ct.acquire("warehouse", holder="first", timeout=5)
        assert lease.token == 1  # no fencing token was spent either
        lease.release()
    finally:
        ct.close()
    not_executable.chmod(0o755)
    assert cli(tmp_path, "run", "--resource", "warehouse", "--", "./load.sh", url=url).returncode == 0


def test_utilisation_keeps_small_values_visible() -> None:
    assert percent(None) == ""
    assert percent(0.0) == "0 %"
    assert percent(0.0014) == "0.14 %"
    assert percent(0.00001) == "<0.01 %"
    assert percent(0.035) == "3.5 %"
    assert percent(0.42) == "42 %"
    assert percent(1.0) == "100 %"


def test_stats_prints_a_short_hold_as_a_small_percentage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ct.db'}"
    ct = ControlTable(url)
    try:
        ct.install()
        ct.set_capacity("warehouse", 2)
        lease = ct.acquire("warehouse", holder="brief", timeout=5)
        time.sleep(0.3)
        lease.release()
    finally:
        ct.close()
    got = cli(tmp_path, "stats", "warehouse", url=url)
    assert got.returncode == 0, got.stderr
    line = next(line for line in got.stdout.splitlines() if "warehouse" in line)
    figure = re.search(r"(<?[0-9.]+) %", line)
    assert figure is not None, line
    assert figure.group(1) != "0", line  # a hold of a few milliseconds is not rounded away to "0%"


def test_status_fits_the_columns_it_is_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ct.db'}"
    long_holder = "airflow/dag_nightly_load/run-2026-11-25T02:00:00/task_load_orders"
    ct = ControlTable(url)
    try:
        ct.install()
        ct.set_capacity("warehouse", 1, aging=30)
        ct.acquire("warehouse", holder=long_holder, timeout=5)
        assert ct.try_acquire("warehouse", holder="writer-x", mode="exclusive") is None
        assert ct.try_acquire("warehouse", holder="reader-y", priority=3) is None
    finally:
        ct.close()
    for columns in (80, 100, 160):
        got = cli(tmp_path, "status", url=url, columns=columns)
        assert got.returncode == 0, got.stderr
        lines = got.stdout.splitlines()
        assert max(len(line) for line in lines) <= columns, got.stdout
        flat = "|".join(_columns_read_back(lines))
        for text in (long_holder, "writer-x", "reader-y", "waiting#1", "waiting#2", "1/1", "exclusive", "aging30s"):
            assert text in flat, (columns, text, got.stdout)


def _columns_read_back(lines: list[str]) -> list[str]:
    """Each column's text, its folded lines joined again (whitespace dropped), from a printed table."""
    header = next(i for i, line in enumerate(lines) if "resource" in line and "holder" in line)
    body = [line for line in lines[header:] if line.strip() and not set(line.strip()) <= set("─━┏┓┗┛┡┩└┘┳┻╇┴┬┼")]
    if "│" in body[1] or "┃" in body[0]:
        cells = [re.split("[│┃]", line)[1:-1] for line in body]
    else:
        starts = [m.start() for m in re.finditer(r"(?<!\S)\S", lines[header]) if m.start() == 0
                  or lines[header][m.start() - 2:m.start()] == "  "]
        bounds = [*starts[1:], None]
        cells = [[line[a:b] for a, b in zip(starts, bounds)] for line in body]
    return ["".join("".join(row[i].split()) for row in cells[1:] if i < len(row)) for i in range(len(cells[0]))]


def test_a_missing_event_table_is_one_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ct.db'}"
    ct = ControlTable(url)
    try:
        ct.install()
        with pytest.raises(ControlTableError, match="does not exist") as caught:
            ct.events("rainfall_events", key="event_id").prepare()
        assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained traceback
    finally:
        ct.close()
    got = cli(tmp_path, "events", "prepare", "rainfall_events", "--key", "event_id", url=url)
    assert got.returncode == 2
    assert got.stderr.startswith("error:") and "Traceback" not in got.stderr
    assert "rainfall_events" in got.stderr and "create the table" in " ".join(got.stderr.split())


def test_status_json_names_the_modes_as_stored(tmp_path: Path) -> None:
    """JSON output says what the tables store and the tables and options say: one word, "shared"."""
    url = f"sqlite:///{tmp_path / 'ct.db'}"
    ct = ControlTable(url)
    try:
        ct.install()
        ct.set_capacity("warehouse", 2)
        ct.acquire("warehouse", holder="h", mode="shared", timeout=5)
    finally:
        ct.close()
    data = json.loads(cli(tmp_path, "status", "--json", url=url).stdout)
    assert data[0]["holders"][0]["mode"] == "shared"


def test_the_demo_fits_80_columns_in_whole_sentences(tmp_path: Path) -> None:
    got = cli_process(tmp_path, "--url", "sqlite:///demo.db", "demo", "--workers", "2", "--rounds", "4",
              "--events", "100", columns=80, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    lines = got.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, got.stdout
    prose = [line.rstrip() for line in lines if line.strip() and not re.search(r"[━┃│┏┗┡└]", line)
             and not line.strip().endswith(("per worker", "summary"))]
    assert prose[0].startswith("controltable demo on sqlite:")
    for line in prose[1:]:
        assert line.endswith((".", ",", ":", "demo passed")), f"a sentence was cut at 80 columns: {line!r}"
    assert any(line.startswith("queue") for line in lines)  # what headed the queue, or that it drained


def test_the_demo_says_what_heads_the_queue() -> None:
    from types import SimpleNamespace

    from controltable.demo import queue_line

    def entry(position: int, mode: str, expired: bool = False) -> SimpleNamespace:
        return SimpleNamespace(position=position, mode=mode, expired=expired)

    st = SimpleNamespace(used=1, waiters=[entry(2, "shared"), entry(1, "exclusive"), entry(3, "shared")])
    assert queue_line(st, 2) == "in use 1/2, waiting  3, an exclusive request heads the queue"
    st = SimpleNamespace(used=2, waiters=[entry(1, "shared", expired=True), entry(2, "shared")])
    assert queue_line(st, 2) == "in use 2/2, waiting  1, a shared request heads the queue"
    assert queue_line(SimpleNamespace(used=0, waiters=[]), 2) == "in use 0/2, waiting  0"
