"""OpenTelemetry spans for waits, holds, claims and completions: the one module that knows OpenTelemetry.

Each ``acquire`` is a span ``controltable.wait <resource>`` (``try_acquire`` too, marked as a
poll), each granted lease a span ``controltable.hold <resource>`` from the grant to its release,
each ``claim``/``allocate`` a span ``controltable.claim <table>``/``controltable.allocate <list>``
and each completion (``complete``, ``fail``, ``release`` of a batch or work item) a span
``controltable.complete <table or list>``, all nested in the caller's current span, so that an
orchestrator's task trace (Airflow 3, Prefect) shows "waited 40 s for warehouse" inside the task.
Attributes are named ``controltable.<name>`` with the keyword's underscores as dots
(``queue_position`` becomes ``controltable.queue.position``); see :data:`OUTCOMES`.

No extra, no cost: controltable never imports OpenTelemetry. A process that traces has imported
``opentelemetry.trace`` already (to set its tracer provider, or Airflow, Prefect or
``opentelemetry-instrument`` did), and only then, with a tracer provider configured, does a hook
do more than look that module up in ``sys.modules``. Without a provider (the API's proxy) there
is nothing to record, so no span is even started. The rest of the package calls this module
through decorators at its public methods (sync, ``async`` or generator), :func:`set` for the one
fact only the engine knows (the queue position) and a lease's :func:`enter_hold`/:func:`leave_hold`.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar

from .errors import AcquireTimeout, LeaseLost
from .holders import process_holder_id

#: The instrumentation scope's name (``otel.scope.name`` of every span).
SCOPE = "controltable"
#: Every attribute name starts with it.
PREFIX = "controltable."
#: What ``controltable.outcome`` says, per kind of span.
OUTCOMES = {
    "wait": ("granted", "queued", "timeout", "withdrawn", "error"),
    "hold": ("released", "lost", "error"),
    "claim": ("claimed", "empty", "cancelled", "error"),
    "allocate": ("allocated", "empty", "cancelled", "error"),
    "complete": ("done", "failed", "released", "lost", "cancelled", "error"),
}

F = TypeVar("F", bound=Callable[..., Any])

#: The innermost controltable span of this context (thread or asyncio task): what :func:`set` adds to.
_CURRENT: ContextVar[Optional[Any]] = ContextVar("controltable_span", default=None)
#: The provider given to :func:`use_provider` (None: OpenTelemetry's global one).
_provider: Any = None
#: The last provider asked and its tracer (a provider makes a new tracer object per call).
_cached: tuple[Any, Any] = (None, None)
#: Where a lease keeps its hold span and the context token of the ``with`` block that made it current.
_HOLD = "_controltable_hold"
_HOLD_TOKEN = "_controltable_hold_token"


def use_provider(provider: Any) -> None:
    """Trace through ``provider`` (an OpenTelemetry ``TracerProvider``) instead of the global one.

    For a process that keeps several providers, and for tests; ``None`` goes back to the global
    provider (``opentelemetry.trace.set_tracer_provider``), which is what Airflow and Prefect set.
    """
    global _provider
    _provider = provider


def tracer() -> Any:
    """The tracer spans are made with, or ``None`` when this process does not trace.

    ``None`` unless ``opentelemetry.trace`` was imported by someone (controltable never imports
    it) and a tracer provider is set: the API's proxy provider, left in place when none was
    configured, would only hand out spans that record nothing.
    """
    global _cached
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        provider = _provider if _provider is not None else trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider):
            return None
        if _cached[0] is provider:
            return _cached[1]
        version = getattr(sys.modules.get("controltable"), "__version__", None)
        made = provider.get_tracer(SCOPE, version)
    except AttributeError:  # a module half-imported by another thread, or an API too old: no spans now
        return None
    _cached = (provider, made)
    return made


def attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as span attributes: names prefixed, underscores as dots, ``None`` left out."""
    return {PREFIX + name.replace("_", "."): value for name, value in values.items() if value is not None}


def set(**values: Any) -> None:  # shadows the builtin here only: tracing.set(...) reads well
    """Add attributes to the innermost controltable span of this context (nothing when not tracing).

    For what only the engine knows (the queue position at entry), so its hook stays one line.
    """
    current = _CURRENT.get()
    if current is not None:
        current.set_attributes(attributes(values))


@contextmanager
def span(name: str, cancelled: str = "cancelled", **values: Any) -> Iterator[Optional[Any]]:
    """A span named ``name`` with ``values`` as attributes, current (and :func:`set`'s) in the block.

    Yields the OpenTelemetry span, or ``None`` when the process does not trace. An exception
    leaving the block sets ``controltable.outcome``: ``timeout`` for
    :class:`AcquireTimeout`, ``lost`` (and ``controltable.lease.lost``) for :class:`LeaseLost`,
    ``error`` for other errors, all three with the span's status ERROR and the exception
    recorded; ``cancelled`` for a decision to stop (``KeyboardInterrupt``, a task's
    cancellation), which is no error of the span's.
    """
    made = tracer()
    if made is None:
        yield None
        return
    with _span(made, name, cancelled, values) as current:
        yield current


@contextmanager
def _span(made: Any, name: str, cancelled: str, values: Mapping[str, Any]) -> Iterator[Any]:
    """:func:`span` with the tracer in hand."""
    with made.start_as_current_span(name, attributes=attributes(values), record_exception=False,
                                    set_status_on_exception=False) as current:
        token = _CURRENT.set(current)
        try:
            yield current
        except BaseException as exc:
            _failed(current, exc, cancelled)
            raise
        finally:
            _CURRENT.reset(token)


def _failed(current: Any, exc: BaseException, cancelled: str) -> None:
    """Record why a span's work ended with ``exc``."""
    if not isinstance(exc, Exception):
        current.set_attribute(PREFIX + "outcome", cancelled)
        return
    lost = isinstance(exc, LeaseLost)
    outcome = "timeout" if isinstance(exc, AcquireTimeout) else "lost" if lost else "error"
    current.set_attributes(attributes({"outcome": outcome, "lease_lost": True if lost else None}))
    current.record_exception(exc)
    from opentelemetry.trace import Status, StatusCode  # imported already: a span exists

    current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _wrap(fn: F, describe: Callable[..., tuple[str, dict[str, Any]]],
          record: Callable[[Any, Any, Any], None], cancelled: str = "cancelled", timed: bool = False) -> F:
    """``fn`` (a method, sync or ``async``) run in a span: ``describe(self, *args, **kw)`` names it
    and gives its attributes, ``record(span, self, result)`` adds what the result says; ``timed``
    adds ``controltable.wait.seconds`` however the call ended. A generator function (under
    ``@contextmanager``: ``Batch.transaction``) is one span from its start to its end."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def run_generator(self: Any, *args: Any, **kw: Any) -> Any:
            made = tracer()
            if made is None:
                return (yield from fn(self, *args, **kw))
            name, values = describe(self, *args, **kw)
            with _span(made, name, cancelled, values) as current:
                result = yield from fn(self, *args, **kw)
                record(current, self, result)
            return result

        return run_generator  # type: ignore[return-value]
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(self: Any, *args: Any, **kw: Any) -> Any:
            made = tracer()
            if made is None:
                return await fn(self, *args, **kw)
            name, values = describe(self, *args, **kw)
            started = time.monotonic()
            with _span(made, name, cancelled, values) as current:
                try:
                    result = await fn(self, *args, **kw)
                    record(current, self, result)
                finally:
                    if timed:
                        current.set_attribute(PREFIX + "wait.seconds", time.monotonic() - started)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(self: Any, *args: Any, **kw: Any) -> Any:
        made = tracer()
        if made is None:
            return fn(self, *args, **kw)
        name, values = describe(self, *args, **kw)
        started = time.monotonic()
        with _span(made, name, cancelled, values) as current:
            try:
                result = fn(self, *args, **kw)
                record(current, self, result)
            finally:
                if timed:
                    current.set_attribute(PREFIX + "wait.seconds", time.monotonic() - started)
        return result

    return run  # type: ignore[return-value]


# -- slots ----------------------------------------------------------------------------------------
def _label(resource: Any) -> str:
    """The resource part of a span name: the resource, or a request's several joined by commas."""
    if isinstance(resource, str):
        return resource
    if isinstance(resource, Mapping):
        return ",".join(sorted(str(name) for name in resource))
    return repr(resource)


def waits(poll: bool = False) -> Callable[[F], F]:
    """Decorate ``acquire(self, resource, **kw)`` (``poll``: ``try_acquire``) with its wait span.

    A grant also starts the lease's hold span (:func:`hold`), a sibling of the wait in the caller's
    trace that ends at the release.
    """
    def decorate(fn: F) -> F:
        def describe(self: Any, *args: Any, **kw: Any) -> tuple[str, dict[str, Any]]:
            resource = args[0] if args else kw.get("resource")
            single = isinstance(resource, str)
            return f"controltable.wait {_label(resource)}", {
                "resource": _label(resource), "holder": kw.get("holder") or process_holder_id(),
                "slots": kw.get("slots", 1) if single else None, "mode": kw.get("mode"),
                "attempt": kw.get("attempt"), "priority": kw.get("priority"), "timeout": kw.get("timeout"),
                "namespace": getattr(self, "namespace", None), "poll": True if poll else None}

        def record(current: Any, self: Any, lease: Any) -> None:
            if lease is None:
                current.set_attribute(PREFIX + "outcome", "queued")
                return
            current.set_attributes(attributes({"outcome": "granted", "holder": lease.holder,
                                               "token": lease.token, "attempt": lease.attempt}))

        return _then(_wrap(fn, describe, record, cancelled="withdrawn", timed=True), hold)

    return decorate


def _then(fn: F, after: Callable[[Any], None]) -> F:
    """``fn``, then ``after(result)`` for a result that is not ``None`` (outside ``fn``'s span)."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(*args: Any, **kw: Any) -> Any:
            result = await fn(*args, **kw)
            if result is not None:
                after(result)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kw: Any) -> Any:
        result = fn(*args, **kw)
        if result is not None:
            after(result)
        return result

    return run  # type: ignore[return-value]


def hold(lease: Any) -> None:
    """Start ``lease``'s hold span (in the caller's current context); :func:`ends_hold` ends it."""
    made = tracer()
    if made is None:
        return
    single = len(lease.resources) == 1
    values = {"resource": _label(lease.resources), "holder": lease.holder, "token": lease.token,
              "slots": lease.slots if single else None, "mode": lease.mode, "attempt": lease.attempt,
              "lease_seconds": lease.lease_seconds}
    setattr(lease, _HOLD, made.start_span(f"controltable.hold {_label(lease.resources)}",
                                          attributes=attributes(values)))


def enter_hold(lease: Any) -> None:
    """In ``with lease:`` (and ``slot()``): the hold span is the current one, the work's spans its children."""
    current = getattr(lease, _HOLD, None)
    if current is not None and getattr(lease, _HOLD_TOKEN, None) is None:
        from opentelemetry import context, trace  # imported already: the span exists

        setattr(lease, _HOLD_TOKEN, context.attach(trace.set_span_in_context(current)))


def leave_hold(lease: Any) -> None:
    """Leaving the ``with`` block: the caller's span is current again."""
    token = getattr(lease, _HOLD_TOKEN, None)
    if token is not None:
        setattr(lease, _HOLD_TOKEN, None)
        from opentelemetry import context  # imported already: the token exists

        context.detach(token)


def ends_hold(fn: F) -> F:
    """Decorate ``Lease.release``: its hold span ends with it, saying whether the lease was lost."""
    def finish(lease: Any, exc: Optional[BaseException]) -> None:
        current = getattr(lease, _HOLD, None)
        if current is None:
            return
        setattr(lease, _HOLD, None)
        lost = isinstance(exc, LeaseLost) or lease.lost is not None
        if exc is not None and not lost and isinstance(exc, Exception):
            _failed(current, exc, "error")
            current.set_attribute(PREFIX + "lease.lost", False)
        else:
            current.set_attributes(attributes({"outcome": "lost" if lost else "released", "lease_lost": lost}))
        if lost:  # the work may have overlapped the next holder's: an error of the hold's
            why = exc if isinstance(exc, LeaseLost) else lease.lost
            current.record_exception(why)
            from opentelemetry.trace import Status, StatusCode  # imported already: the span exists

            current.set_status(Status(StatusCode.ERROR, f"lease lost: {why}"))
        current.end()

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(self: Any, *args: Any, **kw: Any) -> Any:
            try:
                result = await fn(self, *args, **kw)
            except BaseException as exc:
                finish(self, exc)
                raise
            finish(self, None)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(self: Any, *args: Any, **kw: Any) -> Any:
        try:
            result = fn(self, *args, **kw)
        except BaseException as exc:
            finish(self, exc)
            raise
        finish(self, None)
        return result

    return run  # type: ignore[return-value]


# -- events and work lists ------------------------------------------------------------------------
def claims(fn: F) -> F:
    """Decorate ``EventTable.claim(self, size=100, *, owner=None, ...)`` with its claim span."""
    def describe(self: Any, size: int = 100, **kw: Any) -> tuple[str, dict[str, Any]]:
        return f"controltable.claim {self.name}", {
            "table": self.qualified_name, "owner": kw.get("owner") or process_holder_id(),
            "batch_limit": size, "wait": kw.get("wait")}

    def record(current: Any, self: Any, batch: Any) -> None:
        current.set_attributes(attributes({
            "outcome": "empty" if batch is None else "claimed", "batch_size": 0 if batch is None else len(batch),
            "token": None if batch is None else batch.token}))

    return _wrap(fn, describe, record)


def allocates(fn: F) -> F:
    """Decorate ``WorkList.allocate(self, owner=None, lease=None)`` with its allocation span."""
    def describe(self: Any, owner: Optional[str] = None, *_: Any, **kw: Any) -> tuple[str, dict[str, Any]]:
        return f"controltable.allocate {self.name}", {
            "worklist": self.name, "owner": owner or kw.get("owner") or process_holder_id()}

    def record(current: Any, self: Any, item: Any) -> None:
        if item is None:
            current.set_attribute(PREFIX + "outcome", "empty")
            return
        current.set_attributes(attributes({"outcome": "allocated", **_item(item)}))

    return _wrap(fn, describe, record)


def _item(item: Any) -> dict[str, Any]:
    return {"item_id": item.id, "token": item.token, "order": item.order, "attempts": item.attempts}


def completes(outcome: str) -> Callable[[F], F]:
    """Decorate a batch's or work item's ``complete``/``fail``/``release`` (``outcome``: what it does)."""
    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        def describe(self: Any, *args: Any, **kw: Any) -> tuple[str, dict[str, Any]]:
            if hasattr(self, "events"):  # a Batch: all its rows, or the ``keys`` given
                keys = signature.bind(self, *args, **kw).arguments.get("keys")
                return f"controltable.complete {self.events.name}", {
                    "table": self.events.qualified_name, "owner": self.owner, "token": self.token,
                    "batch_size": len(self.rows) if keys is None else len(keys)}
            return f"controltable.complete {self.worklist.name}", {
                "worklist": self.worklist.name, "owner": self.owner, **_item(self)}

        def record(current: Any, self: Any, result: Any) -> None:
            current.set_attribute(PREFIX + "outcome", outcome)

        return _wrap(fn, describe, record)

    return decorate


__all__ = ["OUTCOMES", "PREFIX", "allocates", "attributes", "claims", "completes", "ends_hold", "enter_hold",
           "hold", "leave_hold", "set", "span", "tracer", "use_provider", "waits"]
