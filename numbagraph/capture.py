"""Stream capture: record kernel launches on a stream into a graph.

While a stream captures, work enqueued on it is recorded instead of run:
numba launches (``kernel[grid, block, stream](...)``), numbagraph ops, and
DeviceScalar updates. Rules of capture:

* Nothing may allocate, copy to or from the host, or synchronise on the
  capturing stream: allocate before, read results after replay.
* Arrays passed to kernels must be device arrays; the graph keeps them alive.
* Kernel arguments are baked in; values that change between replays belong in
  a :class:`~numbagraph.DeviceScalar`.

:mod:`numbagraph.safety` enforces these rules. This module begins and ends
captures; :mod:`numbagraph._registry` holds the captures in progress.
"""

from __future__ import annotations

import atexit
import sys
import warnings
from typing import Any, Literal

from . import _graphmem, _hostcalls, _registry
from ._registry import LEGACY_DEFAULT_HANDLES, consequence, invalidate
from .backend import active as _backend
from .errors import (
    CaptureError,
    CaptureInvalidatedError,
    CaptureStateError,
    CaptureWarning,
    DeviceMismatchError,
    NumbagraphError,
    translate_driver_error,
)
from .graph import CapturedGraph

__all__ = ["capture", "begin_capture", "end_capture", "abort_capture", "is_capturing",
           "CAPTURE_MODES"]

CAPTURE_MODES = ("global", "thread_local", "relaxed")


def is_capturing(stream: Any) -> bool:
    """Whether ``stream`` is capturing, by numbagraph or by anyone else.

    Parameters
    ----------
    stream
        A numba or cuda.core stream, an object with ``__cuda_stream__``, or
        0, 1 or 2 (the default, legacy default and per-thread default
        streams).

    Returns
    -------
    bool
        False for the legacy default stream, which never captures.

    Raises
    ------
    TypeError
        ``stream`` is not a stream.

    Examples
    --------
    ```python
    with ng.capture(s):
        assert ng.is_capturing(s)
    ```
    """
    handle = _backend.stream_handle(stream)
    if handle in LEGACY_DEFAULT_HANDLES:
        # It never captures, and asking the driver about it while another
        # stream captures is itself an error.
        return False
    return _registry.on(handle) is not None or _backend.is_capturing(handle)


def begin_capture(stream: Any, *, mode: str = "thread_local") -> None:
    """Start recording the work enqueued on ``stream``; see
    [capture][numbagraph.capture.capture].

    Prefer the ``with ng.capture(stream)`` form, which also ends the capture
    when the block raises.

    Parameters
    ----------
    stream
        The stream to capture: a numba or cuda.core stream, or an object
        with ``__cuda_stream__``.
    mode
        Where the calls CUDA deems unsafe during capture (allocation,
        pinning host memory) are refused: ``"global"`` (on every thread),
        ``"thread_local"`` (on this thread; the default) or ``"relaxed"``
        (nowhere); one of [CAPTURE_MODES][numbagraph.CAPTURE_MODES].

    Raises
    ------
    ValueError
        ``mode`` is not one of [CAPTURE_MODES][numbagraph.CAPTURE_MODES].
    TypeError
        ``stream`` is not a stream.
    CaptureStateError
        ``stream`` is the legacy default stream, which CUDA forbids
        capturing; or it already captures: captures do not nest on one
        stream, so a capture numbagraph began there is ended, its graph
        discarded, while one another library began (``torch.cuda.graph``,
        a cuda.core ``GraphBuilder``) goes on, and records the work
        launched on the stream as it is.
    CaptureError
        The driver could not begin the capture (a driver
        ``CUDA_ERROR_STREAM_CAPTURE_*`` error is raised as the matching
        subclass).
    DeviceMismatchError
        ``stream`` belongs to another device than the current one; make its
        device current (``with cuda.gpus[i]:``) for the capture.
    CudaInHostCallbackError
        Called from inside a host callback.

    Examples
    --------
    ```python
    ng.begin_capture(s)
    step[4, 256, s](x, pos)
    graph = ng.end_capture(s)
    ```
    """
    if mode not in CAPTURE_MODES:
        raise ValueError(
            f"capture mode {mode!r} is not one of {', '.join(CAPTURE_MODES)}"
        )
    handle = _backend.stream_handle(stream)
    if _hostcalls.attention[0]:
        _hostcalls.refuse_here("beginning a capture")
    if handle in LEGACY_DEFAULT_HANDLES:
        raise CaptureStateError(
            f"cannot capture on {stream!r}, the legacy default stream: CUDA "
            "forbids it. Create a stream with cuda.stream(), launch the work "
            "on it and capture that stream"
        )
    device = _current_device_of(stream)
    where = _user_line()
    _registry.forget_orphans()
    _registry.run_deferred()
    if mode == "global":
        with _registry.no_unsafe_calls:
            _begin(stream, handle, mode, device, where)
    else:
        # Only this thread's calls are forbidden, and it makes none meanwhile.
        _begin(stream, handle, mode, device, where)


def _user_line() -> tuple[str, int] | None:
    """(file, line) of the innermost caller outside numbagraph: the user's
    `with ng.capture`, ``begin_capture`` or graphed call that begins a
    capture. A few frames walked, for the warning of a program that ends
    with the capture open."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name != "numbagraph" and not name.startswith("numbagraph."):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


def _current_device_of(stream: Any) -> int:
    """The ordinal of the device ``stream`` belongs to, once sure it is the
    current device: the kernels launched in the capture are compiled for
    the current device, and the driver records them only onto a stream of
    it."""
    device = _backend.stream_device_id(stream)
    if _backend.device_count() > 1:
        current = _backend.current_device_id()
        if device != current:
            raise DeviceMismatchError(
                f"cannot capture on {stream!r}, a stream of device {device}, while device "
                f"{current} is current: the capture would compile and record its "
                f"kernels for device {current}. Make device {device} current for "
                f"the capture: `with cuda.gpus[{device}]: with ng.capture(s): ...` "
                f"(or cuda.select_device({device}))")
    return device


def _begin(stream: Any, handle: int, mode: str, device: int,
           where: tuple[str, int] | None) -> None:
    with _registry.lock:
        existing = _registry.on(handle)
        if existing is None:
            if _backend.is_capturing(handle):
                reason = _registry.take_ended(handle, locked=True)
                raise CaptureStateError(
                    f"{stream!r} is already capturing: {reason}" if reason else
                    f"{stream!r} is already capturing, in a capture begun outside "
                    "numbagraph (torch.cuda.graph, a cuda.core GraphBuilder, CuPy's "
                    "begin_capture, ...), and captures do not nest on one stream. Work "
                    "enqueued on the stream now is recorded into that capture as it is: "
                    "launch numba kernels and numbagraph ops on it without ng.capture, "
                    "and the other library's graph holds them; or end that capture "
                    "before beginning one here. Nothing was begun; the other capture "
                    "goes on"
                )
            try:
                session = _registry.add(stream, handle, mode)
                session.device, session.begun_at = device, where
            except Exception as exc:
                error = translate_driver_error(exc, repr(stream)) or CaptureError(
                    f"could not begin capture on {stream!r}: {exc}"
                )
                raise error from exc
            return
    forked = (f" (forked into the capture on {existing.stream!r})"
              if _registry.key_of(handle) != existing.key else "")
    error = CaptureStateError(
        f"begin_capture({stream!r}) was called while that stream is already "
        f"capturing{forked}: captures cannot nest on one stream. End the first capture "
        "(ng.end_capture or the end of its `with` block) before beginning "
        "another. " + consequence([existing])
    )
    invalidate([existing], error)
    raise error


def _refuse_fork(session: _registry.Session, handle: int, stream: Any, verb: str) -> None:
    """Refuse to end (``verb``) a capture through a stream forked into it:
    CUDA ends a capture on the stream that began it. The capture goes on."""
    if _registry.key_of(handle) != session.key:
        raise CaptureStateError(
            f"{stream!r} is forked into the capture on {session.stream!r}, which only "
            f"that stream can {verb} (CUDA_ERROR_STREAM_CAPTURE_UNMATCHED): "
            f"{verb} the capture on {session.stream!r}, once {stream!r} is joined back "
            "into it. The capture goes on")


def _session_to_end(stream: Any) -> _registry.Session:
    """The capture on ``stream`` that this thread may end, or the error that
    says why there is none."""
    handle = _backend.stream_handle(stream)
    session = _registry.on(handle)
    if session is None:
        failure = _registry.take_ended(handle)
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
    _refuse_fork(session, handle, stream, "end")
    if not session.may_end_here:
        error = CaptureStateError(
            f"the capture on {stream!r} was begun by another thread in mode "
            f"{session.mode!r}, and CUDA lets only that thread end it "
            "(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD). End it on the thread "
            "that began it, or capture with mode='relaxed'. "
            + consequence([session])
        )
        invalidate([session], error)
        raise error
    _registry.raise_if_invalidated(session)
    return session


def end_capture(stream: Any) -> CapturedGraph:
    """Stop recording on ``stream`` and return the instantiated graph.

    Parameters
    ----------
    stream
        The capturing stream, as given to
        [begin_capture][numbagraph.begin_capture].

    Returns
    -------
    CapturedGraph
        The graph of everything recorded on ``stream`` since the capture
        began.

    Raises
    ------
    TypeError
        ``stream`` is not a stream.
    CaptureStateError
        ``stream`` is not capturing; or another thread began its capture in
        mode "thread_local" or "global", and CUDA lets only that thread end
        it (the capture is then ended, its graph discarded); or another
        thread ended the capture meanwhile.
    CaptureInvalidatedError
        With no graph, when an operation refused during the capture ended
        it, on this thread or another.
    ConditionalError
        The capture ends inside a conditional block, a block could not be
        recorded, or a Condition made in it drives no block; the capture is
        discarded.
    CaptureError
        The capture failed and was discarded (a driver
        ``CUDA_ERROR_STREAM_CAPTURE_*`` error is raised as the matching
        subclass). The stream is usable and a new capture may begin.

    Warns
    -----
    CaptureWarning
        The capture recorded nothing: the work was most likely launched on
        another stream.

    Examples
    --------
    ```python
    ng.begin_capture(s)
    step[4, 256, s](x, pos)
    graph = ng.end_capture(s)
    graph.launch()
    ```
    """
    session = _session_to_end(stream)
    # Under the lock, this thread alone ends the capture (a "relaxed" one may
    # be aborted from any thread), and no capture begins between the count
    # below and the end.
    with _registry.lock:
        if not _registry.claim(session):
            raise CaptureStateError(
                f"the capture on {stream!r} was ended by another thread while "
                "this one ended it; there is no graph"
            )
        failure: Exception | None = None
        try:
            # CUDA refuses to instantiate while another capture is active;
            # the graph then instantiates on first use.
            executable = session.recording.finish(
                instantiate=session.instantiate and len(_registry.active()) == 1)
            if session.memory is not None:
                session.memory.phase = _graphmem.CAPTURED
        except Exception as exc:
            failure = exc
            session.keepalive = []
        finally:
            _registry.ended(session, locked=True)
    _registry.run_deferred()
    if failure is not None:
        # The backend ended (and discarded) the capture before raising.
        exc = failure
        translated = translate_driver_error(exc, repr(stream))
        if translated is not None:
            raise translated from exc
        if isinstance(exc, NumbagraphError):
            raise exc
        raise CaptureError(
            f"the capture on {stream!r} failed and was discarded: {exc}. "
            "The stream is usable and a new capture may begin"
        ) from exc
    graph = CapturedGraph(executable, session.stream, session.handle, session.keepalive,
                          session.memory, device=session.device)
    if not session.keepalive and executable.num_nodes == 0:
        warnings.warn(
            f"the capture on {stream!r} recorded nothing: no kernel, op, copy or "
            "DeviceScalar update was enqueued on that stream while it captured. "
            "Were the launches made on another stream? Launch them on the "
            "capturing stream (kernel[grid, block, s](...), ops with stream=s)",
            CaptureWarning, stacklevel=2,
        )
    return graph


def abort_capture(stream: Any) -> None:
    """End the capture on ``stream`` and discard what it recorded: no graph
    is made, and the stream is usable at once. What the ``with ng.capture``
    block does when its body raises.

    Parameters
    ----------
    stream
        The capturing stream.

    Raises
    ------
    TypeError
        ``stream`` is not a stream.
    CaptureStateError
        When the stream is not capturing, or when another thread began the
        capture in mode "thread_local" or "global" (CUDA lets only that
        thread end it); the capture is left as it was.

    Examples
    --------
    ```python
    ng.begin_capture(s)
    try:
        step[4, 256, s](x, pos)
    except Exception:
        ng.abort_capture(s)
        raise
    ```
    """
    handle = _backend.stream_handle(stream)
    session = _registry.on(handle)
    if session is None:
        _registry.take_ended(handle)
        raise CaptureStateError(f"{stream!r} is not capturing")
    _refuse_fork(session, handle, stream, "abort")
    if not session.may_end_here:
        raise CaptureStateError(
            f"the capture on {stream!r} was begun by another thread in mode "
            f"{session.mode!r}, and CUDA lets only that thread end it; abort it "
            "there, or capture with mode='relaxed'. The capture goes on"
        )
    _registry.discard(session)


class capture:
    """Record the work enqueued on ``stream`` inside the block into a graph.

    ``mode`` says where the calls CUDA deems unsafe during capture
    (allocation, pinning host memory) are refused: ``"global"`` (on every
    thread), ``"thread_local"`` (on this thread; the default) or
    ``"relaxed"`` (nowhere). In every mode, calls that would break the
    capture itself (synchronising it, host copies on it, host arrays passed
    to its kernels, work on the legacy default stream) raise a
    [UncapturableOperationError][numbagraph.UncapturableOperationError] and
    end it.

    If the block raises, the capture is discarded, the stream is left usable
    and the exception propagates; a driver ``CUDA_ERROR_STREAM_CAPTURE_*``
    error is translated into the matching
    [CaptureError][numbagraph.CaptureError].

    Parameters
    ----------
    stream
        The stream to capture: a numba or cuda.core stream, or an object
        with ``__cuda_stream__``.
    mode
        Where the calls CUDA deems unsafe during capture (allocation,
        pinning host memory) are refused: ``"global"`` (on every thread),
        ``"thread_local"`` (on this thread; the default) or ``"relaxed"``
        (nowhere); one of [CAPTURE_MODES][numbagraph.CAPTURE_MODES].

    Raises
    ------
    ValueError
        Entering the block: ``mode`` is not one of
        [CAPTURE_MODES][numbagraph.CAPTURE_MODES].
    TypeError
        Entering the block: ``stream`` is not a stream.
    CaptureStateError
        Entering the block, as [begin_capture][numbagraph.begin_capture]
        says; leaving it, as [end_capture][numbagraph.end_capture] says.
    CaptureInvalidatedError
        Leaving the block, with no graph: an operation refused during the
        capture ended it.
    ConditionalError
        Leaving the block, as [end_capture][numbagraph.end_capture] says.
    CaptureError
        The capture could not begin or failed as it ended; a driver
        ``CUDA_ERROR_STREAM_CAPTURE_*`` error raised in the block is raised
        as the matching subclass.

    Examples
    --------
    ```python
    step[4, 256, s](x, pos)          # compile outside capture
    with ng.capture(s) as cap:
        for _ in range(10):
            step[4, 256, s](x, pos)  # recorded, not run
    cap.graph.launch()               # all 10 in one submission
    ```
    """

    def __init__(self, stream: Any, *, mode: str = "thread_local"):
        self.stream = stream
        self.mode = mode
        self._graph: CapturedGraph | None = None
        # "made", then "open" inside the block, then "ended" after it.
        self._state = "made"

    @property
    def graph(self) -> CapturedGraph:
        """The captured graph, once the block has ended.

        Raises
        ------
        CaptureStateError
            The capture object was never entered (``cap = ng.capture(s)``
            without ``with``): no capture began, and the launches made since
            ran at once.
        CaptureError
            The block has not ended, or it raised and made no graph.
        """
        if self._graph is None:
            if self._state == "made":
                raise CaptureStateError(
                    f"no capture began on {self.stream!r}: this ng.capture(...) was never "
                    "entered. ng.capture(s) must be used as `with ng.capture(s) as cap:` "
                    "(or call ng.begin_capture(s), then graph = ng.end_capture(s)); made "
                    "alone it records nothing, so the launches made on the stream since "
                    "ran eagerly, at once, and no graph holds them")
            if self._state == "open":
                raise CaptureError(
                    "the graph exists once the `with ng.capture(...)` block ends")
            raise CaptureError(
                "the graph exists once the `with ng.capture(...)` block ends, and the "
                f"block on {self.stream!r} raised, or its capture failed as it ended: "
                "the capture was discarded and there is no graph")
        return self._graph

    def __enter__(self) -> "capture":
        begin_capture(self.stream, mode=self.mode)
        self._state = "open"
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self._state = "ended"
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


def _warn_of_open_captures() -> None:
    """At interpreter exit, name each capture still open: the work launched
    on its stream was recorded, not run, and no graph of it will launch.
    Each warning is given as from the line that began the capture."""
    for session in _registry.active():
        if session.ending:
            continue
        try:
            stream = repr(session.stream)
        except Exception:  # noqa: BLE001  nothing may fail at exit
            stream = f"the stream of handle {session.handle:#x}"
        file, line = session.begun_at or ("<unknown>", 0)
        warnings.warn_explicit(
            f"the program ended while the capture on {stream}, begun at {file}:{line}, "
            "was open: the work launched on that stream since then was recorded, not "
            "run, and no graph of it was made. End the capture (ng.end_capture(s), or "
            "use `with ng.capture(s) as cap:`) and launch its graph",
            CaptureWarning, file, line)


atexit.register(_warn_of_open_captures)
