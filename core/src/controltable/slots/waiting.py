"""Waiting for a slot: ``acquire``, a waiter's look at its own entry, its sleep, and withdrawing on the way out.

:class:`Waiting` is a mixin of :class:`~controltable.slots.workflow.SlotEngine` over
:class:`~controltable.slots.passes.PassEngine`, not a class the engine delegates to: its methods
call the engine's transactions (``_enqueue``, ``_with_pass``, ``_remove``) as ``self``, and callers
and tests reach them on the engine (``engine._look``), as before the split. The rule for running a
grant pass itself is decided by :func:`.grants.waiter_runs_pass`.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from sqlalchemy.engine import Connection

from .. import dialects, tracing
from ..defaults import DEFAULT_PICKUP, WITHDRAW_GRACE, WITHDRAW_RETRY_INTERVAL
from ..errors import AcquireTimeout
from ..holders import process_holder_id
from ..validation import (
    check_attempt,
    check_mode,
    check_name,
    check_poll_interval,
    check_priority,
    check_seconds,
    normalize_request,
)
from . import grants
from . import statements as sql
from .keys import head_key, holder_key, request_key
from .passes import PassEngine, _Outcome, _Request
from .statements import EXPIRED, GRANTED
from .values import Lease

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


@dataclass
class _Peek:
    """What a waiter learns from reading its own entry (no locks)."""

    state: str  # "granted" (picked up now) | "waiting" | "gone" | "lapsed" | "mismatch"
    outcome: Optional[_Outcome] = None
    #: Whether this waiter should run a grant pass itself (a holder's lease ran out, or it fits).
    needs_pass: bool = False
    #: Seconds until the earliest holder's lease runs out (for the head of the queue).
    holder_expiry_in: Optional[float] = None
    head: bool = False
    recorded_attempt: Optional[int] = None
    #: Seconds until the rate window allows the next grant (when the head waits for it).
    rate_opens_in: Optional[float] = None
    #: One of the request's resources has a rate limit (a new head then looks at once: the grant
    #: it would wait for may be the rate window's, which nobody pushes).
    rate_limited: bool = False


class Waiting(PassEngine):
    """``acquire`` and its wait: enter the queue, look at the own entry, sleep, give up cleanly."""

    def __init__(self, runtime: Any) -> None:
        super().__init__(runtime)
        #: Queue entries of failed acquires still to withdraw: (holder, request key) -> (request,
        #: give up at); retried by one background thread (see :meth:`_abandon`).
        self._withdrawals: dict[tuple[str, str], tuple[_Request, float]] = {}
        self._withdrawals_lock = threading.Lock()
        self._withdrawer: Optional[threading.Thread] = None

    def _request(
        self, resource: Union[str, Mapping[str, int]], holder: Optional[str], slots: int, mode: str, lease: float,
        waiter_ttl: float, pickup: float, attempt: Optional[int], priority: int = 0,
    ) -> _Request:
        parts = normalize_request(resource, slots)
        mode = check_mode(mode)
        holder = check_name("holder", holder) if holder is not None else process_holder_id()
        lease_s = check_seconds("lease", lease)
        ttl = check_seconds("waiter_ttl", waiter_ttl)
        pick = check_seconds("pickup", pickup)
        att = check_attempt(attempt)
        assert lease_s is not None and ttl is not None and pick is not None
        return _Request(parts, holder, mode, lease_s, ttl, pick, att, request_key(parts),
                        priority=check_priority(priority))

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
        req = self._request(resource, holder, slots, mode, lease, waiter_ttl, pickup, attempt, priority)
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

    def _acquire(self, req: _Request, wait: Optional[float], deadline: Optional[float], poll_interval: float,
                 entered: list[str]) -> Lease:
        keys = [holder_key(min(req.parts), req.holder), head_key(min(req.parts), req.holder)]
        since = self.runtime.mark(keys)
        outcome = self._enqueue(req)
        tracing.set(queue_position=max(outcome.position.values(), default=0))  # 0: granted at once
        entered.append(outcome.request_key)
        refreshed = time.monotonic()
        delay = max(min(poll_interval, HEAD_POLL_INTERVAL), 0.01)
        peek: Optional[_Peek] = None
        while not outcome.granted:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                granted = self._withdraw(req)
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
            if self.runtime.wait(keys, sleep, since):
                delay = HEAD_POLL_INTERVAL
                woke = self.runtime.mark(keys)
                rate_limited = peek.rate_limited if peek is not None else outcome.rate_limited
                if woke[0] == since[0] and woke[1] == since[1] and not rate_limited:
                    # Only "you are the head now": in a busy queue the grant follows within
                    # moments, so wait a little for it and look once for both.
                    grant_only = (woke[0], woke[1])
                    self.runtime.wait(keys[:1], HEAD_SETTLE, grant_only)
            since = self.runtime.mark(keys)
            # Refresh on any look once most of the interval has passed (sleeps are jittered both ways).
            refresh = time.monotonic() - refreshed >= req.ttl * REFRESH_FRACTION * 0.6
            peek = self._look(req, refresh)
            if refresh and peek.state == "waiting":
                refreshed = time.monotonic()
            if peek.state == "granted" and peek.outcome is not None:
                outcome = peek.outcome
            elif peek.state in ("gone", "lapsed", "mismatch") or peek.needs_pass:
                # Our entry expired, our grant lapsed, or we must pass the capacity on ourselves.
                outcome = self._enqueue(req)
                entered.append(outcome.request_key)
                refreshed = time.monotonic()
            elif peek.outcome is not None:
                outcome = peek.outcome
        return self._lease(req, outcome)

    def _lease(self, req: _Request, outcome: _Outcome) -> Lease:
        return Lease(
            self,
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
    def _abandon(self, req: _Request, key: str) -> None:
        """Withdraw the entry of an ``acquire`` that failed, within :data:`WITHDRAW_GRACE` seconds.

        Removes the request's rows whatever their state (waiting, or granted and not yet handed
        to the caller, who will never see that lease) and passes the capacity on, like a
        release. If the database cannot be reached now, the withdrawal is queued and retried in
        the background by its request key (:meth:`_retry_withdrawals`).
        """
        try:
            self._remove(sql.request_match(self.t, self.ns, sorted(req.parts), req.holder, key),
                         deadline=time.monotonic() + WITHDRAW_GRACE)
        except Exception as exc:
            log.warning("controltable: could not withdraw the queue entry of %r on %s (%s); retrying on reconnect",
                        req.holder, sorted(req.parts), exc)
            self._defer_withdrawal(req, key)

    def _defer_withdrawal(self, req: _Request, key: str) -> None:
        # Past the entry's own expiry (plus a pickup window for a grant made meanwhile) it can no
        # longer hold anyone up: the next grant pass reaps it.
        give_up = time.monotonic() + req.ttl + req.pickup
        with self._withdrawals_lock:
            self._withdrawals[(req.holder, key)] = (req, give_up)
            if self._withdrawer is None or not self._withdrawer.is_alive():
                self._withdrawer = threading.Thread(target=self._retry_withdrawals, daemon=True,
                                                    name="controltable-withdraw")
                self._withdrawer.start()

    def _forget_withdrawal(self, req: _Request) -> None:
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
                        self._remove(sql.request_match(self.t, self.ns, sorted(req.parts), holder, key),
                                     deadline=time.monotonic() + WITHDRAW_GRACE)
                        done = True
                        log.info("controltable: withdrew the queue entry %r of %r (a failed acquire)", key, holder)
                    except Exception:
                        continue  # still unreachable: try again next round
                with self._withdrawals_lock:
                    if self._withdrawals.get((holder, key), (None, None))[0] is req:
                        del self._withdrawals[(holder, key)]

    def _withdraw(self, req: _Request) -> Optional[_Outcome]:
        """Leave the queue after a timeout; if we were granted meanwhile, take that grant."""
        def action(conn: Connection, res: dict[str, Any], now: float) -> Optional[_Outcome]:
            rows = conn.execute(sql.withdraw_rows(self.t, self.ns, sorted(req.parts), req.holder)).all()
            if rows and all(row.state == GRANTED and float(row.expires_at) >= now for row in rows):
                key = rows[0].request_key
                conn.execute(sql.extend_request(self.t, key, now + req.lease, req.lease))
                return _Outcome.grant(key=key, tokens={row.resource: int(row.token) for row in rows}, parts=req.parts,
                                      expires_at=now + req.lease, granted_at=float(min(row.granted_at for row in rows)),
                                      ticket=min(int(row.ticket) for row in rows), attempt=rows[0].attempt)
            for key in {row.request_key for row in rows}:
                conn.execute(sql.delete_requests(self.t, key))
            self._end_grants(conn, list(rows), now, EXPIRED)  # a grant made for us that lapsed
            return None

        return self._with_pass(set(req.parts), action)

    # -- sleeping and looking ------------------------------------------------------------------
    def _sleep_for(
        self, req: _Request, outcome: _Outcome, peek: Optional[_Peek], refreshed: float, delay: float
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
        if self.runtime.push_active:
            sleep = refresh_in
            if head or position <= HEAD_POSITIONS:
                sleep = min(sleep, max(delay * 10, PUSH_POLL_INTERVAL), req.pickup * 0.7)
        else:
            # Up to a capacity's worth of waiters can be granted by one release: pace by "rounds".
            capacity_rounds = 0.0 if head else max(position - 1, 0) / max(outcome.capacity, 1)
            head_poll = POOLED_HEAD_POLL_INTERVAL if self.runtime.wakeups.lost else HEAD_POLL_INTERVAL
            sleep = min(refresh_in, MAX_POLL_INTERVAL, req.ttl / 4.0, head_poll * (1 + capacity_rounds))
        if expiry is not None:
            sleep = min(sleep, expiry + 0.05)
        if peek is not None and peek.rate_opens_in is not None:
            # The rate window's next opening: no jitter early (that would only look too soon).
            return min(sleep * (0.75 + random.random() / 2), peek.rate_opens_in + 0.01 + 0.02 * random.random())
        return sleep * (0.75 + random.random() / 2)

    def _look(self, req: _Request, refresh: bool) -> _Peek:
        def fn(conn: Connection) -> _Peek:
            return self._peek(conn, req, refresh)

        return self.db.run(fn, deadline=req.deadline)

    def _peek(self, conn: Connection, req: _Request, refresh: bool) -> _Peek:
        """Read our own entry by (namespace, resource, holder), no locks; pick up a grant made for us.

        Also reads, through the queue index, the head ticket of each of our queues and the
        holders' usage and first lease expiry, so that the head can time the reap of a holder
        whose lease runs out (or a grant that lapses) and run the grant pass itself.
        """
        rows = conn.execute(*sql.peek(self.t, self.ns, sorted(req.parts), req.holder)).all()
        if not rows:
            return _Peek("gone")
        now = float(rows[0].now)
        have = {(row.resource, int(row.slots), row.mode) for row in rows}
        recorded = max((int(row.attempt) for row in rows if row.attempt is not None), default=None)
        if have != {(n, k, req.mode) for n, k in req.parts.items()} or len({row.request_key for row in rows}) != 1:
            return _Peek("mismatch", recorded_attempt=recorded)
        key = rows[0].request_key
        ticket = min(int(row.ticket) for row in rows)
        if any(float(row.expires_at) < now for row in rows):
            return _Peek("lapsed", recorded_attempt=recorded)
        if all(row.state == GRANTED for row in rows):
            if req.attempt is not None and req.attempt != recorded:
                return _Peek("granted", recorded_attempt=recorded)  # the caller re-enters for the attempt
            picked = dialects.confirmed_count(conn, *sql.extend_lease(self.t, key, recorded, now, req.lease),
                                              self.db.dialect_name)
            if picked != len(rows):
                return _Peek("lapsed", recorded_attempt=recorded)
            granted = _Outcome.grant(key=key, tokens={row.resource: int(row.token) for row in rows}, parts=req.parts,
                                     expires_at=now + req.lease, granted_at=float(min(row.granted_at for row in rows)),
                                     ticket=ticket, attempt=recorded)
            return _Peek("granted", granted, recorded_attempt=recorded)
        if refresh:
            updated = dialects.confirmed_count(conn, *sql.refresh_waiter(self.t, key, now, req.ttl, req.pickup),
                                               self.db.dialect_name)
            if updated != len(rows):
                return _Peek("lapsed", recorded_attempt=recorded)
        position = {}
        head = True
        fits_all = True
        soonest: Optional[float] = None
        opens_in: Optional[float] = None
        rescue = False
        for row in rows:
            first = int(row.head_ticket) if row.head_ticket is not None else int(row.ticket)
            position[row.resource] = max(int(row.ticket) - first, 0) + 1
            head = head and first == int(row.ticket)
            if row.hold_exp is not None:
                left = float(row.hold_exp) - now
                soonest = left if soonest is None else min(soonest, left)
            queue = grants.Queue(row.resource, int(row.capacity), int(row.used or 0), int(row.excl or 0) > 0)
            if row.rate_count is not None and row.rate_per is not None and position[row.resource] <= 2:
                # The head (and the one behind it, should the head be gone) times the rate window:
                # nobody else grants when it opens, so a waiter sleeps until then and runs the pass.
                count, per = int(row.rate_count), float(row.rate_per)
                times = [float(t) for t in conn.execute(sql.window_times(self.t, self.ns, row.resource, now - per))
                         .scalars()]
                queue.budget = grants.rate_budget(count, per, times, now)
                wait = grants.opens_in(count, per, times, now)
                if wait is not None:
                    opens_in = wait if opens_in is None else max(opens_in, wait)
                elif position[row.resource] == 2 and queue.budget > 0 and grants.fits(queue, 1, "shared"):
                    # Room and budget, yet the head still waits: if the window opened a while ago
                    # and nobody ran a pass since (a dead head), this waiter runs it.
                    left_at = conn.scalar(sql.last_left(self.t, self.ns, row.resource, now - per))
                    rescue = grants.rate_rescue(None if left_at is None else float(left_at), per, now)
            fits_all = fits_all and grants.fits(queue, int(row.slots), row.mode)
        capacity = min(int(row.capacity) for row in rows)
        waiting = _Outcome.wait(key=key, expires_at=now + req.ttl, position=position, ticket=ticket, attempt=recorded,
                                capacity=capacity)
        return _Peek(
            "waiting",
            waiting,
            needs_pass=grants.waiter_runs_pass(head=head, fits_all=fits_all, holder_expiry_in=soonest,
                                               position=max(position.values(), default=1), rescue=rescue),
            holder_expiry_in=None if soonest is None else max(soonest, 0.0),
            head=head,
            recorded_attempt=recorded,
            rate_opens_in=opens_in,
            rate_limited=any(row.rate_count is not None for row in rows),
        )
