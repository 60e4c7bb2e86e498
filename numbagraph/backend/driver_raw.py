"""The driver's own entry points, called through ctypes with integer
arguments, for the calls a replay loop makes at every step.

cuda.bindings converts and checks each argument of each call, which costs
more than the driver's own work for the calls made most: a kernel launch, a
graph launch, a scalar's fill, setting a node on an executable and reading
the current context. Here each is the function
pointer ``cuGetProcAddress`` gives for the ABI of cuda.bindings' structs
(CUDA 12.0: ``CUDA_KERNEL_NODE_PARAMS`` is its ``_v2``), so a struct made by
cuda.bindings is passed by its address (``getPtr()``). Where the driver
gives no such entry point, ``entry`` is None and callers use cuda.bindings.
The library itself (``libcuda``) is loaded at first use: importing the
backend needs no driver.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from cuda.bindings import driver as cu

__all__ = ["libcuda", "entry", "current_context"]

# The ABI of cuda.bindings' node parameter structs.
_ABI = 12000

_loaded: list[Any] = []
_entries: dict[str, Any] = {}
_UNKNOWN = object()

_P = ctypes.c_void_p
_U = ctypes.c_uint
_SIZE = ctypes.c_size_t
_PROTOTYPES = {
    # (function, grid x, y, z, block x, y, z, shared bytes, stream, kernelParams, extra)
    "cuLaunchKernel": (_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P),
    # (graph_exec, stream)
    "cuGraphLaunch": (_P, _P),
    # (destination, value, count, stream)
    "cuMemsetD8Async": (_P, ctypes.c_ubyte, _SIZE, _P),
    "cuMemsetD16Async": (_P, ctypes.c_ushort, _SIZE, _P),
    "cuMemsetD32Async": (_P, _U, _SIZE, _P),
    # (graph_exec, node, params)
    "cuGraphExecKernelNodeSetParams": (_P, _P, _P),
    # (graph_exec, node, params, ctx)
    "cuGraphExecMemcpyNodeSetParams": (_P, _P, _P, _P),
    "cuGraphExecMemsetNodeSetParams": (_P, _P, _P, _P),
    # (CUcontext *)
    "cuCtxGetCurrent": (_P,),
}


def libcuda() -> Any:
    """The driver library, loaded once."""
    if not _loaded:
        names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
        for name in names:
            try:
                _loaded.append(ctypes.CDLL(name))
                break
            except OSError:
                continue
        else:
            raise OSError(f"the CUDA driver library ({', '.join(names)}) cannot be loaded")
    return _loaded[0]


def entry(name: str) -> Any:
    """The driver's ``name`` (one of ``_PROTOTYPES``) as a ctypes function
    returning the ``CUresult`` as an int, or None where the driver has no
    entry point of that ABI. Asked of the driver once."""
    try:
        return _entries[name]
    except KeyError:
        pass
    fn = None
    try:
        err, pfn, _ = cu.cuGetProcAddress(name.encode(), _ABI, _flags(name))
    except Exception:  # noqa: BLE001  no driver library to ask: cuda.bindings says so itself
        err, pfn = None, 0
    if err == cu.CUresult.CUDA_SUCCESS and int(pfn):
        # CFUNCTYPE lets go of the GIL for the call, as cuda.bindings does: a
        # launch may block while a host callback waits for the GIL.
        fn = ctypes.CFUNCTYPE(ctypes.c_int, *_PROTOTYPES[name])(int(pfn))
    elif err == cu.CUresult.CUDA_ERROR_NOT_INITIALIZED:
        return None  # asked again once the driver is initialised
    _entries[name] = fn
    return fn


def _flags(name: str) -> Any:
    """The search flags of ``name``: a call taking a stream gets the entry
    point cuda.bindings calls, which gives the default stream (handle 0)
    per-thread semantics where ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM``
    is set."""
    flags = cu.CUdriverProcAddress_flags
    if name in _STREAM_ORDERED and os.getenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"):
        return flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    return flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM


_STREAM_ORDERED = frozenset({"cuLaunchKernel", "cuGraphLaunch", "cuMemsetD8Async",
                             "cuMemsetD16Async", "cuMemsetD32Async"})


def current_context() -> int:
    """The address of the current context; 0 where none is current or the
    driver fails."""
    get = _entries.get("cuCtxGetCurrent", _UNKNOWN)
    if get is _UNKNOWN:
        get = entry("cuCtxGetCurrent")
    if get is None:
        err, ctx = cu.cuCtxGetCurrent()
        return 0 if err else int(ctx)
    out = ctypes.c_void_p()
    if get(ctypes.byref(out)):
        return 0
    return out.value or 0
