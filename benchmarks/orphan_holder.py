"""Processes for the "orphan slot back" goal (benchmarks/goals.py), run as a script, one OS process each.

  parent MODE NAMESPACE RESOURCE HOLDER LEASE OUT   start a child (same arguments), then hang
  child  MODE NAMESPACE RESOURCE HOLDER LEASE OUT   acquire the slot, renew it in the background
                                                    with ``stop_when_orphaned=True``, write
                                                    {"pid", "parent"} to OUT, then hang

The database URL comes from the environment (``CONTROLTABLE_BENCH_ORPHAN_URL``), not the command
line, so it does not show in ``ps``.

MODE ``expire``: the child holds the lease outside any ``with`` block (no interrupt armed), so when
its parent dies it only stops renewing and the lease runs out on the database clock. MODE
``interrupt``: the child sleeps inside ``with lease:``, so the renewer that finds the process
orphaned also interrupts the block, whose exit gives the slot back; the child then hangs on.
The benchmark SIGKILLs the parent (the child lives on) and times another participant's grant; it
kills the child (the parent's process group) at the end of the round. The same shape as
tests/core/orphan_workers.py, which the benchmarks do not import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from controltable import ControlTable

URL_ENV = "CONTROLTABLE_BENCH_ORPHAN_URL"


def child(mode: str, url: str, namespace: str, resource: str, holder: str, lease: float, out: str) -> None:
    ct = ControlTable(url, namespace=namespace)
    got = ct.acquire(resource, holder=holder, lease=lease, timeout=60)
    got.start_renewing(stop_when_orphaned=True)

    def ready() -> None:
        tmp = out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "parent": os.getppid()}, f)
        os.replace(tmp, out)

    if mode == "interrupt":
        try:
            with got:
                ready()
                time.sleep(3600)
        except BaseException:  # noqa: S110 - the interrupt is what the benchmark waits for
            pass
    else:
        ready()
    time.sleep(3600)  # the orphan lives on; the benchmark kills it


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "parent":
        subprocess.Popen([sys.executable, __file__, "child", *args])  # noqa: S603 - this interpreter, this file
        time.sleep(3600)
    elif cmd == "child":
        child(args[0], os.environ[URL_ENV], args[1], args[2], args[3], float(args[4]), args[5])
    else:
        raise SystemExit(f"unknown command {cmd}")
