"""event_table_asset_check on real event tables: passes while the table keeps up, fails on age and error rows."""

from datetime import timedelta
from typing import Any

import pytest
from dagster import AssetCheckSeverity, AssetSelection, asset, materialize

from controltable import ConfigurationError
from controltable.events import EventStats
from dagster_controltable import ControlTableResource, event_table_asset_check, judge_event_table

pytestmark = pytest.mark.backends("sqlite", "postgres", "mysql")


@asset
def feed() -> None:
    """The asset the event table feeds (its body does not matter to the check)."""


def _evaluate(check: Any, resource: ControlTableResource) -> Any:
    """Materialize ``feed`` with its check; the check's one evaluation."""
    result = materialize([feed, check], resources={"controltable": resource})
    assert result.success  # a failed non-blocking check does not fail the run
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def test_passes_while_the_table_keeps_up(resource: ControlTableResource, timed_events: Any) -> None:
    table = timed_events([(1, 5.0), (2, 3.0)])
    check = event_table_asset_check(asset=feed, table=table, key="id", time_column="created_at",
                                    max_pending_age=timedelta(hours=1), max_error_rows=0)
    evaluation = _evaluate(check, resource)
    assert evaluation.passed, evaluation.description
    meta = {k: v.value for k, v in evaluation.metadata.items()}
    assert meta["controltable/pending"] == 2 and meta["controltable/error"] == 0
    assert meta["controltable/oldest_pending_key"] == "1"
    assert 0 <= meta["controltable/oldest_pending_age_seconds"] < 600
    assert meta["controltable/thresholds"] == {"max_pending_age_seconds": 3600.0, "max_error_rows": 0}


def test_fails_when_the_oldest_pending_event_is_too_old(resource: ControlTableResource, timed_events: Any) -> None:
    table = timed_events([(1, 7200.0), (2, 10.0)])
    check = event_table_asset_check(asset=feed, table=table, key="id", time_column="created_at",
                                    max_pending_age=1800, severity=AssetCheckSeverity.WARN)
    evaluation = _evaluate(check, resource)
    assert not evaluation.passed
    assert evaluation.severity == AssetCheckSeverity.WARN
    assert "id=1" in evaluation.description and "max_pending_age=1800" in evaluation.description
    assert 7000 < evaluation.metadata["controltable/oldest_pending_age_seconds"].value < 9000


def test_fails_on_error_rows_and_passes_after_retry(ct: Any, resource: ControlTableResource,
                                                    timed_events: Any) -> None:
    table = timed_events([(1, 1.0), (2, 1.0), (3, 1.0)])
    events = ct.events(table, key="id", max_attempts=1)
    batch = events.claim(2, owner="test")
    assert batch is not None
    batch.fail("boom")  # the last attempt: both rows go to the error state
    check = event_table_asset_check(asset=feed, table=table, key="id", max_error_rows=1)
    evaluation = _evaluate(check, resource)
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR
    assert "2 event(s) in error" in evaluation.description and "retry-errors" in evaluation.description
    assert evaluation.metadata["controltable/error"].value == 2
    assert events.retry_errors() == 2
    assert _evaluate(check, resource).passed


def test_the_check_alone_through_a_selection(resource: ControlTableResource, timed_events: Any) -> None:
    table = timed_events([(1, 4000.0)])
    check = event_table_asset_check(asset=feed, table=table, key="id", time_column="created_at",
                                    max_pending_age=60, name="feed_backlog")
    result = materialize([feed, check], resources={"controltable": resource},
                         selection=AssetSelection.checks(check))
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "feed_backlog" and not evaluation.passed
    assert not result.get_asset_materialization_events()  # only the check ran


def test_a_missing_table_fails_the_check_step_with_the_fix(ct: Any, resource: ControlTableResource) -> None:
    check = event_table_asset_check(asset=feed, table="no_such_events", key="id", max_error_rows=0)
    result = materialize([feed, check], resources={"controltable": resource}, raise_on_error=False,
                         selection=AssetSelection.checks(check))
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error = failure.step_failure_data.error
    assert error is not None and "does not exist" in error.message and "Fix:" in error.message


@pytest.mark.backends("sqlite")
def test_definition_errors(backend: str) -> None:
    with pytest.raises(ConfigurationError, match="could never fail"):
        event_table_asset_check(asset=feed, table="t", key="id")
    with pytest.raises(ConfigurationError, match="needs time_column"):
        event_table_asset_check(asset=feed, table="t", key="id", max_pending_age=60)
    with pytest.raises(ConfigurationError, match="max_error_rows"):
        event_table_asset_check(asset=feed, table="t", key="id", max_error_rows=-1)
    with pytest.raises(ConfigurationError, match="max_pending_age"):
        event_table_asset_check(asset=feed, table="t", key="id", time_column="c", max_pending_age=0)


def _stats(**kw: Any) -> EventStats:
    return EventStats("t", **kw)


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(("stats", "age", "errors", "passed"), [
    (_stats(pending=3, oldest_pending_key=1, oldest_pending_age=59.0), 60.0, None, True),
    (_stats(pending=3, oldest_pending_key=1, oldest_pending_age=61.0), 60.0, None, False),
    (_stats(pending=3, oldest_pending_key=1, oldest_pending_age=None), 60.0, None, False),  # age unknown
    (_stats(pending=0, done=5), 60.0, 0, True),  # nothing pending: no age to judge
    (_stats(error=1), None, 0, False),
    (_stats(error=1), None, 1, True),
    (_stats(pending=1, oldest_pending_key=1, oldest_pending_age=1e6, error=9), None, 10, True),  # age not asked
])
def test_judge_event_table(backend: str, stats: EventStats, age: Any, errors: Any, passed: bool) -> None:
    verdict = judge_event_table(stats, max_pending_age=age, max_error_rows=errors, key="id")
    assert verdict.passed is passed
    assert bool(verdict.problems) is not passed


def test_dagster_in_the_process_leaves_controltables_ddl_as_printed() -> None:
    """Dagster's storage module registers ``@compiles(Float, "mysql")`` for the whole process (every
    MySQL float becomes ``FLOAT(32)``); the control tables' DDL stays what ``core/sql/mysql.sql`` holds.
    Found when the main lane ran over xdist workers: a worker that had imported Dagster printed FLOAT(32)."""
    from pathlib import Path

    import dagster._core.storage.sql  # noqa: F401 - the hook, as any Dagster process has it
    from support.golden import golden_statements

    from controltable.sqlscript import control_ddl

    ddl = control_ddl("mysql")
    assert any("expires_at FLOAT(53)" in statement for statement in ddl)
    golden = (Path(__file__).resolve().parents[2] / "core" / "sql" / "mysql.sql").read_text(encoding="utf-8")
    held = set(golden_statements(golden))
    assert [s for s in ddl if s.rstrip(";") not in held and s not in held] == []
