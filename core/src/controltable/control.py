"""``ControlTable``: the public entry point tying the database, the control tables and the engines together."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Union

from sqlalchemy import insert, inspect, select, update
from sqlalchemy.engine import Connection, Engine

from .db import DEFAULT_URL, Database
from .defaults import CONNECT_TIMEOUT, STATEMENT_TIMEOUT
from .errors import ConfigurationError, NotInstalledError
from .schema import SCHEMA_VERSION, ControlSchema, build_schema
from .slots import DEFAULT_LEASE, DEFAULT_WAITER_TTL, Lease, ResourceStatus, SlotEngine
from .validation import check_identifier, check_name, check_namespace, check_positive_int
from .wakeups import Wakeups

if TYPE_CHECKING:  # pragma: no cover
    from .events import EventTable
    from .worklist import WorkList


class ControlTable:
    """Coordination state kept in control tables inside your own database.

    One object per process is enough: it owns a connection pool and is safe to share between
    threads. ``namespace`` separates deployments that share a database; ``schema`` and
    ``prefix`` say where the control tables live. ``connect_timeout`` and ``statement_timeout``
    (seconds; ``statement_timeout=None`` keeps the server's own) bound every wait on the
    database, so a silent or black-holed server fails with :class:`DatabaseUnavailableError`
    instead of hanging (see :mod:`controltable.connect` for what each backend gets).
    """

    def __init__(
        self,
        url_or_engine: Union[str, Engine, Any] = DEFAULT_URL,
        *,
        namespace: str = "default",
        schema: Optional[str] = None,
        prefix: str = "ct_",
        connect_timeout: float = CONNECT_TIMEOUT,
        statement_timeout: Optional[float] = STATEMENT_TIMEOUT,
    ) -> None:
        self.namespace = check_namespace(namespace)
        self.schema = check_identifier("schema", schema) if schema is not None else None
        if not isinstance(prefix, str) or (prefix and not prefix.replace("_", "a").isalnum()):
            raise ConfigurationError(f"prefix {prefix!r} must be letters, digits and underscores, e.g. 'ct_'")
        self.prefix = prefix
        self.db = Database(url_or_engine, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
        self.tables: ControlSchema = build_schema(prefix, self.schema)
        self._slots = SlotEngine(self)
        self._wakeups = Wakeups(self.db, self.namespace, f"{prefix}wakeup")

    def __repr__(self) -> str:
        return f"ControlTable({self.db.safe_url!r}, namespace={self.namespace!r})"

    @property
    def engine(self) -> Engine:
        return self.db.engine

    def close(self) -> None:
        """Stop the wake-up listener and close the connection pool."""
        self._wakeups.close()
        self.db.dispose()

    def __enter__(self) -> ControlTable:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- installation -------------------------------------------------------------------------
    def install(self) -> int:
        """Create the control tables if missing and record the schema version. Idempotent.

        Returns the schema version now installed. Needs DDL rights; a DBA can instead run the
        statements printed by ``controltable sql`` and the engine then needs DML rights only.
        """
        self.db.ping()
        with self.db.translating():  # e.g. no CREATE privilege: PermissionDeniedError, not a driver error
            self.tables.metadata.create_all(self.db.engine, checkfirst=True)
        meta = self.tables.meta

        def record(conn: Connection) -> int:
            found = conn.scalar(select(meta.c.value).where(meta.c.key == "schema_version"))
            if found is None:
                conn.execute(insert(meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
                return SCHEMA_VERSION
            version = int(found)
            if version > SCHEMA_VERSION:
                raise NotInstalledError(
                    f"the control tables have schema version {version}, newer than this controltable "
                    f"({SCHEMA_VERSION}); upgrade the controltable package"
                )
            if version < SCHEMA_VERSION:  # pragma: no cover - first migration arrives with version 2
                conn.execute(update(meta).where(meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))
            return SCHEMA_VERSION

        try:
            return self.db.run(record)
        except Exception as exc:
            if "unique" in str(exc).lower() or "duplicate" in str(exc).lower():  # a concurrent install
                return SCHEMA_VERSION
            raise

    def ping(self) -> None:
        """Connect once; raises :class:`DatabaseUnavailableError` naming the URL if that fails."""
        self.db.ping()

    def installed_version(self) -> Optional[int]:
        """The recorded schema version, or None when the control tables are missing."""
        self.db.ping()
        with self.db.translating():
            present = inspect(self.db.engine).has_table(self.tables.meta.name, schema=self.schema)
        if not present:
            return None
        meta = self.tables.meta
        value = self.db.run(lambda c: c.scalar(select(meta.c.value).where(meta.c.key == "schema_version")))
        return int(value) if value is not None else None

    # -- resources ----------------------------------------------------------------------------
    def set_capacity(self, name: str, capacity: int) -> None:
        """Create ``name`` or change its capacity. Shrinking never evicts current holders."""
        self._slots.set_capacity(check_name("resource", name), check_positive_int("capacity", capacity))

    def delete_resource(self, name: str, *, force: bool = False) -> bool:
        """Remove a resource. Refuses while it has live holders or waiters unless ``force``."""
        return self._slots.delete_resource(check_name("resource", name), force=force)

    def acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str] = None,
        slots: int = 1,
        mode: str = "exclusive",
        timeout: Optional[float] = None,
        lease: float = DEFAULT_LEASE,
        waiter_ttl: float = DEFAULT_WAITER_TTL,
        poll_interval: float = 0.05,
    ) -> Lease:
        """Wait in FIFO order for ``slots`` of ``resource`` (or a mapping of several) and take them.

        ``mode="exclusive"`` runs alone on the resource; ``mode="shared"`` runs beside other
        shared holders up to the capacity. ``timeout=None`` waits forever, ``0`` tries once;
        on timeout the queue entry is withdrawn and :class:`AcquireTimeout` raised. Acquiring
        again with the same ``holder`` returns the lease it already has.
        """
        return self._slots.acquire(
            resource, holder=holder, slots=slots, mode=mode, timeout=timeout, lease=lease,
            waiter_ttl=waiter_ttl, poll_interval=poll_interval,
        )

    def try_acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: str,
        slots: int = 1,
        mode: str = "exclusive",
        lease: float = DEFAULT_LEASE,
        waiter_ttl: float = DEFAULT_WAITER_TTL,
    ) -> Optional[Lease]:
        """Poll once: return the lease if granted now, else ``None`` and *keep the place in the queue*.

        For callers that wait outside this process (Airflow sensors in reschedule mode, triggers):
        call again with the same ``holder`` within ``waiter_ttl`` seconds to keep the place; the
        entry expires after that. Withdraw with :meth:`release`. Idempotent like :meth:`acquire`.
        """
        return self._slots.try_acquire(
            resource, holder=holder, slots=slots, mode=mode, lease=lease, waiter_ttl=waiter_ttl
        )

    @contextmanager
    def slot(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str] = None,
        slots: int = 1,
        mode: str = "exclusive",
        timeout: Optional[float] = None,
        lease: float = DEFAULT_LEASE,
        waiter_ttl: float = DEFAULT_WAITER_TTL,
    ) -> Iterator[Lease]:
        """Hold a slot for the duration of a ``with`` block, renewing its lease in the background.

        Raises :class:`LeaseLost` on exit if the lease was lost while the block ran (the block's
        own exception, if any, takes precedence).
        """
        lease_obj = self.acquire(resource, holder=holder, slots=slots, mode=mode, timeout=timeout,
                                 lease=lease, waiter_ttl=waiter_ttl)
        lease_obj.start_renewing()
        with lease_obj:
            yield lease_obj

    def find_lease(self, resource: str, holder: str) -> Optional[Lease]:
        """The lease ``holder`` currently has on ``resource``, e.g. to release it from another process."""
        return self._slots.find_lease(check_name("resource", resource), check_name("holder", holder))

    def release(self, resource: str, holder: str) -> int:
        """Release (or withdraw) whatever ``holder`` has on ``resource``; returns rows removed (0 if none)."""
        return self._slots.release_holder(check_name("resource", resource), check_name("holder", holder))

    def status(self, resources: Optional[list[str]] = None) -> list[ResourceStatus]:
        """Resources with capacity, holders and waiters (who, since when, lease expiry)."""
        return self._slots.status(resources)

    def reap(self) -> int:
        """Remove expired holders and waiters of this namespace; returns how many."""
        return self._slots.reap()

    def now(self) -> float:
        """The database clock as UTC epoch seconds (the clock all leases use)."""
        return self.db.now()

    # -- events and work lists -----------------------------------------------------------------
    def events(
        self,
        table: str,
        *,
        key: str,
        order_by: Optional[str] = None,
        schema: Optional[str] = None,
        **options: Any,
    ) -> EventTable:
        """Batch claiming on the user's own event table ``table`` (see :class:`EventTable`)."""
        from .events import EventTable

        return EventTable(self, table, key=key, order_by=order_by, schema=schema, **options)

    def worklist(self, name: str) -> WorkList:
        """An ordered work list kept in the control tables (see :class:`WorkList`)."""
        from .worklist import WorkList

        return WorkList(self, check_name("work list", name))

    # -- wake-ups ------------------------------------------------------------------------------------
    def _notify(self, conn: Connection, keys: list[str]) -> None:
        """Inside ``conn``'s transaction: wake waiters of ``keys`` when it commits (PostgreSQL)."""
        self._wakeups.notify(conn, keys)

    def _wait_for_wakeup(self, keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> bool:
        """Sleep up to ``seconds``, or less when a wake-up arrives for one of ``keys``."""
        return self._wakeups.wait(keys, seconds, since)
