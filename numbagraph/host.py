"""Host callbacks: Python run at a point of a stream's order, recorded into
graphs.

``ng.on_host(fn, *args, stream=s)`` enqueues ``fn(*args)`` on ``s``: it runs
on the host once the work enqueued before it has finished, and the work
enqueued after it waits for it. Inside a capture on ``s`` it is recorded (a
host node): every launch of the graph calls ``fn(*args)`` at that point.
Paired with [DeviceScalar.read_async][numbagraph.DeviceScalar.read_async]
into a [HostScalar][numbagraph.HostScalar], a replay loop hands each
replay's value to Python without synchronising.

Rules of host callbacks:

* ``fn`` runs on a thread that is not the caller's (the driver's own, on the
  GPU), so what it raises cannot reach the caller: the first exception is
  kept and raised, as HostCallbackError from it, by the next graph launch or
  wait for the device (``graph.launch()``, ``stream.synchronize()``,
  ``cuda.synchronize()``, ``event.synchronize()``, ``DeviceScalar.value``).
* ``fn`` must call no CUDA: numbagraph refuses, with CudaInHostCallbackError,
  every call of its own and every checked call of numba that would (a
  launch, a capture, a graph launch, a scalar update or read, a copy, an
  allocation, a wait).
* A capture keeps ``fn`` and ``args`` alive for as long as its graph may run
  them, and lets go of them as soon as it may not: on the driver once the
  driver drops the graph's user object (it calls its destructor on a thread
  of its own, once the graph is closed and its launches have finished,
  often a little after ``close()`` returns); on the simulator at
  ``close()``. A graph's rebinding or update does not change ``args``.
* Not inside a conditional block (while_loop, if_then, if_else, switch,
  repeat): CUDA runs a conditional body on the device, with no host nodes.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable

from . import _hostcalls, _registry
from ._registry import sessions as _sessions
from .backend import active as _backend
from .errors import CaptureWarning, ConditionalError
from .safety import guard_legacy_work

__all__ = ["on_host"]


def _name_of(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return f"{name}()" if isinstance(name, str) else repr(fn)


class _HostCall:
    """``fn(*args)`` as the backend runs it: between the marks that refuse
    CUDA calls, with what it raises kept for the next report."""

    __slots__ = ("fn", "args", "name", "__weakref__")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args = fn, args
        self.name = _name_of(fn)

    def __call__(self) -> None:
        _hostcalls.enter(self.name)
        try:
            self.fn(*self.args)
        except Exception as exc:  # noqa: BLE001  kept, and raised at the next report
            _hostcalls.keep(exc, self.name)
        finally:
            _hostcalls.leave()

    def __repr__(self) -> str:
        return f"<host callback {self.name}>"


def on_host(fn: Callable[..., Any], *args: Any, stream: Any) -> None:
    """Call ``fn(*args)`` on the host in ``stream``'s order; inside a capture
    on ``stream``, at that point of every launch of the graph.

    ``fn`` runs once the work enqueued on ``stream`` before it has
    finished, and the work enqueued after it waits for it. Outside a capture
    it is enqueued and runs once; inside a capture on ``stream`` it is
    recorded, and each replay calls it, in order with the replay's kernels
    and copies. The capture (then its graph) keeps ``fn`` and ``args``
    alive, so the caller may drop them.

    ``fn`` runs on a thread of the driver, not the caller's (on the
    simulator: at its point of the stream's order, on the thread that runs
    the work). It must call no CUDA, directly or through numba, numbagraph
    or another library: CUDA forbids it in a host function and may never
    return. numbagraph refuses its own such calls and numba's checked ones
    there with CudaInHostCallbackError. It may read host memory, a
    [HostScalar][numbagraph.HostScalar] most of all, which
    [DeviceScalar.read_async][numbagraph.DeviceScalar.read_async] fills
    just before it in stream order. Keep it short: the stream waits for it.

    What ``fn`` raises cannot reach the caller: the first exception is
    kept (later ones are counted) and raised, as a HostCallbackError from
    it, by the next ``graph.launch()``, ``stream.synchronize()``,
    ``cuda.synchronize()``, ``event.synchronize()`` or
    ``DeviceScalar.value``, on any thread. The work recorded around ``fn``
    runs regardless.

    Parameters
    ----------
    fn
        A callable, called as ``fn(*args)``; its result is dropped.
    *args
        Its arguments, held as given (not copied): a mutable one is read
        when ``fn`` runs.
    stream
        The stream whose order ``fn`` runs in: the capturing stream, to
        record it.

    Raises
    ------
    TypeError
        ``fn`` is not callable, or ``stream`` is not a stream.
    ConditionalError
        Inside a conditional block (while_loop, if_then, if_else, switch,
        repeat), whose body CUDA runs on the device: call it before or
        after the block. Nothing was recorded; the capture goes on.
    ForeignStreamInCaptureError
        ``stream`` is the legacy default stream while a stream captures.
    CaptureInvalidatedError
        Another thread's refused operation invalidated the capture on
        ``stream``.
    CudaInHostCallbackError
        Called from inside a host callback.

    Warns
    -----
    CaptureWarning
        ``fn`` was enqueued to run once on ``stream`` while this thread
        captures on another stream: the graph does not hold it.

    Examples
    --------
    ```python
    seen = ng.HostScalar(np.int32)
    values = []
    with ng.capture(s) as cap:
        ng.increment(pos)
        pos.read_async(seen)
        ng.on_host(lambda: values.append(seen.value), stream=s)
    for _ in range(3):
        cap.graph.launch()
    s.synchronize()              # every callback has run
    ```
    """
    if not callable(fn):
        raise TypeError(
            f"ng.on_host() calls fn(*args), so fn must be callable, not "
            f"{type(fn).__name__} {fn!r}; pass the function itself and its "
            "arguments after it: ng.on_host(fn, a, b, stream=s)")
    try:
        handle = _backend.stream_handle(stream)
    except TypeError as exc:
        raise TypeError(f"ng.on_host(stream=...): {exc}") from None
    if _hostcalls.attention[0]:
        _hostcalls.refuse_here("ng.on_host()")
    call = _HostCall(fn, args)
    session = _registry.on(handle) if _sessions else None
    if session is not None:
        _registry.raise_if_invalidated(session)
        if session.block is not None:
            raise ConditionalError(
                f"ng.on_host({call.name}) inside {session.block}: CUDA runs a "
                "conditional body on the device, where a graph cannot call the "
                "host. Call it before or after the block; read values the body "
                "makes with DeviceScalar.read_async into a HostScalar. Nothing "
                "was recorded; the capture goes on")
        session.keep(call)
    elif _sessions:
        guard_legacy_work(handle, "ng.on_host() on the legacy default stream",
                          "pass stream=s, the capturing stream, to record the callback, "
                          "or a stream from cuda.stream() to run it now")
    _backend.host_call(handle, call)
    if session is None and _sessions:
        _warn_if_meant_for_a_capture(call.name, stream)


def _warn_if_meant_for_a_capture(name: str, stream: Any) -> None:
    """The callback was enqueued at once on ``stream`` while this thread
    captures on another stream: the graph being captured does not hold it."""
    me = threading.current_thread()
    mine = [s for s in _registry.active() if s.thread is me]
    if mine:
        warnings.warn(
            f"ng.on_host({name}) was enqueued to run once on {stream!r}, not "
            f"recorded into the capture on {mine[0].stream!r} that this thread is "
            "making: replays of that graph will not call it. To record it, pass "
            "stream=s, the capturing stream; to run it once, call it outside the "
            "capture", CaptureWarning, stacklevel=3)
