"""Worker processes for the fault tests (run as a script; one OS process each).

  drain URL NAMESPACE TABLE NAME LOG STOP [--size N --lease S --chain]
      claim batches and complete them until STOP exists or nothing is left; log JSON lines
      {"p": keys, "tok": t} when a batch is processed and {"c": keys, "tok": t} once its
      completion returned (the batch is recorded done).
  slots URL NAMESPACE NAME SEED LOG STOP [--lease S --grants --meet]
      random shared/exclusive requests on cap1/cap3 with short holds until STOP exists; one line
      per hold whose lease was confirmed held at its end: {"iv": Interval fields}. With --meet the
      first hold is one shared slot of cap3, held until another worker is seen holding cap3 too
      (support.event_workers.meet): the overlap of shared holders the test checks for is made by
      construction, not left to timing. With --grants
      (the failover test) also one line per grant the moment ``acquire`` returned,
      {"g": resource, "tok": token, "t": time, "worker": name}: every token a caller was handed,
      including those in commits a promoted standby never received.

Every exception a worker sees is logged as {"err": class, "ct": is-a-ControlTableError, "op": ...}
and the worker carries on (after a short pause), as a production worker that catches
``ControlTableError`` would; the test asserts that every logged exception was a ControlTableError.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional, TextIO

from controltable import ControlTable, ControlTableError, LeaseLost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: its support package, as the tests import it
from support.event_workers import meet  # noqa: E402


class Log:
    def __init__(self, path: str) -> None:
        self.f: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at exit

    def write(self, **record: Any) -> None:
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()

    def error(self, op: str, exc: BaseException) -> None:
        text = str(exc).strip().splitlines()
        ct = isinstance(exc, ControlTableError)
        # An exception that is not ours is a defect: where it came from goes into the record (and so
        # into the test's failure message), since the worker's process is gone when the test reads it.
        where = {} if ct else {"tb": "".join(traceback.format_exception(exc))[-3000:]}
        self.write(err=type(exc).__name__, module=type(exc).__module__, ct=ct,
                   op=op, msg=text[0][:300] if text else "", **where)


def drain(args: argparse.Namespace) -> int:
    log = Log(args.log)
    stop = Path(args.stop)
    ct = ControlTable(args.url, namespace=args.namespace)
    ev = ct.events(args.table, key="id", lease=args.lease)
    rng = random.Random(args.name)
    batch: Any = None
    deadline = time.monotonic() + args.max_seconds
    while not stop.exists() and time.monotonic() < deadline:
        try:
            if batch is None:
                batch = ev.claim(args.size, owner=args.name, wait=0.5)
            if batch is None:
                st = ev.stats()
                if st.pending == 0 and st.claimed == 0:
                    return 0
                continue
            log.write(p=batch.keys, tok=batch.token)
            time.sleep(rng.uniform(0, 0.004))  # "processing"
            current, batch = batch, None
            if args.chain:
                batch = current.complete_and_claim(args.size)
            else:
                current.complete()
            log.write(c=current.keys, tok=current.token)
        except LeaseLost as exc:
            log.error("drain", exc)
            batch = None
        except Exception as exc:  # recorded: the test asserts every one is a ControlTableError
            log.error("drain", exc)
            batch = None
            time.sleep(0.2)
    return 0


def slots(args: argparse.Namespace) -> int:
    log = Log(args.log)
    stop = Path(args.stop)
    ct = ControlTable(args.url, namespace=args.namespace)
    rng = random.Random(args.seed)
    meeting = Path(args.log).parent / "meeting" if args.meet else None  # the workers' logs lie side by side
    i = 0
    request: Optional[tuple[str, str, int]] = None
    while not stop.exists():
        if request is None:
            # A new request; after a failed acquire the same one (same holder) is retried, which
            # keeps its place in the queue: a new holder would queue behind the old entry until
            # that entry's waiter_ttl ran out.
            i += 1
            resource = rng.choice(["cap1", "cap3"])
            mode = "exclusive" if rng.random() < 0.35 else "shared"
            request = (resource, mode, rng.choice([1, 1, 2]) if mode == "shared" and resource == "cap3" else 1)
            if meeting is not None and i == 1:
                request = ("cap3", "shared", 1)  # before any pair has met, a second worker always gets in
        resource, mode, n = request
        meets = meeting if i == 1 else None  # this hold is the meeting
        lease: Optional[Any] = None
        try:
            # The meeting hold waits for another worker's process to start: its lease outlasts meet()'s
            # own 120 s hang detector, so the wait cannot cost the hold its lease.
            lease = ct.acquire(resource, holder=f"{args.name}-{i}", slots=n, mode=mode,
                               lease=args.lease if meets is None else 150.0, timeout=60)
        except Exception as exc:
            log.error("acquire", exc)
            time.sleep(0.2)
            continue
        request = None
        if args.grants:
            log.write(g=resource, tok=lease.token, t=time.time(), worker=args.name)
        try:
            start = time.time()  # after acquire returned
            if meets is not None:
                meet(meets, args.name, "cap3")
            else:
                time.sleep(rng.uniform(0.02, 0.1) if mode == "shared" else rng.uniform(0.001, 0.03))
            end = time.time()  # before the lease is checked and released
            # Only a hold confirmed at its end is recorded: a lease that expired during an outage (or
            # a grant a failover lost) may have been granted to someone else, and that is reported
            # (LeaseLost), not a violation.
            lease.check()
            log.write(iv=dict(worker=args.name, resource=resource, mode=mode, slots=n, start=start, end=end,
                              ticket=lease.ticket, token=lease.token))
            lease.release()
        except Exception as exc:
            log.error("slots", exc)
            time.sleep(0.2)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("drain")
    for name in ("url", "namespace", "table", "name", "log", "stop"):
        d.add_argument(name)
    d.add_argument("--size", type=int, default=50)
    d.add_argument("--lease", type=float, default=4.0)
    d.add_argument("--chain", action="store_true")
    d.add_argument("--max-seconds", type=float, default=300.0)
    d.set_defaults(fn=drain)
    s = sub.add_parser("slots")
    for name in ("url", "namespace", "name", "seed", "log", "stop"):
        s.add_argument(name)
    s.add_argument("--lease", type=float, default=4.0)
    s.add_argument("--grants", action="store_true")
    s.add_argument("--meet", action="store_true")
    s.set_defaults(fn=slots)
    args = p.parse_args()
    try:
        return int(args.fn(args))
    except BaseException as exc:  # the worker itself died: log it for the test, then fail
        Log(args.log).error("worker", exc)
        raise


if __name__ == "__main__":
    sys.exit(main())
