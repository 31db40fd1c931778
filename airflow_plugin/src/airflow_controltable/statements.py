"""The statement canceller of the kill path, from the core (:mod:`controltable.cancel`).

The provider contains no SQL: this module only names the core's mechanism for the provider's modules.
"""

from __future__ import annotations

from controltable.cancel import CANCEL_TIMEOUT, RunningStatements, tracked_statements

__all__ = ["CANCEL_TIMEOUT", "RunningStatements", "tracked_statements"]
