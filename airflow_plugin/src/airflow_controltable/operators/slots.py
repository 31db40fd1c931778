"""Slot operators: hold a slot for exactly the work of one task (``HoldSlotMixin``), and release a run's slot.

The recommended pattern is the task that does the work holding the slot itself
(``@task.controltable_slot``, :class:`SlotPythonOperator`, or :class:`HoldSlotMixin` in front of any
operator):

1. when the task starts it asks for the slot (FIFO, ``attempt`` = its try number);
2. if the slot is not free it *defers*: the wait happens in the triggerer (no worker slot), woken
   by the database's push notifications. A task whose slot is expected soon (next in line behind
   short holds) first waits for it on its worker, at most ``worker_wait`` seconds, keeping its
   queue place (:mod:`airflow_controltable.worker_wait`): a deferral round trip costs more than that;
3. when granted, the task resumes on a worker and runs the work under the slot, with a short
   lease that this same process renews;
4. the same process releases the slot when the work returns, raises, or is killed: on SIGTERM
   (run or task marked failed, cleared, ``execution_timeout``) ``on_kill`` stops the work by
   raising in it, and the slot is released once the work's stack has unwound. A process that dies
   without that (SIGKILL, OOM, a lost worker) stops renewing, and the slot comes back within one
   lease.

:class:`ReleaseSlotOperator` is the teardown of the sensor + teardown pattern (a slot spanning
several tasks of a run): it waits until the run's tasks between the sensor and the teardown have
finished, and for a run whose end was forced (a task or the run marked failed, not a task that
raised) until Airflow has had time to kill their processes, before it hands the slot on.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Optional

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import BaseOperator, Context

from airflow_controltable.defaults import (
    DEFAULT_DEFERRED_PICKUP,
    DEFAULT_DEFERRED_WAITER_TTL,
    DEFAULT_HELD_LEASE,
    DEFAULT_MODE,
    DEFAULT_REFRESH_INTERVAL,
    DEFAULT_TRIGGER_POLL_INTERVAL,
    DEFER_TIMEOUT_MARGIN,
    INTERRUPT_ON_LEASE_LOSS,
    TEARDOWN_CHECK_INTERVAL,
    TEARDOWN_KILL_MARGIN,
    WORKER_MIN_HEARTBEAT_INTERVAL,
    WORKER_WAIT,
    WORKER_WAIT_HISTORY,
    WORKER_WAIT_HISTORY_WINDOW,
)
from airflow_controltable.exceptions import ControlTableAcquireTimeout, ControlTableLeaseLost
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable
from airflow_controltable.kill import WORK_ENDED_KEY, WorkStopper
from airflow_controltable.operators.base import ControlTableBaseOperator
from airflow_controltable.resume_race import deferral_facts
from airflow_controltable.utils import (
    airflow_errors,
    check_wait_args,
    dag_run_holder,
    slot_priority,
    start_renewing,
    task_instance_holder,
    trigger_failure,
    try_number,
)
from airflow_controltable.worker_wait import typical_hold, wait_for_grant, worker_wait_budget
from controltable import ControlTableError, LeaseLostInterrupt
from controltable import defaults as core_defaults
from controltable.waiting_text import ahead_text

__all__ = [
    "DEFAULT_DEFERRED_PICKUP", "HoldSlotMixin", "ReleaseSlotOperator", "SlotPythonOperator",
]

#: States after which a task instance runs no more (its own process reported the end, or the
#: scheduler / a user ended it).
FINISHED_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})

#: Task-instance states that mean the task ended by itself (its process has exited when it reports
#: them); any other finished state may have been forced on a process that still runs.
CLEAN_STATES = frozenset({"success", "skipped", "upstream_failed"})


class HoldSlotMixin(UsesControlTable, BaseOperator):
    """Hold a slot of ``resource`` while the operator's own ``execute`` runs; wait for it deferred.

    Put it in front of an operator class: ``class LoadWithSlot(HoldSlotMixin, SQLExecuteQueryOperator)``.
    The wrapped operator must not itself defer. The lease (token, holder, expiry) is in
    ``self.slot_lease`` while the work runs, e.g. to pass the fencing token to the storage.

    :param resource: the resource name (templated); it must exist (``set_capacity``).
    :param slots: slots to take (the request's weight).
    :param slot_mode: ``"shared"`` (default: beside other holders, up to the capacity at once) or
        ``"exclusive"`` (alone on the resource).
    :param holder: default: this task instance (dag, run, task, map index). The try number is passed
        as the core's ``attempt``, so a retry or a cleared run gets a new, higher fencing token.
    :param lease: seconds; renewed by this task's process every third of it while the work runs.
    :param wait_timeout: seconds to wait in line before failing (None: no limit); the task's
        retries apply.
    :param waiter_ttl: seconds the queue place survives without a check (covers a triggerer restart).
    :param pickup: seconds a grant made on this task's behalf waits for its trigger to pick it up.
    :param poll_interval: how often the trigger checks on a backend without push.
    :param conn_id: a ``controltable`` or SQL connection; ``namespace`` / ``control_schema`` override it.
    :param priority: the request's place in the queue, as the core's ``priority`` (higher first;
        equal ones in arrival order; any 32-bit value). Wins over ``use_priority_weight``.
    :param use_priority_weight: without ``priority``, queue by the task's ``priority_weight``
        (clamped to the core's range); off by default (plain FIFO, priority 0).
    :param worker_wait: seconds the task may wait for the slot on its worker before deferring, when
        the slot is expected within that time (next in line, judged from the queue and the
        resource's recent hold times: :mod:`airflow_controltable.worker_wait`); the push of the
        release ends the wait, so the work starts without a deferral round trip. The task occupies
        its worker slot meanwhile, like a sensor in poke mode, and the time counts towards its
        ``execution_timeout``. ``0`` defers at once.
    :param interrupt_on_lease_loss: when the renewal finds the lease lost or expired (released from
        outside, reaped, renewals failing for a whole lease), stop the work by raising
        ``LeaseLostInterrupt`` in it, so it does not overlap the next holder; the task then fails
        with ``ControlTableLeaseLost`` (retryable). ``False`` lets the work run on; the task then
        fails at the release. See docs/faults.md, "Lease loss interrupts the work".
    """

    slot_template_fields: Sequence[str] = ("resource", "holder")
    #: The lease while the work runs (None otherwise).
    slot_lease: Any = None
    #: True when this run of the task waited for the slot deferred and resumed when granted.
    slot_resumed: bool = False
    #: What ended this run's wait for the slot: ``"free"`` (granted at the first try),
    #: ``"worker"`` (granted while it waited on the worker), ``"trigger"`` (resumed after deferring).
    slot_granted_by: Optional[str] = None

    def __init__(
        self,
        *,
        resource: str,
        slots: int = 1,
        slot_mode: str = DEFAULT_MODE,
        holder: Optional[str] = None,
        lease: float = DEFAULT_HELD_LEASE,
        wait_timeout: Optional[float] = None,
        waiter_ttl: float = DEFAULT_DEFERRED_WAITER_TTL,
        pickup: float = DEFAULT_DEFERRED_PICKUP,
        poll_interval: float = DEFAULT_TRIGGER_POLL_INTERVAL,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        use_priority_weight: bool = False,
        interrupt_on_lease_loss: bool = INTERRUPT_ON_LEASE_LOSS,
        priority: Optional[int] = None,
        worker_wait: float = WORKER_WAIT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.worker_wait = worker_wait
        self.priority = priority
        self.use_priority_weight = use_priority_weight
        self.interrupt_on_lease_loss = interrupt_on_lease_loss
        self.resource = resource
        self.slots = slots
        self.slot_mode = slot_mode
        self.holder = holder
        self.lease = lease
        self.wait_timeout = wait_timeout
        self.waiter_ttl = waiter_ttl
        self.pickup = pickup
        self.poll_interval = poll_interval
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema
        self.slot_lease = None
        self._stopper: Optional[WorkStopper] = None
        #: Set by ``on_kill`` even when no stoppable wait or work runs yet: a SIGTERM between entering
        #: the queue and the start of the wait on the worker (or of the work) must not be lost.
        self._kill_requested = False

    # -- helpers ------------------------------------------------------------------------------------
    def _slot_holder(self, context: Context) -> str:
        return self.holder or task_instance_holder(context)

    def _pickup(self) -> float:
        core_pickup = float(getattr(core_defaults, "DEFAULT_PICKUP", 0))
        return max(float(self.pickup), 3.0 * float(self.poll_interval), core_pickup)

    def _slot_priority(self) -> int:
        """``priority`` when given, else the task's ``priority_weight`` when ``use_priority_weight`` is on, else 0."""
        return slot_priority(self, self.use_priority_weight, self.priority)

    def _try_slot(self, context: Context) -> Any:
        holder = self._slot_holder(context)
        with airflow_errors():
            return self._table().try_acquire(
                self.resource, holder=holder, slots=self.slots, mode=self.slot_mode, lease=float(self.lease),
                waiter_ttl=float(self.waiter_ttl), attempt=try_number(context), pickup=self._pickup(),
                priority=self._slot_priority(),
            )

    def _worker_wait_budget(self, context: Context) -> float:
        """Seconds to wait on the worker (:func:`~airflow_controltable.worker_wait.worker_wait_budget`), 0 to defer."""
        if float(self.worker_wait) <= 0:
            return 0.0
        holder = self._slot_holder(context)
        try:
            table = self._table()
            (status,) = table.status([self.resource])
            position = next((w.position for w in status.waiters if w.holder == holder), None)
            hold = typical_hold(table.history(self.resource, since=WORKER_WAIT_HISTORY_WINDOW,
                                              limit=WORKER_WAIT_HISTORY))
        except (ControlTableError, ValueError) as exc:  # cannot tell: defer, as without the option
            self.log.info("controltable: cannot tell how soon %r comes (%s); deferring", self.resource, exc)  # type: ignore[attr-defined]
            return 0.0
        if position is None:
            # Not waiting any more: a release since the first look granted it (to be picked up), so
            # deferring would only hand that grant to the triggerer. Picked up at once on the worker.
            self.log.info("controltable: %r was granted since the first look; taking it on the worker",  # type: ignore[attr-defined]
                          self.resource)
            return float(self.worker_wait)
        budget = worker_wait_budget(position=position, capacity=status.capacity, slots=self.slots,
                                    exclusive=self.slot_mode == "exclusive", worker_wait=float(self.worker_wait),
                                    hold=hold)
        if budget > 0:
            self.log.info(  # type: ignore[attr-defined]
                "controltable: %r expected soon (position %s, capacity %d, typical hold %s): waiting up to %.0f s "
                "on the worker before deferring", self.resource, position, status.capacity,
                f"{hold:.1f} s" if hold is not None else "unknown", budget,
            )
        return budget

    def _wait_on_worker(self, context: Context, seconds: float) -> Any:
        """Wait up to ``seconds`` for the grant here, keeping the queue place; None when it did not come.

        Killed meanwhile (``on_kill``), or failing, the request is withdrawn before the error goes
        on: a killed task's place must not hold up the queue until its ``waiter_ttl`` runs out.
        """
        holder = self._slot_holder(context)
        table = self._table()
        started = time.monotonic()
        self._stopper = WorkStopper(
            f"the task is being killed: stopped waiting for a slot of {self.resource!r} on the worker "
            "and withdrew from its queue", killed=lambda: self._kill_requested,
        )
        try:
            with self._stopper:
                lease = wait_for_grant(
                    table, list(table.wakeup_keys(self.resource, holder)), lambda: self._try_slot(context), seconds,
                    poll=min(float(self.poll_interval), 1.0),
                    refresh=min(DEFAULT_REFRESH_INTERVAL, max(float(self.waiter_ttl) / 4.0, 1.0)),
                )
        except BaseException:
            try:
                table.release(self.resource, holder)
            except Exception as exc:  # the entry expires after waiter_ttl anyway
                self.log.warning("controltable: could not withdraw from %r: %s", self.resource, exc)  # type: ignore[attr-defined]
            raise
        finally:
            self._stopper = None
        if lease is None:
            self.log.info("controltable: no grant of %r within %.1f s on the worker; deferring",  # type: ignore[attr-defined]
                          self.resource, time.monotonic() - started)
        else:
            self.log.info("controltable: granted %r after %.2f s on the worker",  # type: ignore[attr-defined]
                          self.resource, time.monotonic() - started)
        return lease

    def _defer_for_slot(self, context: Context, since: Optional[float] = None, resume_near: bool = True) -> None:
        from airflow_controltable.triggers.slot import SlotTrigger

        holder = self._slot_holder(context)
        log = self.log  # type: ignore[attr-defined]
        try:
            info = self._table().wait_info(self.resource, holder)
        except (ControlTableError, AttributeError):
            info = None
        if info is not None:
            log.info(
                "controltable: waiting for %r as %r at position %s behind %s; deferring to the triggerer",
                self.resource, holder, info.position, ahead_text(info.ahead),
            )
        else:
            log.info("controltable: waiting for %r as %r; deferring to the triggerer", self.resource, holder)
        began = since if since is not None else time.time()  # a wait on the worker counts towards wait_timeout
        deadline = began + float(self.wait_timeout) if self.wait_timeout is not None else None
        self.defer(  # type: ignore[attr-defined]
            trigger=SlotTrigger(
                resource=self.resource, holder=holder, slots=self.slots, slot_mode=self.slot_mode,
                lease=float(self.lease), waiter_ttl=float(self.waiter_ttl), attempt=try_number(context),
                pickup=self._pickup(), conn_id=self.conn_id, namespace=self.namespace,
                control_schema=self.control_schema, poll_interval=float(self.poll_interval), deadline=deadline,
                deferral=deferral_facts(), priority=self._slot_priority(),
                # Resumed early once next in line (then waits on the worker), once per request: a
                # wait on the worker that ran out defers for the grant itself.
                resume_near=float(self.worker_wait) if resume_near else 0.0,
            ),
            method_name="execute_in_slot",
            # Airflow's own deferral timeout is only a backstop: the trigger gives up (and withdraws
            # the queue entry) at the deadline itself.
            timeout=(timedelta(seconds=max(deadline - time.time(), 0.0) + DEFER_TIMEOUT_MARGIN)
                     if deadline is not None else None),
        )

    # -- Airflow entry points -----------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        check_wait_args(self.slot_mode, self.resource)
        began = time.time()
        lease = self._try_slot(context)
        self.slot_granted_by = "free"
        if lease is None:
            budget = self._worker_wait_budget(context)
            if self.wait_timeout is not None:
                budget = min(budget, max(began + float(self.wait_timeout) - time.time(), 0.0))
            if budget > 0:
                lease = self._wait_on_worker(context, budget)
                self.slot_granted_by = "worker"
            if lease is None:
                self._defer_for_slot(context, began)  # raises TaskDeferred
        return self._run_in_slot(context, lease)

    def execute_in_slot(self, context: Context, event: Optional[dict[str, Any]] = None) -> Any:
        """Resume after the trigger granted the slot: take the grant over and run the work under it."""
        self.slot_resumed = True
        self.slot_granted_by = "trigger"
        status = (event or {}).get("status")
        if status == "timeout":
            raise ControlTableAcquireTimeout(
                f"gave up waiting for a slot of {self.resource!r} after wait_timeout={self.wait_timeout} s; "
                "raise wait_timeout or the resource's capacity (the task's retries wait in line again)"
            )
        if status == "near":  # next in line, the grant expected soon: wait for it here
            lease = self._try_slot(context)
            if lease is None and float(self.worker_wait) > 0:
                lease = self._wait_on_worker(context, float(self.worker_wait))
            if lease is None:
                self._defer_for_slot(context, resume_near=False)  # raises TaskDeferred
            self.slot_granted_by = "worker"
            return self._run_in_slot(context, lease)
        if status != "granted":
            raise trigger_failure(event, f"waiting for a slot of {self.resource!r}")
        lease = self._try_slot(context)  # the same holder and attempt: the same grant, idempotently
        if lease is None:
            self.log.warning(  # type: ignore[attr-defined]
                "controltable: the grant of %r (token %s) lapsed before the task resumed; waiting again",
                self.resource, event.get("token") if event else None,
            )
            self._defer_for_slot(context)
        return self._run_in_slot(context, lease)

    def resume_execution(self, next_method: str, next_kwargs: Optional[dict[str, Any]], context: Context) -> Any:
        """On a failed or timed-out trigger, withdraw the queue entry before failing."""
        if next_method == "__fail__":
            try:
                self._table().release(self.resource, self._slot_holder(context))
            except Exception as exc:
                self.log.warning("controltable: could not withdraw from %r: %s", self.resource, exc)  # type: ignore[attr-defined]
        return super().resume_execution(next_method, next_kwargs, context)  # type: ignore[misc]

    def _run_in_slot(self, context: Context, lease: Any) -> Any:
        log = self.log  # type: ignore[attr-defined]
        with airflow_errors():
            lease.renew(float(self.lease))  # the trigger's pick-up may be old: a full lease from now
        start_renewing(lease)
        log.info(
            "controltable: holding %d %s slot(s) of %r as %r, fencing token %d, lease %.0f s (renewed)",
            lease.slots, lease.mode, lease.resource, lease.holder, lease.token, lease.lease_seconds,
        )
        self.slot_lease = lease
        self._stopper = WorkStopper(
            f"the task is being killed: stopped the work under the slot of {self.resource!r}; "
            "the slot is released now that the work has stopped", killed=lambda: self._kill_requested,
        )
        try:
            # A lease found lost or expired by the renewer raises LeaseLostInterrupt in the work
            # (disarmed on the way out of the inner block, before the statements are untracked).
            with self._stopper, lease.interrupting(bool(self.interrupt_on_lease_loss)):
                result = self._slot_work(context)
        except LeaseLostInterrupt as exc:
            self._release(lease, failed=True)
            raise ControlTableLeaseLost(
                f"the slot of {lease.resource!r} (token {lease.token}) was lost while the work ran, so the work was "
                f"interrupted before it could overlap the next holder ({exc}). A retry re-acquires with a new "
                "token; raise `lease` if renewals are slow, or pass interrupt_on_lease_loss=False to let work run on"
            ) from exc
        except BaseException:
            self._release(lease, failed=True)
            raise
        finally:
            self._stopper = None
        self._release(lease, failed=False)
        return result

    def _slot_work(self, context: Context) -> Any:
        """The wrapped operator's work: the next ``execute`` in the method resolution order."""
        return super().execute(context)  # type: ignore[misc]

    def _release(self, lease: Any, *, failed: bool) -> None:
        log = self.log  # type: ignore[attr-defined]
        lease.stop_renewing()
        lost = lease.lost
        try:
            lease.release()
            log.info("controltable: released %r (token %d)", lease.resource, lease.token)
        except ControlTableError as exc:
            lost = lost or exc
        finally:
            self.slot_lease = None
        if lost is not None:
            if failed:
                log.warning("controltable: the lease of %r was lost before the release: %s", lease.resource, lost)
                return
            raise ControlTableLeaseLost(
                f"the slot of {lease.resource!r} (token {lease.token}) was lost while the work ran ({lost}); the work "
                "may have overlapped with the next holder, whose token is higher. Raise `lease` if renewals are slow"
            ) from None

    def on_kill(self) -> None:
        """SIGTERM (marked failed, cleared, timeout): stop the work first, so the release comes after it.

        Airflow's SIGTERM handler calls this in the main thread and then lets the task go on; raising
        here unwinds the work, and ``_run_in_slot`` releases the slot once it has. Releasing here
        instead would hand the slot on while the work still writes (Airflow sends SIGKILL only
        seconds later). The exception is a ``KeyboardInterrupt`` too, so a statement the work has
        running is cancelled in the server before the work's stack unwinds (psycopg 3); the lease
        is renewed until then.
        """
        self._kill_requested = True  # before anything else: a wait or work about to start sees it
        try:
            super().on_kill()  # type: ignore[misc]
        finally:
            if self._stopper is not None:
                self._stopper.stop()


class SlotPythonOperator(HoldSlotMixin, PythonOperator):
    """Run ``python_callable`` under a slot of ``resource``, waiting for it deferred (see :class:`HoldSlotMixin`).

    Everything of :class:`PythonOperator` works (``op_args``, ``op_kwargs``, context variables by
    name); a parameter named ``lease`` (give it a default, e.g. ``lease=None``) receives the lease.
    ``@task.controltable_slot(resource)`` is the TaskFlow form of the same thing.
    """

    template_fields: Sequence[str] = ("resource", "holder", *PythonOperator.template_fields)
    ui_color = "#e8f4ea"

    def _slot_work(self, context: Context) -> Any:
        try:
            accepts_lease = "lease" in inspect.signature(self.python_callable).parameters
        except (TypeError, ValueError):
            accepts_lease = False
        if accepts_lease and self.op_kwargs.get("lease") is None:
            self.op_kwargs = {**self.op_kwargs, "lease": self.slot_lease}
        return super()._slot_work(context)


class ReleaseSlotOperator(ControlTableBaseOperator):
    """Release what ``holder`` has on ``resource``, once the work it covered can no longer run; returns rows removed.

    The teardown of the sensor + teardown pattern. Before releasing, it waits (at most until the
    slot's lease runs out) until every task instance of this run between the setup (the sensor)
    and this teardown has finished, read through the Task SDK. If any of them ended in a state
    that may have been forced on a running process (removed, the run itself marked failed, or
    failed without its process recording that its work ended: see
    :mod:`airflow_controltable.plugins.work_ended`), it also waits up to ``kill_grace`` seconds:
    the time Airflow takes to kill such a process (a supervisor heartbeat to notice, then SIGTERM
    and SIGKILL 5 s later). A load that raised does not wait.

    Releasing a slot that is no longer held is not an error (a warning), so a re-run is harmless;
    a resource that does not exist is an error (most likely a typo that would leave the slot held).

    :param resource: the resource name (templated).
    :param holder: the holder (templated). Default: the DAG run, the sensor's default too.
    :param wait_for_work: wait as described above (default True).
    :param kill_grace: seconds; default ``[workers] min_heartbeat_interval`` + 5 s + 3 s margin.
    :param check_interval: seconds between looks at the task states.
    """

    template_fields: Sequence[str] = ("resource", "holder")
    ui_color = "#f8ece8"

    def __init__(
        self,
        *,
        resource: str,
        holder: Optional[str] = None,
        wait_for_work: bool = True,
        kill_grace: Optional[float] = None,
        check_interval: float = TEARDOWN_CHECK_INTERVAL,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema, **kwargs)
        self.resource = resource
        self.holder = holder
        self.wait_for_work = wait_for_work
        self.kill_grace = kill_grace
        self.check_interval = check_interval

    def _kill_grace(self) -> float:
        if self.kill_grace is not None:
            return float(self.kill_grace)
        try:
            from airflow.sdk import conf

            heartbeat = float(conf.getint("workers", "min_heartbeat_interval",
                                          fallback=int(WORKER_MIN_HEARTBEAT_INTERVAL)))
        except Exception:
            heartbeat = WORKER_MIN_HEARTBEAT_INTERVAL
        return heartbeat + TEARDOWN_KILL_MARGIN

    def covered_task_ids(self, context: Context) -> list[str]:
        """Task ids of the run between this teardown's setups and itself (all its upstream if it has no setup)."""
        task: Any = context.get("task")
        if task is None or getattr(task, "dag", None) is None:
            return []
        upstream = set(task.get_flat_relative_ids(upstream=True))
        dag = task.dag
        setups = [dag.get_task(t) for t in upstream if getattr(dag.get_task(t), "is_setup", False)]
        if not setups:
            return sorted(upstream)
        downstream_of_setups: set[str] = set()
        for setup in setups:
            downstream_of_setups |= set(setup.get_flat_relative_ids(upstream=False))
        covered = (upstream & downstream_of_setups) - {s.task_id for s in setups} - {task.task_id}
        return sorted(t for t in covered if not getattr(dag.get_task(t), "is_teardown", False))

    def wait_until_work_finished(self, context: Context, deadline: float) -> None:
        """Block until the covered tasks ran to an end and were killed; ``deadline`` is a ``time.monotonic()`` value."""
        ti: Any = context["ti"]
        task_ids = self.covered_task_ids(context)
        if not task_ids or not hasattr(ti, "get_task_states"):
            return
        states: dict[str, Any] = {}
        while True:
            found = ti.get_task_states(dag_id=ti.dag_id, task_ids=task_ids, run_ids=[ti.run_id])
            states = {k: (str(v) if v is not None else None) for k, v in (found.get(ti.run_id) or {}).items()}
            unfinished = sorted(k for k, v in states.items() if v not in FINISHED_STATES)
            if not unfinished:
                break
            if time.monotonic() >= deadline:
                self.log.warning(
                    "the slot's lease runs out now; releasing although %s have not finished", ", ".join(unfinished)
                )
                return
            self.log.info("waiting for %s to finish before releasing %r", ", ".join(unfinished), self.resource)
            time.sleep(min(float(self.check_interval), max(deadline - time.monotonic(), 0.0)))
        run_state = None
        try:
            run_state = str(ti.get_dagrun_state(dag_id=ti.dag_id, run_id=ti.run_id))
        except Exception as exc:  # older Task SDK: rely on the task states alone
            self.log.debug("could not read the run's state: %s", exc)
        run_forced = run_state in ("failed", "DagRunState.FAILED")  # the teardown still runs: marked failed
        forced = self._maybe_still_running(ti, {k: v for k, v in states.items() if v not in CLEAN_STATES})
        if not forced and not run_forced:
            return
        grace_end = time.monotonic() + min(self._kill_grace(), max(deadline - time.monotonic(), 0.0))
        self.log.info(
            "%s may have been ended by force (states %s, run %s): waiting up to %.0f s for Airflow to kill "
            "their processes", ", ".join(forced) or "the run", {k: states[k] for k in forced}, run_state,
            grace_end - time.monotonic(),
        )
        while time.monotonic() < grace_end:
            time.sleep(min(float(self.check_interval), max(grace_end - time.monotonic(), 0.0)))
            if not run_forced:
                forced = self._maybe_still_running(ti, {k: states[k] for k in forced})
                if not forced:
                    self.log.info("their work has ended in their own processes: releasing now")
                    return

    def _maybe_still_running(self, ti: Any, ended: dict[str, Optional[str]]) -> list[str]:
        """Task ids among ``ended`` (not cleanly finished) whose process may still run the work.

        A ``failed`` task whose process recorded that its work ended (the ``work_ended`` listener's
        XCom, pushed after ``execute`` returned or raised) is not; a ``removed`` one, a mapped one, or
        one with no marker (marked failed by a user, killed) may be.
        """
        maybe = []
        for task_id, state in sorted(ended.items()):
            marker = None
            if state == "failed":
                try:
                    marker = ti.xcom_pull(task_ids=task_id, key=WORK_ENDED_KEY)
                except Exception as exc:  # a mapped task's key, an XCom backend error: wait the grace
                    self.log.debug("could not read the work-ended marker of %s: %s", task_id, exc)
            if marker is not True:
                maybe.append(task_id)
        return maybe

    def execute(self, context: Context) -> int:
        holder = self.holder or dag_run_holder(context)
        with airflow_errors():
            table = self._table()
            held = table.find_lease(self.resource, holder)  # also: an unknown resource raises here
        if held is not None and self.wait_for_work:
            with airflow_errors():
                left = held.expires_at.timestamp() - table.now()  # the lease's own (database) clock
            self.wait_until_work_finished(context, time.monotonic() + left)
        with airflow_errors():
            removed = table.release(self.resource, holder)
        if removed:
            self.log.info("released %r held by %r (%d row(s))", self.resource, holder, removed)
        else:
            self.log.warning(
                "nothing to release: %r holds no slot of %r (already released, never granted, or its lease expired)",
                holder, self.resource,
            )
        return int(removed)

