"""The CLI's renamed words: ``worklist release`` (``free`` a hidden, deprecated alias) and ``--table-schema``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from click.testing import CliRunner

import controltable
from controltable.cli import cli
from controltable.errors import EXIT_USAGE


def test_cli_release_command_and_its_deprecated_name_free(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    runner = CliRunner()

    def run(*args: str, input: Optional[str] = None) -> Any:
        return runner.invoke(cli, ["--url", url, "--namespace", "vocab", *args], input=input, catch_exceptions=False)

    assert run("init").exit_code == 0
    assert run("worklist", "populate", "w", input="[1, 2]").exit_code == 0
    with controltable.ControlTable(url, namespace="vocab") as ct:
        for command in ("release", "free"):
            item = ct.worklist("w").allocate("sh")
            assert item is not None
            got = run("worklist", command, "w", str(item.id), "--token", str(item.token))
            assert got.exit_code == 0, got.output
            assert ("deprecated" in got.output) is (command == "free")
            assert ct.worklist("w").status().total("new") == 2
    assert "free" not in run("worklist", "--help").output, "the old name is hidden from the help"
    # --table-schema is taken: the command looks for the table in that schema (and says it is missing).
    missing = run("events", "stats", "nope", "--key", "id", "--table-schema", "main")
    assert missing.exit_code == EXIT_USAGE and "No such option" not in missing.output, missing.output
    assert "event table 'main.nope' does not exist" in missing.output, missing.output
