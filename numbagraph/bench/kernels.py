"""The kernels the suites run: the tiny kernel ``a[i] += n[0]`` in Numba and
in CUDA C++ (for CuPy's RawKernel), and the fill kernels of the bandwidth
suite."""

from __future__ import annotations

import numpy as np
from numba import cuda

import numbagraph as ng

from .core import Config

__all__ = ["TINY_CUDA_SOURCE", "NumbaTiny", "tiny", "fill_pattern", "fill_value"]

TINY_CUDA_SOURCE = r"""
extern "C" __global__ void tiny(float* a, const float* n, int size) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < size) a[i] += n[0];
}
"""


@cuda.jit
def tiny(a, n):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += n[0]


@cuda.jit
def fill_pattern(x, period, scale):
    """x[i] = (i % period) * scale: exact in float32, never all zeros."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, x.size, step):
        x[i] = (i % period) * scale


@cuda.jit
def fill_value(x, value):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, x.size, step):
        x[i] = value


class NumbaTiny:
    """The tiny kernel's data on a numba stream (``cuda.stream()`` unless
    given): ``a`` (float32), ``n`` as a DeviceScalar and ``n_array`` as a
    plain 1-element device array.

    ``launch(n)`` launches ``tiny[grid, block, stream](a, n)``.
    """

    def __init__(self, config: Config, stream=None):
        self.stream = cuda.stream() if stream is None else stream
        self.a = cuda.to_device(np.zeros(config.elements, np.float32), stream=self.stream)
        self.n = ng.DeviceScalar(1.0, dtype=np.float32, stream=self.stream)
        self.n_array = cuda.to_device(np.ones(1, np.float32), stream=self.stream)
        self.blocks, self.threads = config.grid
        self.configured = tiny[self.blocks, self.threads, self.stream]
        self.configured(self.a, self.n)        # compile outside every capture
        self.configured(self.a, self.n_array)
        self.stream.synchronize()

    def launch(self, n) -> None:
        tiny[self.blocks, self.threads, self.stream](self.a, n)

    def launch_numba(self, n) -> None:
        """The same launch through numba's own configuration and argument
        packing, not numbagraph's fast path (numba's launch hook still runs)."""
        configure = getattr(tiny, "configure", None)  # the simulator has one path
        configured = (configure((self.blocks,), (self.threads,), self.stream) if configure
                      else tiny[self.blocks, self.threads, self.stream])
        configured(self.a, n)

    def sync(self) -> None:
        self.stream.synchronize()
