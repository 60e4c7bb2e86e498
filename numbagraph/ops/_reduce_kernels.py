"""Deterministic reduction kernels.

Floating-point addition is not associative, so where a sum's terms meet
decides its last bits. Here that order depends only on the input's length,
never on timing or on how many blocks run:

* A whole array is cut into tiles of ``U * T`` elements (``U`` loads per
  thread, ``T`` threads) dealt out to ``parts`` parts (a count fixed by its
  length): part ``p`` takes tiles ``p, p + parts, ...``. One block of ``T``
  threads reduces a part: thread ``t`` folds element ``t + k*T`` of each of
  its tiles into accumulator ``k``, and the block combines its threads'
  values in a fixed tree in shared memory. Tiles are dealt out, not cut into
  a contiguous chunk per block, so that the blocks in flight read
  neighbouring tiles: that is what runs at full memory bandwidth (see
  docs/benchmarks).
* The part results are folded in the same way by one block: thread ``t``
  takes parts ``t, t+T, ...`` in order, then the tree.

Large inputs run the parts on many blocks (``parts``), keeping part results
in a scratch array, then fold them (``finish``). ``single`` does the same
arithmetic in one block, keeping part results in shared memory; it needs no
scratch and gives the same bits. Rows of a 2-D array are reduced by one
block each (``rows``), each thread taking a row's elements ``t, t+T, ...``;
long rows, when there are too few to fill the device, are dealt out to
``parts`` parts each as a whole array is (``row_parts``), whose results one
block per row folds (``row_finish``).
No floating-point atomics are used anywhere.

Each of these kernels has its own factory, ``additive_*_kernel`` for sums
and ``extreme_*_kernel`` for maxima and minima, built from the device
functions below; the ``single`` kernel runs its family's part and finish
steps in one block.

Maximum, minimum and their arguments carry (value, index) pairs and pick the
larger value, NaN above all, and the smaller index on ties: a total order,
so the result is the same whatever the order.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import cuda, types
from numba.cuda.np.numpy_support import from_dtype

from ..backend import active as _backend
from ._launch import generated

__all__ = [
    "ADDITIVE_UNROLL",
    "EXTREME_UNROLL",
    "additive_accumulator",
    "extreme_accumulator",
    "add",
    "block_tree",
    "additive_parts_kernel",
    "additive_finish_kernel",
    "additive_single_kernel",
    "additive_rows_kernel",
    "additive_row_parts_kernel",
    "additive_row_finish_kernel",
    "extreme_parts_kernel",
    "extreme_finish_kernel",
    "extreme_single_kernel",
    "extreme_rows_kernel",
    "extreme_row_parts_kernel",
    "extreme_row_finish_kernel",
    "FIN_NONE",
    "FIN_MEAN",
    "FIN_SQRT",
]

FIN_NONE, FIN_MEAN, FIN_SQRT = 0, 1, 2

int64 = types.int64

# Loads each thread has in flight: its elements of one tile.
ADDITIVE_UNROLL = 8
EXTREME_UNROLL = 8

# The index of "no value yet": larger than any real index, so it loses ties.
_SENTINEL = np.int64(np.iinfo(np.int64).max)

# The device's math: Python's on the driver, IEEE results on the simulator.
_math = _backend.device_math


def additive_accumulator(dtype: np.dtype) -> np.dtype:
    """Sums of float16 and bfloat16 run in float32, of int32 in int64."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype.name == "bfloat16":
        return np.dtype(np.float32)
    if dtype.kind in "iu":
        return np.dtype(np.int64)
    return dtype


def extreme_accumulator(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 or dtype.name == "bfloat16" else dtype


@cuda.jit(device=True)
def add(a, b):
    return a + b


def block_tree(threads: int, combine: Callable) -> Callable:
    """``tree(sh, value, tid)``: every thread's ``value`` combined over a
    block of ``threads`` in a fixed tree in the shared array ``sh``, each
    node ``combine(lower, upper)`` of its two halves' results (``combine`` a
    device function such as ``add``); all threads get the result."""

    @cuda.jit(device=True)
    def tree(sh, value, tid):
        sh[tid] = value
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if tid < step:
                sh[tid] = combine(sh[tid], sh[tid + step])
            cuda.syncthreads()
            step //= 2
        result = sh[0]
        cuda.syncthreads()
        return result
    return tree


# Sums. Their ``fin`` argument says what the total becomes: itself, divided
# by the count (mean), or its square root (norm2); integer totals are always
# themselves. With ``has_y`` they sum ``x * y`` rather than ``x`` (compiled
# in, so a plain sum issues no load or branch for ``y``). A total is stored
# in the input's dtype through the backend's ``convert``: an int32 sum, made
# in int64, wraps to int32 as the device's store does, on both backends.

def _finalize(acc_np: np.dtype) -> Callable:
    """``finalize(total, count, fin)``."""
    acc = from_dtype(acc_np)
    if acc_np.kind == "f":
        @cuda.jit(device=True)
        def finalize(total, count, fin):
            if fin == FIN_MEAN:
                return total / acc(count)
            if fin == FIN_SQRT:
                return _math.sqrt(total)
            return total
    else:
        @cuda.jit(device=True)
        def finalize(total, count, fin):
            return total
    return finalize


def _thread_sum(dtype: np.dtype, threads: int, has_y: bool) -> Callable:
    acc_np = additive_accumulator(dtype)
    acc = from_dtype(acc_np)
    zero = acc_np.type(0)

    @cuda.jit(device=True)
    def thread_sum(x, y, xo, yo, first, step, length, tid):
        """This thread's share of x[xo:xo+length] (times y[yo:...] if has_y):
        from ``first``, every ``step`` elements a tile of ``U*T``, of which
        it takes element ``tid + k*T`` into accumulator ``k``.

        Eight loads are issued before their sums: with one thread reading one
        stream, that is what keeps enough bytes in flight for full bandwidth.
        """
        a0 = zero
        a1 = zero
        a2 = zero
        a3 = zero
        a4 = zero
        a5 = zero
        a6 = zero
        a7 = zero
        j = int64(first) + tid
        if has_y:
            while j + 7 * threads < length:
                u0 = acc(x[xo + j])
                u1 = acc(x[xo + j + threads])
                u2 = acc(x[xo + j + 2 * threads])
                u3 = acc(x[xo + j + 3 * threads])
                u4 = acc(x[xo + j + 4 * threads])
                u5 = acc(x[xo + j + 5 * threads])
                u6 = acc(x[xo + j + 6 * threads])
                u7 = acc(x[xo + j + 7 * threads])
                a0 += u0 * acc(y[yo + j])
                a1 += u1 * acc(y[yo + j + threads])
                a2 += u2 * acc(y[yo + j + 2 * threads])
                a3 += u3 * acc(y[yo + j + 3 * threads])
                a4 += u4 * acc(y[yo + j + 4 * threads])
                a5 += u5 * acc(y[yo + j + 5 * threads])
                a6 += u6 * acc(y[yo + j + 6 * threads])
                a7 += u7 * acc(y[yo + j + 7 * threads])
                j += step
            while j < length:  # this thread's share of the last, partial tile
                a0 += acc(x[xo + j]) * acc(y[yo + j])
                j += threads
        else:
            while j + 7 * threads < length:
                u0 = acc(x[xo + j])
                u1 = acc(x[xo + j + threads])
                u2 = acc(x[xo + j + 2 * threads])
                u3 = acc(x[xo + j + 3 * threads])
                u4 = acc(x[xo + j + 4 * threads])
                u5 = acc(x[xo + j + 5 * threads])
                u6 = acc(x[xo + j + 6 * threads])
                u7 = acc(x[xo + j + 7 * threads])
                a0 += u0
                a1 += u1
                a2 += u2
                a3 += u3
                a4 += u4
                a5 += u5
                a6 += u6
                a7 += u7
                j += step
            while j < length:
                a0 += acc(x[xo + j])
                j += threads
        return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    return thread_sum


def _sum_part(dtype: np.dtype, threads: int, has_y: bool) -> Callable:
    """``part(x, y, n, p, nparts, sh, tid)``: the sum of part ``p`` of the
    ``n`` elements dealt out to ``nparts`` parts, in every thread."""
    thread_sum = _thread_sum(dtype, threads, has_y)
    tree = block_tree(threads, add)
    t8 = ADDITIVE_UNROLL * threads

    @cuda.jit(device=True)
    def part(x, y, n, p, nparts, sh, tid):
        return tree(sh, thread_sum(x, y, 0, 0, p * t8, nparts * t8, n, tid), tid)
    return part


def _sum_finish(dtype: np.dtype, threads: int) -> Callable:
    """``finish(parts, nparts, out, count, fin, sh, tid)``: ``out[0]`` is the
    finalized sum of ``parts[:nparts]``, each thread taking parts ``tid,
    tid + threads, ...`` in order."""
    acc_np = additive_accumulator(dtype)
    zero = acc_np.type(0)
    tree = block_tree(threads, add)
    finalize = _finalize(acc_np)
    to_out = _backend.convert(dtype)

    @cuda.jit(device=True)
    def finish(parts, nparts, out, count, fin, sh, tid):
        total = zero
        p = tid
        while p < nparts:
            total += parts[p]
            p += threads
        total = tree(sh, total, tid)
        if tid == 0:
            out[0] = to_out(finalize(total, count, fin))
    return finish


def additive_parts_kernel(dtype: np.dtype, threads: int, has_y: bool) -> Callable:
    """``(x, y, n, nparts, parts)``: one block per part, its sum into ``parts``."""
    acc = from_dtype(additive_accumulator(dtype))
    part = _sum_part(dtype, threads, has_y)

    def parts_kernel(x, y, n, nparts, parts):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        p = int64(cuda.blockIdx.x)
        total = part(x, y, n, p, nparts, sh, tid)
        if tid == 0:
            parts[p] = total
    return parts_kernel


def additive_finish_kernel(dtype: np.dtype, threads: int) -> Callable:
    """``(parts, nparts, out, count, fin)``: one block folds the part sums."""
    acc = from_dtype(additive_accumulator(dtype))
    finish = _sum_finish(dtype, threads)

    def finish_kernel(parts, nparts, out, count, fin):
        sh = cuda.shared.array(threads, acc)
        finish(parts, nparts, out, count, fin, sh, cuda.threadIdx.x)
    return finish_kernel


def additive_single_kernel(dtype: np.dtype, threads: int, max_parts: int,
                           has_y: bool) -> Callable:
    """``(x, y, n, nparts, out, fin)``: parts and finish in one block, the
    part sums held in shared memory."""
    acc = from_dtype(additive_accumulator(dtype))
    part = _sum_part(dtype, threads, has_y)
    finish = _sum_finish(dtype, threads)

    def single_kernel(x, y, n, nparts, out, fin):
        sh = cuda.shared.array(threads, acc)
        held = cuda.shared.array(max_parts, acc)
        tid = cuda.threadIdx.x
        for p in range(nparts):
            total = part(x, y, n, p, nparts, sh, tid)
            if tid == 0:
                held[p] = total
        cuda.syncthreads()
        finish(held, nparts, out, n, fin, sh, tid)
    return single_kernel


def additive_rows_kernel(dtype: np.dtype, threads: int, has_y: bool) -> Callable:
    """``(x, y, y_row_stride, rows, cols, out, fin)``: one block per row."""
    acc_np = additive_accumulator(dtype)
    acc = from_dtype(acc_np)
    thread_sum = _thread_sum(dtype, threads, has_y)
    tree = block_tree(threads, add)
    finalize = _finalize(acc_np)
    to_out = _backend.convert(dtype)
    t8 = ADDITIVE_UNROLL * threads

    def rows_kernel(x, y, y_row_stride, rows, cols, out, fin):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        r = int64(cuda.blockIdx.x)
        while r < rows:
            total = tree(sh, thread_sum(x, y, r * cols, r * y_row_stride, 0, t8, cols, tid),
                         tid)
            if tid == 0:
                out[r] = to_out(finalize(total, cols, fin))
            r += cuda.gridDim.x
    return rows_kernel


def additive_row_parts_kernel(dtype: np.dtype, threads: int, has_y: bool) -> Callable:
    """``(x, y, y_row_stride, rows, cols, nparts, parts)``: block ``b`` sums
    part ``b % nparts`` of row ``b // nparts`` into ``parts[b]``, the row's
    tiles dealt out to its ``nparts`` parts."""
    acc = from_dtype(additive_accumulator(dtype))
    thread_sum = _thread_sum(dtype, threads, has_y)
    tree = block_tree(threads, add)
    t8 = ADDITIVE_UNROLL * threads

    def row_parts_kernel(x, y, y_row_stride, rows, cols, nparts, parts):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        b = int64(cuda.blockIdx.x)
        while b < rows * nparts:
            r = b // nparts
            p = b - r * nparts
            total = tree(sh, thread_sum(x, y, r * cols, r * y_row_stride, p * t8,
                                        nparts * t8, cols, tid), tid)
            if tid == 0:
                parts[b] = total
            b += cuda.gridDim.x
    return row_parts_kernel


def additive_row_finish_kernel(dtype: np.dtype, threads: int) -> Callable:
    """``(parts, nparts, rows, cols, out, fin)``: a block per row folds the
    row's part sums as ``finish`` does into ``out[row]``."""
    acc_np = additive_accumulator(dtype)
    acc = from_dtype(acc_np)
    zero = acc_np.type(0)
    tree = block_tree(threads, add)
    finalize = _finalize(acc_np)
    to_out = _backend.convert(dtype)

    def row_finish_kernel(parts, nparts, rows, cols, out, fin):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        r = int64(cuda.blockIdx.x)
        while r < rows:
            total = zero
            p = int64(tid)
            while p < nparts:
                total += parts[r * nparts + p]
                p += threads
            total = tree(sh, total, tid)
            if tid == 0:
                out[r] = to_out(finalize(total, cols, fin))
            r += cuda.gridDim.x
    return row_finish_kernel


# Maxima and minima. Their ``largest`` argument picks max or min, and with
# ``write_index`` they store where the extreme is (argmax, argmin) rather
# than its value. The starting value never wins a comparison, ties with it
# included (its index is ``_SENTINEL``).

def _worst(acc_np: np.dtype) -> tuple:
    """(lowest, highest) values of ``acc_np``: the starting values of max, min."""
    if acc_np.kind == "f":
        return acc_np.type(-np.inf), acc_np.type(np.inf)
    info = np.iinfo(acc_np)
    return acc_np.type(info.min), acc_np.type(info.max)


@cuda.jit(device=True)
def _better(v1, i1, v2, i2, largest):
    """Whether (v2, i2) beats (v1, i1)."""
    nan1 = v1 != v1
    nan2 = v2 != v2
    if nan1 or nan2:
        if nan1 and nan2:
            return i2 < i1
        return nan2
    if v1 == v2:
        return i2 < i1
    if largest:
        return v2 > v1
    return v2 < v1


def _thread_best_source(unroll: int) -> str:
    """Source of ``thread_best``: candidate ``u`` meets element ``tid + u *
    T`` of each of this thread's tiles, in index order, keeping its value
    and the number of the step that found it (the index is worked out
    once, at the end). The first element, the first NaN or a
    strictly better value replaces a candidate."""
    us = range(unroll)
    lines = ["def thread_best(x, xo, first, step, length, tid, largest):",
             "    start = int64(first) + tid",
             "    j = start",
             "    taken = int32(0)"]
    lines += [f"    v{u} = WORST_MAX if largest else WORST_MIN" for u in us]
    lines += [f"    t{u} = int32(-1)" for u in us]
    lines += [f"    while j + {unroll - 1} * THREADS < length:"]
    lines += [f"        e{u} = ACC(x[xo + j + {u} * THREADS])" for u in us]
    for u in us:
        lines += [f"        if t{u} < 0 or (e{u} != e{u} and v{u} == v{u}) or "
                  f"(e{u} > v{u} if largest else e{u} < v{u}):",
                  f"            v{u} = e{u}",
                  f"            t{u} = taken"]
    lines += ["        j += step",
              "        taken = int32(taken + 1)  # kept int32: += 1 widens it to int64",
              "    best = WORST_MAX if largest else WORST_MIN",
              "    at = SENTINEL"]
    for u in us:
        lines += [f"    if t{u} >= 0:",
                  f"        i{u} = start + int64(t{u}) * step + {u} * THREADS",
                  f"        if _better(best, at, v{u}, i{u}, largest):",
                  f"            best = v{u}",
                  f"            at = i{u}"]
    lines += ["    while j < length:  # this thread's share of the last, partial tile",
              "        e = ACC(x[xo + j])",
              "        if _better(best, at, e, j, largest):",
              "            best = e",
              "            at = j",
              "        j += THREADS",
              "    return best, at"]
    return "\n".join(lines) + "\n"


def _thread_best(dtype: np.dtype, threads: int) -> Callable:
    """``thread_best(x, xo, first, step, length, tid, largest)``: this
    thread's best (value, index) of x[xo:xo+length], index from 0, walking
    tiles as ``thread_sum`` does, ``EXTREME_UNROLL`` loads in flight
    (:func:`_thread_best_source`)."""
    acc_np = extreme_accumulator(dtype)
    low, high = _worst(acc_np)
    return cuda.jit(device=True)(generated(
        "thread_best", _thread_best_source(EXTREME_UNROLL),
        {"int64": int64, "int32": types.int32, "ACC": from_dtype(acc_np),
         "WORST_MAX": low, "WORST_MIN": high, "SENTINEL": _SENTINEL,
         "THREADS": threads, "_better": _better}))


def _pair_tree(threads: int) -> Callable:
    """``tree(shv, shi, value, index, tid, largest)``: the best (value, index)
    of a block, as ``block_tree`` combines, in the shared arrays ``shv`` and
    ``shi``; all threads get it."""

    @cuda.jit(device=True)
    def tree(shv, shi, value, index, tid, largest):
        shv[tid] = value
        shi[tid] = index
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if tid < step:
                if _better(shv[tid], shi[tid], shv[tid + step], shi[tid + step], largest):
                    shv[tid] = shv[tid + step]
                    shi[tid] = shi[tid + step]
            cuda.syncthreads()
            step //= 2
        value = shv[0]
        index = shi[0]
        cuda.syncthreads()
        return value, index
    return tree


def _best_part(dtype: np.dtype, threads: int) -> Callable:
    """``part(x, n, p, nparts, shv, shi, tid, largest)``: the best of part
    ``p``, in every thread."""
    thread_best = _thread_best(dtype, threads)
    tree = _pair_tree(threads)
    tile = EXTREME_UNROLL * threads

    @cuda.jit(device=True)
    def part(x, n, p, nparts, shv, shi, tid, largest):
        v, i = thread_best(x, 0, p * tile, nparts * tile, n, tid, largest)
        return tree(shv, shi, v, i, tid, largest)
    return part


def _store(write_index: bool) -> Callable:
    """``store(out, k, value, index)``: ``out[k]`` is the index or the value."""

    @cuda.jit(device=True)
    def store(out, k, value, index):
        if write_index:
            out[k] = index
        else:
            out[k] = value
    return store


def _best_finish(dtype: np.dtype, threads: int, write_index: bool) -> Callable:
    """``finish(parts_v, parts_i, nparts, out, shv, shi, tid, largest)``:
    ``out[0]`` gets the best of the ``nparts`` part results, each thread
    taking parts ``tid, tid + threads, ...`` in order."""
    low, high = _worst(extreme_accumulator(dtype))
    tree = _pair_tree(threads)
    store = _store(write_index)

    @cuda.jit(device=True)
    def finish(parts_v, parts_i, nparts, out, shv, shi, tid, largest):
        bv = low if largest else high
        bi = _SENTINEL
        p = tid
        while p < nparts:
            if _better(bv, bi, parts_v[p], parts_i[p], largest):
                bv = parts_v[p]
                bi = parts_i[p]
            p += threads
        v, i = tree(shv, shi, bv, bi, tid, largest)
        if tid == 0:
            store(out, 0, v, i)
    return finish


def extreme_parts_kernel(dtype: np.dtype, threads: int) -> Callable:
    """``(x, n, nparts, parts_v, parts_i, largest)``: a block per part, its
    best into ``parts_v``, ``parts_i``."""
    acc = from_dtype(extreme_accumulator(dtype))
    part = _best_part(dtype, threads)

    def parts_kernel(x, n, nparts, parts_v, parts_i, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        tid = cuda.threadIdx.x
        p = int64(cuda.blockIdx.x)
        while p < nparts:
            v, i = part(x, n, p, nparts, shv, shi, tid, largest)
            if tid == 0:
                parts_v[p] = v
                parts_i[p] = i
            p += cuda.gridDim.x
    return parts_kernel


def extreme_finish_kernel(dtype: np.dtype, threads: int, write_index: bool) -> Callable:
    """``(parts_v, parts_i, nparts, out, largest)``: one block folds the parts."""
    acc = from_dtype(extreme_accumulator(dtype))
    finish = _best_finish(dtype, threads, write_index)

    def finish_kernel(parts_v, parts_i, nparts, out, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        finish(parts_v, parts_i, nparts, out, shv, shi, cuda.threadIdx.x, largest)
    return finish_kernel


def extreme_single_kernel(dtype: np.dtype, threads: int, max_parts: int,
                          write_index: bool) -> Callable:
    """``(x, n, nparts, out, largest)``: parts and finish in one block, the
    part results held in shared memory."""
    acc = from_dtype(extreme_accumulator(dtype))
    part = _best_part(dtype, threads)
    finish = _best_finish(dtype, threads, write_index)

    def single_kernel(x, n, nparts, out, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        held_v = cuda.shared.array(max_parts, acc)
        held_i = cuda.shared.array(max_parts, int64)
        tid = cuda.threadIdx.x
        for p in range(nparts):
            v, i = part(x, n, p, nparts, shv, shi, tid, largest)
            if tid == 0:
                held_v[p] = v
                held_i[p] = i
        cuda.syncthreads()
        finish(held_v, held_i, nparts, out, shv, shi, tid, largest)
    return single_kernel


def extreme_rows_kernel(dtype: np.dtype, threads: int, write_index: bool) -> Callable:
    """``(x, rows, cols, out, largest)``: one block per row."""
    acc = from_dtype(extreme_accumulator(dtype))
    thread_best = _thread_best(dtype, threads)
    tree = _pair_tree(threads)
    store = _store(write_index)
    tile = EXTREME_UNROLL * threads

    def rows_kernel(x, rows, cols, out, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        tid = cuda.threadIdx.x
        r = int64(cuda.blockIdx.x)
        while r < rows:
            v, i = thread_best(x, r * cols, 0, tile, cols, tid, largest)
            v, i = tree(shv, shi, v, i, tid, largest)
            if tid == 0:
                store(out, r, v, i)
            r += cuda.gridDim.x
    return rows_kernel


def extreme_row_parts_kernel(dtype: np.dtype, threads: int) -> Callable:
    """``(x, rows, cols, nparts, parts_v, parts_i, largest)``: block ``b``
    finds the best of part ``b % nparts`` of row ``b // nparts`` (index
    within the row) into ``parts_v[b]``, ``parts_i[b]``."""
    acc = from_dtype(extreme_accumulator(dtype))
    thread_best = _thread_best(dtype, threads)
    tree = _pair_tree(threads)
    tile = EXTREME_UNROLL * threads

    def row_parts_kernel(x, rows, cols, nparts, parts_v, parts_i, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        tid = cuda.threadIdx.x
        b = int64(cuda.blockIdx.x)
        while b < rows * nparts:
            r = b // nparts
            p = b - r * nparts
            v, i = thread_best(x, r * cols, p * tile, nparts * tile, cols, tid, largest)
            v, i = tree(shv, shi, v, i, tid, largest)
            if tid == 0:
                parts_v[b] = v
                parts_i[b] = i
            b += cuda.gridDim.x
    return row_parts_kernel


def extreme_row_finish_kernel(dtype: np.dtype, threads: int, write_index: bool) -> Callable:
    """``(parts_v, parts_i, nparts, rows, out, largest)``: a block per row
    folds the row's part results into ``out[row]``."""
    acc_np = extreme_accumulator(dtype)
    acc = from_dtype(acc_np)
    low, high = _worst(acc_np)
    tree = _pair_tree(threads)
    store = _store(write_index)

    def row_finish_kernel(parts_v, parts_i, nparts, rows, out, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        tid = cuda.threadIdx.x
        r = int64(cuda.blockIdx.x)
        while r < rows:
            bv = low if largest else high
            bi = _SENTINEL
            p = int64(tid)
            while p < nparts:
                k = r * nparts + p
                if _better(bv, bi, parts_v[k], parts_i[k], largest):
                    bv = parts_v[k]
                    bi = parts_i[k]
                p += threads
            v, i = tree(shv, shi, bv, bi, tid, largest)
            if tid == 0:
                store(out, r, v, i)
            r += cuda.gridDim.x
    return row_finish_kernel
