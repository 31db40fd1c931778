"""The ``controltable`` command run in the test's own process (click's CliRunner), answering like a subprocess.

A real ``python -m controltable.cli`` costs about 0.4 s of CPU to start (the interpreter, SQLAlchemy, the
package), which the command-line tests paid hundreds of times for commands whose output and exit status,
not the process, are the point. :func:`run` invokes the same click group through ``click``'s entry
(``cli.main`` in standalone mode, so ``sys.exit`` and click's usage errors become the exit status exactly as
in the process) with the environment, working directory, standard input and terminal width the test gives.
What only a real process shows stays in real processes: signals, a child's own output (``run`` passes
its COMMAND the process's file descriptors), the interpreter's decoding of standard input, and
``python -m controltable.cli`` itself (tests/core/test_cli.py keeps those).
"""

from __future__ import annotations

import os
import subprocess
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional, Union

from click.testing import CliRunner


@contextmanager
def _cwd(path: Optional[Path]) -> Iterator[None]:
    if path is None:
        yield
        return
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextmanager
def _fresh_secrets() -> Iterator[None]:
    """No password known from an earlier call: a process starts with none, and one remembered from another
    call would mask this call's password even if this call failed to register it."""
    from controltable.cli import output

    before = set(output._SECRETS)
    output._SECRETS.clear()
    try:
        yield
    finally:
        output._SECRETS.clear()
        output._SECRETS.update(before)


@contextmanager
def _width(columns: int) -> Iterator[None]:
    """The stdout console's width as a process started with ``COLUMNS=columns`` computes it at import."""
    from controltable.cli import output

    before = output.console._width
    output.console.width = columns if columns >= 20 else 200
    try:
        yield
    finally:
        output.console._width = before


def run(*args: str, env: Optional[Mapping[str, Optional[str]]] = None, cwd: Optional[Path] = None,
        input: Union[str, bytes, None] = None, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """``controltable ARGS`` in this process: the exit status, standard output and standard error.

    ``env`` is applied over ``os.environ`` for the call (``None`` values unset a variable), ``cwd`` is the
    working directory (a relative SQLite URL is relative to it). An exception the command let escape is
    printed to the returned stderr as the process would print it (a "Traceback"), exit status 1.
    """
    from controltable.cli.group import cli

    environment = {"COLUMNS": str(columns), **(env or {})}
    with _cwd(cwd), _width(columns), _fresh_secrets():
        result = CliRunner().invoke(cli, list(args), input=input, env=environment, prog_name="controltable")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        exc = result.exception
        stderr += "Traceback (most recent call last):\n" + "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__))
    return subprocess.CompletedProcess(["controltable", *args], result.exit_code, result.stdout, stderr)


def without_controltable_env(**extra: Optional[str]) -> dict[str, Optional[str]]:
    """An ``env`` for :func:`run` that unsets every ``CONTROLTABLE_*`` variable, then sets ``extra``."""
    unset: dict[str, Optional[str]] = {k: None for k in os.environ if k.startswith("CONTROLTABLE_")}
    return {**unset, **extra}
