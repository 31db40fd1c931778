"""PostgreSQL failover, live: the primary killed (SIGKILL) and its streaming standby promoted under load.

A primary and a standby (``initdb``, ``pg_basebackup -R``) are started by the test; slot workers
and event drainers run as separate processes through the libpq multi-host URL
``host=primary&host=standby&target_session_attrs=read-write``, so they find the new primary by
themselves. Two runs:

* asynchronous: the standby is stopped for a while, the primary grants and completes on alone
  (those commits are lost by design), then the primary is killed, the standby started again and
  promoted. Tokens handed out after the promotion must exceed every token handed out before it,
  the lost ones included; completions lost with the primary come back as pending events and are
  completed again (at-least-once), none is lost.
* synchronous (``synchronous_standby_names``): killed while running; no grant and no completion
  may be lost, and no event is reported completed twice.

A work list is driven from the test process: three allocations right before the kill, one after
the promotion, whose token must be above theirs; the three learn at their renewal whether the
failover kept them (synchronous: all held; asynchronous: all lost, LeaseLost).

Both: capacity never exceeded among the holds confirmed at their end, every exception a worker
saw is a ControlTableError, nothing printed to stderr, and the time from the kill to the first
grant on the promoted standby is printed (goal: <= 5 s beyond the promotion itself, plus what the
leases the promoted server inherited from before the kill still ran: a holder whose release was lost
keeps its slot until then, and the workers may all be waiting on that resource).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from support.live import wait_until
from support.required import fail_or_skip

from controltable import ControlTable, LeaseLost, checks
from controltable.defaults import TOKEN_EPOCH_BITS
from controltable.dialects import epoch_begins, next_token, token_epoch

from .replication import ReplicatedPostgres
from .servers import postgres_bin
from .test_faults import _error_summary, _finish, _read, _report, _retry

pytestmark = [pytest.mark.faults]

HERE = Path(__file__).parent
EVENTS = 15_000
CAPACITIES = {"cap1": 1, "cap3": 3}
#: Kill to first grant on the promoted standby, beyond the promotion itself (seconds): the goal,
#: printed in the report; asserted only as a hang detector (5x), never as a speed.
RECOVERY_GOAL = 5.0


def test_next_token_jumps_above_every_earlier_epoch() -> None:
    """The arithmetic the proof rests on (docs/production-databases.md), and what each dialect reads."""
    span = 2**TOKEN_EPOCH_BITS
    assert [next_token(last, 1) for last in (0, 5, 10**9)] == [1, 6, 10**9 + 1]  # timeline 1: unchanged
    assert next_token(11, 2) == span + 1 and next_token(span + 7, 2) == span + 8
    # Every token timeline 2 can issue (fewer than 2**40) is below the first one of timeline 3 or later.
    assert next_token(2 * span, 3) == 2 * span + 1 > span + (span - 1)
    assert next_token(5, 9) == 8 * span + 1 < 2**53
    assert next_token(3, 0) == 4, "no epoch (0 or 1) leaves the counter alone"
    # Until the first token of a later epoch, the grant pass treats the queue as inherited.
    assert not epoch_begins(5, 1) and not epoch_begins(0, 0)
    assert epoch_begins(11, 2) and epoch_begins(span - 1, 2) and not epoch_begins(span + 1, 2)
    assert epoch_begins(span + 1, 3) and not epoch_begins(next_token(span + 1, 3), 3)
    pg = str(select(token_epoch()).compile(dialect=postgresql.dialect()))
    assert "pg_walfile_name(pg_current_wal_lsn())" in pg and "SUBSTR" in pg
    for dialect in (mysql.dialect(), sqlite.dialect()):
        assert str(select(token_epoch()).compile(dialect=dialect)).startswith("SELECT 1")


@pytest.fixture(params=["async", "sync"])
def pair(request: pytest.FixtureRequest) -> Iterator[ReplicatedPostgres]:
    if postgres_bin() is None or not (postgres_bin() / "pg_basebackup").exists():  # type: ignore[operator]
        missing = "PostgreSQL server binaries (initdb, pg_basebackup, pg_ctl) are not installed"
        fail_or_skip(missing, "failover", "postgres")
    p = ReplicatedPostgres(synchronous=request.param == "sync")
    try:
        p.wait_streaming()
        yield p
    finally:
        p.close()


def _spawn(script: str, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, str(HERE / script), *args], env=env, stderr=subprocess.PIPE)


def _wait_for(what: str, check: Any, seconds: float, state: Any = None) -> None:
    wait_until(check, seconds, what, state=state)


#: Hang detector for the drain of EVENTS: how long it may go without completing anything. Its total
#: time is the machine's pace (3,000 batches, two commits each; a loaded run took over 120 s).
STALL = 60.0


def _wait_for_all_done(what: str, done: Any, total: int) -> None:
    """Wait until ``done()`` reaches ``total``; fail only when it stops growing for STALL seconds."""
    last, since = -1, time.monotonic()
    while True:
        now_done = done()
        if now_done >= total:
            return
        if now_done > last:
            last, since = now_done, time.monotonic()
        elif time.monotonic() - since > STALL:
            raise AssertionError(f"hang: {what}: no progress for {STALL:g} s at {now_done} of {total}")
        time.sleep(0.5)


@pytest.mark.timeout(1800)  # a hang detector over the waits' own (the drain's is a stall of STALL s)
def test_failover_keeps_tokens_increasing_and_completions_once(pair: ReplicatedPostgres, tmp_path: Path) -> None:
    mode = "sync" if pair.synchronous else "async"
    url = pair.url()
    namespace = f"fo_{uuid.uuid4().hex[:8]}"
    name = f"ev_{uuid.uuid4().hex[:8]}"
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    for resource, cap in CAPACITIES.items():
        ct.set_capacity(resource, cap)
    md = MetaData()
    table = Table(name, md, Column("id", Integer, primary_key=True, autoincrement=False),
                  Column("payload", String(100), nullable=False))
    md.create_all(ct.engine)
    with ct.engine.begin() as conn:
        conn.execute(insert(table), [{"id": k, "payload": f"event {k}"} for k in range(EVENTS)])
    ev = ct.events(name, key="id")
    ev.prepare()
    ct.worklist("wl").populate(range(40))
    ct.close()
    # The work list is driven from here: allocations right before the kill (lost with the primary
    # when the standby is down) and after the promotion, whose token must be above them.
    control = ControlTable(url, namespace=namespace)
    wl = control.worklist("wl")

    stop = tmp_path / "stop"
    slot_logs = [tmp_path / f"slots-{i}.jsonl" for i in range(3)]
    drain_logs = [tmp_path / f"drain-{i}.jsonl" for i in range(2)]
    procs = [_spawn("fault_workers.py", "slots", url, namespace, f"s{i}", str(100 + i), str(log), str(stop),
                    "--lease", "3", "--grants")
             for i, log in enumerate(slot_logs)]

    def grants() -> list[dict[str, Any]]:
        return [r for r in _read(slot_logs) if "g" in r]

    def completed() -> int:
        return sum(len(r["c"]) for r in _read(drain_logs) if "c" in r)

    promote_s = 0.0
    inherited: dict[str, tuple[int, int]] = {}
    lease_left = 0.0
    try:
        # The drain starts once the slot fleet runs, so that it is still busy when the primary dies.
        _wait_for("grants on the primary", lambda: len(grants()) >= 30, 60)
        procs += [_spawn("fault_workers.py", "drain", url, namespace, name, f"d{i}", str(log), str(stop),
                         "--size", "5", "--lease", "3", "--max-seconds", "1500", *(["--chain"] if i else []))
                  for i, log in enumerate(drain_logs)]
        _wait_for("completions on the primary", lambda: completed() >= 300, 60)
        if not pair.synchronous:
            # The standby goes away; the primary grants and completes on alone: commits to lose.
            pair.standby.stop("fast")
            before = (len(grants()), completed())
            _wait_for("commits the standby does not have",
                      lambda: len(grants()) >= before[0] + 20 and completed() >= before[1] + 200, 60,
                      lambda: (before, len(grants()), completed(), [p.poll() for p in procs]))
        held = [item for item in (wl.allocate(owner="before", lease=300) for _ in range(3)) if item is not None]
        killed_at = pair.kill_primary()
        completed_at_kill = completed()
        t0 = time.time()
        if not pair.synchronous:
            pair.standby.start()
        promoted_at = pair.promote()
        promote_s = promoted_at - t0
        # What the promoted server's queues hold as it starts (the workers race this read): with
        # the standby behind, entries of callers that moved on, each delaying its queue by
        # FAILOVER_PICKUP, not by its own pickup (GrantPasses._after_promotion).
        at_promotion = _retry(lambda: control.status(list(CAPACITIES)))
        inherited = {s.name: (len(s.holders), len(s.waiters)) for s in at_promotion}
        # A holder whose release was lost with the old primary keeps its slot until its lease runs
        # out (documented): the fleet may wait that long beyond the goal when every worker waits on it.
        lease_left = max([0.0] + [h.expires_at.timestamp() - killed_at for s in at_promotion for h in s.holders
                                  if h.expires_at and h.since and h.since.timestamp() < killed_at])
        _wait_for("a grant on the promoted standby", lambda: any(r["t"] > promoted_at for r in grants()), 60)
        item_after = _retry(lambda: wl.allocate(owner="after", lease=300))
        # A holder of an allocation the failover lost learns it at its next renewal.
        renewals = []
        for item in held:
            try:
                item.renew()
                renewals.append("held")
            except LeaseLost:
                renewals.append("lost")
        mark = len(grants())
        _wait_for("grants after the failover", lambda: len(grants()) >= mark + 40, 90)
        check = ControlTable(url, namespace=namespace)
        ev = check.events(name, key="id")
        _wait_for_all_done("the drain to finish", lambda: _retry(ev.stats).done, EVENTS)
    finally:
        tails = _finish(procs, stop)

    slot_records = _read(slot_logs)
    drain_records = _read(drain_logs)
    got = [r for r in slot_records if "g" in r]
    first_after = min(r["t"] for r in got if r["t"] > promoted_at)
    recovery = first_after - killed_at
    # Tokens per resource: every token handed out before the promotion (lost ones included)
    # against every token handed out after it. No grant is made between the kill and the promotion.
    order_problems = []
    lost_grants = 0
    history = {(h.resource, h.token) for h in _retry(lambda: check.history(since=3600, limit=100_000))}
    for resource in CAPACITIES:
        before_tokens = [r["tok"] for r in got if r["g"] == resource and r["t"] < killed_at + 0.5]
        after_tokens = [r["tok"] for r in got if r["g"] == resource and r["t"] > promoted_at]
        assert before_tokens and after_tokens, f"{resource}: no grants on one side of the failover"
        if min(after_tokens) <= max(before_tokens):
            order_problems.append((resource, max(before_tokens), min(after_tokens)))
        lost_grants += sum(1 for t in before_tokens if (resource, t) not in history)
    before_items = [item.token for item in held]
    if item_after is None or len(before_items) < 3 or item_after.token <= max(before_items):
        order_problems.append(("worklist", before_items, item_after and item_after.token))
    control.close()
    intervals = [checks.Interval(**r["iv"]) for r in slot_records if "iv" in r]
    # Capacity and exclusivity over the whole run; FIFO on each side of the failover only (the
    # queue's tickets, like its tokens, count on from what the promoted standby had received).
    violations = [v for v in checks.violations(intervals, CAPACITIES) if "FIFO" not in v]
    for side in ([iv for iv in intervals if iv.start < killed_at], [iv for iv in intervals if iv.start > promoted_at]):
        violations += checks.violations(side, CAPACITIES)
    completions = [k for r in drain_records if "c" in r for k in r["c"]]
    twice = [k for k, n in Counter(completions).items() if n > 1]
    errors, foreign = _error_summary(slot_records + drain_records)
    final = _retry(ev.stats)
    check.close()
    _report(
        f"failover {mode}: kill -> first grant on the promoted standby {recovery:.2f} s "
        f"(promotion{' with the standby restart' if not pair.synchronous else ''} {promote_s:.2f} s), "
        f"queues at the promotion (holders, waiters) {inherited}, inherited leases ran {lease_left:.2f} s "
        f"past the kill, "
        f"grants {len(got)}, lost grants {lost_grants}, token order problems {order_problems}, "
        f"work-list allocations before the kill {renewals} at their renewal after it, "
        f"violations {len(violations)}, completed twice {len(twice)} (of {len(completions)} completions), "
        f"final {final.as_dict()}; worker exceptions {dict(errors)}"
    )
    assert not foreign, f"exceptions that are not ControlTableErrors reached the workers: {foreign[:5]}"
    assert all(p.returncode == 0 for p in procs), f"a worker failed: {tails}"
    assert completed_at_kill < EVENTS, "the drain was over before the primary died: it tested nothing"
    assert all(not tail.strip() for tail in tails), f"a worker printed to stderr: {tails}"
    assert order_problems == [], "a token after the promotion is not above every token before it"
    assert violations == [], violations[:10]
    assert (final.done, final.pending, final.claimed, final.error) == (EVENTS, 0, 0, 0), final.as_dict()
    # The goal (RECOVERY_GOAL beyond the promotion and the inherited leases) is reported above; a
    # loaded CI machine once took 5.62 s against 5.3 s with the code doing what it promises.
    assert recovery <= 5 * RECOVERY_GOAL + promote_s + lease_left, (
        f"hang: the fleet took {recovery:.1f} s to grant again (goal {RECOVERY_GOAL:g} s beyond the promotion)")
    if pair.synchronous:
        assert lost_grants == 0, "a synchronous standby lost an acknowledged grant"
        assert renewals == ["held"] * 3, "a synchronous standby lost an acknowledged allocation"
        assert twice == [], f"events reported completed twice: {twice[:10]}"
    else:
        # The scenario must have lost commits, or it proved nothing about lost tokens.
        assert lost_grants > 0, "no grant was lost: the asynchronous run did not test lost tokens"
        assert renewals == ["lost"] * 3, "allocations made while the standby was down survived the failover"
