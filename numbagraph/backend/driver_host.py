"""Host callbacks on the driver: ``cuLaunchHostFunc`` through one C
trampoline that finds the Python call by a token.

cuda.bindings' ``cuLaunchHostFunc`` hands the driver a record of its own
that it frees after the first call, while a graph's host node calls it at
every replay; so the driver's own ``cuLaunchHostFunc`` is called here,
through ctypes. Its function is one trampoline, made once and alive as long
as the process, and its ``userData`` a token, never a pointer to a Python
object: a token whose call is gone is not found, and nothing is read from
freed memory.

What keeps a call alive:

* run at once (the stream does not capture): this module, until the call
  has run;
* recorded (the stream captures): a CUDA user object the capture's graph
  owns, whose destructor the driver calls once no graph holds it (the
  graph, its instantiation, any graph updated from it) and every launch
  that may run the node has finished. Closing a graph right after
  launching it therefore still runs its callbacks.

The trampoline and the destructor run on the driver's thread, which must
call no CUDA; the last reference to a spent call (run once, or forgotten by
the destructor) is dropped on a thread of numbagraph's own, which they wake,
since dropping it may free device memory its arguments held. So a closed
graph's callbacks and their arguments go as soon as the driver has called
the destructor, which it does on its own thread once the graph is destroyed
and its launches have finished.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import sys
import threading
import time
from typing import Any, Callable

from cuda.bindings import driver as cu

from .driver import LIVE
from .driver_base import CAPTURE_ACTIVE, capture_status, check, raise_for

__all__ = ["host_call"]

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NO_DESTRUCTOR_SYNC = int(cu.CUuserObject_flags.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
_MOVE = int(cu.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE)

# token -> a call enqueued to run once / a call a graph's host node runs.
_once: dict[int, Callable[[], None]] = {}
_recorded: dict[int, Callable[[], None]] = {}
# Calls done with, whose last reference the release thread drops once woken.
_spent: list[Callable[[], None]] = []
_wake = threading.Event()
_releaser: list[threading.Thread] = []
_tokens = itertools.count(1)


def _done_with(call: Callable[[], None]) -> None:
    """Hand ``call`` to the release thread (from the driver's thread)."""
    _spent.append(call)
    _wake.set()


def _release_spent(ctx: Any) -> None:
    """The release thread: drops the calls the driver is done with, with
    ``ctx`` current (dropping an argument may free its device memory)."""
    if ctx is not None:
        cu.cuCtxSetCurrent(ctx)
    while True:
        _wake.wait()
        _wake.clear()
        while _spent:
            try:
                _spent.pop()
            except IndexError:
                break
            except BaseException:  # noqa: BLE001  a finalizer's error must not end the thread
                pass


def _start_releaser() -> None:
    """Start the release thread, in the context current here."""
    err, ctx = cu.cuCtxGetCurrent()
    thread = threading.Thread(target=_release_spent,
                              args=(None if err or not int(ctx) else ctx,),
                              name="numbagraph-host-calls", daemon=True)
    _releaser[:] = [thread]
    thread.start()


# Driver threads whose Python thread state is kept between their calls.
_kept_states: set[int] = set()


def _keep_thread_state() -> None:
    """Keep the thread state Python made for this driver thread as ctypes
    called in: one more ``PyGILState_Ensure``, never released, so each later
    call finds it, where it would make one and destroy it again every time."""
    _kept_states.add(threading.get_ident())
    ctypes.pythonapi.PyGILState_Ensure()


def _run(token: int | None) -> None:
    """The trampoline: run the call of ``token``, if it still exists."""
    if threading.get_ident() not in _kept_states:
        _keep_thread_state()
    key = token or 0
    call = _once.pop(key, None)
    once = call is not None
    if call is None:
        call = _recorded.get(key)
        if call is None:
            return
    try:
        call()
    except BaseException:  # noqa: BLE001  nothing on the driver's thread can take it
        pass
    if once:
        _done_with(call)


def _release(token: int | None) -> None:
    """The user object's destructor: no graph runs the call any more."""
    if threading.get_ident() not in _kept_states:
        _keep_thread_state()
    call = _recorded.pop(token or 0, None)
    if call is not None:
        _done_with(call)


# Made once, never freed: every host node and user object points at these.
_TRAMPOLINE = _HOST_FN(_run)
_DESTRUCTOR = _HOST_FN(_release)

_driver: list[Any] = []


def _libcuda() -> Any:
    """The driver library, with the prototypes of the calls made here;
    loaded at first use (importing the backend needs no driver)."""
    if not _driver:
        names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise OSError(f"the CUDA driver library ({', '.join(names)}) cannot be loaded")
        lib.cuLaunchHostFunc.argtypes = (ctypes.c_void_p, _HOST_FN, ctypes.c_void_p)
        lib.cuLaunchHostFunc.restype = ctypes.c_int
        lib.cuUserObjectCreate.argtypes = (
            ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, _HOST_FN, ctypes.c_uint,
            ctypes.c_uint)
        lib.cuUserObjectCreate.restype = ctypes.c_int
        _driver.append(lib)
    return _driver[0]


def _capture_graph(handle: int) -> Any:
    """The graph the stream captures into now."""
    info = check("cuStreamGetCaptureInfo", cu.cuStreamGetCaptureInfo(handle))
    return info[2]  # (status, id, graph, dependencies, ...)


def _hold_for_graph(handle: int, token: int) -> None:
    """Make the capture's graph own a user object whose destructor forgets
    ``token``'s call."""
    lib = _libcuda()
    obj = ctypes.c_void_p()
    raise_for("cuUserObjectCreate", cu.CUresult(
        lib.cuUserObjectCreate(ctypes.byref(obj), token, _DESTRUCTOR, 1, _NO_DESTRUCTOR_SYNC)))
    # The reference this thread owns moves to the graph.
    check("cuGraphRetainUserObject", cu.cuGraphRetainUserObject(
        _capture_graph(handle), cu.CUuserObject(obj.value or 0), 1, _MOVE))


def host_call(handle: int, call: Callable[[], None]) -> None:
    """``cuLaunchHostFunc`` of ``call`` on the stream: a host node while it
    captures, held by the graph; otherwise run once, in stream order."""
    if not _releaser or not _releaser[0].is_alive():
        _start_releaser()
    lib = _libcuda()
    token = next(_tokens)
    recorded = capture_status(handle) == CAPTURE_ACTIVE
    if recorded:
        _recorded[token] = call
        try:
            _hold_for_graph(handle, token)
        except BaseException:
            _recorded.pop(token, None)
            raise
    else:
        _once[token] = call
    err = lib.cuLaunchHostFunc(handle, _TRAMPOLINE, token)
    if err:
        # Nothing was enqueued; a user object the graph holds forgets a
        # token already gone when the graph is destroyed.
        (_recorded if recorded else _once).pop(token, None)
        raise_for("cuLaunchHostFunc", cu.CUresult(err))


def _settle_at_exit() -> None:
    """At exit, before the interpreter finalizes: the driver's thread calls
    into Python (host nodes, the user objects' destructors), which it cannot
    do once finalization has begun. So while calls are outstanding, the
    graphs still open are destroyed and the device's work waited for now,
    and the destructors given a moment to run."""
    if not (_recorded or _once):
        return
    for executable in list(LIVE):
        executable.close()
    cu.cuCtxSynchronize()
    deadline = time.monotonic() + 2.0
    while (_recorded or _once) and time.monotonic() < deadline:
        time.sleep(0.005)


atexit.register(_settle_at_exit)
