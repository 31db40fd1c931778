"""Every default and limit of controltable, in one module: the core, the CLI and both plugins import them.

Change a default here and every surface (Python API, CLI, Airflow provider, Dagster resource) moves
with it; nothing else in the code base retypes these numbers.
"""

from __future__ import annotations

#: Where the control tables live when no URL is given (the embedded default).
DEFAULT_URL = "sqlite:///controltable.db"

# -- names -------------------------------------------------------------------------------------
#: The longest resource, holder, work-list or event-table name (characters).
NAME_LENGTH = 200
#: The longest namespace (characters).
NAMESPACE_LENGTH = 100
#: The namespace when none is given: deployments sharing one database pick their own.
DEFAULT_NAMESPACE = "default"
#: The prefix of the control tables' names when none is given (``ct_resource``, ``ct_request``, ...).
DEFAULT_PREFIX = "ct_"

# -- slots -------------------------------------------------------------------------------------
#: The mode of a slot request when none is given: "shared", beside other holders up to the capacity
#: (``set_capacity(r, 3)`` means three holders), as Airflow pools, Dagster pools and Prefect limits do.
DEFAULT_MODE = "shared"
#: A slot holder's lease (seconds); ``slot()`` renews it in the background every third of it.
DEFAULT_LEASE = 300.0
#: How long a waiter's queue entry survives without a refresh; waiters refresh after half of it,
#: so 20 idle waiters cost well under one transaction per second.
DEFAULT_WAITER_TTL = 60.0
#: How long a grant made on a waiter's behalf (by whoever freed the capacity) waits to be picked
#: up before it lapses and passes to the next in line: a dead waiter delays its queue by this much.
DEFAULT_PICKUP = 8.0
#: The pickup deadline of every queue entry a promoted server inherited (set by the first grant
#: pass after a failover): entries of callers that moved on while the standby lagged (their grant,
#: release or withdrawal was lost with the old primary) lapse within this instead of
#: ``DEFAULT_PICKUP`` each; live waiters look sooner, or re-enter and restore their own.
FAILOVER_PICKUP = 1.0
#: A slot request's priority when none is given (higher is granted first; any 32-bit value).
DEFAULT_SLOT_PRIORITY = 0
#: How long the grant history keeps ended grants (seconds): 7 days. ``prune_history()`` and the
#: engine's own occasional pruning delete older rows.
HISTORY_RETENTION = 7 * 86400.0
#: Rows one pruning statement deletes at most (a short transaction that never blocks grants long).
HISTORY_PRUNE_BATCH = 1000
#: How often (seconds) a process prunes one batch of a resource's history after a release, so
#: pruning keeps pace with grants without running on every grant.
HISTORY_PRUNE_INTERVAL = 60.0

# -- event batches and work items ----------------------------------------------------------------
#: A claimed batch's lease (seconds).
DEFAULT_BATCH_LEASE = 900.0
#: A work item's lease (seconds).
DEFAULT_ITEM_LEASE = 600.0

# -- background renewal ----------------------------------------------------------------------------
#: Whether a background renewer stops (letting its lease expire) when its process is orphaned.
#: Off for the core (a ``nohup`` job outlives its shell on purpose); the Airflow and Dagster
#: adapters turn it on for their worker processes, whose supervisor owns the outcome.
STOP_RENEWING_WHEN_ORPHANED = False
#: How often (seconds) a renewer that watches for orphaning or an ``alive()`` callback looks.
ORPHAN_CHECK_INTERVAL = 1.0
#: Whether work inside a ``with`` block that holds a lease (``slot()``, ``with lease:``,
#: ``batch.renewing()``, ``item.renewing()``) is interrupted with ``LeaseLostInterrupt`` when its
#: background renewer finds the lease lost or expired. Each of those takes ``interrupt=`` to opt out.
INTERRUPT_ON_LEASE_LOSS = True
#: The signal that interrupts a main thread blocked in a sleep, a socket wait, a statement or a
#: subprocess when its lease is lost (``controltable.interrupt``). Our handler is installed only
#: while a block is armed, and a signal we did not send goes to the handler it replaced; name
#: another (e.g. ``"SIGUSR2"``) if the process gives SIGUSR1 a meaning of its own.
INTERRUPT_SIGNAL = "SIGUSR1"
#: Seconds ``controltable run`` gives its command between SIGTERM and SIGKILL when the lease is lost.
RUN_STOP_GRACE = 10.0

# -- statements per dialect ----------------------------------------------------------------------
#: The most rows one claim or completion statement touches on SQL Server. A statement that takes
#: about 5,000 locks on one table or index escalates to a table lock (ROWLOCK does not prevent
#: it); an event row changed by a claim holds a key lock in the table and in each claim index.
MSSQL_ROWS_PER_STATEMENT = 1000
#: Fencing tokens: the low bits count grants within one server epoch (a PostgreSQL timeline), the
#: high bits are the epoch minus one, so a token issued after a promotion exceeds every token of the
#: timelines before it, lost commits included (docs/production-databases.md has the proof). 2**40
#: grants per resource and timeline is 35 years at 1,000 grants a second; 2**23 timelines fit in 63
#: bits, and tokens stay below 2**53 (exact in JSON) up to timeline 8192.
TOKEN_EPOCH_BITS = 40
#: How long an ``acquire()`` that fails (database unreachable, interrupted, any error) tries to
#: withdraw its queue entry before it lets the error through (seconds): within the caller's
#: ``TIMEOUT_MARGIN``. A withdrawal that did not get through is retried in the background, by
#: its request key, every ``WITHDRAW_RETRY_INTERVAL`` seconds until it does or the entry lapsed.
WITHDRAW_GRACE = 2.0
#: See ``WITHDRAW_GRACE``.
WITHDRAW_RETRY_INTERVAL = 0.5
#: How long ``prepare()`` waits for the lock its DDL needs on a busy table (seconds) before it
#: gives up with an error that says to retry or run the printed DDL in a quiet moment.
DDL_LOCK_TIMEOUT = 30
#: The longest one DDL statement's lock request may wait (seconds) before it is withdrawn and
#: retried, within ``DDL_LOCK_TIMEOUT`` in all: a queued ALTER blocks every new reader and writer
#: of the table behind it (PostgreSQL, SQL Server, MySQL metadata locks), so it never queues long.
DDL_LOCK_RETRY_WAIT = 2
#: Rows per transaction when SQL Server's metadata-only ``prepare()`` sets its new columns.
DDL_BACKFILL_BATCH = 1000
#: How long ``install()`` keeps re-running an idempotent DDL step that met a concurrent install's lock
#: (seconds); past it the ``DatabaseBusyError`` reaches the caller.
INSTALL_BUSY_WINDOW = 30.0

# -- connections and timeouts (overridable: ControlTable(url, connect_timeout=..., statement_timeout=...),
# -- CLI --connect-timeout / --statement-timeout) ------------------------------------------------------
#: Seconds to wait for a connection, including the server's greeting and the login: a server
#: that accepts TCP connections and never answers fails after this long, not after the kernel's
#: TCP timeouts (minutes). libpq rounds up to whole seconds and takes at least 2.
CONNECT_TIMEOUT = 10.0
#: Seconds one statement may run, lock waits included, before the database (or, where the
#: server has no such setting, the driver) cancels it. PostgreSQL ``statement_timeout``,
#: MariaDB ``max_statement_time`` / MySQL ``max_execution_time`` (SELECTs), SQL Server's ODBC
#: query timeout, Oracle's ``call_timeout``, SQLite's busy timeout. ``None`` (or 0) leaves the
#: server's own setting. Raise it for ``EventTable.prepare()`` on a very large table, whose
#: index build is one statement.
STATEMENT_TIMEOUT = 120.0
#: Seconds a call waits for a pooled connection while all 15 (5 + 10 at peaks) are in use, past which
#: it raises ``DatabaseBusyError``. A ``ControlTable``'s pool is shared by its threads: SQLAlchemy's 30 s.
POOL_TIMEOUT = 30.0
#: The same for an ``AsyncControlTable`` on a server (PostgreSQL, MySQL/MariaDB), whose pool every
#: task of its event loop shares (a thousand waiting tasks are its use): a burst of tasks that each
#: need a statement at once (all entering the queue, say) waits its turn in the pool's FIFO, about
#: (tasks / 15) statement times, which took over 30 s for 1,000 tasks on a loaded machine (CI). Ten
#: times the threads' bound, still a bound; a lease's renewal is bounded by the lease's end instead.
ASYNC_POOL_TIMEOUT = 300.0
#: TCP keepalives on server connections: first probe after this many idle seconds...
KEEPALIVE_IDLE = 10
#: ...then one probe every this many seconds...
KEEPALIVE_INTERVAL = 5
#: ...and the connection is declared dead after this many unanswered probes (about 25 s in all),
#: so a black-holed connection fails instead of hanging a worker past its lease.
KEEPALIVE_COUNT = 3
#: Milliseconds sent data may stay unacknowledged before the kernel drops the connection
#: (Linux ``TCP_USER_TIMEOUT``, PostgreSQL ``tcp_user_timeout``).
TCP_USER_TIMEOUT_MS = 30_000
#: How long the wake-up listener waits, at start, for a notification it sent to itself (seconds).
#: Behind a pooler in transaction mode it never arrives: push is then reported inactive and
#: waiters poll. A direct connection delivers it within milliseconds.
PUSH_PROBE_TIMEOUT = 2.0
#: The environment variable holding ``listen_url``: a direct URL of the PostgreSQL server for the
#: wake-up listener when the work URL goes through a connection pooler.
LISTEN_URL_ENV = "CONTROLTABLE_LISTEN_URL"
#: The client-side read/write timeout of MySQL/MariaDB connections is the statement timeout plus
#: this margin, so the server's own cancellation (a clear error) normally comes first.
CLIENT_TIMEOUT_MARGIN = 10.0
#: SQLite's busy timeout (seconds) when no statement timeout is set.
SQLITE_BUSY_TIMEOUT = 60.0
#: The promise of every call with a timeout (``acquire(timeout=)``, ``try_acquire``, ``claim(wait=)``,
#: ``allocate(wait=)``): it returns, with its answer or an error, within its timeout plus this many
#: seconds, whatever the network does (a peer that ACKs and never answers, a dropped path). The
#: parts below add up to less: the last transaction's grace, a statement's grace, the cancel's.
TIMEOUT_MARGIN = 5.0
#: A statement still running when its caller's deadline passes gets this much longer (seconds)
#: before the client cancels it: a withdrawal after a timeout must still reach the database.
#: The worst case of ``acquire(timeout=t)`` on a silent network: t + the slot engine's 1 s
#: ``DEADLINE_GRACE`` + this + ``WITHDRAW_GRACE`` + this = t + 4 s, within ``TIMEOUT_MARGIN``.
DEADLINE_STATEMENT_GRACE = 0.5
#: A lease holder's renew/check runs under a deadline of the lease's expiry (on this machine's
#: monotonic clock, counted from when the grant or last renewal was sent) plus this many seconds;
#: a call that could not reach the database by then raises ``LeaseLost``. With the statement grace
#: and the cancel that is well within ``TIMEOUT_MARGIN`` after the expiry.
LEASE_CALL_GRACE = 1.0
#: ``WorkList.items(timeout=)``: a statement run after the timeout (the consumer held the generator
#: past it) still gets this many seconds from when the generator resumed, then the statement grace.
RESUME_CALL_GRACE = 1.0
#: After the client cancels an overrunning statement (PostgreSQL: a cancel request), it waits this
#: long (seconds) for the answer before it closes the socket itself (a silent network: the cancel
#: is not answered either); the connection is discarded either way.
CANCEL_GRACE = 1.0
#: Retries of a transaction that failed in a way that is safe to repeat (see ``Database.run``).
RETRIES = 5

# -- limits of numbers (enforced by ``controltable.validation``; the plugins reuse it) ------------
#: Whole numbers stored in a column fit a 32-bit signed INTEGER on every backend.
MAX_INT = 2**31 - 1
#: Capacity of a resource, and slots of one request.
MAX_CAPACITY = MAX_INT
#: Rows in one claimed batch (claims are split into statements of at most a few thousand keys).
MAX_BATCH_SIZE = 100_000
#: Attempts before an event goes to the error state.
MAX_ATTEMPTS = MAX_INT
#: Work-list execution order: 1 (runs first) up to MAX_INT. Order 0 and negative orders are
#: refused, so "order" always reads as a rank.
MIN_ORDER = 1
MAX_ORDER = MAX_INT
#: Work-list priority within an order: any 32-bit signed value (higher runs first).
MIN_PRIORITY = -(2**31)
MAX_PRIORITY = MAX_INT
#: The longest lease, waiter TTL, pickup, back-off or timeout (seconds): 30 days. Longer holds
#: are renewed; a timeout of ``None`` waits forever. Non-finite values (inf, nan) are refused.
MAX_SECONDS = 30 * 86400.0
#: The longest poll interval (seconds).
MAX_POLL_SECONDS = 3600.0
#: The shortest lease (slot, batch, work item; seconds). A shorter one runs out before the reply
#: that grants it has crossed a network, and its renewer (every third of the lease) would spin on
#: the database; leases in production are minutes. 50 ms still lets tests watch a lease expire.
MIN_LEASE = 0.05
#: The shortest waiter TTL (seconds): waiters refresh their queue entry every half of it.
MIN_WAITER_TTL = 0.5
#: The shortest pickup window (seconds): a grant made on a waiter's behalf must outlast the wake-up
#: (or the next poll) that tells the waiter, else every grant lapses before it is seen.
MIN_PICKUP = 1.0
#: The shortest poll interval (seconds): below it a waiter polls the database in a busy loop.
MIN_POLL_SECONDS = 0.01
#: The lower bounds of durations by argument name, applied by ``validation.check_seconds`` (the
#: one place every surface checks durations through).
MIN_SECONDS = {"lease": MIN_LEASE, "waiter_ttl": MIN_WAITER_TTL, "pickup": MIN_PICKUP}
#: The longest failure reason stored (characters), for ``Item.fail()`` and ``Batch.fail()`` alike
#: (an event table's error column holds 2,000); a longer one is cut with a marker saying how much.
FAIL_REASON_LENGTH = 2000
#: The longest connect timeout (seconds).
MAX_CONNECT_TIMEOUT = 3600.0
#: The longest statement timeout (seconds); PostgreSQL's limit is about 24.8 days.
MAX_STATEMENT_TIMEOUT = 86400.0
#: The most transaction retries.
MAX_RETRIES = 100

# -- the status page (``controltable serve``, ``controltable.web``) ---------------------------------
#: Where ``controltable serve`` listens: loopback only unless told otherwise, since the page shows
#: holder ids and event errors.
WEB_HOST = "127.0.0.1"
WEB_PORT = 8787
#: How often the page asks for fresh data (seconds); each request reads the control tables once.
WEB_POLL_INTERVAL = 2.0
#: Error rows shown per event table and per work list (the newest first).
WEB_ERROR_ROWS = 20
#: The environment variable holding the token that actions (release a holder, change a capacity)
#: require; ``serve --actions`` refuses to start without it.
WEB_TOKEN_ENV = "CONTROLTABLE_WEB_TOKEN"


# -- the integrations' log lines (``controltable.waiting_text``) -------------------------------------
#: Holders and waiters ahead a "position 3 behind a, b and c" line names before "and N more".
AHEAD_SHOWN = 5
