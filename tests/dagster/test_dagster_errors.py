"""Bad input gives a clear Dagster error at the step (a ``Failure`` naming the fix), not a SQLAlchemy traceback."""

from pathlib import Path
from typing import Any

import pytest
from dagster import (
    DagsterInstance,
    DagsterInvalidDefinitionError,
    Definitions,
    Failure,
    build_sensor_context,
    job,
    op,
)

from dagster_controltable import ControlTableResource, build_batch_op, pending_events_sensor


def _run_op(body: Any, resource: ControlTableResource) -> Any:
    @op(name="uses_controltable")
    def uses_controltable(controltable: ControlTableResource) -> None:
        body(controltable)

    @job
    def the_job() -> None:
        uses_controltable()

    result = the_job.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    assert failure.step_key == "uses_controltable"  # reported at the step, not at resource init
    return failure.step_failure_data.error


def _assert_clear(error: Any, *needles: str) -> None:
    assert error.cls_name == "Failure", error.to_string()
    for needle in needles:
        assert needle in error.message, error.message
    assert "Fix:" in error.message
    # The message itself is one readable paragraph, not a SQLAlchemy dump.
    assert "sqlalche.me" not in error.message and "Background on this error" not in error.message


def _slot(controltable: ControlTableResource) -> None:
    with controltable.slot("warehouse"):
        pass


def test_unreachable_url() -> None:
    error = _run_op(_slot, ControlTableResource(url="postgresql+psycopg://postgres@127.0.0.1:1/test"))
    _assert_clear(error, "unreachable", "check the URL", "`url` of ControlTableResource")


def test_sqlite_file_in_a_missing_directory() -> None:
    error = _run_op(_slot, ControlTableResource(url="sqlite:////nonexistent-dir/sub/controltable.db"))
    _assert_clear(error, "database missing", "directory exists", "`url`")


def test_url_that_is_not_a_url() -> None:
    error = _run_op(_slot, ControlTableResource(url="not a database url"))
    _assert_clear(error, "configuration error", "not a database URL")


def test_password_is_not_shown() -> None:
    error = _run_op(_slot, ControlTableResource(url="postgresql+psycopg://bob:s3cret@127.0.0.1:1/test"))
    assert "s3cret" not in error.to_string()


@pytest.mark.backends("sqlite", "postgres")
def test_control_tables_not_installed(backend_url: str, namespace: str) -> None:
    error = _run_op(_slot, ControlTableResource(url=backend_url, namespace=namespace, prefix="nope_"))
    _assert_clear(error, "not installed", "controltable init")


@pytest.mark.backends("sqlite", "postgres")
def test_unknown_slot_resource(ct: Any, resource: ControlTableResource) -> None:
    error = _run_op(_slot, resource)
    _assert_clear(error, "unknown controltable resource", "'warehouse'", "set_capacity")


@pytest.mark.backends("sqlite", "postgres")
def test_missing_event_table(ct: Any, resource: ControlTableResource, namespace: str) -> None:
    drain = build_batch_op(lambda context, batch: None, table=f"missing_{namespace}", key="id",
                           name="uses_controltable")

    @job
    def drain_job() -> None:
        drain()

    result = drain_job.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    (failure,) = result.get_step_failure_events()
    _assert_clear(failure.step_failure_data.error, "does not exist", f"missing_{namespace}")


@pytest.mark.backends("sqlite", "postgres")
def test_event_table_not_prepared_then_prepared(ct: Any, resource: ControlTableResource, make_events: Any) -> None:
    table = make_events(2, prepare=False)
    error = _run_op(lambda c: c.events(table, key="id"), resource)
    _assert_clear(error, "not prepared", "prepare=True")
    assert resource.events(table, key="id", prepare=True).pending_count() == 2
    resource.close()


@pytest.mark.backends("sqlite", "postgres")
def test_wrong_key_column(ct: Any, resource: ControlTableResource, make_events: Any) -> None:
    table = make_events(1)
    error = _run_op(lambda c: c.events(table, key="nope"), resource)
    _assert_clear(error, "'nope' is not a column")


def test_missing_dagster_resource_is_a_definition_error() -> None:
    drain = build_batch_op(lambda context, batch: None, table="events", key="id", name="drain")

    @job
    def drain_job() -> None:
        drain()

    with pytest.raises(DagsterInvalidDefinitionError, match="controltable"):
        Definitions(jobs=[drain_job]).resolve_all_job_defs()


@pytest.mark.backends("sqlite")
def test_sensor_on_missing_table_raises_failure(ct: Any, resource: ControlTableResource, namespace: str) -> None:
    @job
    def noop() -> None:
        pass

    sensor = pending_events_sensor(noop, table=f"missing_{namespace}", key="id")
    with DagsterInstance.ephemeral() as instance, build_sensor_context(
        instance=instance, resources={"controltable": resource}
    ) as ctx, pytest.raises(Failure, match="does not exist"):
        sensor(ctx)


def test_bad_wait_mode(tmp_path: Path) -> None:
    resource = ControlTableResource(url=f"sqlite:///{tmp_path / 'ct.db'}")
    resource.install()
    resource.set_capacity("warehouse", 1)
    with pytest.raises(Failure, match="wait="), resource.slot("warehouse", wait="sometimes"):
        pass
    resource.close()


def _postgres_url() -> str:
    import os

    url = os.environ.get("CONTROLTABLE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("needs PostgreSQL (CONTROLTABLE_TEST_POSTGRES_URL)")
    return url


def test_unknown_postgres_role_says_so() -> None:
    from sqlalchemy.engine import make_url

    url = make_url(_postgres_url()).set(username="ct_no_such_role")
    error = _run_op(_slot, ControlTableResource(url=url.render_as_string(hide_password=False)))
    _assert_clear(error, "ct_no_such_role")
    assert "not installed" not in error.message and "controltable init" not in error.message
    assert "login" in error.message.lower() or "authentication" in error.message.lower()


def test_missing_database_says_so() -> None:
    from sqlalchemy.engine import make_url

    url = make_url(_postgres_url()).set(database="ct_no_such_database")
    error = _run_op(_slot, ControlTableResource(url=url.render_as_string(hide_password=False)))
    _assert_clear(error, "ct_no_such_database")
    assert "not installed" not in error.message
    assert "database" in error.message.lower() and "missing" in error.message.lower()


def test_hung_server_fails_within_the_connect_timeout() -> None:
    """A server that accepts the TCP connection and never answers: the step fails within connect_timeout."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # the kernel completes the handshake; nobody ever answers the startup packet
    port = listener.getsockname()[1]
    try:
        resource = ControlTableResource(url=f"postgresql+psycopg://postgres@127.0.0.1:{port}/test", connect_timeout=2)
        started = time.monotonic()
        error = _run_op(_slot, resource)
        elapsed = time.monotonic() - started
    finally:
        listener.close()
    _assert_clear(error, "unreachable")
    assert elapsed < 30, f"hang: took {elapsed:.1f} s with connect_timeout=2 (15x)"
