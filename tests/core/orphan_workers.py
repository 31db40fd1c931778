"""Processes for the orphaned-renewer test (run as a script; one OS process each).

  parent URL NAMESPACE RESOURCE HOLDER LEASE OUT ORPHAN   start a child that holds the slot, then hang
  child  URL NAMESPACE RESOURCE HOLDER LEASE OUT ORPHAN   acquire, renew in the background, write
                                                          {"token", "pid"} to OUT, then hang

  blocked URL NAMESPACE RESOURCE HOLDER LEASE OUT       a child as above that holds the slot in ``with`` and
                                                          sleeps an hour in it (blocked), renewing with
                                                          ``stop_when_orphaned=True``; writes the exception that
                                                          ended the sleep to OUT + ".ended"

ORPHAN is 1 to renew with ``stop_when_orphaned=True``, 0 for the default. The test SIGKILLs the
parent and watches the child's lease on the database clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from controltable import ControlTable


def child(url: str, namespace: str, resource: str, holder: str, lease: float, out: str, orphan: bool) -> None:
    ct = ControlTable(url, namespace=namespace)
    got = ct.acquire(resource, holder=holder, lease=lease, timeout=60, mode="exclusive")
    got.start_renewing(stop_when_orphaned=orphan)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"token": got.token, "pid": os.getpid(), "parent": os.getppid()}, f)
    os.replace(tmp, out)
    time.sleep(3600)


def blocked(url: str, namespace: str, resource: str, holder: str, lease: float, out: str) -> None:
    ct = ControlTable(url, namespace=namespace)
    got = ct.acquire(resource, holder=holder, lease=lease, timeout=60, mode="exclusive")
    got.start_renewing(stop_when_orphaned=True)
    try:
        with got:
            tmp = out + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"token": got.token, "pid": os.getpid(), "parent": os.getppid()}, f)
            os.replace(tmp, out)
            time.sleep(3600)
        ended = "the sleep ended by itself"
    except BaseException as exc:  # what ended the blocked work is the test's evidence
        ended = f"{type(exc).__name__}: {exc}"
    with open(out + ".ended", "w", encoding="utf-8") as f:
        f.write(ended)


def parent(argv: list[str]) -> None:
    subprocess.Popen([sys.executable, __file__, argv[0], *argv[1:]])
    time.sleep(3600)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "parent":
        parent(["child", *args])
    elif cmd == "blocked-parent":
        parent(["blocked", *args])
    elif cmd == "blocked":
        blocked(args[0], args[1], args[2], args[3], float(args[4]), args[5])
    elif cmd == "child":
        child(args[0], args[1], args[2], args[3], float(args[4]), args[5], args[6] == "1")
    else:
        raise SystemExit(f"unknown command {cmd}")
