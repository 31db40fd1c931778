"""MkDocs hook: pages listed under ``extra.optional_pages`` in mkdocs.yml join the nav only when present.

Why: other branches add pages (a policies page, a status page) that this branch does not have. A nav
entry whose file is missing fails a strict build, and a page present but left out of the nav is hidden,
so the nav is completed at build time from the files that exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _insert_after(nav: list[Any], after: str, entry: dict[str, str]) -> bool:
    """Insert ``entry`` right after the nav item whose file is ``after`` (searching sections too)."""
    for index, item in enumerate(nav):
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if value == after:
            nav.insert(index + 1, entry)
            return True
        if isinstance(value, list) and _insert_after(value, after, entry):
            return True
    return False


def on_config(config: Any) -> Any:
    """Add each optional page whose file exists in ``docs_dir`` to the nav."""
    docs_dir = Path(config["docs_dir"])
    nav = config["nav"]
    for page in config["extra"].get("optional_pages", []):
        if not (docs_dir / page["file"]).is_file():
            continue
        entry = {page["title"]: page["file"]}
        if not _insert_after(nav, page.get("after", ""), entry):
            nav.append(entry)
    return config
