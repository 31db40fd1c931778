"""``AsyncControlTable``: the public API for asyncio code, over native async drivers, with no second copy of a decision.

How: SQLAlchemy's asyncio extension runs sync code over an async driver in greenlets
(``greenlet_spawn``): every statement's I/O awaits the event loop. So each call here runs the
sync core's own method (:class:`~controltable.ControlTable`: the same statements, grant pass,
waiting loop, retry policy and errors) in a greenlet, on a ``ControlTable`` built over an async
engine (``sqlite+aiosqlite``, ``postgresql+psycopg`` in its async form, ``mysql+aiomysql``). Only
*waiting* changes: the core waits through two seams, which this module points at the event loop:

* :attr:`Wakeups.waiter <controltable.wakeups.Wakeups.waiter>`: a waiter's sleep between looks
  at its queue entry (and a claim's or work list's poll) awaits an :class:`asyncio.Event` set by
  the push listener thread (``loop.call_soon_threadsafe``), or ``asyncio.sleep`` without push;
* :attr:`Database.sleep <controltable.db.Database.sleep>`: a retry's back-off.

Lease renewal is an asyncio task, and a lease found lost cancels the task that entered
``async with act.slot(...)``: asyncio's own cancellation stops an awaiting statement or sleep (its
transaction rolls back). Cancelling a task that waits in :meth:`AsyncControlTable.acquire`
withdraws its queue entry (the core's own clean-up path runs in the greenlet).

Install with ``pip install 'controltable[async]'`` (greenlet, aiosqlite, aiomysql; psycopg has
its async connection built in).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
from types import TracebackType
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from sqlalchemy.engine import make_url

from . import defaults, dialects, tracing
from .control import KEEP, ControlTable
from .defaults import (
    CONNECT_TIMEOUT,
    DEFAULT_LEASE,
    DEFAULT_MODE,
    DEFAULT_NAMESPACE,
    DEFAULT_PICKUP,
    DEFAULT_PREFIX,
    DEFAULT_SLOT_PRIORITY,
    DEFAULT_WAITER_TTL,
    ORPHAN_CHECK_INTERVAL,
    STATEMENT_TIMEOUT,
    STOP_RENEWING_WHEN_ORPHANED,
)
from .errors import ConfigurationError, LeaseLost, LeaseLostInterrupt
from .events import Batch, EventTable
from .renewal import parent_gone
from .slots import Lease, Rate, ResourceStatus, WaitInfo
from .wakeups import PushStatus, Wakeups
from .worklist import Item, WorkList

try:
    from sqlalchemy.util.concurrency import await_only, greenlet_spawn, in_greenlet
except ImportError:  # pragma: no cover - SQLAlchemy without its asyncio support
    await_only = greenlet_spawn = in_greenlet = None  # type: ignore[assignment]

log = logging.getLogger("controltable")

def async_url(url: Union[str, Any]) -> str:
    """``url`` with its driver swapped for the asyncio one (``sqlite://`` -> ``sqlite+aiosqlite://``,
    ``postgresql+psycopg://`` -> psycopg's async connection, ``mysql+pymysql://`` -> ``mysql+aiomysql://``).

    A URL that already names an async driver is kept. Raises :class:`ConfigurationError` for a
    backend with no supported async driver, naming what to use instead.
    """
    from .connect import typed_url

    try:
        parsed = typed_url(make_url(url))
    except Exception:
        raise ConfigurationError(
            f"{url!r} is not a database URL; use e.g. postgresql+psycopg://user@host:5432/db or "
            "sqlite:///controltable.db") from None
    try:
        if dialects.on_asyncio(parsed.get_dialect()):
            return str(parsed.render_as_string(hide_password=False))
    except Exception:
        pass  # the sync driver is not installed: the async one may well be
    found = dialects.async_driver(parsed.get_backend_name(), parsed.get_driver_name())
    if found is None:
        raise ConfigurationError(
            f"no asyncio driver is supported for {parsed.drivername!r}; use PostgreSQL (psycopg), "
            "MySQL/MariaDB (aiomysql) or SQLite (aiosqlite), or run the sync ControlTable with asyncio.to_thread")
    return str(parsed.set(drivername=found).render_as_string(hide_password=False))


Runner = Callable[..., Awaitable[Any]]


class _LoopWaiter:
    """The core's waits (:meth:`Wakeups.wait`), awaited on the event loop from inside a greenlet.

    With push (PostgreSQL), the wait ends when the listener thread delivers a wake-up for one of
    the keys (it calls back through ``loop.call_soon_threadsafe``), or a reconnect of the listener
    (which may have missed some) wakes everyone; without push it is a plain ``asyncio.sleep``.
    Outside a greenlet (a thread of the core's own) it declines, and the core waits as usual.
    """

    def __init__(self, wakeups: Wakeups) -> None:
        self.wakeups = wakeups

    def __call__(self, keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> Optional[bool]:
        if not in_greenlet():
            return None  # a thread of the core's own: its blocking wait
        return bool(await_only(self.wait(keys, seconds, since)))

    async def wait(self, keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> bool:
        w = self.wakeups
        if not w.enabled or w.lost:
            await asyncio.sleep(seconds)
            return False
        if not w._listening.is_set():  # noqa: SLF001 - starting the listener blocks up to its probe
            active = await asyncio.to_thread(lambda: w.active)
            if not active:
                await asyncio.sleep(seconds)
                return False
        start = since if since is not None else w.mark(keys)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(woken.set)

        remove = w.add_listener(keys, wake)
        try:
            if w.mark(keys) != start:
                return True
            try:
                await asyncio.wait_for(woken.wait(), max(seconds, 0.0))
            except asyncio.TimeoutError:
                return w.mark(keys) != start
            return True
        finally:
            remove()


def _sleep(seconds: float) -> None:
    """A retry's back-off: awaited on the loop inside a greenlet, else a plain sleep."""
    if in_greenlet():
        await_only(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def _is_async(url: Union[str, Any]) -> bool:
    try:
        return dialects.on_asyncio(make_url(url).get_dialect())
    except Exception:
        return False


def _target(url: Union[str, Any]) -> Union[str, Any]:
    """The URL to open: its async form, or ``url`` itself for a backend with no async driver here
    (SQL Server, Oracle: their calls then run in threads, with the same semantics but no native I/O)."""
    try:
        found = async_url(url)
    except ConfigurationError as exc:
        if "no asyncio driver" not in str(exc):
            raise
        return url
    if greenlet_spawn is None:  # pragma: no cover - SQLAlchemy without its asyncio support
        raise ConfigurationError(
            "the asyncio API needs SQLAlchemy's asyncio support: pip install 'controltable[async]'")
    try:
        import greenlet  # noqa: F401
    except ImportError:
        raise ConfigurationError("the asyncio API needs greenlet: pip install 'controltable[async]'") from None
    return found


class AsyncControlTable:
    """The asyncio face of :class:`~controltable.ControlTable`: same arguments, same semantics and errors.

    ``url`` may name the sync driver (``sqlite:///ct.db``, ``postgresql+psycopg://...``,
    ``mysql+pymysql://...``): the matching asyncio driver is used (:func:`async_url`). One object
    per event loop: its connection pool (5 connections, 10 more at peaks) is shared by every task,
    so a thousand waiting tasks hold at most that many connections, plus the push listener's one.
    Close it with ``await act.close()`` or ``async with AsyncControlTable(...) as act``.
    """

    def __init__(
        self,
        url: Union[str, Any],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        schema: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = CONNECT_TIMEOUT,
        statement_timeout: Optional[float] = STATEMENT_TIMEOUT,
        listen_url: Optional[str] = None,
    ) -> None:
        target = _target(url)
        #: Whether calls run over a native async driver (else in threads: SQL Server, Oracle).
        self.native = target != url or _is_async(target)
        # Sync core code runs in a greenlet whose statements await the event loop, else in the loop's thread pool.
        self._run: Runner = greenlet_spawn if self.native else asyncio.to_thread
        #: The sync core this object runs (in greenlets, its engine an async engine's sync face).
        self.sync = ControlTable(target, namespace=namespace, schema=schema, prefix=prefix,
                                 connect_timeout=connect_timeout, statement_timeout=statement_timeout,
                                 listen_url=listen_url)
        if self.native:
            wakeups = self.sync.runtime.wakeups
            wakeups.waiter = _LoopWaiter(wakeups)
            self.sync.db.sleep = _sleep
        self.namespace = self.sync.namespace

    @classmethod
    def from_control_table(cls, ct: ControlTable) -> AsyncControlTable:
        """An async twin of ``ct``: the same database, namespace, schema, prefix and timeouts."""
        return cls(ct.db.engine.url.render_as_string(hide_password=False), namespace=ct.namespace,
                   schema=ct.schema, prefix=ct.prefix, connect_timeout=ct.db.connect_timeout,
                   statement_timeout=ct.db.statement_timeout, listen_url=ct.runtime.wakeups.listen_url)

    def __repr__(self) -> str:
        return f"AsyncControlTable({self.sync.db.safe_url!r}, namespace={self.namespace!r})"

    async def close(self) -> None:
        """Stop the wake-up listener and close the connection pool."""
        await asyncio.to_thread(self.sync.runtime.wakeups.close)
        await self._run(self.sync.db.dispose)

    async def __aenter__(self) -> AsyncControlTable:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- set-up -------------------------------------------------------------------------------
    async def install(self) -> int:
        """:meth:`ControlTable.install <controltable.ControlTable.install>`."""
        return await self._run(self.sync.install)

    async def set_capacity(self, name: str, capacity: int, *, rate: Union[Rate, tuple[int, float], None] = KEEP,
                           aging: Optional[float] = KEEP) -> None:
        """:meth:`ControlTable.set_capacity <controltable.ControlTable.set_capacity>`."""
        await self._run(self.sync.set_capacity, name, capacity, rate=rate, aging=aging)

    async def delete_resource(self, name: str, *, force: bool = False) -> bool:
        return await self._run(self.sync.delete_resource, name, force=force)

    async def now(self) -> float:
        """The database clock as UTC epoch seconds (the clock all leases use)."""
        return await self._run(self.sync.now)

    # -- slots --------------------------------------------------------------------------------
    async def acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str] = None,
        slots: int = 1,
        mode: str = DEFAULT_MODE,
        timeout: Optional[float] = None,
        lease: float = DEFAULT_LEASE,
        waiter_ttl: float = DEFAULT_WAITER_TTL,
        poll_interval: float = 0.05,
        attempt: Optional[int] = None,
        pickup: float = DEFAULT_PICKUP,
        priority: int = DEFAULT_SLOT_PRIORITY,
    ) -> AsyncLease:
        """:meth:`ControlTable.acquire <controltable.ControlTable.acquire>`, its sleeps awaited on the loop.

        A cancelled task withdraws its queue entry, as a timeout does."""
        found = await self._run(self.sync.acquire, resource, holder=holder, slots=slots, mode=mode, timeout=timeout,
                             lease=lease, waiter_ttl=waiter_ttl, poll_interval=poll_interval, attempt=attempt,
                             pickup=pickup, priority=priority)
        return AsyncLease(found, self._run)

    async def try_acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: str,
        slots: int = 1,
        mode: str = DEFAULT_MODE,
        lease: float = DEFAULT_LEASE,
        waiter_ttl: float = DEFAULT_WAITER_TTL,
        attempt: Optional[int] = None,
        pickup: float = DEFAULT_PICKUP,
        priority: int = DEFAULT_SLOT_PRIORITY,
    ) -> Optional[AsyncLease]:
        """Poll once, keeping the place in the queue for ``waiter_ttl`` seconds
        (:meth:`ControlTable.try_acquire <controltable.ControlTable.try_acquire>`)."""
        found = await self._run(self.sync.try_acquire, resource, holder=holder, slots=slots, mode=mode, lease=lease,
                             waiter_ttl=waiter_ttl, attempt=attempt, pickup=pickup, priority=priority)
        return None if found is None else AsyncLease(found, self._run)

    def slot(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str] = None,
        slots: int = 1,
        mode: str = DEFAULT_MODE,
        timeout: Optional[float] = None,
        lease: float = DEFAULT_LEASE,
        waiter_ttl: float = DEFAULT_WAITER_TTL,
        attempt: Optional[int] = None,
        pickup: float = DEFAULT_PICKUP,
        priority: int = DEFAULT_SLOT_PRIORITY,
        interrupt: Optional[bool] = None,
        stop_when_orphaned: bool = STOP_RENEWING_WHEN_ORPHANED,
    ) -> AsyncSlotBlock:
        """:meth:`ControlTable.slot` for ``async with``: renewal is an asyncio task, and a loss cancels the task
        that entered the block. ``stop_when_orphaned``: stop renewing once this process's parent is gone (a
        supervised process whose supervisor died lets its lease expire), as the sync renewer's option."""
        async def acquire() -> AsyncLease:
            return await self.acquire(resource, holder=holder, slots=slots, mode=mode, timeout=timeout, lease=lease,
                                      waiter_ttl=waiter_ttl, attempt=attempt, pickup=pickup, priority=priority)

        return AsyncSlotBlock(acquire, defaults.INTERRUPT_ON_LEASE_LOSS if interrupt is None else interrupt,
                              stop_when_orphaned=stop_when_orphaned)

    async def find_lease(self, resource: str, holder: str) -> Optional[AsyncLease]:
        found = await self._run(self.sync.find_lease, resource, holder)
        return None if found is None else AsyncLease(found, self._run)

    async def release(self, resource: str, holder: str) -> int:
        """Release (or withdraw from the queue) whatever ``holder`` has on ``resource``; rows removed."""
        return await self._run(self.sync.release, resource, holder)

    async def release_holders(self, prefix: str) -> int:
        return await self._run(self.sync.release_holders, prefix)

    async def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        return await self._run(self.sync.wait_info, resource, holder)

    async def status(self, resources: Union[list[str], str, None] = None) -> list[ResourceStatus]:
        """Resources with capacity, holders and waiters (:meth:`controltable.ControlTable.status`)."""
        return await self._run(self.sync.status, resources)

    async def reap(self) -> int:
        return await self._run(self.sync.reap)

    # -- events and work lists ----------------------------------------------------------------
    def events(self, table: str, *, key: str, order_by: Optional[str] = None, table_schema: Optional[str] = None,
               **options: Any) -> AsyncEventTable:
        """Batch claiming on the user's own event table (see :class:`~controltable.EventTable`)."""
        return AsyncEventTable(self.sync.events(table, key=key, order_by=order_by, table_schema=table_schema,
                                                **options), self._run)

    def worklist(self, name: str) -> AsyncWorkList:
        """An ordered work list kept in the control tables (see :class:`~controltable.WorkList`)."""
        return AsyncWorkList(self.sync.worklist(name), self._run)

    # -- wake-ups -----------------------------------------------------------------------------
    def wakeup_keys(self, resource: Union[str, Mapping[str, int]], holder: Optional[str] = None) -> list[str]:
        return self.sync.wakeup_keys(resource, holder)

    async def wait_for_wakeup(self, keys: list[str], seconds: float) -> bool:
        """Await up to ``seconds`` or a push for one of ``keys``; True if woken by a push."""
        waiter = self.sync.runtime.wakeups.waiter
        assert isinstance(waiter, _LoopWaiter)
        return await waiter.wait(list(keys), seconds)

    async def push_status(self) -> PushStatus:
        return await asyncio.to_thread(self.sync.push_status)


class _Wrapped:
    """An async view of a core value object: its attributes read through, its actions awaited."""

    def __init__(self, inner: Any, run: Runner) -> None:
        self.sync = inner
        self._run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sync, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sync!r})"


class AsyncLease(_Wrapped):
    """A granted slot request (:class:`~controltable.Lease`): ``token``, ``holder``, ``expires_at``... read through."""

    sync: Lease

    async def renew(self, lease: Optional[float] = None) -> AsyncLease:
        await self._run(self.sync.renew, lease)
        return self

    async def release(self) -> None:
        await self._run(self.sync.release)

    async def check(self) -> None:
        await self._run(self.sync.check)

    async def is_held(self) -> bool:
        return await self._run(self.sync.is_held)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # The sync exit's decisions: a known loss is not asked after, the block's error wins.
        await self._run(self.sync.__exit__, exc_type, exc, tb)


class AsyncSlotBlock:
    """``async with act.slot(...) as lease``: acquire, renew in a task, cancel the work on a loss, release."""

    def __init__(self, acquire: Callable[[], Awaitable[AsyncLease]], interrupt: bool, *,
                 stop_when_orphaned: bool = False) -> None:
        """``acquire``: awaited on entry, returns the granted lease (an adapter's own wait may log
        and show progress around :meth:`AsyncControlTable.acquire`); the rest is this block's."""
        self._acquire = acquire
        self._interrupt = interrupt
        self._stop_when_orphaned = stop_when_orphaned
        self.lease: Optional[AsyncLease] = None
        self._renewer: Optional[asyncio.Task[None]] = None
        self._owner: Optional[asyncio.Task[Any]] = None
        self._cancelled_by_us = False
        #: Whether the work is running (between entry and exit): only then does a loss cancel it.
        self._in_body = False

    async def __aenter__(self) -> AsyncLease:
        lease = await self._acquire()
        self.lease = lease
        self._owner = asyncio.current_task()
        self._renewer = asyncio.get_running_loop().create_task(
            self._renew(lease), name=f"controltable-renew-{lease.holder}")
        self._in_body = True
        tracing.enter_hold(lease.sync)  # the work's spans are the hold's children (in this task's context)
        return lease

    async def _renew(self, lease: AsyncLease) -> None:
        """The renewer's decisions of :class:`controltable.renewal.Renewer`, as a task."""
        interval = lease.sync.lease_seconds / 3.0
        started = time.monotonic()
        expires: Optional[float] = started + float(lease.sync.lease_seconds)
        next_renewal = started + interval
        parent = os.getppid() if self._stop_when_orphaned else None
        step = min(interval, ORPHAN_CHECK_INTERVAL) if parent is not None else interval
        while True:
            await asyncio.sleep(max(min(step, next_renewal - time.monotonic()), 0.0))
            if parent is not None and parent_gone(parent):
                reason = f"the process was orphaned (parent {parent} is gone)"
                log.warning("controltable: stopped renewing %r: %s; the lease will expire", lease.holder, reason)
                self._lose(lease, LeaseLost(f"renewal stopped because {reason}; the lease was left to expire",
                                            gone=False))
                return
            if time.monotonic() < next_renewal:
                continue
            sent = time.monotonic()
            next_renewal = sent + interval
            try:
                # Bounded by the lease's own end: a renewal still waiting then (for one of the pool's
                # connections the loop's other tasks hold, or for the database) cannot save the lease,
                # and the work must stop now, not when the wait ends (ASYNC_POOL_TIMEOUT is minutes).
                left = None if expires is None else max(expires - time.monotonic(), 0.0)
                await asyncio.wait_for(lease.renew(), left)
            except LeaseLost as exc:
                log.error("controltable: %s", exc)
                self._lose(lease, exc)
                return
            except Exception as exc:
                if expires is not None and time.monotonic() >= expires:
                    if isinstance(exc, asyncio.TimeoutError):  # the wait_for above: still waiting at the end
                        why = "its renewal was still waiting (for a pooled connection or the database)"
                    else:
                        why = f"renewals kept failing for its whole length ({exc})"
                    log.error("controltable: lease of %r expired: %s", lease.holder, why)
                    self._lose(lease, LeaseLost(f"the lease expired: {why}; another holder may have it now"))
                    return
                log.warning("controltable: lease renewal failed, will retry: %s", exc)
                if expires is not None:
                    next_renewal = min(next_renewal, expires)
            else:
                expires = sent + float(lease.sync.lease_seconds)

    def _lose(self, lease: AsyncLease, exc: LeaseLost) -> None:
        lease.sync.lost = exc
        if self._interrupt and self._in_body and self._owner is not None and not self._owner.done():
            self._cancelled_by_us = True
            self._owner.cancel(f"controltable: {exc}")

    async def __aexit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        self._in_body = False  # the exit itself is never cancelled by a loss: it reports it
        if self.lease is not None:
            tracing.leave_hold(self.lease.sync)
        lease, self.lease = self.lease, None
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
        if lease is None:
            return
        replacement: Optional[BaseException] = None
        if self._cancelled_by_us and lease.sync.lost is not None:
            owner = self._owner
            if owner is not None and owner.cancelling():
                owner.uncancel()  # our cancellation, not the caller's: it leaves as the loss
            replacement = LeaseLostInterrupt(str(lease.sync.lost))
            replacement.__cause__ = lease.sync.lost
            replacement.__context__ = exc
            exc_type, exc, tb = type(replacement), replacement, None
        await lease.__aexit__(exc_type, exc, tb)
        if replacement is not None:
            raise replacement


class AsyncEventTable(_Wrapped):
    """Batch claiming on an event table (:class:`~controltable.EventTable`), awaited."""

    sync: EventTable

    def __init__(self, inner: EventTable, run: Runner) -> None:
        super().__init__(inner, run)
        self._described = False
        self._describing = asyncio.Lock()

    async def _describe(self) -> None:
        """Reflect the table once, one task at a time: the core guards its reflection with a thread
        lock, which a second task's greenlet (same thread) would wait on while blocking the loop."""
        if self._described:
            return
        async with self._describing:
            if not self._described:
                await self._run(lambda: self.sync.table)
                self._described = True

    async def prepare(self, **kwargs: Any) -> Any:
        """Add the claim columns and index (:meth:`EventTable.prepare <controltable.EventTable.prepare>`)."""
        return await self._run(self.sync.prepare, **kwargs)

    async def claim(self, size: int = 100, *, owner: Optional[str] = None, lease: Optional[float] = None,
                    **kwargs: Any) -> Optional[AsyncBatch]:
        """Claim up to ``size`` rows (``wait=`` seconds awaits claimable rows, waking on a push)."""
        await self._describe()
        found = await self._run(self.sync.claim, size, owner=owner, lease=lease, **kwargs)
        return None if found is None else AsyncBatch(found, self._run)

    async def notify(self) -> None:
        await self._run(self.sync.notify)

    async def pending_count(self) -> int:
        """Rows claimable now (:meth:`EventTable.pending_count <controltable.EventTable.pending_count>`)."""
        await self._describe()
        return await self._run(self.sync.pending_count)

    def batch(self, handle: dict[str, Any]) -> AsyncBatch:
        return AsyncBatch(self.sync.batch(handle), self._run)


class AsyncBatch(_Wrapped):
    """Rows claimed under one token (:class:`~controltable.Batch`): ``keys``, ``rows``, ``token`` read through."""

    sync: Batch

    async def complete(self, keys: Optional[Sequence[Any]] = None) -> int:
        return await self._run(self.sync.complete, keys)

    async def fail(self, reason: str, keys: Optional[Sequence[Any]] = None) -> int:
        return await self._run(self.sync.fail, reason, keys)

    async def release(self) -> int:
        return await self._run(self.sync.release)

    async def renew(self, lease: Optional[float] = None) -> AsyncBatch:
        await self._run(self.sync.renew, lease)
        return self

    async def check(self) -> None:
        await self._run(self.sync.check)


class AsyncWorkList(_Wrapped):
    """An ordered work list (:class:`~controltable.WorkList`), awaited."""

    sync: WorkList

    async def populate(self, *args: Any, **kwargs: Any) -> int:
        return await self._run(self.sync.populate, *args, **kwargs)

    async def allocate(self, owner: Optional[str] = None, lease: Optional[float] = None) -> Optional[AsyncItem]:
        found = await self._run(self.sync.allocate, owner, lease)
        return None if found is None else AsyncItem(found, self._run)

    async def status(self) -> Any:
        return await self._run(self.sync.status)

    async def items(self, owner: Optional[str] = None, lease: Optional[float] = None, **kwargs: Any
                    ) -> AsyncIterator[AsyncItem]:
        """The items in order as they become allocatable (the core's ``items()`` loop, awaited)."""
        found = self.sync.items(owner, lease=lease, **kwargs)
        done = object()
        while True:
            item = await self._run(next, found, done)
            if item is done:
                return
            yield AsyncItem(item, self._run)


class AsyncItem(_Wrapped):
    """An allocated work item (:class:`~controltable.Item`): ``item_id``, ``payload``, ``token`` read through."""

    sync: Item

    async def complete(self) -> None:
        await self._run(self.sync.complete)

    async def fail(self, reason: str) -> None:
        await self._run(self.sync.fail, reason)

    async def release(self) -> None:
        await self._run(self.sync.release)

    async def renew(self, lease: Optional[float] = None) -> AsyncItem:
        await self._run(self.sync.renew, lease)
        return self

    async def check(self) -> None:
        await self._run(self.sync.check)


# -- one twin per event loop ---------------------------------------------------------------------------
# An async engine's connections belong to the loop that opened them, so an integration that serves
# many coroutines (a triggerer's triggers, a flow's async tasks) shares one AsyncControlTable per
# loop and key. Nothing else closes it: the loop holds it in a module dict, and its connections keep
# the loop alive, so garbage collection would not either. Every loop that ran `asyncio.run` would
# leave a pooled and a listening connection open on the server (a test process reached 29).
_PER_LOOP: dict[asyncio.AbstractEventLoop, dict[Hashable, AsyncControlTable]] = {}
_PER_LOOP_LOCK = threading.Lock()
_CLOSERS: dict[int, AsyncGenerator[None, None]] = {}  # the loop keeps its async generators only weakly


def loop_shared(key: Hashable, make: Callable[[], AsyncControlTable]) -> AsyncControlTable:
    """The running loop's :class:`AsyncControlTable` for ``key``, made by ``make()`` on first use.

    It is closed (pool and listener) when the loop shuts down: ``asyncio.run()``, Airflow's
    triggerer and Prefect's loops call ``loop.shutdown_asyncgens()`` first, which runs a closer
    registered here with the loop. A loop closed without that step is swept on the next call from
    any loop, and at exit: its twins' listeners stop and their pools are dropped. Call it from code
    running in the loop; ``make`` must do no I/O (it runs under a lock).
    """
    loop = asyncio.get_running_loop()
    with _PER_LOOP_LOCK:
        for gone in [other for other in _PER_LOOP if other.is_closed()]:
            stale = _PER_LOOP.pop(gone)
            _CLOSERS.pop(id(stale), None)
            for act in stale.values():
                _abandon(act)
        twins = _PER_LOOP.get(loop)
        if twins is None:
            twins = _PER_LOOP[loop] = {}
            _close_at_shutdown(loop, twins)
        found = twins.get(key)
        if found is None:
            found = twins[key] = make()
        return found


def _close_at_shutdown(loop: asyncio.AbstractEventLoop, twins: dict[Hashable, AsyncControlTable]) -> None:
    """Register with ``loop`` an async generator whose ``finally`` closes ``twins``.

    Started here to its first ``yield`` (synchronously: no I/O before it), the generator is one the
    loop knows; ``loop.shutdown_asyncgens()`` ``aclose()``-s it while the loop can still run the
    closing's I/O.
    """
    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with _PER_LOOP_LOCK:
                _CLOSERS.pop(id(twins), None)
                if _PER_LOOP.get(loop) is twins:
                    del _PER_LOOP[loop]
                closing = list(twins.values())
                twins.clear()
            for act in closing:
                try:
                    await act.close()
                except Exception as exc:  # the loop is ending: say so, never raise from its shutdown
                    log.warning("controltable: closing %r at the end of its event loop failed: %s", act, exc)

    gen = closer()
    _CLOSERS[id(twins)] = gen
    try:
        gen.asend(None).send(None)
    except StopIteration:
        pass


def _abandon(act: AsyncControlTable) -> None:
    """Let go of a twin whose loop is closed (nothing can be awaited on it): stop its listener thread
    and drop its pool (the connections close as they are collected)."""
    try:
        act.sync.runtime.wakeups.close()
        act.sync.db.engine.dispose(close=False)
    except Exception as exc:  # best effort at the end of a loop or the process
        log.debug("controltable: could not let go of %r: %s", act, exc)


@atexit.register
def _abandon_all() -> None:
    with _PER_LOOP_LOCK:
        for twins in _PER_LOOP.values():
            for act in twins.values():
                _abandon(act)
        _PER_LOOP.clear()
        _CLOSERS.clear()
