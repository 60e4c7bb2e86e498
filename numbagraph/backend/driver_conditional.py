"""Conditional nodes on the CUDA driver.

A conditional node's bodies are recorded on the capturing stream itself: the
capture is paused (``cuStreamEndCapture`` hands back the graph being built),
the node is added after the work captured so far, and the stream then
captures into a body graph with ``cuStreamBeginCaptureToGraph``. Closing a
body resumes the capture of the enclosing graph where it stopped, so code
that launches on the stream never has to know which graph it records into.
"""

from __future__ import annotations

import pathlib
from typing import Any, Callable

import numpy as np
from cuda import bindings as _bindings
from cuda.bindings import driver as cu
from numba import cuda

from ._bodies import BodyTracking
from .driver_base import CAPTURE_ACTIVE, CAPTURE_MODES, DriverError, check, is_capturing

__all__ = [
    "ConditionalNode",
    "condition_argument",
    "condition_create",
    "conditional_version",
    "capture_node_count",
    "loop_memory",
    "pass_condition",
    "set_condition",
]

_INVALIDATED = cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED


def _version_tuple(text: str) -> tuple[int, int]:
    parts = (text.split(".") + ["0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


_SOURCE = pathlib.Path(__file__).with_name("conditional.cu")

# cuda-bindings 13 gives cuGraphAddNode edge data; 12 has it in _v2 only.
_EDGE_DATA = _version_tuple(_bindings.__version__) >= (13, 0)



def conditional_version() -> tuple[int, int]:
    """The CUDA version whose conditional nodes can be used: the older of the
    driver and the cuda-bindings package, as ``(major, minor)``."""
    raw = check("cuDriverGetVersion", cu.cuDriverGetVersion())
    driver = (raw // 1000, (raw % 1000) // 10)
    return min(driver, _version_tuple(_bindings.__version__))


# ---------------------------------------------------------------- conditions

_set_conditional = cuda.declare_device(
    "ng_set_condition", "int32(uint64, uint32)", link=[str(_SOURCE)]
)


@cuda.jit(device=True)
def set_condition(cond, value):
    """Set ``cond`` to ``value`` (non-zero: true) from device code."""
    _set_conditional(np.uint64(cond), np.uint32(value))


def _capture_info(handle: int) -> tuple:
    """``(status, graph, dependencies, count)`` of the stream's capture.

    Only the dependency nodes are kept: edge data (cuda-bindings 13) is
    returned in memory the driver reuses once the capture pauses, and numba
    launches only ever make default edges.
    """
    status, _id, graph, deps, *_, count = check(
        "cuStreamGetCaptureInfo", cu.cuStreamGetCaptureInfo(handle)
    )
    return status, graph, list(deps[:count]) if count else [], count


def _add_node(graph: Any, deps: list, params: Any) -> Any:
    if _EDGE_DATA:
        ret = cu.cuGraphAddNode(graph, deps, None, len(deps), params)
    else:
        ret = cu.cuGraphAddNode(graph, deps, len(deps), params)
    return check("cuGraphAddNode", ret)


def condition_create(recording: Any, default: int | None) -> Any:
    """A conditional handle of the graph the stream captures into."""
    handle = recording.handle
    status, graph, _, _ = _capture_info(handle)
    if status != CAPTURE_ACTIVE:
        raise DriverError("cuStreamGetCaptureInfo", _INVALIDATED)
    ctx = check("cuStreamGetCtx", cu.cuStreamGetCtx(handle))
    flags = 0 if default is None else cu.CU_GRAPH_COND_ASSIGN_DEFAULT
    made = check(
        "cuGraphConditionalHandleCreate",
        cu.cuGraphConditionalHandleCreate(graph, ctx, default or 0, flags),
    )
    if int(made) >> 56 == _PASS_TAG:
        # ng_set_condition would take it for a pass tag.
        raise DriverError("cuGraphConditionalHandleCreate", cu.CUresult.CUDA_ERROR_NOT_SUPPORTED)
    return made


def condition_argument(state: Any) -> np.uint64:
    """What a kernel is given for a condition: the handle, a uint64."""
    return np.uint64(int(state))


# A pass tag, as conditional.cu reads it: the tag, the pass, the address.
_PASS_TAG = 0xA5
_ADDRESS_BITS = 48


def pass_condition(state: Any, index: int) -> np.uint64:
    """What a kernel recorded into pass ``index`` (from 1) of an unrolled
    loop is given for the loop's condition: a tag naming the pass and the
    loop's state (an int32 array whose first element is the last pass that
    may run)."""
    address = int(state.device_ctypes_pointer.value)
    if address >> _ADDRESS_BITS or not 0 < index < 256:
        raise DriverError("ng_set_condition", cu.CUresult.CUDA_ERROR_NOT_SUPPORTED)
    return np.uint64((_PASS_TAG << 56) | (index << _ADDRESS_BITS) | address)


def _free_relaxed(pointer: int) -> None:
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    err, previous = cu.cuThreadExchangeStreamCaptureMode(mode)
    try:
        cu.cuMemFree(cu.CUdeviceptr(pointer))
    finally:
        if not err:
            cu.cuThreadExchangeStreamCaptureMode(previous)


def loop_memory(size: int, dtype: np.dtype, release: Callable[[Callable[[], None]], None]) -> Any:
    """A device array of ``size`` elements for a loop's own state, which its
    kernels initialise at each launch, made while the thread may be
    capturing: the allocation is made with the thread's capture mode
    relaxed, which CUDA allows during a capture, and is not part of any
    graph. Once the array is collected its memory is freed through
    ``release`` (which defers it until no capture runs)."""
    from numba.cuda.cudadrv import devicearray, driver as numba_driver

    dtype = np.dtype(dtype)
    nbytes = max(size, 1) * dtype.itemsize
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    previous = check("cuThreadExchangeStreamCaptureMode",
                     cu.cuThreadExchangeStreamCaptureMode(mode))
    try:
        pointer = int(check("cuMemAlloc", cu.cuMemAlloc(nbytes)))
    finally:
        cu.cuThreadExchangeStreamCaptureMode(previous)
    memory = numba_driver.MemoryPointer(
        cuda.current_context(), cu.CUdeviceptr(pointer), nbytes,
        finalizer=lambda: release(lambda: _free_relaxed(pointer)))
    return devicearray.DeviceNDArray((size,), (dtype.itemsize,), dtype, gpu_data=memory)


def capture_node_count(handle: int) -> int:
    """How many nodes the graph the stream captures into holds now."""
    status, graph, _, _ = _capture_info(handle)
    if status != CAPTURE_ACTIVE:
        raise DriverError("cuStreamGetCaptureInfo", _INVALIDATED)
    _, count = check("cuGraphGetNodes", cu.cuGraphGetNodes(graph, 0))
    return int(count)


# ---------------------------------------------------------------- nodes

_NODE_KINDS = {
    "while": "CU_GRAPH_COND_TYPE_WHILE",
    "if": "CU_GRAPH_COND_TYPE_IF",
    "switch": "CU_GRAPH_COND_TYPE_SWITCH",
}


def _pause(handle: int) -> tuple:
    """End the capture on the stream for now; returns what resumes it."""
    status, graph, deps, _ = _capture_info(handle)
    if status != CAPTURE_ACTIVE:
        raise DriverError("cuStreamGetCaptureInfo", _INVALIDATED)
    check("cuStreamEndCapture", cu.cuStreamEndCapture(handle))
    return graph, deps


def _resume(handle: int, mode: str, graph: Any, deps: list) -> None:
    check(
        "cuStreamBeginCaptureToGraph",
        cu.cuStreamBeginCaptureToGraph(
            handle, graph, deps or None, None, len(deps), CAPTURE_MODES[mode]
        ),
    )


class ConditionalNode(BodyTracking):
    """A conditional node added where the stream's capture stands now.

    ``begin_branch(i)`` makes the stream capture into body ``i``;
    ``end_branch()`` goes back to the enclosing graph, after the node.
    """

    __slots__ = ("_handle", "_mode", "_bodies")

    def __init__(self, recording: Any, condition: Any, kind: str, size: int, mode: str):
        super().__init__(recording)
        handle = recording.handle
        self._handle, self._mode = handle, mode
        graph, deps = _pause(handle)
        node = None
        try:
            params = cu.CUgraphNodeParams()
            params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = condition
            params.conditional.type = getattr(
                cu.CUgraphConditionalNodeType, _NODE_KINDS[kind]
            )
            params.conditional.size = size
            params.conditional.ctx = check("cuStreamGetCtx", cu.cuStreamGetCtx(handle))
            node = _add_node(graph, deps, params)
            self._bodies = [params.conditional.phGraph_out[i] for i in range(size)]
            recording.bodies.extend(self._bodies)
            recording.conditionals[int(node)] = (kind, tuple(self._bodies), condition)
        finally:
            self._resume(graph, deps if node is None else [node])

    def _resume(self, graph: Any, deps: list) -> None:
        """Resume the enclosing capture into ``graph``. If the driver refuses
        while no body is open, ``graph`` is the capture's own and nothing
        else holds it: the recording keeps it, to destroy it on abort."""
        try:
            _resume(self._handle, self._mode, graph, deps)
        except DriverError:
            if not self._recording.open_bodies:
                self._recording.stranded = graph
            raise

    def begin_branch(self, index: int) -> None:
        saved = _pause(self._handle)
        try:
            check(
                "cuStreamBeginCaptureToGraph",
                cu.cuStreamBeginCaptureToGraph(
                    self._handle, self._bodies[index], None, None, 0, CAPTURE_MODES[self._mode]
                ),
            )
        except DriverError:
            self._resume(*saved)
            raise
        self._opened(saved)

    def end_branch(self) -> None:
        saved = self._close()
        try:
            check("cuStreamEndCapture", cu.cuStreamEndCapture(self._handle))
        finally:
            self._resume(*saved)

    def abandon_branch(self, resume: bool) -> None:
        """Stop recording the body after a failure; resume the enclosing
        capture only if it still exists (``resume``)."""
        saved = self._close()
        if not resume or saved is None:
            return
        if is_capturing(self._handle):
            cu.cuStreamEndCapture(self._handle)  # an invalidated body ends too
        try:
            self._resume(*saved)
        except DriverError:
            pass  # the enclosing capture is aborted next, stranded graph and all
