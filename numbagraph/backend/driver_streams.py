"""Several streams in one capture, and child graphs, on the CUDA driver.

A stream joins a capture by waiting on an event recorded in it and stays in
it until the capture ends; the driver keeps each stream's dependencies in
the graph being built, which ``cuStreamGetCaptureInfo`` reads. A graph
launched into a capture becomes a child graph node: added to that graph
after the stream's dependencies, then made the stream's one dependency
(``cuStreamUpdateCaptureDependencies``), as the driver documents for nodes
added to a capture by hand.
"""

from __future__ import annotations

import threading
from typing import Any

from cuda.bindings import driver as cu

from ..errors import GraphClosedError
from .driver_base import CAPTURE_ACTIVE, DriverError, check
from .driver_conditional import _capture_info

__all__ = [
    "wait_stream", "capture_id", "capture_frontier", "stream_waited", "leave_capture",
    "join_forks", "embed_graph", "has_conditionals",
]

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_INVALIDATED = cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
_SET_DEPENDENCIES = int(
    cu.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES)
_NO_TIMING = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)


# ---------------------------------------------------------------- events

# Events a wait goes through, idle ones kept per context for the next wait:
# once cuStreamWaitEvent returns, the wait holds what the event stood for,
# and the event may be recorded again.
_idle: dict[int, list[Any]] = {}
_idle_lock = threading.Lock()


def _take_event(ctx: Any) -> Any:
    with _idle_lock:
        idle = _idle.get(int(ctx))
        if idle:
            return idle.pop()
    current = check("cuCtxGetCurrent", cu.cuCtxGetCurrent())
    if int(current) == int(ctx):
        return check("cuEventCreate", cu.cuEventCreate(_NO_TIMING))
    # An event belongs to the context it is made in: the stream's.
    check("cuCtxPushCurrent", cu.cuCtxPushCurrent(ctx))
    try:
        return check("cuEventCreate", cu.cuEventCreate(_NO_TIMING))
    finally:
        cu.cuCtxPopCurrent()


def _give_back(ctx: Any, event: Any) -> None:
    with _idle_lock:
        _idle.setdefault(int(ctx), []).append(event)


def wait_stream(waiter: int, waited: int) -> None:
    """An event recorded on ``waited`` and waited on by ``waiter``."""
    ctx = check("cuStreamGetCtx", cu.cuStreamGetCtx(waited))
    event = _take_event(ctx)
    try:
        check("cuEventRecord", cu.cuEventRecord(event, waited))
        check("cuStreamWaitEvent", cu.cuStreamWaitEvent(waiter, event, 0))
    finally:
        _give_back(ctx, event)


# ---------------------------------------------------------------- forks

def capture_frontier(handle: int) -> frozenset[int] | None:
    """The nodes the stream's next captured work will depend on."""
    status, _graph, deps, _count = _capture_info(handle)
    if status != CAPTURE_ACTIVE:
        return None
    return frozenset(int(node) for node in deps)


def stream_waited(recording: Any, handle: int, frontier: Any) -> None:
    """The driver's wait put the stream into the capture: the recording
    keeps its handle, to join it back should the capture be aborted."""
    if handle != recording.handle and handle not in recording.forks:
        recording.forks.append(handle)


def leave_capture(recording: Any, handle: int) -> None:
    if handle in recording.forks:
        recording.forks.remove(handle)


def capture_id(handle: int) -> int | None:
    """The id of the capture the stream is in, or None."""
    err, status, ident, *_ = cu.cuStreamGetCaptureInfo(handle)
    if err != _SUCCESS or status != CAPTURE_ACTIVE:
        return None
    return int(ident)



def join_forks(recording: Any) -> None:
    """Join every stream forked into the capture back into the capture's
    own stream, so that ending it cannot fail for a fork left unjoined
    (CUDA_ERROR_STREAM_CAPTURE_UNJOINED). Never raises: it runs as a
    capture is aborted."""
    forks, recording.forks = list(recording.forks), []
    if not forks:
        return
    origin = capture_id(recording.handle)
    if origin is None:
        return  # ended or invalidated: ending it ends every stream in it
    for handle in forks:
        try:
            if capture_id(handle) == origin:
                wait_stream(recording.handle, handle)
        except Exception:  # noqa: BLE001  the capture is ended next regardless
            pass


# ---------------------------------------------------------------- child graphs

def _runs(executable: Any) -> Any:
    """The executable whose definition ``executable`` runs the parameters
    of: its own, or that of the graph it was last updated from."""
    return executable._applied or executable


def embed_graph(executable: Any, handle: int) -> None:
    """A child graph node cloned from the definition the executable runs
    (so that the node keeps no reference to it)."""
    definition = _runs(executable)._definition
    if definition is None:
        raise GraphClosedError(
            "this graph was updated from a graph that has since been closed, whose "
            "nodes are gone; update it again from a graph that is still open")
    status, graph, deps, _ = _capture_info(handle)
    if status != CAPTURE_ACTIVE:
        raise DriverError("cuStreamGetCaptureInfo", _INVALIDATED)
    node = check("cuGraphAddChildGraphNode",
                 cu.cuGraphAddChildGraphNode(graph, deps or None, len(deps), definition))
    check("cuStreamUpdateCaptureDependencies",
          cu.cuStreamUpdateCaptureDependencies(handle, [node], None, 1, _SET_DEPENDENCIES))


def has_conditionals(executable: Any) -> bool:
    """A captured graph holds a conditional node when its capture made a
    conditional body."""
    return bool(_runs(executable)._bodies)
