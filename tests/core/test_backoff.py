"""The event engine's back-off: the schedule of retry delays and the failure statement that applies it."""

from __future__ import annotations

import re

from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.dialects import postgresql

from controltable import dialects
from controltable.events import ERROR, PENDING, ClaimColumns, EventStatements, claim_columns
from controltable.events.decisions import backoff_schedule


def test_backoff_schedule_doubles_up_to_the_cap() -> None:
    assert backoff_schedule(5, 30.0, 3600.0) == [(1, 30.0), (2, 60.0), (3, 120.0), (4, 240.0)]
    assert backoff_schedule(50, 10.0, 25.0) == [(1, 10.0), (2, 20.0), (3, 25.0)], "stops at the cap"
    assert backoff_schedule(1, 10.0, 25.0) == [], "one attempt: straight to error"
    assert backoff_schedule(3, 0.0, 0.0) == [(2, 0.0)], "no back-off: one entry, every attempt before error"


def test_a_zero_or_tiny_backoff_with_many_attempts_never_overflows() -> None:
    """Found by the generated histories: backoff=0 with max_attempts above 1024 made every fail()
    raise OverflowError (0.0 * 2**1024), and no back-off must not mean max_backoff past the list."""
    assert backoff_schedule(10_000, 0.0, 60.0) == [(9_999, 0.0)]
    tiny = backoff_schedule(10_000, 5e-324, 60.0)
    assert tiny[-1][1] == 60.0 and len(tiny) < 1_100, "doubles in floats up to the cap, then stops"
    assert all(a[1] <= b[1] for a, b in zip(tiny, tiny[1:]))


def _sql(value: object) -> str:
    return str(value.compile(dialect=postgresql.dialect(),  # type: ignore[attr-defined]
                             compile_kwargs={"literal_binds": True}))


def test_fail_values_back_off_then_error_in_sql() -> None:
    """Below ``max_attempts`` a failed row goes back to pending after its back-off (the schedule's
    delay, the cap past its end); at ``max_attempts`` it goes to error, never to be claimed again."""
    t = Table("ev", MetaData(), Column("id", Integer, primary_key=True), Column("seq", Integer),
              Column("payload", String(20)), *claim_columns("ct_"))
    schedule = backoff_schedule(3, 10.0, 15.0)
    assert schedule == [(1, 10.0), (2, 15.0)]
    q = EventStatements(t, ClaimColumns(), "id", "seq", dialects.traits("postgresql"))
    values = q.fail_values("boom", max_attempts=3, schedule=schedule, max_backoff=15.0)
    assert set(values) == {"ct_state", "ct_owner", "ct_token", "ct_expires_at", "ct_available_at", "ct_error"}
    state = _sql(values["ct_state"])
    assert re.fullmatch(rf"CASE WHEN \(?ev\.ct_attempts >= 3\)? THEN {ERROR} ELSE {PENDING} END", state), state
    available = _sql(values["ct_available_at"])
    due = re.fullmatch(
        r"CASE WHEN \(?ev\.ct_attempts >= 3\)? THEN NULL"  # in error: no retry is due
        r" WHEN \(?ev\.ct_attempts <= 1\)? THEN (?P<now>.+) \+ 10\.0"
        r" WHEN \(?ev\.ct_attempts <= 2\)? THEN (?P=now) \+ 15\.0"
        r" ELSE (?P=now) \+ 15\.0 END", available)
    assert due is not None, available
    assert "statement_timestamp()" in due["now"], "the back-off counts from the database clock"
    assert (values["ct_owner"], values["ct_token"], values["ct_expires_at"]) == (None, None, None), "claim let go"
    assert values["ct_error"] == "boom"
