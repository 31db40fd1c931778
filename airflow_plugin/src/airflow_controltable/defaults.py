"""The provider's own defaults, in one place; the core's are imported from ``controltable.defaults``.

Everything here is specific to running under Airflow (how a deferred task waits in the triggerer,
how long a sensor's slot lives between tasks). Anything the core already defines (the lease of a
renewed slot, the slot mode, the name length) is imported from the core, never retyped.
"""

from __future__ import annotations

from controltable.defaults import DEFAULT_LEASE, DEFAULT_MODE, INTERRUPT_ON_LEASE_LOSS, NAME_LENGTH

__all__ = [
    "DEFAULT_DEFERRED_PICKUP",
    "DEFAULT_DEFERRED_WAITER_TTL",
    "DEFAULT_EVENTS_POKE_INTERVAL",
    "DEFAULT_EVENTS_TRIGGER_POLL_INTERVAL",
    "DEFAULT_EXIT_ALLOWANCE",
    "DEFAULT_HELD_LEASE",
    "DEFAULT_MODE",
    "DEFAULT_REFRESH_INTERVAL",
    "DEFAULT_RENEWED_LEASE",
    "DEFAULT_RESUME_MARGIN",
    "DEFAULT_SLOT_LEASE",
    "DEFAULT_SLOT_POKE_INTERVAL",
    "DEFAULT_TRIGGER_POLL_INTERVAL",
    "DEFER_TIMEOUT_MARGIN",
    "INTERRUPT_ON_LEASE_LOSS",
    "MAX_ID",
    "RESUME_GUARD_AIRFLOW",
    "SCHEDULER_CATCH_UP_LIMIT",
    "SCHEDULER_HEARTBEAT_POLL",
    "SENSOR_MIN_PICKUP",
    "SENSOR_MIN_WAITER_TTL",
    "SLOT_MODES",
    "TEARDOWN_CHECK_INTERVAL",
    "TEARDOWN_KILL_MARGIN",
    "WORKER_MIN_HEARTBEAT_INTERVAL",
    "WORKER_TASK_SUCCESS_OVERTIME",
    "WORKER_WAIT",
    "WORKER_WAIT_HISTORY",
    "WORKER_WAIT_HISTORY_WINDOW",
    "WORKER_WAIT_MARGIN",
    "WORKER_WAIT_ROUNDS",
]

#: The two slot modes (the core's); named ``slot_mode`` in every Airflow signature so it never
#: clashes with a sensor's own ``mode`` ("poke" / "reschedule").
SLOT_MODES = ("shared", "exclusive")

#: Holder and owner ids are at most this long (the core's name limit); longer ones are hashed.
MAX_ID = NAME_LENGTH

#: Default lease of a slot taken by :class:`~airflow_controltable.sensors.slots.SlotSensor`.
#: Nothing renews it between the sensor and the release teardown, so it must outlast the tasks in
#: between (their run time plus queueing). The teardown normally frees the slot at once; the lease
#: only decides how long a slot stays blocked when no teardown runs at all (the DAG run was
#: deleted or marked failed by hand, the deployment died). Six hours covers typical warehouse
#: loads; set ``lease=`` to your work's ``execution_timeout`` plus a margin.
DEFAULT_SLOT_LEASE = 6 * 3600.0

#: Lease of a slot held by :func:`~airflow_controltable.decorators.slot_held`: the core's default
#: lease, renewed in the background every third of it while the task runs.
DEFAULT_RENEWED_LEASE = DEFAULT_LEASE

#: Lease of a slot held by the deferrable slot operator and ``@task.controltable_slot`` while the work
#: runs: renewed by the task's own process every third of it, so a worker that dies (or a process
#: that is orphaned) frees the slot within this many seconds, and a trigger's pick-up covers the
#: time Airflow takes to resume the task on a worker.
DEFAULT_HELD_LEASE = 60.0

#: How long the queue place of a deferred task survives without a check. It covers the time from
#: the worker's first try to the trigger's first check (the triggerer picks new triggers up within
#: seconds) and a triggerer restart; a dead waiter costs nothing meanwhile, since a grant made on
#: its behalf lapses after ``pickup`` seconds.
DEFAULT_DEFERRED_WAITER_TTL = 180.0

#: Seconds a grant made on a deferred task's behalf waits to be picked up by its trigger (covers
#: the moment between the worker's first try and the trigger's first check, and polling without push).
DEFAULT_DEFERRED_PICKUP = 20.0

#: With push wake-ups, a waiting trigger still re-checks this often (seconds) to keep its queue
#: entry alive and to cover a lost notification; never more than a quarter of the waiter's ttl.
DEFAULT_REFRESH_INTERVAL = 30.0

#: ``worker_wait`` of the slot operators: seconds a task whose slot is expected soon waits for it on
#: its worker (occupying the worker slot, like a sensor in poke mode) before it defers. A deferral
#: costs a resume (schedule, queue, a new task process) plus, for a grant within seconds of the
#: deferral, the wait for the scheduler to handle the deferring process's exit
#: (``[workers] min_heartbeat_interval`` + a scheduler loop, 10 s by default): a wait shorter than
#: that is cheaper on the worker. 0 defers at once.
WORKER_WAIT = 20.0
#: Without recent grants of the resource to tell how long its slots are held, a request waits on the
#: worker only when at most this many rounds of the capacity are ahead of it (1: next in line).
WORKER_WAIT_ROUNDS = 2
#: With recent grants to go by, a request waits on the worker only when the rounds ahead of it times
#: their median hold fit this many times in ``worker_wait``: holds vary, and a wait that runs out just
#: before the grant is the worst case (the grant then comes right after the deferral, which is the
#: slow path the wait on the worker is for).
WORKER_WAIT_MARGIN = 2.0
#: The recent grants read to tell how long the resource's slots are typically held (their median):
#: how many at most, and from how far back (seconds).
WORKER_WAIT_HISTORY = 20
WORKER_WAIT_HISTORY_WINDOW = 3600.0

#: Poll interval of a slot trigger on a backend without push (seconds).
DEFAULT_TRIGGER_POLL_INTERVAL = 2.0

#: ``SlotSensor``'s ``poke_interval`` (poke and reschedule modes).
DEFAULT_SLOT_POKE_INTERVAL = 10.0
#: A sensor's queue place survives at least this long between pokes (and four poke intervals).
SENSOR_MIN_WAITER_TTL = 120.0
#: A grant made between two pokes survives at least this long (and two poke intervals plus 10 s).
SENSOR_MIN_PICKUP = 30.0

#: ``PendingEventsSensor``'s ``poke_interval``, and the most its trigger waits between checks
#: (rows inserted without ``notify()`` push nothing, so the trigger always polls too).
DEFAULT_EVENTS_POKE_INTERVAL = 30.0
DEFAULT_EVENTS_TRIGGER_POLL_INTERVAL = 30.0

#: Airflow's own deferral timeout is this much longer than ``wait_timeout``: only a backstop, the
#: trigger gives up (and withdraws its queue entry) at the deadline itself.
DEFER_TIMEOUT_MARGIN = 120.0

#: ``ReleaseSlotOperator``: how often it looks at the covered tasks' states, and what it adds to
#: Airflow's kill path (SIGTERM at the next heartbeat, SIGKILL 5 s later) before handing on.
TEARDOWN_CHECK_INTERVAL = 1.0
TEARDOWN_KILL_MARGIN = 5.0 + 3.0

# -- resuming a deferred task ------------------------------------------------------------------------
# Airflow 3.3's scheduler fails a task resumed from deferral when it processes the executor's
# "success" event of the process that deferred *after* it queued the resumed task ("finished with
# state success, but the task instance's state attribute is queued"): the resumed try has the same
# key, and the LocalExecutor keeps no record of a handed-out task that would mark the event stale.
# That event comes when the task supervisor notices its process exited, which, when the process's
# sockets close before it can be reaped, is only at the supervisor's next wake-up:
# ``[workers] min_heartbeat_interval`` later. The scheduler then reads it on its next loop. So a
# trigger fires no sooner than that interval plus a margin after the deferring process exited.

#: Airflow's defaults, used when the configuration cannot be read (``[workers] min_heartbeat_interval``
#: and ``[core] task_success_overtime``: how long a finished task process may linger before Airflow kills it).
WORKER_MIN_HEARTBEAT_INTERVAL = 5.0
WORKER_TASK_SUCCESS_OVERTIME = 20.0

#: Seconds added to the supervisor's wake-up interval: one scheduler loop on a busy machine.
DEFAULT_RESUME_MARGIN = 5.0

#: When the triggerer cannot see the deferring process (another host), the seconds allowed for it
#: to exit after it deferred.
DEFAULT_EXIT_ALLOWANCE = 3.0

#: After the settle, the trigger also waits (when Airflow's health endpoint answers) until the
#: scheduler has heartbeated twice after the exit report was due: a heartbeat ends a scheduler loop,
#: so the loop that ended with the second one started after the first, and read the report. A
#: scheduler that does not heartbeat for this long is not waited for any longer (seconds).
SCHEDULER_CATCH_UP_LIMIT = 120.0
#: How often the trigger reads the scheduler's heartbeat meanwhile (seconds).
SCHEDULER_HEARTBEAT_POLL = 0.5

#: The first Airflow whose scheduler is known (its source read) not to fail a *scheduled* task
#: instance resumed from deferral over the stale event (``process_executor_events``: "Resume-after-defer"):
#: from it on, a trigger may fire as soon as the scheduler has read the exit report, since it handles
#: the report in the same loop, before any later loop queues the task. Older: heartbeats only.
RESUME_GUARD_AIRFLOW = "3.3.2"

#: Deprecated: the settle used to be a fixed 10 s after the deferral; it is now computed from the
#: worker's heartbeat interval (``[controltable] resume_settle`` still overrides it).
DEFAULT_RESUME_SETTLE = WORKER_MIN_HEARTBEAT_INTERVAL + DEFAULT_RESUME_MARGIN
