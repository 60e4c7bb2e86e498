"""The frameworks numbagraph is measured against, each loaded on first use.

A loader raises :class:`~numbagraph.bench.core.PeerMissing` with the reason
when its peer cannot run here (not installed, no CUDA device, no nvcc), and
the suite reports the reason and runs without it.
"""

from __future__ import annotations

import ctypes
import types
from typing import Any

import numbagraph as ng

from .core import Context, PeerMissing
from .kernels import TINY_CUDA_SOURCE, NumbaTiny

__all__ = ["numba_tiny", "raw_driver", "libcuda", "torch_cuda", "cupy_cuda", "cupy_tiny", "require_driver"]


def numba_tiny(ctx: Context) -> NumbaTiny:
    """The tiny kernel and its data on a numba stream, shared by the suites."""
    return ctx.shared("numba", lambda: NumbaTiny(ctx.config))


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
