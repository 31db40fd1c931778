"""No import circles between the modules of the core and the plugins, read statically from the sources.

Two modules that import each other cannot be read, tested or replaced one at a time, and Python only
tolerates the circle while each side imports the other late or under ``TYPE_CHECKING``. So the graph
counts every import: module level, inside functions, and under ``TYPE_CHECKING``. An edge goes to the
module an import names (``from pkg import sub`` names ``pkg.sub`` when ``sub`` is a module, else
``pkg``'s ``__init__``); the parent packages Python runs on the way are not edges, or every package
would be a circle with its own modules. A circle fails with its path, shortest first.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Each package's directory; the Prefect plugin joins when its directory exists.
PACKAGES = {
    "controltable": ROOT / "core" / "src" / "controltable",
    "airflow_controltable": ROOT / "airflow_plugin" / "src" / "airflow_controltable",
    "dagster_controltable": ROOT / "dagster_plugin" / "src" / "dagster_controltable",
    "prefect_controltable": ROOT / "prefect_plugin" / "src" / "prefect_controltable",
}


def module_files(packages: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for every package directory that exists."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package, root in packages.items():
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            parts = (package, *path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imported_modules(name: str, is_package: bool, source: str, known: set[str]) -> set[str]:
    """The known modules that ``name``'s source imports anywhere: top level, in functions, in TYPE_CHECKING."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in known else module)
    return {m for m in found if m in known and m != name}


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    modules = module_files(packages)
    known = set(modules)
    return {
        name: imported_modules(name, is_package, path.read_text(), known)
        for name, (path, is_package) in modules.items()
    }


def _shortest_cycle_through(graph: dict[str, set[str]], start: str, allowed: set[str]) -> list[str]:
    """Breadth-first from ``start`` back to itself inside one strongly connected component."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & allowed):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle through each module that is on one, deduplicated, shortest first.

    Tarjan's strongly connected components find which modules are on a circle; a breadth-first walk
    inside each component names a concrete path a reader can follow.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(root: str) -> None:  # iterative Tarjan: the graph is deep enough to matter for recursion
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found: dict[tuple[str, ...], list[str]] = {}
    for component in components:
        for member in sorted(component):
            cycle = _shortest_cycle_through(graph, member, component)
            start = cycle.index(min(cycle[:-1]))  # one spelling per circle: rotate to its smallest name
            key = tuple(cycle[start:-1] + cycle[:start])
            found.setdefault(key, [*key, key[0]])
    return sorted(found.values(), key=lambda c: (len(c), c))


def test_every_package_is_read() -> None:
    graph = import_graph(PACKAGES)
    assert "controltable.control" in graph and "airflow_controltable.operators.slots" in graph
    assert "dagster_controltable.resource" in graph
    assert "controltable" in graph["airflow_controltable.hooks.controltable"] | set().union(
        *(graph[m] for m in graph if m.startswith("airflow_controltable"))
    )


def test_no_import_circles() -> None:
    found = cycles(import_graph(PACKAGES))
    assert not found, "import circles (break each with a leaf module, or pass what is needed):\n" + "\n".join(
        " -> ".join(cycle) for cycle in found
    )


# The scanner itself, on small packages written for the purpose: each shape must be seen.


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    root = tmp_path / "pkg"
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return {"pkg": root}


def test_scanner_sees_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    packages = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def late():\n    from . import a\n",
    })
    assert cycles(import_graph(packages)) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_scanner_sees_a_circle_through_type_checking(tmp_path: Path) -> None:
    packages = _package(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "",
        "sub/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n",
        "c.py": "import pkg.sub.a\n",
    })
    assert cycles(import_graph(packages)) == [["pkg.c", "pkg.sub.a", "pkg.c"]]


def test_scanner_sees_a_circle_through_a_package_init(tmp_path: Path) -> None:
    packages = _package(tmp_path, {
        "__init__.py": "from .a import A\n",
        "a.py": "class A: ...\n",
        "b.py": "from pkg import A\n",
        "c.py": "from pkg import b\n",
    })
    graph = import_graph(packages)
    assert graph["pkg.b"] == {"pkg"} and graph["pkg.c"] == {"pkg.b"}
    assert cycles(graph) == []  # b names the package's __init__, which does not import b back
    (tmp_path / "pkg" / "__init__.py").write_text("from .a import A\nfrom . import c\n")
    assert cycles(import_graph(packages)) == [["pkg", "pkg.c", "pkg.b", "pkg"]]


def test_scanner_ignores_a_package_and_its_modules(tmp_path: Path) -> None:
    packages = _package(tmp_path, {"__init__.py": "from . import a\n", "a.py": "import os\n"})
    assert cycles(import_graph(packages)) == []
