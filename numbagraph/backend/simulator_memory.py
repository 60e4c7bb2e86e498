"""Graph-owned memory on the simulator: the driver's lifetime rules, modelled.

An allocation is a NumPy buffer made at once; the recording gets an
allocation node, which at every launch makes the memory again (its bytes set
to 0xFF, so that nothing can lean on what an earlier launch left), and a
free node for ``ng.free``, which does the same to memory the graph no longer
owns. Which array belongs to which allocation is found from the buffer
every view of it leads back to (for a graphed call's result, the object
that holds its owner). The counts of :func:`graph_memory_info`
follow the allocations each launch holds; the simulator shares no memory
between graphs, so reserved memory is the most ever held since the last
trim.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Sequence

import numpy as np
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

from ._streams import capture_key
from .simulator import _recordings

# id(buffer) -> (allocation, output) of every buffer an allocation or a
# graphed call's result is made of; an entry goes with its buffer.
_owners: dict[int, tuple[Any, Any]] = {}

# id(allocation) -> its bytes, for each allocation a launch holds now.
_held: dict[int, int] = {}
_counts = {"used": 0, "used_high": 0, "reserved": 0, "reserved_high": 0}


def _own(buffer: np.ndarray, allocation: Any, output: Any) -> None:
    key = id(buffer)
    _owners[key] = (allocation, output)
    weakref.finalize(buffer, _owners.pop, key, None)


def _count(change: int) -> None:
    counts = _counts
    counts["used"] += change
    counts["used_high"] = max(counts["used_high"], counts["used"])
    counts["reserved"] = max(counts["reserved"], counts["used"])
    counts["reserved_high"] = max(counts["reserved_high"], counts["reserved"])


def _poison(buffer: np.ndarray) -> None:
    # In memory order: a view of the whole buffer, C- or F-contiguous.
    np.ravel(buffer, order="K").view(np.uint8)[...] = 0xFF


def _make(buffer: np.ndarray, allocation: Any) -> None:
    """The allocation node, run at every launch."""
    _poison(buffer)
    if id(allocation) not in _held:
        _held[id(allocation)] = allocation.nbytes
        _count(allocation.nbytes)


def _unmake(buffer: np.ndarray, allocation: Any) -> None:
    """The free node of ``ng.free``."""
    _poison(buffer)
    nbytes = _held.pop(id(allocation), None)
    if nbytes is not None:
        _count(-nbytes)


def graph_allocate(handle: int, shape: tuple[int, ...], dtype: np.dtype, stream: Any,
                   allocation: Any, order: str) -> Any:
    buffer = np.empty(shape, dtype, order=order)
    _poison(buffer)
    _own(buffer, allocation, None)
    key = capture_key(handle)
    _recordings[key].record(key, functools.partial(_make, buffer, allocation))
    return FakeCUDAArray(buffer, stream=stream)


def _buffer(dev: Any) -> np.ndarray:
    buffer = dev._ary
    while isinstance(buffer.base, np.ndarray):
        buffer = buffer.base
    return buffer


def graph_free(handle: int, dev: Any, allocation: Any) -> None:
    key = capture_key(handle)
    _recordings[key].record(key, functools.partial(_unmake, _buffer(dev), allocation))


class _Returned:
    """The memory of an array a graphed call returned: NumPy makes it the
    base of that array and of every view of it, so views lead back here."""

    def __init__(self, ary: np.ndarray, owner: tuple[Any, Any]):
        self.ary, self.owner = ary, owner
        self.__array_interface__ = ary.__array_interface__


def graph_memory_of(value: Any) -> tuple[Any, Any] | None:
    if type(value) is not FakeCUDAArray:
        return None
    buffer = value._ary
    while buffer is not None:
        found = _owners.get(id(buffer))
        if found is not None:
            return found
        base = buffer.base
        if type(base) is _Returned:
            return base.owner
        buffer = base if isinstance(base, np.ndarray) else None
    return None


def graph_output(dev: Any, allocation: Any, output: Any) -> Any:
    view = np.asarray(_Returned(dev._ary, (allocation, output)))
    return FakeCUDAArray(view, stream=dev.stream)


def release_graph_memory(allocations: Sequence[Any], handle: int | None,
                         device: int) -> None:
    # One device: every graph's memory is device 0's.
    for allocation in allocations:
        nbytes = _held.pop(id(allocation), None)
        if nbytes is not None:
            _count(-nbytes)


def graph_memory_info() -> tuple[int, int, int, int]:
    c = _counts
    return c["used"], c["used_high"], c["reserved"], c["reserved_high"]


def trim_graph_memory() -> None:
    _counts["reserved"] = _counts["used"]
