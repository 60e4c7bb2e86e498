"""Several streams in one capture: ``with ng.fork(s2):``.

Inside ``ng.capture(s)``, ``with ng.fork(s2):`` makes ``s2`` wait on the
work captured on ``s`` so far, which forks ``s2`` into the capture (CUDA's
rule for a stream that waits on an event recorded in a capture): what is
launched on ``s2`` in the block is recorded into the same graph, after that
work and in parallel with what is launched on ``s`` meanwhile. Leaving the
block makes ``s`` wait on the work of ``s2``, joining it back: what follows
on ``s`` runs after both. numba's events do the same by hand
(``ev.record(s); ev.wait(s2)``, then ``ev2.record(s2); ev2.wait(s)``). Either
way numbagraph counts ``s2`` among the streams of the capture, so that its
launches, ops, copies, scalar updates and graph memory are checked and kept
alive as those on ``s`` are, and refuses to end the capture while ``s2`` is
not joined back (:mod:`numbagraph._forks`).
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from . import _forks, _registry
from ._registry import LEGACY_DEFAULT_HANDLES, key_of
from .backend import active as _backend
from .errors import CaptureStateError, DeviceMismatchError

__all__ = ["fork"]

# The ng.fork blocks open on each thread, innermost last: a nested block
# forks from the stream of the block around it.
_open = threading.local()


def _stack() -> list:
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    return stack


class fork:
    """Fork ``stream`` into the capture in progress for the block, and join
    it back at its end.

    On entering, ``stream`` waits on the work captured on ``parent`` so far
    and becomes a stream of ``parent``'s capture: the work launched on it in
    the block is recorded into the same graph, after that work, in parallel
    with the work launched on ``parent`` meanwhile. On leaving, ``parent``
    waits on the work of ``stream``: the work recorded after the block
    depends on both. Blocks nest (an inner block forks from the stream of
    the block around it), and several streams may be forked at once.

    A stream stays in the capture, joined back, after its block; work on it
    later is recorded into the capture again and must be joined back too
    (another ``ng.fork`` block, or an event) before the capture ends. A
    conditional block (``ng.while_loop`` and its kin) records on the
    capture's own stream only, and not while a forked stream is not joined
    back: fork inside its body instead.

    Parameters
    ----------
    stream
        The stream to fork: a numba or cuda.core stream, or an object with
        ``__cuda_stream__``; not capturing.
    parent
        The capturing stream to fork from and join back into: the capture's
        own stream or a stream forked into it. By default, the stream of the
        innermost ``ng.fork`` block this thread has open in the capture, or
        else the capture's own stream, when this thread captures on exactly
        one stream.

    Raises
    ------
    TypeError
        Entering: ``stream`` or ``parent`` is not a stream.
    CaptureStateError
        Entering: ``parent`` does not capture; no ``parent`` was given and
        this thread captures on no stream or on several; ``stream`` is the
        legacy default stream, ``parent`` itself, the capture's own stream,
        the stream of an ``ng.fork`` block still open, or capturing in
        another capture. Nothing was recorded; the capture goes on.
    CaptureInvalidatedError
        Entering: another thread's refused operation ended the capture.
    DeviceMismatchError
        Entering: ``stream`` belongs to another device than the capture's.
        Nothing was recorded; the capture goes on.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        with ng.fork(s2):
            left[blocks, threads, s2](x)     # runs in parallel with
        right[blocks, threads, s](x)         # ... this
        both[blocks, threads, s](x)          # after the fork's end: after both
    cap.graph.launch()
    ```
    """

    def __init__(self, stream: Any, *, parent: Any = None):
        self.stream = stream
        self.parent = parent
        self._session: Any = None
        self._handle = 0
        # The stream forked from, as found on entering, and its handle.
        self._parent: Any = None
        self._parent_handle = 0

    def _capture(self) -> tuple[Any, Any, int]:
        """The capture to fork into, the stream to fork from and its handle."""
        if self.parent is not None:
            handle = _backend.stream_handle(self.parent)
            session = _registry.on(handle)
            if session is None:
                raise CaptureStateError(
                    f"ng.fork(parent={self.parent!r}): that stream is not capturing; fork "
                    "from the stream of a capture in progress (or one forked into it)")
            return session, self.parent, handle
        me = threading.current_thread()
        mine = [s for s in _registry.active() if s.thread is me and not s.ending]
        if len(mine) != 1:
            raise CaptureStateError(
                f"ng.fork({self.stream!r}) without parent= forks from this thread's "
                "capture, and this thread "
                + ("captures on no stream: use it inside `with ng.capture(s):`"
                   if not mine else
                   f"captures on {', '.join(repr(s.stream) for s in mine)}: "
                   "say which with parent=s"))
        session = mine[0]
        for block in reversed(_stack()):
            if (block._session is session
                    and _registry.on(block._handle) is session):
                return session, block.stream, block._handle
        return session, session.stream, session.handle

    def __enter__(self) -> "fork":
        handle = _backend.stream_handle(self.stream)
        session, parent, parent_handle = self._capture()
        _registry.raise_if_invalidated(session)
        where = f"the capture on {session.stream!r}"
        if handle in LEGACY_DEFAULT_HANDLES:
            raise CaptureStateError(
                f"ng.fork({self.stream!r}): the legacy default stream cannot join a "
                "capture; fork a stream from cuda.stream(). The capture goes on")
        key = key_of(handle)
        if key == key_of(parent_handle):
            raise CaptureStateError(
                f"ng.fork({self.stream!r}) forks a stream from itself: give another "
                "stream to run in parallel with it. The capture goes on")
        target = _registry.on(handle)
        if key == session.key:  # the capture's own stream
            raise CaptureStateError(
                f"ng.fork({self.stream!r}): that stream is the own stream of {where}, "
                "which cannot be forked into it; fork another stream. The capture goes on")
        if any(block._session is session and key_of(block._handle) == key
               for block in _stack()):
            raise CaptureStateError(
                f"ng.fork({self.stream!r}): that stream is forked into {where} by an "
                "ng.fork block still open; fork another stream, or fork it again once "
                "that block has ended. The capture goes on")
        if target is not None and target is not session:
            raise CaptureStateError(
                f"ng.fork({self.stream!r}): that stream is a stream of the capture on "
                f"{target.stream!r}, and CUDA does not join two captures; fork another "
                "stream. The capture goes on")
        if target is None and _backend.is_capturing(handle):
            raise CaptureStateError(
                f"ng.fork({self.stream!r}): that stream captures, in a capture begun "
                "outside numbagraph; fork another stream. The capture goes on")
        if _backend.device_count() > 1:
            device = _backend.stream_device_id(self.stream)
            if device != session.device:
                raise DeviceMismatchError(
                    f"ng.fork({self.stream!r}): that stream belongs to device {device}, and "
                    f"{where} records on device {session.device}, which the kernels "
                    "launched in the block are compiled for. Fork a stream of device "
                    f"{session.device} (made with `with cuda.gpus[{session.device}]: "
                    "s2 = cuda.stream()`). Nothing was recorded; the capture goes on")
        at = _forks.mark(session, parent_handle)
        _backend.wait_stream(handle, parent_handle)
        _forks.waited(session, self.stream, handle, at)
        self._session, self._handle = session, handle
        self._parent, self._parent_handle = parent, parent_handle
        _stack().append(self)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        stack = _stack()
        if self in stack:
            stack.remove(self)
        session: Any = self._session
        self._session = None
        # Nothing to join when the capture has ended, or when a conditional
        # block began it again since: the streams forked in left it there.
        if session is None or not session.current:
            return False
        streams = (_registry.on(self._handle), _registry.on(self._parent_handle))
        if any(found is not session for found in streams):
            return False
        try:
            at = _forks.mark(session, self._handle)
            _backend.wait_stream(self._parent_handle, self._handle)
            _forks.waited(session, self._parent, self._parent_handle, at)
        except Exception:
            if exc_type is None:
                raise
            # The block's own error propagates; ending the capture joins the
            # streams forked into it.
        return False

    def __repr__(self) -> str:
        return f"<ng.fork {self.stream!r}>"
