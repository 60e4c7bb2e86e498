"""Stream handles, the same on both backends: an integer per stream."""

from __future__ import annotations

import threading
from typing import Any, Hashable

PER_THREAD_HANDLE = 2
"""CU_STREAM_PER_THREAD: one handle that names a different stream, the
per-thread default stream, on every thread."""


def capture_key(handle: int) -> Hashable:
    """What a capture on the stream ``handle`` is known by: the handle, or
    for the per-thread default stream the handle and the calling thread,
    since each thread's per-thread default stream captures on its own."""
    if handle == PER_THREAD_HANDLE:
        return (handle, threading.current_thread())
    return handle


def stream_handle(stream: Any) -> int:
    """The raw ``CUstream`` address of a numba, cuda.core or foreign stream
    (on the simulator, the integer handle numbagraph gives its streams)."""
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    handle = getattr(stream, "handle", None)
    if handle is None:
        raise TypeError(
            f"{type(stream).__name__} is not a CUDA stream: pass a numba stream "
            "(cuda.stream()), cuda.external_stream(ptr), or an object with "
            "__cuda_stream__"
        )
    return int(handle)
