"""Deterministic reduction kernels.

Floating-point addition is not associative, so where a sum's terms meet
decides its last bits. Here that order depends only on the input's length,
never on timing or on how many blocks run:

* A whole array is cut into tiles of ``U * T`` elements (``U`` loads per
  thread, ``T`` threads) dealt out to ``parts`` parts (a count fixed by its
  length): part ``p`` takes tiles ``p, p + parts, ...``. One block of ``T``
  threads reduces a part: thread ``t`` folds element ``t + k*T`` of each of
  its tiles into accumulator ``k``, and the block combines its threads'
  values in a fixed tree in shared memory. Dealing tiles out keeps the
  blocks in flight on neighbouring tiles, which is what runs at full memory
  bandwidth (a float32 sum over 1 GiB on the H200 ran at 3.7 TB/s with a
  contiguous chunk per block, at 4.2 with dealt tiles).
* The part results are folded in the same way by one block: thread ``t``
  takes parts ``t, t+T, ...`` in order, then the tree.

Large inputs run the parts on many blocks (``parts``), keeping part results
in a scratch array, then fold them (``finish``). ``single`` does the same
arithmetic in one block, keeping part results in shared memory; it needs no
scratch and gives the same bits. Rows of a 2-D array are reduced by one
block each (``rows``), each thread taking a row's elements ``t, t+T, ...``.
No floating-point atomics are used anywhere.

Maximum, minimum and their arguments carry (value, index) pairs and pick the
larger value, NaN above all, and the smaller index on ties: a total order,
so the result is the same whatever the order.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numba import cuda, types
from numba.np.numpy_support import from_dtype

__all__ = [
    "ADDITIVE_UNROLL",
    "EXTREME_UNROLL",
    "additive_accumulator",
    "block_tree_sum",
    "extreme_accumulator",
    "additive_kernels",
    "extreme_kernels",
    "FIN_NONE",
    "FIN_MEAN",
    "FIN_SQRT",
]

FIN_NONE, FIN_MEAN, FIN_SQRT = 0, 1, 2

# Loads each thread has in flight: its elements of one tile.
ADDITIVE_UNROLL = 8
EXTREME_UNROLL = 4

_INDEX_SENTINEL = np.iinfo(np.int64).max


def additive_accumulator(dtype: np.dtype) -> np.dtype:
    """Sums of float16 run in float32, of int32 in int64."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return np.dtype(np.float32)
    if dtype.kind in "iu":
        return np.dtype(np.int64)
    return dtype


def extreme_accumulator(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def block_tree_sum(threads: int) -> Callable:
    """``tree(sh, value, tid)``: every thread's ``value`` summed over a block of
    ``threads`` in a fixed tree in the shared array ``sh``; all threads get it."""

    @cuda.jit(device=True)
    def tree(sh, value, tid):
        sh[tid] = value
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if tid < step:
                sh[tid] = sh[tid] + sh[tid + step]
            cuda.syncthreads()
            step //= 2
        total = sh[0]
        cuda.syncthreads()
        return total
    return tree


def additive_kernels(dtype: np.dtype, threads: int, max_parts: int, has_y: bool) -> dict:
    """The four sum kernels for inputs of ``dtype``: of ``x`` alone, or with
    ``has_y`` of ``x * y`` (compiled in, so a plain sum issues no load or
    branch for ``y``). Their ``fin`` argument says what the total becomes:
    itself, divided by the count (mean), or its square root (norm2); integer
    totals are always themselves."""
    acc_np = additive_accumulator(dtype)
    acc = from_dtype(acc_np)
    zero = acc_np.type(0)
    tree = block_tree_sum(threads)
    t8 = ADDITIVE_UNROLL * threads
    int64 = types.int64

    if acc_np.kind == "f":
        @cuda.jit(device=True)
        def finalize(total, count, fin):
            if fin == FIN_MEAN:
                return total / acc(count)
            if fin == FIN_SQRT:
                return math.sqrt(total)
            return total
    else:
        @cuda.jit(device=True)
        def finalize(total, count, fin):
            return total

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

    @cuda.jit(device=True)
    def fold(parts, nparts, tid):
        total = zero
        p = tid
        while p < nparts:
            total += parts[p]
            p += threads
        return total

    def parts_kernel(x, y, n, nparts, parts):  # one block per part
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        p = int64(cuda.blockIdx.x)
        total = tree(sh, thread_sum(x, y, 0, 0, p * t8, nparts * t8, n, tid), tid)
        if tid == 0:
            parts[p] = total

    def finish_kernel(parts, nparts, out, count, fin):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        total = tree(sh, fold(parts, nparts, tid), tid)
        if tid == 0:
            out[0] = finalize(total, count, fin)

    def single_kernel(x, y, n, nparts, out, fin):
        sh = cuda.shared.array(threads, acc)
        held = cuda.shared.array(max_parts, acc)
        tid = cuda.threadIdx.x
        for p in range(nparts):
            total = tree(sh, thread_sum(x, y, 0, 0, p * t8, nparts * t8, n, tid), tid)
            if tid == 0:
                held[p] = total
        cuda.syncthreads()
        total = tree(sh, fold(held, nparts, tid), tid)
        if tid == 0:
            out[0] = finalize(total, n, fin)

    def rows_kernel(x, y, y_row_stride, rows, cols, out, fin):
        sh = cuda.shared.array(threads, acc)
        tid = cuda.threadIdx.x
        r = int64(cuda.blockIdx.x)
        while r < rows:
            total = tree(sh, thread_sum(x, y, r * cols, r * y_row_stride, 0, t8, cols, tid),
                         tid)
            if tid == 0:
                out[r] = finalize(total, cols, fin)
            r += cuda.gridDim.x

    return {
        "parts": parts_kernel,
        "finish": finish_kernel,
        "single": single_kernel,
        "rows": rows_kernel,
    }


def extreme_kernels(dtype: np.dtype, threads: int, max_parts: int, write_index: bool) -> dict:
    """The four max/min kernels; their ``largest`` argument picks max or min,
    and with ``write_index`` they store where the extreme is (argmax, argmin)
    rather than its value. The starting value never wins a comparison, ties
    with it included (its index is larger than any real one)."""
    acc_np = extreme_accumulator(dtype)
    acc = from_dtype(acc_np)
    if acc_np.kind == "f":
        low, high = acc_np.type(-np.inf), acc_np.type(np.inf)
    else:
        info = np.iinfo(acc_np)
        low, high = acc_np.type(info.min), acc_np.type(info.max)
    sentinel = np.int64(_INDEX_SENTINEL)
    int64 = types.int64
    t4 = EXTREME_UNROLL * threads

    @cuda.jit(device=True)
    def better(v1, i1, v2, i2, largest):
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

    @cuda.jit(device=True)
    def improves(v, best, best_index, largest):
        """Whether v, met after ``best`` in index order, replaces it: the
        first NaN, or a strictly better value, or anything over no value."""
        if best_index == sentinel:
            return True
        if v != v:
            return best == best
        if largest:
            return v > best
        return v < best

    @cuda.jit(device=True)
    def thread_best(x, xo, first, step, length, tid, largest):
        """This thread's best (value, index) of x[xo:xo+length], index from 0,
        walking tiles as ``thread_sum`` does.

        Four interleaved candidates, each meeting its elements in index
        order, so four loads are in flight before any comparison."""
        worst = low if largest else high
        bv0 = worst
        bv1 = worst
        bv2 = worst
        bv3 = worst
        bi0 = sentinel
        bi1 = sentinel
        bi2 = sentinel
        bi3 = sentinel
        j = int64(first) + tid
        while j + 3 * threads < length:
            v0 = acc(x[xo + j])
            v1 = acc(x[xo + j + threads])
            v2 = acc(x[xo + j + 2 * threads])
            v3 = acc(x[xo + j + 3 * threads])
            if improves(v0, bv0, bi0, largest):
                bv0 = v0
                bi0 = j
            if improves(v1, bv1, bi1, largest):
                bv1 = v1
                bi1 = j + threads
            if improves(v2, bv2, bi2, largest):
                bv2 = v2
                bi2 = j + 2 * threads
            if improves(v3, bv3, bi3, largest):
                bv3 = v3
                bi3 = j + 3 * threads
            j += step
        while j < length:
            v0 = acc(x[xo + j])
            if improves(v0, bv0, bi0, largest):
                bv0 = v0
                bi0 = j
            j += threads
        if better(bv0, bi0, bv1, bi1, largest):
            bv0 = bv1
            bi0 = bi1
        if better(bv2, bi2, bv3, bi3, largest):
            bv2 = bv3
            bi2 = bi3
        if better(bv0, bi0, bv2, bi2, largest):
            return bv2, bi2
        return bv0, bi0

    @cuda.jit(device=True)
    def tree(shv, shi, value, index, tid, largest):
        shv[tid] = value
        shi[tid] = index
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if tid < step:
                if better(shv[tid], shi[tid], shv[tid + step], shi[tid + step], largest):
                    shv[tid] = shv[tid + step]
                    shi[tid] = shi[tid + step]
            cuda.syncthreads()
            step //= 2
        value = shv[0]
        index = shi[0]
        cuda.syncthreads()
        return value, index

    @cuda.jit(device=True)
    def fold(parts_v, parts_i, nparts, tid, largest):
        bv = low if largest else high
        bi = sentinel
        p = tid
        while p < nparts:
            if better(bv, bi, parts_v[p], parts_i[p], largest):
                bv = parts_v[p]
                bi = parts_i[p]
            p += threads
        return bv, bi

    @cuda.jit(device=True)
    def store(out, k, value, index):
        if write_index:
            out[k] = index
        else:
            out[k] = value

    def part_best(x, n, p, nparts, tid, shv, shi, largest):
        v, i = thread_best(x, 0, p * t4, nparts * t4, n, tid, largest)
        return tree(shv, shi, v, i, tid, largest)

    part_best = cuda.jit(device=True)(part_best)

    def parts_kernel(x, n, nparts, parts_v, parts_i, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        tid = cuda.threadIdx.x
        p = int64(cuda.blockIdx.x)
        while p < nparts:
            v, i = part_best(x, n, p, nparts, tid, shv, shi, largest)
            if tid == 0:
                parts_v[p] = v
                parts_i[p] = i
            p += cuda.gridDim.x

    def finish_kernel(parts_v, parts_i, nparts, out, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        tid = cuda.threadIdx.x
        v, i = fold(parts_v, parts_i, nparts, tid, largest)
        v, i = tree(shv, shi, v, i, tid, largest)
        if tid == 0:
            store(out, 0, v, i)

    def single_kernel(x, n, nparts, out, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        held_v = cuda.shared.array(max_parts, acc)
        held_i = cuda.shared.array(max_parts, int64)
        tid = cuda.threadIdx.x
        for p in range(nparts):
            v, i = part_best(x, n, p, nparts, tid, shv, shi, largest)
            if tid == 0:
                held_v[p] = v
                held_i[p] = i
        cuda.syncthreads()
        v, i = fold(held_v, held_i, nparts, tid, largest)
        v, i = tree(shv, shi, v, i, tid, largest)
        if tid == 0:
            store(out, 0, v, i)

    def rows_kernel(x, rows, cols, out, largest):
        shv = cuda.shared.array(threads, acc)
        shi = cuda.shared.array(threads, int64)
        tid = cuda.threadIdx.x
        r = int64(cuda.blockIdx.x)
        while r < rows:
            v, i = thread_best(x, r * cols, 0, t4, cols, tid, largest)
            v, i = tree(shv, shi, v, i, tid, largest)
            if tid == 0:
                store(out, r, v, i)
            r += cuda.gridDim.x

    return {
        "parts": parts_kernel,
        "finish": finish_kernel,
        "single": single_kernel,
        "rows": rows_kernel,
    }
