"""``ControlTableResource``: controltable's slots, event batches and work lists as a Dagster resource.

Dagster's own concurrency pools live in one instance's storage, take one key per op and leak
slots when a run is cancelled. This resource keeps the coordination state in control tables in
a database the user chooses, so Dagster instances, Airflow deployments and shell jobs that
share it also share the limits, and every slot is a lease that expires if its holder dies.

Errors are turned into :class:`dagster.Failure` at the step that hit them, with a description
naming the fix, instead of a traceback from deep inside SQLAlchemy.
"""

import logging
import re
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar, Union

from dagster import (
    ConfigurableResource,
    DagsterInvariantViolationError,
    Failure,
    InitResourceContext,
    MetadataValue,
    OpExecutionContext,
    RetryRequested,
)
from pydantic import Field, PrivateAttr
from sqlalchemy.exc import SQLAlchemyError

from controltable import (
    AcquireTimeout,
    ConfigurationError,
    ControlTable,
    ControlTableError,
    DatabaseUnavailableError,
    Lease,
    LeaseLost,
    NotInstalledError,
    ResourceStatus,
    UnknownResourceError,
)

try:  # only for type hints: these classes are reached through ControlTable.events()/worklist()
    from controltable.events import Batch, EventTable
    from controltable.worklist import Item, WorkList
except ImportError:  # pragma: no cover - a core without these modules cannot work anyway
    Batch = EventTable = Item = WorkList = Any  # type: ignore[misc,assignment]

log = logging.getLogger("dagster_controltable")

T = TypeVar("T")

#: The core's default slot lease; repeated here so the resource's config shows a number.
DEFAULT_LEASE = 300.0
WAIT_MODES = ("block", "retry")
_HOLDER_LIMIT = 200
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


class StepIdentity:
    """Who is asking, as far as Dagster tells: run id, step key, retry number and a logger."""

    def __init__(self, run_id: Optional[str], step_key: Optional[str], retry_number: int, logger: Any) -> None:
        self.run_id = run_id
        self.step_key = step_key
        self.retry_number = retry_number
        self.log = logger

    @property
    def holder(self) -> Optional[str]:
        """``dagster:<run id>:<step key>``: stable across retries of the step, unique across steps.

        Stability across retries is what lets a step that raised ``RetryRequested`` keep its
        place in the FIFO queue; uniqueness keeps two steps from sharing one lease.
        """
        if self.run_id is None:
            return None
        text = f"dagster:{self.run_id}:{self.step_key or 'run'}"
        return _UNSAFE.sub("_", text)[:_HOLDER_LIMIT]


def current_step() -> StepIdentity:
    """The executing op/asset's identity, read from the context Dagster sets for the step.

    ``OpExecutionContext.get()`` works from any code the step calls (resource methods included)
    but only in the step's own thread; elsewhere (sensors, scripts) the identity is empty.
    """
    try:
        ctx = OpExecutionContext.get()
    except DagsterInvariantViolationError:
        ctx = None
    if ctx is None:
        return StepIdentity(None, None, 0, log)
    try:
        step_key: Optional[str] = ctx.get_step_execution_context().step.key
    except Exception:  # pragma: no cover - framework-author API; fall back to the op name
        step_key = ctx.op.name
    return StepIdentity(ctx.run_id, step_key, int(ctx.retry_number), ctx.log)


def as_failure(exc: BaseException, action: str, *, url: str = "", namespace: str = "") -> Failure:
    """Turn a controltable or SQLAlchemy error into a ``Failure`` that says what to change.

    Connection problems allow Dagster retries (the database may come back); configuration
    problems do not, because retrying cannot fix them.
    """
    where = f" (control table at {url}, namespace {namespace!r})" if url else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    retries: Optional[bool] = False
    if isinstance(exc, DatabaseUnavailableError):
        fix = ("check the `url` of ControlTableResource (e.g. EnvVar('CONTROLTABLE_URL')), that the database "
               "server is running and reachable from this process, and the credentials")
        retries = True
        kind = "control-table database unreachable"
    elif isinstance(exc, NotInstalledError) and "event table" in first:
        fix = ("add the claim columns once with `controltable events prepare TABLE --key KEY` or "
               "ControlTableResource.events(TABLE, key=KEY, prepare=True)")
        kind = "event table not prepared"
    elif isinstance(exc, NotInstalledError):
        fix = "create the control tables once with `controltable init --url ...` or ControlTableResource.install()"
        kind = "control tables not installed"
    elif isinstance(exc, UnknownResourceError):
        fix = ("create the resource once with ControlTableResource.set_capacity(name, n) or "
               "`controltable capacity set NAME N`, and check the namespace")
        kind = "unknown controltable resource"
    elif isinstance(exc, AcquireTimeout):
        fix = "raise the timeout or the capacity, or see `controltable status` for who holds the slot"
        retries = True
        kind = "slot not granted in time"
    elif isinstance(exc, LeaseLost):
        fix = ("the lease expired before it was renewed or completed; ask for a longer lease, and make the "
               "protected system reject stale fencing tokens")
        retries = True
        kind = "lease lost"
    elif isinstance(exc, ConfigurationError):
        fix = "fix the argument or configuration named above"
        kind = "controltable configuration error"
    elif isinstance(exc, ControlTableError):
        fix = "see the message above"
        kind = "controltable error"
    elif isinstance(exc, SQLAlchemyError):
        fix = "check the `url`, the database permissions and that the tables exist"
        retries = None
        kind = "database error"
    else:
        fix = "see the chained exception"
        retries = None
        kind = type(exc).__name__
    return Failure(
        description=f"{kind} while {action}{where}: {first}. Fix: {fix}.",
        metadata={"error": MetadataValue.text(f"{type(exc).__name__}: {first}"),
                  "control_table": MetadataValue.text(url or "?")},
        allow_retries=retries,
    )


class ControlTableResource(ConfigurableResource):
    """Coordination through controltable's control tables in your own database.

    One engine is created per run process (``setup_for_execution``) and disposed on teardown.
    Every method turns controltable errors into :class:`dagster.Failure` with the fix.

    Example::

        defs = Definitions(
            assets=[orders],
            resources={"controltable": ControlTableResource(url=EnvVar("CONTROLTABLE_URL"))},
        )

        @asset
        def orders(controltable: ControlTableResource) -> None:
            with controltable.slot("warehouse"):
                load_orders()
    """

    url: str = Field(description="SQLAlchemy URL of the database holding the control tables, e.g. "
                                 "postgresql+psycopg://user@host/db or sqlite:////data/controltable.db.")
    namespace: str = Field(default="default", description="Separates deployments sharing one database; "
                                                          "everyone who must share a limit uses the same one.")
    schema_: Optional[str] = Field(default=None, alias="schema",
                                   description="Database schema holding the control tables (default: the "
                                               "connection's default schema).")
    default_lease: float = Field(default=DEFAULT_LEASE, description="Seconds a slot lease lasts between renewals; "
                                 "a holder that dies frees its slot after at most this long.")
    prefix: str = Field(default="ct_", description="Name prefix of the control tables.")

    _ct: Optional[ControlTable] = PrivateAttr(default=None)
    _setup_error: Optional[BaseException] = PrivateAttr(default=None)
    _checked: bool = PrivateAttr(default=False)
    _events: dict[tuple[Any, ...], EventTable] = PrivateAttr(default_factory=dict)

    # -- lifecycle -----------------------------------------------------------------------------
    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Create the engine once for this process; a bad URL is reported at the step that uses it.

        Nothing connects here: resource initialisation errors are reported by Dagster away from
        the step, while a ``Failure`` raised by the step names the op and the fix.
        """
        self._open()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Dispose the engine, so a run process leaves no pooled connections behind."""
        self.close()

    def close(self) -> None:
        if self._ct is not None:
            self._ct.close()
        self._ct = None
        self._checked = False
        self._events = {}
        self._setup_error = None

    def _open(self) -> None:
        if self._ct is not None:
            return
        try:
            self._ct = ControlTable(self.url, namespace=self.namespace, schema=self.schema_, prefix=self.prefix)
            self._setup_error = None
        except (ControlTableError, SQLAlchemyError, ImportError) as exc:
            self._setup_error = exc

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages."""
        if self._ct is not None:
            return str(self._ct.engine.url.render_as_string(hide_password=True))
        return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", self.url)

    def _fail(self, exc: BaseException, action: str) -> Failure:
        return as_failure(exc, action, url=self.safe_url, namespace=self.namespace)

    def _call(self, action: str, fn: Callable[[], T]) -> T:
        """Run one core call, translating its errors into a ``Failure`` naming ``action``."""
        try:
            return fn()
        except (ControlTableError, SQLAlchemyError) as exc:
            raise self._fail(exc, action) from exc

    @property
    def control_table(self) -> ControlTable:
        """The core :class:`ControlTable` (connected and checked) for anything not mirrored here."""
        self._open()
        if self._setup_error is not None:
            raise self._fail(self._setup_error, "opening the control table")
        assert self._ct is not None
        if not self._checked:
            # now() goes through the core's error translation (an unreachable database becomes
            # DatabaseUnavailableError); installed_version() then tells a missing installation.
            self._call("connecting to the control table", self._ct.now)
            version = self._call("connecting to the control table", self._ct.installed_version)
            if version is None:
                raise self._fail(
                    NotInstalledError(f"no control tables (prefix {self.prefix!r}) in {self.safe_url}"),
                    "connecting to the control table",
                )
            self._checked = True
        return self._ct

    def _raw(self) -> ControlTable:
        """The core object without the installed check (for ``install`` itself)."""
        self._open()
        if self._setup_error is not None:
            raise self._fail(self._setup_error, "opening the control table")
        assert self._ct is not None
        return self._ct

    # -- administration --------------------------------------------------------------------------
    def install(self) -> int:
        """Create the control tables if missing (idempotent); returns the schema version."""
        ct = self._raw()
        version = self._call("installing the control tables", ct.install)
        self._checked = True
        return version

    def set_capacity(self, name: str, capacity: int) -> None:
        """Create resource ``name`` or change its capacity (shrinking never evicts holders)."""
        ct = self.control_table
        self._call(f"setting the capacity of {name!r}", lambda: ct.set_capacity(name, capacity))

    def status(self, resources: Optional[list[str]] = None) -> list[ResourceStatus]:
        """Resources with capacity, holders and waiters, as ``controltable status`` shows them."""
        ct = self.control_table
        return self._call("reading the status", lambda: ct.status(resources))

    # -- slots -------------------------------------------------------------------------------------
    def default_holder(self) -> Optional[str]:
        """``dagster:<run id>:<step key>`` inside a step, else ``None`` (the core then makes one up)."""
        return current_step().holder

    def acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str] = None,
        slots: int = 1,
        mode: str = "exclusive",
        timeout: Optional[float] = None,
        lease: Optional[float] = None,
        waiter_ttl: float = 30.0,
    ) -> Lease:
        """Wait (FIFO) for slots and return the :class:`Lease`; release it yourself (or use ``with``).

        Prefer :meth:`slot`, which also renews the lease. ``holder`` defaults to the step's
        identity, so a retried step re-acquiring gets the lease it already has.
        """
        ct = self.control_table
        who = holder or self.default_holder()
        names = _names(resource)
        try:
            return ct.acquire(resource, holder=who, slots=slots, mode=mode, timeout=timeout,
                              lease=lease or self.default_lease, waiter_ttl=waiter_ttl)
        except (ControlTableError, SQLAlchemyError) as exc:
            raise self._fail(exc, f"acquiring {names}") from exc
        except BaseException:  # interrupted (run cancelled) while queued: give the place up now
            if who is not None:
                self._withdraw(ct, resource, who)
            raise

    def release(self, resource: str, holder: Optional[str] = None) -> int:
        """Release (or withdraw) what ``holder`` (default: this step) has on ``resource``."""
        ct = self.control_table
        who = holder or self.default_holder()
        if who is None:
            raise Failure(description="release() outside a step needs an explicit holder=")
        return self._call(f"releasing {resource!r}", lambda: ct.release(resource, who))

    @contextmanager
    def slot(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str] = None,
        slots: int = 1,
        mode: str = "exclusive",
        timeout: Optional[float] = None,
        lease: Optional[float] = None,
        waiter_ttl: Optional[float] = None,
        wait: str = "block",
        retry_interval: float = 30.0,
        max_retries: int = 120,
    ) -> Iterator[Lease]:
        """Hold slots of ``resource`` for the ``with`` block, renewing the lease in the background.

        ``wait="block"`` (default) waits inside the step in FIFO order (``timeout`` seconds, or
        forever). ``wait="retry"`` polls once and, if the slot is busy, raises
        :class:`dagster.RetryRequested` so the step gives back its worker and Dagster resources
        while it waits; the queue place is kept between retries because the holder (run id +
        step key) is the same on every retry, for ``waiter_ttl`` seconds (default: twice the
        retry interval plus a minute). After ``max_retries`` the step fails and leaves the queue.

        The slot is released when the block exits, also when it raises; if the run is killed,
        the lease expires after ``lease`` seconds. A lease lost while the block ran fails the
        step (the work may have overlapped with another holder). Re-acquiring with the same
        holder returns the same lease, so two nested blocks on one resource in one step need
        distinct ``holder=`` values.
        """
        if wait not in WAIT_MODES:
            raise Failure(description=f"slot(wait={wait!r}) must be one of {', '.join(WAIT_MODES)}")
        ct = self.control_table
        step = current_step()
        who = holder or step.holder
        names = _names(resource)
        lease_s = lease or self.default_lease
        started = time.monotonic()
        if wait == "retry":
            granted = self._try_or_retry(ct, resource, who, step, slots=slots, mode=mode, lease=lease_s,
                                         waiter_ttl=waiter_ttl, retry_interval=retry_interval,
                                         max_retries=max_retries)
        else:
            granted = self._block(ct, resource, who, step, slots=slots, mode=mode, timeout=timeout, lease=lease_s,
                                  waiter_ttl=waiter_ttl if waiter_ttl is not None else 30.0)
        step.log.info(
            f"controltable: holding {names} ({mode}, {slots} slot(s)) as {granted.holder!r}, fencing token "
            f"{granted.token}, after waiting {time.monotonic() - started:.1f} s"
        )
        granted.start_renewing()
        try:
            yield granted
        except BaseException:
            try:
                granted.__exit__(*_exc_info())  # releases; a lost lease is only logged, the block's error wins
            except Exception as exc:  # e.g. the database went away: the lease expires on its own
                log.warning("controltable: could not release %s after an error in the block: %s", names, exc)
            raise
        try:
            granted.__exit__(None, None, None)
        except LeaseLost as exc:
            raise self._fail(exc, f"holding {names}") from exc
        except (ControlTableError, SQLAlchemyError) as exc:
            raise self._fail(exc, f"releasing {names}") from exc
        step.log.info(f"controltable: released {names}")

    def _block(
        self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: Optional[str], step: StepIdentity,
        *, slots: int, mode: str, timeout: Optional[float], lease: float, waiter_ttl: float,
    ) -> Lease:
        names = _names(resource)
        if who is not None:  # one poll first, to tell the user where they stand before waiting
            first = self._call(f"acquiring {names}", lambda: ct.try_acquire(
                resource, holder=who, slots=slots, mode=mode, lease=lease, waiter_ttl=waiter_ttl))
            if first is not None:
                return first
            step.log.info(f"controltable: waiting for {names}: {self._describe_queue(ct, resource)}")
        try:
            return ct.acquire(resource, holder=who, slots=slots, mode=mode, timeout=timeout, lease=lease,
                              waiter_ttl=waiter_ttl)
        except (ControlTableError, SQLAlchemyError) as exc:
            raise self._fail(exc, f"waiting for {names}") from exc
        except BaseException:  # the run was cancelled while we waited: leave the queue at once
            if who is not None:
                self._withdraw(ct, resource, who)
            raise

    def _try_or_retry(
        self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: Optional[str], step: StepIdentity,
        *, slots: int, mode: str, lease: float, waiter_ttl: Optional[float], retry_interval: float,
        max_retries: int,
    ) -> Lease:
        names = _names(resource)
        if who is None:
            raise Failure(description=(
                f"slot({names}, wait='retry') needs a holder that is the same on every retry; outside a "
                "step pass holder= explicitly"))
        ttl = waiter_ttl if waiter_ttl is not None else 2 * retry_interval + 60.0
        if ttl <= retry_interval:
            raise Failure(description=(
                f"waiter_ttl ({ttl:g} s) must be longer than retry_interval ({retry_interval:g} s), or the queue "
                "place expires between retries"))
        granted = self._call(f"acquiring {names}", lambda: ct.try_acquire(
            resource, holder=who, slots=slots, mode=mode, lease=lease, waiter_ttl=ttl))
        if granted is not None:
            return granted
        queue = self._describe_queue(ct, resource)
        if step.retry_number >= max_retries:
            self._withdraw(ct, resource, who)
            raise Failure(
                description=(f"{names} was still busy after {max_retries} retries {retry_interval:g} s apart "
                             f"({queue}); raise max_retries or the capacity, or see `controltable status`"),
                allow_retries=False,
            )
        step.log.info(f"controltable: {names} busy ({queue}); retrying the step in {retry_interval:g} s "
                      f"(retry {step.retry_number + 1} of {max_retries}), keeping the queue place")
        raise RetryRequested(max_retries=max_retries, seconds_to_wait=retry_interval)

    def _withdraw(self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: str) -> None:
        for name in ([resource] if isinstance(resource, str) else list(resource)):
            try:
                ct.release(name, who)
            except Exception as exc:  # best effort: the waiter entry expires on its own anyway
                log.warning("controltable: could not withdraw %s from %r: %s", who, name, exc)

    def _describe_queue(self, ct: ControlTable, resource: Union[str, Mapping[str, int]]) -> str:
        try:
            parts = []
            for st in ct.status(list(_names_list(resource))):
                holders = ", ".join(h.holder for h in st.holders if not h.expired) or "none"
                parts.append(f"{st.name!r} {st.used}/{st.capacity} used, held by {holders}, "
                             f"{len([w for w in st.waiters if not w.expired])} waiting")
            return "; ".join(parts) or "no status"
        except Exception as exc:  # the status is only for the log line
            return f"status unavailable ({exc})"

    # -- events ------------------------------------------------------------------------------------
    def events(
        self,
        table: str,
        *,
        key: str,
        order_by: Optional[str] = None,
        schema: Optional[str] = None,
        prepare: bool = False,
        **options: Any,
    ) -> EventTable:
        """Batch claiming on the user's table ``table`` (core ``ControlTable.events``), checked now.

        The table is reflected here so that a missing table, a missing key column or missing
        claim columns fail the step with the fix rather than at the first claim. ``prepare=True``
        adds missing claim columns and the claim index first (idempotent; needs DDL rights).
        ``options`` go to the core (``max_attempts``, ``backoff``, ``lease``, ``where``...).
        """
        ct = self.control_table
        try:  # reuse the reflected table within this process (e.g. one claim per batch of a drain)
            cache_key: Optional[tuple[Any, ...]] = (table, key, order_by, schema, tuple(sorted(options.items())))
            hash(cache_key)
        except TypeError:  # e.g. a where= expression
            cache_key = None
        if cache_key is not None and not prepare and cache_key in self._events:
            return self._events[cache_key]
        action = f"opening event table {table!r}"
        events = self._call(action, lambda: ct.events(table, key=key, order_by=order_by, schema=schema, **options))
        if prepare:
            self._call(f"preparing event table {table!r}", events.prepare)
        self._call(action, lambda: events.table)
        if cache_key is not None:
            self._events[cache_key] = events
        return events

    @contextmanager
    def claim_batch(
        self,
        table: str,
        *,
        key: str,
        size: int = 100,
        order_by: Optional[str] = None,
        schema: Optional[str] = None,
        owner: Optional[str] = None,
        lease: Optional[float] = None,
        **options: Any,
    ) -> Iterator[Optional[Batch]]:
        """Claim one batch for the ``with`` block and finish it: complete on success, fail on error.

        Yields ``None`` when nothing is claimable. Completion is fenced on the batch token: if the
        claim expired and another worker took rows over, the step fails naming them and nothing
        is completed. An exception in the block gives the rows back for a retry after the
        table's back-off (counting an attempt); a cancelled run gives them back untouched.
        If the block already finished the batch (e.g. with ``batch.transaction()``), that stands.
        """
        events = self.events(table, key=key, order_by=order_by, schema=schema, **options)
        who = owner or self.default_holder()
        batch = self._call(f"claiming from {table!r}", lambda: events.claim(size, owner=who, lease=lease))
        if batch is None:
            yield None
            return
        step = current_step()
        step.log.info(f"controltable: claimed {len(batch)} event(s) of {table!r} under token {batch.token}")
        try:
            yield batch
        except RetryRequested:
            if not batch.finished:  # a retry is not a failed attempt: give the rows back untouched
                self._call(f"releasing batch {batch.token}", batch.release)
            raise
        except Exception as exc:
            if not batch.finished:
                try:
                    batch.fail(f"{type(exc).__name__}: {exc}")
                except Exception as fail_exc:  # the block's error is the one to report
                    log.warning("controltable: could not fail batch %s: %s", batch.token, fail_exc)
            raise
        except BaseException:
            if not batch.finished:
                try:
                    batch.release()
                except Exception as rel_exc:
                    log.warning("controltable: could not release batch %s: %s", batch.token, rel_exc)
            raise
        if not batch.finished:
            self._call(f"completing batch {batch.token} of {table!r}", batch.complete)

    # -- work lists --------------------------------------------------------------------------------
    def worklist(self, name: str) -> WorkList:
        """The ordered work list ``name`` (core ``ControlTable.worklist``), checked now."""
        ct = self.control_table
        wl = self._call(f"opening work list {name!r}", lambda: ct.worklist(name))
        self._call(f"opening work list {name!r}", wl.status)
        return wl


def batch_metadata(batch: Batch, *, max_keys: int = 100) -> dict[str, MetadataValue]:
    """Dagster metadata for a claimed batch: table, token, count and (up to ``max_keys``) keys."""
    keys = [_jsonable(k) for k in batch.keys]
    return {
        "controltable/table": MetadataValue.text(batch.events.qualified_name),
        "controltable/token": MetadataValue.int(int(batch.token)),
        "controltable/events": MetadataValue.int(len(keys)),
        "controltable/keys": MetadataValue.json({"keys": keys[:max_keys], "truncated": len(keys) > max_keys}),
        "controltable/owner": MetadataValue.text(batch.owner),
    }


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _names_list(resource: Union[str, Mapping[str, int]]) -> list[str]:
    return [resource] if isinstance(resource, str) else [str(k) for k in resource]


def _names(resource: Union[str, Mapping[str, int]]) -> str:
    return ", ".join(repr(n) for n in _names_list(resource))


def _exc_info() -> Any:
    import sys

    return sys.exc_info()
