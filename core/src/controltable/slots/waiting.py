"""Waiting for a slot: ``acquire``'s wait loop and ``try_acquire``'s one look, and withdrawing on the way out.

:class:`Waiter` works through :class:`~.entering.Entering` (entering the queue, looking at its own
entry, withdrawing) and sleeps on the wake-ups (:class:`~controltable.wakeups.Wakeups`); the leases
it hands out renew and release through the :class:`~.values.LeaseEngine` it was given. Nothing it
calls calls back into it. The rule for running a grant pass itself is decided by :func:`.grants.waiter_runs_pass`.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from typing import Mapping, Optional, Union

from .. import dialects, threads, tracing
from ..defaults import DEFAULT_PICKUP, WITHDRAW_GRACE, WITHDRAW_RETRY_INTERVAL
from ..errors import AcquireTimeout
from ..validation import check_name, check_poll_interval, check_seconds
from ..wakeups import Wakeups
from . import grants
from .entering import Entering, Peek, new_request
from .keys import head_key, holder_key
from .passes import Outcome, Request
from .values import Lease, LeaseEngine

log = logging.getLogger("controltable")

#: Without push: the longest a waiter sleeps between looks at its entry (far back in the queue).
MAX_POLL_INTERVAL = 2.0
#: Without push: how often the head of the queue looks (a grant waits for it to look).
HEAD_POLL_INTERVAL = 0.1
#: The same where pushes were expected but a pooler swallows them (the listener's self-probe
#: failed): each look there is a round trip through the pooler, so the head looks twice as often
#: to keep the handoff p50 within 100 ms until ``listen_url`` is set.
POOLED_HEAD_POLL_INTERVAL = 0.05
#: With push: the fallback look of a waiter near the head, for a notification that was lost
#: (it backs off from this to half the pickup deadline while nothing happens).
PUSH_POLL_INTERVAL = 1.0
#: With push, the waiters this near the head keep the fallback look (further back: refresh only).
HEAD_POSITIONS = 1
#: With push, a waiter told it became the head waits this long for its grant before it looks.
HEAD_SETTLE = 1.0
#: A waiter refreshes its queue entry after this fraction of ``waiter_ttl``.
REFRESH_FRACTION = 0.5
#: Seconds past an ``acquire`` timeout that its last transaction may still take (then the
#: caller hears :class:`AcquireTimeout`, or the database error that stopped it).
DEADLINE_GRACE = 1.0


class Waiter:
    """``acquire`` and ``try_acquire``: enter the queue, look at the own entry, sleep, give up cleanly."""

    def __init__(self, entering: Entering, wakeups: Wakeups, leases: LeaseEngine) -> None:
        self.entering = entering
        self.wakeups = wakeups
        #: What the leases handed out renew and release through.
        self.leases = leases
        #: Queue entries of failed acquires still to withdraw: (holder, request key) -> (request,
        #: give up at); retried by one background thread (see :meth:`_abandon`).
        self._withdrawals: dict[tuple[str, str], tuple[Request, float]] = {}
        self._withdrawals_lock = threading.Lock()
        self._withdrawer: Optional[threading.Thread] = None

    def try_acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: str,
        slots: int,
        mode: str,
        lease: float,
        waiter_ttl: float,
        attempt: Optional[int] = None,
        pickup: float = DEFAULT_PICKUP,
        priority: int = 0,
    ) -> Optional[Lease]:
        """One look that keeps the queue entry when not granted (for sensors and triggers).

        A waiter already queued reads its own entry without locks (and picks up a grant made on
        its behalf); only a new request, a new attempt or a head that must pass capacity on
        itself takes the resource locks.
        """
        req = new_request(resource, check_name("holder", holder), slots, mode, lease, waiter_ttl, pickup, attempt,
                            priority)
        peek = self.entering.look(req, True)
        newer = attempt is not None and attempt != peek.recorded_attempt
        if peek.state == "granted" and peek.outcome is not None and not newer:
            return self._lease(req, peek.outcome)
        if peek.state == "waiting" and not peek.needs_pass and not newer:
            tracing.set(queue_position=max(peek.outcome.position.values(), default=0) if peek.outcome else None)
            return None
        outcome = self.entering.enter(req)
        tracing.set(queue_position=max(outcome.position.values(), default=0))  # 0: granted at once
        return self._lease(req, outcome) if outcome.granted else None

    def acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str],
        slots: int,
        mode: str,
        timeout: Optional[float],
        lease: float,
        waiter_ttl: float,
        poll_interval: float,
        attempt: Optional[int] = None,
        pickup: float = DEFAULT_PICKUP,
        priority: int = 0,
    ) -> Lease:
        req = new_request(resource, holder, slots, mode, lease, waiter_ttl, pickup, attempt, priority)
        wait = check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        poll_interval = check_poll_interval("poll_interval", poll_interval)
        deadline = None if wait is None else time.monotonic() + wait
        if deadline is not None:
            req = dataclasses.replace(req, deadline=deadline + DEADLINE_GRACE)
        self._forget_withdrawal(req)  # this holder asks again: a pending withdrawal of its old entry is moot
        # Whatever makes this call fail (the database gone while it waits, an interrupt, a bug),
        # its queue entry must not stay behind to be granted and block the queue for a pickup
        # window: it is withdrawn on the way out, or, failing that, on reconnect.
        entered: list[str] = []
        try:
            return self._acquire(req, wait, deadline, poll_interval, entered)
        except AcquireTimeout as exc:
            if not getattr(exc, "withdrawn", False):
                self._abandon(req, entered[-1] if entered else req.key)
            raise
        except BaseException:
            self._abandon(req, entered[-1] if entered else req.key)
            raise

    def _acquire(self, req: Request, wait: Optional[float], deadline: Optional[float], poll_interval: float,
                 entered: list[str]) -> Lease:
        keys = [holder_key(min(req.parts), req.holder), head_key(min(req.parts), req.holder)]
        since = self.wakeups.mark(keys)
        outcome = self.entering.enter(req)
        tracing.set(queue_position=max(outcome.position.values(), default=0))  # 0: granted at once
        entered.append(outcome.request_key)
        refreshed = time.monotonic()
        delay = max(min(poll_interval, HEAD_POLL_INTERVAL), 0.01)
        peek: Optional[Peek] = None
        while not outcome.granted:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                granted = self.entering.withdraw(req)
                if granted is not None:  # granted between our last look and the withdrawal
                    outcome = granted
                    break
                where = ", ".join(f"{n!r} (about position {p})" for n, p in outcome.position.items())
                timeout = AcquireTimeout(
                    f"holder {req.holder!r} was not granted {req.parts!r} ({req.mode}) within {wait:g} s; "
                    f"it was waiting at {where}. Raise the timeout or the capacity, or see `controltable status`."
                )
                timeout.withdrawn = True  # type: ignore[attr-defined]
                raise timeout
            sleep = self._sleep_for(req, outcome, peek, refreshed, delay)
            delay = min(delay * 1.5, MAX_POLL_INTERVAL)
            if deadline is not None:
                sleep = min(sleep, max(deadline - now, 0.0))
            if self.wakeups.wait(keys, sleep, since):
                delay = HEAD_POLL_INTERVAL
                woke = self.wakeups.mark(keys)
                rate_limited = peek.rate_limited if peek is not None else outcome.rate_limited
                if woke[0] == since[0] and woke[1] == since[1] and not rate_limited:
                    # Only "you are the head now": in a busy queue the grant follows within
                    # moments, so wait a little for it and look once for both.
                    grant_only = (woke[0], woke[1])
                    self.wakeups.wait(keys[:1], HEAD_SETTLE, grant_only)
            since = self.wakeups.mark(keys)
            # Refresh on any look once most of the interval has passed (sleeps are jittered both ways).
            refresh = time.monotonic() - refreshed >= req.ttl * REFRESH_FRACTION * 0.6
            peek = self.entering.look(req, refresh)
            if refresh and peek.state == "waiting":
                refreshed = time.monotonic()
            if peek.state == "granted" and peek.outcome is not None:
                outcome = peek.outcome
            elif peek.state in ("gone", "lapsed", "mismatch") or peek.needs_pass:
                # Our entry expired, our grant lapsed, or we must pass the capacity on ourselves.
                outcome = self.entering.enter(req)
                entered.append(outcome.request_key)
                refreshed = time.monotonic()
            elif peek.outcome is not None:
                outcome = peek.outcome
        return self._lease(req, outcome)

    def _lease(self, req: Request, outcome: Outcome) -> Lease:
        return Lease(
            self.leases,
            resources=req.parts,
            mode=req.mode,
            holder=req.holder,
            request_key=outcome.request_key,
            tokens=outcome.tokens,
            lease_seconds=req.lease,
            expires_at=outcome.expires_at,
            granted_at=outcome.granted_at,
            ticket=outcome.ticket,
            attempt=outcome.attempt,
        )

    # -- giving up: the queue entry goes with the caller ------------------------------------
    def _abandon(self, req: Request, key: str) -> None:
        """Withdraw the entry of an ``acquire`` that failed, within :data:`WITHDRAW_GRACE` seconds.

        Removes the request's rows whatever their state (waiting, or granted and not yet handed
        to the caller, who will never see that lease) and passes the capacity on, like a
        release. If the database cannot be reached now, the withdrawal is queued and retried in
        the background by its request key (:meth:`_retry_withdrawals`).
        """
        try:
            self.entering.remove(req, key, deadline=time.monotonic() + WITHDRAW_GRACE)
        except Exception as exc:
            log.warning("controltable: could not withdraw the queue entry of %r on %s (%s); retrying on reconnect",
                        req.holder, sorted(req.parts), exc)
            self._defer_withdrawal(req, key)

    def _defer_withdrawal(self, req: Request, key: str) -> None:
        if dialects.on_asyncio(self.entering.db.engine.dialect):
            # An async driver's I/O runs on its event loop, never in a thread of ours (the statement
            # would fail with MissingGreenlet): the entry is left to expire, as documented for the
            # asyncio API (docs/async.md), and the next grant pass reaps it.
            log.info("controltable: the queue entry of %r on %s expires within %g s (no background "
                     "withdrawal under an async driver)", req.holder, sorted(req.parts), req.ttl + req.pickup)
            return
        # Past the entry's own expiry (plus a pickup window for a grant made meanwhile) it can no
        # longer hold anyone up: the next grant pass reaps it.
        give_up = time.monotonic() + req.ttl + req.pickup
        with self._withdrawals_lock:
            self._withdrawals[(req.holder, key)] = (req, give_up)
            if self._withdrawer is None or not self._withdrawer.is_alive():
                self._withdrawer = threading.Thread(target=self._retry_withdrawals, daemon=True,
                                                    name="controltable-withdraw")
                threads.start(self._withdrawer)

    def _forget_withdrawal(self, req: Request) -> None:
        """A new acquire of the same holder and resources: its old entry is its own again."""
        with self._withdrawals_lock:
            for pending in [k for k, (r, _) in self._withdrawals.items()
                            if r.holder == req.holder and r.parts == req.parts]:
                del self._withdrawals[pending]

    def _retry_withdrawals(self) -> None:
        """The background half of :meth:`_abandon`: one thread per engine while withdrawals are pending."""
        while True:
            time.sleep(WITHDRAW_RETRY_INTERVAL)
            with self._withdrawals_lock:
                pending = list(self._withdrawals.items())
                if not pending:
                    self._withdrawer = None
                    return
            for (holder, key), (req, give_up) in pending:
                done = time.monotonic() >= give_up
                if not done:
                    try:
                        self.entering.remove(req, key, deadline=time.monotonic() + WITHDRAW_GRACE)
                        done = True
                        log.info("controltable: withdrew the queue entry %r of %r (a failed acquire)", key, holder)
                    except Exception:
                        continue  # still unreachable: try again next round
                with self._withdrawals_lock:
                    if self._withdrawals.get((holder, key), (None, None))[0] is req:
                        del self._withdrawals[(holder, key)]

    def _sleep_for(
        self, req: Request, outcome: Outcome, peek: Optional[Peek], refreshed: float, delay: float
    ) -> float:
        """How long a waiter sleeps before it looks at its entry again.

        With push, it is woken when granted, so it looks only to refresh its entry (rarely), and
        - at the head of the queue - when the first holder's lease runs out or, as the fallback
        for a lost notification, every few seconds. Without push it polls its own entry: often
        at the head, rarely far back.
        """
        refresh_in = max(req.ttl * REFRESH_FRACTION - (time.monotonic() - refreshed), 0.01)
        position = max(outcome.position.values() or [1])
        head = position <= 1 if peek is None else peek.head
        expiry = None
        if peek is not None and peek.holder_expiry_in is not None:
            # The head looks when the first holder's lease (or a grant's pickup) runs out; those
            # behind it a little later (see ``grants.BEHIND_GRACE``), in case the head is dead too.
            behind = 0.0 if peek.head else grants.behind_grace(position)
            expiry = peek.holder_expiry_in + behind
        if self.wakeups.active:
            sleep = refresh_in
            if head or position <= HEAD_POSITIONS:
                sleep = min(sleep, max(delay * 10, PUSH_POLL_INTERVAL), req.pickup * 0.7)
        else:
            # Up to a capacity's worth of waiters can be granted by one release: pace by "rounds".
            capacity_rounds = 0.0 if head else max(position - 1, 0) / max(outcome.capacity, 1)
            head_poll = POOLED_HEAD_POLL_INTERVAL if self.wakeups.lost else HEAD_POLL_INTERVAL
            sleep = min(refresh_in, MAX_POLL_INTERVAL, req.ttl / 4.0, head_poll * (1 + capacity_rounds))
        if expiry is not None:
            sleep = min(sleep, expiry + 0.05)
        if peek is not None and peek.rate_opens_in is not None:
            # The rate window's next opening: no jitter early (that would only look too soon).
            return min(sleep * (0.75 + random.random() / 2), peek.rate_opens_in + 0.01 + 0.02 * random.random())
        return sleep * (0.75 + random.random() / 2)
