"""Text for log lines and state messages: resource names, who is ahead, where a waiter stands."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

from controltable import ControlTable
from controltable.aio import AsyncControlTable
from controltable.slots import ResourceStatus, WaitInfo

#: How many of the holders and waiters ahead a log line names before "and N more".
AHEAD_SHOWN = 5
Resource = Union[str, Mapping[str, int]]


def names_list(resource: Resource) -> list[str]:
    """The resource names of ``resource`` (one name, or the keys of a mapping of names to slots)."""
    return [resource] if isinstance(resource, str) else [str(k) for k in resource]


def names(resource: Resource) -> str:
    """ "'a'", "'a', 'b'" for a log line."""
    return ", ".join(repr(n) for n in names_list(resource))


def ahead_text(ahead: list[str]) -> str:
    """ "a", "a and b", "a, b, c, d, e and 7 more"."""
    if not ahead:
        return "nobody"
    if len(ahead) > AHEAD_SHOWN:
        return ", ".join(ahead[:AHEAD_SHOWN]) + f" and {len(ahead) - AHEAD_SHOWN} more"
    return ahead[0] if len(ahead) == 1 else ", ".join(ahead[:-1]) + " and " + ahead[-1]


def where(ct: ControlTable, resource: Resource, who: str) -> tuple[Optional[int], str]:
    """(worst queue position, "'r': position 2 behind prefect:<run> and airflow:<dag>:<run> ('r' 1/1 used, ...)").

    Read from the core's ``wait_info`` and ``status``; only for log lines and the state message,
    so a failure to read is shown, never raised.
    """
    try:
        infos = {name: ct.wait_info(name, who) for name in names_list(resource)}
    except Exception as exc:
        return None, f"position unavailable ({exc})"
    try:
        queue = describe_queue(ct.status(names_list(resource)))
    except Exception as exc:
        queue = f"status unavailable ({exc})"
    return describe_place(infos, queue)


async def awhere(act: AsyncControlTable, resource: Resource, who: str) -> tuple[Optional[int], str]:
    """:func:`where`, read through the asyncio API (async flows and tasks)."""
    try:
        infos = {name: await act.wait_info(name, who) for name in names_list(resource)}
    except Exception as exc:
        return None, f"position unavailable ({exc})"
    try:
        queue = describe_queue(await act.status(names_list(resource)))
    except Exception as exc:
        queue = f"status unavailable ({exc})"
    return describe_place(infos, queue)


def describe_place(infos: Mapping[str, Optional[WaitInfo]], queue: str) -> tuple[Optional[int], str]:
    """(worst queue position, the text) of a waiter's entries ``infos`` (per resource) and ``queue``."""
    parts = []
    worst: Optional[int] = None
    for name, info in infos.items():
        if info is None:
            parts.append(f"{name!r}: not queued")
        elif info.state == "granted":
            parts.append(f"{name!r}: granted, being picked up")
        else:
            worst = info.position if worst is None else max(worst, info.position)
            parts.append(f"{name!r}: position {info.position} behind {ahead_text(list(info.ahead))}")
    return worst, "; ".join(parts) + f" ({queue})"


def describe_queue(statuses: Sequence[ResourceStatus]) -> str:
    """ "'r' 1/1 used, held by a, 2 waiting" per resource."""
    parts = []
    for st in statuses:
        holders = ", ".join(h.holder for h in st.holders if not h.expired) or "nobody"
        parts.append(f"{st.name!r} {st.used}/{st.capacity} used, held by {holders}, "
                     f"{len([w for w in st.waiters if not w.expired])} waiting")
    return "; ".join(parts) or "no status"


def jsonable(value: Any) -> Any:
    """``value`` itself if JSON has it, else its text (event keys in a task's result)."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
