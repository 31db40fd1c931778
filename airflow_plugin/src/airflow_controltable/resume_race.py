"""The scheduler-race workaround: the deferral's facts, and when a trigger may fire without Airflow failing the task.

Airflow 3.3's scheduler fails a task resumed from deferral if it handles the
executor's (stale) "success" event of the process that deferred only after it queued the resumed
task (see :mod:`airflow_controltable.defaults`). That event comes at the latest ``[workers]
min_heartbeat_interval`` after the deferring process exited, and the scheduler reads it on its next
loop. So a trigger given the deferral's facts (``deferral``) fires no sooner than ``settle`` seconds
after that process exited: watched through its pid when the triggerer runs on the same host (and
can see the process alive), else assumed ``DEFAULT_EXIT_ALLOWANCE`` seconds after the deferral;
and then until the scheduler has heartbeated twice after the exit report was due (read from
Airflow's health endpoint, when it answers), since a busy scheduler's loop can outlast any fixed
margin. The heartbeats are watched from the exit on, beside the wait, by one reader per triggerer
(:class:`SchedulerBeats`): a grant that comes after that fires at once. A grant is held meanwhile
(its pick-up lease covers it), so only grants that come within seconds of a deferral wait.

When the triggerer can see the LocalExecutor worker that supervises the deferring process
(:func:`exit_reporter`), it watches when that worker queues the exit report instead of assuming it
``min_heartbeat_interval`` after the exit, and the two heartbeats after that moment are the whole
wait (the fixed settle, a guess at the same thing, is then skipped). What stays: the scheduler
records nothing per loop that a trigger can read (no metadata row, no API field), only its
heartbeat, every ``[scheduler] scheduler_heartbeat_sec``; the loop that reads the report is proven
finished only by the second heartbeat after it, so a grant within seconds of its deferral waits
one to two heartbeat periods (5-10 s by default). Firing sooner reopens the race.

The facts are taken in the deferring task's process (:func:`deferral_facts`, travelling in the
trigger's kwargs); :class:`SettleBeforeFiring` is the triggers' side.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import weakref
from typing import Any, Optional

from airflow_controltable.defaults import (
    DEFAULT_EXIT_ALLOWANCE,
    DEFAULT_RESUME_MARGIN,
    RESUME_GUARD_AIRFLOW,
    SCHEDULER_CATCH_UP_LIMIT,
    SCHEDULER_HEARTBEAT_POLL,
    WORKER_MIN_HEARTBEAT_INTERVAL,
    WORKER_TASK_SUCCESS_OVERTIME,
)

log = logging.getLogger("airflow_controltable.triggers")  # the triggers' logger: this runs in their wait


# -- the facts, taken in the deferring process ------------------------------------------------------
def _airflow_conf(section: str, key: str, fallback: float) -> float:
    """A number from Airflow's configuration as this process sees it, or ``fallback`` without one."""
    try:
        from airflow.sdk import conf

        return float(conf.get(section, key, fallback=str(fallback)))
    except Exception:  # no Airflow configuration available (plain Python use)
        return fallback


def resume_settle() -> float:
    """Seconds a trigger waits after the deferring process exited before it may fire (see ``defaults``).

    ``[controltable] resume_settle`` when set; otherwise this worker's ``[workers]
    min_heartbeat_interval`` (how late its supervisor may notice the exit) plus
    ``DEFAULT_RESUME_MARGIN`` (one scheduler loop). Read in the deferring task's process, whose
    configuration is the supervisor's.
    """
    configured = _airflow_conf("controltable", "resume_settle", -1.0)
    if configured >= 0:
        return configured
    heartbeat = _airflow_conf("workers", "min_heartbeat_interval", WORKER_MIN_HEARTBEAT_INTERVAL)
    return max(heartbeat, 0.0) + DEFAULT_RESUME_MARGIN


def deferral_facts() -> Optional[dict[str, Any]]:
    """What a trigger needs to know about the process that is deferring now, to fire only when that is safe.

    The time, the settle (:func:`resume_settle`), how long Airflow lets a finished task process
    linger before killing it, the process itself (host, pid, start time) so that a triggerer on
    the same host can watch it exit, and the worker that will report that exit (:func:`exit_reporter`).
    JSON-serialisable: it travels in the trigger's kwargs. None when ``[controltable] resume_settle``
    is 0: the protection is off and the trigger fires at once.
    """
    settle = resume_settle()
    if settle <= 0:
        return None
    created: Optional[float] = None
    try:
        import psutil

        created = float(psutil.Process().create_time())
    except Exception:  # no psutil: the trigger cannot tell this process from a later one with its pid
        created = None
    return {
        "at": time.time(),
        "settle": settle,
        "reporter": exit_reporter(),
        "wake": max(_airflow_conf("workers", "min_heartbeat_interval", WORKER_MIN_HEARTBEAT_INTERVAL), 0.0),
        "linger": _airflow_conf("core", "task_success_overtime", WORKER_TASK_SUCCESS_OVERTIME),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "created": created,
    }


#: How Airflow's LocalExecutor titles its worker processes (``local_executor._get_executor_process_title_prefix``).
LOCAL_EXECUTOR_WORKER_TITLE = "airflow worker -- LocalExecutor"


def _current_ti_id() -> Optional[str]:
    """The running task instance's id (what the LocalExecutor names its worker after), or None outside a task."""
    try:
        from airflow.sdk import get_current_context

        ti_id = getattr(get_current_context()["ti"], "id", None)
        return str(ti_id) if ti_id else None
    except Exception:  # no task context (plain Python, a test)
        return None


def exit_reporter(workload: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The process that will report this process's exit to the scheduler, when the triggerer can watch it.

    Airflow's LocalExecutor runs each task under a worker process that titles itself after the task
    instance it supervises (``airflow worker -- LocalExecutor: <ti id>``) and puts the executor
    event on the scheduler's result queue *before* it titles itself ``<idle>`` again
    (``airflow/executors/local_executor.py: _run_worker``). So once that parent no longer carries the
    task instance's id in its title, the exit report has been queued: the trigger then knows when the
    report came instead of assuming ``[workers] min_heartbeat_interval`` after the exit. None when the
    parent's title does not name this task instance (another executor, no ``setproctitle``, no task
    context): the trigger then assumes the report as before.
    """
    workload = workload or _current_ti_id()
    if not workload:
        return None
    try:
        import psutil

        parent = psutil.Process().parent()
        title = " ".join(parent.cmdline()) if parent is not None else ""
        # Only a LocalExecutor worker queues the report on the scheduler's own result pipe; other
        # executors' supervisors are titled after the task too ("airflow supervisor: <ti id>"), but
        # report through a broker, and their pipes prove nothing about the scheduler.
        if parent is None or not title.startswith(LOCAL_EXECUTOR_WORKER_TITLE) or workload not in title:
            return None
        return {"pid": parent.pid, "created": float(parent.create_time()), "workload": workload}
    except Exception:  # no psutil, or the parent is not ours to see
        return None


def reporter_busy(reporter: dict[str, Any]) -> Optional[bool]:
    """Whether the reporting process still supervises the workload (has not queued its exit report yet).

    False once its title no longer names the workload or it is gone (a gone worker reports nothing
    more); None when it cannot be looked at (no psutil, another user's process): unknown, and the
    trigger then assumes the report as if there were no reporter.
    """
    try:
        import psutil
    except ImportError:
        return None
    try:
        proc = psutil.Process(int(reporter["pid"]))
        if abs(proc.create_time() - float(reporter["created"])) > 0.5:
            return False  # the pid was reused: the reporter itself is gone
        return str(reporter["workload"]) in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return False
    except Exception:  # AccessDenied and the like: cannot tell
        return None


def reporter_pipes(reporter: dict[str, Any]) -> Optional[dict[str, str]]:
    """The reporter's pipes (``pipe:[inode]`` -> a ``/proc`` path that opens it); None when they cannot be seen.

    A LocalExecutor worker queues its events on the scheduler's result queue, a pipe it holds the
    write end of (``multiprocessing.SimpleQueue``), and only the scheduler reads that pipe
    (``LocalExecutor._read_results``, in its heartbeat's ``sync``). Linux only (``/proc``).
    """
    base = f"/proc/{int(reporter['pid'])}/fd"
    try:
        import psutil

        if abs(psutil.Process(int(reporter["pid"])).create_time() - float(reporter["created"])) > 0.5:
            return None  # the pid now belongs to another process
    except Exception:  # gone, not ours to see, or no psutil
        return None
    try:
        found: dict[str, str] = {}
        for name in os.listdir(base):
            try:
                target = os.readlink(f"{base}/{name}")
            except OSError:
                continue
            if target.startswith("pipe:"):
                found.setdefault(target, f"{base}/{name}")
        return found or None
    except OSError:  # not Linux, the process is gone, or not ours to look into
        return None


def pipe_unread(pipe: str, path: str) -> Optional[int]:
    """Bytes written to ``pipe`` and not read yet (opened through ``path``, never read); None if it cannot be told."""
    import array
    import fcntl
    import termios

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != pipe:
            return None  # the descriptor number now names something else
        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
        return int(count[0])
    except OSError:
        return None
    finally:
        os.close(fd)


def airflow_guards_resume() -> bool:
    """Whether this Airflow's scheduler ignores a *scheduled* resumed task's stale event (``RESUME_GUARD_AIRFLOW``)."""
    try:
        import airflow
        from packaging.version import Version

        return Version(str(airflow.__version__)) >= Version(RESUME_GUARD_AIRFLOW)
    except Exception:
        return False


def pipes_drained(unread: dict[str, Optional[int]], drained: set[str]) -> Optional[bool]:
    """Whether every pipe was seen empty at least once since the report was queued (a pure decision).

    ``unread`` is one look (bytes unread per pipe), ``drained`` the pipes seen empty so far (updated).
    The report was written before the look began, so the result pipe seen empty means the scheduler
    read it; which pipe that is is not known, so every pipe must have been seen empty. None when a
    pipe cannot be looked at: no proof this way.
    """
    for pipe, count in unread.items():
        if count is None:
            return None
        if count == 0:
            drained.add(pipe)
    return set(unread) <= drained


# -- what the trigger sees: the deferring process's exit, and the scheduler's heartbeats -------------
#: How often the trigger looks whether the deferring process has exited (seconds).
EXIT_WATCH_INTERVAL = 0.25
#: How often the trigger looks whether the scheduler has read the exit report (a few syscalls).
DRAIN_WATCH_INTERVAL = 0.1


def process_alive(pid: int, created: Optional[float]) -> bool:
    """Whether process ``pid`` (started at ``created``, when known) still runs on this host; a zombie has exited."""
    try:
        import psutil

        proc = psutil.Process(int(pid))
        if created is not None and abs(proc.create_time() - float(created)) > 0.5:
            return False  # the pid was reused by another process
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except Exception:  # gone (NoSuchProcess), not ours to see (AccessDenied), or no psutil
        return False


def in_deferring_process(deferral: dict[str, Any]) -> bool:
    """Whether this trigger runs in the very process that deferred (``dag.test()`` / ``airflow dags test``).

    There the trigger runs inline, no executor reports the deferral's exit, and the process never
    exits while the trigger waits: nothing to wait for.
    """
    return deferral.get("host") == socket.gethostname() and deferral.get("pid") == os.getpid()


def exit_time(
    deferral: dict[str, Any], first_seen_alive: bool, now: float, exited_seen: Optional[float],
    first_look: Optional[float] = None,
) -> float:
    """When the deferring process exited, as far as the trigger can tell (a pure decision, unit tested).

    ``first_look`` is when the trigger first looked for the process on this host (None: it could
    not look, the process runs on another host); ``exited_seen`` is when it saw the process gone
    after having seen it alive. A process already gone at the first look exited before it; one the
    trigger could not look for is assumed gone ``DEFAULT_EXIT_ALLOWANCE`` seconds after the
    deferral. Airflow kills a process that lingers ``linger`` seconds after its task ended, so no
    exit is later than that (plus the same allowance).
    """
    at = float(deferral.get("at") or 0.0)
    latest = at + float(deferral.get("linger") or 0.0) + DEFAULT_EXIT_ALLOWANCE
    if not first_seen_alive:
        if first_look is None:
            return at + DEFAULT_EXIT_ALLOWANCE
        return min(max(first_look, at), latest)
    if exited_seen is None:
        return min(max(now, at), latest)
    return min(exited_seen, latest)


def fire_not_before(deferral: Optional[dict[str, Any]], not_before: Optional[float], exited: Optional[float]) -> float:
    """Epoch seconds before which the trigger must not fire: ``settle`` after the exit, and ``not_before``."""
    earliest = float(not_before or 0.0)
    if deferral is not None and exited is not None:
        earliest = max(earliest, exited + float(deferral.get("settle") or 0.0))
    return earliest


def scheduler_caught_up(report_due: float, heartbeats: list[float]) -> bool:
    """Whether the scheduler has surely read an executor report queued by ``report_due`` (a pure decision).

    ``heartbeats`` are the scheduler's distinct heartbeat times as observed, oldest first. A
    heartbeat is written at the end of a scheduler loop, and every loop reads the executor's
    reports; so once a heartbeat later than ``report_due`` has been seen, the loop that ends with
    the next heartbeat started after the report was queued, and has read and handled it.
    """
    later = [h for h in heartbeats if h > report_due]
    return len(later) >= 2


def health_url() -> Optional[str]:
    """Airflow's health endpoint (it names the scheduler's latest heartbeat), from this process's configuration."""
    try:
        from urllib.parse import urlsplit

        from airflow.sdk import conf

        base = conf.get("core", "execution_api_server_url", fallback="") or conf.get("api", "base_url", fallback="")
        parts = urlsplit(str(base))
        if not parts.scheme or not parts.netloc:
            return None
        return f"{parts.scheme}://{parts.netloc}/api/v2/monitor/health"
    except Exception:
        return None


def read_scheduler_heartbeat(url: str) -> Optional[float]:
    """The scheduler's latest heartbeat (epoch seconds) from the health endpoint, or None if unavailable."""
    import json
    import urllib.request
    from datetime import datetime

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - Airflow's own api-server
            body = json.loads(resp.read())
        stamp = (body.get("scheduler") or {}).get("latest_scheduler_heartbeat")
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp() if stamp else None
    except Exception:
        return None


class SchedulerBeats:
    """The scheduler's heartbeats as this triggerer's event loop has seen them: one reader for all triggers.

    Each deferred trigger needs to know when the scheduler has read its deferral's exit report
    (:func:`scheduler_caught_up`). Observing that only once the slot is granted made every grant wait
    for the scheduler's next heartbeat or two, even a grant made long after the deferral, when the
    race cannot happen any more. So a trigger registers as soon as it knows when its deferring
    process exited, and one reader per event loop polls Airflow's health endpoint while any trigger
    is registered (every ``SCHEDULER_HEARTBEAT_POLL`` s, however many triggers wait): a grant that
    comes after the scheduler caught up fires at once; only one that comes within a few heartbeats
    of its deferral waits.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.beats: list[float] = []  # distinct heartbeats seen, oldest first (the last few)
        self.waiting = 0
        self.unavailable = False
        self._reader: Optional[asyncio.Task[None]] = None

    async def _read(self) -> None:
        while self.waiting > 0:
            beat = await asyncio.to_thread(read_scheduler_heartbeat, self.url)
            if beat is None:
                self.unavailable = True  # no health endpoint: the settle alone applies
                return
            if not self.beats or beat != self.beats[-1]:
                self.beats = [*self.beats[-31:], beat]
            await asyncio.sleep(SCHEDULER_HEARTBEAT_POLL)

    async def caught_up(self, report_due: float, limit: float) -> Optional[bool]:
        """Wait (at most ``limit`` s) until the scheduler surely read a report due at ``report_due``;
        None when the heartbeat cannot be read."""
        self.waiting += 1
        try:
            if self._reader is None or self._reader.done():
                self.unavailable = False
                self._reader = asyncio.ensure_future(self._read())
            deadline = time.time() + limit
            while not scheduler_caught_up(report_due, self.beats):
                if self.unavailable:
                    return None
                if time.time() >= deadline:
                    return False
                await asyncio.sleep(min(SCHEDULER_HEARTBEAT_POLL / 2, max(deadline - time.time(), 0.0)))
            return True
        finally:
            self.waiting -= 1


_BEATS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SchedulerBeats] = weakref.WeakKeyDictionary()


def scheduler_beats(url: str) -> SchedulerBeats:
    """The running event loop's :class:`SchedulerBeats` (the triggerer runs every trigger in one loop)."""
    loop = asyncio.get_running_loop()
    beats = _BEATS.get(loop)
    if beats is None or beats.url != url:
        beats = _BEATS[loop] = SchedulerBeats(url)
    return beats


class PipeLooks:
    """The reporters' pipes as this triggerer's event loop has looked at them: one look per pipe per interval.

    Every LocalExecutor worker writes to the same result pipe, so a hundred triggers that wait for
    the scheduler to read it would otherwise look at it a hundred times per interval.
    """

    def __init__(self) -> None:
        self.seen: dict[str, tuple[float, Optional[int]]] = {}  # pipe -> (when the look began, unread bytes)
        self._lock = asyncio.Lock()  # one look at a time: the triggers behind it reuse its answer

    async def look(self, pipes: dict[str, str], since: float) -> dict[str, Optional[int]]:
        """Unread bytes per pipe, from looks that began after ``since`` and less than an interval ago."""
        async with self._lock:
            fresh_from = max(since, time.time() - DRAIN_WATCH_INTERVAL)
            stale = {pipe: path for pipe, path in pipes.items() if self.seen.get(pipe, (0.0, None))[0] < fresh_from}
            if stale:
                began = time.time()
                counts = await asyncio.to_thread(
                    lambda: {pipe: pipe_unread(pipe, path) for pipe, path in stale.items()})
                for pipe, count in counts.items():
                    self.seen[pipe] = (began, count)
            return {pipe: self.seen[pipe][1] for pipe in pipes}


_LOOKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PipeLooks] = weakref.WeakKeyDictionary()


def pipe_looks() -> PipeLooks:
    """The running event loop's :class:`PipeLooks`."""
    loop = asyncio.get_running_loop()
    looks = _LOOKS.get(loop)
    if looks is None:
        looks = _LOOKS[loop] = PipeLooks()
    return looks


class SettleBeforeFiring:
    """The triggers' side of the workaround: hold an event until firing cannot fail the resumed task.

    A trigger calls :meth:`_init_settle` in ``__init__`` with its ``deferral`` facts and
    ``not_before``; its wait loop starts :meth:`_watch_exit` and :meth:`_observe_scheduler` beside
    the wait and awaits :meth:`_settle` before it yields any event.
    """

    deferral: Optional[dict[str, Any]]
    not_before: Optional[float]

    def _init_settle(self, deferral: Optional[dict[str, Any]], not_before: Optional[float]) -> None:
        #: Wall-clock (epoch seconds) before which no event is fired.
        self.not_before = not_before
        #: The deferring process's facts (:func:`deferral_facts`): fire ``settle`` s after it exited.
        self.deferral = dict(deferral) if deferral else None
        self._seen_alive = False
        self._exited_seen: Optional[float] = None
        self._first_look: Optional[float] = None
        #: When the exit report was seen queued (the reporter stopped naming the workload), if watched.
        self._reported_seen: Optional[float] = None
        #: Whether the scheduler was seen to heartbeat twice after the report (None: not known).
        self._caught_up: Optional[bool] = None
        #: When the scheduler was seen to have read the exit report off the reporter's pipe, if seen.
        self._drained_seen: Optional[float] = None
        self._watch_done = deferral is None

    async def _watch_exit(self) -> None:
        """Note when the deferring process exits (same host only); runs beside the wait from the start."""
        deferral = self.deferral
        try:
            if (deferral is None or deferral.get("host") != socket.gethostname() or not deferral.get("pid")
                    or in_deferring_process(deferral)):
                return
            latest = float(deferral.get("at") or 0) + float(deferral.get("linger") or 0) + DEFAULT_EXIT_ALLOWANCE
            self._first_look = time.time()
            while time.time() < latest:
                alive = await asyncio.to_thread(process_alive, int(deferral["pid"]), deferral.get("created"))
                if not alive:
                    if self._seen_alive:
                        self._exited_seen = time.time()
                    break
                self._seen_alive = True
                await asyncio.sleep(EXIT_WATCH_INTERVAL)
            else:
                return  # still running at Airflow's kill: the assumed exit applies
            await self._watch_report(deferral, latest)
        finally:
            self._watch_done = True

    async def _watch_report(self, deferral: dict[str, Any], latest: float) -> None:
        """After the exit: note when the reporter queued the exit report (:func:`exit_reporter`), if it can be seen."""
        reporter = deferral.get("reporter")
        if not reporter:
            return
        # The reporter reports right after it reaps the process (or, if it slept through the exit,
        # at its next wake-up, ``wake`` s later); past that plus Airflow's kill, stop looking.
        until = max(latest, time.time()) + float(deferral.get("wake") or 0.0) + DEFAULT_EXIT_ALLOWANCE
        while time.time() < until:
            busy = await asyncio.to_thread(reporter_busy, reporter)
            if busy is None:
                return
            if not busy:
                self._reported_seen = time.time()
                return
            await asyncio.sleep(EXIT_WATCH_INTERVAL)

    def _exited(self) -> float:
        assert self.deferral is not None
        return exit_time(self.deferral, self._seen_alive, time.time(), self._exited_seen, self._first_look)

    async def _settle(self, watcher: Optional[asyncio.Task[None]], observer: Optional[asyncio.Task[None]]) -> None:
        """Wait until firing cannot make Airflow's scheduler fail the resumed task (module docstring)."""
        exited: Optional[float] = None
        if self.deferral is not None and not in_deferring_process(self.deferral):
            if watcher is not None:
                started = time.time()
                await watcher  # bounded by the deferral's linger
                if time.time() - started > 1.0:
                    log.info("controltable: waited %.1f s for the deferring process to exit%s", time.time() - started,
                             " and its worker to report it" if self._reported_seen is not None else "")
            exited = self._exited()
        if self._reported_seen is not None and observer is not None:
            # The report was seen queued: the scheduler seen reading it, or heartbeating twice after
            # it, proves it was handled; the fixed settle (a guess at the report's time plus one
            # loop) is only the fallback when neither can be seen.
            started = time.time()
            await observer
            if self._drained_seen is not None or self._caught_up:
                log.info("controltable: waited %.1f s for the scheduler to read the deferral's exit report (%s)",
                         time.time() - started, "seen read" if self._drained_seen is not None else "heartbeats")
                await self._sleep_until(fire_not_before(None, self.not_before, None))
                return
        earliest = fire_not_before(self.deferral, self.not_before, exited)
        delay = earliest - time.time()
        if delay > 0:
            log.info("controltable: firing in %.1f s, once Airflow has seen the deferring process exit", delay)
            await asyncio.sleep(delay)
        if observer is not None:
            started = time.time()
            await observer  # bounded by SCHEDULER_CATCH_UP_LIMIT; done long ago for a late grant
            if time.time() - started > 1.0:
                log.info("controltable: waited %.1f s for the scheduler to read the deferral's exit",
                         time.time() - started)

    async def _observe_scheduler(self, watcher: Optional[asyncio.Task[None]]) -> None:
        """From the deferring process's exit on, until the scheduler has surely read its exit report."""
        assert self.deferral is not None
        if watcher is not None:
            await watcher
        report_due = self._reported_seen
        reporter = self.deferral.get("reporter")
        if report_due is None or not reporter:  # not seen: at the latest the supervisor's next wake-up
            await self._scheduler_catch_up(self._exited() + float(self.deferral.get("wake") or 0.0))
            return
        if not airflow_guards_resume():  # the whole loop must be over: the heartbeats after the report
            await self._scheduler_catch_up(report_due)
            return
        # Two ways to know the scheduler read the report; the first to prove it ends the wait.
        drain = asyncio.ensure_future(self._watch_drain(reporter))
        beats = asyncio.ensure_future(self._scheduler_catch_up(report_due))
        pending: set[asyncio.Future[None]] = {drain, beats}
        try:
            while pending and self._drained_seen is None and not self._caught_up:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pending:
                task.cancel()

    async def _watch_drain(self, reporter: dict[str, Any]) -> None:
        """Note when the scheduler has read the exit report off the reporter's pipes (:func:`pipes_drained`).

        The scheduler reads its executor's results in the executor heartbeat of a loop and handles
        them later in that same loop (``process_executor_events``), while the task instance is still
        deferred: the loop's scheduling step, the only one that queues, already ran. A trigger that
        fires after the read makes the task instance scheduled; the next loop queues it, with the
        stale event gone from the executor's buffer.
        """
        pipes = await asyncio.to_thread(reporter_pipes, reporter)
        if not pipes:
            return
        drained: set[str] = set()
        since = self._reported_seen or time.time()
        deadline = time.time() + SCHEDULER_CATCH_UP_LIMIT
        while time.time() < deadline:
            verdict = pipes_drained(await pipe_looks().look(pipes, since), drained)
            if verdict is None:
                return
            if verdict:
                self._drained_seen = time.time()
                return
            await asyncio.sleep(DRAIN_WATCH_INTERVAL)

    async def _scheduler_catch_up(self, report_due: float) -> None:
        """Wait (bounded) until the scheduler has surely read the exit report: a busy scheduler's loop
        can take longer than the settle's margin. Without a health endpoint, the settle alone applies."""
        url = health_url()
        if url is None:
            return
        self._caught_up = await scheduler_beats(url).caught_up(report_due, SCHEDULER_CATCH_UP_LIMIT)
        if self._caught_up is False:
            log.warning("controltable: the scheduler did not heartbeat twice in %.0f s; firing anyway",
                        SCHEDULER_CATCH_UP_LIMIT)

    @staticmethod
    async def _sleep_until(earliest: float) -> None:
        delay = earliest - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
