"""The integration where Prefect users run it: ``prefect server start``, a process work pool and a worker.

A Prefect server (its own SQLite database in a temporary PREFECT_HOME), a process worker, the
ControlTableBlock registered (``prefect block register -m``) and saved, and the flows of
``live_flows/`` deployed from their folder (``live_prefect.py``). Flow runs are created and
cancelled through the REST API and checked from their own records, their logs and the control
table (on a throwaway PostgreSQL, as the Airflow and Dagster deployment tests):

- contention on a capacity-1 and a capacity-2 resource: 0 overlaps (the interval checker), tokens
  in grant order; queued runs granted FIFO, sync and async flow runs in one queue;
- a cancelled flow run (the worker SIGTERMs its process), sync or async: a waiter's queue place and
  a holder's slot are gone, the run's log saying it released on TerminationSignal;
- a SIGKILLed worker: its orphaned flow-run process stops renewing and its work is interrupted; the
  slot comes back within the lease (the orphan gives it back as it stops; the lease's expiry is the
  bound), and no work row is written after the lease's last expiry (on the database clock);
- several flow runs drain one event table: every event exactly once;
- traces: flow runs started under ``opentelemetry-instrument`` (the deployment's job variables)
  export OTLP/HTTP to a receiver this module runs; a sync and an async flow run that waited for a
  slot show its wait and hold spans as children of Prefect's own flow-run span.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect")

from live_prefect import PrefectDeployment, wait_until  # noqa: E402
from otlp_receiver import OtlpReceiver  # noqa: E402
from sqlalchemy import BigInteger, Column, DateTime, Integer, MetaData, String, Table, func, insert, select  # noqa: E402
from support.live import deployment_postgres_url, parent_of  # noqa: E402

from controltable import ControlTable  # noqa: E402
from controltable.checks import Interval, violations  # noqa: E402

pytestmark = [pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Hang detectors, never speeds (the goals are the benchmarks'): a flow run to show in the queue (the
#: worker starts a process per run), a cancelled run's queue place or slot to go (goal 2 s), an orphaned
#: flow run to let its 6 s lease go (it would never, were it renewing still).
QUEUE_HANG = 300.0
CANCEL_HANG = 120.0
ORPHAN_HANG = 120.0


@pytest.fixture(scope="module")
def live() -> Iterator[dict[str, Any]]:
    url = deployment_postgres_url("the live Prefect tests (control table)")
    namespace = f"pf_{uuid.uuid4().hex[:10]}"
    events = f"pf_ev_{uuid.uuid4().hex[:8]}"
    work = f"pf_work_{uuid.uuid4().hex[:8]}"
    # Folders of its own, not pytest's basetemp: another pytest session of the same user removes old
    # basetemps while this module's deployment still writes there.
    scratch = Path(tempfile.mkdtemp(prefix="ct-prefect-live-"))
    records = scratch / "records"
    records.mkdir()
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    meta = MetaData()
    Table(events, meta, Column("id", Integer, primary_key=True), Column("payload", String(50)))
    Table(f"{events}_log", meta, Column("event_id", Integer), Column("token", BigInteger), Column("run_id", String(64)))
    Table(work, meta, Column("run_id", String(64)), Column("n", Integer), Column("at", DateTime(timezone=True)))
    meta.create_all(ct.engine)
    ct.events(events, key="id").prepare()
    dep = PrefectDeployment(scratch / "prefect_home",
                            env={"LIVE_BLOCK": "live", "LIVE_RECORDS": str(records), "LIVE_EVENT_TABLE": events},
                            pythonpath=(str(ROOT / "core" / "src"), str(ROOT / "prefect_plugin" / "src")))
    orphans: list[int] = []
    otlp = OtlpReceiver().__enter__()
    try:
        dep.start()
        dep.save_block("live", url=url, namespace=namespace, default_lease=30.0)
        dep.deploy(HERE / "live_flows", {"hold": "flows.py:hold", "hold-async": "flows.py:hold_async",
                                          "drain": "flows.py:drain"})
        # Traced: the flow-run process under `opentelemetry-instrument` (the SDK configured from
        # OTEL_* variables, as Prefect's docs and the `prefect[otel]` extra set it up), exporting
        # OTLP/HTTP to a receiver this module runs on localhost.
        instrument = Path(dep.python).parent / "opentelemetry-instrument"
        dep.deploy(HERE / "live_flows", {"hold-traced": "flows.py:hold", "hold-async-traced": "flows.py:hold_async"},
                   job_variables={"command": f"{instrument} {dep.python} -m prefect.engine", "env": {
                       "OTEL_SERVICE_NAME": "prefect-flow-run", "OTEL_TRACES_EXPORTER": "otlp",
                       "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                       "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.endpoint,
                       "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}})
        yield {"ct": ct, "dep": dep, "records": records, "events": events, "work": work, "orphans": orphans,
               "meta": meta, "otlp": otlp}
    except BaseException:
        for name in dep.procs:
            print(f"--- {name}.log\n{dep.log_tail(name)}")
        raise
    finally:
        dep.stop()
        otlp.__exit__(None, None, None)
        for pid in orphans:  # flow-run processes a test left running on purpose
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        meta.drop_all(ct.engine)
        ct.close()
        if not os.environ.get("CT_KEEP_PREFECT_LIVE"):
            shutil.rmtree(scratch, ignore_errors=True)


def _record(live: dict[str, Any], kind: str, run_id: str) -> dict[str, Any] | None:
    path = Path(live["records"]) / f"{kind}_{run_id}.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def _entries(ct: ControlTable, resource: str) -> tuple[list[str], list[str]]:
    (st,) = ct.status([resource])
    return [h.holder for h in st.holders], [w.holder for w in st.waiters]


def _check_intervals(records: list[dict[str, Any]], resource: str, capacity: int) -> None:
    intervals = [Interval(worker=r["holder"], resource=resource, mode=r["mode"], slots=r["slots"], start=r["start"],
                          end=r["end"], ticket=r["ticket"], token=r["token"]) for r in records]
    assert violations(intervals, {resource: capacity}) == []
    tokens = [r["token"] for r in sorted(records, key=lambda r: r["start"])]
    if capacity == 1:
        assert tokens == sorted(tokens), f"tokens out of grant order: {tokens}"
    assert len(set(tokens)) == len(tokens), tokens


@pytest.mark.parametrize("capacity,runs", [(1, 4), (2, 5)])
def test_contending_flow_runs_never_overlap(live: dict[str, Any], capacity: int, runs: int) -> None:
    ct: ControlTable = live["ct"]
    dep: PrefectDeployment = live["dep"]
    resource = f"cap{capacity}"
    ct.set_capacity(resource, capacity)
    # The test holds every slot until all the runs are queued, so each of them waits whatever the
    # worker's pace (a loaded worker starting runs seconds apart would let each find a slot free).
    blocker = ct.acquire(resource, holder="shell:blocker", slots=capacity, lease=3600, timeout=0)
    ids = [dep.submit("hold", resource=resource, seconds=1.5) for _ in range(runs)]
    wait_until(lambda: sorted(_entries(ct, resource)[1]) == sorted(f"prefect:{r}" for r in ids), QUEUE_HANG,
               "every flow run to queue behind the test's hold", state=lambda: _entries(ct, resource))
    blocker.release()
    dep.wait_for_runs(ids, {"COMPLETED"}, timeout=600)
    records = [_record(live, "held", r) for r in ids]
    assert all(records), "a completed run left no record of its hold"
    _check_intervals([r for r in records if r], resource, capacity)
    holders = {r["holder"] for r in records if r}
    assert holders == {f"prefect:{r}" for r in ids}
    assert _entries(ct, resource) == ([], [])
    # Every run queued: its log says it waited (written only when its first try was refused; where it
    # stood may already read "granted" if the release came first). A run's logs reach the server late.
    line = f"controltable: waiting for {resource!r}: "
    for r in ids:
        wait_until(lambda r=r: line in dep.logs(r), QUEUE_HANG, f"flow run {r}'s log line on its queue place",
                   state=lambda r=r: dep.logs(r)[-2000:])


def test_queued_flow_runs_are_granted_fifo(live: dict[str, Any]) -> None:
    """Sync and async flow runs (``with`` and ``async with slot(...)``) in one queue, granted in its order."""
    ct: ControlTable = live["ct"]
    dep: PrefectDeployment = live["dep"]
    ct.set_capacity("fifo", 1)
    ct.acquire("fifo", holder="shell:blocker", lease=300)
    ids: list[str] = []
    for kind in ("hold", "hold-async", "hold"):  # each queued before the next is created: the order is known
        ids.append(dep.submit(kind, resource="fifo", seconds=0.5))
        wait_until(lambda: _entries(ct, "fifo")[1] == [f"prefect:{r}" for r in ids], 180,
                   f"flow run {len(ids)} to queue", state=lambda: (_entries(ct, "fifo"), dep.state(ids[-1])))
    ct.release("fifo", "shell:blocker")
    dep.wait_for_runs(ids, {"COMPLETED"}, timeout=300)
    records = [_record(live, "held", r) for r in ids]
    assert [r["run_id"] for r in sorted(records, key=lambda r: r["token"])] == ids  # type: ignore[index]
    assert [bool(r.get("async")) for r in records] == [False, True, False]  # type: ignore[union-attr]
    _check_intervals(records, "fifo", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["hold", "hold-async"])
def test_cancelled_flow_runs_free_their_queue_place_and_slot(live: dict[str, Any], kind: str) -> None:
    """Sync flows (``with slot``) and async ones (``async with slot`` on the asyncio core)."""
    ct: ControlTable = live["ct"]
    dep: PrefectDeployment = live["dep"]
    resource = "cancel" if kind == "hold" else "cancel-async"
    ct.set_capacity(resource, 1)
    holder = dep.submit(kind, resource=resource, seconds=300)
    wait_until(lambda: _record(live, "holding", holder), 180, "the first run to hold the slot")
    waiter = dep.submit(kind, resource=resource, seconds=1)
    wait_until(lambda: _entries(ct, resource)[1] == [f"prefect:{waiter}"], 180, "the second run to queue")
    behind = f"{resource!r}: position 1 behind prefect:{holder}"
    wait_until(lambda: behind in dep.logs(waiter), 60, f"the waiting run's log line {behind!r}")
    # ... and so does its state message, on the run's page (set beside the log line, read separately).
    wait_until(lambda: behind in (dep.run(waiter)["state"]["message"] or ""), 60, "the waiting run's state message",
               state=lambda: dep.run(waiter)["state"])

    started = time.monotonic()
    dep.cancel(waiter)
    wait_until(lambda: not _entries(ct, resource)[1], CANCEL_HANG,
               "the cancelled waiter's queue place to go (a hang)", interval=0.05)
    withdrawn_after = time.monotonic() - started
    assert _entries(ct, resource)[0] == [f"prefect:{holder}"]

    started = time.monotonic()
    dep.cancel(holder)
    wait_until(lambda: _entries(ct, resource) == ([], []), CANCEL_HANG,
               "the cancelled holder's slot to be freed (a hang)", interval=0.05)
    freed_after = time.monotonic() - started
    print(f"cancel {kind}: waiter's place gone after {withdrawn_after:.2f} s, holder's slot freed after "
          f"{freed_after:.2f} s")
    dep.wait_for_runs([holder, waiter], {"CANCELLED"}, timeout=120)
    # The cause: each run's own exit path, on Prefect's TerminationSignal (the worker's SIGTERM),
    # which an async flow's engine turns into the cancellation of the flow's asyncio task.
    # In an async flow the signal's exception lands where the flow's thread is: awaiting on the loop
    # it becomes the task's cancellation, inside a statement's greenlet it stays TerminationSignal
    # (seen in a run); either is the run's own exit path on the cancellation.
    whys = ["TerminationSignal"] if kind == "hold" else ["CancelledError", "TerminationSignal"]

    def said(run: str, what: str) -> bool:
        return any(f"{what} {resource!r} ({why})" in dep.logs(run) for why in whys)

    wait_until(lambda: said(waiter, "left the queue of"), 30,
               "the waiter's log line on leaving the queue", state=lambda: dep.logs(waiter)[-2000:])
    wait_until(lambda: said(holder, "released"), 30,
               "the holder's log line on releasing", state=lambda: dep.logs(holder)[-2000:])
    assert _record(live, "held", holder) is None  # the work did not run to its end


def test_sigkilled_worker_frees_the_slot_within_the_lease_and_stops_the_work(live: dict[str, Any]) -> None:
    ct: ControlTable = live["ct"]
    dep: PrefectDeployment = live["dep"]
    lease = 6.0
    ct.set_capacity("killed", 1)
    run = dep.submit("hold", resource="killed", seconds=300, lease=lease, work_table=live["work"])
    holding = wait_until(lambda: _record(live, "holding", run), 180, "the flow run to hold the slot")
    live["orphans"].append(holding["pid"])
    work = Table(live["work"], MetaData(), autoload_with=ct.engine)

    def rows() -> int:
        with ct.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(work).where(work.c.run_id == run)).scalar_one())

    wait_until(lambda: rows() > 3, 60, "the flow run's work rows")
    parent = holding["ppid"]
    assert parent != holding["pid"]
    parent_command = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    print(f"flow-run process {holding['pid']}, its parent {parent}: {parent_command}")
    (st,) = ct.status(["killed"])
    before = {h.expires_at for h in st.holders}  # the lease's expiry before the kill, for the work check
    os.kill(parent, signal.SIGKILL)  # the worker (or the process it started the flow run under)
    killed = time.monotonic()
    # Once the flow-run process is re-parented its renewer starts no renewal (it checks getppid()
    # before each): the expiries seen from here on are this one and at most one renewal sent before.
    wait_until(lambda: parent_of(holding["pid"]) != parent, 60, "the orphaned flow run to be re-parented (a hang)",
               interval=0.05)
    expiries = set()
    (st,) = ct.status(["killed"])
    expiries.update(h.expires_at for h in st.holders)

    def let_go() -> bool:  # released by the orphan as it stopped, or expired (status still lists it then)
        (st,) = ct.status(["killed"])
        expiries.update(h.expires_at for h in st.holders)
        return all(h.expired for h in st.holders)

    # An orphan that kept renewing would never let go (a hang detector; the seconds are printed, not
    # asserted: how soon the lease runs out after the kill is the machine's pace).
    wait_until(let_go, ORPHAN_HANG, "the orphan to let its lease go (it kept renewing, or a hang)", interval=0.1)
    if os.environ.get("CT_KEEP_PREFECT_LIVE"):
        os.kill(holding["pid"], signal.SIGUSR2)  # its threads' stacks, in the records
    # The slot comes back: the next in line is granted (the grant pass reaps the expired holder).
    nxt = ct.acquire("killed", holder="shell:next", timeout=ORPHAN_HANG, lease=30)
    back_after = time.monotonic() - killed
    assert _entries(ct, "killed") == (["shell:next"], [])
    last_expiry = max(e for e in expiries | before if e is not None)
    with ct.engine.connect() as conn:
        last_work = conn.execute(select(func.max(work.c.at)).where(work.c.run_id == run)).scalar_one()
    print(f"slot back {back_after:.2f} s after the SIGKILL (lease {lease:g} s); {len(expiries) - 1} renewal(s) "
          f"seen after the re-parenting; last work row {last_work}, lease's last expiry {last_expiry}")
    assert len(expiries) <= 2, f"the orphaned flow run started a renewal after its parent was gone: {sorted(expiries)}"
    assert last_work <= last_expiry, "the orphaned flow run worked on after its lease was lost"
    assert _record(live, "held", run) is None  # interrupted, never reached its end
    nxt.release()
    if dep.worker.poll() is not None:  # the parent killed was the worker: start another for later tests
        dep.start_worker()


def test_several_flow_runs_drain_an_event_table_exactly_once(live: dict[str, Any]) -> None:
    ct: ControlTable = live["ct"]
    dep: PrefectDeployment = live["dep"]
    name = live["events"]
    table = Table(name, MetaData(), autoload_with=ct.engine)
    total = 60
    with ct.engine.begin() as conn:
        conn.execute(insert(table), [{"id": i, "payload": f"p{i}"} for i in range(1, total + 1)])
    ids = [dep.submit("drain") for _ in range(3)]
    dep.wait_for_runs(ids, {"COMPLETED"}, timeout=400)
    events = ct.events(name, key="id")
    assert events.stats().done == total
    log = Table(f"{name}_log", MetaData(), autoload_with=ct.engine)
    with ct.engine.connect() as conn:
        counts = dict(conn.execute(select(log.c.event_id, func.count()).group_by(log.c.event_id)).all())
        runs = {r for (r,) in conn.execute(select(log.c.run_id).distinct())}
    assert len(counts) == total and set(counts.values()) == {1}, "an event was processed twice or never"
    assert runs <= set(ids)


@pytest.mark.parametrize("kind", ["hold-traced", "hold-async-traced"])
def test_a_waiting_flow_runs_trace_nests_the_wait_and_hold_in_prefects_run_span(live: dict[str, Any],
                                                                                  kind: str) -> None:
    """Prefect 3 opens a span per flow run (prefect/telemetry/run_telemetry.py, through the global
    tracer provider) and makes it current while the flow runs: the slot's wait and hold spans are
    its children, exported by the flow-run process to the collector (here: the test's receiver)."""
    ct: ControlTable = live["ct"]
    dep: PrefectDeployment = live["dep"]
    resource = f"traced-{kind}"
    ct.set_capacity(resource, 1)
    ct.acquire(resource, holder="shell:blocker", lease=300)
    run = dep.submit(kind, resource=resource, seconds=0.5)
    wait_until(lambda: _entries(ct, resource)[1] == [f"prefect:{run}"], 180, "the traced flow run to queue",
               state=lambda: dep.state(run))
    ct.release(resource, "shell:blocker")
    dep.wait_for_runs([run], {"COMPLETED"}, timeout=300)
    held = _record(live, "held", run)
    assert held is not None

    def exported() -> list[dict[str, Any]]:
        spans = live["otlp"].spans()
        runs = [s for s in spans if s["attributes"].get("prefect.run.id") == run]
        ours = [s for s in spans if s["name"] in (f"controltable.wait {resource}", f"controltable.hold {resource}")]
        return spans if runs and any(s["name"].startswith("controltable.hold") for s in ours) else []

    spans = wait_until(exported, 60, "the flow run's spans at the receiver",
                       state=lambda: sorted({s["name"] for s in live["otlp"].spans()}))
    (prefect_run,) = [s for s in spans if s["attributes"].get("prefect.run.id") == run]
    assert prefect_run["scope"] == "prefect" and prefect_run["attributes"]["prefect.run.type"] == "flow"
    waits = [s for s in spans if s["name"] == f"controltable.wait {resource}"]
    (granted,) = [s for s in waits if s["attributes"].get("controltable.outcome") == "granted"]
    (hold,) = [s for s in spans if s["name"] == f"controltable.hold {resource}"]
    for span in (granted, hold):
        assert span["scope"] == "controltable"
        assert span["trace_id"] == prefect_run["trace_id"], span
        assert span["parent_span_id"] == prefect_run["span_id"], span
        assert span["attributes"]["controltable.resource"] == resource
        assert span["attributes"]["controltable.holder"] == f"prefect:{run}"
        assert span["attributes"]["controltable.token"] == held["token"]
    assert granted["attributes"]["controltable.wait.seconds"] > 0
    assert hold["attributes"]["controltable.outcome"] == "released"
    # The first look (try_acquire) found the slot taken: a poll span that says so, in the same run span.
    assert any(s["attributes"].get("controltable.poll") and s["attributes"].get("controltable.outcome") == "queued"
               and s["parent_span_id"] == prefect_run["span_id"] for s in waits), waits
    print(f"{kind}: run span {prefect_run['span_id']} > wait {granted['span_id']} "
          f"({granted['attributes']['controltable.wait.seconds']:.2f} s), hold {hold['span_id']}")
