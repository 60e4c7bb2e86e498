"""Capture safety: operations a graph cannot record are refused, clearly.

During a capture, CUDA refuses some calls with a cryptic error that
invalidates the whole capture (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``,
``..._IMPLICIT``), and would record others into a graph whose replays do
not do what the call did (``x[i]`` would return before its copy ran). This module holds the checks of numba's entry points,
run before the driver sees them, on both backends, so that each such
operation raises a :class:`~numbagraph.errors.UncapturableOperationError`
that names it, says why it cannot be captured and what to do instead. The
operation does not run; the captures it would have broken are ended and
their graphs discarded. :mod:`numbagraph._patches` puts the checks in front
of numba's functions (its table lists them); :func:`on_launch` is the check
every kernel launch passes through.

Which calls are refused depends on the capture mode, as in CUDA:

* Stream rules, in every mode: nothing may synchronise a capturing stream,
  copy between host and device on it (a copy into memory CUDA allocated
  page-locked is recorded), or pass a host array to a kernel on it; a stream made to wait on an event recorded in a capture joins it, and
  is one of its streams until it ends (:mod:`numbagraph._forks`), but not a
  stream of another capture; nothing may use the legacy default stream
  while a (blocking) stream captures; nothing may synchronise the device, or
  an event recorded inside a capture, while the capture runs. A foreign
  array (PyTorch, CuPy, ``__cuda_array_interface__``) given to work on a
  capturing stream is read as a view, without numba's synchronisation, and
  the work is ordered after the stream the array names where a capture
  allows it (see "foreign arrays" below).
* Thread rules, for calls CUDA calls "potentially unsafe" (allocation,
  pinning host memory, instantiating a graph, and calls that block the host:
  synchronising a stream or event outside the capture, copying to the host):
  refused on the thread of a ``"thread_local"`` or ``"global"`` capture, and
  on every thread while a ``"global"`` capture runs. ``"relaxed"`` captures
  refuse none of them.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np
from numba.cuda.args import ArgHint

from . import _foreign, _forks, _graphmem, _hostcalls, _registry
from ._registry import (
    LEGACY_DEFAULT_HANDLES, PER_THREAD_HANDLE, consequence, invalidate, key_of, raise_if_invalidated,
)
from .backend import active as _backend
from .errors import (
    AllocationInCaptureError,
    CaptureWarning,
    ConditionalError,
    DeviceMismatchError,
    DeviceNodeError,
    GraphMemoryError,
    ForeignStreamInCaptureError,
    HostArrayInCaptureError,
    HostCopyInCaptureError,
    NumbagraphError,
    SyncInCaptureError,
    UncapturableOperationError,
)

__all__ = [
    "on_launch",
    "refuse_other_device",
    "allocation_allowed",
    "guard_allocation",
    "graph_allocation_session",
    "graph_allocate",
    "check_graph_memory",
    "guard_legacy_work",
    "library_work_session",
    "order_foreign_operands",
    "guard_device_copy",
    "guard_host_wait",
    "guard_host_to_device",
    "guard_device_to_host",
    "guard_graph_launch",
    "guard_child_graph",
    "embed_child",
    "graph_free_handle",
    "guard_instantiation",
    "instantiation_forbidden",
    "Check",
    "CHECKS",
]

# Read on every call during a capture: the registry's dict itself.
_sessions = _registry.sessions
# Non-zero while a host callback runs somewhere (or an error one raised is kept).
_host_attention = _hostcalls.attention


# ---------------------------------------------------------------- policy

def _thread_blockers() -> list:
    """The captures that forbid this thread a "potentially unsafe" call."""
    _registry.forget_orphans()
    me = threading.current_thread()
    return [
        s for s in _registry.active()
        if s.mode == "global" or (s.mode == "thread_local" and s.thread is me)
    ]


def _stream_blockers(handle: int | None) -> list:
    """The captures that work enqueued on the stream ``handle`` would break."""
    if handle is None:
        return []
    if handle in LEGACY_DEFAULT_HANDLES:
        return [s for s in _registry.active()
                if s.joins_legacy or any(f.joins_legacy for f in s.forks.values())]
    session = _registry.on(handle)
    return [] if session is None else [session]


def _streams(blockers: list) -> str:
    names = [repr(s.stream) for s in blockers]
    if len(names) == 1:
        return f"{names[0]} captures"
    return f"{', '.join(names)} capture"


def _mode_clause(blockers: list) -> str:
    me = threading.current_thread()
    if any(s.thread is not me for s in blockers):
        return "while any thread captures in mode 'global'"
    return "on a thread that captures in mode 'thread_local' or 'global'"


def _refuse(
    cls: type[UncapturableOperationError],
    operation: str,
    blockers: list,
    why: str,
    instead: str,
) -> None:
    error = cls(
        f"{operation} cannot run while {_streams(blockers)}: {why}. "
        f"Instead, {instead}. {consequence(blockers)}"
    )
    invalidate(blockers, error)
    raise error


def _handle(stream: Any) -> int | None:
    """The handle of a stream argument (0 for "default"), or None when it
    is not a stream numbagraph understands."""
    if not stream:
        return 0
    try:
        return _backend.stream_handle(stream)
    except (TypeError, ValueError, AttributeError):
        return None


def _array_handle(array: Any, stream: Any) -> int | None:
    """The stream an array method runs on: the one given, else the array's
    own default stream, as numba decides."""
    return _handle(stream if stream else getattr(array, "stream", 0))


def _is_device(obj: Any) -> bool:
    return bool(getattr(obj, "__cuda_ndarray__", False)) or hasattr(
        obj, "__cuda_array_interface__"
    )


def _is_legacy(handle: int | None) -> bool:
    return handle in LEGACY_DEFAULT_HANDLES


_LEGACY_WHY = (
    "it runs on the legacy default stream, which waits on every blocking "
    "stream, so it would join the capture implicitly; CUDA forbids that "
    "(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)"
)

_ALLOCATION_WHY = (
    "allocating is a synchronous driver call that a graph does not record, so "
    "the memory would not be there when the graph replays; CUDA forbids it {}"
)
_ALLOCATION_INSTEAD = (
    "allocate device arrays for the capturing stream inside the capture "
    "(ng.empty(shape, dtype, stream=s), or cuda.device_array on the capturing "
    "thread), which makes them memory of the graph; or allocate them, and "
    "create every DeviceScalar, before the capture begins and reuse them in "
    "the captured work. A capture with mode='relaxed' lets an allocation for "
    "another stream run once, outside the graph"
)


# ---------------------------------------------------------------- allocation

# The one allocation rule, for numba's allocators, ng.empty and its kin, and
# numbagraph's own scratch alike: CUDA's rule for "potentially unsafe" calls.
# An allocation is refused on the thread of a "thread_local" or "global"
# capture, and on every thread while a "global" capture runs; elsewhere it
# runs at once, outside any graph. An allocation made for a stream that
# captures outside numbagraph (whose mode it cannot know) is refused too.
# A refusal is an UncapturableOperationError like the others: it ends the
# captures that forbid the allocation.

def _foreign_capture(handle: int | None) -> bool:
    return (handle is not None and not _is_legacy(handle) and _registry.on(handle) is None
            and _backend.is_capturing(handle))


def allocation_allowed(handle: int | None = None) -> bool:
    """Whether this thread may allocate device memory now, for the stream
    ``handle`` if given."""
    if _sessions and _thread_blockers():
        return False
    return not _foreign_capture(handle)


def guard_allocation(operation: str, handle: int | None = None, how: str = "",
                     instead: str = _ALLOCATION_INSTEAD) -> None:
    """Refuse ``operation``, which allocates (for the stream ``handle``, if
    given), where the allocation rule forbids it: raises
    AllocationInCaptureError and ends the captures that forbid it. ``how``,
    if given, says how the operation comes to allocate; ``instead``
    replaces the advice given."""
    blockers = _thread_blockers() if _sessions else []
    if blockers:
        _refuse(
            AllocationInCaptureError, operation, blockers,
            how + _ALLOCATION_WHY.format(_mode_clause(blockers)), instead,
        )
    if _foreign_capture(handle):
        raise AllocationInCaptureError(
            f"{operation} cannot run while its stream captures, in a capture begun "
            "outside numbagraph: " + how + _ALLOCATION_WHY.format(
                "during captures in mode 'global' or 'thread_local'")
            + f". Instead, {instead}"
        )


# ---------------------------------------------------------------- graph memory

# An allocation for the stream a thread captures on, or for no stream named
# while the thread captures on one stream, is recorded into that capture: it
# is memory of the graph (numbagraph._graphmem), in every capture mode. Any
# other allocation follows the allocation rule above.

def graph_allocation_session(handle: int | None, operation: str) -> Any:
    """The capture an allocation for the stream ``handle`` (None or 0: no
    stream named) is recorded into, or None when it is not recorded."""
    if not _sessions:
        return None
    me = threading.current_thread()
    if handle:
        session = _registry.on(handle)
        if session is None or session.thread is not me or session.ending:
            return None
        mine = [session]
    else:
        mine = [s for s in _registry.active() if s.thread is me and not s.ending]
        if len(mine) > 1:
            raise AllocationInCaptureError(
                f"{operation} names no stream, and this thread captures on "
                f"{', '.join(repr(s.stream) for s in mine)}: name the stream whose "
                "graph owns the array, stream=s")
        if not mine:
            return None
    _registry.raise_if_invalidated(mine[0])
    return mine[0]


def graph_allocate(session: Any, shape: tuple[int, ...], dtype: np.dtype, stream: Any,
                   operation: str, order: str = "C", handle: int | None = None) -> Any:
    """A C- (or, with ``order="F"``, Fortran-) contiguous device array of
    ``shape`` and ``dtype``, allocated by the capture ``session`` as memory
    of its graph, for ``stream`` (the capturing stream's numba stream when
    0). The allocation is recorded on the stream ``handle`` of the capture
    (by default ``stream``'s, or the capture's own stream when 0): a stream
    forked into the capture allocates in its own order."""
    if any(d < 0 for d in shape):
        raise ValueError(f"{operation}: shape {shape} has a negative dimension")
    if dtype.hasobject:
        raise TypeError(f"{operation}: dtype {dtype} holds Python objects, which "
                        "device memory cannot")
    if session.block is not None:
        raise GraphMemoryError(
            f"{operation} cannot allocate inside {session.block}: CUDA forbids "
            "memory nodes in a conditional body. Allocate in the capture before "
            "opening the block (or before the capture); nothing was allocated")
    memory = session.memory
    if memory is None:
        memory = session.memory = _graphmem.GraphMemory(repr(session.stream))
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    what = f"the {dtype} array of shape {shape} that {operation} allocated"
    allocation = _graphmem.Allocation(memory, max(nbytes, 1), what)
    if handle is None:
        handle = _handle(stream) if stream else None
    fork = session.forks.get(key_of(handle)) if handle else None
    if fork is None:
        handle = session.handle
    else:
        _allocated_on[allocation] = handle
    if not stream:
        owner = session.stream if fork is None else fork.stream
        if isinstance(owner, _backend.STREAM_TYPE):
            stream = owner
    dev = _backend.graph_allocate(handle, shape, dtype, stream, allocation, order)
    allocation.array = weakref.ref(dev)
    memory.add(allocation)
    return dev


# Allocations recorded on a stream forked into the capture -> its handle.
_allocated_on: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def graph_free_handle(session: Any, allocation: Any) -> int:
    """The stream of ``session`` a free of ``allocation`` is recorded on:
    the one that allocated it, while it is in the capture; else the
    capture's own (every stream forked in was joined back by then)."""
    handle = _allocated_on.get(allocation)
    if handle is not None and key_of(handle) in session.forks:
        return handle
    return session.handle


def check_graph_memory(values: Any, handle: int | None, operation: Any,
                       host: bool = False) -> None:
    """Refuse ``operation`` (a string, or a kernel whose launch it is) when
    one of ``values`` (or of the tuples among them) is graph-owned memory
    that does not exist for it: work enqueued on the stream ``handle``
    (recorded if it captures), or, with ``host``, a host access. Call only
    while ``_graphmem.held[0]``."""
    memory_of = _backend.graph_memory_of
    session = None
    if _sessions and not host and handle is not None:
        session = _sessions.get(handle if handle != PER_THREAD_HANDLE else key_of(handle))
    for value in values:
        if type(value) in (tuple, list):
            check_graph_memory(value, handle, operation, host)
            continue
        found = memory_of(value)
        if found is None:
            continue
        refused = _graphmem.problem(found[0], found[1], session, host)
        if refused is not None:
            cls, why = refused
            if not isinstance(operation, str):
                operation = f"launching {_kernel_name(operation)}"
            raise cls(f"{operation}: {why}")


_held = _graphmem.held


# ---------------------------------------------------------------- checks

def _check_allocation(operation: str) -> Callable[..., None]:
    def check(*args: Any, **kwargs: Any) -> None:
        guard_allocation(operation)
    return check


def guard_host_to_device(operation: str, handle: int | None, instead: str | None = None) -> None:
    """Refuse ``operation``, a copy from the host enqueued on the stream
    ``handle``, where it would break a capture; ``instead`` replaces the
    advice given."""
    blockers = _stream_blockers(handle)
    if not blockers:
        return
    if _is_legacy(handle):
        why = _LEGACY_WHY
        advice = "pass stream= a stream that is not capturing, or copy after the capture ends"
    else:
        why = (
            "the graph would record a copy from a host buffer that may change or "
            "be freed before it replays, and the data would not reach the device now"
        )
        advice = (
            "copy before the capture begins; keep a value that changes between "
            "replays in an ng.DeviceScalar, whose update() is recorded inside a capture"
        )
    _refuse(HostCopyInCaptureError, operation, blockers, why, instead or advice)


# How numba comes to allocate while handling a host value ({} names it).
_NUMBA_TEMPORARY = "numba copies {} through a temporary device array, and "

_BLOCKING_WHY = (
    "it blocks the host until the work before it on the stream has finished; "
    "CUDA counts host-blocking calls among those it forbids {}"
)
_BLOCKING_INSTEAD = (
    "do it before the capture begins or after it ends, or capture with "
    "mode='relaxed', which allows it"
)


def _check_host_blocking(cls: type, operation: str) -> None:
    """Thread rule for calls that block the host on work outside any capture."""
    blockers = _thread_blockers()
    if blockers:
        _refuse(cls, operation, blockers,
                _BLOCKING_WHY.format(_mode_clause(blockers)), _BLOCKING_INSTEAD)


# What CUDA does with a copy into pageable memory, the reason every copy to
# the host but one into memory it allocated page-locked is refused.
_PAGEABLE = (
    "CUDA makes a copy into pageable memory through a pinned buffer of the "
    "driver's and returns only once the copy has completed, but a capturing "
    "stream runs nothing until its graph is launched"
)
_PINNED_INSTEAD = (
    "read results after the graph has run (graph.launch(), then "
    "x.copy_to_host(stream=s)), or record a copy into pinned memory made before "
    "the capture: x.copy_to_host(cuda.pinned_array(x.shape, x.dtype), stream=s), "
    "a copy node each launch of the graph runs"
)


def guard_device_to_host(operation: str, handle: int | None, instead: str | None = None,
                         why: str | None = None) -> None:
    """Refuse ``operation``, a copy to the host enqueued on the stream
    ``handle``, where it would break a capture; ``instead`` replaces the
    advice given, ``why`` the reason (where the copy is not numba's copy
    into a NumPy array of its own)."""
    # An asynchronous copy to the host on another stream is allowed, as CUDA
    # allows it in every mode; waiting for it is what blocks.
    blockers = _stream_blockers(handle)
    if not blockers:
        return
    if _is_legacy(handle):
        why = _LEGACY_WHY
        advice = "read results after the capture ends and the graph has run"
    else:
        why = why or (
            "numba reads the device through a copy into a NumPy array it makes, "
            "pageable host memory, and " + _PAGEABLE
        )
        advice = _PINNED_INSTEAD
    _refuse(HostCopyInCaptureError, operation, blockers, why, instead or advice)


def _check_to_device(obj: Any, stream: Any = 0, copy: bool = True, to: Any = None) -> None:
    if _is_device(obj) or to is not None:
        return  # no allocation; a copy into `to` is checked by copy_to_device
    guard_allocation("cuda.to_device()")
    if copy:
        guard_host_to_device("cuda.to_device()", _handle(stream))


def _check_copy_to_host(self: Any, ary: Any = None, stream: Any = 0) -> None:
    what = "a new NumPy array" if ary is None else "the array given, which is"
    guard_device_to_host(
        "copy_to_host()", _array_handle(self, stream),
        "copy into an array made before the capture by cuda.pinned_array or "
        "cuda.mapped_array: x.copy_to_host(pinned, stream=s) is recorded as a copy "
        "node, which each launch of the graph runs, and the graph keeps the array "
        "alive; or read results after the graph has run (graph.launch(), then "
        "x.copy_to_host(stream=s))",
        f"numba copies into {what} not memory CUDA allocated page-locked; "
        + _PAGEABLE + " (memory cuda.pinned() pins stays pinned only for its block, "
        "which a graph outlives)")


def _recorded_copy_to_host(self: Any, ary: Any = None, stream: Any = 0) -> Any:
    """``copy_to_host(ary, stream=s)`` into memory CUDA allocated page-locked,
    on a stream a capture records: a copy node, the graph keeping ``ary`` and
    the device array alive; returns ``ary``. None where the check decides
    (no such memory, or a stream no capture of numbagraph's records)."""
    handle = _array_handle(self, stream)
    if ary is None or handle is None or _is_legacy(handle):
        return None
    session = _registry.on(handle)
    if session is None:
        return None
    host = _backend.pinned_host_array(ary)
    if host is None:
        return None
    raise_if_invalidated(session)
    _check_same_layout(self, host)
    session.keep((self, ary))
    _backend.copy_to_host_async(host, self, handle)
    return ary


def _check_same_layout(dev: Any, host: np.ndarray) -> None:
    """numba's check of a copy's arrays: the same dtype, and the same shape
    and strides once dimensions of 1 are dropped."""
    if np.dtype(dev.dtype) != host.dtype:
        raise TypeError(f"copy_to_host(): incompatible dtype: {dev.dtype} vs. {host.dtype}")
    kept = [(n, s) for n, s in zip(dev.shape, dev.strides) if n != 1]
    given = [(n, s) for n, s in zip(host.shape, host.strides) if n != 1]
    if [n for n, _ in kept] != [n for n, _ in given]:
        raise ValueError(f"copy_to_host(): incompatible shape: {dev.shape} vs. {host.shape}")
    if host.size and [s for _, s in kept] != [s for _, s in given]:
        raise ValueError(
            f"copy_to_host(): incompatible strides: {dev.strides} vs. {host.strides}; inside "
            "a capture the device array is copied as a whole into a pinned array of its "
            "layout")


def _check_copy_to_device(self: Any, ary: Any, stream: Any = 0) -> None:
    handle = _array_handle(self, stream)
    if not _is_device(ary):
        guard_host_to_device("copy_to_device() from a host array", handle)
        return
    guard_device_copy(handle, self, ary, "copy_to_device() between device arrays")


def _selects_element(array: Any, item: Any) -> bool:
    """Whether ``array[item]`` is one element, which numba copies to the host."""
    if getattr(array.dtype, "names", None):
        return False  # a record element stays on the device
    try:
        probe = np.broadcast_to(np.empty((), np.bool_), array.shape)[item]
    except Exception:  # noqa: BLE001  numba reports bad indices itself
        return False
    return not isinstance(probe, np.ndarray)


def _check_getitem(self: Any, item: Any, stream: Any = 0) -> None:
    if _backend.in_kernel():
        return  # indexing on the device
    if _selects_element(self, item):
        guard_device_to_host("reading an element of a device array (x[i])",
                              _array_handle(self, stream))


def _check_setitem(self: Any, key: Any, value: Any, stream: Any = 0) -> None:
    if _backend.in_kernel():
        return  # indexing on the device
    handle = _array_handle(self, stream)
    operation = "assigning into a device array (x[...] = value)"
    if not _is_device(value):
        guard_host_to_device(operation, handle)
        guard_allocation(operation, how=_NUMBA_TEMPORARY.format("the value"))
        return
    blockers = _stream_blockers(handle)
    if blockers:
        _refuse(
            UncapturableOperationError, operation, blockers,
            "numba assigns through its own kernel and, without a stream, "
            "synchronises; that is not recorded the same way on every backend",
            "copy with target.copy_to_device(source, stream=s), or write the "
            "values with a kernel of your own",
        )


_SYNC_INSTEAD = (
    "synchronise after the capture has ended and the graph has been launched "
    "(graph.launch(); s.synchronize())"
)


def _check_device_synchronize(*args: Any, **kwargs: Any) -> None:
    blockers = _registry.active()
    if blockers:
        _refuse(
            SyncInCaptureError, "cuda.synchronize()", blockers,
            "it waits on every stream, capturing ones included, and CUDA "
            "forbids waiting on a capturing stream",
            _SYNC_INSTEAD,
        )


def _check_stream_synchronize(self: Any) -> None:
    handle = _handle(self)
    blockers = _stream_blockers(handle)
    if not blockers:
        _check_host_blocking(SyncInCaptureError, f"{self!r}.synchronize()")
        return
    why = (
        _LEGACY_WHY if _is_legacy(handle) else
        "a capturing stream runs nothing until its graph is launched, so there "
        "is nothing to wait for, and CUDA forbids it "
        "(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)"
    )
    _refuse(SyncInCaptureError, f"{self!r}.synchronize()", blockers, why, _SYNC_INSTEAD)


def _recorded_in(event: Any) -> Any:
    """The capture in progress that ``event`` was last recorded in, if any."""
    for session in _registry.active():
        if session.events is not None and event in session.events:
            return session
    return None


def _check_event_wait_host(operation: str) -> Callable[..., None]:
    def check(self: Any, *args: Any, **kwargs: Any) -> None:
        session = _recorded_in(self)
        if session is None:
            _check_host_blocking(SyncInCaptureError, operation)
            return
        _refuse(
            SyncInCaptureError, operation, [session],
            "the event was recorded inside the capture, so it completes only "
            "when the graph runs (CUDA_ERROR_STREAM_CAPTURE_CAPTURED_EVENT)",
            "record and wait on events outside the capture, or wait after "
            "the graph has been launched",
        )
    return check


def _check_event_record(self: Any, stream: Any = 0) -> None:
    guard_legacy_work(_handle(stream), "event.record() on the legacy default stream")


def _track_event_record(self: Any, stream: Any = 0) -> None:
    handle = _handle(stream)
    session = _registry.on(handle) if handle is not None else None
    for other in _registry.active():
        if other is not session and other.events is not None:
            other.events.pop(self, None)
    if session is not None:
        if session.events is None:
            session.events = weakref.WeakKeyDictionary()
        session.events[self] = _forks.mark(session, handle)  # type: ignore[arg-type]


def _check_event_wait(self: Any, stream: Any = 0) -> None:
    handle = _handle(stream)
    guard_legacy_work(handle, "event.wait() on the legacy default stream")
    owner = _recorded_in(self)
    target = _registry.on(handle) if handle is not None else None
    if owner is not None and target is not None and owner is not target:
        _refuse(
            ForeignStreamInCaptureError, f"event.wait(stream={stream!r})", [owner, target],
            "the event was recorded in another capture than the one the waiting "
            "stream is in, and CUDA does not join two captures "
            "(CUDA_ERROR_STREAM_CAPTURE_MERGE)",
            "order work between captures outside them, or record the event on a "
            "stream of the waiting stream's own capture",
        )
    if owner is not None and target is None and handle is not None and _foreign_capture(handle):
        _refuse(
            ForeignStreamInCaptureError, f"event.wait(stream={stream!r})", [owner],
            "the event was recorded inside the capture and the waiting stream "
            "captures in a capture begun outside numbagraph, which CUDA does not "
            "join to it (CUDA_ERROR_STREAM_CAPTURE_MERGE)",
            "wait with a stream that does not capture, or end the other capture first",
        )
    if target is not None and owner is None:
        _refuse(
            ForeignStreamInCaptureError, f"event.wait(stream={stream!r})", [target],
            "the event was not recorded inside the capture, so the graph would "
            "depend on work outside it (CUDA_ERROR_STREAM_CAPTURE_ISOLATION)",
            "make the stream wait on the event before the capture begins",
        )
    if owner is not None:
        raise_if_invalidated(owner)
        if owner.events[self].restarts != owner.restarts:
            raise ConditionalError(
                f"event.wait(stream={stream!r}) waits on an event recorded in the "
                f"capture on {owner.stream!r} before a conditional block (while_loop, "
                "if_then, if_else, switch) opened or closed there: a block ends the "
                "capture and begins it again, and CUDA cannot wait on an event of "
                "the capture before that (CUDA_ERROR_INVALID_VALUE). Work on one "
                "stream runs in order, so a wait on the stream the event was "
                "recorded on orders nothing: drop it; otherwise record the event "
                "again after the block. Nothing was recorded; the capture goes on"
            )


def _track_event_wait(self: Any, stream: Any = 0) -> None:
    """A wait on an event recorded in a capture, made: the waiting stream
    is in that capture from now on (forked into it), or the stream the event
    was recorded on is joined into it."""
    owner = _recorded_in(self)
    if owner is None or not owner.current:
        return
    handle = _handle(stream)
    if handle is not None:
        _forks.waited(owner, stream, handle, owner.events[self])


# Argument types that can never carry host memory or a foreign array;
# remembered so that the check costs one set lookup per argument on every
# launch during capture. Types that may be foreign arrays (see
# numbagraph._foreign) are remembered apart: a launch with one is checked.
_never_host: set[type] = set()
_foreign_kinds: set[type] = set()
_MAYBE_HOST = (np.ndarray, np.void, ArgHint)
_HOST, _FOREIGN = 1, 2


def _scan(args: Any) -> int:
    """What ``args`` (and the tuples among them) hold: a host array
    (``_HOST``), a foreign device array (``_FOREIGN``), both or neither."""
    found = 0
    for arg in args:
        kind = type(arg)
        if kind in _never_host:
            continue
        if kind in _foreign_kinds:
            found |= (_HOST | _FOREIGN) if _foreign.on_host(arg) else _FOREIGN
        elif isinstance(arg, _MAYBE_HOST):
            if not _is_device(arg):
                found |= _HOST
        elif isinstance(arg, tuple):
            found |= _scan(arg)
        elif kind not in _registry.device_wrappers and _foreign.may_be_foreign(kind, arg):
            _foreign_kinds.add(kind)
            found |= (_HOST | _FOREIGN) if _foreign.on_host(arg) else _FOREIGN
        else:
            _never_host.add(kind)
    return found


# ---------------------------------------------------------------- foreign arrays

# numba orders a launch with a foreign array (a PyTorch tensor, a CuPy array,
# anything with __cuda_array_interface__) after the stream the array names
# (numbagraph._foreign.producer): an event recorded there, waited on by the
# launch stream, and for an object with only __cuda_array_interface__ a host
# synchronisation of that stream too. Inside a capture (numbagraph's, or one
# begun outside it) neither may run: the synchronisation, and the event on a
# stream outside the capture, break it. So a launch on a capturing stream is
# given a view of each foreign array's memory, and the order is kept as far
# as a capture can keep it:
# - the array names no stream, or the launch stream: nothing to order;
# - a stream of the same capture: it is joined into the launch stream (an
#   event recorded on it and waited on), as the end of an ng.fork block
#   joins a stream back;
# - a stream of another capture: refused, CUDA joins no two captures
#   (CUDA_ERROR_STREAM_CAPTURE_MERGE);
# - the legacy default stream: a capture cannot wait on its work, and needs
#   not when the capture's stream is blocking (numba's cuda.stream()): no
#   work can reach the legacy stream while a blocking stream captures
#   (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), and a replay on a blocking stream
#   waits for all of it. On a non-blocking capture stream it is warned;
# - any other stream: a capture cannot wait on work outside it
#   (CUDA_ERROR_STREAM_CAPTURE_ISOLATION), and nothing runs while it
#   captures: warned, since each replay must be ordered after that work by
#   its caller.
# A launch on a stream that does not capture, while numbagraph captures,
# runs as numba makes it, but is refused where numba's order would break a
# capture: the legacy default stream while a blocking stream captures, or a
# stream of a capture, which the launch stream would join.

_UNORDERED_WHY = {
    "legacy": "a capture cannot wait on its work, and the capture's stream is a "
              "non-blocking one, which a replay does not order after it",
    "other": "a stream outside the capture, whose work a capture cannot wait on "
             "(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)",
}


def _named(producer: int) -> str:
    names = {0: "the legacy default stream", 1: "the legacy default stream",
             2: "the per-thread default stream"}
    return names.get(producer, f"the stream {producer:#x}")


def _stream_of(session: Any, handle: int) -> Any:
    """The stream object of ``session`` whose handle is ``handle``."""
    fork = session.forks.get(key_of(handle))
    return session.stream if fork is None else fork.stream


def _order_foreign(handle: int, session: Any, producer: int | None, source: str, what: str,
                   operation: str) -> None:
    """Order work about to be enqueued on the capturing stream ``handle``
    (of ``session``; None: of a capture begun outside numbagraph) after
    ``producer``, the stream the foreign array ``what`` names (``source``
    says how), by the rule above."""
    if producer is None or key_of(producer) == key_of(handle):
        return
    if _is_legacy(producer):
        blocking = (session.joins_legacy if session is not None
                    else _backend.joins_legacy_stream(handle))
        if not blocking:
            _warn_unordered(producer, source, what, operation, "legacy")
        return
    owner = _registry.on(producer)
    if session is not None and owner is session:
        raise_if_invalidated(session)
        at = _forks.mark(session, producer)
        _backend.wait_stream(handle, producer)
        _forks.waited(session, _stream_of(session, handle), handle, at)
        return
    capture = _backend.capture_id(producer) if owner is None else None
    if session is None and capture is not None and capture == _backend.capture_id(handle):
        _backend.wait_stream(handle, producer)  # both in one capture begun outside numbagraph
        return
    if owner is None and capture is None:
        _warn_unordered(producer, source, what, operation, "other")
        return
    where = (f"the capture on {owner.stream!r}" if owner is not None
             else "a capture begun outside numbagraph")
    message = (
        f"{operation}: {what} is ordered after {source}, {_named(producer)}, which "
        f"captures in {where}, not the launch's capture; ordering the launch after it "
        "would join two captures, which CUDA does not (CUDA_ERROR_STREAM_CAPTURE_MERGE). "
        "Instead, produce the array on a stream of the launch's capture (fork that "
        "stream in with ng.fork), or make the library's current stream the capturing "
        "one while launching (PyTorch: with torch.cuda.stream(torch.cuda.ExternalStream"
        "(s.handle)); CuPy: with cupy.cuda.ExternalStream(int(s.handle)))")
    if session is None:
        raise ForeignStreamInCaptureError(
            message + ". Nothing was launched; the capture goes on")
    error = ForeignStreamInCaptureError(f"{message}. {consequence([session])}")
    invalidate([session], error)
    raise error


def _warn_unordered(producer: int, source: str, what: str, operation: str, kind: str) -> None:
    warnings.warn(
        f"{operation}: {what} is ordered after {source}, {_named(producer)}: "
        f"{_UNORDERED_WHY[kind]}. The graph reads the array when it runs: before each "
        "launch of the graph, make sure the work enqueued there has finished, or make "
        "the launch stream wait on it (an event recorded on that stream and waited on "
        "by the launch stream); or produce the array on the capturing stream",
        CaptureWarning, stacklevel=2)


def _foreign_views(handle: int, session: Any, args: tuple, operation: str) -> tuple:
    """``args``, for a launch on the capturing stream ``handle`` (of
    ``session``, or of a capture begun outside numbagraph when None), with
    each foreign array (in tuples too) replaced by a view of its memory,
    once the launch is ordered after the stream each names. Every view is
    made before anything is ordered, so that a bad array records nothing."""
    orders: list[tuple] = []
    launched = _views(args, orders, "argument {}")
    for producer, source, what in orders:
        _order_foreign(handle, session, producer, source, what, operation)
    return launched


def _views(args: tuple, orders: list, label: str) -> tuple:
    out: list | None = None
    for i, arg in enumerate(args):
        kind = type(arg)
        if kind in _foreign_kinds:
            described = _foreign.interface(arg)
            if described is None:
                continue
            what = f"{label.format(i + 1)} ({kind.__name__})"
            producer, source = _foreign.producer(arg, described)
            new = _foreign.view(arg)
            orders.append((producer, source, what))
        elif kind is tuple:
            new = _views(arg, orders, label.format(i + 1) + ", item {}")
            if new is arg:
                continue
        else:
            continue
        if out is None:
            out = list(args)
        out[i] = new
    return args if out is None else tuple(out)


def order_foreign_operands(stream: Any, values: Any, operation: str) -> None:
    """Order ``operation``, an op about to be enqueued on ``stream``, after
    the streams its foreign operands among ``values`` name, where ``stream``
    is a stream of a numbagraph capture, by the rule foreign arrays passed
    to kernels follow (ops read foreign arrays as views and synchronise
    nothing). Call only while a capture is active; a ``stream`` that is not
    a stream is left for the op to refuse."""
    handle = _handle(stream) if stream is not None else None
    if handle is None or _is_legacy(handle):
        return
    session = _registry.on(handle)
    if session is None:
        return
    orders: list[tuple] = []
    for i, value in enumerate(values):
        kind = type(value)
        if kind in _never_host or kind in _registry.device_wrappers or kind is tuple:
            continue
        if kind not in _foreign_kinds and not _foreign.may_be_foreign(kind, value):
            continue
        described = _foreign.interface(value)
        if described is None:
            continue
        producer, source = _foreign.producer(value, described)
        orders.append((producer, source, f"operand {i + 1} ({kind.__name__})"))
    for producer, source, what in orders:
        _order_foreign(handle, session, producer, source, what, operation)


def _guard_eager_foreign(handle: int, args: Any, operation: str) -> None:
    """Refuse a launch on ``handle``, a stream that does not capture, while
    numbagraph captures, where the order numba makes for a foreign array
    among ``args`` would break a capture."""
    for arg in args:
        kind = type(arg)
        if kind is tuple:
            _guard_eager_foreign(handle, arg, operation)
            continue
        if kind not in _foreign_kinds:
            continue
        described = _foreign.interface(arg)
        if described is None:
            continue
        producer, source = _foreign.producer(arg, described)
        if producer is None or key_of(producer) == key_of(handle):
            continue
        what = (f"{operation} with a {kind.__name__} ordered after {source}, "
                f"{_named(producer)},")
        if _is_legacy(producer):
            blockers = _stream_blockers(producer)
            if blockers:
                _refuse(
                    ForeignStreamInCaptureError, what, blockers,
                    "numba orders the launch after that stream with an event recorded "
                    "there (the library records it, for an array read through "
                    "__dlpack__): work on the legacy default stream, which waits on "
                    "every blocking stream and so would join the capture "
                    "(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)",
                    "make the library's current stream the launch stream while "
                    "launching (PyTorch: with torch.cuda.stream(torch.cuda."
                    "ExternalStream(h)); CuPy: with cupy.cuda.ExternalStream(h)), or "
                    "capture on a non-blocking stream, which the legacy default stream "
                    "does not wait on")
            continue
        owner = _registry.on(producer)
        if owner is not None:
            _refuse(
                ForeignStreamInCaptureError, what, [owner],
                "numba orders the launch after that stream by making the launch stream "
                "wait on an event recorded there, which would fork the launch stream "
                "into that capture and record the launch there instead of running it",
                "launch on the capturing stream to record the work, or make the "
                "library's current stream one that does not capture while launching")


def _kernel_name(kernel: Any) -> str:
    function = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None)
    return getattr(function, "__name__", "a kernel")


def _check_launch(handle: int, kernel: Any, args: tuple) -> tuple:
    """Validate a kernel launch made while a capture is active; returns the
    arguments to launch with (foreign arrays as views, see
    :func:`_foreign_views`)."""
    session = _registry.on(handle)
    if session is not None and session.failure is not None:
        raise_if_invalidated(session)
    if _is_legacy(handle):
        guard_legacy_work(handle, f"launching {_kernel_name(kernel)} on the legacy default stream")
    found = _scan(args)
    if found & _HOST:
        _refuse_host_arrays(session, kernel)
    if not found & _FOREIGN or _is_legacy(handle):
        return args
    operation = f"launching {_kernel_name(kernel)}"
    if session is None and _backend.capture_id(handle) is None:
        _guard_eager_foreign(handle, args, operation)
        return args
    return _foreign_views(handle, session, args, operation)


def _refuse_host_arrays(session: Any, kernel: Any) -> None:
    operation = f"launching {_kernel_name(kernel)} with a host (NumPy) array argument"
    instead = (
        "copy the array to the device before the capture (d = cuda.to_device(a)) "
        "and pass the device array; read results back after the graph has run"
    )
    if session is not None:
        _refuse(
            HostArrayInCaptureError, operation, [session],
            "numba would copy it to a temporary device array before the launch "
            "and back after it; a graph records neither copy, and the temporary "
            "would be gone before any replay",
            instead,
        )
    blockers = _thread_blockers()
    if blockers:
        _refuse(
            HostArrayInCaptureError, operation, blockers,
            _NUMBA_TEMPORARY.format("it") + _ALLOCATION_WHY.format(_mode_clause(blockers)),
            instead,
        )


def _outside_captures(handle: int, kernel: Any, args: tuple) -> tuple:
    """A launch while numbagraph captures nothing, with an argument of a
    type not known to carry no foreign array: as numba launches it, unless
    its stream captures in a capture begun outside numbagraph (asked of the
    driver only for a launch with a foreign array)."""
    if not _scan(args) & _FOREIGN or _is_legacy(handle) or _backend.capture_id(handle) is None:
        return args
    return _foreign_views(handle, None, args, f"launching {_kernel_name(kernel)}")


def on_launch(handle: int, kernel: Any, args: tuple) -> tuple:
    """The check every kernel launch passes through, on both backends: it
    returns the arguments the kernel is launched with.

    A launch from inside a host callback is refused (CUDA forbids it
    there). While a capture is active, a launch that may break it is
    validated: one on the legacy default stream, on a stream whose capture
    another thread invalidated, or with an argument whose type may carry
    host memory or be a foreign array. A launch on a capturing stream keeps
    its kernel and arguments alive with the graph. A foreign array (``__cuda_array_interface__``) given to a
    launch on a capturing stream, numbagraph's or another library's, is
    passed as a view of its memory, numba's synchronisation left out and
    the order kept by the rule of the section above. Instances of
    registered device wrappers are unwrapped once the launch is allowed (a
    Condition's unwrapping marks it set).
    """
    # Hot path (every launch, eager or captured): one pass over the
    # arguments serves both checks, and the unwrapping is a plain loop.
    wrappers, never_host = _registry.device_wrappers, _never_host
    if _host_attention[0]:
        _hostcalls.refuse_here(f"launching {_kernel_name(kernel)}")
    check = wrapped = False
    for arg in args:
        kind = type(arg)
        if kind not in never_host:
            check = True
        if kind in wrappers:
            wrapped = True
    if _held[0]:
        check_graph_memory(args, handle, kernel)
    recording = None
    if _sessions:
        session = _sessions.get(handle if handle != PER_THREAD_HANDLE else key_of(handle))
        if wrapped and _registry.launch_checks:
            for arg in args:
                launch_check = _registry.launch_checks.get(type(arg))
                if launch_check is not None:
                    launch_check(arg, session)
        launched = args
        if (check or handle in LEGACY_DEFAULT_HANDLES
                or (session is not None and session.failure is not None)):
            launched = _check_launch(handle, kernel, args)
        if session is not None:
            if wrapped and _backend.device_count() > 1:
                for arg in args:
                    if type(arg) in wrappers:
                        refuse_other_device(arg, session, f"launching {_kernel_name(kernel)}")
            recording = session, (kernel, args)
        args = launched
    elif check:
        args = _outside_captures(handle, kernel, args)
    if wrapped:
        unwrapped = list(args)
        for i, arg in enumerate(unwrapped):
            unwrap = wrappers.get(type(arg))
            if unwrap is not None:
                unwrapped[i] = unwrap(arg)
        args = tuple(unwrapped)
    if recording is not None:
        # A kernel numba cannot type with these arguments is refused before
        # the capture keeps the launch, as it would fail at it (issue 33).
        _backend.type_launch(kernel, args)
        recording[0].keepalive.append(recording[1])
    return args


# ---------------------------------------------------------------- public

def refuse_other_device(obj: Any, session: Any, operation: str) -> None:
    """Refuse ``operation``, which gives ``obj`` (a device wrapper: a
    DeviceScalar) to the capture ``session``, when ``obj`` lives on another
    device than the one the capture records on."""
    device = getattr(obj, "device", None)
    if isinstance(device, int) and device != session.device:
        raise DeviceMismatchError(
            f"{operation}: {obj!r} lives on device {device}, but the capture on "
            f"{session.stream!r} records on device {session.device}, and its graph "
            f"would read memory of another device. Make the scalar on a stream of "
            f"device {session.device} (`with cuda.gpus[{session.device}]: "
            "s = cuda.stream()`, then ng.DeviceScalar(..., stream=s)). Nothing was "
            "recorded")



def guard_legacy_work(handle: int | None, operation: str,
                      instead: str = "do it on the capturing stream to record it, "
                                     "or on a stream from cuda.stream() to run it now",
                      ) -> None:
    """Refuse ``operation``, enqueued on the stream ``handle``, when it would
    join a capture implicitly (the legacy default stream while a blocking
    stream captures)."""
    if _is_legacy(handle):
        blockers = _stream_blockers(handle)
        if blockers:
            _refuse(ForeignStreamInCaptureError, operation, blockers, _LEGACY_WHY, instead)


def library_work_session(arrays: tuple, handle: int, operation: str) -> Any:
    """The capture session that records ``operation``, work a library
    enqueues on the stream ``handle`` itself (cuBLAS's kernels, NCCL's)
    reading and writing ``arrays``, or None when the stream does not
    capture. Refused first: graph memory among ``arrays`` that does not
    exist for it, work on the legacy default stream that would join a
    capture, a capture that was invalidated."""
    if _held[0]:
        check_graph_memory(arrays, handle, operation)
    if not _sessions:
        return None
    if handle in LEGACY_DEFAULT_HANDLES:
        guard_legacy_work(handle, f"{operation} on the legacy default stream")
    session = _registry.on(handle)
    if session is not None:
        raise_if_invalidated(session)
    return session


def guard_device_copy(handle: int | None, dst: Any, src: Any, operation: str) -> None:
    """Guard ``operation``, a copy between the device arrays ``dst`` and
    ``src`` enqueued on the stream ``handle``: refused on the legacy default
    stream where it would join a capture; recorded by a capture on its own
    stream, whose graph then keeps both arrays. Call only while a capture is
    active."""
    if _is_legacy(handle):
        guard_legacy_work(handle, operation,
                          "pass stream=s, the capturing stream, to record the copy")
        return
    session = _registry.on(handle) if handle is not None else None
    if session is not None:
        raise_if_invalidated(session)
        session.keep((dst, src))


def guard_host_wait(handle: int, operation: str) -> None:
    """Refuse ``operation``, which blocks the host until the stream ``handle``
    has finished its work, where a capture forbids it. Call only while a
    capture is active."""
    blockers = _stream_blockers(handle)
    if blockers:
        _refuse(
            SyncInCaptureError, operation, blockers,
            _LEGACY_WHY if _is_legacy(handle) else
            "it waits for its stream, which captures and so runs nothing until "
            "its graph is launched",
            _SYNC_INSTEAD,
        )
    _check_host_blocking(SyncInCaptureError, operation)


def guard_graph_launch(handle: int, operation: str) -> None:
    """Refuse to upload a graph on the stream ``handle`` where that breaks a
    capture, or to launch one on the legacy default stream while a stream
    captures (a launch on a capturing stream is recorded: see
    :func:`embed_child`). Call only while a capture is active."""
    session = _registry.on(handle)
    if session is not None:
        _refuse(
            UncapturableOperationError, f"{operation} on a capturing stream",
            [session],
            "CUDA does not record a graph upload into a capture "
            "(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)",
            "upload the graph after the capture ends; graph.launch() inside the "
            "capture records it as a child graph node",
        )
    guard_legacy_work(handle, f"{operation} on the legacy default stream")


# A graph launched on a stream of a capture is recorded into it as a child
# graph node, a clone of the graph as it runs then. CUDA embeds no graph that
# holds memory nodes (unless the parent takes it over, which would end the
# graph given) or conditional nodes; a graph rebound since its capture runs
# pointers its definition, which is what is cloned, does not hold.

def guard_child_graph(executable: Any, memory: Any, rebound: bool, what: str) -> None:
    """Refuse ``what``, which records the graph ``executable`` (owning
    ``memory``, a _graphmem.GraphMemory or None; ``rebound`` since its
    capture) into a capture as a child graph node, where that cannot be
    done. Nothing is recorded and the capture goes on."""
    if memory is not None and memory.nbytes > 0:
        raise GraphMemoryError(
            f"{what}: the graph allocates memory inside it ({memory.nbytes} bytes), and "
            "CUDA embeds no graph with memory nodes as a child graph. Allocate the "
            "arrays it uses before its capture, or record its work in this capture "
            "instead (call what captured it). Nothing was recorded; the capture goes on")
    if _backend.has_conditionals(executable):
        raise ConditionalError(
            f"{what}: the graph holds a conditional node (while_loop, if_then, "
            "if_else, switch), which CUDA forbids in a child graph. Record its work "
            "in this capture instead (call what captured it), or launch it after "
            "the capture. Nothing was recorded; the capture goes on")
    if _backend.device_node_count(executable):
        raise DeviceNodeError(
            f"{what}: the graph holds a device-updatable kernel node "
            "(ng.device_updatable), whose handle belongs to the graph's own "
            "executable, and CUDA runs one executable of such a graph at a time: a "
            "child graph node would make another. Record its work in this capture "
            "instead (call what captured it), or launch it after the capture. "
            "Nothing was recorded; the capture goes on")
    if rebound:
        raise NumbagraphError(
            f"{what}: the graph was rebound (by rebind(), or by update() from a "
            "rebound graph), and a child graph node is cloned from the graph as "
            "captured, which does not hold the new arrays. Capture the graph again "
            "with the arrays it should use. Nothing was recorded; the capture goes on")


def embed_child(session: Any, handle: int, executable: Any, keep: list, what: str) -> None:
    """Record the graph ``executable``, checked by :func:`guard_child_graph`,
    into the capture ``session`` on its stream ``handle`` as a child graph
    node; the new graph keeps ``keep``, what the child graph's nodes use."""
    raise_if_invalidated(session)
    try:
        _backend.embed_graph(executable, handle)
    except NumbagraphError:
        raise
    except Exception as exc:
        error = UncapturableOperationError(
            f"{what} could not be recorded into the capture on {session.stream!r}: "
            f"{exc}. {consequence([session])}")
        invalidate([session], error)
        raise error from exc
    session.keepalive.extend(keep)


def instantiation_forbidden() -> bool:
    """Whether a capture forbids this thread to instantiate a graph now."""
    return bool(_thread_blockers())


def guard_instantiation() -> None:
    """Refuse to instantiate a graph where a capture forbids it."""
    blockers = _thread_blockers()
    if blockers:
        _refuse(
            UncapturableOperationError,
            "instantiating a graph (its first launch, upload or update)",
            blockers,
            "the graph was captured while another capture was active, so it "
            "was not instantiated then, and CUDA forbids instantiation "
            + _mode_clause(blockers),
            "launch or upload it once after the other capture has ended, "
            "before beginning a new one",
        )


# ---------------------------------------------------------------- entry points

class Check(NamedTuple):
    """How one of numba's entry points is checked while a capture is in
    progress: ``check(*args, **kwargs)`` before the call, which raises to
    refuse it, and ``after(*args, **kwargs)`` once it has run.
    ``instead(*args, **kwargs)``, when given, runs first and returns what
    the call returns in its place (None: the call runs as checked).
    ``memory(*args, **kwargs)``, when given, runs before the call whenever
    graph-owned memory exists, in a capture or not, and raises to refuse a
    use of such memory where it does not exist. Every checked entry point
    is refused inside a host callback (it calls CUDA); one that ``waits``
    for the device raises, once it has waited, the error a host callback
    raised and numbagraph kept (HostCallbackError)."""

    check: Callable[..., None]
    why: str
    after: Callable[..., None] | None = None
    # A call CUDA forbids on every thread during a "global" capture: counted
    # while in flight (see _registry.unsafe_call).
    unsafe: bool = True
    instead: Callable[..., Any] | None = None
    memory: Callable[..., None] | None = None
    waits: bool = False


_ALLOCATES = "refused where a capture forbids allocation"


def _graph_device_array(shape: Any, dtype: Any = np.float64, strides: Any = None,
                        order: str = "C", stream: Any = 0) -> Any:
    """cuda.device_array, recorded into this thread's capture when it is
    made for the capturing stream (or no stream); None to let numba make it."""
    operation = "cuda.device_array()"
    session = graph_allocation_session(_handle(stream), operation)
    if session is None:
        return None
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if strides is not None or order not in ("C", "F"):
        raise GraphMemoryError(
            f"{operation} inside a capture makes C- or F-contiguous arrays, with no "
            "strides given; allocate one and take a strided view of it")
    return graph_allocate(session, tuple(int(d) for d in shape), np.dtype(dtype), stream,
                          operation, order)


def _graph_device_array_like(ary: Any, stream: Any = 0) -> Any:
    operation = "cuda.device_array_like()"
    session = graph_allocation_session(_handle(stream), operation)
    if session is None:
        return None
    # numba makes an F-contiguous array like an F-contiguous one, else C.
    flags = getattr(ary, "flags", None)
    fortran = (flags is not None and flags["F_CONTIGUOUS"] and not flags["C_CONTIGUOUS"])
    return graph_allocate(session, tuple(ary.shape), np.dtype(ary.dtype), stream, operation,
                          "F" if fortran else "C")


def _memory_to_device(obj: Any, stream: Any = 0, copy: bool = True, to: Any = None) -> None:
    if to is None:
        return
    if _is_device(obj):
        check_graph_memory((to, obj), _handle(stream), "cuda.to_device(to=...)")
    else:
        check_graph_memory((to,), None, "cuda.to_device(to=...) from the host", host=True)


def _memory_copy_to_host(self: Any, ary: Any = None, stream: Any = 0) -> None:
    handle = _array_handle(self, stream)
    if (_sessions and ary is not None and handle is not None and not _is_legacy(handle)
            and _registry.on(handle) is not None
            and _backend.pinned_host_array(ary) is not None):
        # A copy the capture records: work on its stream, not a host access.
        check_graph_memory((self,), handle, "copy_to_host() into pinned memory")
        return
    check_graph_memory((self,), None, "copy_to_host()", host=True)


def _memory_copy_to_device(self: Any, ary: Any, stream: Any = 0) -> None:
    if _is_device(ary):
        check_graph_memory((self, ary), _array_handle(self, stream),
                           "copy_to_device() between device arrays")
    else:
        check_graph_memory((self,), None, "copy_to_device() from the host", host=True)


def _memory_getitem(self: Any, item: Any, stream: Any = 0) -> None:
    if not _backend.in_kernel() and _selects_element(self, item):
        check_graph_memory((self,), None, "reading an element of a device array (x[i])",
                           host=True)


def _memory_setitem(self: Any, key: Any, value: Any, stream: Any = 0) -> None:
    if not _backend.in_kernel():
        check_graph_memory((self, value), None, "assigning into a device array (x[...] = v)",
                           host=True)


CHECKS: dict[str, dict[str, Check]] = {
    # numba.cuda's functions
    "function": {
        "to_device": Check(_check_to_device, "refused where it would allocate or copy "
                                             "from the host into a capture",
                           memory=_memory_to_device),
        "synchronize": Check(_check_device_synchronize,
                             "refused while any capture runs: it waits on capturing streams",
                             waits=True),
        "device_array": Check(
            _check_allocation("cuda.device_array()"),
            "made for the capturing stream on its thread, memory of the graph; "
            "elsewhere " + _ALLOCATES, instead=_graph_device_array),
        "device_array_like": Check(
            _check_allocation("cuda.device_array_like()"),
            "made for the capturing stream on its thread, memory of the graph; "
            "elsewhere " + _ALLOCATES, instead=_graph_device_array_like),
        **{
            name: Check(_check_allocation(f"cuda.{name}()"), _ALLOCATES)
            for name in (
                "pinned_array", "pinned_array_like", "mapped_array", "mapped_array_like",
                "managed_array", "pinned", "mapped",
            )
        },
    },
    # methods of numba's device array classes
    "array": {
        "copy_to_host": Check(_check_copy_to_host, "on a capturing stream, a copy into "
                              "memory CUDA allocated page-locked is recorded, kept with "
                              "the graph; one into other host memory is refused",
                              instead=_recorded_copy_to_host, memory=_memory_copy_to_host),
        "copy_to_device": Check(_check_copy_to_device, "a host copy is refused on a "
                                "capturing stream; a device copy is kept with the graph",
                                memory=_memory_copy_to_device),
        **{name: Check(_check_getitem, "reading an element copies it to the host",
                       memory=_memory_getitem)
           for name in ("__getitem__", "getitem")},
        **{name: Check(_check_setitem, "assigning from the host copies and allocates",
                       memory=_memory_setitem)
           for name in ("__setitem__", "setitem")},
    },
    # methods of numba's stream class
    "stream": {
        "synchronize": Check(_check_stream_synchronize,
                             "refused on a capturing stream and where a capture forbids "
                             "blocking the host", waits=True),
    },
    # methods of numba's event class
    "event": {
        "record": Check(_check_event_record, "refused on the legacy default stream; "
                        "events recorded inside a capture are tracked",
                        _track_event_record, unsafe=False),
        "wait": Check(_check_event_wait, "a stream that waits on an event recorded in a "
                      "capture is forked into it; one in another capture is refused",
                      _track_event_wait, unsafe=False),
        **{name: Check(_check_event_wait_host(f"event.{name}()"),
                       "refused for an event recorded inside a capture",
                       waits=name == "synchronize")
           for name in ("synchronize", "query")},
    },
}
"""How each of numba's guarded entry points is checked, by kind of owner;
:mod:`numbagraph._patches` installs them."""
