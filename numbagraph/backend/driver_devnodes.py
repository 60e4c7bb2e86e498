"""Device-updatable kernel nodes on the CUDA driver.

A kernel node is opted in with the launch attribute
``CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE`` once the capture has
ended and before the graph is instantiated (an executable made before the
opt-in sees no update); the driver then gives the node a device handle,
which kernels pass to ``cudaGraphKernelNodeSetGridDim`` and
``cudaGraphKernelNodeSetEnabled`` (``device_nodes.cu``). Kernels launched
before the node exists are given it too, so what a kernel receives is a
slot in device memory, one uint64, that the handle is written into as the
capture ends, on the capture's stream: an event recorded after that write is
waited on by the stream of the graph's first launch or upload.

CUDA's documentation asks for an upload of an executable whose nodes are
updated from the device, after instantiation and after each update from the
host (a rebinding): the executable's :class:`Ready` does it before the next
launch. Everything here is as probe35 (``.gpu/probe35``) ran it on an H200.
"""

from __future__ import annotations

import pathlib
import weakref
from typing import Any, Callable

import numpy as np
from cuda.bindings import driver as cu
from numba import cuda

from .driver_base import CAPTURE_ACTIVE, DriverError, check, in_context

__all__ = [
    "device_node_argument",
    "device_node_attach",
    "device_node_count",
    "device_node_create",
    "set_enabled",
    "set_grid",
]

_SOURCE = pathlib.Path(__file__).with_name("device_nodes.cu")

# cuGraphKernelNode{Set,Get}Attribute take a CUkernelNodeAttrID (an enum of
# its own in cuda-bindings 13), CUlaunchAttributeID before.
_ATTR = getattr(getattr(cu, "CUkernelNodeAttrID", cu.CUlaunchAttributeID),
                "CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE",
                cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE)
_KERNEL = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
_INVALIDATED = cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED

# ---------------------------------------------------------------- device functions

_set_grid = cuda.declare_device(
    "ng_set_grid", "int32(uint64, uint32, uint32, uint32)", link=[str(_SOURCE)])
_set_enabled = cuda.declare_device(
    "ng_set_enabled", "int32(uint64, uint32)", link=[str(_SOURCE)])


@cuda.jit(device=True)
def set_grid(node, x, y=1, z=1):
    """Set the grid of the node whose slot ``node`` is; CUDA's error code."""
    return _set_grid(node[0], np.uint32(x), np.uint32(y), np.uint32(z))


@cuda.jit(device=True)
def set_enabled(node, enabled):
    """Enable (non-zero) or disable the node whose slot ``node`` is."""
    return _set_enabled(node[0], np.uint32(1 if enabled else 0))


# ---------------------------------------------------------------- capture

class _Pending:
    """The nodes a capture opts in as it ends: (node, slot) pairs."""

    __slots__ = ("nodes", "__weakref__")

    def __init__(self) -> None:
        self.nodes: list[tuple[Any, Any]] = []


# recording -> what it opts in as it ends
_pending: "weakref.WeakKeyDictionary[Any, _Pending]" = weakref.WeakKeyDictionary()


def device_node_create(recording: Any,
                       release: Callable[[Callable[[], None]], None]) -> Any:
    """The slot of a new device node: one uint64 of device memory, made
    while the thread captures (``loop_memory``'s way), zero until the
    capture ends."""
    from .driver_conditional import loop_memory

    return loop_memory(1, np.uint64, release)


def device_node_argument(state: Any) -> Any:
    """What a kernel is given for a device node: its slot."""
    return state


def device_node_attach(recording: Any, state: Any, handle: int) -> None:
    """The kernel node the stream ``handle`` recorded last becomes the node
    of ``state``; it is opted in as the capture ends."""
    status, _id, _graph, deps, *_, count = check(
        "cuStreamGetCaptureInfo", cu.cuStreamGetCaptureInfo(handle))
    if status != CAPTURE_ACTIVE:
        raise DriverError("cuStreamGetCaptureInfo", _INVALIDATED)
    if int(count) != 1:
        raise TypeError(f"the stream's work stands after {int(count)} nodes, not one kernel node")
    node = cu.CUgraphNode(int(deps[0]))  # the driver reuses the array it returned
    kind = check("cuGraphNodeGetType", cu.cuGraphNodeGetType(node))
    if kind != _KERNEL:
        raise TypeError(f"the stream's last node is a {kind.name}, not a kernel node")
    _pending.setdefault(recording, _Pending()).nodes.append((node, state))


class Ready:
    """An executable's device nodes: the event after their handles were
    written, and whether an upload is due before the next launch."""

    __slots__ = ("count", "slots", "due", "_event", "__weakref__")

    def __init__(self, count: int, slots: list, event: Any):
        self.count = count
        self.slots = slots  # the graph's kernels read them: kept as long as it lives
        self.due = True
        self._event = event
        weakref.finalize(self, cu.cuEventDestroy, event)

    def prepare(self, graph_exec: Any, stream: Any, ctx: Any) -> None:
        """Order the stream after the handles' write, and upload (CUDA asks
        for it after instantiation and after every update from the host)."""
        self.wait(stream, ctx)
        check("cuGraphUpload", in_context(ctx, cu.cuGraphUpload, graph_exec, stream))
        self.due = False

    def wait(self, stream: Any, ctx: Any) -> None:
        """Order the stream after the handles' write."""
        check("cuStreamWaitEvent", in_context(ctx, cu.cuStreamWaitEvent, stream, self._event, 0))

    def launcher(self, graph_exec: Any, stream: Any, ctx: Any,
                 launch: Callable[[], None]) -> Callable[[], None]:
        # Each stream's first launch waits for the handles' write, whatever
        # stream an upload was made on.
        waited = [False]

        def launch_ready() -> None:
            if self.due:
                self.prepare(graph_exec, stream, ctx)
                waited[0] = True
            elif not waited[0]:
                self.wait(stream, ctx)
                waited[0] = True
            launch()

        return launch_ready


def opt_in(recording: Any) -> Ready | None:
    """Opt in the nodes the capture attached, its capture now ended and its
    graph not yet instantiated, and write each node's handle into its slot;
    None where it attached none."""
    pending = _pending.pop(recording, None)
    if pending is None or not pending.nodes:
        return None
    stream = cu.CUstream(recording.handle)
    for node, slot in pending.nodes:
        value = cu.CUkernelNodeAttrValue()
        value.deviceUpdatableKernelNode.deviceUpdatable = 1
        check("cuGraphKernelNodeSetAttribute", cu.cuGraphKernelNodeSetAttribute(node, _ATTR, value))
        got = check("cuGraphKernelNodeGetAttribute", cu.cuGraphKernelNodeGetAttribute(node, _ATTR))
        device_node = int(got.deviceUpdatableKernelNode.devNode)
        if not device_node:
            raise DriverError("cuGraphKernelNodeGetAttribute", cu.CUresult.CUDA_ERROR_NOT_SUPPORTED)
        pointer = int(slot.device_ctypes_pointer.value)
        check("cuMemsetD32Async", cu.cuMemsetD32Async(
            cu.CUdeviceptr(pointer), device_node & 0xFFFFFFFF, 1, stream))
        check("cuMemsetD32Async", cu.cuMemsetD32Async(
            cu.CUdeviceptr(pointer + 4), device_node >> 32, 1, stream))
    event = check("cuEventCreate", cu.cuEventCreate(
        cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    try:
        check("cuEventRecord", cu.cuEventRecord(event, stream))
    except BaseException:
        cu.cuEventDestroy(event)
        raise
    return Ready(len(pending.nodes), [slot for _, slot in pending.nodes], event)


def device_node_count(executable: Any) -> int:
    """How many device-updatable kernel nodes the executable's graph holds."""
    ready = getattr(executable, "device_nodes", None)
    return 0 if ready is None else ready.count
