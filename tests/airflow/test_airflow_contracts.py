"""The provider's contracts: one error table, stored trigger class paths, one name per argument.

* ``translate()`` picks the Airflow exception by the core's ``error_outcome(exc).family``, giving
  every core error class its exception;
* every trigger's ``serialize()`` names the class path of the module that defines it (Airflow stores
  it), which rebuilds the same trigger;
* the event table's schema is ``table_schema`` (trigger argument and batch handle key), only;
* an explicit slot ``priority`` wins over ``use_priority_weight``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import pytest

import controltable
from controltable import ControlTableError


def _all_error_classes() -> list[type[ControlTableError]]:
    """Every ControlTableError subclass the core (and its subpackages) defines."""
    for module in ("controltable.events.ddl", "controltable.worklist.values"):
        importlib.import_module(module)
    found: list[type[ControlTableError]] = []
    todo: list[type[ControlTableError]] = [ControlTableError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("controltable"):
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: (c.__module__, c.__name__))


#: The Airflow exception each core error class has always been translated to (by class name; the
#: event-table variant of NotInstalledError is checked separately).
EXPECTED = {
    "AcquireTimeout": "ControlTableAcquireTimeout",
    "LeaseLost": "ControlTableLeaseLost",
    "LeaseLostInterrupt": "ControlTableLeaseLost",
    "DatabaseUnavailableError": "ControlTableUnavailable",
    "DatabaseBusyError": "ControlTableUnavailable",
    "StatementTimeoutError": "ControlTableUnavailable",
    "TooManyConnectionsError": "ControlTableUnavailable",
    "ReadOnlyDatabaseError": "ControlTableUnavailable",
    "ConflictError": "ControlTableRetryableError",
    "AuthenticationError": "ControlTableConnectionError",
    "DatabaseMissingError": "ControlTableConnectionError",
    "ConfigurationError": "ControlTableConfigError",
    "PoolerError": "ControlTableConfigError",
    "NotInstalledError": "ControlTableConfigError",
    "UnknownResourceError": "ControlTableConfigError",
    "PermissionDeniedError": "ControlTableFailure",
    "UnexpectedDatabaseError": "ControlTableFailure",
    "ControlTableError": "ControlTableFailure",
    "TableBusyError": "ControlTableFailure",
    "WorkListBlocked": "ControlTableFailure",
}


def test_every_core_error_class_translates_as_before() -> None:
    from airflow_controltable import exceptions
    from airflow_controltable.utils import translate

    classes = _all_error_classes()
    assert {c.__name__ for c in classes} == set(EXPECTED), "a new core error class: add its expected exception"
    for cls in classes:
        error = cls("boom")
        translated = translate(error)
        expected = getattr(exceptions, EXPECTED[cls.__name__])
        assert type(translated) is expected, (cls.__name__, type(translated).__name__)
        assert str(translated) == str(error), "the core's message (which names the fix) is kept as is"
        assert controltable.error_outcome(error).family in {
            "lease_lost", "timeout", "unavailable", "conflict", "connection", "configuration", "failure",
        }
    event_table = translate(controltable.NotInstalledError("event table events is not prepared"))
    assert type(event_table) is exceptions.ControlTableConfigError


def test_every_family_has_its_airflow_exception() -> None:
    from airflow_controltable.utils import FAMILY_EXCEPTIONS
    from controltable.errors import FAMILIES

    assert set(FAMILY_EXCEPTIONS) == set(FAMILIES)


# -- stored trigger class paths --------------------------------------------------------------------------
def _resolve(classpath: str) -> Any:
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _triggers() -> list[Any]:
    from airflow_controltable.triggers.events import PendingEventsTrigger
    from airflow_controltable.triggers.slot import SlotTrigger

    return [
        SlotTrigger(resource="warehouse", holder="h", lease=60, waiter_ttl=60, priority=3),
        PendingEventsTrigger(table="events", key="id", table_schema="raw"),
    ]


@pytest.mark.parametrize("index", [0, 1], ids=["SlotTrigger", "PendingEventsTrigger"])
def test_serialized_trigger_classpaths_import_and_rebuild_the_same_trigger(index: int) -> None:
    trigger = _triggers()[index]
    classpath, kwargs = trigger.serialize()
    cls = _resolve(classpath)
    assert cls is type(trigger)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # what this version stores loads without warnings
        rebuilt = cls(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_trigger_classpaths_name_the_defining_modules() -> None:
    assert _triggers()[0].serialize()[0] == "airflow_controltable.triggers.slot.SlotTrigger"
    assert _triggers()[1].serialize()[0] == "airflow_controltable.triggers.events.PendingEventsTrigger"


def test_the_event_table_schema_has_one_name() -> None:
    from airflow_controltable.operators.events import ClaimBatchOperator
    from airflow_controltable.sensors.events import PendingEventsSensor
    from airflow_controltable.triggers.events import PendingEventsTrigger

    for build in (lambda: PendingEventsTrigger(table="events", key="id", schema="raw"),
                  lambda: ClaimBatchOperator(task_id="claim", table="events", key="id", schema="raw"),
                  lambda: PendingEventsSensor(task_id="wait", table="events", key="id", schema="raw")):
        with pytest.raises(TypeError, match="schema"):
            build()


def test_batch_handles_name_the_schema_table_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_controltable.operators.events import CompleteBatchOperator

    seen: list[Any] = []
    op = CompleteBatchOperator(task_id="done", handle=[])

    class Events:
        def batch(self, handle: Any) -> Any:
            return handle

    def events(table: str, key: str, order_by: Any, table_schema: Any) -> Events:
        seen.append(table_schema)
        return Events()

    monkeypatch.setattr(op, "_events", events)
    op._batch({"table": "events", "key": "id", "table_schema": "raw"})
    op._batch({"table": "events", "key": "id", "schema": "raw"})  # not a key of a handle: not read
    assert seen == ["raw", None]


# -- priority --------------------------------------------------------------------------------------------
def test_explicit_priority_wins_over_use_priority_weight() -> None:
    from airflow_controltable.operators.slots import SlotPythonOperator
    from airflow_controltable.sensors.slots import SlotSensor
    from airflow_controltable.utils import slot_priority

    op = SlotPythonOperator(task_id="t", resource="r", python_callable=lambda: None, priority_weight=7,
                            use_priority_weight=True)
    assert op.priority is None and op._slot_priority() == 7
    op = SlotPythonOperator(task_id="t2", resource="r", python_callable=lambda: None, priority_weight=7,
                            use_priority_weight=True, priority=-2)
    assert op._slot_priority() == -2
    assert SlotPythonOperator(task_id="t3", resource="r", python_callable=lambda: None)._slot_priority() == 0
    sensor = SlotSensor(task_id="s", resource="r", priority=5)
    assert sensor.priority == 5 and slot_priority(sensor, sensor.use_priority_weight, sensor.priority) == 5
    assert slot_priority(object(), False, None) == 0


def test_hold_slot_mixin_opens_its_table_through_uses_control_table() -> None:
    from airflow_controltable.hooks.controltable import UsesControlTable
    from airflow_controltable.operators.slots import HoldSlotMixin

    assert issubclass(HoldSlotMixin, UsesControlTable)
    assert not hasattr(HoldSlotMixin, "_slot_table")
