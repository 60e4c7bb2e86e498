"""Checking and describing op operands before anything is launched.

An operand is a device array (numba, or anything with
``__cuda_array_interface__``), a :class:`~numbagraph.DeviceScalar`, or a
Python/NumPy number. Every check an op needs happens here, in Python, and
fails with :class:`~numbagraph.OpError`; a call that passes them only
launches kernels, so a wrong call inside a capture never reaches the driver.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._rebind import Operands
from ..backend import active as _backend
from ..errors import OpError, ScalarValueError
from ..scalar import SCALAR_DTYPES, DeviceScalar, _checker

__all__ = [
    "ARITHMETIC",
    "FLOATS",
    "INTEGERS",
    "ALL",
    "BFLOAT16",
    "BFLOAT16_INSTALL",
    "Operand",
    "device_array",
    "output",
    "operand",
    "check_dtype",
    "row_view",
    "check_disjoint",
    "keep_disjoint",
    "overlaps",
    "rules",
]

FLOATS = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64))

# numbagraph is not on a package index yet: its extras install from its checkout.
BFLOAT16_INSTALL = 'pip install -e ".[bfloat16]"'


def _bfloat16() -> np.dtype | None:
    """NumPy's bfloat16 is ml_dtypes' (numba-cuda types arrays of it as
    bfloat16 once ml_dtypes is installed); None without it."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


# The dtype of bfloat16 arrays, or None where ml_dtypes is not installed.
BFLOAT16 = _bfloat16()
INTEGERS = tuple(np.dtype(t) for t in (np.int32, np.int64))
ARITHMETIC = FLOATS + INTEGERS
ALL = SCALAR_DTYPES

# Operand modes, as kernels see them.
VALUE, SCALAR, ARRAY = 0, 1, 2


def _names(dtypes: Sequence[np.dtype]) -> str:
    return ", ".join(d.name for d in dtypes)


def device_array(obj: Any, what: str, contiguous: bool = True) -> Any:
    """``obj`` as a C-contiguous numba device array (any layout, with
    ``contiguous`` False, for an op whose kernels read strides); DeviceScalars
    become their one-element array."""
    if isinstance(obj, DeviceScalar):
        return obj.inner()
    try:
        dev = _backend.as_device_array(obj)
    except OpError as exc:
        raise OpError(f"{what}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise OpError(
            f"{what} is a {type(obj).__name__} whose __cuda_array_interface__ numba "
            f"cannot read ({type(exc).__name__}: {exc}); it needs at least 'shape', "
            "'typestr', 'data' and 'version'"
        ) from exc
    if dev is None:
        if isinstance(obj, np.ndarray):
            raise OpError(
                f"{what} is a NumPy (host) array; ops take device arrays. Copy it "
                "to the device with cuda.to_device(...) before capturing"
            )
        raise OpError(
            f"{what} is a {type(obj).__name__}; pass a device array (numba, or any "
            "object with __cuda_array_interface__ such as a CuPy array or a "
            "PyTorch CUDA tensor)"
        )
    if contiguous and not dev.is_c_contiguous():
        raise OpError(
            f"{what} is not C-contiguous (strides {tuple(dev.strides)} for shape "
            f"{tuple(dev.shape)}); ops take C-contiguous arrays: make a "
            "contiguous copy before capturing"
        )
    return dev


def check_dtype(dtype: np.dtype, allowed: Sequence[np.dtype], what: str, op: str) -> None:
    if dtype not in allowed:
        raise OpError(f"{op} does not take {what} of dtype {dtype}; use one of {_names(allowed)}")


def output(obj: Any, allowed: Sequence[np.dtype], op: str, what: str = "out") -> Any:
    """The device array an op writes to, checked against ``allowed``."""
    dev = device_array(obj, what)
    check_dtype(np.dtype(dev.dtype), allowed, what, op)
    return dev


def flat(dev: Any) -> Any:
    """A 1-D view of a C-contiguous device array."""
    return dev if dev.ndim == 1 else dev.reshape(dev.size)


@dataclass
class Operand:
    """One input of an elementwise kernel: an array read per element, a
    one-element array read once on the device, or a value baked into the
    launch."""

    mode: int
    array: Any = None        # flat device array (ARRAY, SCALAR)
    value: Any = None        # NumPy scalar of the operand's dtype (VALUE)
    dtype: np.dtype = None
    shape: tuple = ()

    @property
    def is_scalar(self) -> bool:
        return self.mode != ARRAY


def number(value: Any, dtype: np.dtype, what: str, op: str) -> Any:
    """``value`` as a NumPy scalar of ``dtype``, refusing values that do not
    fit (1.5 for an integer op, 300 for uint8)."""
    if isinstance(value, np.ndarray) or not isinstance(
        value, (bool, int, float, np.bool_, np.integer, np.floating)
    ):
        raise OpError(f"{what} of {op} must be a device array, a DeviceScalar or a number")
    try:
        checked = _checker(dtype)(value)
    except ScalarValueError as exc:
        raise OpError(f"{what} of {op}: {exc}") from exc
    return dtype.type(checked)


def operand(obj: Any, dtypes: Sequence[np.dtype], what: str, op: str,
            value_dtype: np.dtype | None = None) -> Operand:
    """Describe one input. Numbers take ``value_dtype`` (the op's dtype);
    arrays and DeviceScalars must have one of ``dtypes``."""
    if isinstance(obj, (bool, int, float, np.generic)) and not isinstance(obj, np.ndarray):
        dtype = np.dtype(value_dtype if value_dtype is not None else dtypes[0])
        return Operand(VALUE, value=number(obj, dtype, what, op), dtype=dtype)
    dev = device_array(obj, what)
    dtype = np.dtype(dev.dtype)
    if dtype not in dtypes:
        hint = ""
        if isinstance(obj, DeviceScalar):
            hint = f"; create the DeviceScalar with dtype={dtypes[0].name}"
        raise OpError(
            f"{what} of {op} has dtype {dtype}, expected {_names(dtypes)}{hint}"
        )
    shape = tuple(dev.shape)
    if dev.size == 1:
        # Read once per thread on the device when the kernel runs, so a
        # DeviceScalar updated between replays is seen by the next one.
        return Operand(SCALAR, array=flat(dev), dtype=dtype, shape=shape)
    return Operand(ARRAY, array=flat(dev), dtype=dtype, shape=shape)


def broadcast_strides(operand: Operand, out_shape: tuple, what: str, op: str) -> tuple[int, int]:
    """(row stride, column stride) in elements with which ``operand`` is read
    for element (r, c) of the output seen as rows x columns.

    Rules: a scalar goes everywhere; an array of the output's shape maps one
    to one; for a 2-D output of shape (R, C), an array of shape (C,) or
    (1, C) is repeated down the rows and one of shape (R, 1) across the
    columns.
    """
    shape = operand.shape
    if operand.is_scalar:
        return 0, 0
    if shape == out_shape:
        return (out_shape[-1] if len(out_shape) == 2 else 0), 1
    if len(out_shape) == 2:
        rows, cols = out_shape
        if shape in ((cols,), (1, cols)):
            return 0, 1
        if shape == (rows, 1):
            return 1, 0
    raise OpError(
        f"{what} of {op} has shape {shape}, which does not broadcast to the "
        f"output shape {out_shape}. An input may have the output's shape, be a "
        "scalar (number, DeviceScalar or one-element array), or, for a 2-D "
        "output (R, C), be a row of shape (C,) or (1, C) or a column of shape (R, 1)"
    )


def row_view(shape: tuple) -> tuple[int, int]:
    """(rows, columns) of an array seen as a matrix: 1-D arrays are one row."""
    if len(shape) == 2:
        return shape
    size = int(np.prod(shape)) if shape else 1
    return 1, size


def _extent(dev: Any) -> tuple[int, int]:
    start = _backend.device_pointer(dev)
    return start, start + dev.size * dev.dtype.itemsize


def overlaps(a: Any, b: Any) -> bool:
    """Whether two device arrays share memory."""
    if a.size == 0 or b.size == 0:
        return False
    a_lo, a_hi = _extent(a)
    b_lo, b_hi = _extent(b)
    return a_lo < b_hi and b_lo < a_hi


class _Rules(threading.local):
    """The rules on operands' memory that the checks of the op call being
    made on this thread applied, while a capture may record it (None
    otherwise): the call's capture keeps them (``_launch.repeatable``), so
    that a rebinding of its graph applies them too."""

    pending: list | None = None


rules = _Rules()


def _keep(op: str, kind: str, out: Any, inputs: Sequence[tuple[str, Any, tuple]],
          what: str = "out") -> None:
    pending = rules.pending
    if pending is None or out.size == 0:
        return
    operands = [(name, dev, shape) for name, dev, shape in inputs
                if dev is not None and dev.size]
    if operands:
        pending.append(Operands(op, kind, [(what, out, tuple(out.shape)), *operands]))


def check_in_place(out: Any, inputs: Sequence[tuple[str, Any, tuple]], op: str) -> None:
    """Refuse inputs that share memory with ``out`` without being ``out``
    itself (same memory, same shape): each element of ``out`` is written by
    the thread that reads the same element of such an input, so exact
    aliasing computes in place, but a shifted or broadcast view would be
    read after other threads wrote it. ``inputs`` are (name, device array,
    the shape it is read in): an op may hold an operand flat."""
    if out.size == 0:
        return
    out_lo, out_hi = _extent(out)
    out_shape = tuple(out.shape)
    for what, dev, shape in inputs:
        if dev is None or dev.size == 0:
            continue
        lo, hi = _extent(dev)
        if hi <= out_lo or out_hi <= lo:
            continue  # disjoint
        if (lo, hi) == (out_lo, out_hi) and tuple(shape) == out_shape:
            continue  # out itself
        raise OpError(
            f"{what} of {op} shares memory with out without being out itself "
            f"({what} has shape {tuple(shape)}, out {out_shape}): threads "
            f"would read elements of {what} that others have already written. Pass "
            "out itself to compute in place, or an input in memory of its own"
        )
    if rules.pending is not None:
        _keep(op, Operands.IN_PLACE, out, inputs)


def keep_disjoint(out: Any, inputs: Sequence[tuple[str, Any]], op: str,
                  what: str = "out") -> None:
    """Where a capture may record the op: its rule that ``out`` (named
    ``what``) shares no memory with ``inputs``, checked already, for a
    rebinding of its graph to apply too."""
    if rules.pending is not None:
        _keep(op, Operands.DISJOINT, out, [(name, dev, ()) for name, dev in inputs], what)


def check_disjoint(out: Any, inputs: Sequence[tuple[str, Any]], op: str,
                   what: str = "out") -> None:
    """Refuse outputs that share memory with inputs an op reads from other
    threads than the one writing (matrix products, gathers); ``what`` names
    the output."""
    for name, dev in inputs:
        if dev is not None and overlaps(out, dev):
            raise OpError(
                f"{what} of {op} overlaps {name}; {op} needs an output that does not "
                "share memory with its inputs"
            )
    keep_disjoint(out, inputs, op, what)
