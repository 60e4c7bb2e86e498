"""Stream capture: record kernel launches on a stream into a graph.

While a stream captures, work enqueued on it is recorded instead of run:
numba launches (``kernel[grid, block, stream](...)``), numbagraph ops, and
DeviceScalar updates. Rules of capture:

* Nothing may allocate, copy to or from the host, or synchronise on the
  capturing stream: allocate before, read results after replay.
* Arrays passed to kernels must be device arrays; the graph keeps them alive.
* Kernel arguments are baked in; values that change between replays belong in
  a :class:`~numbagraph.DeviceScalar`.
"""

from __future__ import annotations

import threading
from typing import Any

from .backend import active as _backend
from .errors import CaptureError
from .graph import CapturedGraph

__all__ = ["capture", "begin_capture", "end_capture", "is_capturing", "CAPTURE_MODES"]

CAPTURE_MODES = ("global", "thread_local", "relaxed")

_LEGACY_DEFAULT_HANDLES = (0, 1)


class _Session:
    """A capture in progress: the backend recording plus what it must keep."""

    __slots__ = ("stream", "handle", "mode", "recording", "keepalive")

    def __init__(self, stream: Any, handle: int, mode: str):
        self.stream = stream
        self.handle = handle
        self.mode = mode
        self.keepalive: list = []
        self.recording = _backend.Recording(handle, mode)

    def keep(self, obj: Any) -> None:
        self.keepalive.append(obj)


_sessions: dict[int, _Session] = {}
_sessions_lock = threading.Lock()


def recording_for(handle: int) -> _Session | None:
    """The capture in progress on the stream with this handle, if any."""
    return _sessions.get(handle)


# Types passed to kernels in place of the device array they wrap; unwrapping
# them here spares numba a __cuda_array_interface__ round trip per launch.
_device_wrappers: dict[type, Any] = {}


def register_device_wrapper(cls: type, unwrap: Any) -> None:
    """Launch kernels with ``unwrap(obj)`` wherever an instance of ``cls``
    is passed."""
    _device_wrappers[cls] = unwrap


def _on_launch(handle: int, kernel: Any, args: tuple) -> tuple:
    session = _sessions.get(handle)
    if session is not None:
        session.keepalive.append((kernel, args))
    wrappers = _device_wrappers
    for arg in args:
        if type(arg) in wrappers:
            return tuple(
                wrappers[type(a)](a) if type(a) in wrappers else a for a in args
            )
    return args


_backend.set_launch_hook(_on_launch)


def _handle_of(stream: Any) -> int:
    return _backend.stream_handle(stream)


def is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is capturing, by numbagraph or by anyone else."""
    handle = _handle_of(stream)
    return handle in _sessions or _backend.is_capturing(handle)


def begin_capture(stream: Any, *, mode: str = "thread_local") -> None:
    """Start recording the work enqueued on ``stream``; see :func:`capture`.

    Prefer the ``with ng.capture(stream)`` form, which also ends the capture
    when the block raises.
    """
    if mode not in CAPTURE_MODES:
        raise ValueError(
            f"capture mode {mode!r} is not one of {', '.join(CAPTURE_MODES)}"
        )
    handle = _handle_of(stream)
    if handle in _LEGACY_DEFAULT_HANDLES:
        raise CaptureError(
            "cannot capture on the legacy default stream: CUDA forbids it. "
            "Create a stream with cuda.stream() and launch on it"
        )
    with _sessions_lock:
        if handle in _sessions or _backend.is_capturing(handle):
            raise CaptureError(
                f"{stream!r} is already capturing; end that capture "
                "(ng.end_capture) before starting another on the same stream"
            )
        try:
            _sessions[handle] = _Session(stream, handle, mode)
        except Exception as exc:
            raise CaptureError(f"could not begin capture on {stream!r}: {exc}") from exc


def _take_session(stream: Any) -> _Session:
    handle = _handle_of(stream)
    with _sessions_lock:
        session = _sessions.pop(handle, None)
    if session is None:
        raise CaptureError(
            f"{stream!r} is not capturing: call ng.begin_capture(stream) first, "
            "or use `with ng.capture(stream) as cap:`"
        )
    return session


def end_capture(stream: Any) -> CapturedGraph:
    """Stop recording on ``stream`` and return the instantiated graph."""
    session = _take_session(stream)
    try:
        # CUDA refuses to instantiate while another capture is active; the
        # graph then instantiates on first use.
        executable = session.recording.finish(instantiate=not _sessions)
    except Exception as exc:
        raise CaptureError(
            f"the capture on {stream!r} failed and was discarded: {exc}. "
            "An operation that cannot be captured ran while it was active; the "
            "stream is usable and a new capture may begin"
        ) from exc
    return CapturedGraph(executable, session.stream, session.handle, session.keepalive)


def abort_capture(stream: Any) -> None:
    """End the capture on ``stream`` and discard what it recorded."""
    _take_session(stream).recording.abort()


class capture:
    """Record the work enqueued on ``stream`` inside the block into a graph.

    ``mode`` says which other CUDA calls are refused while capturing:
    ``"global"`` (unsafe calls from any thread), ``"thread_local"`` (from this
    thread; the default) or ``"relaxed"`` (none).

    If the block raises, the capture is discarded, the stream is left usable
    and the exception propagates.

    Example::

        step[4, 256, s](x, pos)          # compile outside capture
        with ng.capture(s) as cap:
            for _ in range(10):
                step[4, 256, s](x, pos)  # recorded, not run
        cap.graph.launch()               # all 10 in one submission
    """

    def __init__(self, stream: Any, *, mode: str = "thread_local"):
        self.stream = stream
        self.mode = mode
        self._graph: CapturedGraph | None = None

    @property
    def graph(self) -> CapturedGraph:
        """The captured graph, once the block has ended."""
        if self._graph is None:
            raise CaptureError("the graph exists once the `with ng.capture(...)` block ends")
        return self._graph

    def __enter__(self) -> "capture":
        begin_capture(self.stream, mode=self.mode)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._graph = end_capture(self.stream)
            return False
        try:
            abort_capture(self.stream)
        except CaptureError:
            pass  # already ended by whatever raised
        return False
