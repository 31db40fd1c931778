"""What CI requires (``CONTROLTABLE_TEST_REQUIRE``, e.g. ``postgres,mysql,pgbouncer,galera``): a missing
server or program fails the run there, and skips the test elsewhere (a developer's quick loop)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required_names() -> set[str]:
    """The names listed in ``CONTROLTABLE_TEST_REQUIRE``."""
    return {n.strip() for n in os.environ.get("CONTROLTABLE_TEST_REQUIRE", "").split(",") if n.strip()}


def fail_or_skip(missing: str, *names: str) -> NoReturn:
    """Fail when one of ``names`` is required, else skip; ``missing`` says what is not there."""
    wanted = required_names() & set(names)
    if wanted:
        pytest.fail(f"{missing}, and CONTROLTABLE_TEST_REQUIRE requires {', '.join(sorted(wanted))}")
    pytest.skip(missing)
