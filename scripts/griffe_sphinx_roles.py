"""Griffe extension for the API reference: Sphinx cross-reference roles in docstrings shown as code.

Why: the docstrings use Sphinx roles (``:class:`Lease```, ``:meth:`~x.Y.z```) that read well in the
source and in ``help()``, but mkdocstrings renders Markdown, where a role would show up as literal
``:class:`` text. Each role becomes inline code naming its target's last component when the target
starts with ``~`` (as Sphinx does), the full target otherwise. The sources are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|exc|data|obj|const):`(~?)([^`]+)`")


def _replace(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def strip_roles(text: str) -> str:
    """``:class:`~a.b.C``` -> ```C```, ``:mod:`a.b``` -> ```a.b```."""
    return _ROLE.sub(_replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrites each loaded object's docstring once, before mkdocstrings parses it."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = strip_roles(obj.docstring.value)
