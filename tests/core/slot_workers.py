"""Worker processes for the slot stress and kill tests (run as a script, one OS process each).

  stress URL NAMESPACE WORKER SEED ROUNDS OUT [meet]
                                                 random shared/exclusive requests with random
                                                 holds; one JSON line per grant to OUT. With "meet",
                                                 round 0 is a shared hold of cap3 that lasts until
                                                 another worker holds cap3 too (support.event_workers.meet)
  hold URL NAMESPACE RESOURCE HOLDER LEASE OUT [MODE]  acquire, write the grant to OUT, then hang
                                                 (the test kills it with SIGKILL)
  wait URL NAMESPACE RESOURCE HOLDER OUT         queue as a waiter, write 'queued', then hang
  fleet URL NAMESPACE WORKER THREADS SEED OUT    THREADS waiters in one process (one ControlTable),
                                                 each acquiring once; one JSON line per grant to OUT
  policy URL NAMESPACE RESOURCE WORKER SEED ROUNDS PRIORITIES SLOTS HOLD_MIN HOLD_MAX DELAY OUT
                                                 ROUNDS requests of SLOTS with a priority drawn from
                                                 PRIORITIES (comma-separated), random holds, after
                                                 DELAY seconds; one JSON line per grant to OUT
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from pathlib import Path

from controltable import ControlTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: its support package, as the tests import it
from support.event_workers import meet  # noqa: E402


def stress(url: str, namespace: str, worker: str, seed: int, rounds: int, out: str,
           meeting_first: bool = False) -> None:
    ct = ControlTable(url, namespace=namespace)
    rng = random.Random(seed)
    meeting = Path(out).parent / "meeting"  # the run's workers write their logs side by side
    with open(out, "a", encoding="utf-8") as log:
        for i in range(rounds):
            if meeting_first and i == 0:
                resource, mode, slots = "cap3", "shared", 1
            else:
                resource = rng.choice(["cap1", "cap3"])
                mode = "exclusive" if rng.random() < 0.35 else "shared"
                slots = rng.choice([1, 1, 2]) if mode == "shared" and resource == "cap3" else 1
            time.sleep(rng.uniform(0, 0.03))
            with ct.slot(resource, holder=f"{worker}-{i}", slots=slots, mode=mode, lease=30, timeout=300) as lease:
                start = time.time()
                if meeting_first and i == 0:
                    meet(meeting, worker, "cap3")  # shared holders overlap by construction
                else:
                    time.sleep(rng.uniform(0.03, 0.15) if mode == "shared" else rng.uniform(0.001, 0.04))
                end = time.time()
                record = dict(worker=worker, resource=resource, mode=mode, slots=slots, start=start, end=end,
                              ticket=lease.ticket, token=lease.token)
            log.write(json.dumps(record) + "\n")
            log.flush()


def hold(url: str, namespace: str, resource: str, holder: str, lease: float, out: str,
         mode: str = "exclusive") -> None:
    ct = ControlTable(url, namespace=namespace)
    got = ct.acquire(resource, holder=holder, lease=lease, timeout=60, mode=mode)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"token": got.token, "granted": time.time(), "expires": got.expires_at.timestamp()}, f)
    time.sleep(3600)


def wait(url: str, namespace: str, resource: str, holder: str, out: str) -> None:
    ct = ControlTable(url, namespace=namespace)
    ct.try_acquire(resource, holder=holder, waiter_ttl=1.0)
    with open(out, "w", encoding="utf-8") as f:
        f.write("queued")
    time.sleep(3600)


def fleet(url: str, namespace: str, worker: str, threads: int, seed: int, out: str) -> None:
    ct = ControlTable(url, namespace=namespace)
    lock = threading.Lock()
    errors: list[BaseException] = []
    with open(out, "a", encoding="utf-8") as log:

        def one(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            mode = "exclusive" if rng.random() < 0.1 else "shared"
            time.sleep(rng.uniform(0, 0.5))
            try:
                # timeout: a hang detector (200 waiters, capacity 4; a loaded run's MariaDB ran out 150 s)
                with ct.slot("fleet", holder=f"{worker}-{i}", mode=mode, lease=60, timeout=900) as lease:
                    start = time.time()
                    time.sleep(rng.uniform(0.1, 0.2))
                    end = time.time()
                    record = dict(worker=f"{worker}-{i}", resource="fleet", mode=mode, slots=1, start=start, end=end,
                                  ticket=lease.ticket, token=lease.token)
                with lock:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
            except BaseException as exc:  # reported by the process's exit code
                errors.append(exc)

        pool = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    ct.close()
    if errors:
        raise SystemExit(f"{len(errors)} waiters failed, first: {errors[0]!r}")


def policy(url: str, namespace: str, resource: str, worker: str, seed: int, rounds: int, priorities: str,
           slots: int, hold_min: float, hold_max: float, delay: float, out: str) -> None:
    ct = ControlTable(url, namespace=namespace)
    rng = random.Random(seed)
    choices = [int(p) for p in priorities.split(",")]
    time.sleep(delay)
    with open(out, "a", encoding="utf-8") as log:
        for i in range(rounds):
            priority = rng.choice(choices)
            time.sleep(rng.uniform(0, 0.03))
            asked = time.time()
            with ct.slot(resource, holder=f"{worker}-{i}", slots=slots, priority=priority, lease=30,
                         timeout=120) as lease:
                start = time.time()
                time.sleep(rng.uniform(hold_min, hold_max))
                end = time.time()
                record = dict(worker=f"{worker}-{i}", resource=resource, mode="shared", slots=slots, start=start,
                              end=end, ticket=lease.ticket, token=lease.token)
            log.write(json.dumps(dict(record, priority=priority, asked=asked)) + "\n")
            log.flush()
    ct.close()


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "stress":
        stress(args[0], args[1], args[2], int(args[3]), int(args[4]), args[5], meeting_first=args[6:7] == ["meet"])
    elif cmd == "hold":
        hold(args[0], args[1], args[2], args[3], float(args[4]), args[5], *args[6:7])
    elif cmd == "fleet":
        fleet(args[0], args[1], args[2], int(args[3]), int(args[4]), args[5])
    elif cmd == "policy":
        policy(args[0], args[1], args[2], args[3], int(args[4]), int(args[5]), args[6], int(args[7]),
               float(args[8]), float(args[9]), float(args[10]), args[11])
    elif cmd == "wait":
        wait(args[0], args[1], args[2], args[3], args[4])
    else:
        raise SystemExit(f"unknown command {cmd}")
