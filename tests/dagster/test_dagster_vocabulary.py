"""One vocabulary with the core and the Airflow provider: holder ids, the retry policy, argument names, defaults."""

import ast
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, Failure, build_sensor_context, job

import controltable.defaults as core_defaults
from controltable import (
    AcquireTimeout,
    AuthenticationError,
    ConfigurationError,
    ConflictError,
    DatabaseBusyError,
    DatabaseMissingError,
    DatabaseUnavailableError,
    LeaseLost,
    LeaseLostInterrupt,
    NotInstalledError,
    PermissionDeniedError,
    StatementTimeoutError,
    UnknownResourceError,
    error_outcome,
)
from controltable.errors import ERROR_TABLE, UnexpectedDatabaseError, is_retryable
from dagster_controltable import (
    ControlTableResource,
    StepIdentity,
    as_failure,
    build_batch_op,
    build_worklist_op,
    pending_events_sensor,
)
from dagster_controltable import defaults as dagster_defaults
from dagster_controltable.failures import DAGSTER_HINTS
from dagster_controltable.resource import head_retry_interval, retry_waiter_ttl, run_holder_prefix

PLUGIN = Path(__file__).resolve().parents[2] / "dagster_plugin" / "src" / "dagster_controltable"


# -- holder ids --------------------------------------------------------------------------------
@pytest.mark.backends("sqlite")
def test_long_step_keys_get_distinct_holders_that_keep_the_run_prefix(backend: str) -> None:
    base = "fan_out[" + "x" * 300
    a = StepIdentity("run-1", base + "a]", 0, None).holder
    b = StepIdentity("run-1", base + "b]", 0, None).holder
    assert a is not None and b is not None
    assert a != b  # truncating at 200 characters made these one holder sharing one lease
    assert len(a) <= core_defaults.NAME_LENGTH and len(b) <= core_defaults.NAME_LENGTH
    assert a.startswith(run_holder_prefix("run-1")) and b.startswith(run_holder_prefix("run-1"))
    assert StepIdentity("run-1", base + "a]", 3, None).holder == a  # stable across retries
    assert StepIdentity("run-1", "load", 0, None).holder == "dagster:run-1:load"
    assert StepIdentity("run-1", "lo\nad", 0, None).holder == "dagster:run-1:lo_ad"


def test_release_run_withdraws_steps_with_long_keys(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("wide", 2)
    holders = [str(StepIdentity("run-7", "s" * 250 + tail, 0, None).holder) for tail in ("a", "b")]
    for holder in holders:
        ct.acquire("wide", holder=holder, lease=60)
    (st,) = ct.status(["wide"])
    assert sorted(h.holder for h in st.holders) == sorted(holders)  # two holders, two slots
    assert resource.release_run("run-7") == 2
    (st,) = ct.status(["wide"])
    assert st.holders == []


# -- one retry policy ----------------------------------------------------------------------------
@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("exc", [
    AuthenticationError("login refused"), DatabaseMissingError("no db"), StatementTimeoutError("slow"),
    DatabaseBusyError("deadlocks"), DatabaseUnavailableError("down"), PermissionDeniedError("no grant"),
    NotInstalledError("no tables"), UnknownResourceError("no such resource"), AcquireTimeout("busy"),
    LeaseLost("expired"), ConflictError("clash"), ConfigurationError("bad"), UnexpectedDatabaseError("odd"),
    ValueError("not ours"),
])
def test_failure_allows_retries_exactly_when_the_core_says_retryable(backend: str, exc: BaseException) -> None:
    failure = as_failure(exc, "doing something", url="sqlite:///x.db", namespace="n")
    assert isinstance(failure, Failure)
    assert failure.allow_retries is is_retryable(exc)
    assert "Fix:" in (failure.description or "") and "doing something" in (failure.description or "")


@pytest.mark.backends("sqlite")
def test_failure_messages_stay(backend: str) -> None:
    assert (as_failure(AcquireTimeout("t"), "acquiring 'r'").description or "").startswith(
        "slot not granted in time while acquiring 'r': t. Fix: raise the timeout or the capacity")
    assert (as_failure(LeaseLost("x"), "holding 'r'").description or "").startswith("lease lost while holding 'r'")


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("exc", [
    AuthenticationError("login refused"), DatabaseUnavailableError("down"), NotInstalledError("no tables"),
    NotInstalledError("event table 'e' has no claim columns"), UnknownResourceError("no such resource"),
    AcquireTimeout("busy"), LeaseLostInterrupt("gone"), ConflictError("clash"), ValueError("not ours"),
])
def test_failure_takes_kind_fix_and_retries_from_the_core_table(backend: str, exc: BaseException) -> None:
    outcome = error_outcome(exc)
    failure = as_failure(exc, "doing something", url="sqlite:///x.db", namespace="n")
    description = failure.description or ""
    assert description.startswith(f"{outcome.kind} while doing something")
    assert f"Fix: {outcome.fix}" in description
    assert failure.allow_retries is outcome.retryable


@pytest.mark.backends("sqlite")
def test_dagster_hints_name_kinds_of_the_core_table_and_dagster_places(backend: str) -> None:
    kinds = {outcome.kind for _, _, outcome in ERROR_TABLE}
    assert set(DAGSTER_HINTS) <= kinds  # a kind renamed in the core must not silently drop its hint
    assert "ControlTableResource.install()" in (as_failure(NotInstalledError("none"), "x").description or "")
    assert "ControlTableResource.set_capacity" in (as_failure(UnknownResourceError("r"), "x").description or "")
    assert "interrupt_on_lease_loss=False" in (as_failure(LeaseLostInterrupt("l"), "x").description or "")


# -- one name per argument: table_schema, poll_interval, control_schema ---------------------------
def _drain_job(op_def: Any) -> Any:
    @job
    def drain_job() -> None:
        op_def()

    return drain_job


@pytest.mark.backends("sqlite")
def test_table_schema_names_the_event_tables_schema(ct: Any, resource: ControlTableResource,
                                                    make_events: Any) -> None:
    table = make_events(3)
    op_def = build_batch_op(lambda context, batch: None, table=table, key="id", name="drain", table_schema="main")
    result = _drain_job(op_def).execute_in_process(resources={"controltable": resource})
    assert result.success and result.output_for_node("drain")["events"] == 3
    events = resource.events(table, key="id", table_schema="main")
    assert events.qualified_name == f"main.{table}"
    sensor = pending_events_sensor(_drain_job(op_def), table=table, key="id", table_schema="main")
    with DagsterInstance.ephemeral() as instance, build_sensor_context(
            instance=instance, resources={"controltable": resource}) as ctx:
        assert sensor(ctx).skip_message.startswith("0 claimable")  # type: ignore[union-attr]


@pytest.mark.backends("sqlite")
def test_worklist_op_takes_poll_interval_and_owner(ct: Any, resource: ControlTableResource) -> None:
    wl = ct.worklist("renamed")
    wl.populate([{"n": 1}, {"n": 2}], order=1)
    owners: list[str] = []
    worker = build_worklist_op(lambda context, item: owners.append(item.owner), worklist="renamed",
                               name="worker", poll_interval=0.1, owner="shell:night", timeout=10)
    result = _drain_job(worker).execute_in_process(resources={"controltable": resource})
    assert result.success and owners == ["shell:night", "shell:night"]


# -- defaults: the core's imported, the integration's in one module -------------------------------
@pytest.mark.backends("sqlite")
def test_core_defaults_are_the_core_objects(backend: str) -> None:
    assert ControlTableResource.model_fields["default_lease"].default == core_defaults.DEFAULT_LEASE
    for name in ("DEFAULT_LEASE", "DEFAULT_MODE", "DEFAULT_WAITER_TTL", "NAME_LENGTH"):
        assert getattr(dagster_defaults, name) is getattr(core_defaults, name)
    assert retry_waiter_ttl(10.0) == 10.0 + dagster_defaults.RETRY_WAITER_TTL_MARGIN
    assert head_retry_interval(1000.0) == dagster_defaults.HEAD_RETRY_MAX


def _numeric_defaults(path: Path) -> list[str]:
    """Numeric literals used as argument defaults (other than 0 and 1) in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for default in [*args.defaults, *[d for d in args.kw_defaults if d is not None]]:
                if (isinstance(default, ast.Constant) and isinstance(default.value, (int, float))
                        and not isinstance(default.value, bool) and default.value not in (0, 1)):
                    found.append(f"{path.name}:{default.lineno} {node.name}(... = {default.value!r})")
    return found


@pytest.mark.backends("sqlite")
def test_no_default_number_is_typed_outside_the_defaults_module(backend: str) -> None:
    modules = [p for p in PLUGIN.glob("*.py") if p.name != "defaults.py"]
    assert modules
    assert [hit for p in modules for hit in _numeric_defaults(p)] == []


@pytest.mark.backends("sqlite")
def test_resource_control_schema_names_the_control_tables_schema(backend_url: str, namespace: str) -> None:
    first = ControlTableResource(url=backend_url, namespace=namespace, control_schema="main")
    second = ControlTableResource(url=backend_url, namespace=namespace, control_schema="main")
    assert first.install() >= 1
    first.set_capacity("shared_name", 2)
    assert [st.capacity for st in second.status(["shared_name"])] == [2]  # the same control tables
    assert first.control_table.schema == "main"
    assert "schema" not in ControlTableResource.model_fields  # one name: control_schema
    first.close()
    second.close()


@pytest.mark.backends("sqlite")
def test_batch_op_owner(ct: Any, resource: ControlTableResource, make_events: Any) -> None:
    table = make_events(2)
    owners: list[str] = []
    op_def = build_batch_op(lambda context, batch: owners.append(batch.owner), table=table, key="id",
                            name="drain", owner="shell:nightly")
    assert _drain_job(op_def).execute_in_process(resources={"controltable": resource}).success
    assert owners == ["shell:nightly"]


# -- one word per mode: "shared" in the step log, the metadata and the errors -----------------------
@pytest.mark.backends("sqlite")
def test_the_step_log_metadata_and_errors_say_shared(ct: Any, resource: ControlTableResource) -> None:
    from dagster import OpExecutionContext, op

    ct.set_capacity("warehouse", 2)

    @op
    def default_mode(context: OpExecutionContext, controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse"):
            pass

    @op
    def old_word(context: OpExecutionContext, controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse", mode="counting"):
            pass

    with DagsterInstance.ephemeral() as instance:
        ok = _drain_job(default_mode).execute_in_process(resources={"controltable": resource}, instance=instance)
        assert ok.success
        logs = [e.user_message for e in instance.all_logs(ok.run_id) if "controltable: holding" in e.user_message]
    assert logs and "(shared, 1 slot(s))" in logs[0], logs
    (meta,) = [m for e in ok.all_events if e.event_type_value == "STEP_OUTPUT"
               for k, m in e.event_specific_data.metadata.items() if k.startswith("controltable/slot/")]
    assert meta.value["mode"] == "shared"
    refused = _drain_job(old_word).execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    assert not refused.success
    (failure,) = refused.get_step_failure_events()
    text = str(failure.step_failure_data.error)
    assert "'shared'" in text and "got 'counting'" in text, text


@pytest.mark.backends("sqlite")
def test_the_events_sensor_starts_stopped_the_cleanup_sensor_running_and_the_page_says_so(backend: str) -> None:
    """A sensor that launches runs waits for the operator (as Dagster's own do); the cleanup sensor
    only withdraws what ended runs left, so it runs from the start. docs/dagster.md says how to start
    the events sensor, by the name the factory gives it."""
    from dagster import DefaultSensorStatus

    from dagster_controltable import controltable_run_cleanup_sensor

    @job
    def drain() -> None:
        pass

    events = pending_events_sensor(drain, table="events", key="id")
    assert events.default_status == DefaultSensorStatus.STOPPED
    assert controltable_run_cleanup_sensor().default_status == DefaultSensorStatus.RUNNING
    page = " ".join((PLUGIN.parents[2] / "docs" / "dagster.md").read_text().split())
    assert f"dagster sensor start {events.name} -f defs.py" in page and "comes up **stopped**" in page
