"""Cancel, in the server, the statements a piece of work has running when it must stop.

Work that must stop (a lost lease, an orchestrator's kill) is interrupted in its thread
(:mod:`controltable.interrupt`), but a statement the server is running goes on by itself: the
client gives up, and the server runs it to its end, committing a write after the slot went to the
next holder (MySQL drivers; psycopg cancels only on ``KeyboardInterrupt``; SQLite's C loop never
looks at Python signals). So while the work runs, the statements its thread runs through SQLAlchemy
are noted, and whoever stops the work has them cancelled first, from another thread:

* a driver connection with a thread-safe ``cancel_safe()``/``cancel()`` (psycopg 3, psycopg2) sends
  the server a cancel request; one with ``interrupt()`` (sqlite3) stops its running statement;
* on a backend whose traits say ``kill_query`` (MySQL, MariaDB) the server stops it on
  ``KILL QUERY <thread id>`` sent over a connection of its own.

The statement then fails in the work's thread (the server's "cancelled" error), and its
transaction rolls back. One set of listeners on SQLAlchemy's ``Engine`` class, installed on first
use, notes a statement only for threads that asked (:func:`track_thread`); the lease interrupt and
the Airflow provider's kill path share this one mechanism.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from . import threads
from .dialects import traits

log = logging.getLogger("controltable")

#: Seconds the kill waits for the cancel requests to be sent (a connection of their own).
CANCEL_TIMEOUT = 5.0


class RunningStatements:
    """The statements one thread has running now, each with what cancels it."""

    def __init__(self, thread: Optional[int] = None) -> None:
        self.thread = threading.get_ident() if thread is None else thread
        #: Per cursor: ("kill", (engine URL, server thread id)) or ("call", the driver's cancel method).
        self.running: dict[int, tuple[str, Any]] = {}
        self._lock = threading.Lock()

    def before(self, conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, many: Any) -> None:
        how = _canceller(conn)
        if how is not None:
            with self._lock:
                self.running[id(cursor)] = how

    def after(self, conn: Any, cursor: Any, *args: Any) -> None:
        with self._lock:
            self.running.pop(id(cursor), None)

    def failed(self, context: Any) -> None:
        cursor = getattr(context, "cursor", None)
        if cursor is not None:
            self.after(None, cursor)

    def cancel(self, wait: float = CANCEL_TIMEOUT) -> int:
        """Cancel every noted statement, waiting at most ``wait`` seconds; returns how many were cancelled.

        The requests are sent from a helper thread, so a silent server cannot hold the caller
        longer than ``wait`` (the requests may still arrive after it).
        """
        with self._lock:
            targets = list(self.running.values())
        if not targets:
            return 0
        sent: list[object] = []
        helper = threading.Thread(target=_cancel_all, args=(targets, sent), name="controltable-cancel", daemon=True)
        threads.start(helper)
        helper.join(wait)
        if sent:
            log.info("controltable: cancelled %d running statement(s) of the stopped work", len(sent))
        return len(sent)


def _canceller(conn: Any) -> Optional[tuple[str, Any]]:
    """How a statement on this SQLAlchemy connection is cancelled from another thread, if it can be."""
    try:
        dbapi = conn.connection.dbapi_connection
    except Exception:
        return None
    if traits(conn.dialect.name).kill_query:
        try:
            return ("kill", (conn.engine.url, int(dbapi.thread_id())))
        except Exception:  # a driver without thread_id(): nothing to cancel it by
            return None
    for name in ("cancel_safe", "cancel", "interrupt"):  # psycopg 3.2+, psycopg/psycopg2, sqlite3
        method: Optional[Callable[[], Any]] = getattr(dbapi, name, None)
        if callable(method):
            return ("call", method)
    return None


def _cancel_all(targets: list[tuple[str, Any]], sent: list[object]) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    for how, what in targets:
        try:
            if how == "call":
                what()
                sent.append(what)
                continue
            url, thread_id = what
            engine = create_engine(url, poolclass=NullPool)
            try:
                with engine.connect() as conn:
                    conn.exec_driver_sql(f"KILL QUERY {int(thread_id)}")  # an int: nothing user-given
                sent.append(thread_id)
            finally:
                engine.dispose()
        except Exception as exc:
            log.warning("controltable: could not cancel a running statement (%s): %s", what, exc)


# -- which threads are tracked ---------------------------------------------------------------------
#: Per thread ident: the trackers that thread's statements are noted in (nested blocks: several).
_TRACKED: dict[int, list[RunningStatements]] = {}
_LISTENING = False
_LISTEN_LOCK = threading.Lock()


def _each(thread: int) -> list[RunningStatements]:
    return list(_TRACKED.get(thread, ()))


def _before(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, many: Any) -> None:
    for tracker in _each(threading.get_ident()):
        tracker.before(conn, cursor, statement, parameters, context, many)


def _after(conn: Any, cursor: Any, *args: Any) -> None:
    for tracker in _each(threading.get_ident()):
        tracker.after(conn, cursor)


def _failed(context: Any) -> None:
    for tracker in _each(threading.get_ident()):
        tracker.failed(context)


def _listen() -> None:
    """Install the ``Engine`` listeners once per process (adding and removing them per block is not thread-safe)."""
    global _LISTENING
    with _LISTEN_LOCK:
        if _LISTENING:
            return
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "before_cursor_execute", _before)
        event.listen(Engine, "after_cursor_execute", _after)
        event.listen(Engine, "handle_error", _failed)
        _LISTENING = True


def track_thread(tracker: RunningStatements) -> None:
    """Note the statements of ``tracker.thread`` in ``tracker`` from now on."""
    _listen()
    with _LISTEN_LOCK:
        _TRACKED.setdefault(tracker.thread, []).append(tracker)


def untrack_thread(tracker: RunningStatements) -> None:
    with _LISTEN_LOCK:
        trackers = _TRACKED.get(tracker.thread)
        if trackers and tracker in trackers:
            trackers.remove(tracker)
            if not trackers:
                del _TRACKED[tracker.thread]
