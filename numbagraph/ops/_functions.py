"""The scalar functions behind the elementwise ops.

Each maker takes the op's dtype and returns ``f(x, y, z)`` for the map
templates. Arithmetic happens in the compute type (float32 for float16), and
the result is rounded once when stored. Floating-point results follow IEEE
arithmetic on the device (``log(0) == -inf``), on both backends: the math
functions are the backend's (``device_math``), and so is ``astype``'s
conversion. Maximum and minimum propagate NaN as NumPy does.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..backend import active as _backend
from ._launch import compute_type

__all__ = ["BINARY", "UNARY", "axpy", "where", "astype"]

# Python's math on the driver, where numba compiles it to the device's; on the
# simulator, the same functions with the device's NaN and inf where Python's
# raise.
_math = _backend.device_math


def _add(ct):
    def f(x, y, z):
        return ct(x) + ct(y)
    return f


def _sub(ct):
    def f(x, y, z):
        return ct(x) - ct(y)
    return f


def _mul(ct):
    def f(x, y, z):
        return ct(x) * ct(y)
    return f


def _div(ct, integer):
    if integer:
        # Floor division, as NumPy's // ; division by zero gives 0.
        def f(x, y, z):
            if y == 0:
                return ct(0)
            return ct(x) // ct(y)
        return f

    def f(x, y, z):
        return ct(x) / ct(y)
    return f


def _maximum(ct):
    def f(x, y, z):
        u = ct(x)
        v = ct(y)
        return u if (u > v or u != u) else v
    return f


def _minimum(ct):
    def f(x, y, z):
        u = ct(x)
        v = ct(y)
        return u if (u < v or u != u) else v
    return f


def _pow(ct):
    def f(x, y, z):
        return ct(x) ** ct(y)
    return f


def _neg(ct):
    def f(x, y, z):
        return -ct(x)
    return f


def _abs(ct):
    def f(x, y, z):
        return abs(ct(x))
    return f


def _exp(ct):
    def f(x, y, z):
        return _math.exp(ct(x))
    return f


def _log(ct):
    def f(x, y, z):
        return _math.log(ct(x))
    return f


def _sqrt(ct):
    def f(x, y, z):
        return _math.sqrt(ct(x))
    return f


def _rsqrt(ct):
    one = ct(1)

    def f(x, y, z):
        return one / _math.sqrt(ct(x))
    return f


def _tanh(ct):
    def f(x, y, z):
        return _math.tanh(ct(x))
    return f


def _sigmoid(ct):
    one = ct(1)

    def f(x, y, z):
        return one / (one + _math.exp(-ct(x)))
    return f


def _relu(ct):
    zero = ct(0)

    def f(x, y, z):
        u = ct(x)
        return zero if u < zero else u
    return f


def _gelu(ct):
    # The exact GELU, x * Phi(x), as PyTorch's default.
    half, one, inv_sqrt2 = ct(0.5), ct(1), ct(0.7071067811865476)

    def f(x, y, z):
        u = ct(x)
        return half * u * (one + _math.erf(u * inv_sqrt2))
    return f


def _copy(ct):
    def f(x, y, z):
        return x
    return f


def _with_compute(maker: Callable) -> Callable[[np.dtype], Callable]:
    return lambda dtype: maker(compute_type(dtype))


BINARY: dict[str, Callable[[np.dtype], Callable]] = {
    "add": _with_compute(_add),
    "sub": _with_compute(_sub),
    "mul": _with_compute(_mul),
    "div": lambda dtype: _div(compute_type(dtype), np.dtype(dtype).kind in "iu"),
    "maximum": _with_compute(_maximum),
    "minimum": _with_compute(_minimum),
    "pow": _with_compute(_pow),
}

UNARY: dict[str, Callable[[np.dtype], Callable]] = {
    "neg": _with_compute(_neg),
    "abs": _with_compute(_abs),
    "exp": _with_compute(_exp),
    "log": _with_compute(_log),
    "sqrt": _with_compute(_sqrt),
    "rsqrt": _with_compute(_rsqrt),
    "tanh": _with_compute(_tanh),
    "sigmoid": _with_compute(_sigmoid),
    "relu": _with_compute(_relu),
    "gelu": _with_compute(_gelu),
    "copy": _with_compute(_copy),
}


def axpy(dtype: np.dtype) -> Callable:
    """alpha * x + y, with alpha in the first slot."""
    ct = compute_type(dtype)

    def f(x, y, z):
        return ct(x) * ct(y) + ct(z)
    return f


def where(dtype: np.dtype) -> Callable:
    """y where x is nonzero, else z."""
    def f(x, y, z):
        return y if x else z
    return f


def astype(source: np.dtype, target: np.dtype) -> Callable:
    """x converted to ``target`` as the device converts (the backend's
    ``convert``: integers wrap, floats to integers saturate, NaN to 0);
    float16 goes through float32, which holds it exactly, since not every
    conversion from float16 exists on the device."""
    ct = compute_type(source)
    to = _backend.convert(target)

    def f(x, y, z):
        return to(ct(x))
    return f
