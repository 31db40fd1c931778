"""The ``controltable`` command: install, inspect and use slots, event tables and work lists from a shell.

Exit codes (stable, for shell scripts):
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
module assembles them and keeps every name ``controltable.cli`` always had.
"""

from __future__ import annotations

# The EXIT_* statuses are this package's public names too; they come from the one error table.
from ..errors import (  # noqa: F401
    EXIT_DATABASE,
    EXIT_EMPTY,
    EXIT_ERROR,
    EXIT_LOST,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    EXIT_VIOLATION,
)

# Registering order does not matter: click lists a group's commands sorted by name.
from . import ops_commands, slot_commands, work_commands  # noqa: F401,E402 - registers the commands
from .group import CT, F, Seconds, _exit_code, _url_password, _version, cli, handled, main, sqlite_file  # noqa: F401,E402
from .ops_commands import demo, doctor, history, init, serve, sql, stats  # noqa: F401,E402
from .output import (  # noqa: F401,E402
    _output_width,
    _printable,
    console,
    duration_text,
    err,
    fail,
    in_seconds,
    percent,
    print_error,
    when,
)
from .slot_commands import (  # noqa: F401,E402
    _behind,
    _cannot_start,
    _note_push,
    _priority,
    _status_dict,
    acquire,
    capacity,
    capacity_delete,
    capacity_list,
    capacity_set,
    reap,
    release,
    renew,
    run,
    status,
)
from .work_commands import (  # noqa: F401,E402
    _event_options,
    _free_deprecated,
    _item_command,
    _read_payloads,
    events,
    events_prepare,
    events_retry,
    events_stats,
    wl_allocate,
    wl_clear,
    wl_drop,
    wl_populate,
    wl_reset,
    wl_status,
    worklist,
)
