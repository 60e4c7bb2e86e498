"""Work taken from a stream instead of enqueued, on the driver: the kernel
launches, copies and fills a run of a graphed function makes while its
graph is given new sizes (``numbagraph._resize``), listed in the order
they were made.

A kernel launch is listed as ``(plan, dims_for, arguments packed as
bytes)``, with ``kernel, arguments`` after them for one taken before the
launch checks (``driver_launch``); a copy or fill numbagraph enqueues itself
as a tuple whose first item names it: ``("copy", dst, src, bytes)`` between
device pointers, ``("to host", host, src, bytes)`` into pinned memory,
``("fill", dst, byte value, bytes)``.
"""

from __future__ import annotations

from typing import Any

from ._streams import capture_key

__all__ = ["Taken", "diverted", "divert_launches", "stop_diverting", "take"]


class Taken(list):
    """The work taken from one stream, in order; ``early``: kernel launches
    of device arrays and numbers alone may be taken before the launch
    checks."""

    __slots__ = ("early",)

    def __init__(self, early: bool):
        super().__init__()
        self.early = early


# capture key -> the work taken from that stream (empty: none is)
diverted: dict[Any, Taken] = {}


def divert_launches(handle: int, early: bool = False) -> Taken:
    """From now on, the kernel launches, copies and fills on stream
    ``handle`` (this thread's, for the per-thread default stream) that
    numbagraph makes itself are not enqueued but listed, in order, in the
    list returned, kernel launches once the launch checks passed them; one
    numbagraph cannot list goes on as it would. With ``early``, a
    ``kernel[...]`` launch whose arguments are numba device arrays and
    numbers alone, no launch guard set, is taken before the checks: the
    caller vouches that they would pass it."""
    taken = Taken(early)
    diverted[capture_key(handle)] = taken
    return taken


def stop_diverting(handle: int) -> None:
    diverted.pop(capture_key(handle), None)


def take(handle: int, item: tuple) -> bool:
    """List ``item``, a copy or fill on stream ``handle``, where work is
    taken from that stream; whether it was."""
    taken = diverted.get(capture_key(handle))
    if taken is None:
        return False
    taken.append(item)
    return True
