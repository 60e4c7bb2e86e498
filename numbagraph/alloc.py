"""Device arrays: made at once, or inside a capture as memory of its graph.

Outside a capture these helpers make C-contiguous numba device arrays at
once. Called on a thread that captures, for the capturing stream (or with
no stream named), they record the allocation into the capture instead: the
array is memory of the graph, which exists while the graph runs
(docs/capture.md, "Graph-owned memory"). Any other allocation follows
numbagraph's one allocation rule: refused, with AllocationInCaptureError,
on the thread of a "thread_local" or "global" capture and everywhere during
a "global" one, before anything is allocated.
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

import numpy as np
from numba import cuda

from . import _registry
from .backend import active as _backend
from .errors import GraphMemoryError, NumbagraphError, OpError
from .safety import (
    graph_allocate, graph_allocation_session, graph_free_handle, guard_allocation,
    guard_legacy_work,
)

__all__ = ["empty", "zeros", "empty_like", "zeros_like", "free", "graph_memory_info",
           "trim_graph_memory", "GraphMemoryInfo"]

Shape = int | tuple[int, ...]


# More bytes than any device holds: refused before the driver is asked.
_MAX_BYTES = 1 << 48


def _whole(d: Any) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))


def _shape(shape: Shape) -> tuple[int, ...]:
    dims: tuple[Any, ...]
    if _whole(shape):
        dims = (shape,)
    elif isinstance(shape, (tuple, list)):
        dims = tuple(shape)
    else:
        raise OpError(
            f"shape {shape!r} is a {type(shape).__name__}: give an int or a tuple of "
            "ints, such as 1024 or (4, 1024)")
    if any(not _whole(d) or d < 0 for d in dims):
        raise OpError(
            f"shape {dims!r} must be non-negative integers, such as (4, 1024)")
    return tuple(int(d) for d in dims)


def _nbytes(shape: tuple[int, ...], dtype: np.dtype, what: str) -> int:
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= _MAX_BYTES:
        raise OpError(
            f"{what}: shape {shape} of {dtype.name} is {nbytes} bytes, more than any "
            "device holds; check the shape")
    return nbytes


def _device_array(shape: tuple[int, ...], dtype: np.dtype, stream: Any, what: str) -> Any:
    nbytes = _nbytes(shape, dtype, what)
    try:
        return cuda.device_array(shape, dtype, stream=_backend.as_numba_stream(stream))
    except NumbagraphError:
        raise
    except Exception as exc:
        raise OpError(
            f"{what}: could not allocate {nbytes} bytes ({shape} of {dtype.name}) on the "
            f"device: {exc}. Free arrays no longer needed, or make it smaller") from exc


def empty(shape: Shape, dtype: Any = np.float64, *, stream: Any = 0) -> Any:
    """A new C-contiguous device array, uninitialised.

    Inside a capture, on its thread, for the capturing stream or with no
    stream named, the allocation is recorded into the capture: the array is
    memory of the graph, which exists from the graph's first launch until
    its next one (which makes it again), or until [free][numbagraph.free]
    frees it inside the graph.

    Parameters
    ----------
    shape
        An int, or a tuple of ints.
    dtype
        Any NumPy dtype.
    stream
        The stream the allocation is made for; 0 names none.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``shape`` is not a non-negative integer or a tuple of them.
    TypeError
        ``dtype`` is not a NumPy dtype, or ``stream`` is not a stream.
    GraphMemoryError
        Inside a conditional block's body, where CUDA records no allocation.
    AllocationInCaptureError
        An allocation for another stream where this thread may not allocate
        now: it runs a "thread_local" or "global" capture, or any thread
        runs a "global" one, or ``stream`` captures outside numbagraph; or
        no stream named while this thread captures on several. Nothing is
        allocated, and the captures that forbid it are ended.

    Examples
    --------
    ```python
    out = ng.empty((4, 1024), np.float32)
    ```
    """
    shape, dtype = _shape(shape), np.dtype(dtype)
    handle = _backend.stream_handle(stream)
    session = graph_allocation_session(handle, "ng.empty()")
    if session is not None:
        _nbytes(shape, dtype, "ng.empty()")
        return graph_allocate(session, shape, dtype, _backend.as_numba_stream(stream),
                              "ng.empty()")
    guard_allocation("ng.empty()", handle)
    return _device_array(shape, dtype, stream, "ng.empty()")


def zeros(shape: Shape, dtype: Any = np.float64, *, stream: Any = 0) -> Any:
    """A new C-contiguous device array of zeros, filled on ``stream``.

    Inside a capture, as [empty][numbagraph.empty], the array is memory of
    the graph, and the graph zeroes it at every launch.

    Parameters
    ----------
    shape
        An int, or a tuple of ints.
    dtype
        Any NumPy dtype.
    stream
        The stream the zeros are written on; 0 names none.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``shape`` is not a non-negative integer or a tuple of them; or
        ``stream`` captures on another thread, so the fill would be recorded
        into that capture instead of run.
    TypeError
        ``dtype`` is not a NumPy dtype, or ``stream`` is not a stream.
    GraphMemoryError, AllocationInCaptureError
        As [empty][numbagraph.empty].
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.

    Examples
    --------
    ```python
    cache = ng.zeros((max_len, dim), np.float32, stream=s)
    ```
    """
    shape, dtype, handle = _shape(shape), np.dtype(dtype), _backend.stream_handle(stream)
    session = graph_allocation_session(handle, "ng.zeros()")
    if session is not None:
        _nbytes(shape, dtype, "ng.zeros()")
        array = graph_allocate(session, shape, dtype, _backend.as_numba_stream(stream),
                               "ng.zeros()")
        # On the stream that allocated it (a stream forked into the capture
        # allocates on its own), or the capture's own when none is named.
        _backend.memset_zero(array, handle or session.handle)
        return array
    guard_allocation("ng.zeros()", handle)
    if _backend.is_capturing(handle) if handle else False:
        raise OpError(
            f"ng.zeros(stream={stream!r}) cannot fill the array now: the stream "
            "captures on another thread, so the fill would be recorded into that "
            "capture instead of run. Pass another stream, or call it on the "
            "capturing thread, where the array becomes memory of the graph"
        )
    guard_legacy_work(handle, "ng.zeros() filling on the legacy default stream",
                      "pass stream= a stream from cuda.stream()")
    array = _device_array(shape, dtype, stream, "ng.zeros()")
    _backend.memset_zero(array, handle)
    return array


def _like(a: Any) -> tuple[tuple[int, ...], np.dtype]:
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is None or dtype is None:
        raise OpError(f"{type(a).__name__} has no shape and dtype to copy")
    return tuple(shape), np.dtype(dtype)


def empty_like(a: Any, dtype: Any = None, *, stream: Any = 0) -> Any:
    """An uninitialised device array with ``a``'s shape and dtype (or ``dtype``).

    Parameters
    ----------
    a
        Anything with ``shape`` and ``dtype``: a device or NumPy array.
    dtype
        The new array's dtype; ``a``'s when None.
    stream
        The stream the allocation is made for.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``a`` has no ``shape`` and ``dtype``.
    GraphMemoryError, AllocationInCaptureError
        As [empty][numbagraph.empty].

    Examples
    --------
    ```python
    out = ng.empty_like(x)
    ```
    """
    shape, own = _like(a)
    return empty(shape, own if dtype is None else dtype, stream=stream)


def zeros_like(a: Any, dtype: Any = None, *, stream: Any = 0) -> Any:
    """A device array of zeros with ``a``'s shape and dtype (or ``dtype``).

    Parameters
    ----------
    a
        Anything with ``shape`` and ``dtype``: a device or NumPy array.
    dtype
        The new array's dtype; ``a``'s when None.
    stream
        The stream the zeros are written on; not a capturing one.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``a`` has no ``shape`` and ``dtype``, or ``stream`` captures on
        another thread.
    GraphMemoryError, AllocationInCaptureError
        As [empty][numbagraph.empty].
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.

    Examples
    --------
    ```python
    grad = ng.zeros_like(w, stream=s)
    ```
    """
    shape, own = _like(a)
    return zeros(shape, own if dtype is None else dtype, stream=stream)


def free(array: Any) -> None:
    """Free graph-owned memory inside the capture that allocated it, at this
    point of the graph: later allocations of the graph may reuse the memory.

    Frees nothing at once: the graph frees the memory each time it runs, in
    the order of the stream that allocated it (the capturing stream, or a
    stream forked into the capture while it is in it: work on other streams
    that uses the array must be joined into that stream first). From this
    point on the array may not
    be used, by the capture's work or, after a replay, on the host. Outside
    a capture (a function run as written before it is captured), given an
    array made at once, it does nothing: numba frees that array when it is
    dropped.

    Parameters
    ----------
    array
        An array allocated in the capture running on this thread (by
        [empty][numbagraph.empty] and its kin, or ``cuda.device_array``), as
        returned, not a view of it.

    Raises
    ------
    GraphMemoryError
        ``array`` is graph memory whose capture is not running on this
        thread; or, inside a capture, ``array`` is not memory this thread's
        capture allocated (a graph's memory that it does not free is freed at its
        next launch or when it is closed), is a view, was freed already, or the call is
        inside a conditional block's body, where CUDA records no free.
        Nothing is recorded.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        tmp = ng.empty(n, np.float32, stream=s)
        ng.mul_into(x, 2.0, tmp, stream=s)
        ng.add_into(tmp, y, out, stream=s)
        ng.free(tmp)
    ```
    """
    found = _backend.graph_memory_of(array)
    if found is None:
        me = threading.current_thread()
        if not any(s.thread is me for s in _registry.active()):
            return  # run as written, outside a capture: numba frees it when dropped
        raise GraphMemoryError(
            f"ng.free() inside a capture frees memory the capture allocated; this "
            f"{type(array).__name__} is not graph memory (it was made outside the "
            "capture), and a graph cannot free it. numba frees it when the last "
            "reference to it is dropped")
    allocation, output = found
    memory = allocation.memory
    session = next((s for s in _registry.active() if s.memory is memory), None)
    if session is None or session.thread is not threading.current_thread():
        raise GraphMemoryError(
            f"ng.free(): {allocation.what} belongs to a graph whose capture is not "
            "running on this thread; free it inside that capture. Memory a graph "
            "does not free is freed at its next launch, and when it is closed")
    made = allocation.array
    if output is not None or made is None or made() is not array:
        raise GraphMemoryError(
            f"ng.free() takes the array the allocation returned, not a view or another "
            f"array over it ({allocation.what}); pass that array")
    if allocation.freed:
        raise GraphMemoryError(f"ng.free(): {allocation.what} was freed already")
    if session.block is not None:
        raise GraphMemoryError(
            f"ng.free() cannot free inside {session.block}: CUDA forbids memory nodes "
            "in a conditional body. Free it after the block closes")
    _backend.graph_free(graph_free_handle(session, allocation), array, allocation)
    allocation.freed = True


class GraphMemoryInfo(NamedTuple):
    """The current device's graph memory, in bytes (see
    [graph_memory_info][numbagraph.graph_memory_info])."""

    used: int
    """Held by graphs' allocations now."""
    used_high: int
    """The most ever held at once."""
    reserved: int
    """Taken from the system for graph memory now, in use or not."""
    reserved_high: int
    """The most ever taken at once."""


def graph_memory_info() -> GraphMemoryInfo:
    """How much device memory graphs hold, on the current device.

    Graphs launched into one stream never run at once, so the driver lets
    them share physical memory: eight graphs that each allocate and free
    256 MiB inside reserve about 256 MiB between them, not 2 GiB (on the
    simulator, which shares nothing, reserved is the most held since the
    last trim).

    Returns
    -------
    GraphMemoryInfo
        ``used``, ``used_high``, ``reserved``, ``reserved_high``.

    Examples
    --------
    ```python
    info = ng.graph_memory_info()
    print(info.reserved / 2**20, "MiB reserved for graphs")
    ```
    """
    return GraphMemoryInfo(*_backend.graph_memory_info())


def trim_graph_memory() -> None:
    """Give the graph memory no graph holds now back to the system.

    Examples
    --------
    ```python
    graph.close()
    ng.trim_graph_memory()
    ```
    """
    _backend.trim_graph_memory()
