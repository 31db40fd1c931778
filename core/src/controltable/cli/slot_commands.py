"""Slot commands of ``controltable``: capacity, status, reap, acquire, release, renew and run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict
from typing import Any, Callable, NoReturn, Optional, TypeVar

import click
from rich import box
from rich.table import Table

from ..control import ControlTable
from ..defaults import DEFAULT_LEASE, DEFAULT_MODE, DEFAULT_SLOT_PRIORITY, RUN_STOP_GRACE
from ..errors import EXIT_LOST, EXIT_USAGE, ControlTableError, LeaseLost
from ..holders import process_holder_id
from .group import CT, cli, handled
from .output import console, err, fail, in_seconds, print_error, when

T = TypeVar("T")


# -- capacity ----------------------------------------------------------------------------------------
@cli.group()
def capacity() -> None:
    """Create, resize, list and delete resources."""


@capacity.command("set")
@click.argument("name")
@click.argument("slots", type=int)
@click.option("--rate", default=None, metavar="COUNT/PERIOD",
              help="Also at most COUNT grants in any PERIOD, e.g. 100/60s or 10/1m; 'none' clears.")
@click.option("--aging", default=None, metavar="SECONDS",
              help="A waiter's priority rises by one per SECONDS waited (e.g. 30 or 5m); 'none' clears.")
@click.pass_obj
@handled
def capacity_set(obj: CT, name: str, slots: int, rate: Optional[str], aging: Optional[str]) -> None:
    """Set NAME's capacity to SLOTS (creates it). Shrinking never evicts holders.

    --rate and --aging left out keep what is set.
    """
    from ..slots import parse_duration, parse_rate

    policy: dict[str, Any] = {}
    if rate is not None:
        policy["rate"] = None if rate.lower() == "none" else parse_rate(rate)
    if aging is not None:
        policy["aging"] = None if aging.lower() == "none" else parse_duration(aging)
    ct = obj.get()
    ct.set_capacity(name, slots, **policy)
    (st,) = ct.status([name])
    extra = "".join([f", rate {st.rate}" if st.rate else "", f", aging {st.aging:g}s" if st.aging else ""])
    console.print(f"{name}: capacity {slots}{extra}")


@capacity.command("list")
@click.pass_obj
@handled
def capacity_list(obj: CT) -> None:
    """List resources and their capacity."""
    table = Table("resource", "capacity", "rate", "aging", "in use", "waiting", title=f"namespace {obj.namespace}")
    for st in obj.get().status():
        table.add_row(st.name, str(st.capacity), str(st.rate or ""), f"{st.aging:g}s" if st.aging else "",
                      str(st.used), str(sum(1 for w in st.waiters if not w.expired)))
    console.print(table)


@capacity.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete even with live holders or waiters.")
@click.pass_obj
@handled
def capacity_delete(obj: CT, name: str, force: bool) -> None:
    """Delete resource NAME."""
    if not obj.get().delete_resource(name, force=force):
        fail(f"resource {name!r} does not exist in namespace {obj.namespace!r}", EXIT_USAGE)
    console.print(f"deleted {name}")


# -- status ------------------------------------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("resources", nargs=-1)
@click.pass_obj
@handled
def status(obj: CT, as_json: bool, resources: tuple[str, ...]) -> None:
    """Show resources with their holders and waiters."""
    ct = obj.get()
    states = ct.status(list(resources) or None)
    if as_json:
        click.echo(json.dumps([asdict(s) for s in states], default=str, indent=2))
        return
    push = ct.push_status()
    if push.state == "inactive":  # behind a pooler in transaction mode: waiters poll
        err.print(f"note: {push.detail}")
    now = ct.now()
    if not states:
        console.print(f"no resources in namespace {obj.namespace!r}; "
                      "create one with `controltable capacity set NAME N`")
        return
    # Columns that say nothing are left out and long ids fold, so the table fits COLUMNS (80 included)
    # without cutting a holder id: priority only when one differs from the default, the waits-behind
    # column only with waiters, the start time only where it fits.
    entries = [e for st in states for e in (*st.holders, *st.waiters)]
    show_priority = any(e.priority != DEFAULT_SLOT_PRIORITY or e.effective_priority != e.priority for e in entries)
    show_behind = any(st.waiters for st in states)
    wide = console.width >= 120

    def behind(e: Any) -> str:
        return "" if e.state == "granted" else _behind(e.ahead, 3 if wide else 1)

    def holder(e: Any) -> str:  # narrow: who a waiter waits behind goes under its id
        return e.holder if wide or not behind(e) else f"{e.holder}\n behind: {behind(e)}"

    # (header, cell, flexible): flexible columns (names, ids) share the width left and fold; the
    # others keep their text on one line.
    columns: list[tuple[str, Callable[[Any], str], int]] = [
        ("holder", holder, 3), ("mode", lambda e: e.mode, 0),
    ]
    if wide or any(e.slots != 1 for e in entries):
        columns.append(("slots", lambda e: str(e.slots), 0))
    if show_priority:
        columns.append(("priority", _priority, 0))
    columns.append(("token", lambda e: str(e.token or ""), 0))
    if wide:
        columns.append(("since (UTC)", lambda e: when(e.since), 0))
    columns.append(("lease", lambda e: in_seconds(e.expires_at, now), 0))
    if show_behind and wide:
        columns.append(("waits behind", behind, 2))
    table = Table(title=f"controltable status: namespace {obj.namespace}",
                  box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD, show_edge=wide,
                  padding=(0, 1) if wide else (0, 1, 0, 0), expand=not wide)
    table.add_column("resource", overflow="fold", ratio=2)
    table.add_column("in use", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for header, _, ratio in columns:
        if ratio:
            table.add_column(header, overflow="fold", ratio=ratio)
        else:
            table.add_column(header, no_wrap=True)
    for st in states:
        rows = [(h, "holding") for h in st.holders] + [(w, f"waiting #{w.position}") for w in st.waiters]
        policy = "".join([f"\nrate {st.rate}" if st.rate else "", f"\naging {st.aging:g}s" if st.aging else ""])
        used = f"{st.used}/{st.capacity}"
        if not rows:
            table.add_row(st.name + policy, used, "idle", *["" for _ in columns])
        for i, (e, state) in enumerate(rows):
            table.add_row(st.name + policy if i == 0 else "", used if i == 0 else "",
                          state + ((" (expired)" if wide else "\n(expired)") if e.expired else ""),
                          *[cell(e) for _, cell, _ in columns])
    console.print(table)


def _priority(entry: Any) -> str:
    """An entry's priority, with what aging made of it when that differs."""
    text = str(entry.priority)
    if entry.effective_priority != entry.priority:
        text += f" ({entry.effective_priority:.1f})"
    return text


def _behind(ahead: list[str], show: int = 3) -> str:
    """The first few holders and waiters ahead of a waiter ("who blocks me"), and how many more."""
    if not ahead:
        return ""
    more = f" +{len(ahead) - show} more" if len(ahead) > show else ""
    return ", ".join(ahead[:show]) + more


@cli.command()
@click.pass_obj
@handled
def reap(obj: CT) -> None:
    """Remove expired holders and waiters now (acquire does it anyway); prints how many."""
    console.print(f"reaped {obj.get().reap()} expired entries")


# -- acquire / release / run -------------------------------------------------------------------------
#: The signals that end a command waiting in the queue (``kill``, a supervisor, Ctrl-C, a closed
#: terminal). By default SIGTERM and SIGHUP end the process at once, with its queue entry left
#: behind to be granted to nobody; see :class:`_QueueSignals`.
QUEUE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Ended(BaseException):
    """One of :data:`QUEUE_SIGNALS` arrived while the command waited in the queue.

    A BaseException raised in the main thread, like Ctrl-C's KeyboardInterrupt: the wait unwinds
    and ``acquire`` withdraws its queue entry on the way out, as it does for any failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _QueueSignals:
    """Every one of :data:`QUEUE_SIGNALS`, from the wait in the queue to the end of the held phase,
    handled in three phases (one handler throughout, so no signal falls between two of them):

    - waiting: :class:`_Ended` is raised in the main thread, once (a second signal while the entry
      is being withdrawn is ignored, so the withdrawal is not cut short; the process is ending
      anyway);
    - granted (``granted`` set, no ``child`` yet): the signal is recorded in ``signum``, never
      raised, and the caller acts on it (releases the grant and exits 128 + the signal, or hands
      it to the child it just started) - an exception there would escape with the grant held;
    - ``child`` set (``run``'s COMMAND): the signal is passed on to the child.

    The handlers that were there before are back once the block ends; the signals are blocked
    while they are put back, and one that arrived meanwhile is taken as in the phase it came in."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.granted = False
        self.child: Optional[subprocess.Popen[bytes]] = None
        self._old: dict[int, Any] = {}

    def _end(self, signum: int, frame: Any) -> None:
        if self.child is not None:
            self.child.send_signal(signum)
        elif self.signum is None:
            self.signum = signum
            if not self.granted:
                raise _Ended(signum)

    def __enter__(self) -> _QueueSignals:
        # Handlers can be set only in the main thread (the command's own; a caller running the CLI
        # in another thread keeps its signals, and Ctrl-C there is its business).
        # A signal the command was started with ignored stays ignored: ``nohup controltable run ...``
        # ignores SIGHUP so that closing the terminal ends neither the wait nor COMMAND, which inherits
        # the ignored signal (a handler here would have let COMMAND start with SIGHUP's default and be
        # sent the hangup).
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._end) for s in QUEUE_SIGNALS
                         if signal.getsignal(s) != signal.SIG_IGN}
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._old:
            return
        self.granted = True  # from here a signal is only recorded: nothing may raise out of __exit__
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, QUEUE_SIGNALS)
        try:
            for s, handler in self._old.items():
                signal.signal(s, handler)
            # Taken here, not by the handlers just put back (a default SIGTERM would end the
            # process with the grant held until its lease ran out).
            for s in sorted(signal.sigpending() & set(QUEUE_SIGNALS)):
                if signal.sigtimedwait([s], 0) is not None:
                    self._end(s, None)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _queued(signals: _QueueSignals, ct: ControlTable, request: dict[str, int], holder: str,
            wait: Callable[[], T]) -> T:
    """``wait()`` (an acquire of ``request`` for ``holder``) inside ``signals``, ended cleanly by a signal.

    On one of :data:`QUEUE_SIGNALS` the acquire withdraws its entry as it unwinds; then, for the
    instant between the grant and ``signals.granted``, whatever ``holder`` still has on the
    resources is released too (:func:`_ended`). Once granted, a signal is only recorded: the
    caller checks ``signals.signum``."""
    try:
        got = wait()
        signals.granted = True
        return got
    except _Ended as ended:
        _ended(ct, request, holder, ended.signum, queued=True)


def _ended(ct: ControlTable, request: dict[str, int], holder: str, signum: int, *, queued: bool) -> NoReturn:
    """Release whatever ``holder`` has on ``request``'s resources (its queue entry or a grant) and
    exit 128 + ``signum``, as a shell reports a process ended by that signal."""
    left = 0
    for name in sorted(request):
        try:
            left += ct.release(name, holder)
        except ControlTableError as exc:
            print_error(f"could not withdraw {holder!r} from {name!r} ({exc}); its entry expires by itself")
    name = signal.Signals(signum).name
    if queued:
        fail(f"{name} while {holder!r} waited for {request!r}: left the queue"
             + (" (released the grant made meanwhile)" if left else ""), 128 + signum)
    fail(f"{name} right after {holder!r} was granted {request!r}: released the grant", 128 + signum)


@cli.command()
@click.argument("resource")
@click.option("--holder", required=True, help="Who holds the slot; release with the same holder.")
@click.option("--slots", default=1, show_default=True, type=int,
              help="Slots to take (the request's weight against the capacity).")
@click.option("--shared/--exclusive", "shared", default=DEFAULT_MODE == "shared", show_default=False,
              help="--shared: a slot beside other holders, up to the capacity (the default); --exclusive: "
                   "alone on the resource.")
@click.option("--attempt", type=int, default=None, help="Attempt number (a retry gets a new token).")
@click.option("--timeout", type=float, default=None, help="Seconds to wait (default: forever; 0: try once).")
@click.option("--lease", type=float, default=DEFAULT_LEASE, show_default=True,
              help="Lease seconds; renew with `renew`.")
@click.option("--priority", type=int, default=DEFAULT_SLOT_PRIORITY, show_default=True,
              help="Higher is granted first; equal priorities in arrival order.")
@click.pass_obj
@handled
def acquire(obj: CT, resource: str, holder: str, slots: int, shared: bool, attempt: Optional[int],
            timeout: Optional[float], lease: float, priority: int) -> None:
    """Wait for and take a slot; prints the fencing token. Exit 3 on timeout.

    SIGTERM, SIGINT or SIGHUP while waiting: the queue entry is withdrawn, exit 128 + the signal.
    """
    ct = obj.get()
    with _QueueSignals() as signals:
        got = _queued(signals, ct, {resource: slots}, holder, lambda: ct.acquire(
            resource, holder=holder, slots=slots, mode="shared" if shared else "exclusive", timeout=timeout,
            lease=lease, attempt=attempt, priority=priority))
    if signals.signum is not None:  # came after the grant, before the handlers were put back
        _ended(ct, {resource: slots}, holder, signals.signum, queued=False)
    click.echo(got.token)


@cli.command()
@click.argument("resource")
@click.option("--holder", required=True, help="The holder id given to acquire.")
@click.pass_obj
@handled
def release(obj: CT, resource: str, holder: str) -> None:
    """Release HOLDER's slot on RESOURCE. Exit 6 if nothing was held (already expired or released)."""
    if obj.get().release(resource, holder) == 0:
        fail(f"{holder!r} held nothing on {resource!r} (lease expired or already released)", EXIT_LOST)
    console.print(f"released {resource} ({holder})")


@cli.command()
@click.argument("resource")
@click.option("--holder", required=True, help="The holder id given to acquire.")
@click.option("--lease", type=float, default=None, help="New lease length (default: the original).")
@click.pass_obj
@handled
def renew(obj: CT, resource: str, holder: str, lease: Optional[float]) -> None:
    """Extend HOLDER's lease on RESOURCE. Exit 6 if the lease was lost."""
    found = obj.get().find_lease(resource, holder)
    if found is None:
        fail(f"{holder!r} holds nothing on {resource!r}", EXIT_LOST)
    found.renew(lease)
    console.print(f"renewed until {when(found.expires_at)} UTC")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--resource", "resources", multiple=True, required=True,
              help="Resource to hold (repeat for several, all-or-nothing); NAME or NAME:SLOTS.")
@click.option("--slots", default=1, show_default=True, type=int, help="Slots when one resource is named.")
@click.option("--shared/--exclusive", "shared", default=DEFAULT_MODE == "shared", show_default=False,
              help="--shared: a slot beside other holders, up to the capacity (the default); --exclusive: "
                   "alone on the resource.")
@click.option("--attempt", type=int, default=None, help="Attempt number (a retry gets a new token).")
@click.option("--holder", default=None, help="Holder id (default: host:pid:random).")
@click.option("--timeout", type=float, default=None, help="Seconds to wait (default: forever). Exit 3 on timeout.")
@click.option("--lease", type=float, default=60.0, show_default=True,
              help="Lease seconds; renewed every third of it while the command runs.")
@click.option("--priority", type=int, default=DEFAULT_SLOT_PRIORITY, show_default=True,
              help="Higher is granted first; equal priorities in arrival order.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
@handled
def run(obj: CT, resources: tuple[str, ...], slots: int, shared: bool, attempt: Optional[int],
        holder: Optional[str], timeout: Optional[float], lease: float, priority: int, command: tuple[str, ...]) -> None:
    """Hold a slot while COMMAND runs (flock(1) for the whole fleet); exits with COMMAND's code.

    The lease is renewed in the background; SIGTERM/SIGINT are passed to COMMAND and the slot is
    released when it exits. If the lease is lost while COMMAND runs, COMMAND is stopped (SIGTERM,
    then SIGKILL after a grace) and the exit status is 6 (unless COMMAND had already failed by itself:
    its code is kept). Only COMMAND itself is signalled, not its process group (docs/cli.md).
    SIGTERM, SIGINT or SIGHUP while still waiting: the queue entry is withdrawn, exit 128 + the signal.
    """
    problem = _cannot_start(command[0])
    if problem:  # before queueing: a command that cannot start must not spend a grant and a token
        fail(f"cannot run {command[0]!r}: {problem}; nothing was queued", 127)
    request: Any
    if len(resources) == 1 and ":" not in resources[0]:
        request = {resources[0]: slots}
    else:
        request = {}
        for spec in resources:
            name, _, k = spec.partition(":")
            try:
                request[name] = int(k) if k else slots
            except ValueError:
                fail(f"--resource {spec!r}: slots after ':' must be a whole number", EXIT_USAGE)
    ct = obj.get()
    who = holder if holder is not None else process_holder_id()  # known here: a signal withdraws it
    # One handler from the queue to the child's end (_QueueSignals): a signal between the grant and
    # the child's start releases the grant (exit 128 + n); once the child runs it is passed on.
    with _QueueSignals() as signals:
        lease_obj = _queued(signals, ct, request, who, lambda: ct.acquire(
            request, holder=who, mode="shared" if shared else "exclusive", timeout=timeout, lease=lease,
            attempt=attempt, priority=priority))
        lease_obj.start_renewing()
        env = dict(os.environ, CONTROLTABLE_TOKEN=str(lease_obj.token), CONTROLTABLE_HOLDER=lease_obj.holder)
        child: Optional[subprocess.Popen[bytes]] = None
        try:
            if signals.signum is None:
                child = subprocess.Popen(list(command), env=env)
        except OSError as exc:
            lease_obj.release()
            fail(f"cannot run {command[0]!r}: {exc}", 127)
        if child is None:
            lease_obj.release()
            _ended(ct, request, who, int(signals.signum or 0), queued=False)
        signals.child = child
        if signals.signum is not None:  # came while the child started: it is the child's now
            child.send_signal(signals.signum)
        stopped = False
        try:
            try:
                # A lost lease interrupts the wait (controltable.interrupt): the child must not go on
                # working beside the next holder, so it is stopped as `consul lock` stops its child.
                with lease_obj.interrupting(True):
                    code = child.wait()
            except LeaseLost:
                code, stopped = _stop_child(child)
        finally:
            lost = lease_obj.lost
            try:
                lease_obj.release()
            except LeaseLost as exc:
                lost = lost or exc
    if lost is not None:
        print_error(lost)
        if code == 0 or stopped:
            sys.exit(EXIT_LOST)
    sys.exit(code if code >= 0 else 128 - code)


def _stop_child(child: subprocess.Popen[bytes]) -> tuple[int, bool]:
    """Stop ``run``'s child after its lease was lost: SIGTERM, then SIGKILL after :data:`RUN_STOP_GRACE`.

    Returns its exit code and whether it was stopped: a child that had already exited by itself
    (the loss came as it ended) is not signalled, and its own code stands (``run`` exits 6 only
    for a child it stopped or one that succeeded). Only the child is signalled, not a process
    group: it shares ``run``'s group, so the terminal's Ctrl-C and an orchestrator's kill of the
    task's group (SIGKILL included) reach it as before; a shell COMMAND passes SIGTERM on itself
    (``exec``, or ``trap 'kill 0' TERM``)."""
    code = child.poll()
    if code is not None:
        return code, False
    err.print(f"controltable: the lease was lost; stopping the command (pid {child.pid}) with SIGTERM")
    child.terminate()
    try:
        return child.wait(timeout=RUN_STOP_GRACE), True
    except subprocess.TimeoutExpired:
        err.print(f"controltable: the command did not end within {RUN_STOP_GRACE:g} s of SIGTERM; sending SIGKILL")
        child.kill()
        return child.wait(), True


def _cannot_start(program: str) -> Optional[str]:
    """Why ``program`` cannot be started (as ``subprocess.Popen`` would look it up), or None.

    A path (anything with a slash) must be an executable file; a bare name must be on ``PATH``.
    The child may still fail to start for other reasons (a bad interpreter line): ``run`` then
    releases the slot and exits 127 as before.
    """
    import shutil

    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.exists(program):
            return "no such file"
        if os.path.isdir(program):
            return "it is a directory"
        if not os.access(program, os.X_OK):
            return "not executable (chmod +x it, or run it through its interpreter)"
        return None
    return None if shutil.which(program) else "not found on PATH"
