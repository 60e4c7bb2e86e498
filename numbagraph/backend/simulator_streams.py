"""Several streams in one capture, and child graphs, on Numba's simulator.

Simulated work runs when its call returns, so waits between streams order
nothing that is not ordered already. In a capture, every stream forked into
it records into the capture's one recording, in the order the calls are
made. What the driver keeps of each stream, the nodes its next work depends
on, is modelled as CUDA's capture keeps it: each recorded call has an id; a
stream's frontier is the id of its last call, or the ids of its last call
and of the work it waited on since (an event recorded on a stream stands
for that stream's frontier, a wait on it adds that frontier to the waiting
stream's); each call depends on its stream's frontier as it is recorded,
and is that stream's frontier next. The recording keeps each call's id and dependencies, which its
description reads, so that a stream's work since it was joined back shows
as it does on the driver, and forked work as branches. A graph launched
into a capture is one recorded call, :class:`ChildGraph`, that replays what
the graph recorded.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ._streams import capture_key
from .simulator import _Frontier, _ids_of, _recordings, _recordings_lock
from .simulator_conditional import _Node

__all__ = [
    "ChildGraph", "wait_stream", "capture_id", "capture_frontier", "stream_waited",
    "leave_capture", "embed_graph", "has_conditionals",
]


def wait_stream(waiter: int, waited: int) -> None:
    """Simulated work on ``waited`` is done already: nothing to wait for."""


def capture_id(handle: int) -> int | None:
    """The recording the stream records into stands for its capture."""
    recording = _recordings.get(capture_key(handle))
    return None if recording is None else id(recording)


def capture_frontier(handle: int) -> frozenset[int] | None:
    key = capture_key(handle)
    recording = _recordings.get(key)
    if recording is None:
        return None
    return _ids_of(recording.frontiers.get(key))


def stream_waited(recording: Any, handle: int, frontier: Any) -> None:
    """The stream records into ``recording`` from now on, its frontier
    grown by the work it waited on, as the driver's dependencies grow."""
    key = capture_key(handle)
    with _recordings_lock:
        _recordings.setdefault(key, recording)
    frontiers = recording.frontiers
    frontiers[key] = _ids_of(frontiers.get(key)) | (frontier or frozenset())


def leave_capture(recording: Any, handle: int) -> None:
    key = capture_key(handle)
    with _recordings_lock:
        if key != capture_key(recording.handle) and _recordings.get(key) is recording:
            del _recordings[key]
    recording.frontiers.pop(key, None)


class ChildGraph:
    """A child graph node: the calls another graph recorded, replayed in
    order, with their ids and dependencies (``links``). It holds the calls
    as they were when it was recorded, as the driver clones a child graph,
    so that later changes to that graph (an update, a rebinding, closing
    it) do not reach it."""

    __slots__ = ("calls", "links")

    def __init__(self, calls: Sequence[Callable[[], None]],
                 links: Sequence[tuple[int, _Frontier | None]]):
        self.calls = tuple(calls)
        self.links = tuple(links)

    def __call__(self) -> None:
        for call in self.calls:
            call()


def embed_graph(executable: Any, handle: int) -> None:
    """A graph that recorded no conditional node runs nothing before its
    calls: its calls are the whole graph."""
    key = capture_key(handle)
    _recordings[key].record(key, ChildGraph(executable._nodes, executable._links))


def has_conditionals(executable: Any) -> bool:
    return any(isinstance(call, _Node) for call in executable._nodes)
