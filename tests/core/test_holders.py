"""Holder ids built by ``controltable.holders.holder_id``: bounded, stable, distinct, prefix-keeping."""

from controltable.defaults import NAME_LENGTH
from controltable.holders import holder_id


def test_short_ids_are_joined_unchanged() -> None:
    assert holder_id("dagster", "run-1", "load") == "dagster:run-1:load"


def test_long_ids_are_bounded_and_distinct() -> None:
    a = holder_id("dagster", "run-1", "x" * 300 + "a")
    b = holder_id("dagster", "run-1", "x" * 300 + "b")
    assert len(a) == len(b) == NAME_LENGTH
    assert a != b  # truncation alone would make these one holder sharing one lease
    assert a.startswith("dagster:run-1:") and b.startswith("dagster:run-1:")


def test_ids_are_stable_across_calls() -> None:
    assert holder_id("airflow", "d" * 250, "r") == holder_id("airflow", "d" * 250, "r")


def test_control_characters_are_replaced() -> None:
    assert holder_id("a\nb", "c\x00") == "a_b:c_"
