"""``slot()``: hold a controltable slot in a Prefect flow or task, as a context manager or decorator, sync or async.

The counterpart of Prefect's own ``concurrency()`` (same shape: names first, a context manager
usable in flows and tasks), with the coordination state in the user's database instead of the
Prefect server, so Airflow tasks, Dagster ops and shell jobs share the limit.

- Holder: the run (:mod:`.run`); attempt: the run's ``run_count`` (a retry gets a new fencing token).
- Waiting: FIFO inside the run. The run's log says what it waits for, its queue position and who
  holds the slot, again whenever the position changes (checked every
  :data:`PROGRESS_INTERVAL`); a flow run's state message says the same (:mod:`.show`).
- Release: on completion, on failure, and on cancellation and crash. Prefect stops a cancelled
  flow run by SIGTERM, which its engine turns into ``TerminationSignal`` (a ``BaseException``)
  raised in the flow's thread: it passes through this block's exit, which releases at once. A
  waiter leaves the queue the same way. A process killed outright (SIGKILL) frees its slot when
  the lease runs out; a flow-run process whose worker died stops renewing (it is an orphan nobody
  will record) and so lets the lease run out too, and its work is interrupted by the core when
  the lease is found lost (``LeaseLostInterrupt``, unless the block's ``interrupt_on_lease_loss``
  is off).
- Async: ``async with slot(...)`` runs on the core's asyncio API (:mod:`controltable.aio`: native
  async drivers, the block's :meth:`~.ControlTableBlock.async_control_table`): the same FIFO wait
  (push wake-ups awaited on the loop), log lines and state message, no thread. Cancelling the
  awaiting task leaves the queue; renewal is an asyncio task; a lease found lost cancels the task
  holding it (asyncio's own cancellation) and the block raises ``LeaseLostInterrupt``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from typing import Any, Callable, Coroutine, Mapping, Optional, TypeVar, Union, cast

import anyio
import anyio.to_thread

from controltable import ControlTable, Lease, LeaseLost
from controltable.aio import AsyncControlTable, AsyncLease, AsyncSlotBlock
from controltable.defaults import DEFAULT_MODE, DEFAULT_SLOT_PRIORITY, DEFAULT_WAITER_TTL
from controltable.interrupt import protected
from controltable.waiting_text import Resource, awhere, names, names_list, where

from .block import ControlTableBlock, resolve_block
from .run import RunIdentity, current_run, log
from .show import aset_flow_run_message, link_status_page, set_flow_run_message

F = TypeVar("F", bound=Callable[..., Any])

#: Seconds between two looks at a waiter's queue position (a changed position is logged again).
PROGRESS_INTERVAL = 15.0
#: Longest an async waiter's clean-up (leaving the queue) is awaited once its task is cancelled again (seconds).
ASYNC_CLEANUP_BOUND = 30.0


class _Held:
    """One entry of a scope: the lease, who holds it, and how the wait went."""

    def __init__(self, lease: Lease, run: RunIdentity, label: str) -> None:
        self.lease = lease
        self.run = run
        self.label = label
        #: The core's async slot block holding the lease (``async with``), None in sync use.
        self.scope: Optional[AsyncSlotBlock] = None


class SlotScope:
    """What :func:`slot` returns: ``with``, ``async with``, or ``@`` on a sync or async function."""

    def __init__(self, resource: Resource, *, block: Union[ControlTableBlock, str, None], slots: int, mode: str,
                 timeout: Optional[float], lease: Optional[float], waiter_ttl: float, priority: int,
                 holder: Optional[str], interrupt: Optional[bool]) -> None:
        self.resource = resource
        self.block = block
        self.options = {"slots": slots, "mode": mode, "waiter_ttl": waiter_ttl, "priority": priority}
        self.timeout = timeout
        self.lease_seconds = lease
        self.holder = holder
        self.interrupt = interrupt
        self.label = names(resource)
        self._stack: list[_Held] = []  # nested or repeated entries of one scope object, innermost last

    def _copy(self) -> SlotScope:
        return SlotScope(self.resource, block=self.block, timeout=self.timeout, lease=self.lease_seconds,
                         holder=self.holder, interrupt=self.interrupt, **self.options)  # type: ignore[arg-type]

    # -- sync --------------------------------------------------------------------------------
    @protected
    def __enter__(self) -> Lease:
        block = resolve_block(self.block)
        ct = block.control_table()
        run = current_run()
        who = self.holder or run.holder
        lease_s = self.lease_seconds or block.default_lease
        started = time.monotonic()
        position: Optional[int] = None
        progress: Optional[_Progress] = None
        try:
            granted = self._try(ct, who, lease_s, run)
            if granted is None:
                position = self._waiting(ct, who, run, block)
                progress = _Progress(ct, self.resource, who, run, position)
                granted = ct.acquire(self.resource, holder=who, timeout=self.timeout, lease=lease_s,
                                     attempt=run.attempt, **self.options)  # type: ignore[arg-type]
        except BaseException as exc:  # timed out, failed, or the run was cancelled while it waited
            _withdraw(ct, self.resource, who)
            run.logger.info(f"controltable: left the queue of {self.label} ({type(exc).__name__})")
            raise
        finally:
            if progress is not None:
                progress.stop()
        self._granted(granted, run, block, position, time.monotonic() - started)
        granted.interrupt = block.interrupt_on_lease_loss if self.interrupt is None else bool(self.interrupt)
        # Under a worker the flow-run process is supervised: if the worker dies, nobody records the
        # outcome, so the lease must lapse rather than be renewed by an orphan.
        granted.start_renewing(stop_when_orphaned=run.supervised)
        held = _Held(granted.__enter__(), run, self.label)
        self._stack.append(held)
        return held.lease

    @protected
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        held = self._stack.pop()
        try:
            held.lease.__exit__(exc_type, exc, tb)
        finally:
            _released(held, exc_type)

    # -- async -------------------------------------------------------------------------------
    async def __aenter__(self) -> AsyncLease:
        block = (await ControlTableBlock.aload(self.block) if isinstance(self.block, str)  # type: ignore[misc]
                 else resolve_block(self.block))
        assert isinstance(block, ControlTableBlock)
        act = block.async_control_table()
        run = current_run()
        interrupting = block.interrupt_on_lease_loss if self.interrupt is None else bool(self.interrupt)

        async def acquire() -> AsyncLease:
            return await self._acquire_async(act, block, run)

        # The core's async slot block: renewal as an asyncio task, a loss cancels this task
        # (LeaseLostInterrupt at the block's exit), release on every way out, the hold span.
        scope = AsyncSlotBlock(acquire, interrupting, stop_when_orphaned=run.supervised)
        granted = await scope.__aenter__()
        held = _Held(granted.sync, run, self.label)
        held.scope = scope
        self._stack.append(held)
        return granted

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        held = self._stack.pop()
        assert held.scope is not None
        try:
            await held.scope.__aexit__(exc_type, exc, tb)
        finally:
            _released(held, exc_type)

    async def _acquire_async(self, act: AsyncControlTable, block: ControlTableBlock, run: RunIdentity) -> AsyncLease:
        """Poll once; else say where the run stands and wait in the core's FIFO queue, logging progress."""
        who = self.holder or run.holder
        lease_s = self.lease_seconds or block.default_lease
        started = time.monotonic()
        position: Optional[int] = None
        progress: Optional[asyncio.Task[None]] = None
        try:
            granted = await act.try_acquire(self.resource, holder=who, lease=lease_s, attempt=run.attempt,
                                            **self.options)  # type: ignore[arg-type]
            if granted is None:
                position, text = await awhere(act, self.resource, who)
                run.logger.info(f"controltable: waiting for {self.label}: {text}")
                if run.task_run_id is None:
                    await aset_flow_run_message(run.flow_run_id, f"controltable: waiting for {self.label}: {text}")
                if block.status_url:  # a Prefect API call (the artifact), not the control table
                    await anyio.to_thread.run_sync(link_status_page, block.status_url, run.flow_run_id,
                                                   names_list(self.resource), run.logger)
                progress = asyncio.create_task(_progress_async(act, self.resource, who, run, position))
                granted = await act.acquire(self.resource, holder=who, timeout=self.timeout, lease=lease_s,
                                            attempt=run.attempt, **self.options)  # type: ignore[arg-type]
        except BaseException as exc:  # cancelled or timed out: leave the queue before going on
            if progress is not None:
                progress.cancel()
            await _shielded(_awithdraw(act, self.resource, who))
            run.logger.info(f"controltable: left the queue of {self.label} ({type(exc).__name__})")
            raise
        if progress is not None:
            progress.cancel()
        waited = time.monotonic() - started
        if position is not None and run.task_run_id is None:
            await aset_flow_run_message(run.flow_run_id, f"controltable: holding {self.label} (waited {waited:.0f} s)")
        elif position is None and block.status_url:
            await anyio.to_thread.run_sync(link_status_page, block.status_url, run.flow_run_id,
                                           names_list(self.resource), run.logger)
        self._say_granted(granted.sync, run, position, waited)
        return granted

    # -- shared ------------------------------------------------------------------------------
    def _try(self, ct: ControlTable, who: str, lease_s: float, run: RunIdentity) -> Optional[Lease]:
        return ct.try_acquire(self.resource, holder=who, lease=lease_s, attempt=run.attempt,
                              **self.options)  # type: ignore[arg-type]

    def _waiting(self, ct: ControlTable, who: str, run: RunIdentity, block: ControlTableBlock) -> Optional[int]:
        """Say where the run stands (log, flow run state message, status link); its queue position."""
        position, text = where(ct, self.resource, who)
        run.logger.info(f"controltable: waiting for {self.label}: {text}")
        if run.task_run_id is None:
            set_flow_run_message(run.flow_run_id, f"controltable: waiting for {self.label}: {text}")
        link_status_page(block.status_url, run.flow_run_id, names_list(self.resource), run.logger)
        return position

    def _granted(self, granted: Lease, run: RunIdentity, block: ControlTableBlock, position: Optional[int],
                 waited: float) -> None:
        if position is not None:
            if run.task_run_id is None:
                set_flow_run_message(run.flow_run_id, f"controltable: holding {self.label} (waited {waited:.0f} s)")
        else:
            link_status_page(block.status_url, run.flow_run_id, names_list(self.resource), run.logger)
        self._say_granted(granted, run, position, waited)

    def _say_granted(self, granted: Lease, run: RunIdentity, position: Optional[int], waited: float) -> None:
        if position is not None:
            run.logger.info(f"controltable: granted {self.label} after waiting {waited:.1f} s from queue position "
                            f"{position}")
        run.logger.info(f"controltable: holding {self.label} ({granted.mode}, {granted.slots} slot(s)) as "
                        f"{granted.holder!r}, attempt {run.attempt}, fencing token {granted.token}")

    # -- decorator ---------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        """Hold the slot for each call of ``fn`` (put it under ``@task``/``@flow``: ``@task`` then ``@slot(...)``)."""
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with self._copy():
                    return await fn(*args, **kwargs)
            return cast(F, run_async)

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            with self._copy():
                return fn(*args, **kwargs)
        return cast(F, run_sync)


def slot(
    resource: Union[str, Mapping[str, int]],
    *,
    block: Union[ControlTableBlock, str, None],
    slots: int = 1,
    mode: str = DEFAULT_MODE,
    timeout: Optional[float] = None,
    lease: Optional[float] = None,
    waiter_ttl: float = DEFAULT_WAITER_TTL,
    priority: int = DEFAULT_SLOT_PRIORITY,
    holder: Optional[str] = None,
    interrupt: Optional[bool] = None,
) -> SlotScope:
    """Hold ``slots`` of ``resource`` (or a mapping of names to slots) for a block or each call of a function.

    ``block``: a :class:`ControlTableBlock` or the name of a saved one (loaded when the slot is
    entered, so ``@slot("warehouse", block="prod")`` at import time touches no server).
    ``mode="exclusive"`` runs alone on the resource. ``timeout`` (seconds; None waits forever)
    bounds the wait: on timeout the queue place is withdrawn and :class:`~controltable.AcquireTimeout`
    raised. ``lease`` (default: the block's ``default_lease``) is how long a dead holder keeps the
    slot. ``holder`` overrides the run's holder id (e.g. two slots of one resource in one flow run
    at once). ``interrupt`` (default: the block's ``interrupt_on_lease_loss``) stops the work when
    its lease is found lost. Used in a flow or a task, sync or async::

        @task
        def load():
            with slot("warehouse", block="prod") as lease:
                write(fencing_token=lease.token)

        @task
        @slot("warehouse", block="prod")
        async def load_async():
            ...
    """
    return SlotScope(resource, block=block, slots=slots, mode=mode, timeout=timeout, lease=lease,
                     waiter_ttl=waiter_ttl, priority=priority, holder=holder, interrupt=interrupt)


def _withdraw(ct: ControlTable, resource: Resource, who: str) -> None:
    """Leave the queue of every resource (a grant made meanwhile is given back too)."""
    for name in names_list(resource):
        try:
            ct.release(name, who)
        except Exception as exc:  # the place expires after waiter_ttl on its own
            log.warning("controltable: could not withdraw %r from %r: %s", who, name, exc)


def _released(held: _Held, exc_type: Any) -> None:
    why = "" if exc_type is None else f" ({exc_type.__name__})"
    try:
        held.run.logger.info(f"controltable: released {held.label}{why}")
    except BaseException:  # noqa: BLE001 - rich's console raises SystemExit on a broken pipe (worker gone)
        pass


async def _awithdraw(act: AsyncControlTable, resource: Resource, who: str) -> None:
    """:func:`_withdraw` through the asyncio API."""
    for name in names_list(resource):
        try:
            await act.release(name, who)
        except Exception as exc:  # the place expires after waiter_ttl on its own
            log.warning("controltable: could not withdraw %r from %r: %s", who, name, exc)


async def _shielded(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end even if the awaiting task is cancelled again meanwhile (clean-up)."""
    job = asyncio.ensure_future(work)
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait([job], timeout=ASYNC_CLEANUP_BOUND)
        raise


async def _progress_async(act: AsyncControlTable, resource: Resource, who: str, run: RunIdentity,
                          position: Optional[int]) -> None:
    """While an async waiter waits: log its position again when it changes (a task, cancelled at the grant)."""
    while True:
        await asyncio.sleep(PROGRESS_INTERVAL)
        now, text = await awhere(act, resource, who)
        if now is not None and now != position:
            position = now
            run.logger.info(f"controltable: still waiting for {names(resource)}: {text}")


class _Progress:
    """While a sync waiter waits: log its position again when it changes (a daemon thread, bounded looks)."""

    def __init__(self, ct: ControlTable, resource: Resource, who: str, run: RunIdentity,
                 position: Optional[int]) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ct, resource, who, run, position),
                                        name="controltable-prefect-progress", daemon=True)
        self._thread.start()

    def _run(self, ct: ControlTable, resource: Resource, who: str, run: RunIdentity, position: Optional[int]) -> None:
        while not self._stop.wait(PROGRESS_INTERVAL):
            now, text = where(ct, resource, who)
            if now is not None and now != position:
                position = now
                run.logger.info(f"controltable: still waiting for {names(resource)}: {text}")

    def stop(self) -> None:
        self._stop.set()


__all__ = ["LeaseLost", "SlotScope", "slot"]
