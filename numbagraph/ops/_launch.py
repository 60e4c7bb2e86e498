"""Kernel cache, launch grids and launches shared by every op.

Each op kernel is built by a factory for one combination of dtypes and
compiled once, with an explicit signature, the first time that combination is
used; later calls, inside a capture or not, find it in the cache. Grids are
sized from the device: a few blocks per multiprocessor, with grid-stride
loops covering the rest, or, for streaming elementwise kernels, one block per
tile of the array. Launches go through the backend, which knows each
kernel's argument layout from its one signature instead of working it out
again on every call as numba's launch does.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import threading
import weakref
from typing import Any, Callable

import numpy as np
from numba import cuda, types
from numba.cuda.np.numpy_support import from_dtype

from .. import _hostcalls, _registry
from .._graphmem import held as _graph_memory_held
from .._rebind import Fixed
from .._registry import sessions as _sessions
from ..backend import active as _backend
from ..errors import DeviceMismatchError, OpError
from ..safety import check_graph_memory, on_launch, order_foreign_operands
from ..scalar import DeviceScalar
from ._operands import rules as _rules

__all__ = [
    "BLOCKS_PER_SM",
    "limits",
    "blocks_for",
    "tiles_for",
    "launch_handle",
    "OpKernel",
    "compiled",
    "array_type",
    "scalar_type",
    "compute_type",
    "generated",
    "QUAD_BYTES",
    "vector_quads",
    "quad_access",
    "INDEX",
    "repeatable",
    "device_step",
    "forget_remembered",
]

# Enough resident blocks per multiprocessor to hide memory latency with
# 256-thread blocks, few enough that grid-stride loops amortise the setup.
BLOCKS_PER_SM = 8

INDEX = types.int64


def limits() -> tuple[int, int]:
    """(multiprocessors, threads per block) of the current device."""
    return _backend.launch_limits()


def blocks_for(n: int) -> int:
    """Blocks for ``n`` independent items: one per ``threads`` items, at most
    BLOCKS_PER_SM per multiprocessor."""
    sms, threads = _backend.launch_limits()
    return max(1, min(-(-n // threads), sms * BLOCKS_PER_SM))


_MAX_GRID_X = 2**31 - 1


def tiles_for(n: int, tile: int) -> int:
    """Blocks for ``n`` items cut into tiles of ``tile``: one block per tile
    (beyond CUDA's grid limit, blocks loop over tiles)."""
    return max(1, min(-(-n // tile), _MAX_GRID_X))


def launch_handle(stream: Any) -> int:
    """The raw handle of the numba, cuda.core or foreign stream to launch on.

    Launching by handle treats every kind of stream alike, and capture
    recognises the launch by that handle.
    """
    if stream is None:
        raise OpError(
            "stream= is required: pass the stream to launch on (cuda.stream(), "
            "or any object with __cuda_stream__)"
        )
    try:
        handle = _backend.stream_handle(stream)
    except TypeError as exc:
        raise OpError(str(exc)) from exc
    if _backend.device_count() > 1:
        # Read by the call's launches, which check their arrays against it.
        devices = _stream_devices.by_handle
        if len(devices) > 1024:
            devices.clear()
        devices[handle] = _backend.stream_device_id(stream)
    return handle


class _StreamDevices(threading.local):
    """The ordinal of the device of the stream each op call launches on, by
    handle, written as the call begins where there are several devices (with
    one, it stays empty: nothing to check). Kept per thread: a default
    stream's handle names the stream of the device current on the calling
    thread, which differs from thread to thread. A remembered call launches
    the same objects and checks nothing."""

    def __init__(self) -> None:
        self.by_handle: dict[int, int] = {}

    def clear(self) -> None:
        """Forget this thread's streams."""
        self.by_handle.clear()


_stream_devices = _StreamDevices()


def _refuse_other_devices(device: int, args: tuple) -> None:
    """Refuse a launch on a stream of ``device`` given an array or
    DeviceScalar of another device, before anything is launched."""
    for arg in args:
        found = arg.device if type(arg) is DeviceScalar else _backend.array_device_id(arg)
        if found is not None and found != device:
            raise DeviceMismatchError(
                f"an operand lives on device {found}, but the op launches on "
                f"a stream of device {device}, where it cannot be read. Pass arrays "
                f"and scalars of device {device}, or a stream of device {found} "
                f"(made with `with cuda.gpus[{found}]: s = cuda.stream()`), "
                "or copy the operand across first")


def _refuse_call_devices(name: str, params: list[str], args: tuple, kwargs: dict) -> None:
    """With several devices: refuse the call ``name`` (an op) given an array
    or DeviceScalar of another device than its stream's, before any of its
    work is launched or recorded. An op that launches several kernels gives
    each only some operands, and its library calls (cuBLAS) and device
    copies are no kernel launches, so checking each launch would be late."""
    stream = kwargs.get("stream")
    if stream is None:
        return  # the op's own check asks for one
    try:
        device = _backend.stream_device_id(stream)
    except TypeError:
        return  # not a stream: the op's own check says so
    named = [*zip(params, args), *kwargs.items()]
    for what, value in named:
        kind = type(value)
        if value is stream or kind in _NUMBERS:
            continue
        if kind is DeviceScalar:
            found = value.device
        else:
            dev = value
            if not getattr(kind, "__cuda_ndarray__", False):
                if getattr(value, "__cuda_array_interface__", None) is None:
                    continue
                try:
                    dev = _backend.as_device_array(value)
                except Exception:  # noqa: BLE001  the op's own check names the operand
                    continue
            found = _backend.array_device_id(dev)
        if found is not None and found != device:
            raise DeviceMismatchError(
                f"{name}: {what} lives on device {found}, but the op runs on {stream!r}, "
                f"a stream of device {device}, where it cannot be read. Pass arrays "
                f"and scalars of device {device}, or a stream of device {found} "
                f"(made with `with cuda.gpus[{found}]: s = cuda.stream()`), "
                "or copy the operand across first. Nothing was launched")


class OpKernel:
    """A compiled op kernel, launched as ``kernel[grid, block, handle](*args)``
    through the backend, which skips numba's per-call argument analysis."""

    __slots__ = ("dispatcher",)

    def __init__(self, dispatcher: Any):
        self.dispatcher = dispatcher

    def __getitem__(self, config: tuple) -> Callable[..., None]:
        grid, block, handle = config
        dispatcher = self.dispatcher

        def launch(*args: Any) -> None:
            device = _stream_devices.by_handle.get(handle)
            if device is not None:
                _refuse_other_devices(device, args)
            _backend.launch(dispatcher, grid, block, handle, args, on_launch)
            steps = _seen.steps
            if steps is not None:
                steps.append((_backend.prepared_launch(dispatcher, grid, block, 0, handle,
                                                       args, trusted=True),
                              _launch_again, (dispatcher, grid, block, handle, *args)))

        return launch


def _launch_again(dispatcher: Any, grid: Any, block: Any, handle: int, *args: Any) -> None:
    _backend.launch(dispatcher, grid, block, handle, args, on_launch)


def device_step(function: Callable[..., None], *args: Any) -> None:
    """``function(*args)``: device work of an op other than a kernel launch
    (a copy), remembered with the launches of a call being remembered."""
    if _hostcalls.attention[0]:
        _hostcalls.refuse_here(f"an op's device work ({function.__name__})")
    function(*args)
    steps = _seen.steps
    if steps is not None:
        steps.append((None, function, args))


# ---------------------------------------------------------------- eager calls again

class _Seen(threading.local):
    # The device work of the call being remembered on this thread, or None;
    # this thread's remembered calls (per-thread default streams differ by
    # thread) and the calls it has made once, keyed by op and call key.
    steps: list | None = None

    def __init__(self) -> None:
        self.remembered: dict[tuple, tuple] = {}
        self.once: dict[tuple, None] = {}


_seen = _Seen()
_NUMBERS = frozenset({int, float, bool, complex, str, type(None), np.int8, np.int16,
                      np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                      np.float16, np.float32, np.float64, np.complex64, np.complex128,
                      np.bool_})
# (array types and DeviceScalar, stream types), asked of the backend once.
_kinds: list[tuple[frozenset, frozenset]] = []
# Part of every call key: a setting that decides what an op launches
# (ng.set_matmul_backend, ng.set_tf32) changes it, so that no call
# remembered before is made again as it was.
_epoch = [0]


def forget_remembered() -> None:
    """Check every op call again at its next call, on every thread: what a
    call remembered before launches may no longer be what the op would."""
    _epoch[0] += 1


def _call_key(op: Callable, args: tuple, kwargs: dict, objects: list) -> tuple | None:
    """What an eager op call depends on, or None when an argument may change
    without being replaced or fast launches are off: each array and
    DeviceScalar by identity (added to ``objects``), each stream by handle,
    each number by type and value (a zero by its sign too)."""
    if not _kinds:
        arrays, streams = _backend.repeatable_types()
        _kinds.append((arrays | {DeviceScalar} if arrays else frozenset(), streams))
    arrays, streams = _kinds[0]
    if not arrays:
        return None
    key: list = [op, _epoch[0]]
    for values in (args, kwargs.values()):
        for value in values:
            kind = type(value)
            if kind in arrays:
                objects.append(value)
                key.append(id(value))
            elif kind in streams:
                key.append((kind, int(value.handle)))
            elif kind in _NUMBERS:
                key.append((kind, value, str(value)) if value == 0 else (kind, value))
            else:
                return None
    return (*key, *kwargs)


def _step(prepared: Callable[[], None] | None, function: Callable[..., None], args: tuple,
          refs: dict[int, weakref.ref]) -> Callable[[], None]:
    """A remembered step that holds the caller's own objects among ``args``
    only weakly (a remembered call must not keep them alive; it is forgotten
    with them) and everything else the op made (views, scratch) strongly."""
    kept = tuple(refs.get(id(arg), arg) for arg in args)
    if prepared is not None:
        # It holds device pointers: what ``kept`` holds keeps their memory.
        prepared.kept = kept  # type: ignore[attr-defined]
        return prepared
    weak = [i for i, arg in enumerate(args) if id(arg) in refs]
    return functools.partial(_resolved, function, kept, weak)


def _resolved(function: Callable[..., None], kept: tuple, weak: list[int]) -> None:
    args = list(kept)
    for i in weak:
        args[i] = args[i]()
    function(*args)


def repeatable(op: Callable[..., None]) -> Callable[..., None]:
    """An op whose eager call, made again with the same arrays and
    DeviceScalars (the same objects), the same stream and the same numbers,
    launches what the earlier call launched, already packed, without
    checking again: the checks' outcome depends on nothing else. A call is
    remembered the second time it is made and forgotten when one of its
    objects is. Inside a capture, while graph-owned memory exists, or with
    an argument of another kind, every call is checked."""
    name = f"ng.{op.__name__}()"
    params = list(inspect.signature(op).parameters)

    def checked(*args: Any, **kwargs: Any) -> None:
        # Every call not launched as remembered; with one device the check
        # asks nothing.
        if _backend.device_count() > 1:
            _refuse_call_devices(name, params, args, kwargs)
        return op(*args, **kwargs)

    @functools.wraps(op)
    def call(*args: Any, **kwargs: Any) -> None:
        seen = _seen
        if (_sessions or _graph_memory_held[0] or seen.steps is not None
                or _hostcalls.attention[0]):
            # Inside a host callback an op is refused before its checks,
            # which ask the device for its limits.
            if _hostcalls.attention[0]:
                _hostcalls.refuse_here(name)
            # Devices are checked before the order with foreign operands'
            # streams is recorded into a capture.
            if _backend.device_count() > 1:
                _refuse_call_devices(name, params, args, kwargs)
            if _graph_memory_held[0]:
                _refuse_missing_memory(name, args, kwargs)
            if _sessions:
                order_foreign_operands(kwargs.get("stream"), (*args, *kwargs.values()), name)
                return _keeping_rules(op, args, kwargs)
            return op(*args, **kwargs)
        objects: list = []
        key = _call_key(op, args, kwargs, objects)
        if key is None:
            return checked(*args, **kwargs)
        remembered = seen.remembered
        entry = remembered.get(key)
        if entry is not None:
            for step in entry[0]:
                step()
            return None
        once = seen.once
        if key not in once:
            if len(once) >= 256:
                once.clear()
            once[key] = None
            return checked(*args, **kwargs)
        seen.steps = recorded = []
        try:
            result = checked(*args, **kwargs)
        finally:
            seen.steps = None
        if result is None and recorded:
            if len(remembered) >= 256:
                remembered.clear()

            def forget(_ref: Any, key: tuple = key) -> None:
                remembered.pop(key, None)

            refs = {id(obj): weakref.ref(obj, forget) for obj in objects}
            remembered[key] = (tuple(_step(*done, refs) for done in recorded), refs)
        return result

    return call


def _refuse_missing_memory(name: str, args: tuple, kwargs: dict) -> None:
    """Refuse the call ``name`` (an op) given graph memory that does not
    exist for its work (a stale graphed result, a closed graph's array),
    naming the op, before any of its work is launched."""
    try:
        handle = _backend.stream_handle(kwargs.get("stream"))
    except (TypeError, ValueError):
        return  # not a stream: the op's own check says so
    check_graph_memory((*args, *kwargs.values()), handle, name)


def _keeping_rules(op: Callable[..., None], args: tuple, kwargs: dict) -> Any:
    """``op(*args, **kwargs)`` while a capture may record it: once it
    returns, the capture of its stream keeps the rules its checks applied to
    its operands' memory (``_operands.rules``), which a rebinding of the
    graph applies too (issue 33)."""
    outer = _rules.pending
    _rules.pending = pending = []
    try:
        result = op(*args, **kwargs)
    finally:
        _rules.pending = outer
    if pending:
        session = _registry.on(_backend.stream_handle(kwargs["stream"]))
        if session is not None:
            session.keepalive.extend(pending)
    return result


_kernels: dict[tuple, OpKernel] = {}
_kernels_lock = threading.Lock()


def compiled(key: tuple, build: Callable[[], tuple[Callable, tuple]]) -> OpKernel:
    """The kernel for ``key``; ``build()`` returns ``(pyfunc, signature)``
    and runs, with the compile, only the first time ``key`` is asked for."""
    kernel = _kernels.get(key)
    if kernel is None:
        with _kernels_lock:
            kernel = _kernels.get(key)
            if kernel is None:
                pyfunc, signature = build()
                kernel = _kernels[key] = OpKernel(cuda.jit(types.void(*signature))(pyfunc))
    return kernel


@functools.lru_cache(maxsize=None)
def array_type(dtype: np.dtype) -> types.Array:
    """The numba type of a C-contiguous 1-D array of ``dtype``."""
    return from_dtype(np.dtype(dtype))[::1]


@functools.lru_cache(maxsize=None)
def scalar_type(dtype: np.dtype) -> types.Type:
    return from_dtype(np.dtype(dtype))


@functools.lru_cache(maxsize=None)
def compute_type(dtype: np.dtype) -> types.Type:
    """The type arithmetic on ``dtype`` is carried out in: float16 and
    bfloat16 values are computed in float32 and rounded once when stored."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype.name == "bfloat16":
        return types.float32
    return from_dtype(dtype)


# ---------------------------------------------------------------- four at a time

@cuda.jit(device=True)
def _load4_each(a, i):
    return a[i], a[i + 1], a[i + 2], a[i + 3]


@cuda.jit(device=True)
def _store4_each(a, i, v0, v1, v2, v3):
    a[i] = v0
    a[i + 1] = v1
    a[i + 2] = v2
    a[i + 3] = v3


QUAD_BYTES = 16


def vector_quads(arrays: tuple, handle: int, what: str) -> bool:
    """Whether a float32 kernel reading and writing ``arrays`` four elements
    at a time, from indices that are multiples of 4, may use the backend's
    128-bit loads and stores: every array's first element lies at a
    multiple of 16 bytes. Where it may, a capture on ``handle`` keeps the
    arrays from being rebound off that alignment (``what`` names the op)."""
    if any(_backend.device_pointer(dev) % QUAD_BYTES for dev in arrays):
        return False
    if _sessions:
        session = _registry.on(handle)
        if session is not None:
            session.keep(Fixed(what, arrays, _REALIGN, align=QUAD_BYTES))
    return True


def quad_access(vector: bool) -> tuple[Callable, Callable]:
    """``(load4, store4)`` for a kernel's source: the backend's 128-bit ones
    where ``vector``, else four single loads or stores in the same order
    (the same bits)."""
    if vector:
        return _backend.load4, _backend.store4
    return _load4_each, _store4_each


_REALIGN = ("Rebind to arrays whose first element lies at the same offset from a "
            "multiple of 16 bytes (numba's allocations start at one), or capture again")


def generated(name: str, source: str, namespace: dict[str, Any]) -> Callable:
    """The function ``name`` defined by ``source``, Python written out by a
    kernel factory (unrolled loops, one variable per register), with
    ``namespace`` as its globals. The source is registered with ``linecache``
    under a file name of its own, so numba's errors and a graph's node
    descriptions can show its lines."""
    filename = f"<numbagraph generated {name} {abs(hash(source)):x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = dict(namespace)
    exec(compile(source, filename, "exec"), scope)  # noqa: S102 - our own source text
    return scope[name]
