"""OpenTelemetry spans of waits, holds, claims and completions (controltable.tracing).

Recorded with the SDK's in-memory exporter through a provider of the test's own
(``tracing.use_provider``), so no global provider is left set for the rest of the session. Every
span must nest in the caller's current span (an orchestrator's task span) and carry what a trace
reader asks: which resource, who, which token, where in the queue, how long, how it ended. The
"no extra, no cost" promise is checked in fresh interpreters: using the API never imports
OpenTelemetry, neither when it is missing nor when it is installed and unused.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from support.live import wait_until

import controltable.tracing as tracing
from controltable import AcquireTimeout, ControlTable, DatabaseUnavailableError, LeaseLost, LeaseLostInterrupt

pytestmark = pytest.mark.backends("sqlite", "postgres")

#: A hang detector for waits in these tests (each normally takes well under a second).
HANG = 30.0
P = tracing.PREFIX


class Spans:
    """The finished spans, and a caller span (a task's) to nest the calls in."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def task(self, name: str = "task") -> Any:
        return self.tracer.start_as_current_span(name)

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        names = [s.name for s in self.exporter.get_finished_spans()]
        assert len(found) == 1, f"expected one span {name!r}, got {names}"
        return found[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    recorded = Spans()
    tracing.use_provider(recorded.provider)
    try:
        yield recorded
    finally:
        tracing.use_provider(None)
        recorded.provider.shutdown()


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return span.parent is not None and parent.context is not None and span.parent.span_id == parent.context.span_id


def test_granted_wait_and_hold_nest_in_the_callers_span(ct: ControlTable, spans: Spans) -> None:
    ct.set_capacity("warehouse", 2)
    with spans.task(), ct.slot("warehouse", holder="task-1", attempt=3) as lease, spans.task("work"):
        pass
    task, wait, hold, work = (spans.one(n) for n in ("task", "controltable.wait warehouse",
                                                        "controltable.hold warehouse", "work"))
    assert child_of(wait, task) and child_of(hold, task), "the wait and the hold are the task's children"
    assert child_of(work, hold), "the work inside slot() is the hold's child"
    assert wait.attributes is not None and hold.attributes is not None
    assert wait.attributes[P + "resource"] == "warehouse"
    assert wait.attributes[P + "holder"] == "task-1"
    assert wait.attributes[P + "token"] == lease.token
    assert wait.attributes[P + "attempt"] == 3
    assert wait.attributes[P + "outcome"] == "granted"
    assert wait.attributes[P + "queue.position"] == 0, "granted at entry: nobody was ahead"
    waited = wait.attributes[P + "wait.seconds"]
    assert isinstance(waited, float) and waited >= 0
    assert wait.attributes[P + "namespace"] == ct.namespace
    assert wait.end_time is not None and hold.start_time is not None and wait.end_time <= hold.start_time
    assert hold.attributes[P + "token"] == lease.token
    assert hold.attributes[P + "holder"] == "task-1"
    assert hold.attributes[P + "outcome"] == "released"
    assert hold.attributes[P + "lease.lost"] is False
    assert hold.status.status_code is StatusCode.UNSET


def test_a_queued_wait_says_its_position_and_how_long(ct: ControlTable, spans: Spans) -> None:
    ct.set_capacity("warehouse", 1)
    first = ct.acquire("warehouse", holder="first")
    got: dict[str, Any] = {}

    def second() -> None:
        with spans.task("task-2"):
            got["lease"] = ct.acquire("warehouse", holder="second", timeout=HANG)

    t = threading.Thread(target=second)
    t.start()
    info = wait_until(lambda: ct.wait_info("warehouse", "second"), HANG, "the second holder queued")
    assert info.state == "waiting"
    queued_at = time.monotonic()
    released_at = time.monotonic()
    first.release()
    t.join(HANG)
    assert not t.is_alive(), "hang: the second holder was not granted after the release"
    got["lease"].release()
    wait = [s for s in spans.named("controltable.wait warehouse") if s.attributes
            and s.attributes[P + "holder"] == "second"][0]
    assert child_of(wait, spans.one("task-2"))
    assert wait.attributes is not None
    assert wait.attributes[P + "queue.position"] == 1, "it entered behind the holder, at the head of the queue"
    assert wait.attributes[P + "outcome"] == "granted"
    assert wait.attributes[P + "token"] == got["lease"].token
    waited = wait.attributes[P + "wait.seconds"]
    # It was queued before it was seen queued and granted no earlier than the release began.
    assert isinstance(waited, float) and waited >= released_at - queued_at


def test_a_timed_out_wait(ct: ControlTable, spans: Spans) -> None:
    ct.set_capacity("warehouse", 1)
    held = ct.acquire("warehouse", holder="first")
    with spans.task(), pytest.raises(AcquireTimeout):
        ct.acquire("warehouse", holder="late", timeout=0.2)
    held.release()
    wait = [s for s in spans.named("controltable.wait warehouse") if s.attributes
            and s.attributes[P + "holder"] == "late"][0]
    assert wait.attributes is not None
    assert wait.attributes[P + "outcome"] == "timeout"
    assert wait.attributes[P + "queue.position"] == 1
    assert wait.attributes[P + "timeout"] == 0.2
    assert P + "token" not in wait.attributes
    assert wait.status.status_code is StatusCode.ERROR
    assert [e.name for e in wait.events] == ["exception"]
    assert not [s for s in spans.named("controltable.hold warehouse") if s.attributes
                and s.attributes[P + "holder"] == "late"], "no hold without a grant"


def test_a_poll_that_keeps_its_place(ct: ControlTable, spans: Spans) -> None:
    ct.set_capacity("warehouse", 1)
    held = ct.acquire("warehouse", holder="first")
    with spans.task():
        assert ct.try_acquire("warehouse", holder="sensor") is None
    held.release()
    poll = [s for s in spans.named("controltable.wait warehouse") if s.attributes
            and s.attributes[P + "holder"] == "sensor"][0]
    assert poll.attributes is not None
    assert poll.attributes[P + "outcome"] == "queued" and poll.attributes[P + "poll"] is True
    ct.release("warehouse", "sensor")


def test_a_hold_ended_by_a_lapsed_lease(ct: ControlTable, spans: Spans, monkeypatch: pytest.MonkeyPatch) -> None:
    """Renewals cannot reach the database for the whole lease: the renewer takes it as expired."""
    ct.set_capacity("warehouse", 1)

    def unreachable(*_: Any) -> float:
        raise DatabaseUnavailableError("test: the database is unreachable")

    with spans.task(), pytest.raises(LeaseLost) as info, \
            ct.slot("warehouse", holder="a", lease=1.0, interrupt=False) as lease:
        monkeypatch.setattr(lease.engine, "renew", unreachable)
        wait_until(lambda: lease.lost is not None, HANG, "the renewer to find the lease expired")
    assert info.value is lease.lost
    hold = spans.one("controltable.hold warehouse")
    assert hold.attributes is not None
    assert hold.attributes[P + "lease.lost"] is True
    assert hold.attributes[P + "outcome"] == "lost"
    assert hold.status.status_code is StatusCode.ERROR
    assert [e.name for e in hold.events] == ["exception"]


def test_a_hold_ended_by_a_taken_lease(ct: ControlTable, spans: Spans, backend_url: str, namespace: str) -> None:
    """Released by an operator from elsewhere while the work runs: the work is interrupted."""
    ct.set_capacity("warehouse", 1)
    other = ControlTable(backend_url, namespace=namespace)
    try:
        with spans.task(), pytest.raises(LeaseLostInterrupt), ct.slot("warehouse", holder="a", lease=1.5):
            other.release("warehouse", "a")
            end = time.monotonic() + HANG
            while time.monotonic() < end:
                time.sleep(0.01)
            raise AssertionError("hang: the work was never interrupted")
    finally:
        other.close()
    hold = spans.one("controltable.hold warehouse")
    assert hold.attributes is not None
    assert hold.attributes[P + "lease.lost"] is True and hold.attributes[P + "outcome"] == "lost"


def test_claims_and_completions(ct: ControlTable, spans: Spans, event_table: Callable[..., Any]) -> None:
    ev = event_table(3)
    with spans.task():
        batch = ev.claim(2, owner="w")
        assert batch is not None
        batch.complete()
        rest = ev.claim(5, owner="w")
        assert rest is not None
        rest.fail("bad row")
    task = spans.one("task")
    claims = spans.named(f"controltable.claim {ev.name}")
    completions = spans.named(f"controltable.complete {ev.name}")
    assert len(claims) == 2 and len(completions) == 2
    assert all(child_of(s, task) for s in claims + completions)
    first, second = claims
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes[P + "table"] == ev.qualified_name
    assert first.attributes[P + "batch.size"] == 2 and first.attributes[P + "batch.limit"] == 2
    assert first.attributes[P + "token"] == batch.token and first.attributes[P + "outcome"] == "claimed"
    assert second.attributes[P + "batch.size"] == 1
    done, failed = completions
    assert done.attributes is not None and failed.attributes is not None
    assert done.attributes[P + "outcome"] == "done" and done.attributes[P + "token"] == batch.token
    assert done.attributes[P + "batch.size"] == 2
    assert failed.attributes[P + "outcome"] == "failed" and failed.attributes[P + "token"] == rest.token


def test_an_empty_claim_and_a_lost_completion(ct: ControlTable, spans: Spans,
                                              event_table: Callable[..., Any]) -> None:
    ev = event_table(1)
    batch = ev.claim(1, owner="w")
    assert batch is not None
    ev.reset()  # an operator gives the rows back: this batch's completion is fenced out
    with pytest.raises(LeaseLost):
        batch.complete()
    ev.claim(1, owner="x").complete()  # type: ignore[union-attr]
    assert ev.claim(1, owner="w") is None
    lost = spans.named(f"controltable.complete {ev.name}")[0]
    assert lost.attributes is not None
    assert lost.attributes[P + "outcome"] == "lost" and lost.attributes[P + "lease.lost"] is True
    assert lost.status.status_code is StatusCode.ERROR
    empty = spans.named(f"controltable.claim {ev.name}")[-1]
    assert empty.attributes is not None
    assert empty.attributes[P + "outcome"] == "empty" and empty.attributes[P + "batch.size"] == 0


def test_work_list_allocation_and_completion(ct: ControlTable, spans: Spans) -> None:
    wl = ct.worklist("rebuild")
    wl.populate([{"n": 1}, {"n": 2}])
    with spans.task():
        item = wl.allocate("w")
        assert item is not None
        item.complete()
        other = wl.allocate("w")
        assert other is not None
        other.release()
    task = spans.one("task")
    allocations = spans.named("controltable.allocate rebuild")
    finishes = spans.named("controltable.complete rebuild")
    assert len(allocations) == 2 and len(finishes) == 2
    assert all(child_of(s, task) for s in allocations + finishes)
    assert allocations[0].attributes is not None and finishes[0].attributes is not None
    assert allocations[0].attributes[P + "item.id"] == item.id
    assert allocations[0].attributes[P + "token"] == item.token
    assert allocations[0].attributes[P + "outcome"] == "allocated"
    assert finishes[0].attributes[P + "outcome"] == "done" and finishes[0].attributes[P + "token"] == item.token
    assert finishes[1].attributes is not None and finishes[1].attributes[P + "outcome"] == "released"


def test_a_completion_in_the_callers_transaction(ct: ControlTable, spans: Spans,
                                                 event_table: Callable[..., Any]) -> None:
    ev = event_table(2)
    batch = ev.claim(2, owner="w")
    assert batch is not None
    with spans.task(), batch.transaction(), spans.task("writes"):
        pass
    done = spans.one(f"controltable.complete {ev.name}")
    assert done.attributes is not None
    assert done.attributes[P + "outcome"] == "done" and done.attributes[P + "token"] == batch.token
    assert child_of(done, spans.one("task")) and child_of(spans.one("writes"), done)
    assert batch.finished


def test_a_poll_says_its_position(ct: ControlTable, spans: Spans) -> None:
    ct.set_capacity("warehouse", 1)
    held = ct.acquire("warehouse", holder="first")
    assert ct.try_acquire("warehouse", holder="one") is None
    assert ct.try_acquire("warehouse", holder="two") is None
    assert ct.try_acquire("warehouse", holder="two") is None  # looks again: still second in line
    polls = [s.attributes for s in spans.named("controltable.wait warehouse") if s.attributes
             and s.attributes.get(P + "poll")]
    assert [(a[P + "holder"], a[P + "queue.position"]) for a in polls if a] == [("one", 1), ("two", 2), ("two", 2)]
    held.release()
    ct.release("warehouse", "one")
    ct.release("warehouse", "two")


@pytest.mark.backends("sqlite")
def test_the_facade_for_other_surfaces(backend: str, spans: Spans) -> None:
    """What an asynchronous API or a plugin uses: ``span``/``set``, and the decorators on ``async def``."""
    import asyncio

    with spans.task(), tracing.span("controltable.custom thing", resource="thing") as current:
        assert current is not None
        tracing.set(queue_position=4, ignored=None)
    custom = spans.one("controltable.custom thing")
    assert custom.attributes == {P + "resource": "thing", P + "queue.position": 4}
    assert child_of(custom, spans.one("task"))

    class AsyncEvents:
        name = "orders"
        qualified_name = "public.orders"

        @tracing.claims
        async def claim(self, size: int = 100, *, owner: str | None = None) -> Any:
            await asyncio.sleep(0)
            tracing.set(probe=True)
            return None

    assert asyncio.run(AsyncEvents().claim(5, owner="w")) is None
    claim = spans.one("controltable.claim orders")
    assert claim.attributes is not None
    assert claim.attributes[P + "outcome"] == "empty" and claim.attributes[P + "batch.limit"] == 5
    assert claim.attributes[P + "probe"] is True, "set() inside an async method reaches its span"

    from opentelemetry import trace

    tracing.use_provider(None)  # back to the global provider: when none is set, no span at all
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        with tracing.span("controltable.untraced") as nothing:
            assert nothing is None


# -- no extra, no cost ----------------------------------------------------------------------------
_USE_THE_API = """
    import sys
    {prelude}
    from controltable import ControlTable, tracing
    ct = ControlTable({url!r}, namespace="notrace")
    ct.install()
    ct.set_capacity("warehouse", 1)
    with ct.slot("warehouse", holder="a"):
        pass
    ct.try_acquire("warehouse", holder="b").release()
    wl = ct.worklist("w")
    wl.populate([{{"n": 1}}])
    wl.allocate("x").complete()
    {check}
    print("ok")
"""

_BLOCKER = """
    import importlib.abc
    ASKED = []

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                ASKED.append(name)
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, Blocker())
"""


def _run(tmp_path: Path, prelude: str, check: str) -> None:
    code = textwrap.dedent(_USE_THE_API).format(prelude="{prelude}", url=f"sqlite:///{tmp_path / 'ct.db'}",
                                                check=check).replace("{prelude}", textwrap.dedent(prelude))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


@pytest.mark.backends("sqlite")
def test_without_opentelemetry_nothing_is_imported(backend: str, tmp_path: Path) -> None:
    """OpenTelemetry missing (a finder refuses it): the API works and never even asks for it."""
    _run(tmp_path, _BLOCKER,
         "assert ASKED == [], ASKED; assert not [m for m in sys.modules if m.startswith('opentelemetry')]")


@pytest.mark.backends("sqlite")
def test_installed_but_unused_opentelemetry_is_not_imported(backend: str, tmp_path: Path) -> None:
    """Installed (as in this environment) but nobody traces: controltable does not import it."""
    import importlib.util

    assert importlib.util.find_spec("opentelemetry.trace") is not None, "this test needs opentelemetry-api"
    _run(tmp_path, "", "assert not [m for m in sys.modules if m.startswith('opentelemetry')], "
                       "[m for m in sys.modules if m.startswith('opentelemetry')]")


@pytest.mark.backends("sqlite")
def test_no_provider_configured_starts_no_span(backend: str, tmp_path: Path) -> None:
    """The application imported OpenTelemetry but set no provider: no span is started at all
    (the API's proxy would only hand out spans that record nothing), and the SDK stays unloaded."""
    _run(tmp_path, "import opentelemetry.trace",
         "assert tracing.tracer() is None; assert 'opentelemetry.sdk' not in sys.modules")
