"""The dialect rule: only the dialect layer names a dialect; everything else asks ``dialects.traits(name)``.

An AST scan of every module of the three packages (``core/src``, ``airflow_plugin/src``,
``dagster_plugin/src``) fails on a string constant equal to a dialect name (``"postgresql"``,
``"mysql"``...) or a ``.startswith(...)`` argument beginning with one, outside the modules that
are the dialect layer: ``dialects.py`` (with its two parts ``dialect_traits.py`` and
``dialect_ddl.py``, re-exported by it), ``errorcodes.py`` (driver error codes per dialect) and
``connect.py`` (driver connection settings per dialect).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from controltable import dialects

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "core" / "src", ROOT / "airflow_plugin" / "src", ROOT / "dagster_plugin" / "src"]
DIALECT_NAMES = {"postgresql", "mysql", "mariadb", "sqlite", "mssql", "oracle"}
#: The dialect layer (paths relative to a package source root).
DIALECT_LAYER = {
    "controltable/dialects.py",
    "controltable/dialect_traits.py",
    "controltable/dialect_ddl.py",
    "controltable/errorcodes.py",
    "controltable/connect.py",
}
#: Exact uses allowed outside the layer, as (file, the expression holding the constant).
ALLOWED = {
    # An Airflow connection type (the Connection's conn_type), not a SQLAlchemy dialect name.
    ("airflow_controltable/hooks/controltable.py", "conn.conn_type == 'sqlite'"),
}


def _modules() -> list[tuple[str, Path]]:
    return [(str(p.relative_to(src).as_posix()), p) for src in SOURCES for p in sorted(src.rglob("*.py"))
            if "egg-info" not in str(p)]


def _names_dialect(value: object, *, prefix: bool) -> bool:
    if not isinstance(value, str):
        return False
    return value in DIALECT_NAMES or (prefix and any(value.startswith(d) for d in DIALECT_NAMES))


def findings(source: str) -> list[tuple[int, str, str]]:
    """(line, constant, the expression holding it) for every dialect name in ``source``."""
    tree = ast.parse(source)
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    in_startswith: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            for arg in node.args:
                in_startswith.update(id(c) for c in ast.walk(arg))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and _names_dialect(node.value, prefix=id(node) in in_startswith):
            holder = parents.get(id(node), node)
            while isinstance(holder, (ast.Tuple, ast.List, ast.Set)) and id(holder) in parents:
                holder = parents[id(holder)]
            out.append((node.lineno, node.col_offset, str(node.value), ast.unparse(holder)))
    return [(line, value, holder) for line, _, value, holder in sorted(out)]


def test_the_scan_finds_names_and_prefixes() -> None:
    code = 'a = x == "postgresql"\nb = y in ("mysql", "mariadb")\nc = u.startswith("sqlite+")\nd = "MySQL"\n'
    assert [(line, value) for line, value, _ in findings(code)] == [
        (1, "postgresql"), (2, "mysql"), (2, "mariadb"), (3, "sqlite+")]


def test_only_the_dialect_layer_names_dialects() -> None:
    scanned, bad = 0, []
    for rel, path in _modules():
        scanned += 1
        if rel in DIALECT_LAYER:
            continue
        for line, value, holder in findings(path.read_text(encoding="utf-8")):
            if (rel, holder) in ALLOWED:
                continue
            bad.append(f"{rel}:{line}: {value!r} in {holder}")
    assert scanned > 50, "the scan found too few modules: wrong roots?"
    assert not bad, ("dialect names outside the dialect layer; ask controltable.dialects.traits(name) (or add a "
                     "helper to dialects.py) instead:\n" + "\n".join(bad))


def test_the_layer_and_the_allow_list_exist() -> None:
    present = {rel for rel, _ in _modules()}
    assert present >= DIALECT_LAYER
    assert {path for path, _ in ALLOWED} <= present


@pytest.mark.parametrize("name", dialects.SUPPORTED_DIALECTS)
def test_every_supported_dialect_has_traits(name: str) -> None:
    traits = dialects.traits(name)
    assert traits.name == name
    assert traits.script_version, "controltable sql needs a server version to compile for"
    assert dialects.SQL_SERVER_VERSIONS[name] == traits.script_version


def test_traits_of_an_unknown_dialect_are_the_defaults() -> None:
    traits = dialects.traits("firebird")
    assert traits == dialects.Traits("firebird")
    assert not traits.listen_notify and not traits.file_database and traits.ping_sql == "SELECT 1"


def test_traits_answer_what_the_branches_asked() -> None:
    t = dialects.traits
    assert [n for n in dialects.SUPPORTED_DIALECTS if t(n).listen_notify] == ["postgresql"]
    assert [n for n in dialects.SUPPORTED_DIALECTS if t(n).file_database] == ["sqlite"]
    assert t("mariadb").kill_query and t("mysql").kill_query and t("mysql").utf8mb4_tables
    assert t("oracle").ping_sql == "SELECT 1 FROM DUAL" and t("oracle").add_column_keyword == "ADD"
    assert t("mssql").add_column_keyword == "ADD" and t("postgresql").add_column_keyword == "ADD COLUMN"
    assert dialects.server_label("mysql", "10.11.6-MariaDB") == "MariaDB"
    assert dialects.server_label("mysql", "8.0.36") == "MySQL"
    assert dialects.server_label("mssql", "15.0") == "mssql"


@pytest.mark.parametrize("url, expected", [
    ("sqlite:///x.db", True), ("sqlite+pysqlite:///:memory:", True), ("postgresql+psycopg://u@h/db", False),
    ("mysql+pymysql://root@127.0.0.1/test", False), ("not a url", False),
])
def test_is_sqlite_url(url: str, expected: bool) -> None:
    from sqlalchemy.engine import make_url

    assert dialects.is_sqlite_url(url) is expected
    if expected:
        assert dialects.is_sqlite_url(make_url(url)) is True
