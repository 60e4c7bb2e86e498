"""Device-updatable kernel nodes on Numba's CUDA simulator.

A device node is a host-side cell holding the grid and the enabled state the
node launches with; simulated kernels change them through ``set_grid`` and
``set_enabled``. The recorded launch is wrapped in an :class:`Updatable` call
that launches with the cell's grid, or not at all while disabled. The cell
belongs to the graph and outlives its launches, as the driver's node state
does: an update made before the node in a launch is seen by the node in that
launch, and by every later launch until changed again; one made after it,
from the next launch. A rebinding that gives the node's kernel other arrays
(the driver's cuGraphExecKernelNodeSetParams) sets its grid back to the one
captured.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from .simulator import _recordings, _run
from .simulator_conditional import _Node
from .simulator_streams import ChildGraph
from ._streams import capture_key

__all__ = [
    "Updatable",
    "device_node_argument",
    "device_node_attach",
    "device_node_count",
    "device_node_create",
    "set_enabled",
    "set_grid",
]

_UINT32 = 0xFFFFFFFF
# cudaErrorInvalidValue, what the device's update returns for a grid it refuses.
_INVALID_VALUE = 1
# The largest grid CUDA launches: x, y, z.
_GRID_LIMITS = (2**31 - 1, 65535, 65535)


class DeviceNodeCell:
    """The launch state of one device node, as the simulated graph sees it."""

    __slots__ = ("grid", "captured", "enabled")

    def __init__(self) -> None:
        self.grid: tuple[int, int, int] | None = None
        self.captured: tuple[int, int, int] | None = None
        self.enabled = True

    def __repr__(self) -> str:
        return f"<simulated device node grid={self.grid} enabled={self.enabled}>"


def _dim3(dim: Any) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in dim) if isinstance(dim, (tuple, list)) else (int(dim),)
    return (dims + (1, 1, 1))[:3]  # type: ignore[return-value]


def _cell(node: Any, what: str) -> DeviceNodeCell:
    if not isinstance(node, DeviceNodeCell):
        raise TypeError(f"{what} takes the ng.DeviceNode passed to the kernel, not "
                        f"{type(node).__name__}")
    return node


def set_grid(node: Any, x: Any, y: Any = 1, z: Any = 1) -> int:
    """Set the node's grid from a simulated kernel: 0, or 1 (CUDA's
    cudaErrorInvalidValue) and nothing changed where a dimension is 0 or
    beyond CUDA's limits. Dimensions are taken as the device's uint32."""
    cell = _cell(node, "set_grid")
    grid = (int(x) & _UINT32, int(y) & _UINT32, int(z) & _UINT32)
    if any(d == 0 or d > limit for d, limit in zip(grid, _GRID_LIMITS)):
        return _INVALID_VALUE
    cell.grid = grid
    return 0


def set_enabled(node: Any, enabled: Any) -> int:
    """Enable (non-zero) or disable the node from a simulated kernel: 0."""
    _cell(node, "set_enabled").enabled = bool(enabled)
    return 0


def device_node_create(recording: Any,
                       release: Callable[[Callable[[], None]], None]) -> DeviceNodeCell:
    return DeviceNodeCell()


def device_node_argument(state: DeviceNodeCell) -> DeviceNodeCell:
    return state


class Updatable:
    """A recorded kernel launch that is a device node: it launches with its
    cell's grid, and not at all while the cell is disabled."""

    __slots__ = ("cell", "call")

    def __init__(self, cell: DeviceNodeCell, call: functools.partial):
        self.cell, self.call = cell, call

    def rebound(self, rebind: Any) -> "Updatable":
        call = rebind(self.call)
        if call is self.call:
            return self
        moved = Updatable(self.cell, call)
        # A rebinding sets the whole launch from the host, the captured grid
        # included, before any kernel of the next launch runs.
        rebind.reset.append(moved)
        return moved

    def reset(self) -> None:
        self.cell.grid = self.cell.captured

    def __call__(self) -> None:
        cell = self.cell
        if cell.enabled:
            kernel, _grid, block, shared, args = self.call.args
            _run(kernel, cell.grid, block, shared, args)


def device_node_attach(recording: Any, state: DeviceNodeCell, handle: int) -> None:
    """The launch the stream ``handle`` recorded last becomes the node of
    ``state``."""
    key = capture_key(handle)
    recording = _recordings.get(key, recording)
    last = recording.frontiers.get(key)
    if not isinstance(last, int):
        raise TypeError("the stream's work does not stand after one recorded launch")
    for index in range(len(recording.links) - 1, -1, -1):
        if recording.links[index][0] == last:
            break
    else:
        raise TypeError("the stream's last work is not in the graph it records into")
    call = recording.nodes[index]
    if not (isinstance(call, functools.partial) and call.func is _run):
        raise TypeError("the stream's last node is not a kernel launch")
    state.grid = state.captured = _dim3(call.args[1])
    recording.nodes[index] = Updatable(state, call)


def _count(calls: Any) -> int:
    total = 0
    for call in calls:
        if isinstance(call, Updatable):
            total += 1
        elif isinstance(call, _Node):
            total += sum(_count(body) for body in call.bodies)
        elif isinstance(call, ChildGraph):
            total += _count(call.calls)
    return total


def device_node_count(executable: Any) -> int:
    """How many device nodes the simulated graph holds."""
    return _count(executable._nodes)
