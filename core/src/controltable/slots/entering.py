"""Entering a queue and reading one's own entry: the transactions ``acquire`` and ``try_acquire`` are made of.

:class:`Entering` works through :class:`~.passes.GrantPasses` (entering and withdrawing end with a
grant pass under the resource locks) and is what a :class:`~.waiting.Waiter` calls; it knows
nothing of waiting, sleeping or leases. Reading one's own entry (:meth:`Entering.look`) takes no
lock and picks up a grant made on the caller's behalf; whether the caller must run a grant pass
itself is decided by :func:`.grants.waiter_runs_pass`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Union

from sqlalchemy.engine import Connection

from .. import dialects
from ..errors import ConfigurationError, LeaseLost
from ..holders import process_holder_id
from ..validation import check_attempt, check_mode, check_name, check_priority, check_seconds, normalize_request
from . import grants
from . import statements as sql
from .keys import request_key
from .passes import Entered, GrantPasses, Locked, Outcome, Presnapped, Request
from .statements import EXPIRED, GRANTED


@dataclass
class Peek:
    """What a waiter learns from reading its own entry (no locks)."""

    state: str  # "granted" (picked up now) | "waiting" | "gone" | "lapsed" | "mismatch"
    outcome: Optional[Outcome] = None
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


def new_request(
    resource: Union[str, Mapping[str, int]], holder: Optional[str], slots: int, mode: str, lease: float,
    waiter_ttl: float, pickup: float, attempt: Optional[int], priority: int = 0,
) -> Request:
    """What a caller asked for, checked, with its request key chosen before the first transaction
    (a retry after a lost COMMIT recognises its own entry by it); no holder: this process's id."""
    parts = normalize_request(resource, slots)
    mode = check_mode(mode)
    holder = check_name("holder", holder) if holder is not None else process_holder_id()
    lease_s = check_seconds("lease", lease)
    ttl = check_seconds("waiter_ttl", waiter_ttl)
    pick = check_seconds("pickup", pickup)
    att = check_attempt(attempt)
    assert lease_s is not None and ttl is not None and pick is not None
    return Request(parts, holder, mode, lease_s, ttl, pick, att, request_key(parts),
                   priority=check_priority(priority))


class Entering:
    """Entering a queue (or finding one's entry), withdrawing from it, and looking at one's own entry."""

    def __init__(self, passes: GrantPasses) -> None:
        self.passes = passes
        self.sql = passes.sql
        self.db = passes.db
        self.t = passes.t

    def remove(self, req: Request, key: str, deadline: Optional[float] = None) -> int:
        """Remove ``req``'s entry under request key ``key`` whatever its state, passing capacity on."""
        return self.passes.remove(self.sql.request_match(sorted(req.parts), req.holder, key), deadline=deadline)

    def enter(self, req: Request) -> Outcome:
        """Enter the queue (or find our entry), then run a grant pass; picks the grant up if made."""
        names = sorted(req.parts)

        def action(conn: Connection, res: Locked, now: float) -> Union[Entered, Presnapped[Entered]]:
            for name, k in req.parts.items():
                if k > res[name].capacity:
                    raise ConfigurationError(
                        f"request for {k} slots of {name!r} can never be granted: its capacity is "
                        f"{res[name].capacity}; ask for fewer slots or raise the capacity"
                    )
            mine = list(conn.execute(*self.sql.holder_rows(names, req.holder)).all())
            if mine:
                wanted = {(n, k, req.mode) for n, k in req.parts.items()}
                have = {(row.resource, int(row.slots), row.mode) for row in mine}
                keys = {row.request_key for row in mine}
                if have != wanted or len(keys) != 1:
                    raise ConfigurationError(
                        f"holder {req.holder!r} already holds or waits for {sorted(have)} which differs from this "
                        f"request {sorted(wanted)}; release it first or use another holder id"
                    )
                if any(float(row.expires_at) < now for row in mine):
                    # Our entry expired (a waiter that stopped looking) or our grant lapsed: it goes,
                    # and we queue again at the back. The delete re-checks: a pickup may have won.
                    stmt, values = self.sql.delete_expired_request(mine[0].request_key, now)
                    gone = dialects.changed_rows(conn, stmt, self.t.request.c.id, self.db.traits, values)
                    if gone:
                        conn.execute(*self.sql.delete_requests(mine[0].request_key))
                        self.passes.end_grants(conn, mine, now, EXPIRED)
                        mine = []
            attempt = req.attempt
            if mine:
                key = mine[0].request_key
                recorded = max((int(row.attempt) for row in mine if row.attempt is not None), default=None)
                if attempt is not None and recorded is not None and attempt < recorded:
                    raise LeaseLost(
                        f"holder {req.holder!r} on {', '.join(repr(n) for n in names)} was superseded by attempt "
                        f"{recorded}; attempt {attempt} must stop (a newer attempt of the same work runs)"
                    )
                newer = attempt is not None and (recorded is None or attempt > recorded)
                if not newer:
                    attempt = recorded
                ticket = min(int(row.ticket) for row in mine)
                if all(row.state == GRANTED for row in mine):
                    # Idempotent re-acquire (or the pickup of a grant made on our behalf): the same
                    # grant, extended; a newer attempt gets new tokens in place.
                    tokens = {row.resource: int(row.token) for row in mine}
                    if newer:
                        for name in names:
                            new_token = res[name].next_token()
                            conn.execute(*self.sql.retoken_grant(name, tokens[name], now))
                            (row_of,) = [row for row in mine if row.resource == name]
                            conn.execute(*self.sql.record_grant(name, new_token, row_of,
                                                          int(row_of.priority), now, enqueued_at=now))
                            tokens[name] = new_token
                            conn.execute(*self.sql.write_last_token(name, tokens[name]))
                    for row in mine:
                        conn.execute(*self.sql.extend_grant_row(row.id, tokens[row.resource], now + req.lease,
                                                          req.lease, attempt))
                    granted_at = float(min(row.granted_at for row in mine))
                    return Entered(key, attempt, ticket, done=Outcome.grant(
                        key=key, tokens=tokens, parts=req.parts, expires_at=now + req.lease, granted_at=granted_at,
                        ticket=ticket, attempt=attempt))
                conn.execute(*self.sql.requeue_waiter(key, now + req.ttl, attempt, req.pickup))
                return Entered(key, attempt, ticket)
            key = req.key
            tickets = {}
            # One resource (the usual request): the INSERT also reads the snapshot the grant pass
            # starts from, where the dialect allows (one round trip fewer).
            together = len(names) == 1 and self.passes.snapshot_in_change(conn, res)
            snapshot = None
            for name in names:  # one ticket per resource, from its counter, under its lock
                res[name].last_ticket += 1
                res[name].dirty = True  # written by the grant pass that follows
                tickets[name] = res[name].last_ticket
                waiter = sql.NewEntry(
                    resource=name, holder=req.holder, key=key, slots=req.parts[name], mode=req.mode,
                    lease=req.lease, now=now, ttl=req.ttl, ticket=tickets[name], attempt=attempt, pickup=req.pickup,
                    priority=req.priority, queue_key=grants.queue_key(req.priority, now, res[name].aging))
                if together:
                    heads = self.passes.heads(res)
                    rows = conn.execute(*self.sql.enter_and_snapshot(heads, **waiter)).all()
                    snapshot = grants.merge_entered([r for r in rows if r.part == sql.SNAPSHOT_PART],
                                                    [r for r in rows if r.part != sql.SNAPSHOT_PART], heads)
                else:
                    conn.execute(*self.sql.insert_waiter(**waiter))
            entered = Entered(key, attempt, min(tickets.values()))
            return entered if snapshot is None else Presnapped(entered, snapshot)

        def fn(conn: Connection, res: Locked, now: float) -> Outcome:
            entered, snapshot = Presnapped.split(action(conn, res, now))
            if entered.done is not None:
                return entered.done
            made: dict[str, dict[str, int]] = {}
            self.passes.grant_pass(conn, res, now, own=(entered.key, req.lease), granted=made, snapshot=snapshot)
            if entered.key in made:  # granted by this very pass: picked up in the same transaction
                tokens = made[entered.key]
                return Outcome.grant(key=entered.key, tokens=tokens, parts=req.parts, expires_at=now + req.lease,
                                      granted_at=now, ticket=entered.ticket, attempt=entered.attempt)
            position = {}
            for name in names:
                head = conn.scalar(*self.sql.head_ticket(name))
                position[name] = max(entered.ticket - int(head if head is not None else entered.ticket), 0) + 1
            capacity = min(res[name].capacity for name in names)
            return Outcome.wait(key=entered.key, expires_at=now + req.ttl, position=position, ticket=entered.ticket,
                                 attempt=entered.attempt, capacity=capacity,
                                 rate_limited=any(res[name].rate_count is not None for name in names))

        return self.passes.in_lock_order(set(names), fn, deadline=req.deadline)

    def withdraw(self, req: Request) -> Optional[Outcome]:
        """Leave the queue after a timeout; if we were granted meanwhile, take that grant."""
        def action(conn: Connection, res: Locked, now: float) -> Optional[Outcome]:
            rows = conn.execute(*self.sql.withdraw_rows(sorted(req.parts), req.holder)).all()
            if rows and all(row.state == GRANTED and float(row.expires_at) >= now for row in rows):
                key = rows[0].request_key
                conn.execute(*self.sql.extend_request(key, now + req.lease, req.lease))
                return Outcome.grant(key=key, tokens={row.resource: int(row.token) for row in rows}, parts=req.parts,
                                      expires_at=now + req.lease, granted_at=float(min(row.granted_at for row in rows)),
                                      ticket=min(int(row.ticket) for row in rows), attempt=rows[0].attempt)
            for key in {row.request_key for row in rows}:
                conn.execute(*self.sql.delete_requests(key))
            self.passes.end_grants(conn, list(rows), now, EXPIRED)  # a grant made for us that lapsed
            return None

        return self.passes.with_pass(set(req.parts), action)

    def look(self, req: Request, refresh: bool) -> Peek:
        return self.db.run(lambda conn: self._peek(conn, req, refresh), deadline=req.deadline)

    def _peek(self, conn: Connection, req: Request, refresh: bool) -> Peek:
        """Read our own entry by (namespace, resource, holder), no locks; pick up a grant made for us.

        Also reads, through the queue index, the head ticket of each of our queues and the
        holders' usage and first lease expiry, so that the head can time the reap of a holder
        whose lease runs out (or a grant that lapses) and run the grant pass itself.
        """
        rows = conn.execute(*self.sql.peek(sorted(req.parts), req.holder)).all()
        if not rows:
            return Peek("gone")
        now = float(rows[0].now)
        have = {(row.resource, int(row.slots), row.mode) for row in rows}
        recorded = max((int(row.attempt) for row in rows if row.attempt is not None), default=None)
        if have != {(n, k, req.mode) for n, k in req.parts.items()} or len({row.request_key for row in rows}) != 1:
            return Peek("mismatch", recorded_attempt=recorded)
        key = rows[0].request_key
        ticket = min(int(row.ticket) for row in rows)
        if any(float(row.expires_at) < now for row in rows):
            return Peek("lapsed", recorded_attempt=recorded)
        if all(row.state == GRANTED for row in rows):
            if req.attempt is not None and req.attempt != recorded:
                return Peek("granted", recorded_attempt=recorded)  # the caller re-enters for the attempt
            picked = dialects.confirmed_count(conn, *self.sql.extend_lease(key, recorded, now, req.lease),
                                              self.db.traits)
            if picked != len(rows):
                return Peek("lapsed", recorded_attempt=recorded)
            granted = Outcome.grant(key=key, tokens={row.resource: int(row.token) for row in rows}, parts=req.parts,
                                     expires_at=now + req.lease, granted_at=float(min(row.granted_at for row in rows)),
                                     ticket=ticket, attempt=recorded)
            return Peek("granted", granted, recorded_attempt=recorded)
        if refresh:
            updated = dialects.confirmed_count(conn, *self.sql.refresh_waiter(key, now, req.ttl, req.pickup),
                                               self.db.traits)
            if updated != len(rows):
                return Peek("lapsed", recorded_attempt=recorded)
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
                times = [float(t) for t in conn.execute(*self.sql.window_times(row.resource, now - per))
                         .scalars()]
                queue.budget = grants.rate_budget(count, per, times, now)
                wait = grants.opens_in(count, per, times, now)
                if wait is not None:
                    opens_in = wait if opens_in is None else max(opens_in, wait)
                elif position[row.resource] == 2 and queue.budget > 0 and grants.fits(queue, 1, "shared"):
                    # Room and budget, yet the head still waits: if the window opened a while ago
                    # and nobody ran a pass since (a dead head), this waiter runs it.
                    left_at = conn.scalar(*self.sql.last_left(row.resource, now - per))
                    rescue = grants.rate_rescue(None if left_at is None else float(left_at), per, now)
            fits_all = fits_all and grants.fits(queue, int(row.slots), row.mode)
        capacity = min(int(row.capacity) for row in rows)
        waiting = Outcome.wait(key=key, expires_at=now + req.ttl, position=position, ticket=ticket, attempt=recorded,
                                capacity=capacity)
        return Peek(
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
