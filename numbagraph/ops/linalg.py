"""Matrix-vector and matrix-matrix products into preallocated outputs.

``matvec_into`` gives each row of the matrix to one block, which sums its
products in the fixed order of the reductions, so results are deterministic.
``matmul_into`` is tiled through shared memory: each block computes a square
tile of ``out``, stepping tiles of ``a`` and ``b`` through shared memory
along the inner dimension; every element sums in order of ``k``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numba import cuda, types

from ..errors import OpError
from . import _launch, _reduce_kernels as _rk
from ._operands import ARITHMETIC, check_disjoint, check_dtype, device_array, flat
from .reduce import sum_like

__all__ = ["matvec_into", "matmul_into"]

MATMUL_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64))

_MAX_GRID = 65535


def matvec_into(a: Any, x: Any, out: Any, *, stream: Any) -> None:
    """``out = a @ x`` for ``a`` of shape (M, K), ``x`` of shape (K,) and
    ``out`` of shape (M,), all of one dtype (float16 accumulates in float32,
    int32 in int64). ``out`` must not share memory with ``a`` or ``x``.

    Parameters
    ----------
    a
        A 2-D device array of shape (M, K).
    x
        A 1-D device array of shape (K,).
    out
        A 1-D device array of length M; it shares no memory with ``a`` or
        ``x``.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, memory shared with ``out``, a
        host array), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.matvec_into(w_q, h, q, stream=s)
    ```
    """
    a_dev = device_array(a, "a")
    if a_dev.ndim != 2:
        raise OpError(f"a of matvec_into must be 2-D (M, K), not shape {tuple(a_dev.shape)}")
    sum_like("matvec_into", _rk.FIN_NONE, a, x, out, -1, stream, ARITHMETIC,
             names=("a", "x"), vector_y=True)


def _tile_size() -> int:
    """The largest power of two whose square fits one block."""
    _, threads = _launch.limits()
    tile = 1
    while (2 * tile) ** 2 <= threads:
        tile *= 2
    return tile


def _matmul_kernel(dtype: np.dtype, tile: int) -> Callable:
    acc = _launch.scalar_type(dtype)
    zero = np.dtype(dtype).type(0)
    int64 = types.int64

    def kernel(a, b, out, m, n, k):
        sa = cuda.shared.array((tile, tile), acc)
        sb = cuda.shared.array((tile, tile), acc)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row0 = int64(cuda.blockIdx.y) * tile
        while row0 < m:
            col0 = int64(cuda.blockIdx.x) * tile
            while col0 < n:
                r = row0 + ty
                c = col0 + tx
                total = zero
                k0 = int64(0)
                while k0 < k:
                    ka = k0 + tx
                    kb = k0 + ty
                    sa[ty, tx] = a[r * k + ka] if (r < m and ka < k) else zero
                    sb[ty, tx] = b[kb * n + c] if (kb < k and c < n) else zero
                    cuda.syncthreads()
                    for kk in range(tile):
                        total += sa[ty, kk] * sb[kk, tx]
                    cuda.syncthreads()
                    k0 += tile
                if r < m and c < n:
                    out[r * n + c] = total
                col0 += int64(cuda.gridDim.x) * tile
            row0 += int64(cuda.gridDim.y) * tile

    return kernel


def matmul_into(a: Any, b: Any, out: Any, *, stream: Any) -> None:
    """``out = a @ b`` for ``a`` (M, K), ``b`` (K, N), ``out`` (M, N), all
    float32 or all float64. ``out`` must not share memory with ``a`` or ``b``.

    Parameters
    ----------
    a
        A 2-D device array of shape (M, K).
    b
        A 2-D device array of shape (K, N).
    out
        A 2-D device array of shape (M, N); it shares no memory with ``a`` or
        ``b``.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, memory shared with ``out``, a
        host array), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.matmul_into(p, v_cache, attn, stream=s)    # (1, T) @ (T, D) -> (1, D)
    ```
    """
    launch_on = _launch.launch_handle(stream)
    a_dev, b_dev = device_array(a, "a"), device_array(b, "b")
    out_dev = device_array(out, "out")
    for what, dev in (("a", a_dev), ("b", b_dev), ("out", out_dev)):
        check_dtype(np.dtype(dev.dtype), MATMUL_DTYPES, what, "matmul_into")
        if dev.ndim != 2:
            raise OpError(f"{what} of matmul_into must be 2-D, not shape {tuple(dev.shape)}")
    if not a_dev.dtype == b_dev.dtype == out_dev.dtype:
        raise OpError(
            f"matmul_into needs one dtype; got a {a_dev.dtype}, b {b_dev.dtype}, "
            f"out {out_dev.dtype}")
    (m, k), (k2, n) = a_dev.shape, b_dev.shape
    if k2 != k or tuple(out_dev.shape) != (m, n):
        raise OpError(
            f"matmul_into shapes do not fit: a {tuple(a_dev.shape)} @ b "
            f"{tuple(b_dev.shape)} -> out {tuple(out_dev.shape)}; need (M, K) @ (K, N) "
            "-> (M, N)")
    check_disjoint(out_dev, [("a", a_dev), ("b", b_dev)], "matmul_into")
    if m == 0 or n == 0:
        return
    dtype = np.dtype(a_dev.dtype)
    tile = _tile_size()
    sms, _ = _launch.limits()
    arr = _launch.array_type(dtype)
    kernel = _launch.compiled(
        ("matmul", dtype.str, tile),
        lambda: (_matmul_kernel(dtype, tile), (arr, arr, arr, _launch.INDEX,
                                               _launch.INDEX, _launch.INDEX)),
    )
    grid_x = min(-(-n // tile), _MAX_GRID)
    grid_y = min(-(-m // tile), _MAX_GRID, max(1, sms * 64 // grid_x))
    kernel[(grid_x, grid_y), (tile, tile), launch_on](
        flat(a_dev), flat(b_dev), flat(out_dev), m, n, k)
