"""Stream capture: record kernel launches on a stream into a graph.

While a stream captures, work enqueued on it is recorded instead of run:
numba launches (``kernel[grid, block, stream](...)``), numbagraph ops, and
DeviceScalar updates. Rules of capture:

* Nothing may allocate, copy to or from the host, or synchronise on the
  capturing stream: allocate before, read results after replay.
* Arrays passed to kernels must be device arrays; the graph keeps them alive.
* Kernel arguments are baked in; values that change between replays belong in
  a :class:`~numbagraph.DeviceScalar`.

:mod:`numbagraph.safety` enforces these rules; this module keeps the registry
of captures in progress that it consults, and ends the captures a refused
operation would have broken.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable

from .backend import active as _backend
from .errors import (
    CaptureError,
    CaptureInvalidatedError,
    CaptureStateError,
    NumbagraphError,
    translate_driver_error,
)
from .graph import CapturedGraph, watch_captures

__all__ = ["capture", "begin_capture", "end_capture", "is_capturing", "CAPTURE_MODES"]

CAPTURE_MODES = ("global", "thread_local", "relaxed")

_LEGACY_DEFAULT_HANDLES = (0, 1)


class _Session:
    """A capture in progress: the backend recording plus what it must keep."""

    __slots__ = (
        "stream", "handle", "mode", "recording", "keepalive", "thread",
        "_joins_legacy", "failure", "events",
    )

    def __init__(self, stream: Any, handle: int, mode: str):
        self.stream = stream
        self.handle = handle
        self.mode = mode
        self.keepalive: list = []
        self.thread = threading.get_ident()
        # Set when another thread's refused operation invalidated this
        # capture; the owning thread ends it at its next use.
        self.failure: BaseException | None = None
        self.events: weakref.WeakSet | None = None  # recorded inside; made on first use
        self._joins_legacy: bool | None = None
        # Holds numba's frees until released in _remove: a free during a
        # capture would break it.
        self.recording = _backend.Recording(handle, mode)

    @property
    def joins_legacy(self) -> bool:
        """Whether work on the legacy default stream waits on this stream,
        and so would join the capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
        Asked of the driver when first needed, not at every begin."""
        if self._joins_legacy is None:
            self._joins_legacy = _backend.joins_legacy_stream(self.handle)
        return self._joins_legacy

    def keep(self, obj: Any) -> None:
        self.keepalive.append(obj)


_sessions: dict[int, _Session] = {}
_sessions_lock = threading.Lock()
# handle -> the refused operation that ended the capture on that stream, so
# that end_capture can say why there is no graph.
_ended: dict[int, BaseException] = {}


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


_launch_validator: Callable[[int, Any, tuple], None] | None = None
_unchecked_types: set[type] = set()


def set_launch_validator(validate: Callable[[int, Any, tuple], None],
                         unchecked_types: set[type]) -> None:
    """Call ``validate(stream_handle, kernel, args)`` before kernel launches
    made while any capture is active; it raises to refuse the launch.

    ``validate`` refuses a launch for its stream (the legacy default stream,
    or one whose capture has failed) or for its arguments; ``unchecked_types``,
    a set it may grow, holds the argument types it never refuses. A launch
    with only such arguments on any other stream, the common case inside a
    capture, is not passed to it.
    """
    global _launch_validator, _unchecked_types
    _launch_validator = validate
    _unchecked_types = unchecked_types


def _on_launch(handle: int, kernel: Any, args: tuple) -> tuple:
    wrappers, unchecked = _device_wrappers, _unchecked_types
    check = wrapped = False
    for arg in args:
        kind = type(arg)
        if kind not in unchecked:
            check = True
        if kind in wrappers:
            wrapped = True
    if _sessions:
        session = _sessions.get(handle)
        if _launch_validator is not None and (
            check or handle in _LEGACY_DEFAULT_HANDLES
            or (session is not None and session.failure is not None)
        ):
            _launch_validator(handle, kernel, args)
        if session is not None:
            session.keepalive.append((kernel, args))
    if not wrapped:
        return args
    # Unwrapped once the launch is allowed (a Condition's unwrapping marks
    # it set); a loop, since a generator costs a launch ~0.2 us more.
    unwrapped = list(args)
    for i, arg in enumerate(unwrapped):
        unwrap = wrappers.get(type(arg))
        if unwrap is not None:
            unwrapped[i] = unwrap(arg)
    return tuple(unwrapped)


_backend.set_launch_hook(_on_launch)


def _handle_of(stream: Any) -> int:
    return _backend.stream_handle(stream)


def is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is capturing, by numbagraph or by anyone else."""
    handle = _handle_of(stream)
    if handle in _LEGACY_DEFAULT_HANDLES:
        # It never captures, and asking the driver about it while another
        # stream captures is itself an error.
        return False
    return handle in _sessions or _backend.is_capturing(handle)


# ---------------------------------------------------------------- registry

def active_sessions() -> list[_Session]:
    """The captures in progress, on every thread."""
    return list(_sessions.values())


def _remove(session: _Session) -> None:
    """Forget a session whose backend capture has ended."""
    with _sessions_lock:
        if _sessions.get(session.handle) is session:
            del _sessions[session.handle]
    session.recording.release_frees()
    if not _sessions:
        _run_deferred()


def _discard(session: _Session) -> None:
    """End a session's capture and drop what it recorded."""
    try:
        session.recording.abort()
    finally:
        session.keepalive = []
        _remove(session)


def _is_current(session: _Session) -> bool:
    return _sessions.get(session.handle) is session


def invalidate(sessions: Iterable[_Session], error: BaseException) -> None:
    """End the captures that a refused operation would have broken.

    Captures begun on this thread end now and their graphs are discarded.
    CUDA lets only the beginning thread end a capture in mode "global" or
    "thread_local", so a capture of another thread is marked instead: its
    thread's next launch on the stream, or its end_capture, ends it and
    raises CaptureInvalidatedError.
    """
    me = threading.get_ident()
    for session in sessions:
        if session.thread == me:
            with _sessions_lock:
                current = _is_current(session)
                if current:
                    _ended[session.handle] = error
            if current:
                _discard(session)
        elif session.failure is None:
            session.failure = error


def consequence(sessions: Iterable[_Session]) -> str:
    """What :func:`invalidate` does to ``sessions``, for error messages."""
    me = threading.get_ident()
    own = [repr(s.stream) for s in sessions if s.thread == me]
    other = [repr(s.stream) for s in sessions if s.thread != me]
    parts = []
    if own:
        parts.append(
            f"The capture on {', '.join(own)} was ended and its graph discarded; "
            "the stream is usable and a new capture may begin."
        )
    if other:
        parts.append(
            f"The capture on {', '.join(other)}, begun by another thread, was "
            "invalidated: its next launch or end_capture there raises "
            "CaptureInvalidatedError."
        )
    return " ".join(parts)


def raise_if_invalidated(session: _Session) -> None:
    """End ``session`` and raise if another thread's refused operation
    invalidated it (see :func:`invalidate`)."""
    failure = session.failure
    if failure is None:
        return
    if session.mode != "relaxed" and session.thread != threading.get_ident():
        return  # only the owning thread may end it
    with _sessions_lock:
        current = _is_current(session)
    if current:
        _discard(session)
    raise CaptureInvalidatedError(
        f"the capture on {session.stream!r} was invalidated by an operation "
        f"refused on another thread ({failure}). It has been ended and its "
        "graph discarded; begin a new capture once the other thread no longer "
        "makes that call"
    ) from failure


# Releases that may call the driver in ways CUDA forbids during a capture
# (destroying graphs, freeing memory), waiting for no capture to be active.
_deferred: list[Callable[[], None]] = []


def release_when_idle(free: Callable[[], None]) -> None:
    """Run ``free()`` now if no capture is active, else once the last one
    ends. Safe to call from finalizers, on any thread."""
    _deferred.append(free)
    _run_deferred()


watch_captures(_sessions, release_when_idle)


def _run_deferred() -> None:
    while _deferred and not _sessions:
        # Never block: this runs from finalizers, which may fire while this
        # very thread holds the lock. Whoever holds it runs these after.
        if not _sessions_lock.acquire(blocking=False):
            return
        try:
            if _sessions:
                return
            pending = _deferred[:]
            del _deferred[: len(pending)]
            for free in pending:
                try:
                    free()
                except Exception:  # noqa: BLE001  a failed free must not stop the rest
                    pass
        finally:
            _sessions_lock.release()


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
        raise CaptureStateError(
            f"cannot capture on {stream!r}, the legacy default stream: CUDA "
            "forbids it. Create a stream with cuda.stream(), launch the work "
            "on it and capture that stream"
        )
    _run_deferred()
    with _sessions_lock:
        existing = _sessions.get(handle)
        if existing is None:
            if _backend.is_capturing(handle):
                raise CaptureStateError(
                    f"{stream!r} is already capturing, in a capture begun outside "
                    "numbagraph; end that capture before beginning one here"
                )
            _ended.pop(handle, None)
            try:
                _sessions[handle] = _Session(stream, handle, mode)
            except Exception as exc:
                error = translate_driver_error(exc, repr(stream)) or CaptureError(
                    f"could not begin capture on {stream!r}: {exc}"
                )
                raise error from exc
            return
    error = CaptureStateError(
        f"begin_capture({stream!r}) was called while that stream is already "
        "capturing: captures cannot nest on one stream. End the first capture "
        "(ng.end_capture or the end of its `with` block) before beginning "
        "another. " + consequence([existing])
    )
    invalidate([existing], error)
    raise error


def _session_to_end(stream: Any) -> _Session:
    """The capture on ``stream`` that this thread may end, or the error that
    says why there is none."""
    handle = _handle_of(stream)
    session = _sessions.get(handle)
    if session is None:
        with _sessions_lock:
            failure = _ended.pop(handle, None)
        if failure is not None:
            raise CaptureInvalidatedError(
                f"the capture on {stream!r} was already ended, and its graph "
                f"discarded, when an operation that cannot be captured was "
                f"refused: {failure}"
            ) from failure
        raise CaptureStateError(
            f"{stream!r} is not capturing: call ng.begin_capture(stream) first, "
            "or use `with ng.capture(stream) as cap:`"
        )
    if session.mode != "relaxed" and session.thread != threading.get_ident():
        error = CaptureStateError(
            f"the capture on {stream!r} was begun by another thread in mode "
            f"{session.mode!r}, and CUDA lets only that thread end it "
            "(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD). End it on the thread "
            "that began it, or capture with mode='relaxed'. "
            + consequence([session])
        )
        invalidate([session], error)
        raise error
    raise_if_invalidated(session)
    return session


def end_capture(stream: Any) -> CapturedGraph:
    """Stop recording on ``stream`` and return the instantiated graph.

    Raises CaptureInvalidatedError, with no graph, when an operation refused
    during the capture ended it.
    """
    session = _session_to_end(stream)
    try:
        # CUDA refuses to instantiate while another capture is active; the
        # graph then instantiates on first use.
        executable = session.recording.finish(instantiate=len(_sessions) == 1)
    except Exception as exc:
        # The backend ended (and discarded) the capture before raising.
        session.keepalive = []
        _remove(session)
        translated = translate_driver_error(exc, repr(stream))
        if translated is not None:
            raise translated from exc
        if isinstance(exc, NumbagraphError):
            raise
        raise CaptureError(
            f"the capture on {stream!r} failed and was discarded: {exc}. "
            "The stream is usable and a new capture may begin"
        ) from exc
    _remove(session)
    return CapturedGraph(executable, session.stream, session.handle, session.keepalive)


def abort_capture(stream: Any) -> None:
    """End the capture on ``stream`` and discard what it recorded."""
    handle = _handle_of(stream)
    session = _sessions.get(handle)
    if session is None:
        with _sessions_lock:
            _ended.pop(handle, None)
        raise CaptureStateError(f"{stream!r} is not capturing")
    _discard(session)


class capture:
    """Record the work enqueued on ``stream`` inside the block into a graph.

    ``mode`` says where the calls CUDA deems unsafe during capture
    (allocation, pinning host memory) are refused: ``"global"`` (on every
    thread), ``"thread_local"`` (on this thread; the default) or
    ``"relaxed"`` (nowhere). In every mode, calls that would break the
    capture itself (synchronising it, host copies on it, host arrays passed
    to its kernels, work on the legacy default stream) raise a
    :class:`~numbagraph.errors.UncapturableOperationError` and end it.

    If the block raises, the capture is discarded, the stream is left usable
    and the exception propagates; a driver ``CUDA_ERROR_STREAM_CAPTURE_*``
    error is translated into the matching :class:`CaptureError`.

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
        if isinstance(exc, Exception):
            translated = translate_driver_error(exc, repr(self.stream))
            if translated is not None:
                raise translated from exc
        return False
