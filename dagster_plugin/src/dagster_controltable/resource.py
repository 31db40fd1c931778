"""``ControlTableResource``: controltable's slots, event batches and work lists as a Dagster resource.

Dagster's own concurrency pools live in one instance's storage and take one pool per op; a
cancelled run keeps its slots unless run monitoring frees them. This resource keeps the
coordination state in control tables in a database the user chooses, so Dagster instances,
Airflow deployments and shell jobs that share it also share the limits, and every slot is a
lease that expires if its holder dies.

Errors are turned into :class:`dagster.Failure` at the step that hit them, with a description
naming the fix, instead of a traceback from deep inside SQLAlchemy.
"""

import logging
import math
import os
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar, Union

from dagster import (
    ConfigurableResource,
    DagsterInvariantViolationError,
    DagsterRunStatus,
    Failure,
    InitResourceContext,
    MetadataValue,
    OpExecutionContext,
    RetryRequested,
)
from pydantic import Field, PrivateAttr, TypeAdapter, model_validator

from controltable import (
    AcquireTimeout,
    AuthenticationError,
    ConfigurationError,
    ControlTable,
    ControlTableError,
    DatabaseBusyError,
    DatabaseMissingError,
    DatabaseUnavailableError,
    Lease,
    LeaseLost,
    LeaseLostInterrupt,
    NotInstalledError,
    PermissionDeniedError,
    ResourceStatus,
    StatementTimeoutError,
    UnknownResourceError,
)
from controltable.compat import renamed
from controltable.defaults import MAX_PRIORITY, MIN_PRIORITY
from controltable.errors import is_retryable, safe_url
from controltable.holders import holder_id

from . import defaults, retry_watch
from .defaults import DEFAULT_LEASE, DEFAULT_MODE, DEFAULT_WAITER_TTL, INTERRUPT_ON_LEASE_LOSS

try:  # only for type hints: these classes are reached through ControlTable.events()/worklist()
    from controltable.events import Batch, EventTable
    from controltable.worklist import Item, WorkList
except ImportError:  # pragma: no cover - a core without these modules cannot work anyway
    Batch = EventTable = Item = WorkList = Any  # type: ignore[misc,assignment]

log = logging.getLogger("dagster_controltable")

T = TypeVar("T")

WAIT_MODES = ("block", "retry")
#: ``slot(wait="retry")``: seconds between a busy step's retries, and how many retries before it fails
#: (kept under these names for existing imports; the values live in :mod:`.defaults`).
DEFAULT_RETRY_INTERVAL = defaults.RETRY_INTERVAL
DEFAULT_MAX_RETRIES = defaults.MAX_RETRIES
#: A run in one of these states will never pick up a grant: its requests can be withdrawn.
RUN_ENDED_BADLY = frozenset({DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE})


class StepIdentity:
    """Who is asking, as far as Dagster tells: run id, step key, retry number and a logger."""

    def __init__(self, run_id: Optional[str], step_key: Optional[str], retry_number: int, logger: Any,
                 context: Any = None, *, own_process: bool = False) -> None:
        self.run_id = run_id
        self.step_key = step_key
        self.retry_number = retry_number
        self.log = logger
        self.context = context
        #: The step runs in a process of its own that the run's orchestrator started (multiprocess
        #: executor, step launchers): the process lives only for this try of the step, and its
        #: parent is the run worker. False in the run worker itself (in-process executor).
        self.own_process = own_process

    def tag_priority(self) -> int:
        """The ``dagster/priority`` tags as Dagster's own pools weigh them: the run's plus the step's.

        Unset or not a whole number counts as 0 (as in Dagster); clamped to the core's range.
        """
        if self.context is None:
            return 0
        total = 0
        sources: list[Any] = []
        try:
            sources.append(self.context.run.tags)
        except Exception:  # pragma: no cover - no run (direct invocation)
            pass
        try:
            sources.append(self.context.get_step_execution_context().step.tags or {})
        except Exception:  # pragma: no cover - framework-author API
            pass
        for tags in sources:
            try:
                total += int(tags.get("dagster/priority", 0))
            except (TypeError, ValueError):
                continue
        return max(MIN_PRIORITY, min(MAX_PRIORITY, total))

    @property
    def attempt(self) -> Optional[int]:
        """The step's attempt (retry number + 1), passed to the core so a retry gets a higher fencing token.

        ``None`` outside a step: the core then treats every request of a holder as the same attempt.
        """
        return self.retry_number + 1 if self.run_id is not None else None

    @property
    def run_prefix(self) -> Optional[str]:
        """``dagster:<run id>:``: the start of every holder id of this run's steps."""
        return run_holder_prefix(self.run_id) if self.run_id is not None else None

    @property
    def holder(self) -> Optional[str]:
        """``dagster:<run id>:<step key>``: stable across retries of the step, unique across steps.

        Stability across retries is what lets a step that raised ``RetryRequested`` keep its
        place in the FIFO queue; uniqueness keeps two steps from sharing one lease.
        Built by the core's :func:`~controltable.holders.holder_id`: a step key too long for a
        holder id is shortened with a hash of the whole id rather than cut, so two long step keys
        never share one lease, and the run prefix is kept for :meth:`ControlTableResource.release_run`.
        """
        if self.run_id is None:
            return None
        return holder_id("dagster", self.run_id, self.step_key or "run")


def run_holder_prefix(run_id: str) -> str:
    """The prefix every holder id of run ``run_id`` starts with (what withdrawing a whole run matches)."""
    return holder_id("dagster", run_id, "")


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
        step_context = ctx.get_step_execution_context()
        step_key: Optional[str] = step_context.step.key
        # An orchestrator in another process handles this step's retries ("deferred"): the step
        # runs in a process of its own (the multiprocess executor's child, a step launcher's pod).
        own_process = bool(step_context.retry_mode.deferred)
    except Exception:  # pragma: no cover - framework-author API; fall back to the op name
        step_key, own_process = ctx.op.name, False
    return StepIdentity(ctx.run_id, step_key, int(ctx.retry_number), ctx.log, ctx, own_process=own_process)


def as_failure(exc: BaseException, action: str, *, url: str = "", namespace: str = "") -> Failure:
    """Turn a controltable error (every database failure reaches the integration as one) into a ``Failure``
    that says what to change.

    Whether Dagster may retry the step is the core's :func:`~controltable.errors.is_retryable`,
    the policy the Airflow provider follows too: connection problems, busy databases, slots not
    granted in time and lost leases allow retries; logins, missing tables, privileges and
    configuration do not, because retrying cannot fix them.
    """
    where = f" (control table at {url}, namespace {namespace!r})" if url else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, AuthenticationError):
        fix = ("check the user and password in the `url` of ControlTableResource (e.g. EnvVar('CONTROLTABLE_URL')); "
               "the database refused the login, so retrying cannot help")
        kind = "control-table login failed (authentication)"
    elif isinstance(exc, DatabaseMissingError):
        fix = ("create the database (or fix its name in the `url` of ControlTableResource), then create the control "
               "tables once with `controltable init --url ...`")
        kind = "control-table database missing"
    elif isinstance(exc, StatementTimeoutError):
        fix = ("a statement ran past statement_timeout: look for long locks on the control tables, or raise "
               "`statement_timeout` of ControlTableResource")
        kind = "control-table statement timed out"
    elif isinstance(exc, DatabaseBusyError):
        fix = "the database kept rolling back on locks; the step may be retried"
        kind = "control-table database busy"
    elif isinstance(exc, PermissionDeniedError):
        fix = "grant the database user the privileges named above on the control tables (or event table)"
        kind = "permission denied on the control tables"
    elif isinstance(exc, DatabaseUnavailableError):
        fix = ("check the `url` of ControlTableResource (e.g. EnvVar('CONTROLTABLE_URL')) and that the database "
               "server is running and reachable from this process; `connect_timeout` bounds the wait")
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
        kind = "slot not granted in time"
    elif isinstance(exc, LeaseLostInterrupt):
        fix = ("the slot, batch or work item was lost or expired while the step worked, so its work was stopped "
               "before it could overlap the next holder; the step may be retried (with a new fencing token). Ask "
               "for a longer lease if renewals are slow, or set interrupt_on_lease_loss=False to let work run on")
        kind = "lease lost, work interrupted"
    elif isinstance(exc, LeaseLost):
        fix = ("the lease expired before it was renewed or completed; ask for a longer lease, and make the "
               "protected system reject stale fencing tokens")
        kind = "lease lost"
    elif isinstance(exc, ConfigurationError):
        fix = "fix the argument or configuration named above"
        kind = "controltable configuration error"
    elif isinstance(exc, ControlTableError):
        fix = "see the message above"
        kind = "controltable error"
    else:
        fix = "see the chained exception"
        kind = type(exc).__name__
    return Failure(
        description=f"{kind} while {action}{where}: {first}. Fix: {fix}.",
        metadata={"error": MetadataValue.text(f"{type(exc).__name__}: {first}"),
                  "control_table": MetadataValue.text(url or "?")},
        allow_retries=is_retryable(exc),
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
    control_schema: Optional[str] = Field(default=None, description="Database schema holding the control tables "
                                                                    "(default: the connection's default schema).")
    schema_: Optional[str] = Field(default=None, alias="schema",
                                   description="Deprecated old name of control_schema (it named the control "
                                               "tables' schema, never an event table's).")
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
    # (resource name, holder) of every request this process made and has not released: what
    # teardown withdraws when the run was cancelled or failed.
    _entries: dict[tuple[str, str], None] = PrivateAttr(default_factory=dict)
    _run_id: Optional[str] = PrivateAttr(default=None)
    _instance: Any = PrivateAttr(default=None)
    _log: Any = PrivateAttr(default=None)
    _watcher: Optional[threading.Thread] = PrivateAttr(default=None)
    _watch_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _between_retries: bool = PrivateAttr(default=False)
    _namespace_note: Optional[str] = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _renamed_schema(self) -> "ControlTableResource":
        """``schema`` is the deprecated name of ``control_schema``: the same vocabulary as the Airflow provider."""
        if self.schema_ is not None:
            if self.control_schema is not None:
                raise ValueError("give control_schema only (schema is its deprecated old name)")
            warnings.warn("ControlTableResource: schema is deprecated, use control_schema (same meaning)",
                          DeprecationWarning, stacklevel=2)
        return self

    @property
    def control_tables_schema(self) -> Optional[str]:
        """The schema of the control tables: ``control_schema``, or the deprecated ``schema``."""
        return self.control_schema if self.control_schema is not None else self.schema_

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
        if not self._entries or self._run_id is None or self._ct is None or instance is None:
            return 0
        for attempt in range(retries + 1):
            try:
                run = instance.get_run_by_id(self._run_id)
            except Exception as exc:  # no status: leave the entries to the sensor or their TTL
                log.warning("controltable: could not read the status of run %s: %s", self._run_id, exc)
                return 0
            if run is not None and run.status in RUN_ENDED_BADLY:
                break
            if attempt < retries:
                time.sleep(defaults.WATCH_TICK)
        else:
            return 0
        withdrawn = 0
        for name, who in list(self._entries):
            try:
                withdrawn += self._ct.release(name, who)
            except Exception as exc:  # best effort: the sensor or the TTL removes it otherwise
                log.warning("controltable: could not withdraw %s from %r: %s", who, name, exc)
            self._entries.pop((name, who), None)
        if withdrawn:
            (self._log or log).info(f"controltable: run {self._run_id} is {run.status.value}: withdrew {withdrawn} "
                                    f"slot request(s) {when}")
        return withdrawn

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
            self._ct = ControlTable(self.url, namespace=self.namespace, schema=self.control_tables_schema,
                                    prefix=self.prefix, listen_url=self.listen_url, **self._timeouts())
            self._setup_error = None
        except (ControlTableError, ImportError) as exc:
            self._setup_error = exc

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
        names = _names(resource)
        self._track(resource, who)
        try:
            return ct.acquire(resource, holder=who, slots=slots, mode=mode, timeout=timeout,
                              lease=lease or self.default_lease, waiter_ttl=waiter_ttl, attempt=step.attempt)
        except ControlTableError as exc:
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
        self._entries.pop((resource, who), None)
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
            with ControlTable(self.url, namespace=namespace, schema=self.control_tables_schema, prefix=self.prefix,
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
        with self._watch_lock:  # a try is running: the between-retries watcher stands down
            self._between_retries = False
        ct = self.control_table
        step = current_step()
        who = holder or step.holder
        names = _names(resource)
        lease_s = lease or self.default_lease
        prio = step.tag_priority() if priority_from_tag else priority
        if wait == "retry":
            granted, wait_s, position = self._try_or_retry(
                ct, resource, who, step, slots=slots, mode=mode, lease=lease_s, waiter_ttl=waiter_ttl,
                retry_interval=retry_interval, max_retries=max_retries, priority=prio)
        else:
            granted, wait_s, position = self._block(
                ct, resource, who, step, slots=slots, mode=mode, timeout=timeout, lease=lease_s,
                waiter_ttl=waiter_ttl if waiter_ttl is not None else DEFAULT_WAITER_TTL, priority=prio)
        step.log.info(
            f"controltable: holding {names} ({mode}, {slots} slot(s)) as {granted.holder!r}, fencing token "
            f"{granted.token}, after waiting {wait_s:.1f} s"
            + (f" from queue position {position}" if position else " (granted at once)")
        )
        _add_output_metadata(step, {
            "controltable/wait_seconds": MetadataValue.float(round(wait_s, 3)),
            "controltable/queue_position": MetadataValue.int(position or 0),
            "controltable/token": MetadataValue.int(int(granted.token)),
            "controltable/holder": MetadataValue.text(granted.holder),
            f"controltable/slot/{'+'.join(_names_list(resource))}": MetadataValue.json({
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
                log.warning("controltable: could not release %s after the lease was lost: %s", names, rel_exc)
            raise self._fail(exc, f"holding {names}") from exc
        except BaseException:
            try:
                granted.__exit__(*_exc_info())  # releases; a lost lease is only logged, the block's error wins
            except Exception as exc:  # e.g. the database went away: the lease expires on its own
                log.warning("controltable: could not release %s after an error in the block: %s", names, exc)
            raise
        finally:
            self._untrack(resource, granted.holder)
        try:
            granted.__exit__(None, None, None)
        except LeaseLost as exc:
            raise self._fail(exc, f"holding {names}") from exc
        except ControlTableError as exc:
            raise self._fail(exc, f"releasing {names}") from exc
        step.log.info(f"controltable: released {names}")

    def _interrupt(self, interrupt: Optional[bool]) -> bool:
        """Whether a lease loss interrupts the work: the call's ``interrupt``, else the resource's setting."""
        return self.interrupt_on_lease_loss if interrupt is None else bool(interrupt)

    def _block(
        self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: Optional[str], step: StepIdentity,
        *, slots: int, mode: str, timeout: Optional[float], lease: float, waiter_ttl: float, priority: int = 0,
    ) -> tuple[Lease, float, Optional[int]]:
        names = _names(resource)
        started = time.monotonic()
        position: Optional[int] = None
        self._track(resource, who)
        if who is not None:  # one poll first, to tell the user where they stand before waiting
            first = self._call(f"acquiring {names}", lambda: ct.try_acquire(
                resource, holder=who, slots=slots, mode=mode, lease=lease, waiter_ttl=waiter_ttl,
                attempt=step.attempt, priority=priority))
            if first is not None:
                return first, time.monotonic() - started, None
            position, where = self._where(ct, resource, who)
            step.log.info(f"controltable: waiting for {names}: {where}")
        try:
            granted = ct.acquire(resource, holder=who, slots=slots, mode=mode, timeout=timeout, lease=lease,
                                 waiter_ttl=waiter_ttl, attempt=step.attempt, priority=priority)
        except ControlTableError as exc:
            raise self._fail(exc, f"waiting for {names}") from exc
        except BaseException:  # the run was cancelled while we waited: leave the queue at once
            if who is not None:
                self._withdraw(ct, resource, who)
            raise
        return granted, time.monotonic() - started, position

    def _try_or_retry(
        self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: Optional[str], step: StepIdentity,
        *, slots: int, mode: str, lease: float, waiter_ttl: Optional[float], retry_interval: float,
        max_retries: int, priority: int = 0,
    ) -> tuple[Lease, float, Optional[int]]:
        names = _names(resource)
        if who is None:
            raise Failure(description=(
                f"slot({names}, wait='retry') needs a step identity to keep its queue place across retries; "
                "use it inside an op/asset or pass holder= explicitly"))
        ttl = waiter_ttl if waiter_ttl is not None else retry_waiter_ttl(retry_interval)
        if ttl <= retry_interval:
            raise Failure(description=(
                f"waiter_ttl ({ttl:g} s) must be longer than retry_interval ({retry_interval:g} s), or the queue "
                "place expires between retries"))
        # Where this step stands decides how long a grant made for it may wait: at the head the
        # next retry comes soon and the grant waits a whole retry interval; further back a grant
        # waits only the core's short default, then passes on. A new request is the head if
        # nobody waits yet.
        if step.own_process:  # a try runs: its place is its own again (see retry_watch)
            retry_watch.pause_watcher(who)
        before = self._wait_infos(ct, resource, who)
        at_head = all(i.position <= 1 for i in before) if before else self._nobody_waiting(ct, resource)
        # (never shorter than the core's shortest pickup: a very short retry interval still works)
        pickup = max(retry_interval, defaults.MIN_PICKUP) if at_head else None
        self._track(resource, who)
        granted = self._call(f"acquiring {names}", lambda: ct.try_acquire(
            resource, holder=who, slots=slots, mode=mode, lease=lease, waiter_ttl=ttl, attempt=step.attempt,
            priority=priority, **({"pickup": pickup} if pickup is not None else {})))
        waited = self._waited(ct, before)
        if granted is not None:
            # the position it had at its previous try (0: a grant was waiting for it; it waited all the same)
            return granted, waited, (max(i.position for i in before) or 1) if before else None
        position, where = self._where(ct, resource, who)
        # The budget is time (max_retries whole intervals), not Dagster retries: a step at the
        # head tries more often than once an interval and must not use its budget up faster.
        budget = max_retries * retry_interval
        head = head_retry_interval(retry_interval)
        cap = max_retries * max(1, math.ceil(retry_interval / head))
        if waited >= budget or step.retry_number >= cap:
            self._withdraw(ct, resource, who)
            raise Failure(
                description=(f"{names} was still busy after {waited:.0f} s of retries (max_retries={max_retries} x "
                             f"retry_interval={retry_interval:g} s; {where}); raise max_retries or the capacity, "
                             "or see `controltable status`"),
                allow_retries=False,
            )
        seconds = head if position == 1 else retry_interval
        step.log.info(f"controltable: {names} busy: {where}; retrying the step in {seconds:g} s "
                      f"(retry {step.retry_number + 1}, waited {waited:.1f} s of {budget:g} s), keeping the queue "
                      "place")
        if not step.own_process:
            with self._watch_lock:
                self._between_retries = True
            self._watch_run_between_retries()
        else:
            self._watch_from_outside(who, names, _names_list(resource), seconds, pickup)
        raise RetryRequested(max_retries=cap, seconds_to_wait=seconds)

    def _watch_from_outside(self, who: str, names: str, resources: list[str], seconds: float,
                            pickup: Optional[float]) -> None:
        """This step's process ends now (multiprocess executor): a detached watcher withdraws its
        place if the run is cancelled before the next try (:mod:`dagster_controltable.retry_watch`)."""
        if self._instance is None or self._run_id is None:
            return
        try:
            from dagster._serdes import serialize_value

            settings = {
                "url": self.url, "namespace": self.namespace, "schema": self.control_tables_schema,
                "prefix": self.prefix, "run_id": self._run_id, "holder": who, "resources": resources,
                "instance_ref": serialize_value(self._instance.get_ref()),
            }
            until = time.time() + seconds + (pickup or 0.0) + retry_watch.WATCH_MARGIN
            retry_watch.ensure_watcher(settings, who, until)
        except Exception as exc:  # the cleanup sensor and the place's TTL remain
            log.warning("controltable: could not start the watcher of %s's place on %s: %s", who, names, exc)

    def _watch_run_between_retries(self) -> None:
        """Withdraw this run's queue places the moment it is cancelled while its steps wait to retry.

        In the run worker (in-process executor) Dagster sleeps through a retry wait and notices a
        cancellation only when the sleep ends. A daemon thread watches meanwhile: Dagster's
        termination arrives as an interrupt this process records, and the run's status is read
        every few seconds in case it arrives another way; on CANCELING/CANCELED/FAILURE the
        thread withdraws what this process asked for. It ends when nothing is left to watch.
        """
        if self._instance is None or (self._watcher is not None and self._watcher.is_alive()):
            return
        self._watcher = threading.Thread(target=self._watch_loop, name="controltable-run-watch", daemon=True)
        self._watcher.start()

    def _watch_loop(self) -> None:
        last_check = time.monotonic()
        while self._between_retries and self._entries and self._ct is not None:
            time.sleep(defaults.WATCH_TICK)
            interrupted = _interrupt_received()
            if not interrupted and time.monotonic() - last_check < defaults.WATCH_STATUS_EVERY:
                continue
            last_check = time.monotonic()
            # Under the lock, and only while no try is running: a step that is trying (or holds)
            # handles its own cancellation, and must never lose a slot it works under.
            with self._watch_lock:
                if not self._between_retries:
                    return
                try:
                    when = "on its termination signal" if interrupted else "between retries"
                    retries = defaults.WATCH_INTERRUPT_RETRIES if interrupted else 0
                    if self.withdraw_if_run_ended(self._instance, retries=retries, when=when):
                        return
                except Exception as exc:  # the teardown and the cleanup sensor remain
                    log.warning("controltable: watching run %s failed: %s", self._run_id, exc)
                    return

    def _wait_infos(self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: str) -> list[Any]:
        """The core's wait information of ``who`` on each resource (empty if it has no entry yet)."""
        infos = []
        for name in _names_list(resource):
            try:
                info = ct.wait_info(name, who)
            except ControlTableError as exc:
                raise self._fail(exc, f"reading the queue of {name!r}") from exc
            if info is not None:
                infos.append(info)
        return infos

    def _nobody_waiting(self, ct: ControlTable, resource: Union[str, Mapping[str, int]]) -> bool:
        try:
            return all(not [w for w in st.waiters if not w.expired] for st in ct.status(_names_list(resource)))
        except ControlTableError as exc:
            raise self._fail(exc, f"reading the queue of {_names(resource)}") from exc

    def _waited(self, ct: ControlTable, infos: list[Any]) -> float:
        """Seconds since the earliest ``waiting_since`` among ``infos`` on the database clock (0 if none)."""
        since = [i.waiting_since for i in infos if getattr(i, "waiting_since", None) is not None]
        if not since:
            return 0.0
        try:
            now = ct.now()
        except ControlTableError:
            return 0.0
        return max(0.0, now - min(_timestamp(t) for t in since))

    def _where(self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: str) -> tuple[Optional[int], str]:
        """(queue position, "position 3 behind dagster:<run>:load and airflow:<dag>:<run>; 'r' 1/1 used")."""
        try:
            infos = {name: ct.wait_info(name, who) for name in _names_list(resource)}
        except Exception as exc:  # the position is only for the log line and metadata
            return None, f"position unavailable ({exc})"
        parts = []
        worst: Optional[int] = None
        for name, info in infos.items():
            if info is None:
                parts.append(f"{name!r}: not queued")
                continue
            if info.state == "granted":
                parts.append(f"{name!r}: granted, waiting for pickup")
                continue
            worst = info.position if worst is None else max(worst, info.position)
            parts.append(f"{name!r}: position {info.position} behind {_ahead_text(list(info.ahead))}")
        return worst, "; ".join(parts) + f" ({self._describe_queue(ct, resource)})"

    def _track(self, resource: Union[str, Mapping[str, int]], who: Optional[str]) -> None:
        if who is not None:
            for name in _names_list(resource):
                self._entries[(name, who)] = None

    def _untrack(self, resource: Union[str, Mapping[str, int]], who: Optional[str]) -> None:
        for name in _names_list(resource):
            self._entries.pop((name, str(who)), None)

    def _withdraw(self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: str) -> None:
        for name in _names_list(resource):
            try:
                ct.release(name, who)
            except Exception as exc:  # best effort: the waiter entry expires on its own anyway
                log.warning("controltable: could not withdraw %s from %r: %s", who, name, exc)
            self._entries.pop((name, who), None)

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
        table_schema: Optional[str] = None,
        prepare: bool = False,
        schema: Optional[str] = None,
        **options: Any,
    ) -> EventTable:
        """Batch claiming on the user's table ``table`` (core ``ControlTable.events``), checked now.

        The table is reflected here so that a missing table, a missing key column or missing
        claim columns fail the step with the fix rather than at the first claim. ``prepare=True``
        adds missing claim columns and the claim index first (idempotent; needs DDL rights).
        ``table_schema`` is the event table's schema (the resource's ``control_schema`` is the
        control tables'); ``schema=`` is its deprecated old name. ``options`` go to the core
        (``max_attempts``, ``backoff``, ``lease``, ``time_column``, ``where``...).
        """
        schema = renamed("ControlTableResource.events", "schema", schema, "table_schema", table_schema)
        ct = self.control_table
        try:  # reuse the reflected table within this process (e.g. one claim per batch of a drain)
            cache_key: Optional[tuple[Any, ...]] = (table, key, order_by, schema, tuple(sorted(options.items())))
            hash(cache_key)
        except TypeError:  # e.g. a where= expression
            cache_key = None
        if cache_key is not None and not prepare and cache_key in self._events:
            return self._events[cache_key]
        action = f"opening event table {table!r}"
        events = self._call(action, lambda: ct.events(table, key=key, order_by=order_by, table_schema=schema,
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
        schema: Optional[str] = None,
        interrupt: Optional[bool] = None,
        **options: Any,
    ) -> Iterator[Optional[Batch]]:
        """Claim one batch for the ``with`` block and finish it: complete on success, fail on error.

        Yields ``None`` when nothing is claimable. Completion is fenced on the batch token: if the
        claim expired and another worker took rows over, the step fails naming them and nothing
        is completed. An exception in the block gives the rows back for a retry after the
        table's back-off (counting an attempt); a cancelled run gives them back untouched.
        If the block already finished the batch (e.g. with ``batch.transaction()``), that stands.
        ``table_schema`` is the event table's schema (``schema=``: its deprecated old name).

        The batch's lease is renewed in the background while the block runs (``batch.renewing()``);
        if it is found lost or expired, the block is interrupted with
        :class:`~controltable.LeaseLostInterrupt` and the step fails naming the lease loss, without
        touching the rows another worker may hold now. ``interrupt=False`` (default: the
        resource's ``interrupt_on_lease_loss``) lets the block run on; the fenced completion then fails.
        """
        schema = renamed("ControlTableResource.claim_batch", "schema", schema, "table_schema", table_schema)
        events = self.events(table, key=key, order_by=order_by, table_schema=schema, **options)
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
    keys = [_jsonable(k) for k in batch.keys]
    return {
        "controltable/table": MetadataValue.text(batch.events.qualified_name),
        "controltable/token": MetadataValue.int(int(batch.token)),
        "controltable/events": MetadataValue.int(len(keys)),
        "controltable/keys": MetadataValue.json({"keys": keys[:max_keys], "truncated": len(keys) > max_keys}),
        "controltable/owner": MetadataValue.text(batch.owner),
    }


def retry_waiter_ttl(retry_interval: float) -> float:
    """How long a retry-mode step's queue place survives without a retry: one interval plus 30 s.

    The place must outlive the gap between two tries (the interval plus the time Dagster needs
    to start the step again); it need not cover more, because a cancelled or failed run's places
    are withdrawn by the resource's teardown and the cleanup sensor rather than left to expire.
    """
    return retry_interval + defaults.RETRY_WAITER_TTL_MARGIN


def head_retry_interval(retry_interval: float) -> float:
    """The wait before the next try of a retry-mode step at the head of the queue: a tenth, 1 to 5 s.

    The head is next to be granted; retrying it sooner keeps a freed slot from idling for a
    whole retry interval (the grant made for it waits up to ``retry_interval`` for the pickup).
    Not faster than once a second: every try is a step retry in Dagster's event log (and, with
    the multiprocess executor, a new step process).
    """
    return min(retry_interval, max(defaults.HEAD_RETRY_MIN, min(defaults.HEAD_RETRY_MAX, retry_interval / 10.0)))


def _defined_config(context: Any) -> Optional[Mapping[str, Any]]:
    """The resource's configuration as the code location's definitions give it (config keys), if known."""
    try:
        defined = context.resource_def.config_schema.as_field().default_value
    except Exception:  # no definition defaults (a resource built by hand)
        return None
    return defined if isinstance(defined, Mapping) else None


def _run_config_of(context: Any) -> Optional[Mapping[str, Any]]:
    """The keys this run's own run config gives for this resource (None: it does not configure it)."""
    run = getattr(context, "dagster_run", None)
    resources = ((getattr(run, "run_config", None) or {}).get("resources") or {}) if run is not None else {}
    for key, definition in (getattr(context, "all_resource_defs", None) or {}).items():
        if definition is context.resource_def and isinstance(resources.get(key), Mapping):
            config = resources[key].get("config")
            return config if isinstance(config, Mapping) else None
    return None


def keep_defined_fields(resource: "ControlTableResource", context: Any) -> list[str]:
    """Give back the definitions' values of the fields this run's run config leaves out; returns their keys.

    Dagster replaces a Pythonic resource's whole configuration when run config names the resource,
    so run config giving only ``url`` (the usual override) would reset ``namespace``, ``prefix``,
    the schema and the timeouts to their defaults: the run would queue in another namespace and
    share no limit with the rest. Fields the run config does give win; an ``EnvVar`` in the
    definitions is read from this process's environment (left at the default when unset).
    """
    defined, given = _defined_config(context), _run_config_of(context)
    if defined is None or not given:
        return []
    kept = []
    for name, field in type(resource).model_fields.items():
        key = field.alias or name
        if key in given or key not in defined:
            continue
        value = defined[key]
        if isinstance(value, Mapping) and "env" in value:  # EnvVar("NAME") in the definitions
            value = os.environ.get(str(value["env"]))
            if value is None:
                continue
            value = TypeAdapter(field.annotation or Any).validate_python(value)  # "30" -> 30.0 for a float
        if value != getattr(resource, name):
            # The run's copy of the resource, before anything reads it (pydantic keeps fields in
            # __dict__; the model is frozen against callers, not against this repair).
            object.__setattr__(resource, name, value)
            kept.append(key)
    return kept


def namespace_override_note(namespace: str, context: Any) -> Optional[str]:
    """A warning if this run's namespace differs from the one the code location's definitions give
    although the run config did not choose it (one :func:`keep_defined_fields` could not keep: an
    ``EnvVar`` unset in this process, a run config Dagster does not show the resource)."""
    defined = _defined_config(context)
    if defined is None:
        return None
    given = _run_config_of(context)
    if given is not None and "namespace" in given:
        return None  # the run config chose this namespace itself
    value = defined.get("namespace", "default")
    if isinstance(value, Mapping) and "env" in value:  # EnvVar in the definitions
        value = os.environ.get(str(value["env"]), value)
    if not isinstance(value, str) or value == namespace:
        return None
    return (f"controltable: this run uses namespace {namespace!r}, but the code location's definitions give "
            f"{value!r}. Run config that configures this resource replaces its whole configuration, so fields "
            f"it leaves out fall back to their defaults: this run does not share limits with runs in "
            f"{value!r}. Give `namespace` in the run config too (or set it only in the definitions).")


def _ahead_text(ahead: list[str]) -> str:
    """ "a", "a and b", "a, b and c", "a, b, c, d, e and 7 more"."""
    if not ahead:
        return "nobody"
    if len(ahead) > defaults.AHEAD_SHOWN:
        return ", ".join(ahead[:defaults.AHEAD_SHOWN]) + f" and {len(ahead) - defaults.AHEAD_SHOWN} more"
    return ahead[0] if len(ahead) == 1 else ", ".join(ahead[:-1]) + " and " + ahead[-1]


def _duration(seconds: float) -> str:
    """ "42 s", "7 min", "3.5 h" for a log line."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _add_output_metadata(step: StepIdentity, metadata: dict[str, Any]) -> None:
    """Add to the step's output metadata when Dagster allows it (one output); the log line has it anyway."""
    if step.context is None:
        return
    try:
        step.context.add_output_metadata(metadata)
    except Exception as exc:  # several outputs, no output, or outside an op: metadata is optional
        log.debug("controltable: no output metadata for the slot: %s", exc)


def _interrupt_received() -> bool:
    """Whether Dagster recorded an interrupt (its termination signal) that it has not acted on yet."""
    try:
        from dagster._utils.interrupts import check_captured_interrupt
    except ImportError:  # pragma: no cover - private API moved; the status check still works
        return False
    try:
        return bool(check_captured_interrupt())
    except Exception:  # pragma: no cover
        return False


def _timestamp(value: Any) -> float:
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _names_list(resource: Union[str, Mapping[str, int]]) -> list[str]:
    return [resource] if isinstance(resource, str) else [str(k) for k in resource]


def _names(resource: Union[str, Mapping[str, int]]) -> str:
    return ", ".join(repr(n) for n in _names_list(resource))


def _exc_info() -> Any:
    import sys

    return sys.exc_info()
