"""Cancel, in the server, the MySQL statements a piece of work has running when it must stop.

Work that must stop (an orchestrator's kill, a lost lease) is interrupted with an exception
raised into its thread: psycopg 3 then cancels its running statement itself (on
``KeyboardInterrupt``). MySQL drivers (PyMySQL, mysqlclient) do not: the client gives up, and the
server runs the statement to its end, committing a write after the slot went to the next holder.
So while the work runs, the statements it runs through SQLAlchemy on a MySQL connection are noted
(the connection's thread id), and whoever stops the work, before it raises, has the server stop
them with ``KILL QUERY`` over a connection of its own. Used by the Airflow provider's kill path;
core and plugins share this one mechanism.

Only statements of the thread that runs the work (the task's main thread) are noted; the tracking
is installed for the work's duration only (SQLAlchemy's class-level ``Engine`` events).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .dialects import traits

log = logging.getLogger("controltable")

#: Seconds the kill waits for the KILL QUERY statements to be sent (a connection of their own).
CANCEL_TIMEOUT = 5.0


class RunningStatements:
    """The MySQL statements the work has running now: (engine URL, server thread id) per cursor."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.running: dict[int, tuple[Any, int]] = {}
        self._lock = threading.Lock()

    def before(self, conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, many: Any) -> None:
        if threading.get_ident() != self.thread or not traits(conn.dialect.name).kill_query:
            return
        try:
            thread_id = int(conn.connection.dbapi_connection.thread_id())
        except Exception:  # a driver without thread_id(): nothing to cancel it by
            return
        with self._lock:
            self.running[id(cursor)] = (conn.engine.url, thread_id)

    def after(self, conn: Any, cursor: Any, *args: Any) -> None:
        with self._lock:
            self.running.pop(id(cursor), None)

    def failed(self, context: Any) -> None:
        cursor = getattr(context, "cursor", None)
        if cursor is not None:
            self.after(None, cursor)

    def cancel(self) -> int:
        """``KILL QUERY`` every noted statement (bounded by ``CANCEL_TIMEOUT``); returns how many were sent."""
        with self._lock:
            targets = list(self.running.values())
        if not targets:
            return 0
        sent: list[int] = []

        def kill() -> None:
            from sqlalchemy import create_engine
            from sqlalchemy.pool import NullPool

            for url, thread_id in targets:
                engine = create_engine(url, poolclass=NullPool)
                try:
                    with engine.connect() as conn:
                        conn.exec_driver_sql(f"KILL QUERY {int(thread_id)}")  # an int: nothing user-given
                    sent.append(thread_id)
                except Exception as exc:
                    log.warning("controltable: could not cancel MySQL statement of thread %s: %s", thread_id, exc)
                finally:
                    engine.dispose()

        helper = threading.Thread(target=kill, name="controltable-cancel", daemon=True)
        helper.start()
        helper.join(CANCEL_TIMEOUT)
        if sent:
            log.info("controltable: cancelled %d running MySQL statement(s) of the killed work", len(sent))
        return len(sent)


@contextmanager
def tracked_statements() -> Iterator[RunningStatements]:
    """Note the MySQL statements this thread runs through SQLAlchemy while the block runs."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    tracker = RunningStatements()
    hooks = (("before_cursor_execute", tracker.before), ("after_cursor_execute", tracker.after),
             ("handle_error", tracker.failed))
    for name, fn in hooks:
        event.listen(Engine, name, fn)
    try:
        yield tracker
    finally:
        for name, fn in hooks:
            event.remove(Engine, name, fn)
