"""``ControlTableResource``: controltable's slots, event batches and work lists as a Dagster resource.

Dagster's own concurrency pools live in one instance's storage and take one pool per op; a
cancelled run keeps its slots unless run monitoring frees them. This resource keeps the
coordination state in control tables in a database the user chooses, so Dagster instances,
Airflow deployments and shell jobs that share it also share the limits, and every slot is a
lease that expires if its holder dies.

Errors are turned into :class:`dagster.Failure` at the step that hit them, with a description
naming the fix, instead of a traceback from deep inside SQLAlchemy.

This module holds the resource's configuration and lifecycle; the rest lives beside it: the
step's identity (:mod:`.step`), failure translation (:mod:`.failures`), waiting for slots
(:mod:`.waiting`), withdrawing a cancelled run's requests (:mod:`.run_watch`, :mod:`.retry_watch`),
run config (:mod:`.run_config`) and text (:mod:`.text`). Their public names are re-exported here.
"""

import logging
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar, Union

from dagster import (
    ConfigurableResource,
    Failure,
    InitResourceContext,
    MetadataValue,
    RetryRequested,
)
from pydantic import Field, PrivateAttr

from controltable import (
    ConfigurationError,
    ControlTable,
    ControlTableError,
    Lease,
    LeaseLost,
    LeaseLostInterrupt,
    NotInstalledError,
    ResourceStatus,
)
from controltable.errors import safe_url
from controltable.waiting_text import jsonable, names, names_list

from . import defaults, waiting
from .defaults import DEFAULT_LEASE, DEFAULT_MODE, DEFAULT_WAITER_TTL, INTERRUPT_ON_LEASE_LOSS
from .failures import as_failure
from .run_config import keep_defined_fields, namespace_override_note
from .run_status import RUN_ENDED_BADLY
from .run_watch import RunRequests, watch_from_outside
from .step import StepIdentity, add_output_metadata, current_step, run_holder_prefix
from .waiting import DEFAULT_MAX_RETRIES, DEFAULT_RETRY_INTERVAL, WAIT_MODES, head_retry_interval, retry_waiter_ttl

try:  # only for type hints: these classes are reached through ControlTable.events()/worklist()
    from controltable.events import Batch, EventTable
    from controltable.worklist import Item, WorkList
except ImportError:  # pragma: no cover - a core without these modules cannot work anyway
    Batch = EventTable = Item = WorkList = Any  # type: ignore[misc,assignment]

__all__ = [  # the names this module always offered (re-exported from where they live now)
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_RETRY_INTERVAL",
    "RUN_ENDED_BADLY",
    "WAIT_MODES",
    "ControlTableResource",
    "StepIdentity",
    "as_failure",
    "batch_metadata",
    "current_step",
    "head_retry_interval",
    "keep_defined_fields",
    "namespace_override_note",
    "retry_waiter_ttl",
    "run_holder_prefix",
]

log = logging.getLogger("dagster_controltable")

T = TypeVar("T")


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

    # Not required in Dagster's config schema: run config that overrides one field (e.g.
    # interrupt_on_lease_loss) keeps the definitions' url (keep_defined_fields) instead of being
    # refused with "Missing required config entry url". A resource with no url at all fails the
    # step that uses it, naming the fix.
    url: Optional[str] = Field(default=None, description="SQLAlchemy URL of the database holding the control "
                               "tables, e.g. postgresql+psycopg://user@host/db or sqlite:////data/controltable.db "
                               "(required in the definitions; run config may leave it out).")
    namespace: str = Field(default="default", description="Separates deployments sharing one database; "
                                                          "everyone who must share a limit uses the same one.")
    control_schema: Optional[str] = Field(default=None, description="Database schema holding the control tables "
                                                                    "(default: the connection's default schema).")
    default_lease: float = Field(default=DEFAULT_LEASE, description="Seconds a slot lease lasts between renewals; "
                                 "a holder that dies frees its slot after at most this long.")
    prefix: str = Field(default="ct_", description="Name prefix of the control tables.")
    connect_timeout: Optional[float] = Field(
        default=None, description="Seconds to wait for a connection to the control-table database before the "
                                  "step fails (default: the core's). A hung server fails the step within it.")
    statement_timeout: Optional[float] = Field(
        default=None, description="Seconds one control-table statement may run before it is cancelled "
                                  "(default: the core's).")
    listen_url: Optional[str] = Field(
        default=None, description="PostgreSQL behind a connection pooler in transaction mode (PgBouncer, RDS "
                                  "Proxy): a direct URL of the server for push wake-ups only; work still uses url. "
                                  "Default: CONTROLTABLE_LISTEN_URL.")
    interrupt_on_lease_loss: bool = Field(
        default=INTERRUPT_ON_LEASE_LOSS, description="Stop a step's work (LeaseLostInterrupt, failing the step) when "
        "the lease it holds (slot, event batch, work item) is found lost or expired, instead of letting it overlap "
        "the next holder. False lets the work run on; it then fails at the release or completion.")

    _ct: Optional[ControlTable] = PrivateAttr(default=None)
    _setup_error: Optional[BaseException] = PrivateAttr(default=None)
    _checked: bool = PrivateAttr(default=False)
    _events: dict[tuple[Any, ...], EventTable] = PrivateAttr(default_factory=dict)
    # Every request this process made and has not released: what teardown (or the watcher
    # between retries) withdraws when the run was cancelled or failed.
    _requests: RunRequests = PrivateAttr(default_factory=RunRequests)
    _run_id: Optional[str] = PrivateAttr(default=None)
    _instance: Any = PrivateAttr(default=None)
    _log: Any = PrivateAttr(default=None)
    _namespace_note: Optional[str] = PrivateAttr(default=None)

    # -- lifecycle -----------------------------------------------------------------------------
    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Create the engine once for this process; a bad URL is reported at the step that uses it.

        Nothing connects here: resource initialisation errors are reported by Dagster away from
        the step, while a ``Failure`` raised by the step names the op and the fix. A namespace
        that run config would reset is kept (see :func:`keep_defined_fields`); one that could not be
        kept is warned about once, in the log of the first step that uses the resource.
        """
        self._run_id = context.run_id
        self._instance = context.instance
        self._log = context.log
        kept = keep_defined_fields(self, context)
        if kept and context.log is not None:
            context.log.info(
                f"controltable: run config configures this resource without {', '.join(kept)}: kept the code "
                "location's values (Dagster would have reset them to their defaults)")
        self._namespace_note = namespace_override_note(self.namespace, context)
        self._open()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Withdraw this process's queue places and slots if the run was cancelled or failed; dispose the engine.

        With the in-process executor this process ran every step of the run, so a step waiting
        between retries (``wait="retry"``) leaves the queue the moment the run is cancelled. A
        step process of the multiprocess executor withdraws only its own requests; the
        :func:`controltable_run_cleanup_sensor` covers the rest.
        """
        try:
            self.withdraw_if_run_ended(context.instance)
        finally:
            self.close()

    def withdraw_if_run_ended(self, instance: Any, *, retries: int = 0, when: str = "at teardown") -> int:
        """Withdraw this process's requests when the run is canceling, canceled or failed; returns how many.

        ``retries``: read the status again (every 0.1 s) while it does not say so yet, for a
        caller that knows a termination is on its way (an interrupt arrived).
        """
        return self._requests.withdraw_if_run_ended(self._ct, instance, self._run_id, self._log, retries=retries,
                                                    when=when)

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
            self._ct = ControlTable(self._url(), namespace=self.namespace, schema=self.control_schema,
                                    prefix=self.prefix, listen_url=self.listen_url, **self._timeouts())
            self._setup_error = None
        except (ControlTableError, ImportError) as exc:
            self._setup_error = exc

    def _url(self) -> str:
        """``url``, or the error naming where to give it (neither the definitions nor the run config did)."""
        if not self.url:
            raise ConfigurationError(
                "ControlTableResource has no url: give it in the definitions, e.g. "
                "ControlTableResource(url=EnvVar('CONTROLTABLE_URL')), or in the run config")
        return self.url

    def _timeouts(self) -> dict[str, Any]:
        """The timeouts given in the config (the core's defaults apply to the others)."""
        given = {"connect_timeout": self.connect_timeout, "statement_timeout": self.statement_timeout}
        return {k: float(v) for k, v in given.items() if v is not None}

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages."""
        return safe_url(self._ct.engine.url if self._ct is not None else self.url)

    def failure(self, exc: BaseException, action: str) -> Failure:
        """The ``Failure`` for ``exc`` hit while doing ``action``, naming this control table and the fix.

        For ops and sensors built on the resource that call the core directly and want the
        same messages as the resource's own methods.
        """
        return as_failure(exc, action, url=self.safe_url, namespace=self.namespace)

    _fail = failure  # the name used inside this module

    def _call(self, action: str, fn: Callable[[], T]) -> T:
        """Run one core call, translating its errors into a ``Failure`` naming ``action``."""
        try:
            return fn()
        except ControlTableError as exc:
            raise self._fail(exc, action) from exc

    @property
    def control_table(self) -> ControlTable:
        """The core :class:`ControlTable` (connected and checked) for anything not mirrored here."""
        self._open()
        if self._setup_error is not None:
            raise self._fail(self._setup_error, "opening the control table")
        assert self._ct is not None
        if self._namespace_note is not None:
            step = current_step()
            if step.run_id is not None:
                step.log.warning(self._namespace_note)
                self._namespace_note = None
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
        mode: str = DEFAULT_MODE,
        timeout: Optional[float] = None,
        lease: Optional[float] = None,
        waiter_ttl: float = DEFAULT_WAITER_TTL,
    ) -> Lease:
        """Wait (FIFO) for slots and return the :class:`Lease`; release it yourself (or use ``with``).

        Prefer :meth:`slot`, which also renews the lease. ``holder`` defaults to the step's
        identity, so a retried step re-acquiring gets the lease it already has (with a higher
        fencing token: the step's retry number is passed as the attempt).
        """
        ct = self.control_table
        step = current_step()
        who = holder or step.holder
        label = names(resource)
        self._requests.track(resource, who)
        try:
            return ct.acquire(resource, holder=who, slots=slots, mode=mode, timeout=timeout,
                              lease=lease or self.default_lease, waiter_ttl=waiter_ttl, attempt=step.attempt)
        except ControlTableError as exc:
            raise self._fail(exc, f"acquiring {label}") from exc
        except BaseException:  # interrupted (run cancelled) while queued: give the place up now
            if who is not None:
                self._requests.withdraw(ct, resource, who)
            raise

    def release(self, resource: str, holder: Optional[str] = None) -> int:
        """Release (or withdraw) what ``holder`` (default: this step) has on ``resource``."""
        ct = self.control_table
        who = holder or self.default_holder()
        if who is None:
            raise Failure(description="release() outside a step needs an explicit holder=")
        self._requests.forget(resource, who)
        return self._call(f"releasing {resource!r}", lambda: ct.release(resource, who))

    def release_run(self, run_id: str, *, namespace: Optional[str] = None) -> int:
        """Withdraw every slot held and queue place taken by the steps of run ``run_id``; returns how many.

        Matches holder ids ``dagster:<run id>:*`` (the steps' default holders) in this resource's
        namespace (or ``namespace``, e.g. one the run's config gave), and grants whoever can then
        run. What the cleanup sensor calls for a run that was cancelled or failed; idempotent.
        Never call it for a run that is still running: its steps would lose their slots.
        """
        action = f"withdrawing the requests of run {run_id}"
        if namespace is None or namespace == self.namespace:
            ct = self.control_table
            return self._call(action, lambda: ct.release_holders(run_holder_prefix(run_id)))
        try:
            with ControlTable(self._url(), namespace=namespace, schema=self.control_schema, prefix=self.prefix,
                              **self._timeouts()) as other:
                return other.release_holders(run_holder_prefix(run_id))
        except ControlTableError as exc:
            raise as_failure(exc, action, url=self.safe_url, namespace=namespace) from exc

    @contextmanager
    def slot(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str] = None,
        slots: int = 1,
        mode: str = DEFAULT_MODE,
        timeout: Optional[float] = None,
        lease: Optional[float] = None,
        waiter_ttl: Optional[float] = None,
        wait: str = "block",
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
        max_retries: int = DEFAULT_MAX_RETRIES,
        priority: int = 0,
        priority_from_tag: bool = False,
        interrupt: Optional[bool] = None,
    ) -> Iterator[Lease]:
        """Hold slots of ``resource`` for the ``with`` block, renewing the lease in the background.

        ``wait="block"`` (default) waits inside the step in FIFO order (``timeout`` seconds, or
        forever). ``wait="retry"`` polls once and, if the slot is busy, raises
        :class:`dagster.RetryRequested` so the step gives back its worker and Dagster resources
        while it waits; the queue place is kept between retries because the holder (run id +
        step key) is the same on every retry, for ``waiter_ttl`` seconds (default: the retry
        interval plus 30 s, see :func:`retry_waiter_ttl`). A step at the head of the queue is
        retried sooner (:func:`head_retry_interval`) and a grant made for it waits for it for a
        whole ``retry_interval``; further back, a grant waits only the core's short pickup time,
        so an absent waiter never idles the slot for long. After ``max_retries`` the step fails
        and leaves the queue.

        The slot is released when the block exits, also when it raises; a cancelled or failed
        run's requests are withdrawn by the resource's teardown and
        :func:`controltable_run_cleanup_sensor`; if the run is killed, the lease expires after
        ``lease`` seconds. A lease lost while the block ran fails the step (the work may have
        overlapped with another holder). Each retry of the step gets a higher fencing token.
        The wait (seconds, queue position, who was ahead) goes to the step log and, for ops and
        assets with one output, into its output metadata.

        ``priority`` orders the queue (higher first, equal ones FIFO); ``priority_from_tag=True``
        takes it from the ``dagster/priority`` tags instead (the run's plus the op's, as Dagster's
        own pools weigh them).

        When the background renewal finds the lease lost or expired (released from outside, reaped,
        renewals failing for a whole lease), the block is interrupted with
        :class:`~controltable.LeaseLostInterrupt` and the step fails naming the lease loss, so the
        work stops instead of overlapping the next holder (see docs/faults.md, "Lease loss
        interrupts the work"). ``interrupt=False`` (default: the resource's
        ``interrupt_on_lease_loss``) lets it run on; the step then fails at the release.
        """
        if wait not in WAIT_MODES:
            raise Failure(description=f"slot(wait={wait!r}) must be one of {', '.join(WAIT_MODES)}")
        self._requests.try_starts()  # a try is running: the between-retries watcher stands down
        ct = self.control_table
        step = current_step()
        who = holder or step.holder
        label = names(resource)
        lease_s = lease or self.default_lease
        prio = step.tag_priority() if priority_from_tag else priority
        if wait == "retry":
            granted, wait_s, position = waiting.try_or_retry(
                ct, resource, who, step, self._requests, self._fail, slots=slots, mode=mode, lease=lease_s,
                waiter_ttl=waiter_ttl, retry_interval=retry_interval, max_retries=max_retries, priority=prio,
                before_retry=lambda seconds, pickup: self._before_retry(step, resource, str(who), seconds, pickup))
        else:
            granted, wait_s, position = waiting.block(
                ct, resource, who, step, self._requests, self._fail, slots=slots, mode=mode, timeout=timeout,
                lease=lease_s, waiter_ttl=waiter_ttl if waiter_ttl is not None else DEFAULT_WAITER_TTL, priority=prio)
        if position:
            # The wait as its own event, closing the "waiting for ..." line: Dagster draws the whole
            # step, wait included, as one bar in the run's Gantt chart (it has no step state for
            # waiting on something outside it), so the event log is where the wait shows apart.
            step.log.info(f"controltable: granted {label} after waiting {wait_s:.1f} s from queue position {position}")
        step.log.info(
            f"controltable: holding {label} ({mode}, {slots} slot(s)) as {granted.holder!r}, fencing token "
            f"{granted.token}" + ("" if position else f" (granted at once, {wait_s:.1f} s)")
        )
        add_output_metadata(step, {
            "controltable/wait_seconds": MetadataValue.float(round(wait_s, 3)),
            "controltable/queue_position": MetadataValue.int(position or 0),
            "controltable/token": MetadataValue.int(int(granted.token)),
            "controltable/holder": MetadataValue.text(granted.holder),
            f"controltable/slot/{'+'.join(names_list(resource))}": MetadataValue.json({
                "resources": dict(granted.resources), "mode": granted.mode, "tokens": dict(granted.tokens),
                "holder": granted.holder, "wait_seconds": round(wait_s, 3), "queue_position": position or 0,
                "attempt": step.attempt, "namespace": self.namespace}),
        })
        # In a step process of the multiprocess executor the run worker is the parent: if it is
        # killed, nobody will finish the run, so renewal stops and the lease runs out.
        granted.start_renewing(stop_when_orphaned=step.own_process)
        try:
            with granted.interrupting(self._interrupt(interrupt)):
                yield granted
        except LeaseLostInterrupt as exc:  # the lease went away under the work: stopped, now report it
            try:
                granted.__exit__(*_exc_info())  # stops renewing and releases what may still be ours
            except Exception as rel_exc:
                log.warning("controltable: could not release %s after the lease was lost: %s", label, rel_exc)
            raise self._fail(exc, f"holding {label}") from exc
        except BaseException:
            try:
                granted.__exit__(*_exc_info())  # releases; a lost lease is only logged, the block's error wins
            except Exception as exc:  # e.g. the database went away: the lease expires on its own
                log.warning("controltable: could not release %s after an error in the block: %s", label, exc)
            raise
        finally:
            self._requests.untrack(resource, granted.holder)
        try:
            granted.__exit__(None, None, None)
        except LeaseLost as exc:
            raise self._fail(exc, f"holding {label}") from exc
        except ControlTableError as exc:
            raise self._fail(exc, f"releasing {label}") from exc
        step.log.info(f"controltable: released {label}")

    def _interrupt(self, interrupt: Optional[bool]) -> bool:
        """Whether a lease loss interrupts the work: the call's ``interrupt``, else the resource's setting."""
        return self.interrupt_on_lease_loss if interrupt is None else bool(interrupt)

    def _before_retry(self, step: StepIdentity, resource: Union[str, Mapping[str, int]], who: str, seconds: float,
                      pickup: Optional[float]) -> None:
        """A retry-mode step is about to raise ``RetryRequested``: have its queue place watched until the next try.

        In the run worker (in-process executor) a thread of this process watches; a step process of
        the multiprocess executor ends now, so a detached watcher does (:mod:`.retry_watch`).
        """
        if not step.own_process:
            instance = self._instance
            self._requests.retry_wait_begins(
                None if instance is None else
                lambda retries, when: self.withdraw_if_run_ended(instance, retries=retries, when=when),
                lambda: self._ct is not None, self._run_id)
        else:
            control = {"url": self.url, "namespace": self.namespace, "schema": self.control_schema,
                       "prefix": self.prefix}
            watch_from_outside(self._instance, self._run_id, control, who, names(resource), names_list(resource),
                               seconds, pickup)

    # -- events ------------------------------------------------------------------------------------
    def events(
        self,
        table: str,
        *,
        key: str,
        order_by: Optional[str] = None,
        table_schema: Optional[str] = None,
        prepare: bool = False,
        **options: Any,
    ) -> EventTable:
        """Batch claiming on the user's table ``table`` (core ``ControlTable.events``), checked now.

        The table is reflected here so that a missing table, a missing key column or missing
        claim columns fail the step with the fix rather than at the first claim. ``prepare=True``
        adds missing claim columns and the claim index first (idempotent; needs DDL rights).
        ``table_schema`` is the event table's schema (the resource's ``control_schema`` is the
        control tables'). ``options`` go to the core
        (``max_attempts``, ``backoff``, ``lease``, ``time_column``, ``where``...).
        """
        ct = self.control_table
        try:  # reuse the reflected table within this process (e.g. one claim per batch of a drain)
            cache_key: Optional[tuple[Any, ...]] = (table, key, order_by, table_schema,
                                                 tuple(sorted(options.items())))
            hash(cache_key)
        except TypeError:  # e.g. a where= expression
            cache_key = None
        if cache_key is not None and not prepare and cache_key in self._events:
            return self._events[cache_key]
        action = f"opening event table {table!r}"
        events = self._call(action, lambda: ct.events(table, key=key, order_by=order_by, table_schema=table_schema,
                                                      **options))
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
        size: int = defaults.BATCH_SIZE,
        order_by: Optional[str] = None,
        table_schema: Optional[str] = None,
        owner: Optional[str] = None,
        lease: Optional[float] = None,
        interrupt: Optional[bool] = None,
        **options: Any,
    ) -> Iterator[Optional[Batch]]:
        """Claim one batch for the ``with`` block and finish it: complete on success, fail on error.

        Yields ``None`` when nothing is claimable. Completion is fenced on the batch token: if the
        claim expired and another worker took rows over, the step fails naming them and nothing
        is completed. An exception in the block gives the rows back for a retry after the
        table's back-off (counting an attempt); a cancelled run gives them back untouched.
        If the block already finished the batch (e.g. with ``batch.transaction()``), that stands.
        ``table_schema`` is the event table's schema.

        The batch's lease is renewed in the background while the block runs (``batch.renewing()``);
        if it is found lost or expired, the block is interrupted with
        :class:`~controltable.LeaseLostInterrupt` and the step fails naming the lease loss, without
        touching the rows another worker may hold now. ``interrupt=False`` (default: the
        resource's ``interrupt_on_lease_loss``) lets the block run on; the fenced completion then fails.
        """
        events = self.events(table, key=key, order_by=order_by, table_schema=table_schema, **options)
        who = owner or self.default_holder()
        batch = self._call(f"claiming from {table!r}", lambda: events.claim(size, owner=who, lease=lease))
        if batch is None:
            yield None
            return
        step = current_step()
        step.log.info(f"controltable: claimed {len(batch)} event(s) of {table!r} under token {batch.token}")
        try:
            with batch.renewing(stop_when_orphaned=step.own_process, interrupt=self._interrupt(interrupt)):
                yield batch
        except RetryRequested:
            if not batch.finished:  # a retry is not a failed attempt: give the rows back untouched
                self._call(f"releasing batch {batch.token}", batch.release)
            raise
        except Exception as exc:
            if batch.lost is not None:  # the renewer found the claim lost or expired: the rows may be
                if isinstance(exc, LeaseLost):  # another worker's now, so they are left alone
                    raise self._fail(exc, f"processing batch {batch.token} of {table!r}") from exc
                raise
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


def batch_metadata(batch: Batch, *, max_keys: int = defaults.MAX_METADATA_KEYS) -> dict[str, MetadataValue]:
    """Dagster metadata for a claimed batch: table, token, count and (up to ``max_keys``) keys."""
    keys = [jsonable(k) for k in batch.keys]
    return {
        "controltable/table": MetadataValue.text(batch.events.qualified_name),
        "controltable/token": MetadataValue.int(int(batch.token)),
        "controltable/events": MetadataValue.int(len(keys)),
        "controltable/keys": MetadataValue.json({"keys": keys[:max_keys], "truncated": len(keys) > max_keys}),
        "controltable/owner": MetadataValue.text(batch.owner),
    }


def _exc_info() -> Any:
    return sys.exc_info()
