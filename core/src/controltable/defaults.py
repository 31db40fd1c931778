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

# -- slots -------------------------------------------------------------------------------------
#: The mode of a slot request when none is given: a counting semaphore (``set_capacity(r, 3)``
#: means three holders), as Airflow pools, Dagster pools and Prefect limits mean a limit.
DEFAULT_MODE = "shared"
#: A slot holder's lease (seconds); ``slot()`` renews it in the background every third of it.
DEFAULT_LEASE = 300.0
#: How long a waiter's queue entry survives without a poll.
DEFAULT_WAITER_TTL = 30.0

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

# -- statements per dialect ----------------------------------------------------------------------
#: The most rows one claim or completion statement touches on SQL Server. A statement that takes
#: about 5,000 locks on one table or index escalates to a table lock (ROWLOCK does not prevent
#: it); an event row changed by a claim holds a key lock in the table and in each claim index.
MSSQL_ROWS_PER_STATEMENT = 1000
#: How long ``prepare()`` waits for the lock its DDL needs on a busy table (seconds) before it
#: gives up with an error that says to retry or run the printed DDL in a quiet moment.
DDL_LOCK_TIMEOUT = 30
#: The server versions ``controltable sql`` compiles for when none is given (what a connected
#: engine would detect): SQL Server 2019, Oracle 19c.
SQL_SERVER_VERSIONS = {"mssql": (15, 0), "oracle": (19, 0), "postgresql": (15, 0), "mysql": (8, 0), "sqlite": (3, 40)}
