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

import atexit
import logging
import threading
from typing import Any, Optional, Union

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from controltable import ControlTable
from controltable.aio import AsyncControlTable, loop_shared
from controltable.defaults import DEFAULT_LEASE, DEFAULT_NAMESPACE, DEFAULT_PREFIX, INTERRUPT_ON_LEASE_LOSS
from controltable.errors import ConfigurationError, safe_url

log = logging.getLogger("prefect_controltable")

_OPEN: dict[tuple[Any, ...], ControlTable] = {}
_OPEN_LOCK = threading.Lock()
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
        key, settings = self._settings()
        url = self.url.get_secret_value()
        return loop_shared(("prefect", *key), lambda: AsyncControlTable(url, **settings))

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
