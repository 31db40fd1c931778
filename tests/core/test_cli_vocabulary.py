"""The CLI's words: ``worklist release`` (the one name: no ``free``), ``--table-schema``, "shared"."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import pytest
from click.testing import CliRunner

import controltable
from controltable.cli.group import cli
from controltable.errors import EXIT_USAGE, ConfigurationError


def test_cli_release_command_gives_the_item_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    runner = CliRunner()

    def run(*args: str, input: Optional[str] = None) -> Any:
        return runner.invoke(cli, ["--url", url, "--namespace", "vocab", *args], input=input, catch_exceptions=False)

    assert run("init").exit_code == 0
    assert run("worklist", "populate", "w", input="[1, 2]").exit_code == 0
    with controltable.ControlTable(url, namespace="vocab") as ct:
        item = ct.worklist("w").allocate("sh")
        assert item is not None
        got = run("worklist", "release", "w", str(item.id), "--token", str(item.token))
        assert got.exit_code == 0, got.output
        assert ct.worklist("w").status().total("new") == 2
    assert run("worklist", "free", "w", "1").exit_code == EXIT_USAGE, "one name per command: no old `free`"
    # --table-schema is taken: the command looks for the table in that schema (and says it is missing).
    missing = run("events", "stats", "nope", "--key", "id", "--table-schema", "main")
    assert missing.exit_code == EXIT_USAGE and "No such option" not in missing.output, missing.output
    assert "event table 'main.nope' does not exist" in missing.output, missing.output


# -- one word per mode: "shared" / "exclusive" everywhere ---------------------------------------
ROOT = Path(__file__).resolve().parents[2]
#: Every surface a user reads: the docs, the README, the CLI, the status page, the plugins' sources.
SURFACES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "core" / "src" / "controltable").rglob("*.py")),
            *sorted((ROOT / "core" / "src" / "controltable" / "web").rglob("*.js")),
            *sorted((ROOT / "core" / "src" / "controltable" / "web").rglob("*.html")),
            *sorted((ROOT / "airflow_plugin" / "src").rglob("*.py")),
            *sorted((ROOT / "dagster_plugin" / "src").rglob("*.py"))]


def test_the_shared_mode_has_one_name_in_every_option_output_and_doc(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["--url", url, *args], catch_exceptions=False)

    assert run("init").exit_code == 0
    assert run("capacity", "set", "warehouse", "4").exit_code == 0
    assert "--shared / --exclusive" in run("acquire", "--help").output
    assert "--shared / --exclusive" in run("run", "--help").output
    assert run("acquire", "warehouse", "--holder", "a", "--shared", "--timeout", "0").exit_code == 0
    assert run("acquire", "warehouse", "--holder", "b", "--timeout", "0").exit_code == 0  # shared by default
    refused = run("acquire", "warehouse", "--holder", "c", "--counting", "--timeout", "0")
    assert refused.exit_code != 0 and "No such option '--counting'" in refused.output, refused.output
    with controltable.ControlTable(url) as ct:
        with pytest.raises(ConfigurationError, match="'shared' .*or 'exclusive', got 'counting'"):
            ct.acquire("warehouse", holder="d", mode="counting", timeout=0)
        assert ct.try_acquire("warehouse", holder="w", mode="exclusive", waiter_ttl=60) is None
    for args in (("status",), ("history",)):
        got = run(*args)
        assert got.exit_code == 0 and "shared" in got.output and "counting" not in got.output, got.output
    (st,) = json.loads(run("status", "--json").output)
    assert {h["mode"] for h in st["holders"]} == {"shared"}


def test_no_surface_names_the_shared_mode_counting() -> None:
    pattern = re.compile(r"--counting|mode=\"counting\"|'counting'|\"counting\"|counting (slot|request)", re.I)
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in SURFACES
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert len(SURFACES) > 50 and found == []


# -- help: every option of every command says what it is for -----------------------------------
def _commands(group: Any, path: tuple[str, ...] = ("controltable",)) -> list[tuple[str, Any]]:
    import click

    found = [(" ".join(path), group)]
    if isinstance(group, click.Group):
        for name, command in group.commands.items():
            if not command.hidden:
                found += _commands(command, (*path, name))
    return found


def test_every_option_of_every_command_has_help_text() -> None:
    import click

    commands = _commands(cli)
    missing = [f"{path} {'/'.join(p.opts)}" for path, command in commands for p in command.params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert len(commands) > 30 and missing == []
    for path, command in commands:  # and every command, in the listing of its group
        assert (command.help or command.short_help or "").strip(), f"{path} has no help text"


def test_only_fail_takes_a_reason() -> None:
    runner = CliRunner()
    for command, takes in (("fail", True), ("complete", False), ("release", False)):
        assert ("--reason" in runner.invoke(cli, ["worklist", command, "--help"]).output) is takes, command
