"""The elementwise kernel templates: ``out = f(a, b, c)`` element by element.

Every elementwise op (unary, binary, axpy, where, astype, fill, copy) is one
scalar function ``f(x, y, z)`` dropped into one of two templates:

* flat: output and array inputs of one shape, scalars broadcast. Each block
  owns a tile of ``TILE_ITEMS`` elements per thread and each thread loads its
  four elements of every input before storing any, so enough loads are in
  flight to run at memory bandwidth.
* rows: a 2-D output with row or column broadcast inputs, each input read at
  ``r * row_stride + c * col_stride``.

Inputs a function ignores cost nothing: their loads are dead code.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from numba import cuda, types

from . import _launch
from ._operands import (
    ARRAY,
    SCALAR,
    VALUE,
    Operand,
    broadcast_strides,
    check_in_place,
    row_view,
)

__all__ = ["run"]

_MAX_GRID_Y = 65535
TILE_ITEMS = 4  # elements per thread in a flat kernel's tile; the template unrolls 4


@cuda.jit(device=True)
def _load(array, value, mode, i):
    """Element ``i`` of an ARRAY operand, else its (hoisted) scalar value."""
    if mode == ARRAY:
        return array[i]
    return value


def _flat_template(f: Callable, modes: tuple[int, int, int], threads: int) -> Callable:
    """The flat kernel of ``f`` for operands in ``modes``, launched with
    blocks of ``threads``: both compiled in, as constants."""
    fn = cuda.jit(device=True)(f)
    int64 = types.int64
    span = TILE_ITEMS * threads
    # The operand modes are compiled in, so each load is one plain load (or
    # none): a mode read at run time costs bandwidth (docs/benchmarks).
    am, bm, cm = modes

    def kernel(a, av, b, bv, c, cv, out, n):
        if am == SCALAR:
            av = a[0]
        if bm == SCALAR:
            bv = b[0]
        if cm == SCALAR:
            cv = c[0]
        # Block k owns the tile of TILE_ITEMS * threads elements starting at
        # k * TILE_ITEMS * threads; thread t takes elements t, t + threads, ...
        # of it. Blocks in flight thus read neighbouring tiles, which keeps
        # DRAM pages open, where a grid-stride loop over the whole array
        # scatters them (docs/benchmarks).
        i = int64(cuda.blockIdx.x) * span + cuda.threadIdx.x
        step = int64(cuda.gridDim.x) * span
        while i + 3 * threads < n:
            i1 = i + threads
            i2 = i1 + threads
            i3 = i2 + threads
            # All loads before any store: out may alias an input, so the
            # compiler could not hoist them past the stores itself.
            x0 = _load(a, av, am, i)
            x1 = _load(a, av, am, i1)
            x2 = _load(a, av, am, i2)
            x3 = _load(a, av, am, i3)
            y0 = _load(b, bv, bm, i)
            y1 = _load(b, bv, bm, i1)
            y2 = _load(b, bv, bm, i2)
            y3 = _load(b, bv, bm, i3)
            z0 = _load(c, cv, cm, i)
            z1 = _load(c, cv, cm, i1)
            z2 = _load(c, cv, cm, i2)
            z3 = _load(c, cv, cm, i3)
            out[i] = fn(x0, y0, z0)
            out[i1] = fn(x1, y1, z1)
            out[i2] = fn(x2, y2, z2)
            out[i3] = fn(x3, y3, z3)
            i += step
        while i < n:  # this thread's share of the last, partial tile
            out[i] = fn(_load(a, av, am, i), _load(b, bv, bm, i), _load(c, cv, cm, i))
            i += threads

    return kernel


def _rows_template(f: Callable) -> Callable:
    fn = cuda.jit(device=True)(f)
    int64 = types.int64

    def kernel(a, av, am, ar, ac, b, bv, bm, br, bc, c, cv, cm, cr, cc, out, rows, cols):
        if am == SCALAR:
            av = a[0]
        if bm == SCALAR:
            bv = b[0]
        if cm == SCALAR:
            cv = c[0]
        first = int64(cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x)
        step = int64(cuda.blockDim.x * cuda.gridDim.x)
        r = int64(cuda.blockIdx.y)
        while r < rows:
            j = first
            while j < cols:
                out[r * cols + j] = fn(_load(a, av, am, r * ar + j * ac),
                                       _load(b, bv, bm, r * br + j * bc),
                                       _load(c, cv, cm, r * cr + j * cc))
                j += step
            r += cuda.gridDim.y

    return kernel


def run(
    key: tuple,
    make_fn: Callable[[], Callable],
    inputs: Sequence[tuple[str, Operand]],
    out: Any,
    out_flat: Any,
    stream: Any,
    op: str,
) -> None:
    """Launch ``out = f(inputs...)`` on ``stream``.

    ``key`` names ``f`` (the op and anything its code depends on);
    ``make_fn()`` builds it. ``inputs`` are up to three (name, operand)
    pairs, checked; numbers among them must have ``out``'s dtype.
    """
    out_shape = tuple(out.shape)
    size = out_flat.size
    launch_on = _launch.launch_handle(stream)
    slots, strides = [], []
    for name, item in inputs:
        slots.append(item)
        strides.append(broadcast_strides(item, out_shape, name, op))
    check_in_place(out, [(name, item.array, item.shape) for name, item in inputs
                         if item.mode != VALUE], op)
    while len(slots) < 3:
        slots.append(Operand(VALUE, value=out.dtype.type(0), dtype=out.dtype))
        strides.append((0, 0))
    if size == 0:
        return
    args = []
    for item in slots:
        array = item.array if item.mode != VALUE else out_flat
        value = item.value if item.mode == VALUE else item.dtype.type(0)
        args.append((array, value, item.mode))
    dtypes = tuple(item.dtype for item in slots)
    flat = all(item.is_scalar or rs_cs[1] == 1 and item.shape == out_shape
               for item, rs_cs in zip(slots, strides))
    if flat:
        modes = tuple(item.mode for item in slots)
        threads = _launch.limits()[1]

        def build_flat():
            sig_inputs = []
            for dtype in dtypes:
                sig_inputs += [_launch.array_type(dtype), _launch.scalar_type(dtype)]
            return (_flat_template(make_fn(), modes, threads),
                    (*sig_inputs, _launch.array_type(out.dtype), _launch.INDEX))

        kernel = _launch.compiled(("map.flat", key, dtypes, modes, out.dtype, threads),
                                  build_flat)
        flat_args = [x for array, value, _ in args for x in (array, value)]
        kernel[_launch.tiles_for(size, TILE_ITEMS * threads), threads, launch_on](
            *flat_args, out_flat, size
        )
        return
    rows, cols = row_view(out_shape)

    def build_rows():
        sig_rows = []
        for dtype in dtypes:
            sig_rows += [_launch.array_type(dtype), _launch.scalar_type(dtype),
                         _launch.INDEX, _launch.INDEX, _launch.INDEX]
        return (_rows_template(make_fn()),
                (*sig_rows, _launch.array_type(out.dtype), _launch.INDEX, _launch.INDEX))

    kernel = _launch.compiled(("map.rows", key, dtypes, out.dtype), build_rows)
    row_args = []
    for (array, value, mode), (rs, cs) in zip(args, strides):
        row_args += [array, value, mode, rs, cs]
    sms, threads = _launch.limits()
    gx = _launch.blocks_for(cols)
    gy = max(1, min(rows, (sms * _launch.BLOCKS_PER_SM) // gx, _MAX_GRID_Y))
    kernel[(gx, gy), threads, launch_on](*row_args, out_flat, rows, cols)
