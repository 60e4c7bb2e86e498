"""Kernel cache, launch grids and launches shared by every op.

Each op kernel is built by a factory for one combination of dtypes and
compiled once, with an explicit signature, the first time that combination is
used; later calls, inside a capture or not, find it in the cache. Grids are
sized from the device: a few blocks per multiprocessor, with grid-stride
loops covering the rest, or, for streaming elementwise kernels, one block per
tile of the array. Launches go through the backend, which knows each
kernel's argument layout from its one signature instead of working it out
again on every call as numba's launch does.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import numpy as np
from numba import cuda, types
from numba.np.numpy_support import from_dtype

from ..backend import active as _backend
from ..errors import OpError
from ..safety import on_launch

__all__ = [
    "BLOCKS_PER_SM",
    "limits",
    "blocks_for",
    "tiles_for",
    "launch_handle",
    "OpKernel",
    "compiled",
    "array_type",
    "scalar_type",
    "compute_type",
    "INDEX",
]

# Enough resident blocks per multiprocessor to hide memory latency with
# 256-thread blocks, few enough that grid-stride loops amortise the setup.
BLOCKS_PER_SM = 8

INDEX = types.int64


def limits() -> tuple[int, int]:
    """(multiprocessors, threads per block) of the current device."""
    return _backend.launch_limits()


def blocks_for(n: int) -> int:
    """Blocks for ``n`` independent items: one per ``threads`` items, at most
    BLOCKS_PER_SM per multiprocessor."""
    sms, threads = _backend.launch_limits()
    return max(1, min(-(-n // threads), sms * BLOCKS_PER_SM))


_MAX_GRID_X = 2**31 - 1


def tiles_for(n: int, tile: int) -> int:
    """Blocks for ``n`` items cut into tiles of ``tile``: one block per tile
    (beyond CUDA's grid limit, blocks loop over tiles)."""
    return max(1, min(-(-n // tile), _MAX_GRID_X))


def launch_handle(stream: Any) -> int:
    """The raw handle of the numba, cuda.core or foreign stream to launch on.

    Launching by handle treats every kind of stream alike, and capture
    recognises the launch by that handle.
    """
    if stream is None:
        raise OpError(
            "stream= is required: pass the stream to launch on (cuda.stream(), "
            "or any object with __cuda_stream__)"
        )
    try:
        return _backend.stream_handle(stream)
    except TypeError as exc:
        raise OpError(str(exc)) from exc


class OpKernel:
    """A compiled op kernel, launched as ``kernel[grid, block, handle](*args)``
    through the backend, which skips numba's per-call argument analysis."""

    __slots__ = ("dispatcher",)

    def __init__(self, dispatcher: Any):
        self.dispatcher = dispatcher

    def __getitem__(self, config: tuple) -> Callable[..., None]:
        grid, block, handle = config
        dispatcher = self.dispatcher
        return lambda *args: _backend.launch(dispatcher, grid, block, handle, args, on_launch)


_kernels: dict[tuple, OpKernel] = {}
_kernels_lock = threading.Lock()


def compiled(key: tuple, build: Callable[[], tuple[Callable, tuple]]) -> OpKernel:
    """The kernel for ``key``; ``build()`` returns ``(pyfunc, signature)``
    and runs, with the compile, only the first time ``key`` is asked for."""
    kernel = _kernels.get(key)
    if kernel is None:
        with _kernels_lock:
            kernel = _kernels.get(key)
            if kernel is None:
                pyfunc, signature = build()
                kernel = _kernels[key] = OpKernel(cuda.jit(types.void(*signature))(pyfunc))
    return kernel


@functools.lru_cache(maxsize=None)
def array_type(dtype: np.dtype) -> types.Array:
    """The numba type of a C-contiguous 1-D array of ``dtype``."""
    return from_dtype(np.dtype(dtype))[::1]


@functools.lru_cache(maxsize=None)
def scalar_type(dtype: np.dtype) -> types.Type:
    return from_dtype(np.dtype(dtype))


@functools.lru_cache(maxsize=None)
def compute_type(dtype: np.dtype) -> types.Type:
    """The type arithmetic on ``dtype`` is carried out in: float16 values are
    computed in float32 and rounded once when stored."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return types.float32
    return from_dtype(dtype)
