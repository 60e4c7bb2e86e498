"""Row reads and writes at an index held on the device.

``take_into(table, index, out)`` copies row ``index`` of ``table`` into
``out``: the embedding lookup of a decode step at position ``pos``.
``put_into(src, index, table)`` writes ``src`` into row ``index``: appending
to a K/V cache. The index is a Python int or an integer DeviceScalar (or
one-element integer array), read on the device when the op runs.

An index outside ``0 <= index < rows`` read on the device is skipped: nothing
is read or written, ``out`` (or ``table``) keeps what it held. A Python int
out of range raises :class:`~numbagraph.OpError` at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, types

from ..errors import OpError
from . import _launch
from ._operands import ARRAY, SCALAR, VALUE, check_disjoint, device_array, flat, operand
from .elementwise import copy_into

__all__ = ["take_into", "put_into"]

INDEX_DTYPES = tuple(
    np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                          np.uint8, np.uint16, np.uint32, np.uint64)
)


def _take_kernel():
    int64 = types.int64

    def kernel(table, rows, cols, index, out):
        row = int64(index[0])
        if row >= 0 and row < rows:
            j = int64(cuda.grid(1))
            while j < cols:
                out[j] = table[row * cols + j]
                j += cuda.gridsize(1)

    return kernel


def _put_kernel():
    int64 = types.int64

    def kernel(src, sv, sm, index, table, rows, cols):
        row = int64(index[0])
        if row >= 0 and row < rows:
            if sm == SCALAR:
                sv = src[0]
            j = int64(cuda.grid(1))
            while j < cols:
                table[row * cols + j] = src[j] if sm == ARRAY else sv
                j += cuda.gridsize(1)

    return kernel


def _table(table: Any, op: str) -> tuple[Any, int, int]:
    dev = device_array(table, "table")
    if dev.ndim not in (1, 2):
        raise OpError(f"table of {op} must be 1-D or 2-D, not shape {tuple(dev.shape)}")
    rows, cols = (dev.shape[0], 1) if dev.ndim == 1 else dev.shape
    return dev, rows, cols


def _row_shapes(table_dev: Any, cols: int) -> tuple:
    """Shapes a row may take: (C,) or (1, C) of a 2-D table; one element of a
    1-D table."""
    if table_dev.ndim == 1:
        return ((), (1,))
    return ((cols,), (1, cols))


def _index(index: Any, rows: int, op: str) -> tuple[int | None, Any]:
    """(python_index, None) or (None, device one-element integer array)."""
    if isinstance(index, (bool, np.bool_)):
        raise OpError(f"index of {op} must be an integer, not a bool")
    if isinstance(index, (int, np.integer)):
        if not 0 <= int(index) < rows:
            raise OpError(f"index {int(index)} of {op} is outside the table's {rows} rows")
        return int(index), None
    dev = device_array(index, "index")
    if dev.size != 1 or np.dtype(dev.dtype) not in INDEX_DTYPES:
        raise OpError(
            f"index of {op} must be an int, or an integer DeviceScalar or one-element "
            f"array; got dtype {dev.dtype}, shape {tuple(dev.shape)}"
        )
    return None, flat(dev)


def take_into(table: Any, index: Any, out: Any, *, stream: Any) -> None:
    """``out = table[index]``: row ``index`` of a 2-D table (``out`` of shape
    (C,) or (1, C)), or element ``index`` of a 1-D one (``out`` a DeviceScalar
    or one-element array). Any dtype; ``out`` has the table's.

    Parameters
    ----------
    table
        A 1-D or 2-D device array.
    index
        A Python int, or an integer DeviceScalar or one-element integer device
        array, read on the device when the op runs.
    out
        A row of the table's dtype: shape (C,) or (1, C), or one element of a
        1-D table.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, a host array), a Python int
        ``index`` is outside the table's rows, or ``stream`` is missing or not
        a stream. Raised before anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.take_into(embedding, token, x, stream=s)   # token: int DeviceScalar
    ```
    """
    launch_on = _launch.launch_handle(stream)
    table_dev, rows, cols = _table(table, "take_into")
    out_dev = device_array(out, "out")
    if out_dev.dtype != table_dev.dtype:
        raise OpError(
            f"out of take_into has dtype {out_dev.dtype}, expected the table's {table_dev.dtype}")
    if tuple(out_dev.shape) not in _row_shapes(table_dev, cols):
        raise OpError(
            f"out of take_into has shape {tuple(out_dev.shape)}; a row of a table of "
            f"shape {tuple(table_dev.shape)} needs shape ({cols},)"
        )
    position, index_dev = _index(index, rows, "take_into")
    check_disjoint(out_dev, [("table", table_dev)], "take_into")
    table_flat = flat(table_dev)
    if position is not None:
        copy_into(table_flat[position * cols:(position + 1) * cols], flat(out_dev), stream=stream)
        return
    kernel = _launch.compiled(
        ("take", table_dev.dtype.str, index_dev.dtype.str),
        lambda: (_take_kernel(), (_launch.array_type(table_dev.dtype), _launch.INDEX,
                                  _launch.INDEX, _launch.array_type(index_dev.dtype),
                                  _launch.array_type(table_dev.dtype))),
    )
    kernel[_launch.blocks_for(cols), _launch.limits()[1], launch_on](
        table_flat, rows, cols, index_dev, flat(out_dev))


def put_into(src: Any, index: Any, table: Any, *, stream: Any) -> None:
    """``table[index] = src``: write row ``index`` of a 2-D table (``src`` a
    row of shape (C,) or (1, C), or a scalar filling the row), or element
    ``index`` of a 1-D one (``src`` a number, DeviceScalar or one-element
    array). ``src`` has the table's dtype.

    Parameters
    ----------
    src
        A row of the table's dtype, or a scalar filling the row.
    index
        A Python int, or an integer DeviceScalar or one-element integer device
        array, read on the device when the op runs.
    table
        The 1-D or 2-D device array written.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit (shape, dtype, a host array), a Python int
        ``index`` is outside the table's rows, or ``stream`` is missing or not
        a stream. Raised before anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.put_into(k, pos, k_cache, stream=s)        # pos: int DeviceScalar
    ```
    """
    launch_on = _launch.launch_handle(stream)
    table_dev, rows, cols = _table(table, "put_into")
    dtype = np.dtype(table_dev.dtype)
    src_op = operand(src, (dtype,), "src", "put_into", value_dtype=dtype)
    if not src_op.is_scalar and src_op.shape not in _row_shapes(table_dev, cols):
        raise OpError(
            f"src of put_into has shape {src_op.shape}; a row of a table of shape "
            f"{tuple(table_dev.shape)} takes shape ({cols},) or a scalar"
        )
    position, index_dev = _index(index, rows, "put_into")
    if src_op.mode != VALUE:
        check_disjoint(table_dev, [("src", src_op.array)], "put_into", "table")
    table_flat = flat(table_dev)
    if position is not None:
        row = table_flat[position * cols:(position + 1) * cols]
        copy_into(src_op.array if src_op.mode != VALUE else src_op.value, row, stream=stream)
        return
    array = src_op.array if src_op.mode != VALUE else table_flat
    value = src_op.value if src_op.mode == VALUE else dtype.type(0)
    kernel = _launch.compiled(
        ("put", dtype.str, index_dev.dtype.str),
        lambda: (_put_kernel(), (_launch.array_type(dtype), _launch.scalar_type(dtype),
                                 _launch.INDEX, _launch.array_type(index_dev.dtype),
                                 _launch.array_type(dtype), _launch.INDEX, _launch.INDEX)),
    )
    kernel[_launch.blocks_for(cols), _launch.limits()[1], launch_on](
        array, value, src_op.mode, index_dev, table_flat, rows, cols)
