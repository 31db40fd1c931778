"""``ControlTableBlock``: where the control tables live, as a Prefect block (the URL kept as a secret).

Prefect's convention for a connection is a block (prefect-sqlalchemy's ``SqlAlchemyConnector``):
saved once in the server (``ControlTableBlock(url=...).save("prod")``, or from the UI after
``prefect block register -m prefect_controltable``) and loaded by name in flows, so no flow's
code or parameters carry the password. The block only holds the settings; the
:class:`~controltable.ControlTable` it opens is cached per process (one engine and one wake-up
listener per database, shared by every task of a flow run that uses the same block); its asyncio
twin (:class:`~controltable.aio.AsyncControlTable`, for async flows and tasks) per event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from typing import Any, AsyncGenerator, Optional, Union

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from controltable import ControlTable
from controltable.aio import AsyncControlTable
from controltable.defaults import DEFAULT_LEASE, DEFAULT_NAMESPACE, DEFAULT_PREFIX, INTERRUPT_ON_LEASE_LOSS
from controltable.errors import ConfigurationError, safe_url

log = logging.getLogger("prefect_controltable")

_OPEN: dict[tuple[Any, ...], ControlTable] = {}
_OPEN_LOCK = threading.Lock()
#: The asyncio twins, per event loop (an async engine's connections belong to the loop that made them).
_OPEN_ASYNC: dict[asyncio.AbstractEventLoop, dict[tuple[Any, ...], AsyncControlTable]] = {}


@atexit.register
def _close_all() -> None:
    """Dispose the engines this process opened (a flow-run process ends after its run)."""
    with _OPEN_LOCK:
        for ct in _OPEN.values():
            try:
                ct.close()
            except Exception:  # pragma: no cover - the process is ending; nothing to report to
                pass
        _OPEN.clear()
        for acts in _OPEN_ASYNC.values():
            for act in acts.values():
                _abandon(act)
        _OPEN_ASYNC.clear()


_CLOSERS: dict[int, AsyncGenerator[None, None]] = {}


def _close_with_loop(acts: dict[tuple[Any, ...], AsyncControlTable]) -> None:
    """Close ``acts`` on the running loop as it shuts down, while their connections can still be closed.

    ``asyncio.run()`` (and Prefect's own loops) call ``loop.shutdown_asyncgens()`` before closing
    the loop: it ``aclose()``-s every async generator started on it. So an async generator, started
    here to its first ``yield`` (which registers it with the loop), awaits the closing in its
    ``finally``. A loop closed without that step is swept by :meth:`ControlTableBlock.async_control_table`.
    """
    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            _CLOSERS.pop(id(acts), None)
            for act in list(acts.values()):
                try:
                    await act.close()
                except Exception as exc:  # best effort: the loop is ending
                    log.debug("controltable: could not close %r: %s", act, exc)
            acts.clear()

    gen = closer()
    _CLOSERS[id(acts)] = gen  # the loop keeps its async generators only weakly
    try:
        gen.asend(None).send(None)  # run to the first yield, synchronously (no I/O before it)
    except StopIteration:
        pass


def _abandon(act: AsyncControlTable) -> None:
    """Let go of an :class:`AsyncControlTable` whose event loop is closed (nothing can be awaited on it):
    stop its wake-up listener thread and drop its pool (the connections close as they are collected)."""
    try:
        act.sync.runtime.wakeups.close()
        act.sync.db.engine.dispose(close=False)
    except Exception as exc:  # pragma: no cover - best effort at the end of a loop or process
        log.debug("controltable: could not let go of %r: %s", act, exc)


class ControlTableBlock(Block):
    """The database holding controltable's control tables, and how flows use them.

    Example::

        ControlTableBlock(url="postgresql+psycopg://etl@db/warehouse").save("prod")

        @flow
        def nightly():
            with slot("warehouse", block="prod"):
                load()
    """

    _block_type_name = "ControlTable"
    _block_type_slug = "controltable"
    _description = ("Resource slots (FIFO, leases, fencing tokens), event batches and ordered work lists kept in "
                    "control tables in your own database, shared with Airflow, Dagster and shell jobs.")
    _documentation_url = "https://github.com/controltable/controltable/blob/main/docs/prefect.md"  # type: ignore[assignment]
    _code_example = '''
```python
from prefect import flow
from prefect_controltable import ControlTableBlock, slot

@flow
def nightly():
    with slot("warehouse", block="prod"):
        ...
```'''

    url: SecretStr = Field(description="SQLAlchemy URL of the database holding the control tables, e.g. "
                                       "postgresql+psycopg://user:password@host/db (kept secret).")
    namespace: str = Field(default=DEFAULT_NAMESPACE, description="Separates deployments sharing one database; "
                                                                  "everyone who must share a limit uses the same one.")
    control_schema: Optional[str] = Field(default=None, description="Database schema of the control tables "
                                                                    "(default: the connection's default schema).")
    prefix: str = Field(default=DEFAULT_PREFIX, description="Name prefix of the control tables.")
    default_lease: float = Field(default=DEFAULT_LEASE, gt=0, description="Seconds a slot lease lasts between "
                                 "renewals: a flow run that dies frees its slot after at most this long.")
    connect_timeout: Optional[float] = Field(default=None, gt=0, description="Seconds to wait for a connection "
                                             "(default: the core's); a hung server fails the run within it.")
    statement_timeout: Optional[float] = Field(default=None, gt=0, description="Seconds one control-table "
                                               "statement may run (default: the core's).")
    listen_url: Optional[SecretStr] = Field(default=None, description="PostgreSQL behind a transaction-mode "
                                            "pooler: a direct URL for push wake-ups only (default: "
                                            "CONTROLTABLE_LISTEN_URL).")
    interrupt_on_lease_loss: bool = Field(default=INTERRUPT_ON_LEASE_LOSS, description="Stop the work "
                                          "(LeaseLostInterrupt, failing the run) when its lease is found lost, "
                                          "instead of letting it overlap the next holder.")
    status_url: Optional[str] = Field(default=None, description="The status page (`controltable serve`, or "
                                      "Airflow's), linked from every run that waits for or holds a slot.")

    def control_table(self) -> ControlTable:
        """The :class:`ControlTable` for these settings, opened once per process."""
        url = self.url.get_secret_value()
        key, settings = self._settings()
        with _OPEN_LOCK:
            ct = _OPEN.get(key)
            if ct is None:
                ct = ControlTable(url, **settings)
                _OPEN[key] = ct
            return ct

    def async_control_table(self) -> AsyncControlTable:
        """The :class:`~controltable.aio.AsyncControlTable` for these settings, opened once per event loop.

        Async flows and tasks use it: its statements await the running loop over the native async
        driver (psycopg's async connection, aiomysql, aiosqlite). One per loop, because an async
        engine's pooled connections belong to the loop that opened them; a loop that is gone takes
        its entry with it. Call it from code running in that loop.
        """
        loop = asyncio.get_running_loop()
        key, settings = self._settings()
        with _OPEN_LOCK:
            for gone in [other for other in _OPEN_ASYNC if other.is_closed()]:  # closed meanwhile
                acts = _OPEN_ASYNC.pop(gone)
                _CLOSERS.pop(id(acts), None)
                for stale in acts.values():  # none left when the loop shut down properly
                    _abandon(stale)
            per_loop = _OPEN_ASYNC.get(loop)
            if per_loop is None:
                per_loop = _OPEN_ASYNC[loop] = {}
                _close_with_loop(per_loop)
            found = per_loop.get(key)
            if found is None:
                found = per_loop[key] = AsyncControlTable(self.url.get_secret_value(), **settings)
            return found

    def _settings(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """(cache key, keyword arguments of ControlTable/AsyncControlTable) for this block; checks the URL."""
        url = self.url.get_secret_value()
        if not url:
            raise ConfigurationError("ControlTableBlock has no url: give the SQLAlchemy URL of the database "
                                     "holding the control tables, e.g. ControlTableBlock(url=...).save('prod')")
        listen = self.listen_url.get_secret_value() if self.listen_url is not None else None
        key = (url, self.namespace, self.control_schema, self.prefix, self.connect_timeout,
               self.statement_timeout, listen)
        timeouts = {k: float(v) for k, v in (("connect_timeout", self.connect_timeout),
                                             ("statement_timeout", self.statement_timeout)) if v is not None}
        return key, {"namespace": self.namespace, "schema": self.control_schema, "prefix": self.prefix,
                     "listen_url": listen, **timeouts}

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages."""
        return safe_url(self.url.get_secret_value())


def resolve_block(block: Union[ControlTableBlock, str, None]) -> ControlTableBlock:
    """The block itself, or the saved block of that name (loaded at the moment a slot is entered)."""
    if isinstance(block, ControlTableBlock):
        return block
    if isinstance(block, str) and block:
        loaded = ControlTableBlock.load(block, _sync=True)  # type: ignore[call-arg]
        assert isinstance(loaded, ControlTableBlock)
        return loaded
    raise ConfigurationError(
        f"block={block!r}: give a ControlTableBlock or the name of a saved one, e.g. slot('warehouse', "
        "block='prod') after ControlTableBlock(url=...).save('prod')")
