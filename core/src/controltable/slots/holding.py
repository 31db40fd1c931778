"""Holding a lease: renewing it, releasing it, asking whether it is still held (what a ``Lease`` calls).

:class:`Holding` is the narrow interface a :class:`~.values.Lease` holds (:class:`~.values.LeaseEngine`):
it works through :class:`~.passes.GrantPasses` (a release removes the rows and passes the capacity
on in one transaction) and knows nothing of waiting or reports. Fenced on the lease's attempt: a
newer attempt re-tokens the same rows in place, and an older one's renewal or release must not
touch them.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

from sqlalchemy.engine import Connection

from .. import dialects
from ..clock import read_now
from ..errors import LeaseLost
from . import grants
from . import statements as sql
from .passes import GrantPasses, Locked, Presnapped
from .statements import EXPIRED, GRANTED, RELEASED, SUPERSEDED
from .values import Lease

#: What removing a request found: live grants removed, rows removed, the database time.
Removed = tuple[int, int, float]


class Holding:
    """Renew, release and check leases (the :class:`~.values.LeaseEngine` of every ``Lease`` granted here)."""

    def __init__(self, passes: GrantPasses, after_release: Callable[[Mapping[str, int]], None]) -> None:
        """``after_release`` runs after each release with the released resources (the history's
        occasional pruning, :meth:`.reports.HistoryPruner.maybe_prune`): never on the grant path."""
        self.passes = passes
        self.sql = passes.sql
        self.after_release = after_release
        self.db = passes.db

    def renew(self, lease: Lease, seconds: float) -> float:
        """Extend the lease's rows of its own attempt; a lapsed lease's rows go (its history closed
        ``expired``). When a newer attempt took the grant over, nothing is changed (the fence: see
        the module's docstring) and :class:`LeaseLost` says so."""
        n = len(lease.resources)
        taken_over = -2.0

        def fn(conn: Connection) -> float:
            now = read_now(conn)
            renewed = dialects.confirmed_count(
                conn, *self.sql.extend_lease(lease.request_key, lease.attempt, now, seconds), self.db.traits)
            if renewed != n:
                left = conn.execute(*self.sql.release_rows(lease.request_key, lease.attempt)).all()
                if not left and conn.execute(*self.sql.request_rows(lease.request_key)).first() is not None:
                    return taken_over  # the rows are another attempt's now
                if left:
                    conn.execute(*self.sql.delete_release_rows(lease.request_key, lease.attempt))
                    self.passes.end_grants(conn, list(left), now, EXPIRED)
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
        COMMIT is what removed them and the release succeeded. Other releases that find no rows:
        :meth:`_released_before`. Only the rows of the lease's own attempt are removed (the fence:
        see the module's docstring).
        """
        n = len(lease.resources)
        completed = 0

        def action(conn: Connection, res: Locked, now: float) -> Union[Removed, Presnapped[Removed]]:
            nonlocal completed
            if self.passes.snapshot_in_change(conn, res):
                # The rows, their removal, their history closed and the snapshot the grant pass
                # starts from, in one statement.
                both = conn.execute(*self.sql.remove_and_snapshot(lease.request_key, lease.attempt,
                                                             now, self.passes.heads(res))).all()
                rows: Sequence[Any] = [row for row in both if row.part != sql.SNAPSHOT_PART]
                live = sum(1 for row in rows if row.state == GRANTED and float(row.expires_at) >= now)
                completed += 1
                return Presnapped((live, len(rows), now), grants.after_removal(
                    [row for row in both if row.part == sql.SNAPSHOT_PART], rows))
            if dialects.writes_in_one_statement(conn, self.db.traits):
                # The rows, their removal and their history closed, in one statement.
                rows = conn.execute(*self.sql.remove_request(lease.request_key, lease.attempt, now)).all()
            elif dialects.deletes_returning(conn, self.db.traits):
                rows = conn.execute(*self.sql.delete_request_rows(lease.request_key, lease.attempt)).all()
                self.passes.end_grants(conn, list(rows), now)
            else:
                rows = conn.execute(*self.sql.release_rows(lease.request_key, lease.attempt)).all()
                if rows:
                    conn.execute(*self.sql.delete_release_rows(lease.request_key, lease.attempt))
                    self.passes.end_grants(conn, list(rows), now)
            live = sum(1 for row in rows if row.state == GRANTED and float(row.expires_at) >= now)
            completed += 1
            return live, len(rows), now

        live, found, now = self.passes.with_pass(set(lease.resources), action)
        self.after_release(lease.resources)
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
        rows = self.db.run(lambda c: c.execute(*self.sql.grant_outcomes(lease.tokens)).all())
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
        count = self.db.run(lambda c: c.scalar(*self.sql.held_count(lease.request_key, lease.attempt)))
        return int(count or 0) == len(lease.resources)
