"""How a waiter's place reads in log lines and state messages, for the integrations.

One wording for Airflow, Dagster and Prefect: resource names, who is ahead ("position 2 behind a
and b"), a waiter's place per resource and the queue beside it. Read through the public API only
(``wait_info``, ``status``); :func:`where` and :func:`awhere` are for log lines, so a failure to
read is shown in the text, never raised. The asyncio API is only named for type checking: importing
this module needs no greenlet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

from .defaults import AHEAD_SHOWN

if TYPE_CHECKING:
    from .aio import AsyncControlTable
    from .control import ControlTable
    from .slots import ResourceStatus, WaitInfo

#: One resource name, or a mapping of names to slots (what ``slot()`` and ``acquire()`` take).
Resource = Union[str, Mapping[str, int]]


def names_list(resource: Resource) -> list[str]:
    """The resource names of ``resource`` (one name, or the keys of a mapping of names to slots)."""
    return [resource] if isinstance(resource, str) else [str(k) for k in resource]


def names(resource: Resource) -> str:
    """ "'a'", "'a', 'b'" for a log line."""
    return ", ".join(repr(n) for n in names_list(resource))


def ahead_text(ahead: Sequence[str]) -> str:
    """ "nobody", "a", "a and b", "a, b and c", "a, b, c, d, e and 2 more"."""
    if not ahead:
        return "nobody"
    if len(ahead) > AHEAD_SHOWN:
        return ", ".join(ahead[:AHEAD_SHOWN]) + f" and {len(ahead) - AHEAD_SHOWN} more"
    return ahead[0] if len(ahead) == 1 else ", ".join(ahead[:-1]) + " and " + ahead[-1]


def describe_place(infos: Mapping[str, Optional[WaitInfo]], queue: str) -> tuple[Optional[int], str]:
    """(worst queue position, the text) of a waiter's entries ``infos`` (per resource) and ``queue``.

    "'r': position 2 behind a and b; 's': granted, waiting for pickup ('r' 1/1 used, ...)"; the
    position is None when no entry waits (not queued, or granted).
    """
    parts = []
    worst: Optional[int] = None
    for name, info in infos.items():
        if info is None:
            parts.append(f"{name!r}: not queued")
        elif info.state == "granted":
            parts.append(f"{name!r}: granted, waiting for pickup")
        else:
            worst = info.position if worst is None else max(worst, info.position)
            parts.append(f"{name!r}: position {info.position} behind {ahead_text(list(info.ahead))}")
    return worst, "; ".join(parts) + f" ({queue})"


def describe_queue(statuses: Sequence[ResourceStatus]) -> str:
    """ "'r' 1/1 used, held by a, 2 waiting" per resource (expired holders and waiters left out)."""
    parts = []
    for st in statuses:
        holders = ", ".join(h.holder for h in st.holders if not h.expired) or "nobody"
        parts.append(f"{st.name!r} {st.used}/{st.capacity} used, held by {holders}, "
                     f"{len([w for w in st.waiters if not w.expired])} waiting")
    return "; ".join(parts) or "no status"


def where(ct: ControlTable, resource: Resource, who: str) -> tuple[Optional[int], str]:
    """(worst queue position, "'r': position 2 behind a and b ('r' 1/1 used, held by a, 2 waiting)") of ``who``."""
    try:
        infos = {name: ct.wait_info(name, who) for name in names_list(resource)}
    except Exception as exc:  # only for a log line: shown, never raised
        return None, f"position unavailable ({exc})"
    try:
        queue = describe_queue(ct.status(names_list(resource)))
    except Exception as exc:
        queue = f"status unavailable ({exc})"
    return describe_place(infos, queue)


async def awhere(act: AsyncControlTable, resource: Resource, who: str) -> tuple[Optional[int], str]:
    """:func:`where`, read through the asyncio API."""
    try:
        infos = {name: await act.wait_info(name, who) for name in names_list(resource)}
    except Exception as exc:  # only for a log line: shown, never raised
        return None, f"position unavailable ({exc})"
    try:
        queue = describe_queue(await act.status(names_list(resource)))
    except Exception as exc:
        queue = f"status unavailable ({exc})"
    return describe_place(infos, queue)


def jsonable(value: Any) -> Any:
    """``value`` itself if JSON has it (number, text, bool, null), else its text: a key for metadata or a result."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
