"""The integrations' one wording of a waiter's place (``controltable.waiting_text``), without a database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any, Optional

import pytest

from controltable import Entry, ResourceStatus, WaitInfo
from controltable.defaults import AHEAD_SHOWN
from controltable.waiting_text import (
    ahead_text,
    awhere,
    describe_place,
    describe_queue,
    jsonable,
    names,
    names_list,
    where,
)


def _info(resource: str, state: str = "waiting", position: int = 1, ahead: Optional[list[str]] = None) -> WaitInfo:
    return WaitInfo(resource=resource, holder="me", state=state, position=position, ahead=ahead or [],
                    waiting_since=None, token=None)


def _entry(holder: str, state: str, expired: bool = False) -> Entry:
    return Entry(holder=holder, slots=1, mode="shared", state=state, since=None, expires_at=None, token=None,
                 position=0, expired=expired)


def _status(name: str, holders: list[Entry], waiters: list[Entry], capacity: int = 1) -> ResourceStatus:
    return ResourceStatus(name=name, capacity=capacity, used=len([h for h in holders if not h.expired]),
                          last_token=0, holders=holders, waiters=waiters)


def test_names_of_one_resource_and_of_a_mapping() -> None:
    assert names_list("wh") == ["wh"] and names("wh") == "'wh'"
    assert names_list({"a": 1, "b": 2}) == ["a", "b"] and names({"a": 1, "b": 2}) == "'a', 'b'"


@pytest.mark.parametrize(("ahead", "text"), [
    ([], "nobody"),
    (["a"], "a"),
    (["a", "b"], "a and b"),
    (["a", "b", "c"], "a, b and c"),
    (["a", "b", "c", "d", "e", "f", "g"], "a, b, c, d, e and 2 more"),
])
def test_ahead_text_names_the_first_few_and_counts_the_rest(ahead: list[str], text: str) -> None:
    assert AHEAD_SHOWN == 5
    assert ahead_text(ahead) == text


def test_describe_place_per_state_and_the_worst_position() -> None:
    assert describe_place({"r": None}, "q") == (None, "'r': not queued (q)")
    assert describe_place({"r": _info("r", "granted", 0)}, "q") == (None, "'r': granted, waiting for pickup (q)")
    assert describe_place({"r": _info("r", position=2, ahead=["a", "b"])}, "q") == (
        2, "'r': position 2 behind a and b (q)")
    worst, text = describe_place(
        {"r": _info("r", position=1, ahead=["a"]), "s": _info("s", position=3, ahead=["x", "y", "z"]),
         "t": _info("t", "granted", 0)}, "q")
    assert worst == 3
    assert text == ("'r': position 1 behind a; 's': position 3 behind x, y and z; "
                    "'t': granted, waiting for pickup (q)")


def test_describe_queue_leaves_expired_holders_and_waiters_out() -> None:
    busy = _status("r", [_entry("a", "granted"), _entry("old", "granted", expired=True)],
                   [_entry("w1", "waiting"), _entry("w2", "waiting"), _entry("gone", "waiting", expired=True)])
    idle = _status("s", [], [], capacity=3)
    assert describe_queue([busy, idle]) == ("'r' 1/1 used, held by a, 2 waiting; "
                                            "'s' 0/3 used, held by nobody, 0 waiting")
    assert describe_queue([]) == "no status"


class _Table:
    """What ``where`` reads of a ``ControlTable``; ``fail_on`` names the call that raises."""

    def __init__(self, fail_on: str = "") -> None:
        self.fail_on = fail_on

    def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        if self.fail_on == "wait_info":
            raise RuntimeError("database unreachable")
        return _info(resource, position=1, ahead=["a"])

    def status(self, resources: list[str]) -> list[ResourceStatus]:
        if self.fail_on == "status":
            raise RuntimeError("status timed out")
        return [_status(r, [_entry("a", "granted")], [_entry("me", "waiting")]) for r in resources]


class _AsyncTable:
    def __init__(self, table: _Table) -> None:
        self.table = table

    async def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        return self.table.wait_info(resource, holder)

    async def status(self, resources: list[str]) -> list[ResourceStatus]:
        return self.table.status(resources)


def _both(table: _Table, resource: Any) -> tuple[Optional[int], str]:
    """``where`` and ``awhere`` over the same table: they must agree."""
    sync = where(table, resource, "me")  # type: ignore[arg-type]
    async_ = asyncio.run(awhere(_AsyncTable(table), resource, "me"))  # type: ignore[arg-type]
    assert sync == async_
    return sync


def test_where_reads_the_place_and_the_queue() -> None:
    assert _both(_Table(), "r") == (1, "'r': position 1 behind a ('r' 1/1 used, held by a, 1 waiting)")


def test_where_shows_a_failure_to_read_and_never_raises() -> None:
    assert _both(_Table("wait_info"), "r") == (None, "position unavailable (database unreachable)")
    assert _both(_Table("status"), {"r": 1}) == (1, "'r': position 1 behind a (status unavailable (status timed out))")


def test_jsonable_keeps_json_values_and_turns_the_rest_into_text() -> None:
    assert [jsonable(v) for v in (1, 2.5, "k", True, None)] == [1, 2.5, "k", True, None]
    assert jsonable(("a", 1)) == "('a', 1)"


def test_importing_it_needs_no_asyncio_api() -> None:
    """The integrations import it in processes without greenlet: ``controltable.aio`` is only named for typing."""
    code = "import sys, controltable.waiting_text; print('controltable.aio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
