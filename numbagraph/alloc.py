"""Allocation helpers for outputs, made before a capture begins.

A graph cannot allocate: every array its ops write must exist before the
capture starts. These helpers make C-contiguous numba device arrays and
follow numbagraph's one allocation rule (docs/capture.md): refused, with
AllocationInCaptureError, on the thread of a "thread_local" or "global"
capture and everywhere during a "global" one, before anything is allocated.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .backend import active as _backend
from .capture import is_capturing
from .errors import OpError
from .safety import guard_allocation, guard_legacy_work

__all__ = ["empty", "zeros", "empty_like", "zeros_like"]

Shape = int | tuple[int, ...]


def _shape(shape: Shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise OpError(f"shape {shape!r} must be non-negative integers")
    return tuple(int(d) for d in shape)


def empty(shape: Shape, dtype: Any = np.float64, *, stream: Any = 0) -> Any:
    """A new C-contiguous device array, uninitialised.

    Parameters
    ----------
    shape
        An int, or a tuple of ints.
    dtype
        Any NumPy dtype.
    stream
        The stream the allocation is made for.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``shape`` is not a non-negative integer or a tuple of them.
    TypeError
        ``dtype`` is not a NumPy dtype, or ``stream`` is not a stream.
    AllocationInCaptureError
        This thread may not allocate now: it runs a "thread_local" or
        "global" capture, or any thread runs a "global" one, or ``stream``
        captures outside numbagraph. Nothing is allocated, and the captures
        that forbid it are ended.

    Examples
    --------
    ```python
    out = ng.empty((4, 1024), np.float32)
    ```
    """
    shape, dtype = _shape(shape), np.dtype(dtype)
    guard_allocation("ng.empty()", _backend.stream_handle(stream))
    return cuda.device_array(shape, dtype, stream=stream)


def zeros(shape: Shape, dtype: Any = np.float64, *, stream: Any = 0) -> Any:
    """A new C-contiguous device array of zeros, filled on ``stream``.

    Parameters
    ----------
    shape
        An int, or a tuple of ints.
    dtype
        Any NumPy dtype.
    stream
        The stream the zeros are written on; not a capturing one.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``shape`` is not a non-negative integer or a tuple of them; or
        ``stream`` captures, so the fill would be recorded into the graph
        instead of run: pass another stream, or allocate with
        [empty][numbagraph.empty] and record
        [fill_into][numbagraph.fill_into] to zero it at every replay.
    TypeError
        ``dtype`` is not a NumPy dtype, or ``stream`` is not a stream.
    AllocationInCaptureError
        As [empty][numbagraph.empty]: this thread may not allocate now.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.

    Examples
    --------
    ```python
    cache = ng.zeros((max_len, dim), np.float32, stream=s)
    ```
    """
    shape, dtype, handle = _shape(shape), np.dtype(dtype), _backend.stream_handle(stream)
    guard_allocation("ng.zeros()", handle)
    if is_capturing(stream):
        raise OpError(
            f"ng.zeros(stream={stream!r}) cannot fill the array now: the stream "
            "captures, so the fill would be recorded into the graph instead of "
            "run. Pass another stream (the array is made at once), or allocate "
            "with ng.empty and record ng.fill_into(out, 0, stream=s) to zero it "
            "at every replay"
        )
    guard_legacy_work(handle, "ng.zeros() filling on the legacy default stream",
                      "pass stream= a stream from cuda.stream()")
    array = cuda.device_array(shape, dtype, stream=stream)
    _backend.memset_zero(array, handle)
    return array


def _like(a: Any) -> tuple[tuple[int, ...], np.dtype]:
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is None or dtype is None:
        raise OpError(f"{type(a).__name__} has no shape and dtype to copy")
    return tuple(shape), np.dtype(dtype)


def empty_like(a: Any, dtype: Any = None, *, stream: Any = 0) -> Any:
    """An uninitialised device array with ``a``'s shape and dtype (or ``dtype``).

    Parameters
    ----------
    a
        Anything with ``shape`` and ``dtype``: a device or NumPy array.
    dtype
        The new array's dtype; ``a``'s when None.
    stream
        The stream the allocation is made for.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``a`` has no ``shape`` and ``dtype``.
    AllocationInCaptureError
        As [empty][numbagraph.empty]: this thread may not allocate now.

    Examples
    --------
    ```python
    out = ng.empty_like(x)
    ```
    """
    shape, own = _like(a)
    return empty(shape, own if dtype is None else dtype, stream=stream)


def zeros_like(a: Any, dtype: Any = None, *, stream: Any = 0) -> Any:
    """A device array of zeros with ``a``'s shape and dtype (or ``dtype``).

    Parameters
    ----------
    a
        Anything with ``shape`` and ``dtype``: a device or NumPy array.
    dtype
        The new array's dtype; ``a``'s when None.
    stream
        The stream the zeros are written on; not a capturing one.

    Returns
    -------
    DeviceNDArray
        A numba device array.

    Raises
    ------
    OpError
        ``a`` has no ``shape`` and ``dtype``, or ``stream`` captures.
    AllocationInCaptureError
        As [empty][numbagraph.empty]: this thread may not allocate now.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.

    Examples
    --------
    ```python
    grad = ng.zeros_like(w, stream=s)
    ```
    """
    shape, own = _like(a)
    return zeros(shape, own if dtype is None else dtype, stream=stream)
