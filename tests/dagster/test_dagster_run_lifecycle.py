"""Slots that end with the run, retry-mode handover, attempts, wait metadata and the namespace warning.

In-process (``execute_in_process`` and sensor contexts on an ephemeral instance) on every backend;
``test_dagster_live.py`` checks the same behaviour in a running deployment.
"""

import json
import threading
import time
from typing import Any, Callable

import pytest
from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    OpExecutionContext,
    RetryPolicy,
    RetryRequested,
    SkipReason,
    build_sensor_context,
    job,
    op,
)
from support.live import wait_for_file, wait_until

from dagster_controltable import ControlTableResource, controltable_run_cleanup_sensor, pending_events_sensor
from dagster_controltable.resource import head_retry_interval, retry_waiter_ttl

pytestmark = pytest.mark.backends("sqlite", "postgres", "mysql")


@op
def noop() -> None:
    pass


@job
def noop_job() -> None:
    noop()


def _run_in(instance: DagsterInstance, status: DagsterRunStatus, run_config: Any = None) -> str:
    from dagster._core.storage.dagster_run import DagsterRun

    run = instance.add_run(DagsterRun(job_name=noop_job.name, run_config=run_config or {}))
    if status == DagsterRunStatus.CANCELED:
        instance.report_run_canceled(run)
    elif status == DagsterRunStatus.FAILURE:
        instance.report_run_failed(run)
    elif status == DagsterRunStatus.STARTED:
        instance.handle_run_event(run.run_id, _started(run))
    return run.run_id


def _started(run: Any) -> Any:
    from dagster._core.events import DagsterEvent, DagsterEventType

    return DagsterEvent(event_type_value=DagsterEventType.RUN_START.value, job_name=run.job_name)


def _queue(ct: Any, resource: str) -> tuple[list[str], list[str]]:
    (st,) = ct.status([resource])
    return [h.holder for h in st.holders], [w.holder for w in st.waiters]


def test_cleanup_sensor_withdraws_cancelled_and_failed_runs_only(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    sensor = controltable_run_cleanup_sensor()
    with DagsterInstance.ephemeral() as instance:
        cancelled = _run_in(instance, DagsterRunStatus.CANCELED)
        failed = _run_in(instance, DagsterRunStatus.FAILURE)
        running = _run_in(instance, DagsterRunStatus.STARTED)
        ct.acquire("warehouse", holder=f"dagster:{cancelled}:load", lease=60)
        assert ct.try_acquire("warehouse", holder=f"dagster:{failed}:load", waiter_ttl=60) is None
        assert ct.try_acquire("warehouse", holder=f"dagster:{running}:load", waiter_ttl=60) is None
        with build_sensor_context(instance=instance, resources={"controltable": resource}) as ctx:
            result = sensor(ctx)
            assert isinstance(result, SkipReason)
            assert cancelled in (result.skip_message or "") and failed in (result.skip_message or "")
            # only the running run's request is left, and it gets the freed slot
            holders, waiters = _queue(ct, "warehouse")
            assert set(holders + waiters) == {f"dagster:{running}:load"}
            assert ct.try_acquire("warehouse", holder=f"dagster:{running}:load", waiter_ttl=60) is not None
            again = sensor(ctx)  # the cursor moved past these runs
            assert "no slot requests" in (again.skip_message or "")
    ct.release("warehouse", f"dagster:{running}:load")
    resource.close()


def test_cleanup_sensor_follows_a_namespace_from_run_config(ct: Any, backend_url: str, namespace: str) -> None:
    """A run whose config reset the namespace (only `url` given) is cleaned in "default" + its namespace."""
    other = f"{namespace}_x"
    from controltable import ControlTable

    with ControlTable(backend_url, namespace=other) as elsewhere, DagsterInstance.ephemeral() as instance:
        elsewhere.install()
        elsewhere.set_capacity("warehouse", 1)
        run_config = {"resources": {"controltable": {"config": {"url": backend_url, "namespace": other}}}}
        run_id = _run_in(instance, DagsterRunStatus.CANCELED, run_config)
        elsewhere.acquire("warehouse", holder=f"dagster:{run_id}:load", lease=60)
        resource = ControlTableResource(url=backend_url, namespace=namespace)
        with build_sensor_context(instance=instance, resources={"controltable": resource}) as ctx:
            controltable_run_cleanup_sensor()(ctx)
        assert _queue(elsewhere, "warehouse") == ([], [])
        resource.close()


def _retrying_job(seen: dict[str, Any], retry_interval: float, on_retry: Callable[[OpExecutionContext], None]) -> Any:
    """A job of one step that finds ``warehouse`` busy and retries (``wait="retry"``); its run id goes
    into ``seen``, and its second try only calls ``on_retry``."""

    @op
    def polite(context: OpExecutionContext, controltable: ControlTableResource) -> None:
        seen["run_id"] = context.run_id
        if context.retry_number >= 1:
            on_retry(context)
            return
        with controltable.slot("warehouse", wait="retry", retry_interval=retry_interval):
            pass

    @job
    def polite_job() -> None:
        polite()

    return polite_job


def test_teardown_withdraws_the_requests_of_a_cancelled_run(ct: Any, resource: ControlTableResource) -> None:
    """In-process executor: a step waiting between retries leaves the queue when the run is cancelled."""
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="shell-job")
    instance = DagsterInstance.ephemeral()

    def cancel(context: OpExecutionContext) -> None:  # the run is cancelled while the step waits between retries
        instance.report_run_canceling(instance.get_run_by_id(context.run_id))

    polite_job = _retrying_job({}, 0.2, cancel)
    try:
        polite_job.execute_in_process(resources={"controltable": resource}, instance=instance, raise_on_error=False)
        assert _queue(ct, "warehouse") == (["shell-job"], [])
    finally:
        blocker.release()
        instance.dispose()


def test_teardown_keeps_the_queue_place_of_a_running_run(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="shell-job")
    with DagsterInstance.ephemeral() as instance:
        run_id = _run_in(instance, DagsterRunStatus.STARTED)
        control = resource.control_table
        resource._run_id = run_id
        resource._requests.track("warehouse", f"dagster:{run_id}:load")
        assert control.try_acquire("warehouse", holder=f"dagster:{run_id}:load", waiter_ttl=60) is None
        assert resource.withdraw_if_run_ended(instance) == 0
        assert _queue(ct, "warehouse")[1] == [f"dagster:{run_id}:load"]
        instance.report_run_canceled(instance.get_run_by_id(run_id))
        assert resource.withdraw_if_run_ended(instance) == 1
        assert _queue(ct, "warehouse") == (["shell-job"], [])
    blocker.release()
    resource.close()


def test_retry_mode_at_the_head_retries_sooner(ct: Any, resource: ControlTableResource) -> None:
    assert head_retry_interval(30) == 3 and head_retry_interval(0.5) == 0.5 and head_retry_interval(300) == 5
    assert retry_waiter_ttl(30) == 60
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="shell-job")
    ahead = None
    try:
        with pytest.raises(RetryRequested) as first, resource.slot("warehouse", holder="step-a", wait="retry",
                                                                 retry_interval=30):
            pass
        assert first.value.seconds_to_wait == 3  # at the head: next try soon
        ahead = "step-a"
        with pytest.raises(RetryRequested) as second, resource.slot("warehouse", holder="step-b", wait="retry",
                                                                  retry_interval=30):
            pass
        assert second.value.seconds_to_wait == 30  # behind step-a: the whole interval
        info = ct.wait_info("warehouse", "step-b")
        assert info.position == 2 and list(info.ahead) == ["shell-job", "step-a"] or info.ahead[-1] == "step-a"
    finally:
        blocker.release()
        for who in ("step-a", "step-b"):
            ct.release("warehouse", who)
        resource.close()
    assert ahead == "step-a"


def test_a_granted_head_waiter_picks_up_at_its_next_retry(ct: Any, resource: ControlTableResource) -> None:
    """The grant made for a head waiter in retry mode waits for it (pickup = the retry interval)."""
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="shell-job")
    try:
        with pytest.raises(RetryRequested), resource.slot("warehouse", holder="step-a", wait="retry",
                                                          retry_interval=30):
            pass
        with pytest.raises(RetryRequested), resource.slot("warehouse", holder="step-a", wait="retry",
                                                          retry_interval=30):
            pass  # second try: at the head, so the request now carries a long pickup
    finally:
        blocker.release()  # grants step-a on its behalf
    time.sleep(1.0)
    assert ct.try_acquire("warehouse", holder="newcomer", waiter_ttl=10) is None  # the grant waits for step-a
    with resource.slot("warehouse", holder="step-a", wait="retry", retry_interval=30) as lease:
        assert lease.holder == "step-a"
    ct.release("warehouse", "newcomer")
    resource.close()


def test_each_retry_of_a_step_gets_a_higher_token(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    tokens: list[int] = []

    @op(retry_policy=RetryPolicy(max_retries=1))
    def flaky(context: OpExecutionContext, controltable: ControlTableResource) -> None:
        lease = controltable.acquire("warehouse")  # held across the retry (no release on failure)
        tokens.append(lease.token)
        if context.retry_number == 0:
            raise ValueError("first attempt fails")
        controltable.release("warehouse")

    @job
    def flaky_job() -> None:
        flaky()

    result = flaky_job.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    assert result.success
    assert len(tokens) == 2 and tokens[1] > tokens[0]
    assert _queue(ct, "warehouse") == ([], [])


def test_wait_goes_into_the_log_and_output_metadata(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="airflow:nightly:run1")

    @op
    def report(controltable: ControlTableResource) -> int:
        with controltable.slot("warehouse") as lease:
            return lease.token

    @job
    def report_job() -> None:
        report()

    def release_once_queued() -> None:  # let the step queue, wait a little, then free the slot
        wait_until(lambda: _queue(ct, "warehouse")[1], 60, "the step to queue", interval=0.05)
        time.sleep(0.6)  # not a synchronisation: a wait long enough for wait_seconds >= 0.5 below
        blocker.release()

    threading.Thread(target=release_once_queued, daemon=True).start()
    with DagsterInstance.ephemeral() as instance:
        result = report_job.execute_in_process(resources={"controltable": resource}, instance=instance)
        assert result.success
        (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        metadata = output.step_output_data.metadata
        assert metadata["controltable/queue_position"].value == 1
        assert metadata["controltable/wait_seconds"].value >= 0.5
        assert metadata["controltable/holder"].value == f"dagster:{result.run_id}:report"
        messages = [r.user_message for r in instance.all_logs(result.run_id)]
        assert any("position 1 behind airflow:nightly:run1" in m for m in messages), messages
        # The wait is its own pair of events on the run page: where it began, and when it ended.
        waited = [m for m in messages if m.startswith("controltable: waiting for 'warehouse'")]
        granted = [m for m in messages if m.startswith("controltable: granted 'warehouse' after waiting ")]
        assert len(waited) == 1 and len(granted) == 1, messages
        assert granted[0].endswith("from queue position 1")
        assert messages.index(waited[0]) < messages.index(granted[0])
        seconds = float(granted[0].split("after waiting ")[1].split(" s")[0])
        assert abs(seconds - metadata["controltable/wait_seconds"].value) < 0.06, (seconds, granted)


def test_run_config_overriding_url_keeps_the_definitions_other_fields(ct: Any, backend_url: str,
                                                                      namespace: str) -> None:
    """Run config giving only ``url`` keeps the namespace and prefix of the definitions (Dagster alone
    would reset them to their defaults); a field the run config gives wins; nothing warns."""
    from dagster import Definitions

    ct.set_capacity("warehouse", 1)

    @op
    def load(controltable: ControlTableResource) -> tuple[str, str, float]:
        assert controltable.control_table.namespace == controltable.namespace  # opened and checked
        return controltable.namespace, controltable.prefix, controltable.default_lease

    @job
    def load_job() -> None:
        load()

    defs = Definitions(jobs=[load_job], resources={"controltable": ControlTableResource(
        url=backend_url, namespace=namespace, default_lease=42.0)})

    def run(config: dict[str, Any]) -> tuple[Any, list[str]]:
        result = job_def.execute_in_process(instance=instance, run_config=config)
        return result.output_for_node("load"), [r.user_message for r in instance.all_logs(result.run_id)
                                                if r.level >= 30 and "controltable" in (r.user_message or "")]

    with DagsterInstance.ephemeral() as instance:
        job_def = defs.resolve_job_def("load_job")
        assert run({}) == ((namespace, "ct_", 42.0), [])
        only_url = {"resources": {"controltable": {"config": {"url": backend_url}}}}
        assert run(only_url) == ((namespace, "ct_", 42.0), [])
        chosen = {"resources": {"controltable": {"config": {"url": backend_url, "namespace": "elsewhere",
                                                            "default_lease": 7.0}}}}
        assert run(chosen) == (("elsewhere", "ct_", 7.0), [])


def test_events_sensor_skip_reason_says_what_the_backlog_waits_for(ct: Any, resource: ControlTableResource,
                                                                   make_events: Any) -> None:
    table = make_events(6)
    events = ct.events(table, key="id")
    claimed = events.claim(2, owner="worker-1", lease=60)
    failing = events.claim(1, owner="worker-2", lease=60)
    failing.fail("boom")  # backs off
    sensor = pending_events_sensor(noop_job, table=table, key="id", min_events=10)
    with DagsterInstance.ephemeral() as instance, build_sensor_context(
            instance=instance, resources={"controltable": resource}) as ctx:
        result = sensor(ctx)
    assert isinstance(result, SkipReason)
    message = result.skip_message or ""
    assert "fewer than min_events=10" in message
    assert "2 claimed by running batches" in message
    assert "backing off" in message or "in error" in message
    claimed.release()
    resource.close()


def test_run_worker_withdraws_a_retry_waiter_when_its_run_is_cancelled(ct: Any, resource: ControlTableResource) -> None:
    """In-process executor: while Dagster sleeps through the retry wait, the resource notices the cancel.

    Asserted by cause: when the next try began, the step's place was already gone, and the run's log
    says the watcher withdrew it between retries (it stands down once a try runs). A waiter ahead keeps
    the step off the head of the queue, so its retry wait is the 20 s asked for (ten of the watcher's 2 s status
    reads), not the head's 1-5 s, which a loaded machine's cancel and status reads once outlasted."""
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="shell-job")
    assert ct.try_acquire("warehouse", holder="ahead", waiter_ttl=600) is None
    instance = DagsterInstance.ephemeral()
    seen: dict[str, Any] = {}

    def step_queued() -> bool:
        return any(w.startswith("dagster:") for w in _queue(ct, "warehouse")[1])

    polite_job = _retrying_job(seen, 20, lambda context: seen.update(queued_at_retry=step_queued()))
    runner = threading.Thread(target=lambda: polite_job.execute_in_process(
        resources={"controltable": resource}, instance=instance, raise_on_error=False))
    runner.start()
    try:
        wait_until(lambda: step_queued() and "run_id" in seen, 60, "the step to queue", interval=0.05)
        instance.report_run_canceling(instance.get_run_by_id(seen["run_id"]))
        wait_until(lambda: not step_queued(), 120, "the waiter to be withdrawn (hang detector)", interval=0.05)
        runner.join(timeout=300)
        assert not runner.is_alive(), "hang: the run did not end within 300 s"
        assert seen.get("queued_at_retry") is False, f"the place was still queued when the next try began: {seen}"
        messages = [r.user_message for r in instance.all_logs(seen["run_id"])]
        assert any("withdrew 1 slot request(s) between retries" in m for m in messages), messages
    finally:
        blocker.release()
        instance.dispose()


@pytest.mark.backends("postgres", "sqlite")
def test_retry_watcher_withdraws_a_place_within_moments_of_the_cancel(ct: Any, backend_url: str, namespace: str,
                                                                      tmp_path: Any) -> None:
    """Multiprocess executor between retries: no step process exists, the detached watcher withdraws
    the place as soon as the run is canceling; a next try stops the watcher before touching its place."""
    from dagster_controltable import retry_watch

    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="shell-job", lease=60)
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        run_id = _run_in(instance, DagsterRunStatus.STARTED)
        holder = f"dagster:{run_id}:load"
        assert ct.try_acquire("warehouse", holder=holder, waiter_ttl=120) is None

        from dagster._serdes import serialize_value

        settings = {"url": backend_url, "namespace": namespace, "schema": None, "prefix": "ct_", "run_id": run_id,
                    "holder": holder, "resources": ["warehouse"], "instance_ref": serialize_value(instance.get_ref())}
        assert retry_watch.ensure_watcher(settings, holder, time.time() + 60)
        assert not retry_watch.ensure_watcher(settings, holder, time.time() + 90)  # one watcher, its deadline pushed
        ack = retry_watch.ack_file(holder)
        wait_until(lambda: "ready" in wait_for_file(ack, 60, "the watcher's ack file", json.loads), 60,
                   "the watcher to say it is ready (its ack file)")
        # A next try pauses the watcher (acknowledged) before it touches its place: nothing is withdrawn
        # under it, even when the run is cancelled meanwhile; the watcher process stays for later tries.
        watcher_pid = json.loads(retry_watch.state_file(holder).read_text())["pid"]
        retry_watch.pause_watcher(holder)
        # Acknowledged, not timed out and stopped: the ack file carries the pause's number, and the same
        # watcher process is alive and paused (a pause that timed out would have stopped it).
        paused = json.loads(retry_watch.state_file(holder).read_text())["paused"]
        assert json.loads(ack.read_text()).get("paused") == paused, "the pause was not acknowledged"
        assert json.loads(retry_watch.state_file(holder).read_text())["pid"] == watcher_pid
        assert retry_watch._alive(watcher_pid)
        instance.report_run_canceling(instance.get_run_by_id(run_id))
        # The paused watcher has ticked (rewritten its ack) twice since the cancel: it had a full tick
        # in which an unpaused watcher would have withdrawn the place, and it did not.
        ticks: set[tuple[int, int]] = set()

        def ack_rewritten() -> bool:
            try:
                st = ack.stat()
            except FileNotFoundError:
                return False
            ticks.add((st.st_ino, st.st_mtime_ns))
            return len(ticks) >= 3

        wait_until(ack_rewritten, 60, "the paused watcher to tick after the cancel", interval=0.02)
        assert _queue(ct, "warehouse") == (["shell-job"], [holder])
        # The try raised RetryRequested again: the same watcher resumes, and withdraws the place (no
        # other party releases it). How soon is not asserted: 60 s is the hang detector (the goal is a tick).
        assert not retry_watch.ensure_watcher(settings, holder, time.time() + 60)
        wait_until(lambda: _queue(ct, "warehouse") == (["shell-job"], []), 60,
                   "the resumed watcher to withdraw the cancelled run's place", interval=0.05)
        wait_until(lambda: not retry_watch.state_file(holder).exists(), 60,
                   "the watcher to end after the withdrawal", interval=0.05)
        assert not retry_watch.state_file(holder).exists()  # it ended after the withdrawal
    ct.release("warehouse", "shell-job")


@pytest.mark.parametrize("url_from", ["literal", "env"])
def test_run_config_overriding_one_field_needs_no_url(ct: Any, backend_url: str, namespace: str, url_from: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Run config giving one field (``interrupt_on_lease_loss``) runs with the definitions' url and
    namespace (``url`` as text or ``EnvVar``): Dagster used to refuse it with "Missing required config
    entry url" unless the url was typed into the run config again."""
    from dagster import Definitions, EnvVar

    @op
    def load(controltable: ControlTableResource) -> tuple[str, str, bool]:
        assert controltable.control_table.namespace == controltable.namespace  # opened and checked
        return controltable.url, controltable.namespace, controltable.interrupt_on_lease_loss

    @job
    def load_job() -> None:
        load()

    monkeypatch.setenv("CT_TEST_RUN_CONFIG_URL", backend_url)
    url: Any = backend_url if url_from == "literal" else EnvVar("CT_TEST_RUN_CONFIG_URL")
    defs = Definitions(jobs=[load_job], resources={"controltable": ControlTableResource(url=url, namespace=namespace)})
    with DagsterInstance.ephemeral() as instance:
        one_field = {"resources": {"controltable": {"config": {"interrupt_on_lease_loss": False}}}}
        result = defs.resolve_job_def("load_job").execute_in_process(instance=instance, run_config=one_field)
        assert result.success
        assert result.output_for_node("load") == (backend_url, namespace, False)


@pytest.mark.backends("sqlite")
def test_a_resource_without_any_url_fails_the_step_naming_where_to_give_it(backend: str) -> None:
    @op
    def load(controltable: ControlTableResource) -> None:
        controltable.status()

    @job
    def load_job() -> None:
        load()

    result = load_job.execute_in_process(resources={"controltable": ControlTableResource()}, raise_on_error=False)
    (failure,) = result.get_step_failure_events()
    assert "has no url" in str(failure.step_failure_data.error) and "EnvVar" in str(failure.step_failure_data.error)
