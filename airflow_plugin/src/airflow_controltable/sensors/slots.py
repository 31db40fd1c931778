"""``SlotSensor``: wait in FIFO order for a resource slot and acquire it for the DAG run.

Unlike an Airflow pool, the slot is counted in the shared control table, so other Airflow
deployments, Dagster jobs and shell scripts using the same resource wait in the same queue; and
the slot belongs to a *holder* (by default the DAG run), not to the sensor's task instance, so it
stays held after the sensor finishes until :class:`ReleaseSlotOperator` (a teardown) frees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Optional

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue

from airflow_controltable.defaults import (
    DEFAULT_MODE,
    DEFAULT_SLOT_LEASE,
    DEFAULT_SLOT_POKE_INTERVAL,
    DEFAULT_TRIGGER_POLL_INTERVAL,
    SENSOR_MIN_PICKUP,
    SENSOR_MIN_WAITER_TTL,
    SLOT_MODES,
)
from airflow_controltable.exceptions import ControlTableLeaseLost
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable
from airflow_controltable.resume_race import deferral_facts
from airflow_controltable.triggers.slot import SlotTrigger, lease_payload
from airflow_controltable.utils import (
    airflow_errors,
    check_wait_args,
    dag_run_holder,
    slot_priority,
    trigger_failure,
    try_number,
)

__all__ = ["SLOT_MODES", "SlotSensor"]


class SlotSensor(UsesControlTable, BaseSensorOperator):
    """Wait for ``slots`` of ``resource`` and acquire them; push the lease (with its fencing token) to XCom.

    :param resource: the resource name (templated). It must exist (``set_capacity``).
    :param slots: how many slots to take.
    :param slot_mode: ``"exclusive"`` (alone on the resource) or ``"shared"`` (beside other shared
        holders up to the capacity). Named so it does not clash with the sensor's ``mode``
        (``"poke"``/``"reschedule"``).
    :param holder: who holds the slot (templated). Default: the DAG run (``airflow:<dag_id>:<run_id>``),
        so a later task of the same run releases it.
    :param lease: seconds the slot stays held without renewal. Nothing renews it between this sensor
        and the release, so it must cover all the work in between; see ``DEFAULT_SLOT_LEASE``.
    :param waiter_ttl: seconds the queue place survives between polls. Default: four poll
        intervals and at least two minutes, so reschedule delays do not lose the place.
    :param pickup: seconds a grant made between two checks waits to be picked up. Default: two
        poke intervals plus 10 s, and at least 30 s.
    :param poll_interval: how often the deferrable form's trigger checks on a backend without push
        (default: ``poke_interval``, at most ``DEFAULT_TRIGGER_POLL_INTERVAL``). ``poke_interval``
        stays the poke and reschedule modes' interval, as for any Airflow sensor.
    :param conn_id: a ``controltable`` or SQL connection.
    :param namespace: the control-table namespace (default: the connection's).
    :param control_schema: the schema of the control tables (default: the connection's).
    :param deferrable: wait in the triggerer instead of a worker.
    :param priority: the request's place in the queue, as the core's ``priority`` (higher first;
        equal ones in arrival order). Wins over ``use_priority_weight``.
    :param use_priority_weight: without ``priority``, queue by the sensor's ``priority_weight``
        (higher first); off by default (plain FIFO).

    The slot arguments (``resource``, ``slots``, ``slot_mode``, ``holder``, ``lease``,
    ``waiter_ttl``, ``pickup``, ``poll_interval``, ``conn_id``, ``namespace``, ``control_schema``)
    have the same names and meanings as the slot operator's and ``slot_held``'s.
    """

    template_fields: Sequence[str] = ("resource", "holder")
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        resource: str,
        slots: int = 1,
        slot_mode: str = DEFAULT_MODE,
        holder: Optional[str] = None,
        lease: float = DEFAULT_SLOT_LEASE,
        waiter_ttl: Optional[float] = None,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        deferrable: bool = False,
        poke_interval: float = DEFAULT_SLOT_POKE_INTERVAL,
        pickup: Optional[float] = None,
        poll_interval: Optional[float] = None,
        use_priority_weight: bool = False,
        priority: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.priority = priority
        self.use_priority_weight = use_priority_weight
        self.pickup = pickup
        self.poll_interval = poll_interval
        self.resource = resource
        self.slots = slots
        self.slot_mode = slot_mode
        self.holder = holder
        self.lease = lease
        self.waiter_ttl = waiter_ttl
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema
        self.deferrable = deferrable

    # -- helpers ------------------------------------------------------------------------------
    def _holder(self, context: Context) -> str:
        return self.holder or dag_run_holder(context)

    def _ttl(self) -> float:
        if self.waiter_ttl is not None:
            return float(self.waiter_ttl)
        return max(SENSOR_MIN_WAITER_TTL, 4.0 * float(self.poke_interval))

    def _check_args(self) -> None:
        check_wait_args(self.slot_mode, self.resource)

    def _pickup(self) -> float:
        """A grant made between two pokes must survive until the next one (plus scheduling delay)."""
        if self.pickup is not None:
            return float(self.pickup)
        return max(SENSOR_MIN_PICKUP, 2.0 * float(self.poke_interval) + 10.0)

    def _poll_interval(self) -> float:
        if self.poll_interval is not None:
            return float(self.poll_interval)
        return min(float(self.poke_interval), DEFAULT_TRIGGER_POLL_INTERVAL)

    def _try(self, context: Context) -> Optional[dict[str, Any]]:
        # attempt = the sensor's try number: a cleared run's sensor (a new try) gets a higher token.
        with airflow_errors():
            lease = self._table().try_acquire(
                self.resource, holder=self._holder(context), slots=self.slots, mode=self.slot_mode,
                lease=self.lease, waiter_ttl=self._ttl(), attempt=try_number(context), pickup=self._pickup(),
                priority=slot_priority(self, self.use_priority_weight, self.priority),
            )
        if lease is None:
            return None
        self.log.info(
            "acquired %d %s slot(s) of %r for %r, fencing token %d, lease %.0f s",
            lease.slots, lease.mode, lease.resource, lease.holder, lease.token, lease.lease_seconds,
        )
        return lease_payload(lease)

    # -- poke / reschedule --------------------------------------------------------------------
    def poke(self, context: Context) -> PokeReturnValue:
        """One FIFO poll that keeps the queue place; done (with the lease in XCom) when granted."""
        self._check_args()
        payload = self._try(context)
        if payload is None:
            self.log.info("waiting in line for %r as %r", self.resource, self._holder(context))
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=payload)

    # -- deferrable ---------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self._check_args()
        payload = self._try(context)  # granted at once: no need to defer
        if payload is not None:
            return payload
        holder = self._holder(context)
        self.log.info("deferring: waiting in line for %r as %r in the triggerer", self.resource, holder)
        timeout = timedelta(seconds=float(self.timeout)) if self.timeout is not None else None
        self.defer(
            trigger=SlotTrigger(
                resource=self.resource, holder=holder, slots=self.slots, slot_mode=self.slot_mode,
                lease=self.lease, waiter_ttl=self._ttl(), attempt=try_number(context), pickup=self._pickup(),
                conn_id=self.conn_id, namespace=self.namespace, control_schema=self.control_schema,
                poll_interval=self._poll_interval(), deferral=deferral_facts(),
                priority=slot_priority(self, self.use_priority_weight, self.priority),
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def execute_complete(self, context: Context, event: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Resume after the trigger granted the slot; check it is still held (events may arrive late)."""
        if not event or event.get("status") != "granted":
            raise trigger_failure(event, f"waiting for a slot of {self.resource!r}")
        with airflow_errors():
            lease = self._table().find_lease(event["resource"], event["holder"])
        if lease is None:
            raise ControlTableLeaseLost(
                f"the slot of {event['resource']!r} granted to {event['holder']!r} (token {event['token']}) is no "
                "longer held: its lease ran out before the task resumed; raise `lease`"
            )
        self.log.info("acquired %r for %r in the triggerer, token %s", lease.resource, lease.holder, lease.token)
        return lease_payload(lease)

