"""The frameworks numbagraph is measured against, each loaded on first use.

A loader raises :class:`~numbagraph.bench.core.PeerMissing` with the reason
when its peer cannot run here (not installed, no CUDA device, no nvcc), and
the suite reports the reason and runs without it.
"""

from __future__ import annotations

import ctypes
import time
import types
from typing import Any

from numba import cuda

import numbagraph as ng

from .core import Context, PeerMissing
from .kernels import TINY_CUDA_SOURCE, NumbaTiny

__all__ = [
    "numba_tiny", "numba_tiny_nonblocking", "warm_up", "raw_driver", "libcuda",
    "torch_cuda", "cupy_cuda", "cupy_tiny", "require_driver", "checked",
]


def numba_tiny(ctx: Context) -> NumbaTiny:
    """The tiny kernel and its data on ``cuda.stream()``, shared by the suites."""
    return ctx.shared("numba", lambda: NumbaTiny(ctx.config))


def numba_tiny_nonblocking(ctx: Context) -> NumbaTiny:
    """The tiny kernel on a non-blocking stream: ``cuda.stream()`` creates
    streams that synchronise with the legacy default stream
    (CU_STREAM_DEFAULT); PyTorch, CuPy (``non_blocking=True``) and the C++
    floor use streams that do not."""

    def make():
        cu = raw_driver(ctx).cu
        err, handle = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
        if err:
            raise RuntimeError(f"cuStreamCreate: {err}")
        ctx.on_close(lambda: cu.cuStreamDestroy(handle))
        return NumbaTiny(ctx.config, cuda.external_stream(int(handle)))

    return ctx.shared("numba_nonblocking", make)


def warm_up(ctx: Context) -> None:
    """Launch the tiny kernel for ``config.warm_seconds``, so that the first
    suite does not meet idle clocks."""
    seconds = ctx.config.warm_seconds
    if seconds <= 0:
        return
    t = numba_tiny(ctx)
    ctx.progress(f"warming up for {seconds:g} s")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            t.launch(t.n_array)
        t.sync()


def require_driver(peer: str) -> None:
    if ng.backend() != "cuda":
        raise PeerMissing(f"{peer} needs the CUDA driver; numbagraph runs on {ng.backend()}")


def raw_driver(ctx: Context) -> types.SimpleNamespace:
    """cuda.core and cuda.bindings, used directly on numba's stream."""

    def load():
        require_driver("the raw driver")
        try:
            from cuda.bindings import driver as cu
            from cuda.core import Stream
            from cuda.core.graph import GraphCompleteOptions
        except ImportError as exc:
            raise PeerMissing(f"cuda.core/cuda.bindings not importable: {exc}") from exc
        return types.SimpleNamespace(cu=cu, Stream=Stream, Options=GraphCompleteOptions)

    return ctx.shared("raw", load)


def checked(call: str, returned: tuple) -> Any:
    """What a cuda.bindings call returned after its status: None, its one
    value, or a tuple of several; a RuntimeError naming ``call`` where the
    status is an error."""
    err, *values = returned
    if err:
        raise RuntimeError(f"{call}: {err}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def libcuda(ctx: Context) -> Any:
    """libcuda through ctypes, with argument types set for the few calls the
    loop suite makes."""

    def load():
        require_driver("ctypes libcuda")
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise PeerMissing(f"libcuda.so.1 not loadable: {exc}") from exc
        vp, u64, size = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
        lib.cuGraphLaunch.argtypes = [vp, vp]
        lib.cuMemcpyHtoDAsync_v2.argtypes = [u64, vp, size, vp]
        lib.cuMemsetD32Async.argtypes = [u64, ctypes.c_uint, size, vp]
        for fn in (lib.cuGraphLaunch, lib.cuMemcpyHtoDAsync_v2, lib.cuMemsetD32Async):
            fn.restype = ctypes.c_int
        return lib

    return ctx.shared("libcuda", load)


def torch_cuda(ctx: Context) -> Any:
    def load():
        try:
            import torch
        except ImportError as exc:
            raise PeerMissing(f"PyTorch not installed ({exc})") from exc
        require_driver("PyTorch")
        if not torch.cuda.is_available():
            raise PeerMissing(f"PyTorch {torch.__version__} sees no CUDA device")
        return torch

    return ctx.shared("torch", load)


def cupy_cuda(ctx: Context) -> Any:
    def load():
        try:
            import cupy
        except ImportError as exc:
            raise PeerMissing(f"CuPy not installed ({exc})") from exc
        require_driver("CuPy")
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise PeerMissing("CuPy sees no CUDA device")
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise PeerMissing(f"CuPy sees no CUDA device ({exc})") from exc
        return cupy

    return ctx.shared("cupy", load)


def cupy_tiny(ctx: Context) -> Any:
    """The tiny kernel as a CuPy RawKernel, compiled once."""
    cp = cupy_cuda(ctx)
    return ctx.shared("cupy_tiny", lambda: cp.RawKernel(TINY_CUDA_SOURCE, "tiny"))
