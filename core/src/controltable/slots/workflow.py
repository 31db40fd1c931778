"""The slot engine (``SlotEngine``): capacity, entering a queue, holding and releasing, reaping.

The engine is one object made of parts, each a module of this package: :mod:`.passes` (its base:
transactions, resource locks in name order, the grant pass), :mod:`.waiting` (``acquire`` and the
wait) and :mod:`.reports` (status, the grant history and its statistics). The parts are mixins
rather than objects the engine delegates to: they share the engine's state and call each other's
steps as ``self`` (a grant pass ends every change; a wait re-enters through ``_enqueue``), so no
method needs forwarding and every name stays where callers and tests reach it.

Statements come from :mod:`.statements`, the decisions of who is granted and when a waiter runs a
pass itself from :mod:`.grants`; the parts decide when each runs and in which transaction,
through the database layer (``Database.run``).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from sqlalchemy.engine import Connection

from .. import dialects, errorcodes, tracing
from ..clock import read_now
from ..defaults import DEFAULT_PICKUP
from ..errors import ConfigurationError, LeaseLost, UnknownResourceError
from ..validation import check_name
from . import grants
from . import statements as sql
from .grants import BEHIND_GRACE, REAP_GRACE  # noqa: F401 - re-exported (were defined here)
from .passes import (  # noqa: F401 - re-exported (were defined here)
    HEAD_READ_LIMIT,
    MIN_PICKUP,
    Presnapped,
    _Entered,
    _NeedLocks,
    _Outcome,
    _Request,
    _Res,
)
from .reports import Reports
from .statements import EXPIRED, GRANTED, RELEASED, SUPERSEDED
from .values import Lease, Rate
from .waiting import (  # noqa: F401 - re-exported (were defined here)
    DEADLINE_GRACE,
    HEAD_POLL_INTERVAL,
    HEAD_POSITIONS,
    HEAD_SETTLE,
    MAX_POLL_INTERVAL,
    POOLED_HEAD_POLL_INTERVAL,
    PUSH_POLL_INTERVAL,
    REFRESH_FRACTION,
    Waiting,
    _Peek,
)

#: What removing a request found: live grants removed, rows removed, the database time.
_Removed = tuple[int, int, float]


class SlotEngine(Waiting, Reports):
    """The SQL behind slots, for one namespace of one installation.

    Grants are made by whoever changes a queue: every transaction that releases, enqueues,
    withdraws, reaps or raises a capacity ends with :meth:`_grant_pass` under the resource row
    locks, which hands the freed capacity to the waiters at the head (decided by
    :func:`grants.decide`). Waiters only read their own entry and pick the grant up.
    """

    # -- capacity ----------------------------------------------------------------------------
    def set_capacity(self, name: str, capacity: int, policy: Optional[dict[str, Any]] = None) -> None:
        """Create or change a resource; ``policy`` may hold ``rate`` (a Rate or None) and ``aging``
        (seconds or None) to set - keys left out are kept."""
        policy = policy or {}

        def create(conn: Connection) -> None:
            if conn.execute(sql.lock_resource_name(self.t, self.ns, name)).first() is None:
                conn.execute(sql.create_resource(self.t, self.ns, name, capacity))

        try:
            self.db.run(create)
        except Exception as exc:  # a concurrent insert of the same name: the row exists now
            if not errorcodes.is_unique_violation(exc):
                raise

        def change(conn: Connection, res: dict[str, Any], now: float) -> None:
            values: dict[str, Any] = dict(capacity=capacity)
            if "rate" in policy:
                rate: Optional[Rate] = policy["rate"]
                values.update(rate_count=None if rate is None else rate.count,
                              rate_per=None if rate is None else rate.per)
                res[name].rate_count = values["rate_count"]
                res[name].rate_per = values["rate_per"]
            if "aging" in policy and policy["aging"] != res[name].aging:
                aging: Optional[float] = policy["aging"]
                values["aging"] = aging
                res[name].aging = aging
                # The queue order's key depends on aging: rewrite it for the waiters (under the lock).
                conn.execute(sql.reorder_queue(self.t, self.ns, name, aging))
            conn.execute(sql.change_resource(self.t, self.ns, name, values))
            res[name].capacity = capacity  # a larger capacity grants the waiters that now fit

        self._with_pass({name}, change)

    def delete_resource(self, name: str, *, force: bool = False) -> bool:
        def fn(conn: Connection) -> bool:
            if conn.execute(sql.lock_resource_name(self.t, self.ns, name)).first() is None:
                return False
            live = conn.scalar(sql.live_request(self.t, self.ns, name))
            if live is not None and not force:
                raise ConfigurationError(
                    f"resource {name!r} still has holders or waiters; release them, wait for their leases "
                    "to expire, or delete with force=True (--force)"
                )
            conn.execute(sql.delete_resource_requests(self.t, self.ns, name))
            conn.execute(sql.delete_history(self.t, self.ns, name))
            conn.execute(sql.delete_resource(self.t, self.ns, name))
            return True

        return self.db.run(fn)

    # -- entering a queue ----------------------------------------------------------------------
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
        req = self._request(resource, check_name("holder", holder), slots, mode, lease, waiter_ttl, pickup, attempt,
                            priority)
        peek = self._look(req, True)
        newer = attempt is not None and attempt != peek.recorded_attempt
        if peek.state == "granted" and peek.outcome is not None and not newer:
            return self._lease(req, peek.outcome)
        if peek.state == "waiting" and not peek.needs_pass and not newer:
            tracing.set(queue_position=max(peek.outcome.position.values(), default=0) if peek.outcome else None)
            return None
        outcome = self._enqueue(req)
        tracing.set(queue_position=max(outcome.position.values(), default=0))  # 0: granted at once
        return self._lease(req, outcome) if outcome.granted else None

    def _enqueue(self, req: _Request) -> _Outcome:
        """Enter the queue (or find our entry), then run a grant pass; picks the grant up if made."""
        names = sorted(req.parts)

        def action(conn: Connection, res: dict[str, Any], now: float) -> Union[_Entered, Presnapped[_Entered]]:
            for name, k in req.parts.items():
                if k > res[name].capacity:
                    raise ConfigurationError(
                        f"request for {k} slots of {name!r} can never be granted: its capacity is "
                        f"{res[name].capacity}; ask for fewer slots or raise the capacity"
                    )
            mine = list(conn.execute(*sql.holder_rows(self.t, self.ns, names, req.holder)).all())
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
                    gone = dialects.changed_rows(conn, sql.delete_expired_request(self.t, mine[0].request_key, now),
                                                 self.t.request.c.id, self.db.dialect_name)
                    if gone:
                        conn.execute(sql.delete_requests(self.t, mine[0].request_key))
                        self._end_grants(conn, mine, now, EXPIRED)
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
                            conn.execute(sql.retoken_grant(self.t, self.ns, name, tokens[name], now))
                            (row_of,) = [row for row in mine if row.resource == name]
                            conn.execute(*sql.record_grant(self.t, self.ns, name, new_token, row_of,
                                                          int(row_of.priority), now, enqueued_at=now))
                            tokens[name] = new_token
                            conn.execute(sql.write_last_token(self.t, self.ns, name, tokens[name]))
                    for row in mine:
                        conn.execute(sql.extend_grant_row(self.t, row.id, tokens[row.resource], now + req.lease,
                                                          req.lease, attempt))
                    granted_at = float(min(row.granted_at for row in mine))
                    return _Entered(key, attempt, ticket, done=_Outcome.grant(
                        key=key, tokens=tokens, parts=req.parts, expires_at=now + req.lease, granted_at=granted_at,
                        ticket=ticket, attempt=attempt))
                conn.execute(sql.requeue_waiter(self.t, key, now + req.ttl, attempt, req.pickup))
                return _Entered(key, attempt, ticket)
            key = req.key
            tickets = {}
            # One resource (the usual request): the INSERT also reads the snapshot the grant pass
            # starts from, where the dialect allows (one round trip fewer).
            together = len(names) == 1 and self._snapshot_in_change(conn, res)
            snapshot = None
            for name in names:  # one ticket per resource, from its counter, under its lock
                res[name].last_ticket += 1
                res[name].dirty = True  # written by the grant pass that follows
                tickets[name] = res[name].last_ticket
                waiter = dict(
                    resource=name, holder=req.holder, key=key, slots=req.parts[name], mode=req.mode,
                    lease=req.lease, now=now, ttl=req.ttl, ticket=tickets[name], attempt=attempt, pickup=req.pickup,
                    priority=req.priority, queue_key=grants.queue_key(req.priority, now, res[name].aging))
                if together:
                    heads = self._heads(res)
                    rows = conn.execute(*sql.enter_and_snapshot(self.t, self.ns, heads, **waiter)).all()
                    snapshot = grants.merge_entered([r for r in rows if r.part == sql.SNAPSHOT_PART],
                                                    [r for r in rows if r.part != sql.SNAPSHOT_PART], heads)
                else:
                    conn.execute(*sql.insert_waiter(self.t, self.ns, **waiter))
            entered = _Entered(key, attempt, min(tickets.values()))
            return entered if snapshot is None else Presnapped(entered, snapshot)

        def fn(conn: Connection, res: dict[str, Any], now: float) -> _Outcome:
            entered, snapshot = Presnapped.split(action(conn, res, now))
            if entered.done is not None:
                return entered.done
            made: dict[str, dict[str, int]] = {}
            self._grant_pass(conn, res, now, own=(entered.key, req.lease), granted=made, snapshot=snapshot)
            if entered.key in made:  # granted by this very pass: picked up in the same transaction
                tokens = made[entered.key]
                return _Outcome.grant(key=entered.key, tokens=tokens, parts=req.parts, expires_at=now + req.lease,
                                      granted_at=now, ticket=entered.ticket, attempt=entered.attempt)
            position = {}
            for name in names:
                head = conn.scalar(sql.head_ticket(self.t, self.ns, name))
                position[name] = max(entered.ticket - int(head if head is not None else entered.ticket), 0) + 1
            capacity = min(res[name].capacity for name in names)
            return _Outcome.wait(key=entered.key, expires_at=now + req.ttl, position=position, ticket=entered.ticket,
                                 attempt=entered.attempt, capacity=capacity,
                                 rate_limited=any(res[name].rate_count is not None for name in names))

        return self._in_lock_order(set(names), fn, deadline=req.deadline)

    # -- holding -----------------------------------------------------------------------------
    def renew(self, lease: Lease, seconds: float) -> float:
        """Extend the lease's rows of its own attempt; a lapsed lease's rows go (its history closed
        ``expired``). Fenced on the lease's attempt like :meth:`release`: when a newer attempt took
        the grant over (same request key, new tokens), nothing is changed and :class:`LeaseLost`
        says so: the newer attempt's rows are neither extended nor removed."""
        n = len(lease.resources)
        taken_over = -2.0

        def fn(conn: Connection) -> float:
            now = read_now(conn)
            renewed = dialects.confirmed_count(
                conn, *sql.extend_lease(self.t, lease.request_key, lease.attempt, now, seconds), self.db.dialect_name)
            if renewed != n:
                left = conn.execute(*sql.release_rows(self.t, lease.request_key, lease.attempt)).all()
                if not left and conn.execute(sql.request_rows(self.t, lease.request_key)).first() is not None:
                    return taken_over  # the rows are another attempt's now
                if left:
                    conn.execute(*sql.delete_release_rows(self.t, lease.request_key, lease.attempt))
                    self._end_grants(conn, list(left), now, EXPIRED)
                return -1.0
            return now + seconds

        expires = self.db.run(fn)
        if expires == taken_over:
            lease.released = True
            raise LeaseLost(
                f"lease of {lease.holder!r} on {lease._names()} was taken over by a newer attempt of the same holder "
                "(a new fencing token) before it was renewed; this attempt must stop: its work may overlap with "
                "the newer one's"
            )
        if expires < 0:
            lease.released = True
            raise LeaseLost(
                f"lease of {lease.holder!r} on {lease._names()} expired and was reaped before it was renewed; "
                "renew more often than the lease length or ask for a longer lease"
            )
        return expires

    def release(self, lease: Lease) -> None:
        """Delete the lease's rows and pass the capacity on; an expired lease is lost even if unreaped.

        Retry-safe: the request key was chosen by the client, so when a retry (after a COMMIT whose
        reply was lost) finds no rows while the lease could not yet have expired, the first
        COMMIT is what removed them and the release succeeded. Releasing a grant that was
        released already (another :class:`Lease` of the same grant) is a no-op; one that expired,
        was reaped or was taken over raises :class:`LeaseLost` saying which
        (:meth:`_released_before`). Only the rows of the lease's own attempt are removed: a newer
        attempt re-tokens the same rows in place, and an older attempt's release must not free it.
        """
        n = len(lease.resources)
        completed = 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> Union[_Removed, Presnapped[_Removed]]:
            nonlocal completed
            if self._snapshot_in_change(conn, res):
                # The rows, their removal, their history closed and the snapshot the grant pass
                # starts from, in one statement.
                both = conn.execute(*sql.remove_and_snapshot(self.t, self.ns, lease.request_key, lease.attempt,
                                                             now, self._heads(res))).all()
                rows: Sequence[Any] = [row for row in both if row.part != sql.SNAPSHOT_PART]
                live = sum(1 for row in rows if row.state == GRANTED and float(row.expires_at) >= now)
                completed += 1
                return Presnapped((live, len(rows), now), grants.after_removal(
                    [row for row in both if row.part == sql.SNAPSHOT_PART], rows))
            if dialects.writes_in_one_statement(conn, self.db.dialect_name):
                # The rows, their removal and their history closed, in one statement.
                rows = conn.execute(*sql.remove_request(self.t, self.ns, lease.request_key, lease.attempt, now)).all()
            elif dialects.deletes_returning(conn, self.db.dialect_name):
                rows = conn.execute(*sql.delete_request_rows(self.t, lease.request_key, lease.attempt)).all()
                self._end_grants(conn, list(rows), now)
            else:
                rows = conn.execute(*sql.release_rows(self.t, lease.request_key, lease.attempt)).all()
                if rows:
                    conn.execute(*sql.delete_release_rows(self.t, lease.request_key, lease.attempt))
                    self._end_grants(conn, list(rows), now)
            live = sum(1 for row in rows if row.state == GRANTED and float(row.expires_at) >= now)
            completed += 1
            return live, len(rows), now

        live, found, now = self._with_pass(set(lease.resources), action)
        self._maybe_prune(lease.resources)
        if live == n:
            return
        if found == 0 and completed > 1 and now < lease._expires_at:
            return  # our first COMMIT went through; its reply was lost
        if found:
            raise LeaseLost(
                f"lease of {lease.holder!r} on {lease._names()} had expired when it was released (at "
                f"{lease.expires_at.isoformat()}); work done after the expiry may have overlapped with another "
                "holder. Renew more often than the lease length or ask for a longer lease"
            )
        self._released_before(lease)

    def _released_before(self, lease: Lease) -> None:
        """A release that found none of the lease's rows: return if the grant was released already
        (a second release, e.g. of the same grant handed out twice by an idempotent ``try_acquire``,
        is a no-op), else raise :class:`LeaseLost` saying what ended it. The grant history says:
        each token's row is closed ``released`` by a release while the lease was live, ``expired``
        by a reap or a late release, ``superseded`` when a newer attempt took it over."""
        rows = self.db.run(lambda c: c.execute(sql.grant_outcomes(self.t, self.ns, lease.tokens)).all())
        outcomes = {row.resource: row.outcome for row in rows if lease.tokens.get(row.resource) == int(row.token)}
        if len(outcomes) == len(lease.tokens) and set(outcomes.values()) == {RELEASED}:
            return
        what = f"lease of {lease.holder!r} on {lease._names()}"
        if SUPERSEDED in outcomes.values():
            raise LeaseLost(
                f"{what} was taken over by a newer attempt of the same holder (a new fencing token) before it "
                "was released; this attempt's work may have overlapped with the newer one's"
            )
        if EXPIRED in outcomes.values():
            raise LeaseLost(
                f"{what} had already expired and been reaped when it was released; work done after the expiry "
                "may have overlapped with another holder. Renew more often than the lease length or ask for a "
                "longer lease"
            )
        raise LeaseLost(
            f"{what} was no longer held when it was released, and its grant history is gone (pruned after "
            "its retention, or the resource was deleted): whether it was released before or expired cannot "
            "be told. Release a lease once, and renew more often than the lease length"
        )

    def is_held(self, lease: Lease) -> bool:
        count = self.db.run(lambda c: c.scalar(sql.held_count(self.t, lease.request_key, lease.attempt)))
        return int(count or 0) == len(lease.resources)

    def release_holder(self, resource: str, holder: str) -> int:
        """Release whatever ``holder`` holds or waits for on ``resource`` (for shell scripts).

        Returns the requests removed: 0 means nothing was held. An unknown resource is an error.
        """
        def known(conn: Connection) -> None:
            if conn.scalar(sql.resource_name(self.t, self.ns, resource)) is None:
                raise UnknownResourceError(
                    f"resource {resource!r} does not exist in namespace {self.ns!r}; check the name and namespace"
                )

        return self._remove(sql.holder_match(self.t, self.ns, resource, holder), known)

    def release_holders(self, prefix: str) -> int:
        """Release every holder and withdraw every waiter whose holder id starts with ``prefix``.

        For run-status sensors and teardown of a whole scope (a DAG run, a Dagster run). The
        prefix is matched literally (``%`` and ``_`` are escaped). Returns the requests removed.
        """
        return self._remove(sql.prefix_match(self.t, self.ns, prefix))

    def reap(self) -> int:
        """Remove expired holders and waiters of this namespace, passing freed capacity on."""
        names = {row[0] for row in self.db.run(lambda c: c.execute(sql.expired_resources(self.t, self.ns)).all())}
        if not names:
            return 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> int:
            # Waiters anywhere in the queues (a pass only looks at the head); holders go in the pass.
            return dialects.changed_rows(conn, sql.delete_expired_waiters(self.t, self.ns, sorted(res), now),
                                         self.t.request.c.id, self.db.dialect_name)

        counted: list[int] = []

        def with_count(conn: Connection, res: dict[str, Any], now: float) -> int:
            n = action(conn, res, now)
            n += self._grant_pass(conn, res, now)
            counted.append(n)
            return n

        return self._in_lock_order(names, with_count)

    def iter_names(self) -> Iterator[str]:  # pragma: no cover - convenience
        for st in self.status():
            yield st.name
