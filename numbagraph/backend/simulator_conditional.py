"""Conditional nodes on Numba's CUDA simulator.

A condition is a host-side cell that simulated kernels write through
``set_condition``. A conditional node is one recorded call holding its bodies
as lists of calls; while a body is open, the capture's node list is swapped
for the body's, so launches on the stream land there as on the GPU. As on
the driver, the node depends on the stream's work so far and is all the
work after it depends on, and a body is a graph of its own: its first work
depends on nothing.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

from ._bodies import BodyTracking

__all__ = [
    "ConditionalNode",
    "condition_argument",
    "condition_create",
    "conditional_version",
    "loop_memory",
    "pass_condition",
    "set_condition",
]

_UINT32 = 0xFFFFFFFF


def conditional_version() -> tuple[int, int]:
    """The simulator runs every kind of node CUDA 12.8 offers."""
    return (12, 8)


class ConditionCell:
    """The value of one condition, as the simulated graph sees it."""

    __slots__ = ("value", "default")

    def __init__(self, default: int | None):
        self.default = default
        self.value = 0 if default is None else default

    def reset(self) -> None:
        self.value = self.default

    def __repr__(self) -> str:
        return f"<simulated graph condition = {self.value}>"


class PassTag:
    """What a kernel recorded into pass ``index`` of an unrolled loop is
    given for the loop's condition, as on the driver: setting it to 0 ends
    the loop after that pass, through the loop's state (``state[0]``, the
    last pass that may run; ``state[1]``, stopped)."""

    __slots__ = ("state", "index")

    def __init__(self, state: Any, index: int):
        self.state, self.index = state, index

    def __repr__(self) -> str:
        return f"<simulated pass {self.index} of an unrolled loop>"


def set_condition(cond: Any, value: Any) -> None:
    """Set ``cond`` to ``value`` (non-zero: true) from a simulated kernel."""
    if type(cond) is PassTag:
        if int(value) & _UINT32 == 0:
            state = cond.state
            state[0] = min(int(state[0]), cond.index)
            state[1] = 1
        return
    if not isinstance(cond, ConditionCell):
        raise TypeError(
            f"set_condition takes the ng.Condition passed to the kernel, not "
            f"{type(cond).__name__}"
        )
    cond.value = int(value) & _UINT32  # the uint32 the device stores


def condition_create(recording: Any, default: int | None) -> ConditionCell:
    cell = ConditionCell(default)
    if default is not None:
        # CUDA assigns the default as each launch of the graph starts.
        recording.prologue.append(cell.reset)
    return cell


def condition_argument(state: ConditionCell) -> ConditionCell:
    return state


def pass_condition(state: Any, index: int) -> PassTag:
    return PassTag(state, index)


def loop_memory(size: int, dtype: Any, release: Callable[[Callable[[], None]], None]) -> Any:
    """A device array for a loop's own state; the simulator frees nothing."""
    return FakeCUDAArray(np.zeros(max(size, 1), dtype))


def _run(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


class _Node:
    """The recorded call: runs the bodies the condition selects."""

    __slots__ = ("kind", "cell", "bodies", "links")

    def __init__(self, kind: str, cell: ConditionCell, size: int):
        self.kind, self.cell = kind, cell
        self.bodies: list[list[Callable[[], None]]] = [[] for _ in range(size)]
        # Per body, in step with its calls: each call's id and what it
        # depends on (as the recording's ``links``).
        self.links: list[list[tuple[int, Any]]] = [[] for _ in range(size)]

    def rebound(self, rebind: Callable[[Any], Any]) -> "_Node":
        """This node with every call in its bodies passed through ``rebind``."""
        node = _Node(self.kind, self.cell, 0)
        node.bodies = [[rebind(call) for call in body] for body in self.bodies]
        node.links = self.links
        return node

    def __call__(self) -> None:
        cell, bodies = self.cell, self.bodies
        if self.kind == "while":
            while cell.value:
                _run(bodies[0])
        elif self.kind == "if":
            if cell.value:
                _run(bodies[0])
            elif len(bodies) == 2:
                _run(bodies[1])
        elif cell.value < len(bodies):
            _run(bodies[cell.value])


class ConditionalNode(BodyTracking):
    """A conditional node appended where the stream's capture stands now.

    ``begin_branch(i)`` makes the stream record into body ``i``;
    ``end_branch()`` goes back to the enclosing list, after the node.
    """

    __slots__ = ("_node",)

    def __init__(self, recording: Any, condition: ConditionCell, kind: str, size: int, mode: str):
        super().__init__(recording)
        self._node = _Node(kind, condition, size)
        recording.record(recording._key, self._node)

    def begin_branch(self, index: int) -> None:
        recording = self._recording
        node = self._node
        # The body's first work depends on nothing: the stream has no
        # frontier in it yet.
        saved = (recording.nodes, recording.links, recording.frontiers.pop(recording._key, None))
        recording.nodes, recording.links = node.bodies[index], node.links[index]
        self._opened(saved)

    def _resume(self, saved: Any) -> None:
        """Record into the enclosing list again, after the node."""
        recording = self._recording
        recording.nodes, recording.links, frontier = saved
        recording.frontiers.pop(recording._key, None)
        if frontier is not None:
            recording.frontiers[recording._key] = frontier

    def end_branch(self) -> None:
        saved = self._close()
        if saved is not None:
            self._resume(saved)

    def abandon_branch(self, resume: bool) -> None:
        saved = self._close()
        if resume and saved is not None:
            self._resume(saved)
