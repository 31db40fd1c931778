"""The event engine's decisions as pure functions (no SQL, no I/O), so they are tested without a database.

The workflow asks these and the statement builders turn the answers into SQL: the back-off
schedule a failure follows, which expired claims are a crash loop rather than a retry, and what
a batch handle from another process says about its batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import ConfigurationError
from .statements import CLAIMED


def backoff_schedule(max_attempts: int, backoff: float, max_backoff: float) -> list[tuple[int, float]]:
    """``(attempts so far, seconds to wait)`` for a failed row, doubling from ``backoff`` up to ``max_backoff``.

    A row failed after ``n`` attempts waits the delay of the first entry whose attempts are at
    least ``n``; past the last entry it waits ``max_backoff``; at ``max_attempts`` it goes to
    the error state instead (decided in SQL from the row's stored attempts, see
    :meth:`controltable.events.statements.EventStatements.fail_values`). The list stops at the first delay
    that reaches ``max_backoff``, so it stays short however large ``max_attempts`` is.
    """
    if backoff <= 0:
        # No back-off: one entry covers every attempt before the error state. (Doubling zero never
        # reaches max_backoff, and 0 * 2**1024 overflowed: fail() raised OverflowError for
        # max_attempts above 1024; "past the last entry" must not mean max_backoff here.)
        return [(max_attempts - 1, 0.0)] if max_attempts > 1 else []
    schedule: list[tuple[int, float]] = []
    delay = float(backoff)
    for attempt in range(1, max_attempts):
        delay = min(delay, max_backoff)  # doubling in floats: a tiny backoff reaches inf, never OverflowError
        schedule.append((attempt, delay))
        if delay >= max_backoff:
            break
        delay *= 2
    return schedule


def poisoned_keys(rows: Iterable[Mapping[str, Any]], key: str, state: str, attempts: str,
                  max_attempts: int) -> list[Any]:
    """Keys of expired claims already abandoned ``max_attempts`` times: a crash loop, not a retry.

    ``state`` and ``attempts`` are the claim columns' names in ``rows`` (as a claim read them).
    """
    return [r[key] for r in rows if r[state] == CLAIMED and (r[attempts] or 0) >= max_attempts]


@dataclass(frozen=True)
class HandleHistory:
    """What a :meth:`Batch.handle` says about its batch, checked and with the lease worked out."""

    keys: list[Any]
    token: int
    owner: str
    lease: float
    claimed_at: float
    expires_at: float


def read_handle(handle: Mapping[str, Any], default_lease: float) -> HandleHistory:
    """Parse a batch handle; the lease comes from the handle, else (older handles) from
    ``expires_at - claimed_at``, else ``default_lease``. Raises :class:`ConfigurationError`."""
    try:
        keys, token, owner = list(handle["keys"]), int(handle["token"]), str(handle["owner"])
        lease = float(handle.get("lease") or 0.0)
        claimed_at = float(handle.get("claimed_at") or 0.0)
        expires_at = float(handle.get("expires_at") or 0.0)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigurationError(f"not a batch handle (needs keys, token, owner): {handle!r}") from exc
    if lease <= 0:
        lease = expires_at - claimed_at if 0 < claimed_at < expires_at else default_lease
    return HandleHistory(keys, token, owner, lease, claimed_at, expires_at)


def storable_text(text: str, limit: int) -> str:
    """``text`` in ASCII, other characters as Python escapes (``ü`` as ``\\xfc``), cut to ``limit``.

    What a claim column gets instead of a name or reason its character set cannot hold (a latin1
    column an earlier ``prepare()`` added on MySQL/MariaDB, a PostgreSQL database in LATIN1): every
    character set stores ASCII, so no claim and no ``fail()`` is refused for what its owner is
    called or its reason says. The owner and the reason are only read by people, never compared.
    """
    return text.encode("ascii", "backslashreplace").decode("ascii")[:limit]
