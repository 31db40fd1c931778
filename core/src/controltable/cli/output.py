"""What the ``controltable`` command prints with: consoles, masked error lines, times, durations, shares, modes."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from typing import NoReturn, Optional

from rich.console import Console
from rich.markup import escape

from ..errors import redact

# Markup off: names, holders and database messages are printed as given, never parsed as rich
# markup (a resource called "[/]" must not crash the output). Styled text opts in per call.


def _output_width() -> Optional[int]:
    """The width tables are laid out for: ``COLUMNS`` when set, else the terminal's, else 200.

    ``COLUMNS`` wins so a caller can fit the output to a log viewer or an 80-column mail; piped into a
    log or a file without it, tables keep a wide layout instead of rich's 80-column default, so holder
    ids and times are not cut to "…" where nobody can widen the terminal.
    """
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= 20:
        return int(columns)
    return None if sys.stdout.isatty() else 200


console = Console(markup=False, width=_output_width())
err = Console(stderr=True, markup=False, soft_wrap=True)


#: Passwords of the URLs this process was given: masked in everything the CLI prints.
_SECRETS: set[str] = set()


def _printable(message: object) -> str:
    """``message`` with passwords masked and anything the terminal cannot encode escaped."""
    return redact(message, _SECRETS).encode("utf-8", "backslashreplace").decode("utf-8")


def print_error(message: object) -> None:
    err.print(f"[bold red]error:[/] {escape(_printable(message))}", markup=True, highlight=False)


def fail(message: str, code: int) -> NoReturn:
    print_error(message)
    sys.exit(code)


def when(ts: Optional[datetime]) -> str:
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def in_seconds(ts: Optional[datetime], now: float) -> str:
    if ts is None:
        return ""
    delta = ts.timestamp() - now
    return f"in {delta:.0f}s" if delta >= 0 else f"expired {-delta:.0f}s ago"


def percent(share: Optional[float]) -> str:
    """A share (0..1) as a percentage that keeps small values visible: 0.14 %, 3.5 %, 42 %."""
    if share is None:
        return ""
    value = share * 100
    if value == 0:
        return "0 %"
    if value < 0.01:
        return "<0.01 %"
    if value < 1:
        return f"{value:.2f} %"
    if value < 10:
        return f"{value:.1f} %"
    return f"{value:.0f} %"


def duration_text(seconds: float) -> str:
    """A duration a reader takes in at a glance: 0.42s, 12.3s, 4m05s, 2h03m."""
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
