"""Holder ids: one helper that every surface (CLI, Airflow, Dagster) builds its holder and owner ids with."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import uuid

from .defaults import NAME_LENGTH

#: Control characters are replaced: ids show up in logs, tables and the status page.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
#: Characters of the hash suffix a shortened id ends with ("~" and 16 hex digits).
_DIGEST = 16


def holder_id(*parts: object, limit: int = NAME_LENGTH) -> str:
    """Join ``parts`` with ``:`` into an id of at most ``limit`` characters, the same in every process.

    Why hash instead of truncating: two long ids that differ only after the limit (two Dagster
    step keys, two mapped Airflow tasks of a long DAG id) would otherwise become one holder and
    share one lease. A shortened id keeps its start (so a scope prefix such as ``dagster:<run>:``
    still matches ``release_holders``) and ends with ``~`` and a hash of the whole id.
    """
    if limit <= _DIGEST + 1:
        raise ValueError(f"limit must be more than {_DIGEST + 1} characters")
    raw = _UNSAFE.sub("_", ":".join(str(p) for p in parts))
    # Blanks at either end would make the id one that ``validation.check_name`` refuses (MySQL and
    # SQL Server compare 'etl' and 'etl ' as one name): they are replaced like control characters.
    core = raw.strip()
    if core != raw:
        start = len(raw) - len(raw.lstrip())
        raw = "_" * start + core + "_" * (len(raw) - start - len(core)) if core else "_" * len(raw)
    if len(raw) <= limit:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:_DIGEST]
    return f"{raw[:limit - _DIGEST - 1]}~{digest}"


def process_holder_id() -> str:
    """A holder id unique to this process and call (host, process id, random part), for callers
    that name no holder or owner: two workers never share one by accident."""
    return holder_id(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:12])
