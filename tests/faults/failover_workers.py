"""The failover tests' slot worker (run as a script; one OS process each).

  slots URL NAMESPACE NAME SEED LOG STOP
      random shared/exclusive requests on cap1/cap3 until STOP exists. One line per grant the
      moment ``acquire`` returned (``{"g": resource, "tok": token, "t": time}``: the test sees
      every token a caller was handed, including those in commits a promoted standby never
      received), and one per hold confirmed at its end (``{"iv": ...}``, for
      :func:`controltable.checks.violations`). Exceptions are logged as fault_workers.py does.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional

from fault_workers import Log  # the script's own folder is on sys.path

from controltable import ControlTable


def slots(args: argparse.Namespace) -> int:
    log = Log(args.log)
    stop = Path(args.stop)
    ct = ControlTable(args.url, namespace=args.namespace)
    rng = random.Random(args.seed)
    i = 0
    request: Optional[tuple[str, str, int]] = None
    while not stop.exists():
        if request is None:
            i += 1  # a failed acquire retries the same holder: it keeps (or re-takes) its place
            resource = rng.choice(["cap1", "cap3"])
            mode = "exclusive" if rng.random() < 0.3 else "shared"
            request = (resource, mode, rng.choice([1, 1, 2]) if mode == "shared" and resource == "cap3" else 1)
        resource, mode, n = request
        lease: Any = None
        try:
            lease = ct.acquire(resource, holder=f"{args.name}-{i}", slots=n, mode=mode, lease=args.lease,
                               timeout=60)
        except Exception as exc:
            log.error("acquire", exc)
            time.sleep(0.1)
            continue
        request = None
        log.write(g=resource, tok=lease.token, t=time.time(), worker=args.name)
        try:
            start = time.time()
            time.sleep(rng.uniform(0.01, 0.06))
            end = time.time()
            lease.check()  # a grant the failover lost ends here, with LeaseLost
            log.write(iv=dict(worker=args.name, resource=resource, mode=mode, slots=n, start=start, end=end,
                              ticket=lease.ticket, token=lease.token))
            lease.release()
        except Exception as exc:
            log.error("slots", exc)
            time.sleep(0.1)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("slots")
    for name in ("url", "namespace", "name", "seed", "log", "stop"):
        s.add_argument(name)
    s.add_argument("--lease", type=float, default=3.0)
    s.set_defaults(fn=slots)
    args = p.parse_args()
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
