"""Worker processes for the event-claiming and work-list concurrency tests.

Run as a standalone script (``python event_workers.py <command> ...``) so every worker is a real
operating-system process with its own connection pool. The test modules import it as
``support.event_workers`` for the event table definition and the process helpers at the bottom.

Commands:
  drain     claim batches until every event is done, logging completed keys as JSON lines
  produce   insert new events in chunks while the drain runs, then touch a "done" flag
  hang      claim one batch with a short lease and sleep (the test SIGKILLs it)
  timed     claim one batch after a start barrier, say so, hold it until told, complete it, report
  worklist  work through a work list, logging (id, order, start, end) per item
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert

WORKER_SCRIPT = Path(__file__).resolve()


# -- shared definitions -------------------------------------------------------------------------
def event_table(name: str, metadata: Optional[MetaData] = None) -> Table:
    """The event table the tests create: explicit integer keys, a payload and an event time."""
    return Table(
        name,
        metadata if metadata is not None else MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("payload", String(100), nullable=False),
        Column("created_at", Float, nullable=True),
    )


def event_rows(start: int, count: int) -> list[dict[str, Any]]:
    now = time.time()
    return [{"id": k, "payload": f"event {k}", "created_at": now} for k in range(start, start + count)]


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.005)


def _control(args: argparse.Namespace) -> Any:
    from controltable import ControlTable

    return ControlTable(args.url, namespace=args.namespace)


# -- commands -----------------------------------------------------------------------------------
def cmd_drain(args: argparse.Namespace) -> int:
    from controltable import LeaseLost

    ct = _control(args)
    ev = ct.events(args.table, key="id", lease=args.lease)
    done_flag = Path(args.done_flag) if args.done_flag else None
    deadline = time.monotonic() + args.max_seconds
    with open(args.log, "a", encoding="utf-8") as log:
        while time.monotonic() < deadline:
            batch = ev.claim(args.size, owner=args.name)
            if batch is None:
                if done_flag is None or done_flag.exists():
                    st = ev.stats()
                    if st.pending == 0 and st.claimed == 0:
                        return 0
                time.sleep(args.idle)
                continue
            if args.work:
                # Announce the batch first, so a test can SIGKILL this worker while it "works".
                log.write(json.dumps({"claimed": batch.keys, "token": batch.token}) + "\n")
                log.flush()
                time.sleep(args.work)
            try:
                batch.complete()
            except LeaseLost as exc:  # the rows were re-claimed: somebody else completes them
                print(f"{args.name}: lease lost on {len(exc.keys)} rows", file=sys.stderr)
                continue
            log.write(json.dumps({"keys": batch.keys, "token": batch.token, "t": time.time()}) + "\n")
            log.flush()
    print(f"{args.name}: gave up after {args.max_seconds} s", file=sys.stderr)
    return 3


def cmd_produce(args: argparse.Namespace) -> int:
    ct = _control(args)
    table = event_table(args.table)
    if args.wait_for:
        # Start only once the drain is under way (some worker logged a batch).
        paths = [Path(p) for p in args.wait_for]
        deadline = time.monotonic() + 120
        while not any(p.exists() and p.stat().st_size > 0 for p in paths):
            if time.monotonic() > deadline:
                print("producer: the drain never started", file=sys.stderr)
                return 3
            time.sleep(0.01)
    first = last = None
    key, end = args.start, args.start + args.count
    while key < end:
        n = min(args.chunk, end - key)
        with ct.engine.begin() as conn:
            conn.execute(insert(table), event_rows(key, n))
        last = time.time()
        first = first or last
        key += n
        time.sleep(args.interval)
    write_json_atomic(Path(args.done_flag), {"first_insert": first, "last_insert": last})
    return 0


def cmd_hang(args: argparse.Namespace) -> int:
    ct = _control(args)
    ev = ct.events(args.table, key="id")
    batch = ev.claim(args.size, owner=args.name, lease=args.lease)
    write_json_atomic(Path(args.ready), {
        "keys": batch.keys if batch else [], "token": batch.token if batch else None,
        "expires_at": batch.expires_at.timestamp() if batch else None,
    })
    time.sleep(args.sleep)  # "processing" forever: the test kills us here
    return 0


def cmd_timed(args: argparse.Namespace) -> int:
    ct = _control(args)
    ev = ct.events(args.table, key="id")
    _ = ev.table  # reflect now, and open a pooled connection: start-up is not what we measure
    ct.now()
    Path(args.ready).touch()
    _wait_for_file(Path(args.go), 120)
    t0 = time.time()
    batch = ev.claim(args.size, owner=args.name)
    claimed = time.time()
    keys = batch.keys if batch else []
    # Holds its batch until the test says finish: the test then sees both batches claimed at once.
    write_json_atomic(Path(args.claimed), keys)
    _wait_for_file(Path(args.finish), 120)
    if batch is not None:
        batch.complete()
    t1 = time.time()
    write_json_atomic(Path(args.result), {"keys": keys, "start": t0, "claimed": claimed, "end": t1})
    return 0


def meet(meeting: Path, name: str, what: str) -> None:
    """Hold on (inside a recorded work interval) until another worker is seen inside one too, or until
    some pair of workers has met: the overlap a test checks for (or it proves nothing) is then made by
    construction, not left to the luck of timing (a loaded machine once served every hold alone).

    A worker's marker exists only inside its recorded interval (call this after recording ``start``;
    record ``end`` after it returns), so seeing another's marker means the two intervals overlap. The
    caller makes sure a second worker can always get in (the slot stress's round 0: one shared slot
    of three, nothing exclusive ahead; a work list's order: several items), so a wait that does not
    end is a defect, reported as a hang after 120 s. ``what`` names the shared thing in that message.
    """
    meeting.mkdir(exist_ok=True)
    mine, met = meeting / f"in.{name}", meeting / "met"
    mine.touch()
    hang = time.monotonic() + 120.0
    try:
        while not met.exists():
            if any(p != mine for p in meeting.glob("in.*")):
                met.touch()
                return
            if time.monotonic() > hang:
                raise SystemExit(f"{name}: hang: no other worker was in {what} within 120 s")
            time.sleep(0.01)
    finally:
        mine.unlink()


def cmd_worklist(args: argparse.Namespace) -> int:
    ct = _control(args)
    wl = ct.worklist(args.worklist)
    rnd = random.Random(args.seed)
    if args.ready:
        ct.now()
        Path(args.ready).touch()
        _wait_for_file(Path(args.go), 120)
    with open(args.log, "a", encoding="utf-8") as log:
        for item in wl.items(owner=args.name, poll_interval=args.poll, timeout=args.max_seconds):
            start = time.time()  # after allocate returned
            if item.order == args.meet_order:
                meet(Path(args.log).parent / f"meeting-{item.order}", args.name, f"an item of order {item.order}")
            else:
                time.sleep(rnd.uniform(args.min_work, args.max_work))
            end = time.time()  # before complete is called
            log.write(json.dumps({"id": item.id, "order": item.order, "payload": item.payload, "start": start,
                                  "end": end, "token": item.token, "owner": args.name}) + "\n")
            log.flush()
            item.complete()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--url", required=True)
        sp.add_argument("--namespace", default="default")
        sp.add_argument("--name", default=f"worker-{os.getpid()}")

    sp = sub.add_parser("drain")
    common(sp)
    sp.add_argument("--table", required=True)
    sp.add_argument("--log", required=True)
    sp.add_argument("--size", type=int, default=200)
    sp.add_argument("--lease", type=float, default=120.0)
    sp.add_argument("--work", type=float, default=0.0)
    sp.add_argument("--idle", type=float, default=0.05)
    sp.add_argument("--done-flag")
    sp.add_argument("--max-seconds", type=float, default=300.0)
    sp.set_defaults(fn=cmd_drain)

    sp = sub.add_parser("produce")
    common(sp)
    sp.add_argument("--table", required=True)
    sp.add_argument("--start", type=int, required=True)
    sp.add_argument("--count", type=int, required=True)
    sp.add_argument("--chunk", type=int, default=100)
    sp.add_argument("--interval", type=float, default=0.02)
    sp.add_argument("--done-flag", required=True)
    sp.add_argument("--wait-for", nargs="*")
    sp.set_defaults(fn=cmd_produce)

    sp = sub.add_parser("hang")
    common(sp)
    sp.add_argument("--table", required=True)
    sp.add_argument("--size", type=int, default=50)
    sp.add_argument("--lease", type=float, default=2.0)
    sp.add_argument("--ready", required=True)
    sp.add_argument("--sleep", type=float, default=600.0)
    sp.set_defaults(fn=cmd_hang)

    sp = sub.add_parser("timed")
    common(sp)
    sp.add_argument("--table", required=True)
    sp.add_argument("--size", type=int, default=5)
    sp.add_argument("--ready", required=True)
    sp.add_argument("--go", required=True)
    sp.add_argument("--claimed", required=True, help="written once the claim returned (its keys)")
    sp.add_argument("--finish", required=True, help="the batch is held until this file exists")
    sp.add_argument("--result", required=True)
    sp.set_defaults(fn=cmd_timed)

    sp = sub.add_parser("worklist")
    common(sp)
    sp.add_argument("--worklist", required=True)
    sp.add_argument("--log", required=True)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--min-work", type=float, default=0.2)
    sp.add_argument("--max-work", type=float, default=0.6)
    sp.add_argument("--poll", type=float, default=0.02)
    sp.add_argument("--max-seconds", type=float, default=120.0)
    sp.add_argument("--ready")
    sp.add_argument("--go")
    sp.add_argument("--meet-order", type=int, help="work items of this order until another worker works one too")
    sp.set_defaults(fn=cmd_worklist)

    args = p.parse_args(argv)
    return int(args.fn(args))


# -- helpers for the test modules (process management) -----------------------------------------
class Workers:
    """Worker processes started by one test; stderr goes to files so pipes never fill up."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stderr: dict[str, Any] = {}

    def start(self, name: str, command: str, *args: Any) -> subprocess.Popen[bytes]:
        err = open(self.dir / f"{name}.stderr", "wb")  # noqa: SIM115 - closed in close()
        argv = [sys.executable, str(WORKER_SCRIPT), command, "--name", name, *[str(a) for a in args]]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        self.procs[name] = proc
        self._stderr[name] = err
        return proc

    def stderr(self, name: str) -> str:
        path = self.dir / f"{name}.stderr"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill(self, name: str) -> int:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=30)

    def wait(self, names: Iterable[str], timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for name in names:
            try:
                codes[name] = self.procs[name].wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.close()
                raise AssertionError(
                    f"worker {name} still running after {timeout} s; stderr:\n{self.stderr(name)}"
                ) from None
        bad = {n: c for n, c in codes.items() if c != 0}
        assert not bad, "workers failed: " + "; ".join(f"{n} exit {c}: {self.stderr(n)}" for n, c in bad.items())
        return codes

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        for f in self._stderr.values():
            f.close()


def wait_for_files(paths: Iterable[Path], timeout: float, workers: Optional[Workers] = None) -> None:
    """Wait until every path exists, failing early if a worker process died."""
    paths = list(paths)
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if workers is not None:
            dead = {n: p.returncode for n, p in workers.procs.items() if p.poll() not in (None, 0)}
            if dead:
                raise AssertionError("worker died: " + "; ".join(f"{n} exit {c}: {workers.stderr(n)}"
                                                                 for n, c in dead.items()))
        if time.monotonic() > deadline:
            raise AssertionError(f"hang: timed out after {timeout} s waiting for {[str(p) for p in paths]}")
        time.sleep(0.01)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())
