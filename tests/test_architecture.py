"""The plugins use only the core's public API: no SQLAlchemy beyond URL parsing, no private members of core objects.

Why: SQL and private state belong to the core, where every statement runs through the database
layer's retry policy and dialect differences live in one module. A plugin that imports SQLAlchemy
to build statements, or reaches into ``ControlTable``'s private members, duplicates logic that
then drifts from the core (a copied backlog query, a copied error translation).

An AST scan of every module of ``airflow_controltable`` and ``dagster_controltable``:

- imports of ``sqlalchemy`` are allowed only for URL parsing (``sqlalchemy.engine.url``, or
  ``make_url``/``URL`` from ``sqlalchemy``/``sqlalchemy.engine``);
- ``x._name`` is flagged when ``_name`` is a private member of a core class (a method, a class
  attribute or a ``self._name`` the core assigns) and ``x`` is not ``self``/``cls``, so the
  plugins' own private attributes (``self._ct``) and other libraries' privates are not flagged;
  so is ``getattr(x, "_name")`` and importing a private name from ``controltable``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "src" / "controltable"
PLUGINS = {
    "airflow_controltable": ROOT / "airflow_plugin" / "src" / "airflow_controltable",
    "dagster_controltable": ROOT / "dagster_plugin" / "src" / "dagster_controltable",
    "prefect_controltable": ROOT / "prefect_plugin" / "src" / "prefect_controltable",
}
#: Imports from these modules are allowed with any name: URL parsing only.
URL_MODULES = {"sqlalchemy.engine.url"}
#: Names allowed from ``sqlalchemy`` / ``sqlalchemy.engine`` themselves.
URL_NAMES = {"make_url", "URL"}
#: Known exceptions to the rules, as strict xfails with a reason ("rule:package/relative path").
#: None today; an entry must say why the module cannot follow the rule yet.
KNOWN: dict[str, str] = {}


@dataclass(frozen=True)
class Finding:
    line: int
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@lru_cache(maxsize=1)
def core_private_members() -> frozenset[str]:
    """Private names the core's classes define: methods, class attributes, ``self._x`` assignments."""
    names: set[str] = set()
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    return frozenset(n for n in names if _is_private(n))


def sqlalchemy_imports(source: str) -> list[Finding]:
    """Imports of ``sqlalchemy`` that are not URL parsing."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.name == "sqlalchemy" or alias.name.startswith("sqlalchemy.")) \
                        and alias.name not in URL_MODULES:
                    found.append(Finding(node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            module = node.module
            if not (module == "sqlalchemy" or module.startswith("sqlalchemy.")) or module in URL_MODULES:
                continue
            bad = [a.name for a in node.names
                   if not (module in ("sqlalchemy", "sqlalchemy.engine") and a.name in URL_NAMES)]
            if bad:
                found.append(Finding(node.lineno, f"from {module} import {', '.join(bad)}"))
    return found


def private_core_access(source: str, core_members: frozenset[str]) -> list[Finding]:
    """Uses of core objects' private members (see the module docstring for the rule)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_private(node.attr) and node.attr in core_members:
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(Finding(node.lineno, f"{ast.unparse(node)}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _is_private(node.args[1].value) and node.args[1].value in core_members):
            found.append(Finding(node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None \
                and (node.module == "controltable" or node.module.startswith("controltable.")):
            if any(_is_private(part) for part in node.module.split(".")):
                found.append(Finding(node.lineno, f"from {node.module} import ..."))
            found.extend(Finding(node.lineno, f"from {node.module} import {a.name}")
                         for a in node.names if _is_private(a.name))
        elif isinstance(node, ast.Import):
            found.extend(Finding(node.lineno, f"import {a.name}") for a in node.names
                         if a.name.startswith("controltable.") and any(_is_private(p) for p in a.name.split(".")))
    return found


def _modules() -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    for package, root in PLUGINS.items():
        out.extend((f"{package}/{p.relative_to(root).as_posix()}", p) for p in sorted(root.rglob("*.py")))
    return out


def _params(rule: str) -> list[object]:
    params: list[object] = []
    for name, path in _modules():
        reason = KNOWN.get(f"{rule}:{name}")
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(path, id=name, marks=marks))
    return params


def test_every_plugin_module_is_scanned() -> None:
    names = [name for name, _ in _modules()]
    assert "dagster_controltable/resource.py" in names and "airflow_controltable/hooks/controltable.py" in names
    assert len(core_private_members()) > 20 and "_slots" in core_private_members()


@pytest.mark.parametrize("path", _params("sqlalchemy"))
def test_no_sqlalchemy_beyond_url_parsing(path: Path) -> None:
    assert [str(f) for f in sqlalchemy_imports(path.read_text())] == []


@pytest.mark.parametrize("path", _params("private"))
def test_no_private_members_of_core_objects(path: Path) -> None:
    assert [str(f) for f in private_core_access(path.read_text(), core_private_members())] == []


# -- the scanner itself: what it must flag, and what it must leave alone ----------------------------
FLAGGED = [
    "import sqlalchemy",
    "import sqlalchemy as sa",
    "from sqlalchemy import select",
    "from sqlalchemy.exc import SQLAlchemyError",
    "from sqlalchemy.engine import Engine, make_url",
    "import sqlalchemy.exc",
]
ALLOWED = [
    "from sqlalchemy.engine.url import make_url, URL",
    "from sqlalchemy.engine import make_url",
    "from sqlalchemy import make_url",
    "import sqlalchemy_utils",
    "from .sqlalchemy import x",
]


@pytest.mark.parametrize("source", FLAGGED)
def test_scanner_flags_sqlalchemy(source: str) -> None:
    assert sqlalchemy_imports(source)


@pytest.mark.parametrize("source", ALLOWED)
def test_scanner_allows_url_parsing(source: str) -> None:
    assert sqlalchemy_imports(source) == []


PRIVATE_FLAGGED = [
    "ct._slots.acquire('r')",
    "self._ct._slots.wait_info('r', 'h')",
    "resource._fail(exc, 'x')",
    "lease.ct._wakeups.notify(conn, [])",
    "getattr(ct, '_slots')",
    "from controltable.events import _age",
    "from controltable._private import x",
]
PRIVATE_ALLOWED = [
    "self._ct.acquire('r')",
    "self._entries.pop(key)",
    "cls._instances",
    "_jsonable(value)",
    "from .resource import _jsonable",
    "from dagster._core.libraries import DagsterLibraryRegistry",
    "context._plugin_private_thing",
    "ct.wait_info('r', 'h').position",
]


@pytest.mark.parametrize("source", PRIVATE_FLAGGED)
def test_scanner_flags_private_core_members(source: str) -> None:
    assert private_core_access(source, core_private_members())


@pytest.mark.parametrize("source", PRIVATE_ALLOWED)
def test_scanner_leaves_public_and_own_privates_alone(source: str) -> None:
    assert private_core_access(source, core_private_members()) == []
