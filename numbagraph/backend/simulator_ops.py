"""What numbagraph.ops needs from the simulator besides recorded work
(zero fills and copies live beside the launches in ``simulator``): device
views of foreign arrays and the size of the simulated device."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

# Every simulated thread is a Python thread: small blocks keep launches quick.
THREADS_PER_BLOCK = 32

# Only Python kernels run here: a library's CUDA kernels (cuBLAS) cannot.
LIBRARY_KERNELS = False


class _HostView:
    """Exposes a foreign array's interface to NumPy and keeps its owner alive
    for as long as the NumPy view lives."""

    def __init__(self, interface: dict, owner: Any):
        self.owner = owner
        self.__array_interface__ = {
            "shape": tuple(interface["shape"]),
            "typestr": interface["typestr"],
            "data": tuple(interface["data"]),
            "strides": interface.get("strides"),
            "version": 3,
        }


def as_device_array(obj: Any) -> Any:
    """``obj`` as a simulated device array, or None if it is not one.

    Under the simulator, ``__cuda_array_interface__`` pointers are host
    pointers, so objects exposing it become views of that memory."""
    if getattr(obj, "__cuda_ndarray__", False):
        return obj
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is None:
        return None
    return FakeCUDAArray(np.asarray(_HostView(interface, obj)))


def device_memory_used() -> None:
    """Simulated arrays are host memory: there is no device memory to count."""
    return None


def current_device_id() -> int:
    """The simulator has one device."""
    return 0


def launch_limits() -> tuple[int, int]:
    """(multiprocessors, threads per block): one small simulated device."""
    return 1, THREADS_PER_BLOCK

