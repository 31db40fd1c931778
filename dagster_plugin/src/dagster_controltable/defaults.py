"""The Dagster integration's own defaults, in one place; the core's defaults are imported, never retyped.

Why a module of its own: the resource, the op factories, the sensors and the asset checks share
these numbers (how a busy step retries, how often a sensor ticks, how many keys go into metadata),
and the core's numbers (leases, waiter times, name lengths) must move with the core. Everything a
user can pass as an argument defaults to a constant here or in :mod:`controltable.defaults`.
"""

from controltable.defaults import (  # noqa: F401 - re-exported: the core's defaults the integration uses
    DEFAULT_BATCH_LEASE,
    DEFAULT_ITEM_LEASE,
    DEFAULT_LEASE,
    DEFAULT_MODE,
    DEFAULT_WAITER_TTL,
    INTERRUPT_ON_LEASE_LOSS,
    MIN_PICKUP,
    NAME_LENGTH,
)

#: The resource key every factory looks the :class:`ControlTableResource` up under.
RESOURCE_KEY = "controltable"

# -- slot(wait="retry"): a busy step gives back its worker and retries --------------------------
#: Seconds between a busy step's retries.
RETRY_INTERVAL = 30.0
#: Retry intervals a busy step may wait in all before it fails (a time budget, not a count).
MAX_RETRIES = 120
#: A retry-mode step's queue place survives one retry interval plus this margin (the time
#: Dagster needs to start the step again).
RETRY_WAITER_TTL_MARGIN = 30.0
#: The step at the head of the queue retries after a tenth of the interval, within these bounds
#: (seconds): soon enough that a freed slot does not idle, not so often that the event log floods.
HEAD_RETRY_MIN = 1.0
HEAD_RETRY_MAX = 5.0
#: How often the between-retries watcher looks for an interrupt, and how often it reads the run status.
WATCH_TICK = 0.1
WATCH_STATUS_EVERY = 2.0
#: Seconds a new try waits for the between-retries watcher to acknowledge its pause before it stops
#: the watcher instead, and seconds it waits for a stopped watcher to exit. The watcher acknowledges
#: between two reads of the run status, and one read from a busy instance database can take seconds:
#: the pause timeout covers a slow read, so that a live watcher is paused, not killed and restarted.
WATCHER_PAUSE_TIMEOUT = 5.0
WATCHER_STOP_TIMEOUT = 5.0
#: After a termination signal, how many more times (every WATCH_TICK) the run status is read
#: while it does not yet say CANCELING.
WATCH_INTERRUPT_RETRIES = 3

# -- op factories and metadata ---------------------------------------------------------------------
#: Events claimed per batch by :func:`build_batch_op` and ``claim_batch``.
BATCH_SIZE = 100
#: Keys, tokens and items listed in one metadata entry (the rest is counted, not listed).
MAX_METADATA_KEYS = 100

# -- sensors -----------------------------------------------------------------------------------------
#: The longest backlog signature kept in a run's ``controltable/backlog`` tag (characters).
BACKLOG_TAG_LENGTH = 200
#: Seconds between two evaluations of :func:`pending_events_sensor`.
EVENTS_SENSOR_INTERVAL = 30
#: Seconds to wait for a requested run to show up before the backlog is requested again.
REREQUEST_AFTER = 600.0
#: Seconds between two evaluations of :func:`controltable_run_cleanup_sensor`.
CLEANUP_SENSOR_INTERVAL = 5
#: How far the cleanup sensor's first tick looks into the past (seconds).
CLEANUP_LOOKBACK = 3600.0
#: The most ended runs the cleanup sensor looks at per tick.
CLEANUP_MAX_RUNS = 500
#: Seconds the cleanup sensor looks back before its cursor, so runs updated in the same instant as
#: the last one seen (or written late by another process) are not missed.
CLEANUP_OVERLAP = 60.0
