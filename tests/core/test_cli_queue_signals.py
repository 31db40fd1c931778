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


def _from_a_terminal(argv: list[str]) -> list[str]:
    """``argv`` started with the signal handling a terminal gives it. The CLI leaves a signal it was
    started with ignored ignored (nohup), and this run may itself run under nohup (SIGHUP ignored) or in
    a shell's background (SIGINT ignored), which every child would inherit."""
    reset = ("import os, signal, sys\n"
             "for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):\n"
             "    signal.signal(s, signal.SIG_DFL)\n"
             "os.execvp(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", reset, *argv]


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
    proc = subprocess.Popen(_from_a_terminal([sys.executable, "-m", "controltable.cli", *args]), cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


#: Scripts that run the CLI with a signal sent to itself at a chosen instant after the grant.
#: ``run``: as the lease's renewal starts (granted, COMMAND not started yet). ``acquire``: as the
#: first handler is put back (the wait has returned the grant, the block is ending).
_AFTER_GRANT = {
    "run": """
import os, runpy, signal
from controltable.renewal import BackgroundRenewal
real = BackgroundRenewal.start_renewing
def start_renewing(self, *a, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(self, *a, **k)
BackgroundRenewal.start_renewing = start_renewing
runpy.run_module("controltable.cli", run_name="__main__")
""",
    "acquire": """
import os, runpy, signal
from controltable.cli import slot_commands
real = signal.signal
sent = []
def put_back(s, handler):
    if not sent and s in slot_commands.QUEUE_SIGNALS and getattr(handler, "__name__", "") != "_end":
        sent.append(s)
        os.kill(os.getpid(), signal.SIGTERM)
    return real(s, handler)
signal.signal = put_back
runpy.run_module("controltable.cli", run_name="__main__")
""",
}


@pytest.mark.parametrize("command", ["run", "acquire"])
def test_a_signal_right_after_the_grant_releases_it_and_exits_128_plus_n(
        ct: ControlTable, backend_url: str, namespace: str, tmp_path: Path, command: str) -> None:
    """Before: ``run`` put the default handlers back before COMMAND started (SIGTERM there killed
    it with the grant held until its lease ran out), and ``acquire``'s handler, still in place
    while the old ones were put back, raised out of ``__exit__`` (a traceback, exit 1, the grant held)."""
    ct.set_capacity("r", 1)
    args = {"run": ["run", "--resource", "r", "--holder", "W", "true"],
            "acquire": ["acquire", "r", "--holder", "W"]}[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLTABLE_")}
    env.update(CONTROLTABLE_URL=backend_url, CONTROLTABLE_NAMESPACE=namespace)
    script = tmp_path / "cli.py"
    script.write_text(_AFTER_GRANT[command])
    proc = subprocess.run(_from_a_terminal([sys.executable, str(script), *args]), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=START_HANG)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stdout, proc.stderr)
    assert "SIGTERM" in proc.stderr and "released the grant" in proc.stderr, proc.stderr
    assert _holders(ct) == [] and _waiters(ct) == [], "the grant was left held"
    lease = ct.try_acquire("r", holder="B")
    assert lease is not None
    lease.release()


@pytest.mark.parametrize("command", ["run", "acquire"])
def test_a_signal_ignored_by_whoever_started_the_command_stays_ignored(
        ct: ControlTable, backend_url: str, namespace: str, tmp_path: Path, command: str) -> None:
    """``nohup controltable run ...``: the hangup ends neither the wait nor COMMAND, which starts with
    SIGHUP still ignored. Before, the command's handler replaced the ignore: the hangup withdrew the
    wait (exit 129), and COMMAND started with SIGHUP's default and was passed the next one."""
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=120)
    probe = "import signal; print('COMMAND', signal.getsignal(signal.SIGHUP).name)"
    args = {"run": ["run", "--resource", "r", "--holder", "W", "--", sys.executable, "-c", probe],
            "acquire": ["acquire", "r", "--holder", "W"]}[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLTABLE_")}
    env.update(CONTROLTABLE_URL=backend_url, CONTROLTABLE_NAMESPACE=namespace)
    proc = subprocess.Popen(_from_a_terminal(["nohup", sys.executable, "-m", "controltable.cli", *args]),
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: "W" in _waiters(ct) or proc.poll() is not None, START_HANG,
                   "the command to queue (a hang)")
        assert proc.poll() is None, f"the command ended before it queued: {proc.communicate()}"
        proc.send_signal(signal.SIGHUP)  # the terminal closed
        holder.release()  # grants W: its own pass, before W looks again
        out, err = proc.communicate(timeout=START_HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert "SIGHUP" not in err and "left the queue" not in err, err
    if command == "run":
        assert "COMMAND SIG_IGN" in out, out
        assert _holders(ct) == [], "run did not release after COMMAND"
    else:
        assert _holders(ct) == ["W"], "acquire did not keep its grant"
        ct.release("r", "W")
