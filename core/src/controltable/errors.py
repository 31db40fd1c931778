"""The exceptions controltable raises: one hierarchy, each message naming the problem and the fix."""

from __future__ import annotations

from typing import Iterable, Sequence


class ControlTableError(Exception):
    """Base class of every error controltable raises on purpose."""


class ConfigurationError(ControlTableError, ValueError):
    """Bad input from the caller: a name, a number or a URL that cannot work as given."""


class NotInstalledError(ControlTableError):
    """The control tables (or an event table's claim columns) are missing from the database."""


class UnknownResourceError(ControlTableError, KeyError):
    """A resource that has no capacity set in this namespace."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DatabaseUnavailableError(ControlTableError):
    """The database could not be reached (after the retries that were safe)."""


class AcquireTimeout(ControlTableError, TimeoutError):
    """A slot was not granted within the requested timeout; the queue entry was withdrawn."""


class LeaseLost(ControlTableError):
    """A lease (slot, batch or work item) expired and was reaped or taken over by someone else.

    Whatever was done under the lost lease may have overlapped with another holder; the
    protected system should reject writes carrying the stale fencing token.
    """

    def __init__(self, message: str, keys: Sequence[object] = ()) -> None:
        super().__init__(message)
        #: For event batches: the keys that were no longer held by this batch.
        self.keys: list[object] = list(keys)


def describe_keys(keys: Iterable[object], limit: int = 10) -> str:
    """Render a few keys for an error message without flooding the log."""
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{shown}{more}"
