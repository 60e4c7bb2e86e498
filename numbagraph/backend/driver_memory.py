"""Graph-owned memory on the driver: stream-ordered allocations recorded as
the graph's memory nodes.

Inside a capture, ``cuMemAllocAsync`` on the capturing stream records an
allocation node and returns the address the graph's memory will have at
every launch; ``cuMemFreeAsync`` records a free node. Graphs are
instantiated with auto-free-on-launch (``driver.Executable``), so what a
graph does not free itself stays allocated until its next launch, which
frees and makes it again, or until its graph is closed and this module frees
it in the order of the stream it last ran on.

An array over such memory is a numba device array whose memory pointer is a
:class:`GraphPointer`: numba frees nothing through it, and it names the
allocation (and, for a graphed function's result, the call) it belongs to.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from cuda.bindings import driver as cu
from numba import cuda
from numba.cuda.cudadrv import devicearray as _devicearray
from numba.cuda.cudadrv import driver as _numba_driver

from .driver import _numba_context
from .driver_base import check
from .driver_ops import device_count as _device_count

_ATTRS = cu.CUgraphMem_attribute


class GraphPointer(_numba_driver.MemoryPointer):
    """Memory a graph owns. It has no finalizer: the graph frees it."""

    def __init__(self, context: Any, pointer: int, size: int, allocation: Any,
                 output: Any = None):
        super().__init__(context, cu.CUdeviceptr(pointer), size)
        self.allocation = allocation
        self.output = output


def graph_allocate(handle: int, shape: tuple[int, ...], dtype: np.dtype, stream: Any,
                   allocation: Any, order: str) -> Any:
    nbytes = allocation.nbytes
    pointer = int(check("cuMemAllocAsync", cu.cuMemAllocAsync(nbytes, handle)))
    allocation.pointer = pointer
    strides = _c_strides(shape, dtype.itemsize)
    if order == "F":
        strides = tuple(reversed(_c_strides(tuple(reversed(shape)), dtype.itemsize)))
    return _devicearray.DeviceNDArray(
        shape, strides, dtype, stream=stream,
        gpu_data=GraphPointer(_numba_context(), pointer, nbytes, allocation))


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def graph_free(handle: int, dev: Any, allocation: Any) -> None:
    check("cuMemFreeAsync", cu.cuMemFreeAsync(allocation.pointer, handle))


def graph_memory_of(value: Any) -> tuple[Any, Any] | None:
    for _ in range(4):
        data = getattr(value, "gpu_data", None)
        if data is None:
            return None
        # A view's memory is an OwnedPointer whose owner is the pointer
        # viewed; an array made from another's __cuda_array_interface__
        # (cuda.as_cuda_array) is owned by that array.
        owner = data if type(data) is GraphPointer else getattr(data, "owner", None)
        if type(owner) is GraphPointer:
            return owner.allocation, owner.output
        if owner is None or owner is data or owner is value:
            return None
        value = owner
    return None


def graph_output(dev: Any, allocation: Any, output: Any) -> Any:
    pointer = dev.device_ctypes_pointer.value or 0
    return _devicearray.DeviceNDArray(
        dev.shape, dev.strides, dev.dtype, stream=dev.stream,
        gpu_data=GraphPointer(_numba_context(), pointer, dev.alloc_size, allocation, output))


def release_graph_memory(allocations: Sequence[Any], handle: int | None,
                         device: int) -> None:
    pushed = _push_device(device)
    try:
        for allocation in allocations:
            if handle is not None:
                err, = cu.cuMemFreeAsync(allocation.pointer, handle)
                if err == cu.CUresult.CUDA_SUCCESS:
                    continue
            # The stream refused the free (destroyed outside numba): free once
            # the device is idle; a failure here leaves nothing to undo.
            cu.cuMemFree(allocation.pointer)
    finally:
        if pushed:
            cu.cuCtxPopCurrent()


def _push_device(device: int) -> bool:
    """Make the primary context of ``device`` current, where there are
    several devices and another is current; True when it was pushed (the
    caller pops it). The driver's own push, not numba's ``cuda.gpus[i]``:
    a graph dropped inside one of numba's calls is freed there by the
    garbage collector, and numba refuses to switch contexts inside its
    calls, which would leave the memory allocated for good."""
    if _device_count() == 1:
        return False
    err, current = cu.cuCtxGetDevice()
    if not err and int(current) == device:
        return False
    context = cuda.gpus[device].get_primary_context()
    check("cuCtxPushCurrent", cu.cuCtxPushCurrent(cu.CUcontext(int(context.handle))))
    return True


def _device() -> Any:
    """The current device, its context made current first."""
    _numba_context()
    return check("cuCtxGetDevice", cu.cuCtxGetDevice())


def graph_memory_info() -> tuple[int, int, int, int]:
    device = _device()
    return tuple(  # type: ignore[return-value]
        int(check("cuDeviceGetGraphMemAttribute",
                  cu.cuDeviceGetGraphMemAttribute(device, getattr(_ATTRS, name))))
        for name in ("CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT", "CU_GRAPH_MEM_ATTR_USED_MEM_HIGH",
                     "CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT",
                     "CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH"))


def trim_graph_memory() -> None:
    check("cuDeviceGraphMemTrim", cu.cuDeviceGraphMemTrim(_device()))
