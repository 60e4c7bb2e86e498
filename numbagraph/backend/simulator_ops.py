"""What numbagraph.ops needs from the simulator besides recorded work
(zero fills and copies live beside the launches in ``simulator``): device
views of foreign arrays, the size of the simulated device, and the device's
math and conversions, which Python's own would break off with an exception."""

from __future__ import annotations

import contextlib
import math
import types
from typing import Any, Callable

import numpy as np
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

# Every simulated thread is a Python thread: small blocks keep launches quick.
THREADS_PER_BLOCK = 32

# Only Python kernels run here: a library's CUDA kernels (cuBLAS) cannot.
LIBRARY_KERNELS = False


class _HostView:
    """Exposes a foreign array's interface to NumPy and keeps its owner alive
    for as long as the NumPy view lives."""

    def __init__(self, interface: dict, owner: Any):
        self.owner = owner
        self.__array_interface__ = {
            "shape": tuple(interface["shape"]),
            "typestr": interface["typestr"],
            "data": tuple(interface["data"]),
            "strides": interface.get("strides"),
            "version": 3,
        }


def as_device_array(obj: Any) -> Any:
    """``obj`` as a simulated device array, or None if it is not one.

    Under the simulator, ``__cuda_array_interface__`` pointers are host
    pointers, so objects exposing it become views of that memory."""
    if getattr(obj, "__cuda_ndarray__", False):
        return obj
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is None:
        return None
    return FakeCUDAArray(np.asarray(_HostView(interface, obj)))


def device_memory_used() -> None:
    """Simulated arrays are host memory: there is no device memory to count."""
    return None


def current_device_id() -> int:
    """The simulator has one device."""
    return 0


def load4(a: Any, i: int) -> tuple:
    """Four elements from ``i``: the simulator reads them one by one."""
    return a[i], a[i + 1], a[i + 2], a[i + 3]


def store4(a: Any, i: int, v0: Any, v1: Any, v2: Any, v3: Any) -> None:
    """Four elements from ``i``, written one by one."""
    a[i] = v0
    a[i + 1] = v1
    a[i + 2] = v2
    a[i + 3] = v3


# ------------------------------------------------------------ math and conversions
#
# A simulated kernel is Python: math.log(-1.0) raises where the device gives
# NaN, and NumPy refuses to store 2**31 or NaN into an int32 array where the
# device wraps or saturates. These give the device's answers instead
# (docs/ops.md, Conversions).

def _ieee(ufunc: np.ufunc) -> Callable[[Any], Any]:
    """``ufunc`` of a scalar in its own float type, NaN and inf where IEEE
    arithmetic gives them, and no warning (the device gives none)."""
    def f(x: Any) -> Any:
        with np.errstate(all="ignore"):
            return ufunc(x)
    f.__name__ = ufunc.__name__
    return f


def _erf(x: Any) -> Any:
    # NumPy has no erf; Python's is defined for every float, NaN and inf
    # included, and its result is rounded once to the argument's type.
    kind = type(x) if isinstance(x, np.floating) else np.float64
    return kind(math.erf(x))


device_math = types.SimpleNamespace(
    exp=_ieee(np.exp), log=_ieee(np.log), sqrt=_ieee(np.sqrt), tanh=_ieee(np.tanh), erf=_erf)


def convert(dtype: np.dtype) -> Callable[[Any], Any]:
    """``v`` as ``dtype``'s scalar, converted as the device's cast converts
    it: what numba's cast compiles to on the driver (fptosi and kin, lowered
    by NVVM to PTX's ``cvt``, which saturates; 8-bit integers are converted
    to 16 bits, whose low byte the store keeps; NaN gives the top bit of
    the conversion alone from a float64 or into 64 bits, else 0, as the
    H200 does)."""
    dtype = np.dtype(dtype)
    kind = dtype.type
    if dtype.kind == "b":
        return lambda v: np.bool_(v != 0)  # NaN != 0: True, as on the device
    if dtype.kind not in "iu":
        def to_float(v: Any) -> Any:
            with np.errstate(all="ignore"):  # overflow gives inf, silently
                return kind(v)
        return to_float
    bits = 8 * dtype.itemsize
    width = max(bits, 16)
    signed = dtype.kind == "i"
    low = -(1 << (width - 1)) if signed else 0
    high = (1 << (width - 1)) - 1 if signed else (1 << width) - 1
    mask, sign = (1 << bits) - 1, 1 << (bits - 1)
    # NaN: the top bit of the conversion alone from a float64, or into 64
    # bits; 0 from a narrower float into 16 or 32 bits (as the H200 gives).
    top = 1 << (width - 1)

    def to_int(v: Any) -> Any:
        if isinstance(v, (int, np.integer, np.bool_)):
            n = int(v)
        else:
            f = float(v)  # exact for every float type; compared exactly below
            if f != f:
                n = top if width == 64 or isinstance(v, float) else 0
            else:
                n = high if f >= high else low if f <= low else int(f)
        n &= mask
        return kind(n - (n & sign) * 2 if signed else n)
    return to_int


def launch_limits() -> tuple[int, int]:
    """(multiprocessors, threads per block): one small simulated device."""
    return 1, THREADS_PER_BLOCK


# Numba's simulator has one device, ordinal 0; every stream and array is
# on it, and the bookkeeping above the backend is the driver's.

def device_count() -> int:
    """The simulator has one device."""
    return 1


def stream_device_id(stream: Any) -> int:
    """Every simulated stream belongs to device 0."""
    return 0


def array_device_id(dev: Any) -> int | None:
    """Every simulated device array lives on device 0."""
    return 0 if getattr(dev, "__cuda_ndarray__", False) else None


def pointer_device_id(pointer: int) -> int:
    """Every simulated address is memory of device 0."""
    return 0


def use_device(ordinal: int) -> Any:
    """Device 0 is always current; the simulator has no other."""
    if ordinal != 0:
        raise ValueError(f"the simulator has one device, 0; there is no device {ordinal}")
    return contextlib.nullcontext()
