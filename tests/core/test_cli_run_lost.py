"""``controltable run`` when its lease is lost: exit 6 only for a COMMAND it stopped (or one that succeeded).

The docstring promises "exit 6 (unless COMMAND failed by itself)". The lease-loss interrupt can
reach ``run``'s wait just after COMMAND ended by itself with a failure; ``run`` used to count that
as stopped (it "sent" SIGTERM to an exited child) and exit 6, hiding COMMAND's own code. Here the
child is a stand-in whose wait is where the loss arrives (its lease removed in the database, the
interrupt raised) after it exited with 3: ``run`` must exit 3 and signal nothing.
"""

from __future__ import annotations

import subprocess
from typing import Any, Optional

import pytest
from click.testing import CliRunner

from controltable import ControlTable, LeaseLost
from controltable.cli.group import cli


class _FailedAsTheLeaseWasLost:
    """A COMMAND that exited with 3 by itself just as its lease was lost."""

    def __init__(self, ct: ControlTable, args: Any, env: dict[str, str]) -> None:
        self.ct, self.env, self.pid = ct, env, 0
        self.returncode: Optional[int] = None
        self.signalled: list[Any] = []

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self.returncode = 3
            assert self.ct.release("r", self.env["CONTROLTABLE_HOLDER"]) == 1  # the lease is gone
            raise LeaseLost("the lease was lost as the command ended (the interrupt of run's wait)")
        return self.returncode

    def poll(self) -> Optional[int]:
        return self.returncode

    def terminate(self) -> None:
        self.signalled.append("SIGTERM")

    def kill(self) -> None:
        self.signalled.append("SIGKILL")

    def send_signal(self, signum: int) -> None:
        self.signalled.append(signum)


def test_a_command_that_failed_by_itself_as_the_lease_was_lost_keeps_its_exit_code(
        ct: ControlTable, backend_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ct.set_capacity("r", 1)
    children: list[_FailedAsTheLeaseWasLost] = []

    def popen(args: Any, env: dict[str, str], **kw: Any) -> _FailedAsTheLeaseWasLost:
        children.append(_FailedAsTheLeaseWasLost(ct, args, env))
        return children[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    result = CliRunner().invoke(cli, ["--url", backend_url, "--namespace", namespace,
                                      "run", "--resource", "r", "--holder", "W", "true"])
    (child,) = children
    assert child.signalled == [], "an exited command was signalled as if it were stopped"
    assert result.exit_code == 3, (result.exit_code, result.output)
    (st,) = ct.status(["r"])
    assert st.holders == []
