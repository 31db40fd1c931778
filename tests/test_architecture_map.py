"""ARCHITECTURE.md names every module of the four packages, so a newcomer finds each concept by name.

A module added without a line in the map fails here, with the lines to add; a file the map's prose
names (its paths through the code) that was moved or removed fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "core": ROOT / "core" / "src" / "controltable",
    "airflow": ROOT / "airflow_plugin" / "src" / "airflow_controltable",
    "dagster": ROOT / "dagster_plugin" / "src" / "dagster_controltable",
    "prefect": ROOT / "prefect_plugin" / "src" / "prefect_controltable",
}


def _names(surface: str, package: Path) -> list[str]:
    """How each module is spelled in the map: ``slots.py`` for the core, ``pkg/path.py`` for a plugin."""
    names = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if surface == "core":
            names.append("/".join(relative.parts))
        elif relative.name != "__init__.py":  # a plugin's subpackage __init__ only groups its modules
            names.append("/".join((package.name, *relative.parts)))
    return names


def test_every_module_is_in_the_map() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    missing = [
        name
        for surface, package in PACKAGES.items()
        for name in _names(surface, package)
        if f"`{name}`" not in text
    ]
    assert not missing, f"add a line for each to ARCHITECTURE.md's module map: {missing}"


def test_the_map_names_no_module_that_is_gone() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    known = {name for surface, package in PACKAGES.items() for name in _names(surface, package)}
    listed = {
        cell.strip("`")
        for line in text.splitlines()
        if line.startswith("| `") and line.split("`")[1].endswith(".py")
        for cell in [line.split("`")[1]]
    }
    assert listed <= known, f"modules in ARCHITECTURE.md that no longer exist: {sorted(listed - known)}"


#: Where a file the map names may live: the map spells core modules from the package
#: (``slots/passes.py``), plugin modules from their package (``airflow_controltable/kill.py``), the rest
#: from the repository root (``tests/faults/test_failover.py``); a bare ``statements.py``,
#: ``workflow.py`` or ``values.py`` is the part every engine has, so it must be in each of them.
SEARCHED = (ROOT, PACKAGES["core"], PACKAGES["airflow"].parent, PACKAGES["dagster"].parent, PACKAGES["prefect"].parent)
ENGINES = ("slots", "events", "worklist")


def _exists(name: str) -> bool:
    if any((base / name).is_file() for base in SEARCHED):
        return True
    return all((PACKAGES["core"] / engine / name).is_file() for engine in ENGINES)


def test_every_file_the_map_names_exists() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`([\w./-]+\.(?:py|md))`", text))
    assert {"renewal.py", "slots/passes.py", "airflow_controltable/operators/slots.py"} <= named
    missing = sorted(n for n in named if not _exists(n))
    assert not missing, f"ARCHITECTURE.md names files that do not exist (moved or renamed?): {missing}"
