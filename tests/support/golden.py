"""Helpers the tests use to compare statements with the golden files (``core/sql/``): the statements
of a printed script, what changed in it, and statement shapes (what an engine sent, made comparable)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from controltable.sqlscript import named_statements


def captured_statements(dialect_name: str, **session: Any) -> list[tuple[str, list[str]]]:
    """``[(section, [compiled statements])]`` of the scripted session (see :func:`named_statements`)."""
    return [(title, [s.sql for s in stmts]) for title, stmts in named_statements(dialect_name, **session)]


_CONTROL = ("grant_history", "work_item", "worklist", "resource", "request", "meta")
#: A bound parameter in any paramstyle a golden file or a live send uses: pyformat (PostgreSQL and
#: PyMySQL live), format (``%s``: the MySQL script), named (Oracle), qmark (SQLite, SQL Server).
_BIND = re.compile(r"%\(\w+\)s|(?<![\w%])%s\b|(?<![:\w]):\"[^\"]+\"|(?<![:\w]):\w+|@\w+|\?|__\[POSTCOMPILE_\w+\]")
_ROWS = re.compile(r"\b(TOP|LIMIT|OFFSET|FETCH FIRST|FIRST_ROWS)(\s*\(?\s*)\d+")
#: Words after FROM / UPDATE / INTO / TABLE ... that are SQL, not the user's table.
_NOT_TABLES = frozenset({"DUAL", "STATISTICS", "SKIP", "NOWAIT", "WAIT", "OF", "SET", "LATERAL", "ONLY"})


def statement_shape(sql: str, *, claim_prefix: str = "ct_") -> str:
    """A statement with what varies between two sends of it made uniform: bound parameters (``?``),
    the length of IN lists and multi-row VALUES, row counts (TOP, LIMIT, FIRST_ROWS), the control
    tables' prefix and schema, and the user's event table and its own columns (``events``,
    ``col``). Two sends of one builder have one shape; two builders' statements differ in shape."""
    s = " ".join(sql.split())
    s = re.sub(r"::[A-Z]+(?: PRECISION)?", "", s)  # PostgreSQL's typed binds (%(x)s::INTEGER)
    s = _BIND.sub("?", s)
    s = re.sub(r"\(\?(?:, \?)*\)", "(?*)", s)
    s = re.sub(r"\(\?\*\)(?:, \(\?\*\))+", "(?*)", s)
    s = _ROWS.sub(r"\1\2N", s)
    s = re.sub(r"\b(anon|param)_\d+\b", r"\1", s)
    s = re.sub(r'(?<![\w."])(?:"?\w+"?\.)?"?\w*_(' + "|".join(_CONTROL) + r')\b"?', r"ct_\1", s)
    # Index and constraint names of the control tables carry the prefix too (zz_request_key_ix).
    s = re.sub(r'(?<![\w."])"?\w*?_(' + "|".join(_CONTROL) + r')((?:_\w+?)?_(?:ix|uq|pk))\b"?', r"ct_\1\2", s)
    controls = {f"ct_{c}" for c in _CONTROL}
    # The user's table: whatever FROM / UPDATE / INTO / ON / JOIN names that is not a control table.
    # Not an UPDATE of a locking clause or an upsert (FOR UPDATE SKIP LOCKED, ON DUPLICATE KEY
    # UPDATE, DO UPDATE SET), and never a keyword (SKIP was read as the table's name).
    named = (r'\b(?:FROM|(?<!FOR )(?<!KEY )(?<!DO )UPDATE|INTO|JOIN|TABLE|INDEX (?:CONCURRENTLY )?\S+ ON'
             r'|ANALYZE(?! TABLE)|STATISTICS)\s+')
    for m in set(re.findall(named + r'((?:"?\w+"?\.)?"?\w+"?)(?![\w(])', s)):
        bare = m.split(".")[-1].strip('"')
        if bare not in controls and bare.upper() not in _NOT_TABLES and not bare.startswith("ct_"):
            s = re.sub(rf'(?<![\w."]){re.escape(m)}(?![\w"])', "events", s)
    s = re.sub(r"\b(ct_(?:claim|pending|claimed|token))_\w+", r"\1_events", s)
    s = re.sub(r"\bevents\.(?!" + re.escape(claim_prefix) + r")\"?\w+\"?", "events.col", s)
    s = re.sub(r"events\.col(?:, events\.col)+", "events.col", s)
    return s


def golden_statements(text: str) -> list[str]:
    """The statements of a printed script (comments and terminators dropped)."""
    return [sql for _name, sql in golden_named(text)]


def golden_named(text: str) -> list[tuple[Optional[str], str]]:
    """The statements of a printed script, each with the name it is printed under (None: DDL)."""
    out: list[tuple[Optional[str], str]] = []
    current: list[str] = []
    name: Optional[str] = None
    for line in text.splitlines():
        if not current and (line.startswith("--") or not line.strip()):
            if line.startswith("-- name: "):
                name = line[len("-- name: "):].strip()
            continue
        if line == "/":  # the end of a PL/SQL block
            out.append((name, "\n".join(current)))
            current, name = [], None
            continue
        current.append(line)
        joined = "\n".join(current)
        if line.endswith(";") and not (joined.startswith("BEGIN ") and not joined.endswith("END;")):
            if joined.startswith("BEGIN ") and joined.endswith("END;"):
                continue  # ended by the "/" line
            out.append((name, joined[:-1]))
            current, name = [], None
    return out


def changed_statements(golden: str, printed: str) -> list[str]:
    """What differs between a golden file and the script printed now, statement by statement and
    by name (``claim_select #3``: the third statement printed under that name), for a reviewer
    who must find the builder behind a change."""
    old, new = golden_named(golden), golden_named(printed)
    seen: dict[Optional[str], int] = {}
    changed = []
    for (was, sql), (name, now) in zip(old, new):
        seen[name] = seen.get(name, 0) + 1
        if (was, sql) != (name, now):
            changed.append(f"{name or 'DDL'} #{seen[name]}" + ("" if was == name else f" (was {was or 'DDL'})"))
    if len(old) != len(new):
        changed.append(f"{len(new) - len(old):+d} statements at the end")
    return changed


def golden_shapes(directory: Path, dialect_name: str) -> set[str]:
    """The shapes of every statement in ``<directory>/<dialect>.sql`` and its ``.suite.sql``."""
    shapes: set[str] = set()
    for name in (f"{dialect_name}.sql", f"{dialect_name}.suite.sql"):
        path = directory / name
        if path.exists():
            shapes |= {statement_shape(s) for s in golden_statements(path.read_text(encoding="utf-8"))}
    return shapes
