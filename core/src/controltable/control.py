"""``ControlTable``: the public entry point tying the database, the control tables and the engines together."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from sqlalchemy import inspect, select
from sqlalchemy.engine import Engine, make_url

from . import connect, migrations, tracing
from .db import DEFAULT_URL, Database
from .defaults import (
    CONNECT_TIMEOUT,
    DEFAULT_LEASE,
    DEFAULT_MODE,
    DEFAULT_NAMESPACE,
    DEFAULT_PICKUP,
    DEFAULT_PREFIX,
    DEFAULT_SLOT_PRIORITY,
    DEFAULT_WAITER_TTL,
    HISTORY_RETENTION,
    LISTEN_URL_ENV,
    STATEMENT_TIMEOUT,
)
from .dialects import traits
from .errors import ConfigurationError
from .events import EventTable
from .runtime import Runtime
from .schema import ControlSchema, build_schema
from .slots import (
    GrantRecord,
    Lease,
    PolicyChange,
    Rate,
    ResourceStats,
    ResourceStatus,
    SlotBlock,
    SlotEngine,
    WaitInfo,
    check_rate,
    head_key,
    holder_key,
    slot_key,
)
from .validation import (
    check_identifier,
    check_name,
    check_names,
    check_namespace,
    check_positive_int,
    check_prefix,
    check_priority,
    check_seconds,
    normalize_request,
)
from .wakeups import PushStatus, Wakeups
from .worklist import WorkList

if TYPE_CHECKING:
    from .doctor import Finding


class _Keep:
    """The default of ``set_capacity``'s policy arguments: keep what is set (None clears)."""

    def __repr__(self) -> str:
        return "<keep>"


KEEP: Any = _Keep()


class ControlTable:
    """Coordination state kept in control tables inside your own database.

    One object per process is enough: it owns a connection pool and is safe to share between
    threads. ``namespace`` separates deployments that share a database; ``schema`` and
    ``prefix`` say where the control tables live. ``connect_timeout`` and ``statement_timeout``
    (seconds; ``statement_timeout=None`` keeps the server's own) bound every wait on the
    database, so a silent or black-holed server fails with :class:`DatabaseUnavailableError`
    instead of hanging (see :mod:`controltable.connect` for what each backend gets).

    ``listen_url`` (default: ``CONTROLTABLE_LISTEN_URL``) is a direct URL of the PostgreSQL
    server for the push wake-up listener alone, when ``url`` goes through a connection pooler in
    transaction mode (which swallows ``LISTEN``); all work still goes through ``url``. Without it
    the listener proves at start that its pushes arrive, and reports push inactive when they do not
    (:meth:`push_status`, :meth:`doctor`).
    """

    def __init__(
        self,
        url_or_engine: Union[str, Engine, Any] = DEFAULT_URL,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        schema: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = CONNECT_TIMEOUT,
        statement_timeout: Optional[float] = STATEMENT_TIMEOUT,
        listen_url: Optional[str] = None,
    ) -> None:
        self.namespace = check_namespace(namespace)
        self.schema = check_identifier("schema", schema) if schema is not None else None
        if not isinstance(prefix, str) or (prefix and not prefix.replace("_", "a").isalnum()):
            raise ConfigurationError(f"prefix {prefix!r} must be letters, digits and underscores, e.g. 'ct_'")
        self.prefix = prefix
        self.db = Database(url_or_engine, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
        self.tables: ControlSchema = build_schema(prefix, self.schema)
        self._wakeups = Wakeups(self.db, self.namespace, f"{prefix}wakeup", _listen_url(listen_url, self.db))
        #: What the engines work through (see :mod:`controltable.runtime`).
        self.runtime = Runtime(self.db, self.tables, self.namespace, self.schema, prefix, self._wakeups)
        self._slots = SlotEngine(self.runtime)

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
        """Create the control tables if missing, record the schema version, upgrade older tables. Idempotent.

        Returns the schema version now installed. Needs DDL rights; a DBA can instead run the
        statements printed by ``controltable sql`` and the engine then needs DML rights only.
        """
        return migrations.install(self.db, self.tables)

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
    def set_capacity(
        self,
        name: str,
        capacity: int,
        *,
        rate: Union[Rate, tuple[int, float], None] = KEEP,
        aging: Optional[float] = KEEP,
    ) -> None:
        """Create ``name`` or change its capacity. Shrinking never evicts current holders.

        ``rate=(100, 60)`` (or ``Rate(100, 60)``) also allows at most 100 grants in any 60
        seconds; ``aging=30`` raises a waiter's effective priority by one for every 30 seconds it
        waits, so no priority can starve it. ``None`` clears either; leaving one out keeps it.
        """
        policy = PolicyChange(set_rate=rate is not KEEP, rate=None if rate is KEEP else check_rate(rate),
                              set_aging=aging is not KEEP,
                              aging=None if aging is KEEP else check_seconds("aging", aging, allow_none=True))
        self._slots.set_capacity(check_name("resource", name), check_positive_int("capacity", capacity), policy)

    def delete_resource(self, name: str, *, force: bool = False) -> bool:
        """Remove a resource. Refuses while it has live holders or waiters unless ``force``."""
        return self._slots.delete_resource(check_name("resource", name), force=force)

    @tracing.waits()
    def acquire(
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
    ) -> Lease:
        """Wait in queue order for ``slots`` of ``resource`` (or a mapping of several) and take them.

        ``mode="shared"`` (the default) counts: up to ``capacity`` slots are held at once, as
        with an Airflow pool. ``mode="exclusive"`` runs alone on the resource (a writer lock).
        ``timeout=None`` waits forever, ``0`` tries once; on timeout the queue entry is withdrawn
        and :class:`AcquireTimeout` raised. Acquiring again with the same ``holder`` returns the
        lease it already has. ``attempt`` (e.g. a task's try number) marks a new attempt of the
        same work: a higher attempt gets the same grant with a new, higher fencing token; a lower
        one than recorded raises :class:`LeaseLost`. A grant made on this request's behalf while
        it waits must be picked up within ``pickup`` seconds, else it passes to the next in line.
        ``priority`` (higher first, equal ones FIFO; raised by the resource's aging while waiting)
        orders the queue.
        """
        return self._slots.waiter.acquire(
            resource, holder=holder, slots=slots, mode=mode, timeout=timeout, lease=lease,
            waiter_ttl=waiter_ttl, poll_interval=poll_interval, attempt=attempt, pickup=pickup,
            priority=check_priority(priority),
        )

    @tracing.waits(poll=True)
    def try_acquire(
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
    ) -> Optional[Lease]:
        """Poll once: return the lease if granted now, else ``None`` and *keep the place in the queue*.

        For callers that wait outside this process (Airflow sensors in reschedule mode, triggers):
        call again with the same ``holder`` within ``waiter_ttl`` seconds to keep the place; the
        entry expires after that. Withdraw with :meth:`release`. Idempotent like :meth:`acquire`.
        Pass a ``pickup`` longer than the interval between calls: a grant made on this request's
        behalf in between waits that long for the next call.
        """
        return self._slots.waiter.try_acquire(
            resource, holder=holder, slots=slots, mode=mode, lease=lease, waiter_ttl=waiter_ttl,
            attempt=attempt, pickup=pickup, priority=check_priority(priority),
        )

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
    ) -> SlotBlock:
        """Hold a slot for the duration of a ``with`` block, renewing its lease in the background.

        When the renewer finds the lease lost or expired, the block is interrupted with
        :class:`LeaseLostInterrupt` (a :class:`LeaseLost`) in the thread that entered it, so the
        work stops instead of overlapping the next holder; ``interrupt=False`` (default:
        ``defaults.INTERRUPT_ON_LEASE_LOSS``) lets it run on. Raises :class:`LeaseLost` on exit
        if the lease was lost while the block ran (the block's own exception, if any, takes
        precedence).
        """
        return SlotBlock(lambda: self.acquire(resource, holder=holder, slots=slots, mode=mode, timeout=timeout,
                                              lease=lease, waiter_ttl=waiter_ttl, attempt=attempt, pickup=pickup,
                                              priority=priority), interrupt)

    def find_lease(self, resource: str, holder: str) -> Optional[Lease]:
        """The lease ``holder`` currently has on ``resource``, e.g. to release it from another process."""
        return self._slots.find_lease(check_name("resource", resource), check_name("holder", holder))

    def release(self, resource: str, holder: str) -> int:
        """Release (or withdraw) whatever ``holder`` has on ``resource``; returns rows removed (0 if none)."""
        return self._slots.release_holder(check_name("resource", resource), check_name("holder", holder))

    def release_holders(self, prefix: str) -> int:
        """Release every holder and withdraw every waiter whose holder id starts with ``prefix``.

        For teardown of a whole scope (all tasks of a DAG run, all steps of a Dagster run): use
        holder ids that start with the scope, e.g. ``f"{dag_id}/{run_id}/"``. The prefix is
        matched literally. Whoever can run then is granted. Returns the requests removed.
        """
        return self._slots.release_holders(check_prefix("holder prefix", prefix))

    def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        """Where ``holder`` stands on ``resource`` (state, position, who is ahead), or None."""
        return self._slots.wait_info(check_name("resource", resource), check_name("holder", holder))

    def status(self, resources: Union[list[str], str, None] = None) -> list[ResourceStatus]:
        """Resources with capacity, holders and waiters (who, since when, lease expiry).

        ``resources``: a list of names (or one name as a string); ``None`` for all."""
        return self._slots.status(check_names("resource", resources) if resources is not None else None)

    def reap(self) -> int:
        """Remove expired holders and waiters of this namespace; returns how many."""
        return self._slots.reap()

    # -- grant history ------------------------------------------------------------------------
    def history(self, resource: Optional[str] = None, *, since: float = 3600.0, limit: int = 1000) -> list[GrantRecord]:
        """The grants of the last ``since`` seconds (of ``resource``, or all), newest first."""
        name = check_name("resource", resource) if resource is not None else None
        window = check_seconds("since", since)
        assert window is not None
        return self._slots.history(name, window, check_positive_int("limit", limit))

    def stats(self, resources: Union[list[str], str, None] = None, *, window: float = 3600.0) -> list[ResourceStats]:
        """Per resource: grants, wait p50/p95/max, utilisation, grants per hour and expired
        leases over the last ``window`` seconds (from the grant history)."""
        names = check_names("resource", resources) if resources else None
        seconds = check_seconds("window", window)
        assert seconds is not None
        return self._slots.stats(names, seconds)

    def stats_series(self, resource: str, *, window: float = 3600.0, buckets: int = 12) -> list[ResourceStats]:
        """:meth:`stats` of ``resource`` for ``buckets`` equal parts of the last ``window``, oldest first."""
        seconds = check_seconds("window", window)
        assert seconds is not None
        return self._slots.stats_series(check_name("resource", resource), seconds,
                                        check_positive_int("buckets", buckets, maximum=10_000))

    def prune_history(self, older_than: Optional[float] = None) -> int:
        """Delete ended grants older than ``older_than`` seconds (default: the retention, 7 days).

        Runs in batches of short transactions; returns the rows deleted. Releases also prune a
        batch now and then, so calling this is only needed to shrink the history at once.
        """
        seconds = check_seconds("older_than", HISTORY_RETENTION if older_than is None else older_than,
                                allow_zero=True)
        assert seconds is not None
        return self._slots.prune_history(seconds)

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
        table_schema: Optional[str] = None,
        **options: Any,
    ) -> EventTable:
        """Batch claiming on the user's own event table ``table`` (see :class:`EventTable`).

        ``table_schema`` is the event table's schema, not the control tables'.
        """
        return EventTable(self.runtime, table, key=key, order_by=order_by, table_schema=table_schema, **options)

    def worklist(self, name: str) -> WorkList:
        """An ordered work list kept in the control tables (see :class:`WorkList`)."""
        return WorkList(self.runtime, check_name("work list", name))

    # -- wake-ups ------------------------------------------------------------------------------------
    def wakeup_keys(self, resource: Union[str, Mapping[str, int]], holder: Optional[str] = None) -> list[str]:
        """The wake-up keys that concern a slot request (for adapters that wait outside ``acquire``).

        With ``holder``: the key pushed when that request is granted (on its behalf, to be picked
        up within its ``pickup`` seconds by calling ``try_acquire`` again) or becomes the head of
        its queue. Without: the keys pushed when grants are made or expired holders reaped.
        """
        names = sorted(normalize_request(resource, 1))
        if holder is None:
            return [slot_key(n) for n in names]
        who = check_name("holder", holder)
        return [holder_key(names[0], who), head_key(names[0], who)]

    def add_wakeup_listener(self, keys: list[str], callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (from the listener thread) on every push for one of ``keys``.

        One listener connection per ``ControlTable`` serves all its users. Returns a function
        that removes the callback. Without push (not PostgreSQL) the callback is never called:
        poll, e.g. every few seconds, as the fallback. Async code bridges with
        ``loop.call_soon_threadsafe``.
        """
        return self._wakeups.add_listener(list(keys), callback)

    def wait_for_wakeup(self, keys: list[str], seconds: float) -> bool:
        """Block up to ``seconds`` or until a push for one of ``keys``; True if woken by a push."""
        wait = check_seconds("seconds", seconds, allow_zero=True)
        assert wait is not None
        return self._wakeups.wait(list(keys), wait)

    @property
    def push_active(self) -> bool:
        """Whether pushes are being received now (PostgreSQL with psycopg); else callers must poll."""
        return self._wakeups.active

    def push_status(self) -> PushStatus:
        """Whether push wake-ups reach this process and, when not, why and what to set."""
        return self._wakeups.status()

    @property
    def wakeups(self) -> Wakeups:
        """This control table's wake-ups (one listener connection shared by every waiter here): its
        ``listen_url``, ``channel``, ``probe()``, the count of pushes ``received``, ``lost``.

        For diagnostics (``doctor``) and tests; waiting code uses :meth:`add_wakeup_listener`,
        :meth:`wait_for_wakeup` and :attr:`push_active`."""
        return self._wakeups

    def doctor(self, *, event_tables: Sequence[EventTable] = ()) -> list[Finding]:
        """Check whether this setup keeps controltable's promises: one :class:`Finding` per check.

        Server kind and version, a connection pooler and its mode, push wake-ups (round trip),
        primary or standby and synchronous replication, clock skew, isolation level, privileges,
        the control tables' version, Galera settings, and each of ``event_tables``' claim indexes
        and statistics. Every finding has a ``level`` (``ok``, ``info``, ``warning``, ``error``)
        and a ``fix``. Read-only apart from one notification and probes that match no row. An
        unreachable database raises :class:`DatabaseUnavailableError` instead.
        """
        from .doctor import run_checks

        return run_checks(self, self._wakeups, event_tables=event_tables)


def _listen_url(given: Optional[str], db: Database) -> Optional[str]:
    """``listen_url`` as given, else ``CONTROLTABLE_LISTEN_URL`` when the database is PostgreSQL
    (a variable set for a whole environment must not break a SQLite or MariaDB control table)."""
    if given is not None:
        return _typed(given) if given else None
    found = os.environ.get(LISTEN_URL_ENV, "").strip()
    return _typed(found) if found and traits(db.dialect_name).listen_notify else None


def _typed(url: str) -> str:
    """``url`` with the spellings people type made explicit (``postgres://``, see
    :func:`connect.typed_url`); text that is no URL is left for the listener's own check to name."""
    try:
        parsed = make_url(url)
    except Exception:
        return url
    return str(connect.typed_url(parsed).render_as_string(hide_password=False))
