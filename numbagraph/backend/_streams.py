"""Stream handles, the same on both backends: an integer per stream."""

from __future__ import annotations

import threading
from typing import Any, Hashable

NAMED_HANDLES = (0, 1, 2)
"""The streams an integer may name: the default, the legacy default and the
per-thread default stream, whose handles are the same in every process."""

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
        if stream in NAMED_HANDLES:
            return stream
        raise TypeError(
            f"{stream} is a bare integer, which numbagraph does not take as a "
            "stream: the driver cannot tell a stream handle from another number "
            "without crashing the process. Pass the stream object (cuda.stream(), "
            "or any object with __cuda_stream__), or wrap a handle from another "
            f"library as cuda.external_stream({stream:#x}). The integers 0, 1 and "
            "2 name the default, legacy default and per-thread default streams"
        )
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    # PyTorch and CuPy streams of versions without __cuda_stream__ give
    # their raw handle under their own names.
    library = type(stream).__module__
    if library.startswith("torch.cuda") and isinstance(getattr(stream, "cuda_stream", None), int):
        return int(stream.cuda_stream)
    if library.startswith("cupy.cuda") and isinstance(getattr(stream, "ptr", None), int):
        return int(stream.ptr)
    handle = getattr(stream, "handle", None)
    if handle is None:
        raise TypeError(
            f"{type(stream).__name__} is not a CUDA stream: pass a numba stream "
            "(cuda.stream()), cuda.external_stream(ptr), or an object with "
            "__cuda_stream__"
        )
    return int(handle)
