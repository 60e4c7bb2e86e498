"""Reductions: whole arrays into one value, or 2-D arrays row by row.

With ``axis=None`` (the default) the whole input reduces into ``out``, a
DeviceScalar or a one-element device array; with ``axis=-1`` (or 1) each row
of a 2-D input reduces into one element of a 1-D ``out`` of length rows.

Results are deterministic: the same input gives the same bits on every call
and every replay, eager or captured, whatever else the device is doing.
Large inputs are reduced by many blocks into a small scratch array that
belongs to the stream; it is allocated the first time a reduction runs on
that stream where the allocation rule allows it (docs/capture.md: not on the
thread of a "thread_local" or "global" capture). Where the rule forbids it,
the reduction uses one block instead: slower, same bits. Run a step once
before capturing it and this never happens.

With ``axis=-1``, each row is reduced by one block, unless there are too
few rows to fill the device: then long rows are cut into parts, one block
each (``row_parts``), whose results a second kernel folds, in the scratch
above. Where no scratch can be made, rows keep one block each: the same
results up to rounding, not the same bits.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numba import cuda, types

from .. import _registry
from ..backend import active as _backend
from ..errors import OpError
from ..alloc import free
from ..safety import allocation_allowed, graph_allocate, graph_allocation_session
from . import _launch, _reduce_kernels as _rk
from ._operands import ARITHMETIC, FLOATS, check_disjoint, check_dtype, device_array, flat

__all__ = [
    "sum_into", "mean_into", "max_into", "min_into", "argmax_into", "argmin_into",
    "dot_into", "norm2_into",
]

INDEX_DTYPES = tuple(np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64))


# Parts per multiprocessor: enough blocks in flight for full bandwidth (see
# docs/benchmarks). MAX_PARTS keeps the part results (value and index, 16
# bytes each) within the 48 KiB of static shared memory a ``single`` block
# may hold.
PARTS_PER_SM = 16
MAX_PARTS = 2560


def _max_parts() -> int:
    sms, _ = _launch.limits()
    return min(sms * PARTS_PER_SM, MAX_PARTS)


def _plan(n: int, unroll: int) -> int:
    """How many parts ``n`` elements are dealt out to, in tiles of ``unroll``
    elements per thread: a function of ``n`` alone, so the summation order
    is too."""
    _, threads = _launch.limits()
    return min(_max_parts(), max(1, -(-n // (unroll * threads))))


# Long rows. A row reduced by one block keeps one multiprocessor busy, so
# with few rows most of the device idles while each block walks a long row.
# Then each row is cut into parts, one block each, whose results a second
# kernel combines: the split happens when there are fewer rows than
# SPLIT_BELOW_ROWS_PER_SM per multiprocessor and each part still gets at
# least ``per_thread`` elements per thread (a reduction's tile, so that no
# part is idle; a few loads per thread for softmax and the norms). A row has
# as many parts as it can, within the _max_parts() blocks a reduction
# spreads over: rows * parts never exceeds it, which is the scratch's size.
SPLIT_BELOW_ROWS_PER_SM = 4
# Parts per row forced on every row op whose rows fit the scratch (0: the
# rule above decides; 1: a block per row); tests set it to run either path
# on tiny arrays.
force_row_parts = 0


def row_parts(rows: int, cols: int, per_thread: int) -> int:
    """How many parts, one block each, every one of ``rows`` rows of
    ``cols`` elements is cut into: 1 keeps a block per row. A function of
    the shape and the device alone, so the summation order is too."""
    sms, threads = _launch.limits()
    most = _max_parts() // max(rows, 1)
    if force_row_parts:
        return max(1, min(force_row_parts, cols, most))
    if rows >= sms * SPLIT_BELOW_ROWS_PER_SM:
        return 1
    parts = min(cols // (per_thread * threads), most)
    return parts if parts >= 2 else 1


# Scratch for part results: per (stream, device), per accumulator dtype. A
# stream is known by its capture key: the per-thread default stream is one
# handle for a different stream on each thread, and those run at once.
_scratch: dict[tuple[Any, int], dict[tuple, Any]] = {}


def _scratch_for(handle: int, dtype: np.dtype, with_index: bool,
                 width: int = 1) -> tuple | None:
    """The part-result arrays for a reduction on the stream with this
    handle, ``width`` values per part (the index array has one): the
    stream's own, made once outside any capture; or, the first time inside a
    capture on this thread, arrays the graph allocates, which
    :func:`_done` frees inside it once the reduction has read them; or None
    when neither can be made now (a conditional body, or the allocation
    rule forbids it)."""
    key = (_registry.key_of(handle), _backend.current_device_id())
    if key not in _scratch and len(_scratch) >= 256:
        _scratch.clear()  # streams come and go; graphs keep the scratch they use
    per_stream = _scratch.setdefault(key, {})
    key = (dtype.str, with_index, width)
    arrays = per_stream.get(key)
    if arrays is not None:
        return arrays
    size = _max_parts()
    what = "a reduction's scratch"
    session = graph_allocation_session(handle, what) if handle else None
    if session is not None:
        if session.block is not None:
            return None
        return (graph_allocate(session, (size * width,), dtype, 0, what, handle=handle),
                graph_allocate(session, (size,), np.dtype(np.int64), 0, what, handle=handle)
                if with_index else None)
    if not allocation_allowed(handle):
        return None
    values = cuda.device_array(size * width, dtype)
    indices = cuda.device_array(size, np.int64) if with_index else None
    arrays = per_stream[key] = (values, indices)
    return arrays


def _done(scratch: tuple) -> None:
    """Free scratch a graph allocated for one reduction, inside the graph."""
    for array in scratch:
        if array is not None and _backend.graph_memory_of(array) is not None:
            free(array)


def _kernel(factory: Callable, args: tuple, out: Any, signature: tuple) -> Any:
    """The kernel ``factory(*args)`` compiled for ``signature``, cached by the
    factory, its arguments and the dtype of ``out`` (None for a kernel
    without one): together they decide the signature."""
    key = ("reduce", factory, args, None if out is None else out.dtype.str)
    return _launch.compiled(key, lambda: (factory(*args), signature))


def _axis_rows(x: Any, axis: Any, op: str) -> bool:
    """True for a row-by-row reduction."""
    if axis is None:
        return False
    if x.ndim == 2 and axis in (-1, 1):
        return True
    raise OpError(
        f"{op} takes axis=None (the whole array) or axis=-1 (each row of a 2-D "
        f"array); got axis={axis!r} for an array of shape {tuple(x.shape)}"
    )


def _whole_out(out: Any, dtypes: tuple, op: str) -> Any:
    dev = device_array(out, "out")
    if dev.size != 1:
        raise OpError(
            f"out of {op} must be a DeviceScalar or a one-element array for a "
            f"whole-array reduction, not shape {tuple(dev.shape)}; pass axis=-1 "
            "to reduce each row"
        )
    check_dtype(np.dtype(dev.dtype), dtypes, "out", op)
    return flat(dev)


def _rows_out(out: Any, rows: int, dtypes: tuple, op: str) -> Any:
    dev = device_array(out, "out")
    if dev.size != rows or dev.ndim != 1:
        raise OpError(
            f"out of {op} with axis=-1 must be 1-D with one element per row "
            f"({rows}), not shape {tuple(dev.shape)}"
        )
    check_dtype(np.dtype(dev.dtype), dtypes, "out", op)
    return dev


def sum_like(op: str, fin: int, x: Any, y: Any, out: Any, axis: Any, stream: Any,
             allowed: tuple, *, names: tuple[str, str] = ("a", "b"),
             vector_y: bool = False) -> None:
    """sum, mean, dot, norm2 and matrix-vector products: ``finalize(sum x*y)``.

    With ``vector_y`` (matvec), ``y`` is one row used for every row of ``x``.
    """
    launch_on = _launch.launch_handle(stream)
    x_dev = device_array(x, "x" if y is None or y is x else names[0])
    dtype = np.dtype(x_dev.dtype)
    check_dtype(dtype, allowed, "inputs", op)
    rows_mode = _axis_rows(x_dev, axis, op)
    y_dev = x_dev
    y_row_stride = x_dev.shape[1] if rows_mode else 0
    if y is not None and y is not x:
        a_name, b_name = names
        y_dev = device_array(y, b_name)
        if np.dtype(y_dev.dtype) != dtype:
            raise OpError(
                f"{b_name} of {op} has dtype {y_dev.dtype}, expected {dtype} like {a_name}")
        shape, y_shape = tuple(x_dev.shape), tuple(y_dev.shape)
        want = (shape[1],) if vector_y else shape
        if y_shape != want:
            raise OpError(
                f"{b_name} of {op} has shape {y_shape}, expected {want} for {a_name} "
                f"of shape {shape}")
        y_row_stride = 0 if vector_y or not rows_mode else shape[1]
    has_y = y is not None
    acc = _rk.additive_accumulator(dtype)
    _, threads = _launch.limits()
    max_parts = _max_parts()
    arr, acc_arr = _launch.array_type(dtype), _launch.array_type(acc)
    i64 = _launch.INDEX
    xf, yf = flat(x_dev), flat(y_dev)
    if rows_mode:
        rows, cols = x_dev.shape
        out_dev = _rows_out(out, rows, (dtype,), op)
        check_disjoint(out_dev, [("the input", x_dev), ("the second input", y_dev)], op)
        if rows == 0:
            return
        out_t = _launch.array_type(out_dev.dtype)
        nparts = row_parts(rows, cols, _rk.ADDITIVE_UNROLL)
        scratch = _scratch_for(launch_on, acc, False) if nparts > 1 else None
        if scratch is not None:
            values, _ = scratch
            first = _kernel(_rk.additive_row_parts_kernel, (dtype, threads, has_y), None,
                            (arr, arr, i64, i64, i64, i64, acc_arr))
            second = _kernel(_rk.additive_row_finish_kernel, (dtype, threads), out_dev,
                             (acc_arr, i64, i64, i64, out_t, i64))
            first[rows * nparts, threads, launch_on](xf, yf, y_row_stride, rows, cols, nparts,
                                                     values)
            second[min(rows, max_parts), threads, launch_on](values, nparts, rows, cols,
                                                             out_dev, fin)
            _done(scratch)
            return
        kernel = _kernel(_rk.additive_rows_kernel, (dtype, threads, has_y), out_dev,
                         (arr, arr, i64, i64, i64, _launch.array_type(out_dev.dtype), i64))
        kernel[min(rows, max_parts), threads, launch_on](
            xf, yf, y_row_stride, rows, cols, out_dev, fin)
        return
    out_dev = _whole_out(out, (dtype,), op)
    out_t = _launch.array_type(out_dev.dtype)
    n = x_dev.size
    parts = _plan(n, _rk.ADDITIVE_UNROLL)
    scratch = _scratch_for(launch_on, acc, False) if parts > 1 else None
    if scratch is None:
        kernel = _kernel(_rk.additive_single_kernel, (dtype, threads, max_parts, has_y),
                         out_dev, (arr, arr, i64, i64, out_t, i64))
        kernel[1, threads, launch_on](xf, yf, n, parts, out_dev, fin)
        return
    values, _ = scratch
    first = _kernel(_rk.additive_parts_kernel, (dtype, threads, has_y), None,
                    (arr, arr, i64, i64, acc_arr))
    second = _kernel(_rk.additive_finish_kernel, (dtype, threads), out_dev,
                     (acc_arr, i64, out_t, i64, i64))
    first[parts, threads, launch_on](xf, yf, n, parts, values)
    second[1, threads, launch_on](values, parts, out_dev, n, fin)
    _done(scratch)


def _extreme(op: str, largest: bool, write_index: bool, x: Any, out: Any, axis: Any,
             stream: Any) -> None:
    launch_on = _launch.launch_handle(stream)
    x_dev = device_array(x, "x")
    dtype = np.dtype(x_dev.dtype)
    check_dtype(dtype, ARITHMETIC, "x", op)
    rows_mode = _axis_rows(x_dev, axis, op)
    out_dtypes = INDEX_DTYPES if write_index else (dtype,)
    acc = _rk.extreme_accumulator(dtype)
    _, threads = _launch.limits()
    max_parts = _max_parts()
    xf = flat(x_dev)
    arr, acc_arr, i64 = _launch.array_type(dtype), _launch.array_type(acc), _launch.INDEX
    idx_arr = _launch.array_type(np.int64)

    if rows_mode:
        rows, cols = x_dev.shape
        out_dev = _rows_out(out, rows, out_dtypes, op)
        check_disjoint(out_dev, [("x", x_dev)], op)
        if rows == 0:
            return
        if cols == 0:
            raise OpError(f"{op} of rows with no elements has no value")
        out_t = _launch.array_type(out_dev.dtype)
        nparts = row_parts(rows, cols, _rk.EXTREME_UNROLL)
        scratch = _scratch_for(launch_on, acc, True) if nparts > 1 else None
        if scratch is not None:
            values, indices = scratch
            first = _kernel(_rk.extreme_row_parts_kernel, (dtype, threads), None,
                            (arr, i64, i64, i64, acc_arr, idx_arr, types.boolean))
            second = _kernel(_rk.extreme_row_finish_kernel, (dtype, threads, write_index),
                             out_dev, (acc_arr, idx_arr, i64, i64, out_t, types.boolean))
            first[rows * nparts, threads, launch_on](xf, rows, cols, nparts, values, indices,
                                                     largest)
            second[min(rows, max_parts), threads, launch_on](values, indices, nparts, rows,
                                                             out_dev, largest)
            _done(scratch)
            return
        kernel = _kernel(_rk.extreme_rows_kernel, (dtype, threads, write_index), out_dev,
                         (arr, i64, i64, _launch.array_type(out_dev.dtype), types.boolean))
        kernel[min(rows, max_parts), threads, launch_on](xf, rows, cols, out_dev, largest)
        return
    out_dev = _whole_out(out, out_dtypes, op)
    n = x_dev.size
    if n == 0:
        raise OpError(f"{op} of an empty array has no value")
    out_t = _launch.array_type(out_dev.dtype)
    parts = _plan(n, _rk.EXTREME_UNROLL)
    scratch = _scratch_for(launch_on, acc, True) if parts > 1 else None
    if scratch is None:
        kernel = _kernel(_rk.extreme_single_kernel, (dtype, threads, max_parts, write_index),
                         out_dev, (arr, i64, i64, out_t, types.boolean))
        kernel[1, threads, launch_on](xf, n, parts, out_dev, largest)
        return
    values, indices = scratch
    first = _kernel(_rk.extreme_parts_kernel, (dtype, threads), None,
                    (arr, i64, i64, acc_arr, idx_arr, types.boolean))
    second = _kernel(_rk.extreme_finish_kernel, (dtype, threads, write_index), out_dev,
                     (acc_arr, idx_arr, i64, out_t, types.boolean))
    first[parts, threads, launch_on](xf, n, parts, values, indices, largest)
    second[1, threads, launch_on](values, indices, parts, out_dev, largest)
    _done(scratch)


def sum_into(x: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = sum(x)`` (float16 sums in float32, int32 in int64; ``out`` has
    ``x``'s dtype).

    Parameters
    ----------
    x
        The device array reduced.
    out
        A DeviceScalar or a one-element device array with ``axis=None``; with
        ``axis=-1``, a 1-D device array of one element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    total = ng.DeviceScalar(0.0, dtype=np.float32, stream=s)
    ng.sum_into(x, total, stream=s)
    ng.sum_into(m, row_sums, axis=-1, stream=s)    # m: (R, C), row_sums: (R,)
    ```
    """
    sum_like("sum_into", _rk.FIN_NONE, x, None, out, axis, stream, ARITHMETIC)


def mean_into(x: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = mean(x)`` (float dtypes).

    Parameters
    ----------
    x
        The device array reduced.
    out
        A DeviceScalar or a one-element device array with ``axis=None``; with
        ``axis=-1``, a 1-D device array of one element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.mean_into(x, m, stream=s)
    ```
    """
    sum_like("mean_into", _rk.FIN_MEAN, x, None, out, axis, stream, FLOATS)


def norm2_into(x: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = sqrt(sum(x * x))`` (float dtypes).

    Parameters
    ----------
    x
        The device array reduced.
    out
        A DeviceScalar or a one-element device array with ``axis=None``; with
        ``axis=-1``, a 1-D device array of one element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.norm2_into(g, gnorm, stream=s)
    ```
    """
    sum_like("norm2_into", _rk.FIN_SQRT, x, x, out, axis, stream, FLOATS)


def dot_into(a: Any, b: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = sum(a * b)``; ``a`` and ``b`` of one shape and dtype. With
    ``axis=-1``, the dot product of each row pair.

    Parameters
    ----------
    a
        A device array.
    b
        A device array of ``a``'s shape and dtype.
    out
        A DeviceScalar or a one-element device array with ``axis=None``; with
        ``axis=-1``, a 1-D device array of one element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.dot_into(u, v, uv, stream=s)
    ```
    """
    if a is b:
        sum_like("dot_into", _rk.FIN_NONE, a, a, out, axis, stream, ARITHMETIC)
        return
    sum_like("dot_into", _rk.FIN_NONE, a, b, out, axis, stream, ARITHMETIC)


def max_into(x: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = max(x)``, NaN if any element is NaN.

    Parameters
    ----------
    x
        The device array reduced.
    out
        A DeviceScalar or a one-element device array with ``axis=None``; with
        ``axis=-1``, a 1-D device array of one element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded. Also for an empty ``x``, or rows with no
        elements: they have no maximum.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.max_into(x, top, stream=s)
    ```
    """
    _extreme("max_into", True, False, x, out, axis, stream)


def min_into(x: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = min(x)``, NaN if any element is NaN.

    Parameters
    ----------
    x
        The device array reduced.
    out
        A DeviceScalar or a one-element device array with ``axis=None``; with
        ``axis=-1``, a 1-D device array of one element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded. Also for an empty ``x``, or rows with no
        elements: they have no minimum.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.min_into(x, bottom, stream=s)
    ```
    """
    _extreme("min_into", False, False, x, out, axis, stream)


def argmax_into(x: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = argmax(x)``: the index of the first largest element (of the
    first NaN, if any), into an int32, int64, uint32 or uint64 ``out``; of a
    flattened ``x`` with ``axis=None``, of each row with ``axis=-1``.

    Parameters
    ----------
    x
        The device array reduced.
    out
        An int32, int64, uint32 or uint64 DeviceScalar or one-element device
        array with ``axis=None``; with ``axis=-1``, a 1-D device array of one
        element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded. Also for an empty ``x``, or rows with no
        elements.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    token = ng.DeviceScalar(0, dtype=np.int32, stream=s)
    ng.argmax_into(logits, token, stream=s)        # greedy decoding
    ```
    """
    _extreme("argmax_into", True, True, x, out, axis, stream)


def argmin_into(x: Any, out: Any, *, axis: int | None = None, stream: Any) -> None:
    """``out = argmin(x)``: the index of the first smallest element (of the
    first NaN, if any).

    Parameters
    ----------
    x
        The device array reduced.
    out
        An int32, int64, uint32 or uint64 DeviceScalar or one-element device
        array with ``axis=None``; with ``axis=-1``, a 1-D device array of one
        element per row.
    axis
        None: the whole array; -1 (or 1): each row of a 2-D input.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, ``axis``, a host array), or
        ``stream`` is missing or not a stream. Raised before anything is
        launched or recorded. Also for an empty ``x``, or rows with no
        elements.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.argmin_into(dist, nearest, stream=s)
    ```
    """
    _extreme("argmin_into", False, True, x, out, axis, stream)
