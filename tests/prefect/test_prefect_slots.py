"""slot() in Prefect flows and tasks, in-process against a temporary Prefect server (prefect_test_harness).

What a run holds, under which holder id and attempt, what its log and state say while it waits,
and that every way out (completion, failure, cancellation of the waiting or holding code, a lost
lease) leaves the control table clean. The same against a running server and worker, with
SIGTERM and SIGKILL, is in test_prefect_live.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any
from uuid import UUID

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.exceptions import TerminationSignal
from prefect_controltable import ControlTableBlock, slot
from support.live import await_until, wait_until

from controltable import ControlTable, LeaseLostInterrupt

pytestmark = pytest.mark.timeout(1800)

#: Every wait below is a hang detector (several times what it takes on a loaded machine), never a speed.
HANG = 600


def _entries(ct: ControlTable, resource: str) -> tuple[list[str], list[str]]:
    (st,) = ct.status([resource])
    return [h.holder for h in st.holders], [w.holder for w in st.waiters]


async def _aentries(ct: ControlTable, resource: str) -> tuple[list[str], list[str]]:
    """:func:`_entries` from async code: in a thread, never blocking the loop (on SQLite a blocked loop
    would keep the async slot's own transaction from finishing while the sync call waits for its lock)."""
    return await asyncio.to_thread(_entries, ct, resource)


def _logs(flow_run_id: UUID) -> str:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(entry.message for entry in logs)


def test_a_flow_holds_the_slot_as_its_run_and_releases_it(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    seen: dict[str, Any] = {}

    @flow
    def hold() -> str:
        from prefect.runtime import flow_run

        with slot("wh", block=block) as lease:
            seen.update(holder=lease.holder, token=lease.token, attempt=lease.attempt,
                        during=_entries(ct, "wh"))
        return str(flow_run.id)

    run_id = hold()
    assert seen["holder"] == f"prefect:{run_id}"
    assert seen["attempt"] == 1
    assert seen["during"] == ([f"prefect:{run_id}"], [])
    assert _entries(ct, "wh") == ([], [])


def test_a_task_retry_is_a_new_attempt_with_a_higher_token(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    tries: list[tuple[str, int, int]] = []

    @task(retries=1, retry_delay_seconds=0)
    def load() -> None:
        with slot("wh", block=block) as lease:
            tries.append((lease.holder, int(lease.attempt or 0), lease.token))
            if len(tries) == 1:
                raise RuntimeError("first attempt fails inside the slot")

    @flow
    def run() -> None:
        load()

    run()
    (holder1, attempt1, token1), (holder2, attempt2, token2) = tries
    assert holder1 == holder2 and holder1.startswith("prefect:") and holder1.count(":") == 2
    assert (attempt1, attempt2) == (1, 2)
    assert token2 > token1
    assert _entries(ct, "wh") == ([], [])


def test_a_failing_task_releases_the_slot(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)

    @task
    def boom() -> None:
        with slot("wh", block=block):
            raise ValueError("work failed")

    @flow
    def run() -> None:
        boom()

    with pytest.raises(ValueError, match="work failed"):
        run()
    assert _entries(ct, "wh") == ([], [])


def test_termination_while_holding_and_while_waiting_releases(block: ControlTableBlock, ct: ControlTable) -> None:
    """Prefect turns the SIGTERM of a cancellation into TerminationSignal, a BaseException: both
    the holder's block and a waiter's queue place are freed on the way out."""
    ct.set_capacity("wh", 1)
    with pytest.raises(TerminationSignal), slot("wh", block=block, holder="t:holder"):
        assert _entries(ct, "wh") == (["t:holder"], [])
        raise TerminationSignal(signal=15)
    assert _entries(ct, "wh") == ([], [])

    ct.acquire("wh", holder="shell:blocker", lease=3600)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            with slot("wh", block=block, holder="t:waiter", timeout=2.0):
                pass
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(HANG)
    assert not waiter.is_alive(), "hang: the waiter did not time out"
    assert type(outcome[0]).__name__ == "AcquireTimeout"
    assert _entries(ct, "wh") == (["shell:blocker"], [])
    ct.release("wh", "shell:blocker")


def test_a_waiting_flow_says_where_it_stands_in_its_log_and_state(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    ct.acquire("wh", holder="airflow:etl:load", lease=3600)
    ids: list[str] = []

    @flow
    def waits() -> None:
        from prefect.runtime import flow_run

        ids.append(str(flow_run.id))
        with slot("wh", block=block):
            pass

    thread = threading.Thread(target=waits)
    thread.start()
    wait_until(lambda: ids and _entries(ct, "wh")[1] == [f"prefect:{ids[0]}"], HANG, "the flow run to queue")
    run_id = UUID(ids[0])
    with get_client(sync_client=True) as client:
        wait_until(lambda: "position 1 behind airflow:etl:load" in (client.read_flow_run(run_id).state.message or ""),
                   HANG, "the flow run's state message")
    ct.release("wh", "airflow:etl:load")
    thread.join(HANG)
    assert not thread.is_alive(), "hang: the flow run did not get the slot"
    text = wait_until(lambda: (lambda t: t if "released" in t else None)(_logs(run_id)), HANG, "the run's logs")
    assert "controltable: waiting for 'wh': 'wh': position 1 behind airflow:etl:load" in text
    assert "held by airflow:etl:load" in text
    assert "granted 'wh' after waiting" in text
    assert f"as 'prefect:{run_id}', attempt 1, fencing token" in text
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run_id).state.is_completed()
    assert _entries(ct, "wh") == ([], [])


def test_status_page_linked_from_the_run(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    linked = block.model_copy(update={"status_url": "http://status.example:8080/"})

    @flow
    def hold() -> str:
        from prefect.runtime import flow_run

        with slot("wh", block=linked):
            pass
        return str(flow_run.id)

    run_id = UUID(hold())
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    assert [(a.key, a.type) for a in arts] == [("controltable-status", "markdown")] or \
        [(a.key, "link" in (a.data or "")) for a in arts] == [("controltable-status", True)], arts
    assert "http://status.example:8080/" in str(arts[0].data)


def test_decorator_sync_and_async_and_a_saved_block_by_name(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    name = f"ct-{ct.namespace.replace('_', '-')}"
    block.save(name, overwrite=True)
    seen: list[tuple[str, list[str]]] = []

    @task
    @slot("wh", block=name)
    def sync_work() -> None:
        seen.append(("sync", _entries(ct, "wh")[0]))

    @task
    @slot("wh", block=name)
    async def async_work() -> None:
        seen.append(("async", (await _aentries(ct, "wh"))[0]))

    @flow
    async def run() -> None:
        await async_work()
        sync_work()

    asyncio.run(run())
    assert [kind for kind, _ in seen] == ["async", "sync"]
    for _, holders in seen:
        assert len(holders) == 1 and holders[0].startswith("prefect:")
    assert _entries(ct, "wh") == ([], [])


def test_async_waiter_cancelled_leaves_the_queue(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    ct.acquire("wh", holder="shell:blocker", lease=3600)

    async def main() -> None:
        async def waiter() -> None:
            async with slot("wh", block=block, holder="async:waiter"):
                raise AssertionError("granted while the blocker holds the slot")

        job = asyncio.create_task(waiter())

        async def queued() -> bool:
            return (await _aentries(ct, "wh"))[1] == ["async:waiter"]

        await await_until(queued, HANG, "the waiter to queue", state=lambda: _aentries(ct, "wh"))
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    asyncio.run(asyncio.wait_for(main(), HANG))
    assert _entries(ct, "wh") == (["shell:blocker"], [])
    ct.release("wh", "shell:blocker")


def test_async_holder_is_cancelled_when_its_lease_is_lost(block: ControlTableBlock, ct: ControlTable) -> None:
    """The lease taken away (here: released by an operator) cancels the awaiting work; the block
    raises LeaseLostInterrupt instead of letting it run on beside the next holder."""
    ct.set_capacity("wh", 1)
    reached: list[str] = []

    async def main() -> None:
        async with slot("wh", block=block, holder="async:holder", lease=3.0):
            await asyncio.to_thread(ct.release, "wh", "async:holder")  # gone: the renewer finds it lost
            await asyncio.sleep(60)
            reached.append("work ran on after the loss")

    with pytest.raises(LeaseLostInterrupt):
        asyncio.run(asyncio.wait_for(main(), HANG))
    assert reached == []
    assert _entries(ct, "wh") == ([], [])


def test_async_tasks_queue_fifo_as_their_runs_over_the_native_async_driver(block: ControlTableBlock,
                                                                             ct: ControlTable,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Three async task runs of one async flow wait in one event loop: granted in queue order, each
    as its own task run (holder, attempt 1), the waits in the run's log, the statements on the
    backend's asyncio driver (no worker thread polls the sync core)."""
    caplog.set_level(logging.INFO)
    ct.set_capacity("wh", 1)
    ct.acquire("wh", holder="shell:blocker", lease=3600)
    granted: list[tuple[int, str, int, int]] = []
    drivers: list[tuple[str, bool]] = []

    @task
    async def work(n: int) -> None:
        async with slot("wh", block=block) as lease:
            granted.append((n, lease.holder, lease.attempt, lease.token))
            await asyncio.sleep(0.05)

    @flow
    async def contend() -> str:
        from prefect.runtime import flow_run

        act = block.async_control_table()
        drivers.append((act.sync.engine.dialect.driver, bool(act.sync.engine.dialect.is_async)))
        jobs = []
        async def queued() -> list[str]:
            return [w.holder for w in (await act.status(["wh"]))[0].waiters]

        async def queued_runs_are(n: int) -> bool:
            return len(await queued()) == n

        def waits_logged() -> int:
            return sum("controltable: waiting for 'wh'" in r.getMessage() for r in caplog.records)

        # Each queued, and its wait logged, before the next starts: the queue order is known, and each
        # log line says where its run stood before the blocker left. (A run logs its place after it has
        # entered the queue, from a second read: waiting for the entry alone let the release come
        # between the two under load, and the third run's line named two ahead instead of three.)
        for n in range(3):
            jobs.append(asyncio.create_task(work(n)))
            await await_until(lambda n=n: queued_runs_are(n + 1), HANG, f"task run {n} to queue", state=queued)
            await await_until(lambda n=n: waits_logged() == n + 1, HANG, f"task run {n}'s wait to be logged",
                              state=waits_logged)
        await act.release("wh", "shell:blocker")
        await asyncio.gather(*jobs)
        return str(flow_run.id)

    run_id = asyncio.run(asyncio.wait_for(contend(), HANG))
    assert drivers == [(drivers[0][0], True)], drivers  # aiosqlite, psycopg (async), aiomysql
    assert [n for n, *_ in granted] == [0, 1, 2]
    assert [token for *_, token in granted] == sorted(token for *_, token in granted)
    holders = [holder for _, holder, _, _ in granted]
    assert all(h.startswith(f"prefect:{run_id}:") for h in holders) and len(set(holders)) == 3
    assert [attempt for _, _, attempt, _ in granted] == [1, 1, 1]
    logs = wait_until(lambda: (text := _logs(UUID(run_id))).count("controltable: granted 'wh'") == 3 and text,
                      HANG, "the three task runs' log lines")
    assert "controltable: waiting for 'wh': 'wh': position 1 behind shell:blocker" in logs
    assert "position 3 behind shell:blocker, " in logs  # the third names everyone ahead
    assert _entries(ct, "wh") == ([], [])


def test_async_task_failure_releases_and_its_retry_is_a_new_attempt(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    tries: list[tuple[str, int, int, tuple[list[str], list[str]]]] = []

    @task(retries=1, retry_delay_seconds=0)
    async def flaky() -> None:
        async with slot("wh", block=block) as lease:
            tries.append((lease.holder, lease.attempt, lease.token, await _aentries(ct, "wh")))
            if len(tries) == 1:
                raise RuntimeError("first try fails")

    @flow
    async def run() -> None:
        await flaky()

    asyncio.run(asyncio.wait_for(run(), HANG))
    (h1, a1, t1, during1), (h2, a2, t2, _) = tries
    assert h1 == h2 and during1 == ([h1], [])
    assert (a1, a2) == (1, 2) and t2 > t1
    assert _entries(ct, "wh") == ([], [])


def test_an_async_flow_waiting_says_so_in_its_state_message(block: ControlTableBlock, ct: ControlTable) -> None:
    ct.set_capacity("wh", 1)
    ct.acquire("wh", holder="shell:blocker", lease=3600)
    messages: list[str] = []

    @flow
    async def waits() -> str:
        from prefect.client.orchestration import get_client
        from prefect.runtime import flow_run

        async def hold() -> None:
            async with slot("wh", block=block):
                pass

        job = asyncio.create_task(hold())
        async with get_client() as client:
            async def message() -> str:
                return (await client.read_flow_run(flow_run.id)).state.message or ""

            async def waiting() -> str:
                text = await message()
                return text if "waiting for 'wh'" in text else ""

            messages.append(await await_until(waiting, HANG, "the run's state message to show the wait",
                                              state=message))
            await block.async_control_table().release("wh", "shell:blocker")
            await job
            messages.append((await client.read_flow_run(flow_run.id)).state.message or "")
        return str(flow_run.id)

    asyncio.run(asyncio.wait_for(waits(), HANG))
    assert "controltable: waiting for 'wh': 'wh': position 1 behind shell:blocker" in messages[0]
    assert messages[1].startswith("controltable: holding 'wh' (waited"), messages
    assert _entries(ct, "wh") == ([], [])
