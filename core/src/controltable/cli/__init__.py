"""The ``controltable`` command: install, inspect and use slots, event tables and work lists from a shell.

Exit codes (stable, for shell scripts; defined in the one error table, :mod:`controltable.errors`):
  0  success
  1  unexpected error
  2  bad usage or bad input (the message says what to fix)
  3  acquire timed out (AcquireTimeout)
  4  the database is unreachable or the control tables are missing
  5  nothing to do: no batch or work item available
  6  the lease was lost (or nothing was held when releasing/renewing)
  7  the demo found a violation

The command lives in modules of one concept each: ``group`` (the group, its global options, ``CT``,
error handling), ``output`` (consoles and formatting), ``slot_commands``, ``work_commands`` (event
tables and work lists) and ``ops_commands`` (init, sql, doctor, stats, history, demo, serve). This
module registers their commands on the group and offers ``main``, the console script's entry point.
"""

from __future__ import annotations

# Registering order does not matter: click lists a group's commands sorted by name.
from . import ops_commands, slot_commands, work_commands  # noqa: F401 - registers the commands
from .group import main

__all__ = ["main"]
