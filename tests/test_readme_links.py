"""The README's relative links point at files that exist (the docs site checks its own links when built
strictly; the README is not part of the site)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t for t in _LINK.findall(text) if "://" not in t]
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
