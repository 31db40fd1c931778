"""The asyncio API (``controltable.aio``) keeps the sync API's promises, on every live backend.

Each test runs one event loop (``asyncio.run``) over the async driver of the backend under test;
a sync ``ControlTable`` (the ``ct`` fixture) or another process plays the other side. Times are
hang detectors only.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from typing import Any, Awaitable, TypeVar

import pytest

pytest.importorskip("greenlet")
pytest.importorskip("aiosqlite")
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select
from support.live import await_until

from controltable.aio import AsyncControlTable, AsyncLease, async_url
from controltable.errors import AcquireTimeout, ConfigurationError, LeaseLost, LeaseLostInterrupt, UnknownResourceError

T = TypeVar("T")
HANG = 120.0


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        try:
            return await asyncio.wait_for(coro, HANG)
        except asyncio.TimeoutError:
            raise AssertionError(f"hang: the async test did not finish within {HANG} s") from None

    return asyncio.run(bounded())


def twin(ct: Any) -> AsyncControlTable:
    return AsyncControlTable.from_control_table(ct)


async def waiting(act: AsyncControlTable, resource: str) -> list[str]:
    (st,) = await act.status(resource)
    return [w.holder for w in st.waiters]


def test_async_url_swaps_the_driver() -> None:
    assert async_url("sqlite:///x.db").startswith("sqlite+aiosqlite:")
    assert async_url("postgresql+psycopg://u@h/d").startswith("postgresql+psycopg_async:")
    assert async_url("mysql+pymysql://u@h/d").startswith("mysql+aiomysql:")
    assert async_url("sqlite+aiosqlite:///x.db").startswith("sqlite+aiosqlite:")
    with pytest.raises(ConfigurationError, match="asyncio driver"):
        async_url("mssql+pyodbc://u@h/d")


def test_a_backend_without_an_async_driver_runs_in_threads() -> None:
    """SQL Server and Oracle keep the API (the Airflow triggers use it): calls go to threads."""
    from controltable.aio import _target

    assert _target("mssql+pyodbc://u@h/d") == "mssql+pyodbc://u@h/d"
    assert _target("oracle+oracledb://u@h/d") == "oracle+oracledb://u@h/d"
    assert str(_target("sqlite:///x.db")).startswith("sqlite+aiosqlite:")


@pytest.mark.backends("postgres", "mysql")
def test_an_event_loops_tasks_wait_longer_for_the_shared_pool_than_threads(ct: Any) -> None:
    """A loaded CI run's 1,000 tasks entering one queue at once waited over SQLAlchemy's 30 s for the
    loop's 15 pooled connections and failed with DatabaseBusyError: an asyncio engine's pool waits
    ASYNC_POOL_TIMEOUT (its FIFO is the tasks' turn), a thread's the sync bound."""
    from controltable import defaults

    act = AsyncControlTable.from_control_table(ct)
    try:
        assert act.sync.db.engine.pool.timeout() == defaults.ASYNC_POOL_TIMEOUT
        assert ct.db.engine.pool.timeout() == defaults.POOL_TIMEOUT < defaults.ASYNC_POOL_TIMEOUT
    finally:
        asyncio.run(act.close())


def test_a_renewal_still_waiting_when_the_lease_ends_interrupts_the_work() -> None:
    """A renewal that waits (for a pooled connection the loop's other tasks hold, up to
    ASYNC_POOL_TIMEOUT, or for the database) past the lease's end cannot save it: the block's work is
    cancelled at the end (the renewer's own bound), not when the wait ends, and the loss says why.
    Here the renewal never returns; before the bound the work ran on until the wait gave up."""
    import types

    from controltable.aio import AsyncSlotBlock

    class Stuck:
        """A lease whose renewal never comes back; no database behind it."""

        def __init__(self) -> None:
            self.sync = types.SimpleNamespace(lease_seconds=0.6, lost=None)
            self.holder = "stuck"
            self.renewals = 0

        async def renew(self) -> None:
            self.renewals += 1
            await asyncio.Event().wait()

        async def __aexit__(self, *exc: Any) -> None:
            return None

    stuck = Stuck()

    async def acquire() -> Any:
        return stuck

    async def main() -> None:
        async with AsyncSlotBlock(acquire, True):
            await asyncio.sleep(HANG)  # the work: only the loss can end it before the hang detector

    with pytest.raises(LeaseLostInterrupt) as info:
        asyncio.run(main())
    assert stuck.renewals == 1
    assert "still waiting" in str(info.value.__cause__), info.value.__cause__


def test_fifo_behind_a_sync_holder_in_another_process(ct: Any, namespace: str) -> None:
    """Async waiters queued one after another are granted in that order once the holder in
    another process (the sync API) lets go."""
    ct.set_capacity("fifo", 1)
    url = ct.db.engine.url.render_as_string(hide_password=False)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from controltable import ControlTable
            ct = ControlTable({url!r}, namespace={namespace!r})
            lease = ct.acquire("fifo", holder="sync-holder", timeout=30)
            print("held", flush=True)
            sys.stdin.readline()
            lease.release()
            print("released", flush=True)
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"

        async def main() -> list[str]:
            async with twin(ct) as act:
                granted: list[str] = []

                async def worker(name: str) -> None:
                    async with act.slot("fifo", holder=name, timeout=60):
                        granted.append(name)

                names = [f"w{i}" for i in range(5)]
                tasks = []
                for i, name in enumerate(names):
                    tasks.append(asyncio.create_task(worker(name)))
                    await await_until(lambda n=i: _count_is(act, n + 1), HANG, f"waiter {name} to enter the queue")
                assert await waiting(act, "fifo") == names
                holder.stdin.write("\n")  # type: ignore[union-attr]
                holder.stdin.flush()  # type: ignore[union-attr]
                await asyncio.gather(*tasks)
                return granted

        assert run(main()) == [f"w{i}" for i in range(5)]
        assert holder.stdout.readline().strip() == "released"
    finally:
        holder.kill()
        holder.wait(10)


async def _count_is(act: AsyncControlTable, n: int) -> bool:
    return len(await waiting(act, "fifo")) == n


def test_same_errors_as_the_sync_api(ct: Any) -> None:
    async def main() -> None:
        async with twin(ct) as act:
            with pytest.raises(UnknownResourceError) as async_err:
                await act.acquire("no-such-resource", holder="x", timeout=0)
            with pytest.raises(UnknownResourceError) as sync_err:
                ct.acquire("no-such-resource", holder="x", timeout=0)
            assert str(async_err.value) == str(sync_err.value)
            with pytest.raises(ConfigurationError):
                await act.acquire("r", holder="", timeout=0)

    run(main())


def test_bounded_wait_ends_by_timeout_and_withdraws(ct: Any) -> None:
    ct.set_capacity("bounded", 1)
    held = ct.acquire("bounded", holder="sync-holder")

    async def main() -> None:
        async with twin(ct) as act:
            with pytest.raises(AcquireTimeout):
                await act.acquire("bounded", holder="late", timeout=0.5)
            assert await waiting(act, "bounded") == []  # withdrawn: nobody is held up by it

    run(main())
    held.release()


def test_cancelling_a_waiting_task_withdraws_its_entry(ct: Any) -> None:
    ct.set_capacity("cancel", 1)
    held = ct.acquire("cancel", holder="sync-holder")

    async def main() -> None:
        async with twin(ct) as act:
            task = asyncio.create_task(act.acquire("cancel", holder="gives-up"))
            await await_until(lambda: _has_waiter(act, "cancel", "gives-up"), HANG, "the waiter to enter the queue")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await waiting(act, "cancel") == []

    run(main())
    held.release()


async def _has_waiter(act: AsyncControlTable, resource: str, holder: str) -> bool:
    return holder in await waiting(act, resource)


def test_try_acquire_keeps_the_place_and_release_withdraws(ct: Any) -> None:
    ct.set_capacity("poll", 1)
    held = ct.acquire("poll", holder="sync-holder")

    async def main() -> None:
        async with twin(ct) as act:
            assert await act.try_acquire("poll", holder="poller", waiter_ttl=60) is None
            assert await waiting(act, "poll") == ["poller"]
            held.release()
            lease = await act.try_acquire("poll", holder="poller", waiter_ttl=60)
            assert isinstance(lease, AsyncLease) and lease.holder == "poller"
            assert await act.release("poll", "poller") == 1
            (st,) = await act.status("poll")
            assert st.holders == [] and st.waiters == []

    run(main())


def test_push_wakeup_ends_the_wait(ct: Any) -> None:
    """On PostgreSQL a release pushes: the waiter's sleep ends woken, not at its poll interval."""
    if ct.db.dialect_name != "postgresql":
        pytest.skip("push wake-ups are PostgreSQL's")
    ct.set_capacity("push", 1)
    held = ct.acquire("push", holder="sync-holder")

    async def main() -> list[bool]:
        async with twin(ct) as act:
            wakeups = act.sync.runtime.wakeups
            assert (await act.push_status()).active
            inner = wakeups.waiter
            assert inner is not None
            outcomes: list[bool] = []

            def recording(keys: list[str], seconds: float, since: Any = None) -> Any:
                woken = inner(keys, seconds, since)
                if woken is not None:
                    outcomes.append(woken)
                return woken

            wakeups.waiter = recording
            task = asyncio.create_task(act.acquire("push", holder="woken", timeout=60))
            await await_until(lambda: _has_waiter(act, "push", "woken"), HANG, "the waiter to enter the queue")
            await asyncio.to_thread(held.release)
            lease = await task
            await lease.release()
            return outcomes

    outcomes = run(main())
    assert outcomes and outcomes[-1] is True, f"the wait that ended in the grant was not woken by a push: {outcomes}"


def test_lost_lease_cancels_the_work_and_rolls_back_its_statement(ct: Any) -> None:
    ct.set_capacity("lost", 1)
    work = Table(f"{ct.namespace}_work", MetaData(), Column("id", Integer, primary_key=True, autoincrement=True),
                 Column("n", Integer, nullable=False))
    work.create(ct.engine)
    try:
        async def main() -> tuple[int, BaseException]:
            async with twin(ct) as act:
                done = 0
                entered = asyncio.Event()

                async def body() -> None:
                    nonlocal done
                    async with act.slot("lost", holder="doomed", lease=1.5):
                        entered.set()
                        while True:
                            await asyncio.to_thread(lambda: None)  # let the loop breathe
                            await _insert(act, work, done)
                            done += 1

                task = asyncio.create_task(body())
                await entered.wait()
                await asyncio.to_thread(ct.release, "lost", "doomed")  # taken away behind its back
                try:
                    await task
                except BaseException as exc:  # noqa: BLE001 - the test inspects it
                    return done, exc
                raise AssertionError("the work ran on after its lease was lost")

        done, exc = run(main())
        assert isinstance(exc, LeaseLostInterrupt) and isinstance(exc, LeaseLost), repr(exc)
        rows = ct.db.run(lambda c: c.scalar(select(func.count()).select_from(work)))
        # Nothing runs on after the cancellation: the insert in flight either rolled back or had
        # committed (the cancel then landed while its connection went back to the pool).
        assert done <= rows <= done + 1
        assert ct.db.run(lambda c: c.scalar(select(func.count()).select_from(work))) == rows
        (st,) = ct.status("lost")
        assert st.holders == []
    finally:
        work.drop(ct.engine)


async def _insert(act: AsyncControlTable, work: Table, n: int) -> None:
    from sqlalchemy.util import greenlet_spawn

    await greenlet_spawn(act.sync.db.run, lambda c: c.execute(insert(work).values(n=n)), idempotent=False)


def test_claim_complete_exactly_once_across_tasks(ct: Any, event_table: Any) -> None:
    ev = event_table(60)

    async def main() -> list[Any]:
        async with twin(ct) as act:
            aev = act.events(ev.name, key="id")
            seen: list[Any] = []

            async def consumer(i: int) -> None:
                while True:
                    batch = await aev.claim(7, owner=f"c{i}")
                    if batch is None:
                        return
                    seen.extend(batch.keys)
                    await batch.complete()

            await asyncio.gather(*(consumer(i) for i in range(6)))
            return seen

    seen = run(main())
    assert sorted(seen) == list(range(1, 61))


def test_worklist_allocate_complete_across_tasks(ct: Any) -> None:
    wl = ct.worklist("aio-list")
    for order in range(3):
        wl.populate([{"i": i} for i in range(4)], order=order + 1)

    async def main() -> list[int]:
        async with twin(ct) as act:
            awl = act.worklist("aio-list")
            done: list[int] = []

            async def worker(i: int) -> None:
                async for item in awl.items(owner=f"w{i}", timeout=30):
                    done.append(item.id)
                    await item.complete()

            await asyncio.gather(*(worker(i) for i in range(3)))
            assert (await awl.status()).finished
            return done

    done = run(main())
    assert len(done) == 12 and len(set(done)) == 12


def test_a_statement_deadline_belongs_to_its_task(tmp_path: Any) -> None:
    """Tasks of one loop run their statements in one thread: each keeps its own deadline (a
    ``threading.local`` would hand one task's deadline to the other)."""
    from controltable.db import Database

    db = Database(f"sqlite:///{tmp_path / 'd.db'}")

    async def task(until: float, seen: list[Any], gate: asyncio.Event, other: asyncio.Event) -> None:
        with db.deadline(until):
            gate.set()
            await other.wait()  # the other task has set its deadline meanwhile
            seen.append(db._local.deadline)
        seen.append(getattr(db._local, "deadline", None))

    async def main() -> tuple[list[Any], list[Any]]:
        a_seen: list[Any] = []
        b_seen: list[Any] = []
        a_in, b_in = asyncio.Event(), asyncio.Event()
        await asyncio.gather(task(100.0, a_seen, a_in, b_in), task(200.0, b_seen, b_in, a_in))
        return a_seen, b_seen

    a_seen, b_seen = run(main())
    assert a_seen == [100.0, None] and b_seen == [200.0, None]
    db.dispose()


def test_interrupt_false_lets_the_work_run_on_and_the_exit_reports_the_loss(ct: Any) -> None:
    ct.set_capacity("runs-on", 1)

    async def main() -> BaseException:
        async with twin(ct) as act:
            try:
                async with act.slot("runs-on", holder="stubborn", lease=1.5, interrupt=False) as lease:
                    await asyncio.to_thread(ct.release, "runs-on", "stubborn")  # taken away behind its back
                    # the renewer records the loss; the work is not cancelled
                    await await_until(lambda: lease.sync.lost is not None, HANG, "the renewer to notice the loss")
            except LeaseLost as exc:
                return exc
            raise AssertionError("the exit did not report the lost lease")

    exc = run(main())
    assert type(exc) is LeaseLost, repr(exc)


def test_async_wait_and_hold_are_spans_nested_in_the_tasks_span(ct: Any) -> None:
    """The traces of issue 36 part 3 through the async API: the wait and the hold nest in the
    caller's span, and the work inside ``async with`` is the hold's child."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import controltable.tracing as tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    ct.set_capacity("traced", 1)

    async def main() -> None:
        async with twin(ct) as act:
            with tracer.start_as_current_span("task"):
                async with act.slot("traced", holder="t"):
                    with tracer.start_as_current_span("work"):
                        await asyncio.sleep(0)

    tracing.use_provider(provider)
    try:
        run(main())
    finally:
        tracing.use_provider(None)
        provider.shutdown()
    found = {s.name: s for s in exporter.get_finished_spans()}
    task, wait, hold, work = (found[n] for n in ("task", "controltable.wait traced", "controltable.hold traced",
                                                 "work"))

    def child_of(span: Any, parent: Any) -> bool:
        return span.parent is not None and span.parent.span_id == parent.context.span_id

    assert child_of(wait, task) and child_of(hold, task), "the wait and the hold are the task's children"
    assert child_of(work, hold), "the work inside the async slot is the hold's child"
    assert hold.attributes is not None and hold.attributes["controltable.outcome"] == "released"


def test_an_orphaned_process_stops_renewing_and_its_work_is_cancelled(ct: Any, monkeypatch: Any) -> None:
    """``stop_when_orphaned``: once the parent is gone (the sync renewer's own test,
    ``renewal.parent_gone``, here made true on cue) the renewal task stops, the work's task is
    cancelled and the block raises LeaseLostInterrupt saying why; the slot is not held on."""
    import controltable.aio as aio

    ct.set_capacity("orphan", 1)
    orphaned = {"now": False}
    seen_parents: list[int] = []

    def parent_gone(original: int) -> bool:
        seen_parents.append(original)
        return orphaned["now"]

    monkeypatch.setattr(aio, "parent_gone", parent_gone)

    async def main() -> BaseException:
        async with twin(ct) as act:
            try:
                async with act.slot("orphan", holder="orphan", lease=30, stop_when_orphaned=True):
                    orphaned["now"] = True
                    await asyncio.sleep(300)
            except LeaseLostInterrupt as exc:
                return exc
            raise AssertionError("the work ran to its end")

    exc = run(main())
    assert "orphaned" in str(exc), exc
    assert seen_parents and set(seen_parents) == {os.getppid()}
    (st,) = ct.status("orphan")
    assert [h.holder for h in st.holders if not h.expired] == []


@pytest.mark.backends("sqlite", "postgres")
def test_loop_shared_is_one_twin_per_loop_and_key_closed_when_its_loop_ends(ct: Any) -> None:
    """What the Airflow triggers and Prefect's async tasks share: one twin per loop, closed at its end.

    The database's side is the pool: a twin still pooling after ``asyncio.run`` returned is a
    connection left open on the server for every loop (``tests/airflow/test_airflow_slots.py``
    counts the sockets). A loop closed without ``shutdown_asyncgens`` is swept on the next call.
    (Not on MariaDB: an aiomysql connection dropped after its loop closed raises from ``__del__``,
    which the sweep cannot prevent; the closing at the loop's end is the same code on every backend.)
    """
    from controltable import aio

    ct.set_capacity("r", 1)
    made: list[AsyncControlTable] = []

    def make() -> AsyncControlTable:
        made.append(twin(ct))
        return made[-1]

    async def use() -> asyncio.AbstractEventLoop:
        first = aio.loop_shared(("test", id(ct)), make)
        assert aio.loop_shared(("test", id(ct)), make) is first  # one per loop and key
        lease = await first.acquire("r", holder="h", timeout=10)
        await lease.release()
        assert first.sync.db.engine.pool.checkedin() >= 1  # pooled while the loop runs
        return asyncio.get_running_loop()

    ended = [asyncio.run(use()) for _ in range(2)]
    assert len(made) == 2 and made[0] is not made[1]  # a loop's twin is never another loop's
    assert all(m.sync.db.engine.pool.checkedin() == 0 for m in made)  # closed at each loop's end
    assert not set(ended) & set(aio._PER_LOOP)

    bare = asyncio.new_event_loop()  # closed without shutdown_asyncgens: nothing runs the closer
    bare.run_until_complete(use())
    bare.close()
    assert bare in aio._PER_LOOP and made[-1].sync.db.engine.pool.checkedin() >= 1
    asyncio.run(use())  # the next call from any loop sweeps it
    assert bare not in aio._PER_LOOP and made[2].sync.db.engine.pool.checkedin() == 0


def test_a_failed_withdrawal_is_left_to_expire_not_retried_from_a_thread(tmp_path: Any, caplog: Any) -> None:
    """The sync API retries a withdrawal the database refused from a background thread; under an async
    driver that thread's statements failed with MissingGreenlet (seen in a loaded run's log, after a
    cancelled wait), so the entry is left to expire, and the log says within how long."""
    import logging

    from controltable.slots.entering import new_request

    act = AsyncControlTable(f"sqlite+aiosqlite:///{tmp_path / 'w.db'}")
    waiter = act.sync._slots.waiter
    req = new_request("r", "h", 1, "exclusive", 60, 30, 8, None)
    with caplog.at_level(logging.INFO, logger="controltable"):
        waiter._defer_withdrawal(req, "key")
    assert waiter._withdrawer is None and not waiter._withdrawals  # no thread, nothing pending
    assert "expires within 38 s" in caplog.text
