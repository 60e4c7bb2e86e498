"""Elementwise ops: ``out[...] = f(inputs[...])``, written into ``out``.

Inputs broadcast to ``out``: an input may have ``out``'s shape, be a scalar
(a number, a DeviceScalar, or a one-element device array), or, when ``out``
is 2-D of shape (R, C), be a row (shape (C,) or (1, C)) repeated down the
rows or a column (shape (R, 1)) repeated across them. Array inputs and
DeviceScalars have ``out``'s dtype; numbers must fit it. ``out`` may be one
of the inputs when it has ``out``'s shape.

A DeviceScalar input is read on the device each time the op runs, so one
updated between graph replays changes what the next replay computes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .._registry import sessions as _sessions
from ..backend import active as _backend
from ..errors import OpError
from .._graphmem import held as _graph_memory_held
from ..safety import check_graph_memory, guard_device_copy
from ..scalar import DeviceScalar
from . import _functions, _launch, _map
from ._operands import ALL, ARITHMETIC, FLOATS, flat, operand, output, overlaps
from ._operands import keep_disjoint

__all__ = [
    "add_into", "sub_into", "mul_into", "div_into",
    "maximum_into", "minimum_into", "pow_into",
    "neg_into", "abs_into", "exp_into", "log_into", "sqrt_into", "rsqrt_into",
    "tanh_into", "sigmoid_into", "relu_into", "gelu_into", "copy_into",
    "fill_into", "axpy_into", "where_into", "astype_into",
]

Input = Any  # a device array, a DeviceScalar, or a number


def _apply(op: str, allowed: Sequence[np.dtype], name: str,
           make: Callable[[np.dtype], Callable], inputs: Sequence[tuple[str, Any]],
           out: Any, stream: Any) -> None:
    """Check everything, then launch ``out = make(dtype)(inputs...)``; ``name``
    names the function for the kernel cache."""
    out_dev = output(out, allowed, op)
    dtype = np.dtype(out_dev.dtype)
    checked = [(what, operand(obj, (dtype,), what, op, value_dtype=dtype))
               for what, obj in inputs]
    _map.run((name, dtype.str), lambda: make(dtype), checked, out_dev, flat(out_dev),
             stream, op)


def _binary(name: str, allowed: Sequence[np.dtype]) -> Callable[..., None]:
    return lambda a, b, out, stream: _apply(
        f"{name}_into", allowed, name, _functions.BINARY[name], (("a", a), ("b", b)),
        out, stream)


def _unary(name: str, allowed: Sequence[np.dtype]) -> Callable[..., None]:
    return lambda x, out, stream: _apply(
        f"{name}_into", allowed, name, _functions.UNARY[name], (("x", x),), out, stream)


_add, _sub, _mul, _div = (_binary(op, ARITHMETIC) for op in ("add", "sub", "mul", "div"))
_maximum, _minimum = (_binary(op, ARITHMETIC) for op in ("maximum", "minimum"))
_pow = _binary("pow", FLOATS)


def add_into(a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = a + b``.

    Parameters
    ----------
    a
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    b
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.add_into(x, y, out, stream=s)        # arrays
    ng.add_into(x, pos, out, stream=s)      # pos: a DeviceScalar
    ```
    """
    _add(a, b, out, stream)


def sub_into(a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = a - b``.

    Parameters
    ----------
    a
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    b
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.sub_into(x, 1.0, out, stream=s)
    ```
    """
    _sub(a, b, out, stream)


def mul_into(a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = a * b``.

    Parameters
    ----------
    a
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    b
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.mul_into(x, scale, out, stream=s)
    ```
    """
    _mul(a, b, out, stream)


def div_into(a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = a / b``; for integer dtypes floor division (``a // b``), with
    0 where ``b`` is 0.

    Parameters
    ----------
    a
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    b
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.div_into(x, n, out, stream=s)
    ```
    """
    _div(a, b, out, stream)


def maximum_into(a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = maximum(a, b)``, NaN if either is NaN.

    Parameters
    ----------
    a
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    b
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.maximum_into(x, 0.0, out, stream=s)
    ```
    """
    _maximum(a, b, out, stream)


def minimum_into(a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = minimum(a, b)``, NaN if either is NaN.

    Parameters
    ----------
    a
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    b
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.minimum_into(x, limit, out, stream=s)
    ```
    """
    _minimum(a, b, out, stream)


def pow_into(a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = a ** b`` (float dtypes).

    Parameters
    ----------
    a
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    b
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.pow_into(x, 2.0, out, stream=s)
    ```
    """
    _pow(a, b, out, stream)


_neg, _abs, _relu = (_unary(op, ARITHMETIC) for op in ("neg", "abs", "relu"))
_exp, _log, _sqrt, _rsqrt, _tanh, _sigmoid, _gelu = (
    _unary(op, FLOATS) for op in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu")
)
_copy = _unary("copy", ALL)


def neg_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = -x``.

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.neg_into(x, out, stream=s)
    ```
    """
    _neg(x, out, stream)


def abs_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = |x|``.

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.abs_into(x, out, stream=s)
    ```
    """
    _abs(x, out, stream)


def exp_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = exp(x)`` (float dtypes).

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.exp_into(x, out, stream=s)
    ```
    """
    _exp(x, out, stream)


def log_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = log(x)`` (float dtypes).

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.log_into(x, out, stream=s)
    ```
    """
    _log(x, out, stream)


def sqrt_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = sqrt(x)`` (float dtypes).

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.sqrt_into(x, out, stream=s)
    ```
    """
    _sqrt(x, out, stream)


def rsqrt_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = 1 / sqrt(x)`` (float dtypes).

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.rsqrt_into(x, out, stream=s)
    ```
    """
    _rsqrt(x, out, stream)


def tanh_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = tanh(x)`` (float dtypes).

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.tanh_into(x, out, stream=s)
    ```
    """
    _tanh(x, out, stream)


def sigmoid_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = 1 / (1 + exp(-x))`` (float dtypes).

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.sigmoid_into(x, out, stream=s)
    ```
    """
    _sigmoid(x, out, stream)


def relu_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = maximum(x, 0)``.

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.relu_into(x, out, stream=s)
    ```
    """
    _relu(x, out, stream)


def gelu_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))``, the exact GELU
    (float dtypes).

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.gelu_into(x, out, stream=s)
    ```
    """
    _gelu(x, out, stream)


def copy_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = x``; any dtype, ``x`` of ``out``'s dtype, broadcast like every
    elementwise input.

    An array of ``out``'s shape and dtype that does not overlap it is copied
    by the driver (a memcpy node in a graph), as fast as the device copies.

    Parameters
    ----------
    x
        A device array, a DeviceScalar or a number of ``out``'s dtype,
        broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.copy_into(x, out, stream=s)
    ```
    """
    if not _copy_whole(x, out, stream):
        _copy(x, out, stream)


def _copy_whole(x: Input, out: Any, stream: Any) -> bool:
    """Copy ``x`` into ``out`` with the driver when both are device arrays of
    one shape and dtype in disjoint memory; False, with nothing done,
    otherwise."""
    if isinstance(x, (DeviceScalar, bool, int, float, np.generic)):
        return False
    x_dev, out_dev = _backend.as_device_array(x), _backend.as_device_array(out)
    if (x_dev is None or out_dev is None or x_dev.shape != out_dev.shape
            or x_dev.dtype != out_dev.dtype or not x_dev.is_c_contiguous()
            or not out_dev.is_c_contiguous() or overlaps(x_dev, out_dev)):
        return False
    handle = _launch.launch_handle(stream)
    # A device copy needs disjoint memory: a rebinding must keep it so.
    keep_disjoint(out_dev, [("x", x_dev)], "copy_into")
    if _graph_memory_held[0]:
        check_graph_memory((out_dev, x_dev), handle, "ng.copy_into()")
    if _sessions:
        guard_device_copy(handle, out_dev, x_dev, "copy_into on the legacy default stream")
    _launch.device_step(_backend.copy_device, out_dev, x_dev, handle)
    return True


def fill_into(out: Any, value: Input, *, stream: Any) -> None:
    """Set every element of ``out`` to ``value``: a number, or a DeviceScalar
    read on the device when the op runs. Any dtype.

    Parameters
    ----------
    out
        The device array filled, of any dtype.
    value
        A number, or a DeviceScalar read on the device when the op runs.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.fill_into(cache, 0.0, stream=s)
    ```
    """
    _apply("fill_into", ALL, "copy", _functions.UNARY["copy"], (("value", value),), out,
           stream)


def axpy_into(alpha: Input, x: Input, y: Input, out: Any, *, stream: Any) -> None:
    """``out = alpha * x + y``, with ``alpha`` a number or a DeviceScalar
    (or a one-element array).

    Parameters
    ----------
    alpha
        A number, a DeviceScalar or a one-element device array.
    x
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    y
        A device array, a DeviceScalar or a number, broadcast to ``out``.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded. Also when ``alpha`` is an array of
        more than one element.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.axpy_into(-lr, grad, w, w, stream=s)     # w -= lr * grad
    ```
    """
    out_dev = output(out, ARITHMETIC, "axpy_into")
    dtype = np.dtype(out_dev.dtype)
    alpha_op = operand(alpha, (dtype,), "alpha", "axpy_into", value_dtype=dtype)
    if not alpha_op.is_scalar:
        raise OpError(
            "alpha of axpy_into must be a number, a DeviceScalar or a one-element "
            f"array, not an array of shape {alpha_op.shape}; use mul_into and add_into"
        )
    checked = [
        ("alpha", alpha_op),
        ("x", operand(x, (dtype,), "x", "axpy_into", value_dtype=dtype)),
        ("y", operand(y, (dtype,), "y", "axpy_into", value_dtype=dtype)),
    ]
    _map.run(("axpy", dtype.str), lambda: _functions.axpy(dtype), checked, out_dev,
             flat(out_dev), stream, "axpy_into")


def where_into(cond: Input, a: Input, b: Input, out: Any, *, stream: Any) -> None:
    """``out = a where cond is nonzero, else b``. ``cond`` is an array or
    DeviceScalar of any dtype (bool, integer or float) or a number; ``a``
    and ``b`` have ``out``'s dtype. All three broadcast to ``out``.

    Parameters
    ----------
    cond
        A device array or DeviceScalar of any dtype, or a number; nonzero
        selects ``a``.
    a
        Device array, DeviceScalar or number taken where ``cond`` is nonzero.
    b
        Device array, DeviceScalar or number taken where ``cond`` is zero.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.where_into(mask, x, 0.0, out, stream=s)
    ```
    """
    if isinstance(cond, (bool, int, float, np.generic)):
        copy_into(a if cond else b, out, stream=stream)
        return
    out_dev = output(out, ALL, "where_into")
    dtype = np.dtype(out_dev.dtype)
    checked = [
        ("cond", operand(cond, ALL, "cond", "where_into")),
        ("a", operand(a, (dtype,), "a", "where_into", value_dtype=dtype)),
        ("b", operand(b, (dtype,), "b", "where_into", value_dtype=dtype)),
    ]
    _map.run(("where", dtype.str), lambda: _functions.where(dtype), checked, out_dev,
             flat(out_dev), stream, "where_into")


def astype_into(x: Input, out: Any, *, stream: Any) -> None:
    """``out = x`` converted to ``out``'s dtype, as NumPy's ``astype``
    (floats to integers truncate; to bool, nonzero is True; integers wrap to
    a narrower dtype) and, where NumPy leaves the result undefined, as the
    GPU converts: NaN gives 0 and floats out of an integer dtype's range
    saturate (docs/ops.md, Conversions). Any dtypes.

    Parameters
    ----------
    x
        A device array or a number, of any dtype.
    out
        The device array written, allocated before the capture.
    stream
        The stream the op is launched on, or recorded into while it captures.

    Raises
    ------
    OpError
        An operand does not fit ``out`` (shape, dtype, a host array, a number
        out of range), or ``stream`` is missing or not a stream. Raised before
        anything is launched or recorded.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        ``stream``'s capture was invalidated by an operation refused on
        another thread.

    Examples
    --------
    ```python
    ng.astype_into(logits16, logits32, stream=s)
    ```
    """
    if isinstance(x, (bool, int, float, np.generic)):
        fill_into(out, x, stream=stream)
        return
    out_dev = output(out, ALL, "astype_into")
    x_op = operand(x, ALL, "x", "astype_into")
    source = x_op.dtype
    target = np.dtype(out_dev.dtype)
    _map.run(("astype", source.str, target.str), lambda: _functions.astype(source, target),
             [("x", x_op)], out_dev, flat(out_dev), stream, "astype_into")
