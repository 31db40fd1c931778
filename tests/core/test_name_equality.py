"""Names a user can tell apart are never one name in the database, on every live backend.

MySQL/MariaDB's PAD SPACE collations (the control tables' ``utf8mb4_bin`` included) and SQL Server
compare ``'etl'`` and ``'etl '`` as equal: such names are refused on every backend, for every kind
of name. Case variants and Unicode normal forms (NFC, NFD) are compared by code point everywhere
and stay distinct names.
"""

from __future__ import annotations

import unicodedata
import uuid
from typing import Any, Callable

import pytest
from sqlalchemy import update

from controltable import ConfigurationError, ControlTable

#: Blanks at either end, ASCII and not (NO-BREAK SPACE, IDEOGRAPHIC SPACE).
EDGED = ["etl ", " etl", "etl\u00a0", "\u3000etl", "etl  "]


def _refused(call: Callable[[], Any]) -> None:
    with pytest.raises(ConfigurationError, match="whitespace"):
        call()


@pytest.mark.parametrize("name", EDGED)
def test_names_with_blanks_at_either_end_are_refused_for_every_kind(ct: Any, event_table: Callable[..., Any],
                                                                    backend_url: str, name: str) -> None:
    ct.set_capacity("db", 1)
    _refused(lambda: ct.set_capacity(name, 1))
    _refused(lambda: ct.try_acquire(name, holder="etl"))
    _refused(lambda: ct.try_acquire({"db": 1, name: 1}, holder="etl"))
    _refused(lambda: ct.try_acquire("db", holder=name))
    _refused(lambda: ct.acquire("db", holder=name, timeout=1))
    _refused(lambda: ct.release("db", name))
    _refused(lambda: ct.find_lease("db", name))
    _refused(lambda: ct.wait_info(name, "etl"))
    _refused(lambda: ct.status([name]))
    _refused(lambda: ct.delete_resource(name))
    _refused(lambda: ct.worklist(name))
    _refused(lambda: ct.worklist("wl").allocate(owner=name))
    ev = event_table(3)
    _refused(lambda: ev.claim(1, owner=name))
    _refused(lambda: ControlTable(backend_url, namespace=name))
    if name[0].isspace():  # a prefix may end with a blank ("etl " of "etl job"), never begin with one
        _refused(lambda: ct.release_holders(name))
    assert ev.claim(3, owner="etl").keys == [1, 2, 3]  # nothing was claimed by the refused owner
    assert [s.holders for s in ct.status(["db"])] == [[]]


def test_a_trailing_blank_never_makes_a_second_holder_of_one_slot(ct: Any) -> None:
    """The double holder: on MariaDB 'etl ' was given the lease (and token) 'etl' holds."""
    ct.set_capacity("db", 1)
    held = ct.try_acquire("db", holder="etl")
    assert held is not None
    _refused(lambda: ct.try_acquire("db", holder="etl "))
    (status,) = ct.status(["db"])
    assert [h.holder for h in status.holders] == ["etl"]
    assert status.waiters == []
    held.release()


def test_a_prefix_may_end_with_a_blank(ct: Any) -> None:
    ct.set_capacity("db", 3)
    for holder in ("etl job", "etl_job", "etl"):
        assert ct.try_acquire("db", holder=holder) is not None
    assert ct.release_holders("etl ") == 1
    assert sorted(h.holder for h in ct.status(["db"])[0].holders) == ["etl", "etl_job"]


def _forms() -> list[tuple[str, str]]:
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    return [("Etl", "etl"), ("ETL", "etl"), (nfc, nfd), ("Straße", "STRASSE"), ("ǅ", "ǆ")]


@pytest.mark.parametrize("first, second", _forms(), ids=["case", "upper", "nfc-nfd", "sharp-s", "titlecase"])
def test_case_and_normal_forms_are_distinct_names(ct: Any, first: str, second: str) -> None:
    # Two holders of a capacity-1 slot: the second is not the first (no shared lease).
    ct.set_capacity("db", 1)
    held = ct.try_acquire("db", holder=first)
    assert held is not None and held.holder == first
    assert ct.try_acquire("db", holder=second) is None
    (status,) = ct.status(["db"])
    assert [h.holder for h in status.holders] == [first]
    assert [w.holder for w in status.waiters] == [second]
    # Two resources: each has its own capacity, and each name comes back exactly as given.
    ct.set_capacity(first, 1)
    ct.set_capacity(second, 1)
    a = ct.try_acquire(first, holder="a")
    b = ct.try_acquire(second, holder="b")
    assert a is not None and b is not None, "one name's slot taken by the other's holder"
    assert {s.name for s in ct.status([first, second])} == {first, second}
    # Two work lists and two namespaces.
    ct.worklist(first).populate([{"n": 1}], order=1)
    assert ct.worklist(second).allocate(owner="w") is None
    assert ct.worklist(first).allocate(owner="w") is not None


def test_an_entry_stored_with_a_trailing_blank_never_breaks_the_grant_pass(ct: Any) -> None:
    """An entry stored before blanks were refused: where the database reads it as the resource
    without the blank (MySQL/MariaDB), the pass counts it there instead of raising KeyError."""
    ct.set_capacity("wh", 1)
    assert ct.try_acquire("wh", holder="h1") is not None
    q = ct.tables.request
    with ct.engine.begin() as conn:
        conn.execute(update(q).where(q.c.namespace == ct.namespace, q.c.holder == "h1").values(resource="wh "))
    pads = ct.engine.dialect.name == "mysql"  # PAD SPACE: 'wh ' is 'wh' there
    second = ct.try_acquire("wh", holder="h2")
    assert (second is None) == pads, "the stored entry is a holder of 'wh' exactly where the database says so"


def test_holder_ids_never_end_with_a_blank() -> None:
    from controltable.holders import holder_id
    from controltable.validation import check_name

    for parts in (("dag", "task "), (" dag", "task"), ("dag", "\u00a0"), ("x" * 300 + " ",)):
        check_name("holder", holder_id(*parts))
    assert holder_id("dag", "task ") != holder_id("dag", "task")


def test_namespaces_differing_in_case_are_two(backend_url: str) -> None:
    base = f"n_{uuid.uuid4().hex[:8]}"
    upper, lower = ControlTable(backend_url, namespace=base.upper()), ControlTable(backend_url, namespace=base)
    try:
        upper.install()
        upper.set_capacity("db", 1)
        lower.set_capacity("db", 1)
        assert upper.try_acquire("db", holder="a") is not None
        assert lower.try_acquire("db", holder="b") is not None
    finally:
        upper.close()
        lower.close()
