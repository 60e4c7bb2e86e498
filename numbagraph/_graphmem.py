"""Graph-owned memory: what a capture allocates, and when it exists.

An array allocated inside a capture (``ng.empty`` and its kin, or numba's
``device_array`` on the capturing thread) is memory of the graph being
captured: a memory node, allocated each time the graph runs. Its lifetime is
the graph's, as CUDA's auto-free-on-launch defines it:

- while its capture runs, only that capture's own work may use it (the work
  is recorded, not run);
- from the graph's first launch until its next one, it holds what that
  launch wrote: any work, and the host, may use it;
- every launch frees it and makes it again, at the same address;
- ``ng.free`` inside the capture frees it at that point of the graph (later
  allocations of the graph may reuse the memory): it exists nowhere after;
- closing the graph, or discarding its capture, frees everything.

This module holds that state as plain data, and says of a use why the memory
is not there; :mod:`numbagraph.safety` asks it before anything is launched,
copied or recorded.
"""

from __future__ import annotations

from typing import Any

from .errors import GraphMemoryError, StaleOutputError

__all__ = ["GraphMemory", "Allocation", "Output", "held", "problem"]

# How many Allocation objects are alive. While none is, no array can be
# graph-owned and the checks look at nothing.
held = [0]

CAPTURING, CAPTURED, DISCARDED, CLOSED = range(4)


class GraphMemory:
    """The allocations of one capture, then of its graph."""

    __slots__ = ("where", "allocations", "phase", "launches", "stream", "stream_object",
                 "callers", "nbytes", "closed_by")

    def __init__(self, where: str):
        self.where = where  # "the capture on <stream>"
        self.allocations: list[Allocation] = []
        self.phase = CAPTURING
        # Launches of the graph so far, and the stream of the last one.
        self.launches = 0
        self.stream: int | None = None
        # The stream object of the last launch, kept so that its handle stays
        # valid for the frees that follow the graph's close.
        self.stream_object: Any = None
        # What closed the graph, when not the user's own close().
        self.closed_by: str | None = None
        # Launch number -> the graphed call that made it, for stale outputs.
        self.callers: dict[int, str] = {}
        self.nbytes = 0

    def add(self, allocation: "Allocation") -> None:
        self.allocations.append(allocation)
        self.nbytes += allocation.nbytes

    def called(self, label: str) -> None:
        """Name the call that made the latest launch."""
        callers = self.callers
        if len(callers) >= 64:
            for launch in sorted(callers)[:32]:
                del callers[launch]
        callers[self.launches] = label

    def end(self, phase: int) -> list["Allocation"]:
        """Leave the capturing or captured phase for ``phase``; returns the
        allocations the last launch left allocated (none if it never ran)."""
        allocations, self.allocations = self.allocations, []
        launched = self.phase == CAPTURED and self.launches > 0
        self.phase = phase
        return [a for a in allocations if not a.freed] if launched else []


class Allocation:
    """One allocation a capture recorded. ``pointer`` is its device address
    (the driver's; the simulator keeps its own)."""

    __slots__ = ("memory", "nbytes", "what", "pointer", "freed", "array", "__weakref__")

    def __init__(self, memory: GraphMemory, nbytes: int, what: str):
        self.memory, self.nbytes, self.what = memory, nbytes, what
        self.pointer = 0
        self.freed = False
        # A weak reference to the array the allocation returned.
        self.array: Any = None
        held[0] += 1

    def __del__(self) -> None:
        held[0] -= 1


class Output:
    """What one call of a graphed function returned: valid until the graph
    is launched again."""

    __slots__ = ("launch", "label")

    def __init__(self, launch: int, label: str):
        self.launch, self.label = launch, label


def problem(allocation: Allocation, output: Output | None, session: Any,
            host: bool) -> tuple[type, str] | None:
    """Why the memory of ``allocation`` is not there for a use: on the host
    (``host``), or by work enqueued into the capture ``session`` (a Session,
    or None for work that runs at once). Returns (error class, why and what
    to do), or None when the use is fine."""
    memory = allocation.memory
    what = allocation.what
    phase = memory.phase
    if phase == CAPTURING:
        mine = session is not None and getattr(session, "memory", None) is memory
        if mine and not host:
            if allocation.freed:
                return GraphMemoryError, (
                    f"{what} was freed with ng.free earlier in this capture; allocate "
                    "another array for the work after it")
            return None
        return GraphMemoryError, (
            f"{what} is memory of the graph being captured on {memory.where}: it "
            "exists only while that graph runs. Use it in work on the capturing "
            "stream inside that capture, or read it after the graph has been launched")
    if phase == DISCARDED:
        return GraphMemoryError, (
            f"{what} was allocated by a capture that was discarded, so it never "
            "existed; capture the work again")
    if phase == CLOSED:
        closed = memory.closed_by or "a graph that has been closed"
        return GraphMemoryError, (
            f"{what} belonged to {closed}, which freed it; copy results out "
            "(ng.copy_into, copy_to_host) while the graph is open")
    if session is not None:
        return GraphMemoryError, (
            f"{what} is memory of another graph (captured on {memory.where}), which "
            "frees it and makes it again at each of its launches, so this capture "
            "cannot use it. After that graph's launch, and before this capture "
            "begins, copy it (ng.copy_into) into an array made outside any capture, "
            "and use that")
    if memory.launches == 0:
        return GraphMemoryError, (
            f"{what} is memory of a graph (captured on {memory.where}) that has not "
            "been launched yet: graph memory exists from the graph's first launch. "
            "Launch the graph first")
    if allocation.freed:
        return GraphMemoryError, (
            f"{what} was freed inside its graph (captured on {memory.where}) by "
            "ng.free, so it does not exist after the graph has run. Copy what you "
            "need into an array made outside the capture before the ng.free")
    if output is not None and output.launch != memory.launches:
        later = memory.callers.get(output.launch + 1, "a later launch of the same graph")
        return StaleOutputError, (
            f"{what} was returned by {output.label}, and {later} overwrote it "
            "(a graph's memory is made again at each of its launches). Copy it "
            "out (ng.copy_into, copy_to_host) before the next call, or use the "
            "result of the newest call")
    return None
