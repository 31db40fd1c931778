"""Issue 33, hole 2: a ``controltable run``/``acquire`` that is ended while it waits leaves no entry.

Before, ``run`` set its signal handlers only once the slot was granted: SIGTERM (or SIGHUP) while it
waited ended the process at once with its queue entry left behind, and the next release granted the
slot to the dead process, idle until its pickup ran out. Real subprocesses here: each is signalled
once ``status()`` shows it waiting; then its entry must be gone, the command must exit 128 + the
signal's number, and the release that follows must grant the live waiter queued behind it (read
right after the release returns, before that waiter looks again: the release's own pass did it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.live import wait_until

from controltable import ControlTable

#: Hang detectors: the CLI starts in about a second; a withdrawal takes one transaction.
START_HANG = 60.0
EXIT_HANG = 30.0

CASES = [
    ("run", signal.SIGTERM), ("run", signal.SIGHUP), ("run", signal.SIGINT),
    ("acquire", signal.SIGTERM), ("acquire", signal.SIGHUP), ("acquire", signal.SIGINT),
]


def _waiters(ct: ControlTable) -> list[str]:
    (st,) = ct.status(["r"])
    return [w.holder for w in st.waiters]


def _holders(ct: ControlTable) -> list[str]:
    (st,) = ct.status(["r"])
    return [h.holder for h in st.holders]


@pytest.mark.parametrize("command,signum", CASES, ids=[f"{c}-{s.name}" for c, s in CASES])
def test_a_signal_while_queued_withdraws_the_entry_and_the_release_grants_the_next_waiter(
        ct: ControlTable, backend_url: str, namespace: str, tmp_path: Path, command: str,
        signum: signal.Signals) -> None:
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=120)
    args = {"run": ["run", "--resource", "r", "--holder", "W", "true"],
            "acquire": ["acquire", "r", "--holder", "W"]}[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLTABLE_")}
    env.update(CONTROLTABLE_URL=backend_url, CONTROLTABLE_NAMESPACE=namespace)
    proc = subprocess.Popen([sys.executable, "-m", "controltable.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: "W" in _waiters(ct) or proc.poll() is not None, START_HANG,
                   "the command to queue (a hang)")
        assert proc.poll() is None, f"the command ended before it queued: {proc.communicate()}"
        assert ct.try_acquire("r", holder="B", waiter_ttl=60) is None  # the live waiter behind it
        assert _waiters(ct) == ["W", "B"]
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=EXIT_HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert _waiters(ct) == ["B"], "the signalled command's queue entry was left behind"
    holder.release()
    assert _holders(ct) == ["B"], "the release did not grant the live waiter behind the signalled one"
    assert proc.returncode == 128 + signum, (proc.returncode, out, err)
    assert signum.name in err and "left the queue" in err, err
    lease = ct.try_acquire("r", holder="B", waiter_ttl=60)
    assert lease is not None and lease.token > holder.token
    lease.release()
