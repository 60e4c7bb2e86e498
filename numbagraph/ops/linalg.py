"""Matrix-vector and matrix-matrix products into preallocated outputs.

``matvec_into`` gives each row of the matrix to one warp: lane ``l`` reads
elements ``l, l + 32, ...`` of the row (so a warp's loads are coalesced)
into four accumulators, four independent loads at a time, and the lanes'
sums combine through shared memory; the order of the sums depends on ``K`` alone,
so results are deterministic. Where the matrix has rows enough, each warp
reads two or four rows at once, to keep more loads in flight. float32
matrices with rows a multiple of 4 long are read in 16-byte quads instead,
each row split between two warps (``_matvec_quads_source``).
``matmul_into`` calls cuBLAS on the driver where nvmath-python is installed
(numbagraph.ops._blas says when), and otherwise runs a kernel tiled through
shared memory: each block computes a square tile of ``out``, stepping tiles
of ``a`` and ``b`` through shared memory along the inner dimension; every
element sums in order of ``k``. Both read any strides; a batch of matrices
(3-D operands) is one call.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from numba import cuda, types
from numba.cuda.np.numpy_support import from_dtype

from .._rebind import span
from ..backend import active as _backend
from ..errors import OpError
from . import _blas, _launch, _reduce_kernels as _rk
from ._operands import keep_disjoint
from ._operands import (ARITHMETIC, BFLOAT16, BFLOAT16_INSTALL, check_disjoint, check_dtype,
                        device_array, flat)

__all__ = ["matvec_into", "matmul_into"]

MATMUL_DTYPES = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64)) + (
    (BFLOAT16,) if BFLOAT16 is not None else ())

MATVEC_DTYPES = ARITHMETIC + ((BFLOAT16,) if BFLOAT16 is not None else ())

_MAX_GRID = 65535


def matvec_into(a: Any, x: Any, out: Any, *, stream: Any) -> None:
    """``out = a @ x`` for ``a`` of shape (M, K), ``x`` of shape (K,) and
    ``out`` of shape (M,), all of one dtype (float16 and bfloat16 accumulate
    in float32, int32 in int64; bfloat16 arrays need ml_dtypes, ``pip install
    -e ".[bfloat16]"``). ``out`` must not share memory with ``a`` or ``x``.

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
    launch_on = _launch.launch_handle(stream)
    a_dev = device_array(a, "a")
    if a_dev.ndim != 2:
        raise OpError(f"a of matvec_into must be 2-D (M, K), not shape {tuple(a_dev.shape)}")
    dtype = np.dtype(a_dev.dtype)
    check_dtype(dtype, MATVEC_DTYPES, "inputs", "matvec_into")
    rows, cols = a_dev.shape
    x_dev = device_array(x, "x")
    if np.dtype(x_dev.dtype) != dtype:
        raise OpError(f"x of matvec_into has dtype {x_dev.dtype}, expected {dtype} like a")
    if tuple(x_dev.shape) != (cols,):
        raise OpError(f"x of matvec_into has shape {tuple(x_dev.shape)}, expected ({cols},) "
                      f"for a of shape {tuple(a_dev.shape)}")
    out_dev = device_array(out, "out")
    if out_dev.ndim != 1 or out_dev.size != rows:
        raise OpError(f"out of matvec_into must be 1-D with one element per row of a "
                      f"({rows}), not shape {tuple(out_dev.shape)}")
    check_dtype(np.dtype(out_dev.dtype), (dtype,), "out", "matvec_into")
    check_disjoint(out_dev, [("a", a_dev), ("x", x_dev)], "matvec_into")
    if rows == 0:
        return
    sms, threads = _launch.limits()
    warps = max(1, min(_MATVEC_THREADS, threads) // _WARP)
    arr = _launch.array_type(dtype)
    if dtype == np.float32 and cols % 4 == 0:
        split = math.gcd(MATVEC_QUAD_SPLIT, warps)
        vector = _launch.vector_quads((flat(a_dev), x_dev), launch_on, "matvec_into")
        kernel = _launch.compiled(
            ("matvec_quads", warps, vector, split, MATVEC_QUAD_UNROLL),
            lambda: (_matvec_quads_kernel(warps, split, vector),
                     (arr, arr, arr, _launch.INDEX, _launch.INDEX)))
        groups = warps // split
        blocks = min(-(-rows // groups), _MAX_GRID)
        kernel[blocks, warps * _WARP, launch_on](flat(a_dev), x_dev, out_dev, rows, cols)
        return
    together = matvec_rows_per_warp(rows, warps, sms)
    kernel = _launch.compiled(
        ("matvec", dtype.name, warps, together),
        lambda: (_matvec_kernel(dtype, warps, together),
                 (arr, arr, arr, _launch.INDEX, _launch.INDEX)),
    )
    blocks = min(-(-rows // (warps * together)), _MAX_GRID)
    kernel[blocks, warps * _WARP, launch_on](flat(a_dev), x_dev, out_dev, rows, cols)


# matvec_into: 8 warps per block where the device allows.
_MATVEC_THREADS = 256
_WARP = 32


# Rows each warp reads at once, chosen so that the grid still has at least
# MATVEC_BLOCKS_PER_SM blocks per multiprocessor: more rows in flight per
# warp keep more loads in flight, fewer blocks leave multiprocessors idle.
MATVEC_ROWS_PER_WARP = (4, 2, 1)
MATVEC_BLOCKS_PER_SM = 2
# Loads of each row every lane has in flight per step.
_MATVEC_UNROLL = 4


def matvec_rows_per_warp(rows: int, warps: int, sms: int) -> int:
    """How many rows each warp of a ``warps``-warp block reads at once."""
    for r in MATVEC_ROWS_PER_WARP:
        if -(-rows // (warps * r)) >= MATVEC_BLOCKS_PER_SM * sms:
            return r
    return 1


def _matvec_source(together: int, unroll: int) -> str:
    """Source of ``matvec(a, x, out, rows, cols)``: warp ``w`` of block ``b``
    computes rows ``(b * warps + w) * together + r`` for ``r`` below
    ``together``, all at once, then the rows ``gridDim.x * warps *
    together`` further on. Lane ``lane`` takes a row's elements ``lane + 32
    j``, element ``j`` into accumulator ``j % unroll``; each step issues
    ``unroll`` loads of ``x`` and of every row before their sums. A row's
    accumulators meet as ``(s0 + s1) + (s2 + s3)`` and its lanes in a fixed
    tree through shared memory, so its result does not depend on
    ``together``. A row's sum is stored through ``OUT``, the backend's
    conversion to ``out``'s dtype (an int32 product, summed in int64, wraps
    to int32)."""
    rows_, us = range(together), range(unroll)
    lines = [
        "def matvec(a, x, out, rows, cols):",
        "    sh = cuda.shared.array(THREADS, ACC)",
        "    tid = cuda.threadIdx.x",
        "    lane = tid % 32",
        f"    mine = (tid // 32) * {together}",
        f"    start = int64(cuda.blockIdx.x) * WARPS * {together}",
        "    while start < rows:",
    ]
    for r in rows_:
        lines += [f"        row{r} = start + mine + {r}",
                  f"        base{r} = row{r} * cols if row{r} < rows else int64(0)"]
        lines += [f"        s{r}_{u} = ZERO" for u in us]
    lines += ["        c = int64(lane)",
              f"        while c + {(unroll - 1) * 32} < cols:"]
    lines += [f"            x{u} = ACC(x[c + {u * 32}])" for u in us]
    lines += [f"            a{r}_{u} = ACC(a[base{r} + c + {u * 32}])" for r in rows_ for u in us]
    lines += [f"            s{r}_{u} += a{r}_{u} * x{u}" for r in rows_ for u in us]
    lines += [f"            c += {unroll * 32}",
              "        while c < cols:",
              "            xv = ACC(x[c])"]
    lines += [f"            s{r}_0 += ACC(a[base{r} + c]) * xv" for r in rows_]
    lines += ["            c += 32"]
    for r in rows_:
        lines += _lanes_summed(_pairwise([f"s{r}_{u}" for u in us]))
        lines += [f"        if lane == 0 and row{r} < rows:",
                  f"            out[row{r}] = OUT(sh[tid])",
                  "        cuda.syncthreads()"]
    lines += [f"        start += int64(cuda.gridDim.x) * WARPS * {together}"]
    return "\n".join(lines) + "\n"


# Float32 matrices with rows a multiple of 4 long: each row belongs to
# MATVEC_QUAD_SPLIT warps of a block (fewer where the block has fewer), whose lanes read it in quads (16 bytes
# a load), MATVEC_QUAD_UNROLL quads of the row and of x in flight per lane.
# Splitting a row keeps every warp busy where rows are few (4096 of them
# fill an H200 once), and the 16-byte loads keep the bytes in flight that
# four single loads would (docs/benchmarks).
MATVEC_QUAD_SPLIT = 2
MATVEC_QUAD_UNROLL = 2


def _matvec_quads_source(split: int, unroll: int) -> str:
    """Source of ``matvec(a, x, out, rows, cols)`` for float32 rows of a
    multiple of 4: the ``split`` warps of row group ``g`` (warp ``w`` is part
    ``w % split`` of group ``w // split``) take the quads of a row in
    interleaved stripes of ``32 * split`` quads; lane ``lane`` of part
    ``p`` reads the quads at ``4 * (p * 32 + lane) + stripe * j``, quad
    ``j`` into accumulator ``j % unroll``, adding its four products in
    order. A lane's accumulators meet pairwise, a warp's lanes in a fixed
    tree through shared memory, and a row's parts in order of ``p``: the
    order of every sum depends on ``cols`` alone."""
    us = range(unroll)
    stripe = 4 * 32 * split
    lines = [
        "def matvec(a, x, out, rows, cols):",
        "    sh = cuda.shared.array(THREADS, ACC)",
        "    tid = cuda.threadIdx.x",
        "    lane = tid % 32",
        "    warp = tid // 32",
        f"    group = warp // {split}",
        f"    first = int64(4 * ((warp % {split}) * 32 + lane))",
        "    start = int64(cuda.blockIdx.x) * GROUPS",
        "    while start < rows:",
        "        row = start + group",
        "        base = row * cols if row < rows else int64(0)",
    ]
    lines += [f"        s{u} = ZERO" for u in us]
    lines += ["        c = first",
              f"        while c + {(unroll - 1) * stripe + 3} < cols:"]
    for u in us:
        lines += [f"            x{u}_0, x{u}_1, x{u}_2, x{u}_3 = LOAD4(x, c + {u * stripe})",
                  f"            a{u}_0, a{u}_1, a{u}_2, a{u}_3 = "
                  f"LOAD4(a, base + c + {u * stripe})"]
    for u in us:
        lines += [f"            s{u} += a{u}_{e} * x{u}_{e}" for e in range(4)]
    lines += [f"            c += {unroll * stripe}",
              "        while c < cols:",
              "            x0_0, x0_1, x0_2, x0_3 = LOAD4(x, c)",
              "            a0_0, a0_1, a0_2, a0_3 = LOAD4(a, base + c)"]
    lines += [f"            s0 += a0_{e} * x0_{e}" for e in range(4)]
    lines += [f"            c += {stripe}"]
    lines += _lanes_summed(_pairwise([f"s{u}" for u in us]))
    lines += [f"        if tid % {32 * split} == 0 and row < rows:"]
    parts = " + ".join(f"sh[tid + {32 * p}]" for p in range(split))
    lines += [f"            out[row] = {parts}",
              "        cuda.syncthreads()",
              "        start += int64(cuda.gridDim.x) * GROUPS"]
    return "\n".join(lines) + "\n"


def _matvec_quads_kernel(warps: int, split: int, vector: bool) -> Callable:
    """``(a, x, out, rows, cols)`` of float32, ``a`` flattened row-major with
    rows a multiple of 4 long (:func:`_matvec_quads_source`); the quads move
    with 128-bit loads where ``vector``, else four single loads (the same
    bits)."""
    load4, _ = _launch.quad_access(vector)
    return _launch.generated(
        "matvec", _matvec_quads_source(split, MATVEC_QUAD_UNROLL),
        {"cuda": cuda, "int64": types.int64, "ACC": types.float32, "ZERO": np.float32(0),
         "THREADS": warps * _WARP, "GROUPS": warps // split, "LOAD4": load4})


def _lanes_summed(total: str) -> list[str]:
    """Source lines that sum ``total`` over the 32 lanes of each warp, in a
    fixed tree through shared memory (``sh``, one slot per thread), into the
    slot of the warp's lane 0; every thread of the block meets each barrier."""
    return [f"        sh[tid] = {total}",
            "        cuda.syncthreads()",
            "        offset = 16",
            "        while offset > 0:",
            "            if lane < offset:",
            "                sh[tid] += sh[tid + offset]",
            "            cuda.syncthreads()",
            "            offset //= 2"]


def _pairwise(terms: list[str]) -> str:
    """``terms`` summed as a balanced tree: ``(s0 + s1) + (s2 + s3)``."""
    while len(terms) > 1:
        terms = [f"({terms[i]} + {terms[i + 1]})" if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _matvec_kernel(dtype: np.dtype, warps: int, together: int) -> Callable:
    """``(a, x, out, rows, cols)``, ``a`` flattened row-major, one warp per
    ``together`` rows (:func:`_matvec_source`). Float16 and bfloat16 sum
    in float32, int32 in int64. The lanes combine through shared memory (one
    kernel on both backends: the simulator has no warp shuffles), each block stepping
    through its rows together so that all its threads meet every barrier."""
    acc_np = _rk.additive_accumulator(dtype)
    return _launch.generated(
        "matvec", _matvec_source(together, _MATVEC_UNROLL),
        {"cuda": cuda, "int64": types.int64, "ACC": from_dtype(acc_np),
         "ZERO": acc_np.type(0), "THREADS": warps * _WARP, "WARPS": warps,
         "OUT": _backend.convert(dtype)})


def _tile_size() -> int:
    """The largest power of two whose square fits one block."""
    _, threads = _launch.limits()
    tile = 1
    while (2 * tile) ** 2 <= threads:
        tile *= 2
    return tile


# Element access by batch, row and column, for an operand of 2 dimensions
# (the same matrix for every batch) or 3.

@cuda.jit(device=True)
def _get2(x, z, r, c):
    return x[r, c]


@cuda.jit(device=True)
def _get3(x, z, r, c):
    return x[z, r, c]


@cuda.jit(device=True)
def _put2(x, z, r, c, value):
    x[r, c] = value


@cuda.jit(device=True)
def _put3(x, z, r, c, value):
    x[z, r, c] = value


def _matmul_kernel(dtype: np.dtype, tile: int, a_ndim: int, b_ndim: int,
                   out_ndim: int) -> Callable:
    acc = _launch.compute_type(dtype)
    zero = np.dtype(np.float64 if dtype == np.float64 else np.float32).type(0)
    get_a = _get3 if a_ndim == 3 else _get2
    get_b = _get3 if b_ndim == 3 else _get2
    put = _put3 if out_ndim == 3 else _put2
    int64 = types.int64

    def matmul_tiles(a, b, out, batches, m, n, k):
        sa = cuda.shared.array((tile, tile), acc)
        sb = cuda.shared.array((tile, tile), acc)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        z = int64(cuda.blockIdx.z)
        while z < batches:
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
                        if r < m and ka < k:
                            sa[ty, tx] = get_a(a, z, r, ka)
                        else:
                            sa[ty, tx] = zero
                        if kb < k and c < n:
                            sb[ty, tx] = get_b(b, z, kb, c)
                        else:
                            sb[ty, tx] = zero
                        cuda.syncthreads()
                        for kk in range(tile):
                            total += sa[ty, kk] * sb[kk, tx]
                        cuda.syncthreads()
                        k0 += tile
                    if r < m and c < n:
                        put(out, z, r, c, total)
                    col0 += int64(cuda.gridDim.x) * tile
                row0 += int64(cuda.gridDim.y) * tile
            z += int64(cuda.gridDim.z)

    return matmul_tiles


def _distinct_elements(dev: Any) -> bool:
    """Whether no two elements of ``dev`` share memory: along the axes
    ordered by stride, each steps past all the memory the smaller ones span
    (a sufficient test)."""
    extent = np.dtype(dev.dtype).itemsize
    for n, stride in sorted(((n, abs(s)) for n, s in zip(dev.shape, dev.strides) if n > 1),
                            key=lambda axis: axis[1]):
        if stride < extent:
            return False
        extent = stride * (n - 1) + extent
    return True


def _shapes(a_dev: Any, b_dev: Any, out_dev: Any) -> tuple[int, int, int, int]:
    """(batches, M, K, N), or OpError."""
    a_shape, b_shape = tuple(a_dev.shape), tuple(b_dev.shape)
    out_shape = tuple(out_dev.shape)
    batched = [s[0] for s in (a_shape, b_shape) if len(s) == 3]
    batches = batched[0] if batched else 1
    (m, k), (k2, n) = a_shape[-2:], b_shape[-2:]
    want = (batches, m, n) if batched else (m, n)
    if len(set(batched)) > 1 or k2 != k or out_shape != want:
        raise OpError(
            f"matmul_into shapes do not fit: a {a_shape} @ b {b_shape} -> out {out_shape}; "
            "need (M, K) @ (K, N) -> (M, N), or a batch, (B, M, K) @ (B, K, N) -> (B, M, N), "
            "where either input may be 2-D to be used for every batch")
    return batches, m, k, n


def _check_matmul_dtype(dtype: np.dtype, what: str) -> None:
    if BFLOAT16 is None and dtype.kind == "V" and dtype.itemsize == 2:
        raise OpError(
            f"{what} of matmul_into has dtype {dtype}, a 2-byte type NumPy cannot name: "
            f"bfloat16 needs ml_dtypes (`{BFLOAT16_INSTALL}` from numbagraph's "
            "repository root)")
    check_dtype(dtype, MATMUL_DTYPES, what, "matmul_into")


def matmul_into(a: Any, b: Any, out: Any, *, stream: Any) -> None:
    """``out = a @ b`` for ``a`` (M, K), ``b`` (K, N), ``out`` (M, N), or a
    batch of products: ``a`` (B, M, K), ``b`` (B, K, N), ``out`` (B, M, N),
    either input 2-D to be used for every batch. All of one dtype: float16
    or bfloat16 (both accumulated in float32; bfloat16 arrays need ml_dtypes,
    ``pip install -e ".[bfloat16]"``), float32 or float64. Any strides,
    views and transposes included. ``out`` must not share memory with ``a``
    or ``b``.

    On the CUDA driver with nvmath-python installed (``pip install
    -e ".[blas]"``) the product is cuBLAS's, recorded into a capture as
    cuBLAS's own kernel nodes; float32 runs without TF32 unless
    [set_tf32][numbagraph.set_tf32] allows it. Elsewhere, for layouts cuBLAS
    does not take (a matrix strided along both axes), with ``K`` 0, or after
    ``ng.set_matmul_backend("numba")``, a numba kernel tiled through shared
    memory runs. [matmul_backend][numbagraph.matmul_backend] says which.

    Parameters
    ----------
    a
        A device array of shape (M, K), or (B, M, K).
    b
        A device array of shape (K, N), or (B, K, N).
    out
        A device array of shape (M, N), or (B, M, N) when an input is 3-D;
        it shares no memory with ``a`` or ``b``, and no two of its elements
        share memory.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, memory shared with ``out``, a
        host array), or ``stream`` is missing or not a stream; or, after
        ``ng.set_matmul_backend("cublas")``, cuBLAS cannot be called here
        (its first call on a thread inside a capture: call
        [prepare_matmul][numbagraph.prepare_matmul] before). Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Warns
    -----
    CaptureWarning
        cuBLAS could not be called, and the numba kernel ran (or was
        recorded) instead: the first call on a thread inside a capture, or
        one inside a conditional body of a capture without a workspace yet.

    Examples
    --------
    ```python
    ng.matmul_into(p, v_cache, attn, stream=s)    # (1, T) @ (T, D) -> (1, D)
    ng.matmul_into(x, w_t.T, y, stream=s)   # w_t.T a view (CuPy, PyTorch): no copy
    ```
    """
    launch_on = _launch.launch_handle(stream)
    a_dev = device_array(a, "a", contiguous=False)
    b_dev = device_array(b, "b", contiguous=False)
    out_dev = device_array(out, "out", contiguous=False)
    for what, dev in (("a", a_dev), ("b", b_dev), ("out", out_dev)):
        _check_matmul_dtype(np.dtype(dev.dtype), what)
        if dev.ndim not in (2, 3):
            raise OpError(f"{what} of matmul_into must be 2-D or 3-D (a batch), not shape "
                          f"{tuple(dev.shape)}")
    if not a_dev.dtype == b_dev.dtype == out_dev.dtype:
        raise OpError(
            f"matmul_into needs one dtype; got a {a_dev.dtype}, b {b_dev.dtype}, "
            f"out {out_dev.dtype}")
    batches, m, k, n = _shapes(a_dev, b_dev, out_dev)
    if not _distinct_elements(out_dev):
        raise OpError(
            f"out of matmul_into has elements that share memory (strides "
            f"{tuple(out_dev.strides)} for shape {tuple(out_dev.shape)}); write into an "
            "array whose elements are each its own")
    _, out_lo, out_hi = span(out_dev)
    for what, dev in (("a", a_dev), ("b", b_dev)):
        _, lo, hi = span(dev)
        if lo < hi and out_lo < out_hi and lo < out_hi and out_lo < hi:
            raise OpError(
                f"out of matmul_into overlaps {what} (their memory spans meet); "
                "matmul_into needs an output that does not share memory with its inputs")
    keep_disjoint(out_dev, [("a", a_dev), ("b", b_dev)], "matmul_into")
    if m == 0 or n == 0 or batches == 0:
        return
    dtype = np.dtype(a_dev.dtype)
    if k and _blas.enabled():
        gemm = _blas.plan(tuple(a_dev.shape), tuple(a_dev.strides), tuple(b_dev.shape),
                          tuple(b_dev.strides), tuple(out_dev.shape), tuple(out_dev.strides),
                          dtype.itemsize)
        pointers = (_backend.device_pointer(a_dev), _backend.device_pointer(b_dev),
                    _backend.device_pointer(out_dev))
        if gemm is not None and not any(p % dtype.itemsize for p in pointers):
            call = _blas.gemm_call(launch_on, dtype, gemm, a_dev, b_dev, out_dev, pointers)
            if call is not None:
                _launch.device_step(_blas.run, call)
                _blas.finish(call)
                return
    tile = _tile_size()
    sms, _ = _launch.limits()
    kinds = (a_dev._numba_type_, b_dev._numba_type_, out_dev._numba_type_)
    kernel = _launch.compiled(
        ("matmul", dtype.name, tile, kinds),
        lambda: (_matmul_kernel(dtype, tile, a_dev.ndim, b_dev.ndim, out_dev.ndim),
                 (*kinds, _launch.INDEX, _launch.INDEX, _launch.INDEX, _launch.INDEX)),
    )
    grid_x = min(-(-n // tile), _MAX_GRID)
    grid_y = min(-(-m // tile), _MAX_GRID, max(1, sms * 64 // grid_x))
    grid_z = min(batches, _MAX_GRID, max(1, sms * 64 // (grid_x * grid_y)))
    kernel[(grid_x, grid_y, grid_z), (tile, tile), launch_on](
        a_dev, b_dev, out_dev, batches, m, n, k)


# ---------------------------------------------------------------- settings

# Not ops, so not in __all__: numbagraph.ops exports them as they are, where
# each op is wrapped as a repeatable call.

def matmul_backend() -> str:
    """The path [matmul_into][numbagraph.matmul_into] takes now, for the
    layouts cuBLAS takes: ``"cublas"`` or ``"numba"``.

    ``"cublas"`` on the CUDA driver with nvmath-python installed (``pip
    install -e ".[blas]"``) and libcublas found, unless
    ``set_matmul_backend("numba")``; ``"numba"`` on the simulator, without
    the extra, or after ``set_matmul_backend("numba")``. Asking imports
    nvmath and loads libcublas the first time, on the driver; it makes no
    handle and allocates nothing.

    Returns
    -------
    str
        ``"cublas"`` or ``"numba"``.

    Examples
    --------
    ```python
    print(ng.matmul_backend())     # "cublas" on a GPU with numbagraph[blas]
    ```
    """
    return "cublas" if _blas.enabled() else "numba"


def set_matmul_backend(choice: str) -> str:
    """Choose how [matmul_into][numbagraph.matmul_into] computes, for every
    thread, from its next call on.

    ``"auto"`` (the default) calls cuBLAS where it can run and runs the numba
    kernel elsewhere, never failing for want of cuBLAS; ``"cublas"`` asks for
    cuBLAS by name: this call fails where it cannot run, and a later
    ``matmul_into`` that cannot call it (its first call on a thread inside a
    capture) raises instead of running the numba kernel; ``"numba"`` always
    runs the numba kernel, whose launches a graph can rebind. A graph keeps
    the path it captured.

    Parameters
    ----------
    choice
        ``"auto"``, ``"cublas"`` or ``"numba"``.

    Returns
    -------
    str
        The choice before this call.

    Raises
    ------
    ValueError
        ``choice`` is none of the three.
    OpError
        ``"cublas"`` where cuBLAS cannot run: on the simulator, without
        nvmath-python (``pip install -e ".[blas]"``), or where libcublas
        is not found; the message says which. The choice is left as it was.

    Examples
    --------
    ```python
    before = ng.set_matmul_backend("numba")
    ...
    ng.set_matmul_backend(before)
    ```
    """
    if choice not in _blas.CHOICES:
        raise ValueError(
            f"set_matmul_backend takes one of {', '.join(map(repr, _blas.CHOICES))}, not "
            f"{choice!r}")
    if choice == "cublas":
        reason = _blas.unavailable()
        if reason is not None:
            raise OpError(f"ng.set_matmul_backend('cublas'): {reason}. The choice stays "
                          f"{_blas.settings.choice!r}")
    before, _blas.settings.choice = _blas.settings.choice, choice
    _launch.forget_remembered()
    return before


def set_tf32(enabled: bool) -> bool:
    """Allow cuBLAS to compute float32 products on TF32 tensor cores (inputs
    rounded to a 10-bit mantissa, accumulated in float32), for every thread,
    from the next [matmul_into][numbagraph.matmul_into] call on.

    Off by default, as PyTorch's ``torch.backends.cuda.matmul.allow_tf32``:
    float32 products are then computed in float32. Only cuBLAS's float32
    products change; the numba kernel, float16 and float64 do not. A graph
    keeps what it captured.

    Parameters
    ----------
    enabled
        True to allow TF32, False to compute in float32.

    Returns
    -------
    bool
        The setting before this call.

    Raises
    ------
    TypeError
        ``enabled`` is not a bool.

    Examples
    --------
    ```python
    ng.set_tf32(True)     # faster float32 products, about 3 decimal digits
    ```
    """
    if not isinstance(enabled, (bool, np.bool_)):
        raise TypeError(f"set_tf32 takes True or False, not {enabled!r}")
    before, _blas.settings.tf32 = _blas.settings.tf32, bool(enabled)
    _launch.forget_remembered()
    return before


def prepare_matmul(*, stream: Any) -> str:
    """Make, outside a capture, what [matmul_into][numbagraph.matmul_into]
    needs to call cuBLAS on ``stream`` from this thread: the thread's cuBLAS
    handle on the current device, the stream's workspace, and a spare handle
    and workspace for the next capture's graph. Nothing when the numba kernel
    is what runs.

    ``matmul_into`` makes them itself at its first call outside a capture;
    a capture whose thread never called it cannot (cuBLAS may allocate as it
    makes a handle), and records the numba kernel instead, with a
    CaptureWarning. Call this before such a capture.

    Parameters
    ----------
    stream
        The stream the capture will record on.

    Returns
    -------
    str
        The path ``matmul_into`` takes: ``"cublas"`` or ``"numba"``.

    Raises
    ------
    OpError
        ``stream`` is not a stream, or a capture in progress forbids
        allocating now (the stream captures, or another thread's capture
        forbids it): call it before the capture begins.

    Examples
    --------
    ```python
    ng.prepare_matmul(stream=s)
    with ng.capture(s) as cap:
        ng.matmul_into(x, w, y, stream=s)     # cuBLAS, recorded
    ```
    """
    return _blas.prepare(_launch.launch_handle(stream))
