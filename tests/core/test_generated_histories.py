"""Generated histories: hypothesis drives the public API of several clients and a reference model side by side.

The examples in the other tests prove the cases someone wrote down; these find the ones nobody did.
A rule-based state machine issues random operations through several ``ControlTable`` objects in one
namespace (acquire, try_acquire, release twice, renew, set_capacity with priorities and rate limits,
clients abandoned with their entries left to lapse) with names that include blanks at either end,
case variants, both Unicode normal forms and the longest allowed. After every step the database's
view (``status()``, what each call returned) is compared with the pure model of
``support/reference_model.py``, and the promises are checked one by one so a failure names the one
broken: capacity, exclusivity, tokens above every earlier token of the resource, FIFO within a
priority, no two holders with one lease, liveness (free capacity and a live waiter at the head mean a
grant by the next pass, whatever expired before it) and every exception a ``controltable`` error.

Time is the database clock's: an abandoned client's short leases and waiter entries are waited out
on ``ControlTable.now()``, never on a sleep of this machine. Live clients use leases far longer
than an example, so nothing expires that the model does not know of.

Budget: ``CONTROLTABLE_HISTORY_EXAMPLES`` examples per backend (default 10, the full suite; the quick
loop runs 4), or ``CONTROLTABLE_HISTORY_MINUTES`` of examples per backend and machine (the longer run; see
CONTRIBUTING.md). Each test prints how many examples it tried.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
import unicodedata
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from sqlalchemy import MetaData, Table, delete

hypothesis = pytest.importorskip("hypothesis")  # the SQLAlchemy 1.4 run has no hypothesis
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402
from support import event_tables  # noqa: E402
from support.reference_model import (  # noqa: E402
    ACTIVE,
    CLAIMED,
    DONE,
    ERROR,
    GRANTED,
    NEW,
    PENDING,
    EventModel,
    EventRow,
    SlotModel,
    WorkItem,
    WorkListModel,
    may_be_refused,
)

from controltable import (  # noqa: E402
    AcquireTimeout,
    ConfigurationError,
    ControlTable,
    ControlTableError,
    LeaseLost,
    UnknownResourceError,
)
from controltable.checks import Interval, violations  # noqa: E402
from controltable.defaults import MAX_ATTEMPTS, NAME_LENGTH  # noqa: E402

# -- budget ------------------------------------------------------------------------------------------
MINUTES = float(os.environ.get("CONTROLTABLE_HISTORY_MINUTES", "0") or 0)
EXAMPLES = int(os.environ.get("CONTROLTABLE_HISTORY_EXAMPLES", "0") or 0) or 10
STEPS = int(os.environ.get("CONTROLTABLE_HISTORY_STEPS", "0") or 0) or 15

#: Leases, waiter entries and pickups of live clients: far longer than any example, so they never
#: run out unless the model says so. An example that takes longer fails as a hang.
LONG = 600.0
#: An abandoned client's waiter entries, leases and pickups (seconds, the smallest allowed pickup).
GHOST_TTL = 2.0


def settings_for(kind: str, examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        database=None,
    )


# -- names ---------------------------------------------------------------------------------------------
def _pad(name: str, tail: str = "") -> str:
    """``name`` repeated up to the longest allowed name, ending in ``tail``."""
    body = (name * (NAME_LENGTH // max(len(name), 1) + 1))[: NAME_LENGTH - len(tail)]
    return body + tail


#: How a base name is varied: kept, a blank after or before it, other case, the other Unicode normal
#: form, the longest allowed name (also with a blank at the end), one character too long.
TRANSFORMS: dict[str, Callable[[str], str]] = {
    "same": lambda s: s,
    "trailing blank": lambda s: s + " ",
    "leading blank": lambda s: " " + s,
    "upper": str.upper,
    "title": str.title,
    "NFD": lambda s: unicodedata.normalize("NFD", s),
    "NFC": lambda s: unicodedata.normalize("NFC", s),
    "longest": _pad,
    "longest, trailing blank": lambda s: _pad(s, " "),
    "too long": lambda s: _pad(s) + "x",
}


def names(*bases: str) -> st.SearchStrategy[str]:
    return st.builds(lambda base, how: TRANSFORMS[how](base), st.sampled_from(bases), st.sampled_from(list(TRANSFORMS)))


def near(existing: list[str], fresh: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A name in use, a variant of one (the names a backend might confuse with it), or a fresh one."""
    if not existing:
        return fresh
    used = st.sampled_from(sorted(existing))
    variant = st.builds(lambda n, how: TRANSFORMS[how](n), used, st.sampled_from(list(TRANSFORMS)))
    return st.one_of(used, variant, fresh)


RESOURCES = names("wh", "caf\u00e9", "db")
HOLDERS = names("etl", "zo\u00eb", "load")
MODES = st.sampled_from(["shared", "exclusive"])
PRIORITIES = st.sampled_from([0, 1, -1])


def too_long(*ns: str) -> bool:
    return any(len(n) > NAME_LENGTH for n in ns)


def refusable(*ns: str) -> bool:
    return any(may_be_refused(n) for n in ns)


class Outcome:
    """What one call did: its value, or the ``controltable`` error it raised (anything else fails)."""

    def __init__(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.value = value
        self.error = error

    def __repr__(self) -> str:
        return f"raised {type(self.error).__name__}: {self.error}" if self.error else f"returned {self.value!r}"


#: Errors that were not controltable errors (a machine's teardown checks nothing more after one).
RAW_ERRORS: list[BaseException] = []


def call(what: str, fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(fn())
    except ControlTableError as exc:
        return Outcome(error=exc)
    except Exception as exc:  # the promise: every failure a caller sees is a controltable error
        RAW_ERRORS.append(exc)
        raise AssertionError(
            f"{what} raised {type(exc).__name__}, not a controltable error: {exc!r}\n{traceback.format_exc()}"
        ) from exc


def wait_for_clock(ct: ControlTable, target: float, why: str) -> None:
    """Wait until the database clock passes ``target`` (a hang detector far above the wait itself)."""
    limit = time.monotonic() + 60 + max(target - ct.now(), 0) * 5
    while ct.now() <= target:
        assert time.monotonic() < limit, f"hang: the database clock did not pass {target} ({why})"
        time.sleep(0.05)


class SlotHistories(RuleBasedStateMachine):
    """Slots: several clients of one namespace against the model of ``support/reference_model.py``."""

    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.namespace = f"h_{uuid.uuid4().hex[:12]}"
        self.clients = [ControlTable(self.url, namespace=self.namespace) for _ in range(3)]
        self.model = SlotModel()
        #: Lease objects handed out, with the model grant they belong to: (resource, holder, grant id, lease).
        self.leases: list[tuple[str, str, int, Any]] = []
        self.ghosts = 0
        #: A check failed: the teardown adds nothing.
        self.broken = False
        self.started = time.monotonic()
        #: Resources a pass certainly ran on in this step, and the grants the model made.
        self.passed: set[str] = set()
        #: Resources whose state the model takes from the database after this step (see ``abandon_client``).
        self.resync: set[str] = set()
        #: When a step may have left either of two states (see ``enter``): the check adopts the one seen.
        self.candidates: list[SlotModel] = []

    def teardown(self) -> None:
        try:
            if not self.broken and not RAW_ERRORS:
                self.next_pass()
        finally:
            for ct in self.clients:
                ct.close()

    def next_pass(self) -> None:
        """Liveness at the end of an example: one more pass on every resource with waiters (a new
        request at the back of the queue) must grant whoever fits at the head, expired entries or not."""
        for name in sorted(self.model.resources):
            res = self.model.resources[name]
            if res.waiters() or res.pending:
                self.enter(self.clients[0], name, "next-pass", "shared", 1, -2, False)
                self.matches_the_model()

    # -- helpers -----------------------------------------------------------------------------------
    def fail(self, message: str) -> None:
        self.broken = True
        raise AssertionError(message)

    def expect_refusal(self, out: Outcome, *ns: str) -> bool:
        """True when the call was refused as it may be (names too long, or ones a backend cannot keep apart)."""
        if too_long(*ns):
            if not isinstance(out.error, ConfigurationError):
                self.fail(f"a name longer than {NAME_LENGTH} characters was not refused: {out}")
            return True
        # Refused as one the backend cannot keep apart: allowed, and nothing changed.
        return isinstance(out.error, ConfigurationError) and refusable(*ns)

    def record_lease(self, resource: str, holder: str, lease: Any) -> None:
        entry = self.model.entry(resource, holder)
        assert entry is not None and entry.grant_id is not None
        if lease.holder != holder:
            self.fail(f"a lease asked for by {holder!r} names holder {lease.holder!r}")
        if entry.token is None:
            entry.token = lease.token
        elif entry.token != lease.token:
            self.fail(f"holder {holder!r} on {resource!r} got token {lease.token}, its grant has token {entry.token}")
        self.leases.append((resource, holder, entry.grant_id, lease))

    def enter(self, ct: ControlTable, resource: str, holder: str, mode: str, slots: int, priority: int,
              blocking: bool) -> None:
        """try_acquire (``blocking=False``) or acquire(timeout=0), checked against the model."""
        out = self.call_enter(ct, resource, holder, mode, slots, priority, blocking)
        self.check_enter(out, resource, holder, mode, slots, priority, blocking)

    @staticmethod
    def describe(resource: str, holder: str, mode: str, slots: int, priority: int, blocking: bool) -> str:
        return (f"{'acquire' if blocking else 'try_acquire'}({resource!r}, holder={holder!r}, mode={mode!r}, "
                f"slots={slots}, priority={priority}{', timeout=0' if blocking else ''})")

    def call_enter(self, ct: ControlTable, resource: str, holder: str, mode: str, slots: int, priority: int,
                   blocking: bool) -> Outcome:
        what = self.describe(resource, holder, mode, slots, priority, blocking)
        kw: dict[str, Any] = dict(holder=holder, mode=mode, slots=slots, priority=priority, lease=LONG,
                                  waiter_ttl=LONG, pickup=LONG)
        if blocking:
            return call(what, lambda: ct.acquire(resource, timeout=0, **kw))
        return call(what, lambda: ct.try_acquire(resource, **kw))

    def check_enter(self, out: Outcome, resource: str, holder: str, mode: str, slots: int, priority: int,
                    blocking: bool) -> None:
        what = self.describe(resource, holder, mode, slots, priority, blocking)
        if self.expect_refusal(out, resource, holder):
            return
        if resource not in self.model.resources:
            if not isinstance(out.error, UnknownResourceError):
                self.fail(f"{what} on a resource never created: expected UnknownResourceError, {out}")
            return
        res = self.model.resources[resource]
        mine = self.model.entry(resource, holder)
        if mine is not None and (mine.slots, mine.mode) != (slots, mode):
            if not isinstance(out.error, ConfigurationError):
                self.fail(f"{what}: holder already has {mine.slots} {mine.mode}: expected ConfigurationError, {out}")
            return
        if mine is None and slots > res.capacity:
            if not isinstance(out.error, ConfigurationError):
                self.fail(f"{what}: more slots than the capacity {res.capacity}: expected ConfigurationError, {out}")
            return
        if mine is not None and mine.state == GRANTED:
            if out.error is not None:
                self.fail(f"{what}: the holder holds a grant, asking again must return it: {out}")
            self.record_lease(resource, holder, out.value)
            return
        # A new entry, or a waiter asking again: a pass runs (always for a new entry and for
        # acquire; for a waiter's try_acquire only when it must pass capacity on itself).
        with_pass = self.model.clone()
        entry = with_pass.enqueue(resource, holder, slots, mode, priority)
        certain = mine is None or blocking
        if blocking and entry.state != GRANTED:
            with_pass.remove(resource, holder)  # acquire(timeout=0) withdraws its entry
        if isinstance(out.error, ConfigurationError) and mine is not None and slots > res.capacity:
            return  # a waiter that can never fit (the capacity shrank) is told so when it passes
        if out.error is not None and not (blocking and isinstance(out.error, AcquireTimeout)):
            self.fail(f"{what}: unexpected error {out}")
        granted = out.value is not None
        if not certain and res.pending and not granted:
            # A waiter's own look runs a pass only when it must (at the head and fitting, or a
            # holder ran out): either state may follow; the check after the step picks the one seen.
            self.candidates = [with_pass, self.model]
            if entry.state == GRANTED:
                self.candidates = [self.model]
            return
        if granted != (entry.state == GRANTED):
            if granted:
                owner = [e.holder for e in res.live() if e.state == GRANTED and e.token == out.value.token]
                self.fail(f"{what} returned a lease (token {out.value.token}) where the model has it waiting "
                          f"behind {[w.holder for w in with_pass.resources[resource].waiters()]!r}"
                          + (f"; that token is holder {owner[0]!r}'s: two holders with one lease" if owner else ""))
            self.fail(f"liveness: {what} was not granted although free capacity and the head of the queue "
                      f"are its (capacity {res.capacity}, holders {[h.holder for h in res.holders()]!r}, "
                      f"expired entries {[e.holder for e in res.entries if e.expired]!r}): {out}")
        self.model = with_pass
        self.passed.add(resource)
        if granted:
            self.record_lease(resource, holder, out.value)

    # -- rules ---------------------------------------------------------------------------------------
    @initialize(name=RESOURCES, capacity=st.integers(1, 3))
    def first_resource(self, name: str, capacity: int) -> None:
        self.set_capacity(0, name, capacity, None)

    @rule(data=st.data(), client=st.integers(0, 2), capacity=st.integers(1, 3),
          rate=st.just(-1) | st.none() | st.integers(1, 4))
    def resize(self, data: st.DataObject, client: int, capacity: int, rate: Optional[int]) -> None:
        self.set_capacity(client, data.draw(self.resource_names(), label="resource"), capacity, rate)

    def set_capacity(self, client: int, name: str, capacity: int, rate: Optional[int]) -> None:
        """Create or resize; ``rate`` k: at most k grants per hour (longer than the example); -1 keeps it."""
        keep = rate == -1
        what = f"set_capacity({name!r}, {capacity}, rate={'<keep>' if keep else rate})"
        ct = self.clients[client]
        if keep:
            out = call(what, lambda: ct.set_capacity(name, capacity))
        else:
            out = call(what, lambda: ct.set_capacity(name, capacity, rate=None if rate is None else (rate, 3600.0)))
        if self.expect_refusal(out, name):
            return
        if out.error is not None:
            self.fail(f"{what}: {out}")
        self.model.set_capacity(name, capacity, rate, keep)
        self.passed.add(name)

    def resource_names(self) -> st.SearchStrategy[str]:
        return near(list(self.model.resources), RESOURCES)

    def holder_names(self) -> st.SearchStrategy[str]:
        used = {e.holder for r in self.model.resources.values() for e in r.live() if not e.holder.startswith("ghost-")}
        return near(sorted(used), HOLDERS)

    @rule(data=st.data(), client=st.integers(0, 2), mode=MODES, slots=st.integers(1, 2), priority=PRIORITIES,
          blocking=st.booleans())
    def request(self, data: st.DataObject, client: int, mode: str, slots: int, priority: int, blocking: bool) -> None:
        resource = data.draw(self.resource_names(), label="resource")
        holder = data.draw(self.holder_names(), label="holder")
        self.enter(self.clients[client], resource, holder, mode, slots if mode == "shared" else 1, priority, blocking)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def release_lease(self, data: st.DataObject) -> None:
        """Release a lease object: the live grant goes; a second release (same object or another
        object of the same grant) is a no-op or a ``LeaseLost`` that says so, and changes nothing."""
        i = data.draw(st.integers(0, len(self.leases) - 1), label="lease")
        resource, holder, grant_id, lease = self.leases[i]
        what = f"Lease({resource!r}, {holder!r}, token {lease.token}).release()"
        already = lease.released
        out = call(what, lease.release)
        live = any(e.grant_id == grant_id for e in self.model.resources[resource].live())
        if live and not already:
            if out.error is not None:
                self.fail(f"{what}: the grant is live, the release failed: {out}")
            self.model.remove_grant(resource, grant_id)
            self.passed.add(resource)
            return
        if out.error is not None and not isinstance(out.error, LeaseLost):
            self.fail(f"{what}: releasing a grant released before must be a no-op or LeaseLost: {out}")
        self.maybe_passed(resource)

    def maybe_passed(self, resource: str) -> None:
        """A call that changed nothing of its own may still have run a pass on the way (a release that
        found its grant gone locks the resource and passes capacity on, reaping what ran out): either
        state may follow; the check after the step picks the one seen."""
        if self.model.resources[resource].pending:
            with_pass = self.model.clone()
            with_pass.grant_pass(resource)
            self.candidates = [self.model, with_pass]

    @rule(data=st.data(), client=st.integers(0, 2))
    def release_by_name(self, data: st.DataObject, client: int) -> None:
        resource = data.draw(self.resource_names(), label="resource")
        holder = data.draw(self.holder_names(), label="holder")
        what = f"release({resource!r}, {holder!r})"
        out = call(what, lambda: self.clients[client].release(resource, holder))
        if self.expect_refusal(out, resource, holder):
            return
        if resource not in self.model.resources:
            if not isinstance(out.error, UnknownResourceError):
                self.fail(f"{what} on a resource never created: expected UnknownResourceError, {out}")
            return
        if out.error is not None:
            self.fail(f"{what}: {out}")
        expected = 1 if self.model.entry(resource, holder) is not None else 0
        if out.value != expected:
            self.fail(f"{what} removed {out.value} requests, the model has {expected} for that holder")
        if expected == 0 and not any(e.holder == holder for e in self.model.resources[resource].entries):
            # Nothing of that holder's: the queue did not change, so no pass is owed (a release that
            # matches no row returns at once); one that met rows (an expired entry) passes on.
            self.maybe_passed(resource)
            return
        self.model.remove(resource, holder)
        self.passed.add(resource)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.leases) - 1), label="lease")
        resource, holder, grant_id, lease = self.leases[i]
        what = f"Lease({resource!r}, {holder!r}, token {lease.token}).renew()"
        out = call(what, lambda: lease.renew(LONG))
        live = any(e.grant_id == grant_id for e in self.model.resources[resource].live()) and not lease.released
        if live and out.error is not None:
            self.fail(f"{what}: the grant is live, the renewal failed: {out}")
        if not live and not isinstance(out.error, LeaseLost):
            self.fail(f"{what}: the grant is gone, the renewal must raise LeaseLost: {out}")
        if not live:
            self.maybe_passed(resource)

    @precondition(lambda self: bool(self.model.resources))
    @rule(data=st.data(), priority=PRIORITIES, mode=MODES, follow=st.sampled_from([True, True, False]),
          follower_priority=PRIORITIES)
    def abandon_client(self, data: st.DataObject, priority: int, mode: str, follow: bool,
                       follower_priority: int) -> None:
        """A client queues some requests with short leases and waiter entries, then goes away without a
        word; ``follower`` (a live holder) queues behind them while they live. Their entries run out
        on the database clock; nobody passes the capacity on until the next pass."""
        resource = data.draw(st.sampled_from(sorted(self.model.resources)), label="resource")
        # Mostly a queue longer than the capacity (the pass reads only the head of a queue).
        cap = self.model.resources[resource].capacity
        n = data.draw(st.integers(cap, 2 * cap + 3) | st.integers(1, cap), label="requests")
        follower = data.draw(self.holder_names(), label="follower") if follow else None
        ghost_ct = ControlTable(self.url, namespace=self.namespace)
        names = []
        outs = []
        try:
            start = ghost_ct.now()
            for _ in range(n):
                self.ghosts += 1
                holder = f"ghost-{self.ghosts}"
                names.append(holder)
                what = f"try_acquire({resource!r}, holder={holder!r}, mode={mode!r}, priority={priority}) by a " \
                       "client about to be abandoned"
                outs.append((what, call(what, lambda h=holder: ghost_ct.try_acquire(  # type: ignore[misc]
                    resource, holder=h, mode=mode, priority=priority, lease=GHOST_TTL, waiter_ttl=GHOST_TTL,
                    pickup=GHOST_TTL))))
            if follower is not None:
                followed = self.call_enter(self.clients[0], resource, follower, "shared", 1, follower_priority, False)
            end = self.clients[0].now()
        finally:
            ghost_ct.close()
        if end < start + GHOST_TTL:
            # Every pass of the rule ran while the short entries were certainly alive: judge them.
            for holder, (what, out) in zip(names, outs):
                entry = self.model.enqueue(resource, holder, 1, mode, priority)
                self.passed.add(resource)
                if out.error is not None or (out.value is not None) != (entry.state == GRANTED):
                    self.fail(f"{what}: {out}, the model has it {entry.state}")
                if out.value is not None:
                    self.record_lease(resource, holder, out.value)
                    self.leases.pop()  # an abandoned client's lease is never used again
            if follower is not None:
                self.check_enter(followed, resource, follower, "shared", 1, follower_priority, False)
        else:
            # A pass of this rule may have run after a short entry ran out (a loaded machine): the
            # model cannot tell what it saw. It takes the database's word for the resource (the
            # safety checks still judge it) rather than end the example: draws must not hang on time.
            for what, out in outs:
                if out.error is not None:
                    self.fail(f"{what}: {out}")
            if follower is not None and followed.error is None and followed.value is not None:
                # Kept as in the judged path, so that what the next steps draw never hangs on time;
                # its grant is looked up when the model takes the database's word.
                self.leases.append((resource, follower, 0, followed.value))
            self.resync.add(resource)
        wait_for_clock(self.clients[1], end + GHOST_TTL + 0.01, "the abandoned client's entries to run out")
        self.model.expire(resource, set(names))

    @rule(client=st.integers(0, 2))
    def reap(self, client: int) -> None:
        out = call("reap()", self.clients[client].reap)
        if out.error is not None:
            self.fail(f"reap(): {out}")
        for name, res in self.model.resources.items():
            if res.pending:
                self.model.grant_pass(name)
                self.passed.add(name)

    # -- the checks after every step ---------------------------------------------------------------
    @invariant()
    def matches_the_model(self) -> None:
        assert time.monotonic() - self.started < LONG / 2, "hang: an example ran longer than the live leases"
        out = call("status()", self.clients[2].status)
        if out.error is not None:
            self.fail(f"status(): {out}")
        seen: dict[str, Any] = {}
        for st_ in out.value:
            if st_.name in seen:
                self.fail(f"status() lists resource {st_.name!r} twice")
            seen[st_.name] = st_
        for name in sorted(self.resync):
            self.adopt(name, seen.get(name))
        self.resync = set()
        candidates, self.candidates = self.candidates or [self.model], []
        problems: list[AssertionError] = []
        for model in candidates:
            try:
                self.check_model(model, seen)
            except AssertionError as exc:
                problems.append(exc)
                continue
            self.model = model
            break
        else:
            raise problems[0]
        self.passed = set()

    def adopt(self, name: str, status: Any) -> None:
        if status is None:
            self.fail(f"resource {name!r} is missing from status()")
        holders = [e for e in status.holders if not e.expired]
        if len({e.token for e in holders}) != len(holders):
            self.fail(f"{name!r}: two live holders with one token: {[(e.holder, e.token) for e in holders]}")
        self.model.adopt(name, [(e.holder, e.slots, e.mode, e.priority, e.token) for e in holders],
                         [(e.holder, e.slots, e.mode, e.priority) for e in status.waiters if not e.expired])
        self.model.resources[name].top_token = max([self.model.resources[name].top_token,
                                                    *(e.token for e in holders)])
        # The database made grants the model did not see (why it adopts); they count against the
        # rate window as the engine counts them, from the grant history (the window is an hour,
        # longer than any example). Without this a loaded run's model granted what the spent rate
        # budget held back, and reported a liveness failure the product did not have.
        self.model.resources[name].grants = len(self.clients[0].history(name, since=3600.0, limit=1000))
        for i, (resource, holder, grant_id, lease) in enumerate(self.leases):
            if resource == name and grant_id == 0:
                entry = self.model.entry(name, holder)
                found = entry.grant_id if entry is not None and entry.token == lease.token else None
                self.leases[i] = (resource, holder, found or -1, lease)

    def check_model(self, model: SlotModel, seen: dict[str, Any]) -> None:
        extra = set(seen) - set(model.resources)
        if extra:
            self.fail(f"resources the model does not have: {sorted(extra)!r} (model: {sorted(model.resources)!r})")
        for name, res in model.resources.items():
            if name not in seen:
                self.fail(f"resource {name!r} is missing from status() (it has {sorted(seen)!r}): two names were one")
            self.check_resource(name, res, seen[name])

    def check_resource(self, name: str, res: Any, status: Any) -> None:
        if status.capacity != res.capacity:
            self.fail(f"{name!r}: capacity {status.capacity}, the model set {res.capacity}")
        holders = {e.holder: e for e in status.holders if not e.expired}
        waiters = [e for e in status.waiters if not e.expired]
        model_holders = {e.holder: e for e in res.holders()}
        model_waiters = [e.holder for e in res.waiters()]
        tokens = [e.token for e in holders.values()]
        # -- safety, each promise on its own -----------------------------------------------------
        if len(set(tokens)) != len(tokens):
            self.fail(f"{name!r}: two live holders with one token: {[(h, e.token) for h, e in holders.items()]}")
        if any(e.mode == "exclusive" for e in holders.values()) and len(holders) > 1:
            self.fail(f"{name!r}: an exclusive holder is not alone: {sorted(holders)!r}")
        new = [h for h, e in model_holders.items() if h in holders and e.token is None]
        used = sum(e.slots for e in holders.values())
        if new and used > status.capacity:
            self.fail(f"{name!r}: granted {new!r} with {used} slots in use, capacity {status.capacity}")
        for h in new:
            if holders[h].token <= res.top_token:
                self.fail(f"{name!r}: {h!r} was granted token {holders[h].token}, not above the earlier "
                          f"token {res.top_token}")
        for h in new:
            g = model_holders[h]
            for w in waiters:
                m = next((e for e in res.entries if e.holder == w.holder), None)
                # Only a waiter queued before the grant can have been ahead of it (one queued later
                # with a higher priority was not there to be passed over).
                if (m is not None and m.ticket <= g.granted_at_ticket
                        and (-m.priority, m.ticket) < (-g.priority, g.ticket)):
                    self.fail(f"{name!r}: {h!r} (priority {g.priority}, ticket {g.ticket}) was granted while "
                              f"{w.holder!r} (priority {m.priority}, ticket {m.ticket}) waits ahead of it: FIFO")
        # -- liveness and the whole state -------------------------------------------------------------
        if set(holders) != set(model_holders):
            stuck = [h for h in model_holders if h not in holders]
            if stuck and name in self.passed:
                self.fail(f"liveness on {name!r}: a pass ran, capacity {res.capacity} and {stuck!r} at the head "
                          f"(live) fit, yet the database has holders {sorted(holders)!r} and waiters "
                          f"{[w.holder for w in waiters]!r} (expired entries: "
                          f"{[e.holder for e in status.waiters if e.expired]!r})")
            self.fail(f"{name!r}: holders {sorted(holders)!r}, the model has {sorted(model_holders)!r}")
        for h, e in holders.items():
            m = model_holders[h]
            if (e.slots, e.mode) != (m.slots, m.mode):
                self.fail(f"{name!r}: holder {h!r} holds {e.slots} {e.mode}, it asked for {m.slots} {m.mode}")
            if m.token is not None and m.token != e.token:
                self.fail(f"{name!r}: holder {h!r} has token {e.token}, it was granted {m.token}")
        if [w.holder for w in waiters] != model_waiters:
            self.fail(f"{name!r}: waiters {[w.holder for w in waiters]!r}, the model has {model_waiters!r} "
                      "(queue order: priority, then FIFO)")
        # Tokens of this step's grants: in the model's grant order (queue order).
        for h in sorted(new, key=lambda h: model_holders[h].grant_id or 0):
            model_holders[h].token = holders[h].token
        fresh = sorted(new, key=lambda h: model_holders[h].grant_id or 0)
        got = [holders[h].token for h in fresh]
        if got != sorted(got):
            self.fail(f"{name!r}: tokens {got!r} of {fresh!r} are not in grant (queue) order")
        res.top_token = max([res.top_token, *tokens])


class EventHistories(RuleBasedStateMachine):
    """Event batches: two clients claim, complete, fail, release and abandon batches of one table.

    Claims are disjoint (never a row a live batch holds, never a finished one), a batch completes
    only while it holds every row (a batch whose claim was taken over raises ``LeaseLost`` and
    marks nothing), and a claim finds rows whenever some are claimable.
    """

    url = ""
    #: The event table (created and prepared once per test; each example starts with fresh rows).
    table_name = ""
    ROWS = 8

    def __init__(self) -> None:
        super().__init__()
        self.namespace = f"h_{uuid.uuid4().hex[:12]}"
        self.clients = [ControlTable(self.url, namespace=self.namespace) for _ in range(2)]
        table = Table(self.table_name, MetaData(), autoload_with=self.clients[0].engine)
        with self.clients[0].engine.begin() as conn:
            conn.execute(delete(table))
        event_tables.fill(self.clients[0], self.table_name, 1, self.ROWS)
        self.events: list[Any] = []
        self.model = EventModel(self.ROWS)
        self.batches: dict[int, Any] = {}
        self.started = time.monotonic()

    def teardown(self) -> None:
        for ct in self.clients:
            ct.close()

    @initialize(max_attempts=st.sampled_from([100, 10_000, MAX_ATTEMPTS]))
    def configure(self, max_attempts: int) -> None:
        """No back-off (a failed row is due at once: the model keeps no clock) and more attempts
        than an example makes, so no row goes to the error state."""
        self.events = [ct.events(self.table_name, key="id", backoff=0, max_attempts=max_attempts)
                       for ct in self.clients]

    @rule(client=st.integers(0, 1), size=st.integers(1, 4), owner=HOLDERS, abandon=st.booleans())
    def claim(self, client: int, size: int, owner: str, abandon: bool) -> None:
        """Claim; ``abandon``: with a short lease, then its owner goes away and the lease runs out."""
        what = f"claim({size}, owner={owner!r}{', short lease' if abandon else ''})"
        claimable = self.model.claimable()
        out = call(what, lambda: self.events[client].claim(size, owner=owner, lease=GHOST_TTL if abandon else LONG))
        if too_long(owner) or (isinstance(out.error, ConfigurationError) and refusable(owner)):
            if not isinstance(out.error, ConfigurationError):
                raise AssertionError(f"{what}: an owner longer than {NAME_LENGTH} characters was accepted: {out}")
            return
        if out.error is not None:
            raise AssertionError(f"{what}: {out}")
        batch = out.value
        if batch is None:
            assert not claimable, f"{what} found nothing although rows {claimable} are claimable"
            return
        keys = sorted(batch.keys)
        held = [k for k in keys if k not in claimable]
        assert not held, f"{what} claimed rows {held} that a live batch holds or that are finished: claims overlap"
        assert len(keys) == min(size, len(claimable)), f"{what} claimed {keys} of the claimable {claimable}"
        # A batch's token is chosen at random by its client: it must only never repeat.
        assert batch.token not in self.batches, f"{what}: token {batch.token} was handed out before"
        self.batches[batch.token] = batch
        self.model.claim(batch.token, keys)
        if abandon:
            wait_for_clock(self.clients[1], batch.expires_at.timestamp() + 0.01, "an abandoned batch's lease")
            self.model.expire(batch.token)

    def pick(self, data: st.DataObject) -> Any:
        return self.batches[data.draw(st.sampled_from(sorted(self.batches)), label="batch token")]

    @precondition(lambda self: bool(self.batches))
    @rule(data=st.data())
    def complete_batch(self, data: st.DataObject) -> None:
        batch = self.pick(data)
        what = f"batch {batch.token} ({sorted(batch.keys)}).complete()"
        holds = self.model.holds(batch.token)
        out = call(what, batch.complete)
        if holds:
            assert out.error is None, f"{what}: the batch holds every row, the completion failed: {out}"
            self.model.settle(batch.token, DONE)
        elif out.error is None:
            # Settled before (completed, failed or released by this batch): nothing left to mark.
            assert out.value == 0 or all(self.model.rows[k].state == DONE for k in batch.keys), \
                f"{what}: rows were taken over, yet the completion {out} (expected LeaseLost, nothing marked)"
        else:
            # Taken over: fenced, nothing marked (the check after the step reads every row).
            assert isinstance(out.error, LeaseLost), f"{what}: rows were taken over, expected LeaseLost: {out}"

    @precondition(lambda self: bool(self.batches))
    @rule(data=st.data(), give_back=st.booleans())
    def fail_or_release(self, data: st.DataObject, give_back: bool) -> None:
        batch = self.pick(data)
        what = f"batch {batch.token} ({sorted(batch.keys)}).{'release' if give_back else 'fail'}()"
        holds = self.model.holds(batch.token)
        out = call(what, batch.release if give_back else lambda: batch.fail("generated failure"))
        if holds:
            assert out.error is None, f"{what}: the batch holds every row: {out}"
            self.model.settle(batch.token, PENDING)
            return
        if out.error is not None:
            assert isinstance(out.error, LeaseLost), f"{what}: {out}"
            return
        for k in batch.keys:  # what it still held goes back; rows others hold stay theirs
            if self.model.rows[k].state == CLAIMED and self.model.rows[k].batch == batch.token:
                self.model.rows[k] = EventRow()

    @invariant()
    def matches_the_model(self) -> None:
        assert time.monotonic() - self.started < LONG / 2, "hang: an example ran longer than the live leases"
        rows = event_tables.rows(self.clients[1], self.table_name)
        states = {0: PENDING, 1: CLAIMED, 2: DONE}
        for k, r in self.model.rows.items():
            got = states.get(rows[k]["ct_state"], f"state {rows[k]['ct_state']}")
            want = r.state
            assert got == want, f"row {k}: {got} in the database, {want} in the model"
            if want == CLAIMED:
                assert rows[k]["ct_token"] == r.batch, \
                    f"row {k} is claimed under token {rows[k]['ct_token']}, the model's batch is {r.batch}"


class WorkListHistories(RuleBasedStateMachine):
    """Work lists: items in orders, allocated, finished and abandoned by two clients.

    No item of a later order is allocated while an earlier order has an unfinished item, the
    highest priority goes first within an order, finishes are fenced by the allocation's token,
    and allocate finds an item whenever one is allocatable.
    """

    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.namespace = f"h_{uuid.uuid4().hex[:12]}"
        self.clients = [ControlTable(self.url, namespace=self.namespace) for _ in range(2)]
        self.model = WorkListModel()
        self.name = "wl"
        self.allocated: dict[int, Any] = {}
        self.started = time.monotonic()

    def teardown(self) -> None:
        for ct in self.clients:
            ct.close()

    def lists(self, client: int) -> Any:
        return self.clients[client].worklist(self.name)

    @initialize(name=names("wl", "ordn\u00e9"))
    def choose_name(self, name: str) -> None:
        out = call(f"worklist({name!r})", lambda: self.clients[0].worklist(name))
        if out.error is None:
            self.name = name
        elif not (isinstance(out.error, ConfigurationError) and (too_long(name) or refusable(name))):
            raise AssertionError(f"worklist({name!r}): {out}")

    @rule(client=st.integers(0, 1), order=st.integers(1, 3), priority=st.integers(0, 2), count=st.integers(1, 3))
    def populate(self, client: int, order: int, priority: int, count: int) -> None:
        wl = self.lists(client)
        out = call("populate", lambda: wl.populate([{"n": i} for i in range(count)], order, priority=priority))
        assert out.error is None and out.value == count, f"populate({count}, order={order}): {out}"
        ids = [int(row["id"]) for row in wl.items_list(limit=10_000)]
        new = [i for i in ids if i not in self.model.items]
        assert len(new) == count, f"populate({count}) added items {new}"
        for i in new:
            self.model.items[i] = WorkItem(order, priority)

    @rule(client=st.integers(0, 1), owner=HOLDERS, abandon=st.booleans())
    def allocate(self, client: int, owner: str, abandon: bool) -> None:
        what = f"allocate(owner={owner!r}{', short lease' if abandon else ''})"
        allocatable = self.model.allocatable()
        current = self.model.current()
        out = call(what, lambda: self.lists(client).allocate(owner, lease=GHOST_TTL if abandon else LONG))
        if too_long(owner) or (isinstance(out.error, ConfigurationError) and refusable(owner)):
            assert isinstance(out.error, ConfigurationError), f"{what}: an over-long owner was accepted: {out}"
            return
        assert out.error is None, f"{what}: {out}"
        item = out.value
        if item is None:
            assert not allocatable, f"{what} found nothing although items {allocatable} of order {current} are free"
            return
        assert item.order == current, \
            f"{what} allocated item {item.id} of order {item.order} while order {current} is unfinished"
        assert item.id in allocatable, f"{what} allocated item {item.id}, not one of the free {allocatable}"
        best = max(self.model.items[i].priority for i in allocatable)
        assert item.priority == best, f"{what}: priority {item.priority} went before {best}"
        self.model.items[item.id] = WorkItem(item.order, item.priority, ACTIVE, item.token)
        self.allocated[item.token] = item
        if abandon:
            wait_for_clock(self.clients[1], item.expires_at.timestamp() + 0.01, "an abandoned item's lease")
            self.model.items[item.id].expired = True

    @precondition(lambda self: bool(self.allocated))
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "release"]))
    def finish(self, data: st.DataObject, how: str) -> None:
        item = self.allocated[data.draw(st.sampled_from(sorted(self.allocated)), label="item token")]
        what = f"item {item.id} (token {item.token}).{how}()"
        holds = self.model.holds(item.id, item.token)
        out = call(what, {"complete": item.complete, "fail": lambda: item.fail("generated"),
                          "release": item.release}[how])
        if holds:
            assert out.error is None, f"{what}: the item is held under its token: {out}"
            # A finished item keeps its token (finishing again under it is a retry, and succeeds).
            state = {"complete": DONE, "fail": ERROR, "release": NEW}[how]
            self.model.items[item.id] = WorkItem(item.order, item.priority, state,
                                                 None if state == NEW else item.token)
        elif out.error is not None:
            assert isinstance(out.error, LeaseLost), f"{what}: {out}"
        else:
            state = self.model.items[item.id].state
            assert how == "release" or (state == {"complete": DONE, "fail": ERROR}[how]
                                        and self.model.items[item.id].token == item.token), \
                f"{what} succeeded although the item is no longer held under its token (it is {state})"

    @invariant()
    def matches_the_model(self) -> None:
        assert time.monotonic() - self.started < LONG / 2, "hang: an example ran longer than the live leases"
        rows = {int(r["id"]): r for r in self.lists(1).items_list(limit=10_000)}
        assert set(rows) == set(self.model.items), f"items {sorted(rows)}, the model has {sorted(self.model.items)}"
        for i, item in self.model.items.items():
            assert rows[i]["state"] == item.state, f"item {i}: {rows[i]['state']} in the database, {item.state} " \
                                                   "in the model"
            if item.state == ACTIVE:
                assert int(rows[i]["token"]) == item.token, f"item {i} is held under token {rows[i]['token']}"


def run_machine(machine: type[RuleBasedStateMachine], url: str, kind: str) -> None:
    """Run ``machine`` against ``url`` within the budget and print how many examples it tried.

    The CI run is one hypothesis run of ``EXAMPLES`` examples; the longer run repeats runs of 25
    examples (each with its own seed) until ``CONTROLTABLE_HISTORY_MINUTES`` are up.
    """
    from hypothesis.stateful import run_state_machine_as_test

    counted = {"examples": 0, "steps": 0}

    class Counted(machine):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            counted["examples"] += 1
            super().__init__()

        def check_invariants(self, *args: Any, **kw: Any) -> None:
            counted["steps"] += 1
            super().check_invariants(*args, **kw)

    Counted.__name__ = machine.__name__
    Counted.url = url  # type: ignore[attr-defined]
    started = time.monotonic()
    try:
        if not MINUTES:
            run_state_machine_as_test(Counted, settings=settings_for(kind, EXAMPLES))
        while MINUTES and time.monotonic() - started < MINUTES * 60:
            run_state_machine_as_test(Counted, settings=settings_for(kind, 25))
    finally:
        print(f"\n{machine.__name__} on {kind}: {counted['examples']} examples ({counted['steps']} steps) "
              f"in {time.monotonic() - started:.0f} s")


def test_slot_histories(backend: str, backend_url: str) -> None:
    with ControlTable(backend_url, namespace="install") as ct:
        ct.install()
    run_machine(SlotHistories, backend_url, backend)


def test_event_histories(backend: str, backend_url: str) -> None:
    with ControlTable(backend_url, namespace="install") as ct:
        ct.install()
        table = event_tables.create(ct, 0)
        try:
            ct.events(table.name, key="id").prepare()
            EventHistories.table_name = table.name
            run_machine(EventHistories, backend_url, backend)
        finally:
            event_tables.drop(ct, table.name)


def test_worklist_histories(backend: str, backend_url: str) -> None:
    with ControlTable(backend_url, namespace="install") as ct:
        ct.install()
    run_machine(WorkListHistories, backend_url, backend)


# -- the multi-process variant: killed and frozen holders, recorded intervals checked independently ----
WORKERS = Path(__file__).with_name("slot_workers.py")

#: One fault: (seconds after the start, what, which process). "kill" and "stop" go to the short-lease
#: holders (``slot_workers.py hold``: their lease runs out while dead or frozen); "freeze" stops a
#: stress worker for a moment shorter than its lease, then lets it go on.
FAULTS = st.lists(st.tuples(st.floats(0.0, 3.0), st.sampled_from(["kill", "stop", "freeze"]), st.integers(0, 2)),
                  min_size=1, max_size=5)


@pytest.mark.slow
def test_histories_with_killed_and_frozen_processes(backend: str, backend_url: str, tmp_path: Path) -> None:
    """Stress workers (``slot_workers.py stress``) share ``cap1`` and ``cap3`` with short-lease holders
    that hypothesis kills (SIGKILL) or freezes (SIGSTOP, SIGCONT after their lease ran out), while it
    also freezes stress workers for moments within their lease. The recorded intervals must show no
    capacity, exclusivity or FIFO violation (``controltable.checks``), every token once, every stress
    worker done and nothing left held."""
    from hypothesis import given

    with ControlTable(backend_url, namespace="install") as ct:
        ct.install()
    tried = {"examples": 0}

    @settings(max_examples=int(os.environ.get("CONTROLTABLE_HISTORY_PROCESS_EXAMPLES", "3")), deadline=None,
              suppress_health_check=list(HealthCheck), database=None)
    @given(faults=FAULTS, holder_modes=st.lists(MODES, min_size=3, max_size=3))
    def run(faults: list[tuple[float, str, int]], holder_modes: list[str]) -> None:
        tried["examples"] += 1
        run_dir = tmp_path / f"run{tried['examples']}"
        run_dir.mkdir()
        namespace = f"h_{uuid.uuid4().hex[:12]}"
        ct = ControlTable(backend_url, namespace=namespace)
        capacities = {"cap1": 1, "cap3": 3}
        for name, cap in capacities.items():
            ct.set_capacity(name, cap)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            stress = []
            for i in range(3):
                err = open(run_dir / f"s{i}.err", "wb")  # noqa: SIM115 - closed with the process
                stress.append(subprocess.Popen([sys.executable, str(WORKERS), "stress", backend_url, namespace,
                                                f"s{i}", str(7000 + i), "6", str(run_dir / f"s{i}.jsonl")],
                                               stderr=err))
            holders = []
            for i, mode in enumerate(holder_modes):
                holders.append(subprocess.Popen([sys.executable, str(WORKERS), "hold", backend_url, namespace,
                                                 "cap1" if i % 2 == 0 else "cap3", f"h{i}", str(GHOST_TTL),
                                                 str(run_dir / f"h{i}.json"), mode]))
            procs = stress + holders
            started = time.monotonic()
            for at, what, which in sorted(faults):
                time.sleep(max(at - (time.monotonic() - started), 0))  # when to inject a fault, not a sync
                target = (stress if what == "freeze" else holders)[which]
                if target.poll() is not None:
                    continue
                if what == "kill":
                    target.send_signal(signal.SIGKILL)
                elif what == "stop":
                    target.send_signal(signal.SIGSTOP)  # frozen past its lease: its slot is taken over
                    wait_for_clock(ct, ct.now() + GHOST_TTL + 0.1, "a frozen holder's lease to run out")
                    target.send_signal(signal.SIGCONT)
                else:
                    target.send_signal(signal.SIGSTOP)  # a moment, well within the stress lease (30 s)
                    time.sleep(0.2)
                    target.send_signal(signal.SIGCONT)
            for i, p in enumerate(stress):
                code = p.wait(timeout=300)  # hang detector: the run takes a few seconds
                assert code == 0, f"stress worker s{i} failed: {(run_dir / f's{i}.err').read_text()[-2000:]}"
            intervals = [Interval(**json.loads(line)) for i in range(3)
                         for line in (run_dir / f"s{i}.jsonl").read_text().splitlines()]
            assert len(intervals) == 18
            assert violations(intervals, capacities) == []
            tokens: dict[str, list[int]] = {}
            for iv in intervals:
                tokens.setdefault(iv.resource, []).append(iv.token)
            for i in range(3):
                grant = run_dir / f"h{i}.json"
                if grant.exists() and grant.stat().st_size:
                    resource = "cap1" if i % 2 == 0 else "cap3"
                    tokens.setdefault(resource, []).append(json.loads(grant.read_text())["token"])
            for name, ts in tokens.items():
                assert len(ts) == len(set(ts)), f"{name}: a token was handed out twice: {sorted(ts)}"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                    p.wait(10)
            ct.close()

    try:
        run()
    finally:
        print(f"\nkilled and frozen processes on {backend}: {tried['examples']} examples")
