"""Row-wise neural-network ops: softmax, layer norm and RMS norm.

Each row of a 2-D ``x`` (a 1-D ``x`` is one row) is handled by one block:
its statistics are reduced in the fixed order of the reductions, so results
are deterministic. float16 rows are computed in float32. ``out`` has ``x``'s
shape and dtype and may be ``x`` itself.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from numba import cuda, types

from ..errors import OpError
from . import _launch
from ._operands import FLOATS, check_disjoint, check_dtype, check_in_place, device_array, flat, row_view
from ._reduce_kernels import add, block_tree

__all__ = ["softmax_into", "layernorm_into", "rmsnorm_into"]

SOFTMAX, LAYERNORM, RMSNORM = 0, 1, 2


@cuda.jit(device=True)
def nan_max(a, b):
    """The larger of ``a`` and ``b``, NaN above any number."""
    if b > a or b != b:
        return b
    return a


def _rows_kernel(dtype: np.dtype, threads: int) -> Callable:
    acc_np = np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)
    acc = _launch.scalar_type(acc_np)
    zero, one = acc_np.type(0), acc_np.type(1)
    lowest = acc_np.type(-np.inf)
    int64 = types.int64

    tree_sum = block_tree(threads, add)
    tree_max = block_tree(threads, nan_max)

    def kernel(x, w, has_w, b, has_b, out, rows, cols, eps, kind):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        r = int64(cuda.blockIdx.x)
        while r < rows:
            base = r * cols
            if kind == SOFTMAX:
                top = lowest
                j = int64(tid)
                while j < cols:
                    top = nan_max(top, acc(x[base + j]))
                    j += threads
                top = tree_max(sh, top, tid)
                total = zero
                j = int64(tid)
                while j < cols:
                    total += math.exp(acc(x[base + j]) - top)
                    j += threads
                total = tree_sum(sh, total, tid)
                j = int64(tid)
                while j < cols:
                    out[base + j] = math.exp(acc(x[base + j]) - top) / total
                    j += threads
            else:
                if kind == LAYERNORM:
                    total = zero
                    j = int64(tid)
                    while j < cols:
                        total += acc(x[base + j])
                        j += threads
                    mean = tree_sum(sh, total, tid) / acc(cols)
                else:
                    mean = zero
                squares = zero
                j = int64(tid)
                while j < cols:
                    d = acc(x[base + j]) - mean
                    squares += d * d
                    j += threads
                inv = one / math.sqrt(tree_sum(sh, squares, tid) / acc(cols) + eps)
                j = int64(tid)
                while j < cols:
                    v = (acc(x[base + j]) - mean) * inv
                    if has_w:
                        v = v * acc(w[j])
                    if has_b:
                        v = v + acc(b[j])
                    out[base + j] = v
                    j += threads
            r += cuda.gridDim.x

    return kernel


def _rows_op(kind: int, op: str, x: Any, weight: Any, bias: Any, out: Any, eps: float,
             stream: Any) -> None:
    launch_on = _launch.launch_handle(stream)
    x_dev = device_array(x, "x")
    dtype = np.dtype(x_dev.dtype)
    check_dtype(dtype, FLOATS, "x", op)
    if x_dev.ndim not in (1, 2):
        raise OpError(f"x of {op} must be 1-D (one row) or 2-D, not shape {tuple(x_dev.shape)}")
    out_dev = device_array(out, "out")
    if tuple(out_dev.shape) != tuple(x_dev.shape) or out_dev.dtype != dtype:
        raise OpError(
            f"out of {op} must have x's shape {tuple(x_dev.shape)} and dtype {dtype}; "
            f"got {tuple(out_dev.shape)} {out_dev.dtype}")
    rows, cols = row_view(tuple(x_dev.shape))
    params = []
    for what, p in (("weight", weight), ("bias", bias)):
        if p is None:
            params.append((flat(out_dev), False))
            continue
        p_dev = device_array(p, what)
        if tuple(p_dev.shape) != (cols,) or p_dev.dtype != dtype:
            raise OpError(
                f"{what} of {op} must have shape ({cols},) and dtype {dtype}; got "
                f"{tuple(p_dev.shape)} {p_dev.dtype}")
        params.append((p_dev, True))
    check_in_place(out_dev, [("x", x_dev, x_dev.shape)], op)
    check_disjoint(out_dev, [(what, p if has else None)
                             for what, (p, has) in zip(("weight", "bias"), params)], op)
    if not isinstance(eps, (int, float, np.floating, np.integer)) or not eps >= 0:
        raise OpError(f"eps of {op} must be a non-negative number, not {eps!r}")
    if rows == 0:
        return
    sms, threads = _launch.limits()
    acc_np = np.dtype(np.float32) if dtype == np.float16 else dtype
    arr = _launch.array_type(dtype)
    kernel = _launch.compiled(
        ("rows_nn", dtype.str, threads),
        lambda: (_rows_kernel(dtype, threads),
                 (arr, arr, types.boolean, arr, types.boolean, arr, _launch.INDEX,
                  _launch.INDEX, _launch.scalar_type(acc_np), _launch.INDEX)),
    )
    (w_dev, has_w), (b_dev, has_b) = params
    kernel[min(rows, sms * _launch.BLOCKS_PER_SM), threads, launch_on](
        flat(x_dev), w_dev, has_w, b_dev, has_b, flat(out_dev), rows, cols, acc_np.type(eps),
        kind)


def softmax_into(x: Any, out: Any, *, stream: Any) -> None:
    """``out = exp(x - max) / sum(exp(x - max))`` along each row.

    Parameters
    ----------
    x
        A 2-D device array of rows, or a 1-D one (one row); float dtypes.
    out
        A device array of ``x``'s shape and dtype; may be ``x`` itself.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, a host array, a negative
        ``eps``), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.softmax_into(scores, probs, stream=s)
    ```
    """
    _rows_op(SOFTMAX, "softmax_into", x, None, None, out, 0.0, stream)


def layernorm_into(x: Any, weight: Any, bias: Any, out: Any, *, eps: float = 1e-5,
                   stream: Any) -> None:
    """``out = (x - mean) / sqrt(var + eps) * weight + bias`` along each row
    (population variance); ``weight`` and ``bias`` of shape (C,), or None.

    Parameters
    ----------
    x
        A 2-D device array of rows, or a 1-D one (one row); float dtypes.
    weight
        A device array of shape (C,) and ``x``'s dtype, or None.
    bias
        A device array of shape (C,) and ``x``'s dtype, or None.
    out
        A device array of ``x``'s shape and dtype; may be ``x`` itself.
    eps
        A non-negative number added to the variance.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, a host array, a negative
        ``eps``), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.layernorm_into(h, gamma, beta, h_norm, stream=s)
    ```
    """
    _rows_op(LAYERNORM, "layernorm_into", x, weight, bias, out, eps, stream)


def rmsnorm_into(x: Any, weight: Any, out: Any, *, eps: float = 1e-6, stream: Any) -> None:
    """``out = x / sqrt(mean(x * x) + eps) * weight`` along each row;
    ``weight`` of shape (C,), or None.

    Parameters
    ----------
    x
        A 2-D device array of rows, or a 1-D one (one row); float dtypes.
    weight
        A device array of shape (C,) and ``x``'s dtype, or None.
    out
        A device array of ``x``'s shape and dtype; may be ``x`` itself.
    eps
        A non-negative number added to the variance.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, a host array, a negative
        ``eps``), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.rmsnorm_into(h, g, h_norm, stream=s)
    ```
    """
    _rows_op(RMSNORM, "rmsnorm_into", x, weight, None, out, eps, stream)
