"""Row-wise neural-network ops: softmax, layer norm and RMS norm.

Each row of a 2-D ``x`` (a 1-D ``x`` is one row) is handled by one block:
its statistics are reduced in the fixed order of the reductions, so results
are deterministic. float16 rows are computed in float32. ``out`` has ``x``'s
shape and dtype and may be ``x`` itself. Rows of at most ``HELD_MOST``
elements per thread are read once, each thread holding its elements in
registers for every pass; longer rows are read once per pass. float32 rows
of a multiple of 4 elements, up to ``QUADS_MOST`` groups of four per
thread, are held as such groups, each read and written with one 16-byte
load or store (four single ones where an array does not start at a
multiple of 16 bytes, with the same bits).

Long rows, when there are too few of them to fill the device (the rule of
``reduce.row_parts``), are cut into contiguous parts, one block each, in two
kernels: ``stats`` reduces each part into the reduction scratch (softmax:
the part's maximum and its sum of ``exp(x - maximum)``; layer norm: the
part's mean and sum of squared deviations from it; RMS norm: its sum of
squares), then ``apply`` combines a row's part results in every block of
the row, in a fixed order (softmax rescales each part's sum to the row's
maximum; layer norm merges means and deviations exactly, as Chan's formula
does) and writes the block's part of ``out``. Where no scratch can be made
(docs/capture.md), rows keep one block each.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numba import cuda, types

from ..backend import active as _backend
from ..errors import OpError
from . import _launch
from ._operands import FLOATS, check_disjoint, check_dtype, check_in_place, device_array, flat, row_view
from ._reduce_kernels import add, additive_accumulator, block_tree
from .reduce import _done, _scratch_for, row_parts

__all__ = ["softmax_into", "layernorm_into", "rmsnorm_into"]

# The device's math: Python's on the driver, IEEE results on the simulator.
_math = _backend.device_math

SOFTMAX, LAYERNORM, RMSNORM = 0, 1, 2

# Elements per thread that a part of a split row gets at least: a few loads
# in flight per thread make each block's work outweigh its launch and the
# combining of the row's part results.
PART_PER_THREAD = 4

# Most elements of a row each thread holds in registers (0: none): rows up
# to HELD_MOST * threads long are read from memory once, with every load
# issued before the first is used; longer rows are read once per pass.
# Holding more costs registers, and so resident blocks, beyond what a
# single read saves (docs/benchmarks).
HELD_MOST = 4

# Float32 rows a multiple of 4 long move four elements (16 bytes) per load
# and store, and each thread holds up to QUADS_MOST of those groups: at
# that width holding 16 elements per thread beats reading per pass
# (docs/benchmarks), where single loads lost to the registers they cost.
QUADS_MOST = 4


@cuda.jit(device=True)
def nan_max(a, b):
    """The larger of ``a`` and ``b``, NaN above any number."""
    if b > a or b != b:
        return b
    return a


def _rows_kernel(dtype: np.dtype, threads: int) -> Callable:
    acc_np = additive_accumulator(dtype)
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
                    total += _math.exp(acc(x[base + j]) - top)
                    j += threads
                total = tree_sum(sh, total, tid)
                j = int64(tid)
                while j < cols:
                    out[base + j] = _math.exp(acc(x[base + j]) - top) / total
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
                inv = one / _math.sqrt(tree_sum(sh, squares, tid) / acc(cols) + eps)
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


def _held_rows_source(per: int, kind: int, width: int = 1) -> str:
    """Source of ``rows_held``, ``_rows_kernel``'s kernel for rows of at most
    ``per * width * THREADS`` elements, written for one ``kind`` of op (its
    ``kind`` argument is not read): thread ``tid`` reads its elements of a
    row into ``h0 .. h{per-1}``, every load issued before the first is
    used, and holds them for every pass.

    With ``width`` 1 its elements are ``tid + k * THREADS``, and each pass
    adds them in the order of ``k``, as ``_rows_kernel`` does, so the
    results are the same bits. With ``width`` 4 (float32 rows of a multiple
    of 4) they are the quads ``4 * (tid + k * THREADS) + e``, each read and
    written with one ``LOAD4`` / ``STORE4`` (and weights and biases read
    so), added in the order of ``(k, e)``."""
    ks, es = range(per), range(width)

    def h(k: int, e: int) -> str:
        return f"h{k}" if width == 1 else f"h{k}_{e}"

    def at(k: int) -> str:
        return f"lead + {k * width} * THREADS"

    def each(body: list[str]) -> list[str]:
        """``body`` for every held element in the row, ``{h}`` its name."""
        out = []
        for k in ks:
            out.append(f"        if {at(k)} < cols:")
            for e in es:
                out += ["            " + line.replace("{h}", h(k, e)) for line in body]
        return out

    lines = [
        "def rows_held(x, w, has_w, b, has_b, out, rows, cols, eps, kind):",
        "    sh = cuda.shared.array(THREADS, ACC)",
        "    tid = int64(cuda.threadIdx.x)",
        f"    lead = {width} * tid",
        "    r = int64(cuda.blockIdx.x)",
        "    while r < rows:",
        "        base = r * cols + lead",
    ]
    if width == 1:
        lines += [f"        h{k} = ACC(x[base + {k} * THREADS]) if {at(k)} < cols else ZERO"
                  for k in ks]
    else:
        for k in ks:
            quad = ", ".join(h(k, e) for e in es)
            lines += [f"        if {at(k)} < cols:",
                      f"            {quad} = LOAD4(x, base + {k * width} * THREADS)",
                      "        else:"]
            lines += [f"            {h(k, e)} = ZERO" for e in es]

    def write(values: list[str], k: int) -> list[str]:
        """Store row elements ``values`` (one per ``e``) of group ``k``."""
        if width == 1:
            return [f"            out[base + {k} * THREADS] = {values[0]}"]
        return [f"            STORE4(out, base + {k * width} * THREADS, {', '.join(values)})"]

    if kind == SOFTMAX:
        lines += ["        top = LOWEST"]
        lines += each(["top = nan_max(top, {h})"])
        lines += ["        top = tree_max(sh, top, tid)",
                  "        total = ZERO"]
        lines += each(["{h} = _math.exp({h} - top)", "total += {h}"])
        lines += ["        total = tree_sum(sh, total, tid)"]
        for k in ks:
            lines += [f"        if {at(k)} < cols:"]
            lines += write([f"{h(k, e)} / total" for e in es], k)
    else:
        lines += ["        mean = ZERO"]
        if kind == LAYERNORM:
            lines += ["        total = ZERO"]
            lines += each(["total += {h}"])
            lines += ["        mean = tree_sum(sh, total, tid) / ACC(cols)"]
        lines += ["        squares = ZERO"]
        lines += each(["d = {h} - mean", "squares += d * d"])
        lines += ["        inv = ONE / _math.sqrt(tree_sum(sh, squares, tid) / ACC(cols) + eps)"]
        for k in ks:
            lines += [f"        if {at(k)} < cols:"]
            lines += [f"            v{e} = ({h(k, e)} - mean) * inv" for e in es]
            if width == 1:
                lines += ["            if has_w:",
                          f"                v0 = v0 * ACC(w[{at(k)}])",
                          "            if has_b:",
                          f"                v0 = v0 + ACC(b[{at(k)}])"]
            else:
                lines += ["            if has_w:",
                          f"                g0, g1, g2, g3 = LOAD4(w, {at(k)})"]
                lines += [f"                v{e} = v{e} * g{e}" for e in es]
                lines += ["            if has_b:",
                          f"                c0, c1, c2, c3 = LOAD4(b, {at(k)})"]
                lines += [f"                v{e} = v{e} + c{e}" for e in es]
            lines += write([f"v{e}" for e in es], k)
    lines += ["        r += cuda.gridDim.x"]
    return "\n".join(lines) + "\n"


def _held_rows_kernel(dtype: np.dtype, threads: int, per: int, kind: int, width: int = 1,
                      vector: bool = False) -> Callable:
    """``_rows_kernel`` for rows of at most ``per * width * threads``
    elements and one kind of op, each thread holding its elements in
    registers (:func:`_held_rows_source`); quads (``width`` 4) move with the
    backend's 128-bit loads and stores where ``vector``, and otherwise four
    single ones."""
    acc_np = additive_accumulator(dtype)
    load4, store4 = _launch.quad_access(vector)
    return _launch.generated("rows_held", _held_rows_source(per, kind, width), {
        "cuda": cuda, "_math": _math, "int64": types.int64, "nan_max": nan_max,
        "tree_sum": block_tree(threads, add), "tree_max": block_tree(threads, nan_max),
        "ACC": _launch.scalar_type(acc_np), "ZERO": acc_np.type(0), "ONE": acc_np.type(1),
        "LOWEST": acc_np.type(-np.inf), "THREADS": threads, "LOAD4": load4,
        "STORE4": store4})


def quads_per_thread(dtype: np.dtype, cols: int, threads: int) -> int:
    """Groups of four elements each thread holds for float32 rows of
    ``cols`` (1, 2 or 4 groups), or 0: other dtypes, rows not a multiple of
    4 long, or longer than QUADS_MOST groups per thread."""
    if dtype != np.float32 or cols % 4:
        return 0
    groups = 1
    while 4 * groups * threads < cols and groups < QUADS_MOST:
        groups *= 2
    return groups if 4 * groups * threads >= cols else 0


def held_per_thread(cols: int, threads: int) -> int:
    """Elements each thread holds for rows of ``cols`` (a power of two from
    4 to HELD_MOST), or 0 when a row is longer than that: then
    ``_rows_kernel`` reads it once per pass."""
    if not HELD_MOST:
        return 0
    per = 4
    while per * threads < cols and per < HELD_MOST:
        per *= 2
    return per if per * threads >= cols else 0


@cuda.jit(device=True)
def part_bounds(p, nparts, cols, quantum):
    """[lo, hi) of part ``p`` of a row of ``cols`` cut into ``nparts``
    contiguous parts, each but the last ceil(cols / nparts) long, rounded up
    to a multiple of ``quantum`` (4 for rows read in quads)."""
    size = (cols + nparts - 1) // nparts
    size = (size + quantum - 1) // quantum * quantum
    lo = p * size
    hi = lo + size
    if hi > cols:
        hi = cols
    if lo > cols:
        lo = cols
    return lo, hi


def _stats_kernel(dtype: np.dtype, threads: int, width: int = 1,
                  vector: bool = False) -> Callable:
    """``(x, rows, cols, nparts, stats, kind)``: block ``b`` reduces part
    ``b % nparts`` of row ``b // nparts`` into ``stats[b]`` and, for softmax
    and layer norm, ``stats[rows * nparts + b]``. With ``width`` 4 (float32
    rows of a multiple of 4), parts are whole quads and each thread reads
    quads ``lo + 4 * (tid + k * threads)``, with one ``load4`` each where
    ``vector``, adding their elements in order."""
    acc_np = additive_accumulator(dtype)
    acc = _launch.scalar_type(acc_np)
    zero = acc_np.type(0)
    lowest = acc_np.type(-np.inf)
    int64 = types.int64
    load4, _ = _launch.quad_access(vector)
    step = width * threads

    tree_sum = block_tree(threads, add)
    tree_max = block_tree(threads, nan_max)

    def kernel(x, rows, cols, nparts, stats, kind):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        b = int64(cuda.blockIdx.x)
        total_parts = rows * nparts
        while b < total_parts:
            r = b // nparts
            lo, hi = part_bounds(b - r * nparts, nparts, cols, width)
            base = r * cols
            if kind == SOFTMAX:
                top = lowest
                j = lo + width * tid
                while j < hi:
                    if width == 4:
                        v0, v1, v2, v3 = load4(x, base + j)
                        top = nan_max(nan_max(nan_max(nan_max(top, v0), v1), v2), v3)
                    else:
                        top = nan_max(top, acc(x[base + j]))
                    j += step
                top = tree_max(sh, top, tid)
                total = zero
                if top != lowest:  # a part of -inf only adds nothing, not NaN
                    j = lo + width * tid
                    while j < hi:
                        if width == 4:
                            v0, v1, v2, v3 = load4(x, base + j)
                            total += _math.exp(v0 - top)
                            total += _math.exp(v1 - top)
                            total += _math.exp(v2 - top)
                            total += _math.exp(v3 - top)
                        else:
                            total += _math.exp(acc(x[base + j]) - top)
                        j += step
                total = tree_sum(sh, total, tid)
                if tid == 0:
                    stats[b] = top
                    stats[total_parts + b] = total
            elif kind == LAYERNORM:
                total = zero
                j = lo + width * tid
                while j < hi:
                    if width == 4:
                        v0, v1, v2, v3 = load4(x, base + j)
                        total += v0
                        total += v1
                        total += v2
                        total += v3
                    else:
                        total += acc(x[base + j])
                    j += step
                total = tree_sum(sh, total, tid)
                mean = zero
                if hi > lo:
                    mean = total / acc(hi - lo)
                squares = zero
                j = lo + width * tid
                while j < hi:
                    if width == 4:
                        v0, v1, v2, v3 = load4(x, base + j)
                        d0, d1, d2, d3 = v0 - mean, v1 - mean, v2 - mean, v3 - mean
                        squares += d0 * d0
                        squares += d1 * d1
                        squares += d2 * d2
                        squares += d3 * d3
                    else:
                        d = acc(x[base + j]) - mean
                        squares += d * d
                    j += step
                squares = tree_sum(sh, squares, tid)
                if tid == 0:
                    stats[b] = mean
                    stats[total_parts + b] = squares
            else:
                squares = zero
                j = lo + width * tid
                while j < hi:
                    if width == 4:
                        v0, v1, v2, v3 = load4(x, base + j)
                        squares += v0 * v0
                        squares += v1 * v1
                        squares += v2 * v2
                        squares += v3 * v3
                    else:
                        v = acc(x[base + j])
                        squares += v * v
                    j += step
                squares = tree_sum(sh, squares, tid)
                if tid == 0:
                    stats[b] = squares
            b += cuda.gridDim.x

    return kernel


def _apply_kernel(dtype: np.dtype, threads: int, width: int = 1,
                  vector: bool = False) -> Callable:
    """``(x, w, has_w, b, has_b, out, rows, cols, nparts, stats, eps, kind)``:
    block ``b`` combines row ``b // nparts``'s part results, each thread
    taking parts ``tid, tid + threads, ...`` in order before the block's
    tree, and writes part ``b % nparts`` of the row into ``out``; in quads,
    with ``width`` 4, as ``_stats_kernel`` reads them."""
    acc_np = additive_accumulator(dtype)
    acc = _launch.scalar_type(acc_np)
    zero, one = acc_np.type(0), acc_np.type(1)
    lowest = acc_np.type(-np.inf)
    int64 = types.int64
    load4, store4 = _launch.quad_access(vector)
    step = width * threads

    tree_sum = block_tree(threads, add)
    tree_max = block_tree(threads, nan_max)

    def kernel(x, w, has_w, bias, has_b, out, rows, cols, nparts, stats, eps, kind):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        b = int64(cuda.blockIdx.x)
        total_parts = rows * nparts
        while b < total_parts:
            r = b // nparts
            first = r * nparts
            lo, hi = part_bounds(b - first, nparts, cols, width)
            base = r * cols
            if kind == SOFTMAX:
                top = lowest
                q = int64(tid)
                while q < nparts:
                    top = nan_max(top, stats[first + q])
                    q += threads
                top = tree_max(sh, top, tid)
                total = zero
                q = int64(tid)
                while q < nparts:
                    m = stats[first + q]
                    if m != lowest:  # a part of -inf adds nothing
                        total += stats[total_parts + first + q] * _math.exp(m - top)
                    q += threads
                total = tree_sum(sh, total, tid)
                j = lo + width * tid
                while j < hi:
                    if width == 4:
                        v0, v1, v2, v3 = load4(x, base + j)
                        store4(out, base + j, _math.exp(v0 - top) / total,
                               _math.exp(v1 - top) / total, _math.exp(v2 - top) / total,
                               _math.exp(v3 - top) / total)
                    else:
                        out[base + j] = _math.exp(acc(x[base + j]) - top) / total
                    j += step
            else:
                if kind == LAYERNORM:
                    # mean: the parts' means weighted by their lengths; the
                    # sum of squared deviations from it: each part's own
                    # plus its length times its mean's squared distance.
                    total = zero
                    q = int64(tid)
                    while q < nparts:
                        plo, phi = part_bounds(q, nparts, cols, width)
                        total += stats[first + q] * acc(phi - plo)
                        q += threads
                    mean = tree_sum(sh, total, tid) / acc(cols)
                    squares = zero
                    q = int64(tid)
                    while q < nparts:
                        plo, phi = part_bounds(q, nparts, cols, width)
                        d = stats[first + q] - mean
                        squares += stats[total_parts + first + q] + d * d * acc(phi - plo)
                        q += threads
                else:
                    mean = zero
                    squares = zero
                    q = int64(tid)
                    while q < nparts:
                        squares += stats[first + q]
                        q += threads
                inv = one / _math.sqrt(tree_sum(sh, squares, tid) / acc(cols) + eps)
                j = lo + width * tid
                while j < hi:
                    if width == 4:
                        v0, v1, v2, v3 = load4(x, base + j)
                        v0, v1 = (v0 - mean) * inv, (v1 - mean) * inv
                        v2, v3 = (v2 - mean) * inv, (v3 - mean) * inv
                        if has_w:
                            g0, g1, g2, g3 = load4(w, j)
                            v0, v1, v2, v3 = v0 * g0, v1 * g1, v2 * g2, v3 * g3
                        if has_b:
                            c0, c1, c2, c3 = load4(bias, j)
                            v0, v1, v2, v3 = v0 + c0, v1 + c1, v2 + c2, v3 + c3
                        store4(out, base + j, v0, v1, v2, v3)
                    else:
                        v = (acc(x[base + j]) - mean) * inv
                        if has_w:
                            v = v * acc(w[j])
                        if has_b:
                            v = v + acc(bias[j])
                        out[base + j] = v
                    j += step
            b += cuda.gridDim.x

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
    acc_np = additive_accumulator(dtype)
    arr = _launch.array_type(dtype)
    (w_dev, has_w), (b_dev, has_b) = params
    i64, acc_t = _launch.INDEX, _launch.scalar_type(acc_np)
    nparts = row_parts(rows, cols, PART_PER_THREAD)
    scratch = _scratch_for(launch_on, acc_np, False, 2) if nparts > 1 else None
    if scratch is not None:
        stats, _ = scratch
        acc_arr = _launch.array_type(acc_np)
        width = 4 if dtype == np.float32 and cols % 4 == 0 else 1
        vector = width == 4 and _launch.vector_quads(
            (flat(x_dev), w_dev, b_dev, flat(out_dev)), launch_on, op)
        first = _launch.compiled(
            ("rows_nn_stats", dtype.str, threads, width, vector),
            lambda: (_stats_kernel(dtype, threads, width, vector),
                     (arr, i64, i64, i64, acc_arr, i64)))
        second = _launch.compiled(
            ("rows_nn_apply", dtype.str, threads, width, vector),
            lambda: (_apply_kernel(dtype, threads, width, vector),
                     (arr, arr, types.boolean, arr, types.boolean, arr, i64, i64, i64,
                      acc_arr, acc_t, i64)))
        blocks = rows * nparts
        first[blocks, threads, launch_on](flat(x_dev), rows, cols, nparts, stats, kind)
        second[blocks, threads, launch_on](
            flat(x_dev), w_dev, has_w, b_dev, has_b, flat(out_dev), rows, cols, nparts, stats,
            acc_np.type(eps), kind)
        _done(scratch)
        return
    groups = quads_per_thread(dtype, cols, threads)
    if groups:
        width, per = 4, groups
        vector = _launch.vector_quads((flat(x_dev), w_dev, b_dev, flat(out_dev)), launch_on, op)
    else:
        width, per, vector = 1, held_per_thread(cols, threads), False
    kernel = _launch.compiled(
        ("rows_nn", dtype.str, threads, per, width, vector, kind if per else None),
        lambda: (_held_rows_kernel(dtype, threads, per, kind, width, vector) if per
                 else _rows_kernel(dtype, threads),
                 (arr, arr, types.boolean, arr, types.boolean, arr, _launch.INDEX,
                  _launch.INDEX, _launch.scalar_type(acc_np), _launch.INDEX)),
    )
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
