"""The simulator backend: the same API on Numba's CUDA simulator.

The simulator runs every launch synchronously, so a "graph" is the ordered
list of launches made on the capturing stream, kept as calls bound to the
live arrays. Replaying runs them again in order, so a DeviceScalar updated
between replays is seen exactly as on the GPU.

To give captures something to key on, simulator streams get integer handles
the way driver streams have them: 0 is the default stream, 1 the legacy and
2 the per-thread default stream, and ``cuda.stream()`` hands out new ones.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import weakref
from typing import Any, Callable, Sequence, Union

import numpy as np
from numba import cuda
from numba.cuda.simulator import api as _sim_api
from numba.cuda.simulator.cudadrv import devicearray as _sim_devicearray
from numba.cuda.simulator import kernelapi as _sim_kernelapi
from numba.cuda.simulator.kernel import BlockThread, FakeCUDAKernel
from numba import typeof as _numba_typeof
from numba.cuda import types as _numba_types
from numba.cuda.np import numpy_support as _numpy_support

from ._arguments import checked_types, indexed_numbers, untyped_launch
from ._streams import capture_key, stream_handle  # noqa: F401  (stream_handle: a backend member)
from .interface import LaunchHook, Move, Patch, fast_launch_off

NAME = "simulator"


# ---------------------------------------------------------------- streams

_Stream = _sim_api.stream
_fresh_handles = itertools.count(0x1000)


def _stream_init(self, handle: int | None = None) -> None:
    self.handle = next(_fresh_handles) if handle is None else int(handle)


def _stream_repr(self) -> str:
    names = {0: "default", 1: "legacy default", 2: "per-thread default"}
    kind = names.get(self.handle, f"handle {self.handle:#x}")
    return f"<simulated CUDA stream, {kind}>"


def _stream_protocol(self) -> tuple[int, int]:
    return (0, self.handle)


def _named_stream(handle: int) -> Callable[[], Any]:
    def stream() -> Any:
        return _Stream(handle)

    return stream


def _external_stream(ptr: int) -> Any:
    return _Stream(int(ptr))


_STREAM_FUNCTIONS = {
    "default_stream": _named_stream(0),
    "legacy_default_stream": _named_stream(1),
    "per_thread_default_stream": _named_stream(2),
    "external_stream": _external_stream,
}


_numba_streams: dict[int, Any] = {}


def as_numba_stream(stream: Any) -> Any:
    """``stream`` as the simulator's calls take it: itself for a simulated
    stream, 0 for the default stream, else a simulated stream of its handle,
    made once per handle."""
    if isinstance(stream, _Stream):
        return stream
    handle = stream_handle(stream)
    if handle == 0:
        return 0
    made = _numba_streams.get(handle)
    if made is None:
        if len(_numba_streams) > 1024:
            _numba_streams.clear()
        made = _numba_streams[handle] = _Stream(handle)
    return made


def synchronize(handle: int) -> None:
    """Simulated work is finished when its call returns."""


# ---------------------------------------------------------------- capture

# capture key (see _streams.capture_key) -> the recording on that stream
_recordings: dict[Any, "Recording"] = {}
_recordings_lock = threading.Lock()

# What a stream of a capture stands after, its frontier (the driver's capture
# dependencies): the id of its last recorded call, or, once it waited on
# other work of the capture, the ids of the calls its next call depends on.
# A stream with no work yet in the graph it records into has none (None).
_Frontier = Union[int, "frozenset[int]"]


def _ids_of(frontier: _Frontier | None) -> frozenset[int]:
    """The ids of the calls ``frontier`` stands for."""
    if frontier is None:
        return frozenset()
    if isinstance(frontier, int):
        return frozenset((frontier,))
    return frontier


def is_capturing(handle: int) -> bool:
    return capture_key(handle) in _recordings


def capture_node_count(handle: int) -> int:
    """How many calls the recording the stream captures into holds now (the
    open body's, inside a conditional block)."""
    recording = _recordings.get(capture_key(handle))
    return 0 if recording is None else len(recording.nodes)


class Recording:
    """The calls made on the streams of one capture, in the order they were
    made, each with the calls it depends on (``links``)."""

    def __init__(self, handle: int, mode: str):
        self.handle = handle
        self._key = capture_key(handle)
        self.nodes: list[Callable[[], None]] = []
        # Calls run as every launch starts (condition defaults), and checks
        # that must pass before the capture may end.
        self.prologue: list[Callable[[], None]] = []
        self.finish_checks: list[Callable[[], None]] = []
        # Conditional bodies being recorded, innermost last.
        self.open_bodies: list = []
        # The frontier of each stream of the capture (forked ones too) that
        # has work in the graph it records into (see simulator_streams).
        self.frontiers: dict[Any, _Frontier] = {}
        # In step with ``nodes`` (a body's own while it is open): each call's
        # id and what it depends on, its stream's frontier as it was recorded.
        self.links: list[tuple[int, _Frontier | None]] = []
        self._ids = itertools.count()
        with _recordings_lock:
            _recordings[self._key] = self

    def record(self, key: Any, call: Callable[[], None]) -> None:
        """Record ``call``, made on the stream of capture key ``key``: it
        depends on the stream's frontier, and is the stream's frontier next,
        as the driver's capture makes a node the stream's one dependency."""
        ident = next(self._ids)
        frontiers = self.frontiers
        self.links.append((ident, frontiers.get(key)))
        self.nodes.append(call)
        frontiers[key] = ident

    def _stop(self) -> None:
        with _recordings_lock:
            for key in [k for k, r in _recordings.items() if r is self]:
                del _recordings[key]

    def finish(self, instantiate: bool = True) -> "Executable":
        try:
            for check in self.finish_checks:
                check()
        except Exception:
            self.abort()
            raise
        self._stop()
        executable = Executable(self.nodes, self.prologue, self.links)
        # As on the driver, which cannot instantiate during another capture.
        executable.instantiated = instantiate
        return executable

    def abort(self) -> None:
        for body in reversed(list(self.open_bodies)):
            body.abandon_branch(resume=True)
        self._stop()
        self.nodes, self.links = [], []

    def strand(self) -> None:
        """Recorded calls hold the arrays they run on: drop them (the stream
        still counts as capturing, as on the GPU)."""
        self.nodes, self.links = [], []
        self.prologue = []

    def release_frees(self) -> None:
        """Nothing to release: the simulator frees nothing through a driver,
        so it never holds frees back."""


class Executable:
    instantiated = True  # set on first use, as the driver instantiates then

    def __init__(self, nodes: list[Callable[[], None]], prologue: Sequence = (),
                 links: Sequence[tuple[int, _Frontier | None]] = ()):
        self._nodes = tuple(nodes)
        self._prologue = tuple(prologue)
        # Each call's id and those of the calls it depends on (Recording.links).
        self._links = tuple(links)
        self.num_nodes = len(self._nodes)
        # Moves on when the nodes are set other than by rebindings: the
        # changes plans made before no longer apply.
        self.generation = 0

    def instantiate(self) -> None:
        """Nothing to build: the recorded calls are the graph."""
        self.instantiated = True

    def launcher(self, handle: int) -> Callable[[], None]:
        self.instantiated = True

        def launch() -> None:
            for call in self._prologue:
                call()
            for node in self._nodes:
                node()

        return launch

    def upload(self, handle: int) -> None:
        """Nothing to upload: simulated graphs live on the host."""
        self.instantiated = True

    def update(self, other: "Executable") -> None:
        if other.num_nodes != self.num_nodes:
            raise ValueError(
                f"graph update needs the same topology: {other.num_nodes} nodes "
                f"given, {self.num_nodes} expected"
            )
        self._nodes, self._links = other._nodes, other._links
        self.instantiated = True
        self._prologue = other._prologue
        self.generation += 1

    def plan_rebind(self, moves: Sequence[Move]) -> "_Plan":
        return _Plan(self, moves)

    def redo_rebind(self, change: Any, targets: Callable[[], Sequence[Any]]) -> bool:
        """The calls rebuilt again over ``targets`` by the moves of
        ``change``, which names this executable weakly and holds no array."""
        owner, generation, moves = change
        if owner() is not self or generation != self.generation:
            return False
        _Plan(self, [Move(*move, target) for move, target in zip(moves, targets())]).apply()
        return True

    def reparameterise(self, launches: Sequence[Any]) -> str | None:
        self.instantiated = True
        self.generation += 1
        nodes = self._nodes
        if self._prologue:
            return "the graph holds a conditional node (a device loop or branch)"
        kinds = [_kind_of(node) for node in nodes]
        other = next((k for k in kinds if k not in _TAKEN_KINDS), None)
        if other is not None:
            return (f"the graph holds a {other} node, and only kernel launches, copies "
                    "and fills take new sizes here")
        if len(launches) != len(nodes):
            return (f"the call made {len(launches)} kernel launches, copies and fills in all, "
                    f"where the graph holds {len(nodes)}")
        calls = []
        for i, (node, kind, item) in enumerate(zip(nodes, kinds, launches)):
            made = "kernel" if len(item) == 1 else item[0]
            if made != kind:
                return (f"the call made {_WORDS[made]} where the graph's node {i} is "
                        f"{_WORDS[kind]}")
            call = item[-1]
            if kind == "kernel" and (call.args[0] is not node.args[0] or _launch_types(
                    call.args[4]) != _launch_types(node.args[4])):
                name = getattr(getattr(call.args[0], "py_func", None), "__name__", "a kernel")
                return (f"launch {i} runs `{name}`, and the graph's node {i} another "
                        "kernel or overload of it (other argument types)")
            calls.append(call)
        self._nodes = tuple(calls)
        return None

    def close(self) -> None:
        self._nodes, self._links = (), ()


class _Plan:
    """A rebinding: the recorded calls rebuilt over the moved arrays, put in
    place by ``apply``. The calls are rebuilt, never changed, since a graph
    updated from this one shares them."""

    __slots__ = ("used", "change", "_executable", "_nodes", "_reset")

    def __init__(self, executable: Executable, moves: Sequence[Move]):
        self._executable = executable
        self.used = [False] * len(moves)
        rebind = _Rebinder(moves, self.used)
        self._nodes = tuple(rebind(node) for node in executable._nodes)
        self._reset = rebind.reset
        self.change = (weakref.ref(executable), executable.generation,
                       [(move.start, move.end, move.shift) for move in moves])

    def apply(self) -> None:
        self._executable._nodes = self._nodes
        for node in self._reset:
            node.reset()


class _At:
    """NumPy's view of ``like``'s layout at another address, keeping the
    array that owns that memory alive."""

    def __init__(self, ptr: int, like: np.ndarray, owner: Any):
        self.owner = owner
        # Raw bytes of the element's size, viewed as its dtype afterwards:
        # a structured dtype's padding and field order survive that.
        self.__array_interface__ = {
            "shape": like.shape, "typestr": f"|V{like.dtype.itemsize}",
            "data": (ptr, False), "strides": like.strides, "version": 3,
        }

    @staticmethod
    def view(ptr: int, like: np.ndarray, owner: Any) -> np.ndarray:
        return np.asarray(_At(ptr, like, owner)).view(like.dtype)


class _Rebinder:
    """Rebuilds a recorded call, or any value it holds, with every array
    inside a moved range replaced by the same view of the range's target."""

    def __init__(self, moves: Sequence[Move], used: list[bool]):
        self._moves, self._used = moves, used
        # Calls rebuilt that the host sets again whole once the rebinding is
        # applied (a device node's, whose grid goes back to the captured one).
        self.reset: list[Any] = []

    def _array(self, ary: np.ndarray) -> np.ndarray | None:
        ptr = ary.__array_interface__["data"][0]
        for i, move in enumerate(self._moves):
            if move.start <= ptr < move.end:
                self._used[i] = True
                target = move.target
                return _At.view(ptr + move.shift, ary, getattr(target, "_ary", target))
        return None

    def __call__(self, value: Any) -> Any:
        if isinstance(value, _FakeArray):
            moved = self._array(value._ary)
            return value if moved is None else _FakeArray(moved, stream=value.stream)
        if isinstance(value, np.ndarray):
            moved = self._array(value)
            return value if moved is None else moved
        if isinstance(value, (tuple, list)):
            items = [self(item) for item in value]
            if all(a is b for a, b in zip(items, value)):
                return value
            make = getattr(value, "_make", None)  # a namedtuple
            return make(items) if make is not None else type(value)(items)
        if isinstance(value, functools.partial):
            func = value.func
            owner = getattr(func, "__self__", None)
            if isinstance(owner, np.ndarray):  # a bound method, as ndarray.fill
                moved = self(owner)
                func = func if moved is owner else getattr(moved, func.__name__)
            args = self(value.args)
            keywords = {k: self(v) for k, v in value.keywords.items()}
            if func is value.func and args is value.args and all(
                    keywords[k] is v for k, v in value.keywords.items()):
                return value
            return functools.partial(func, *args, **keywords)
        rebound = getattr(value, "rebound", None)  # a call holding calls: a conditional node
        if rebound is not None:
            return rebound(self)
        return value


# ---------------------------------------------------------------- capture safety

_FakeArray = _sim_devicearray.FakeCUDAArray
# numba's own copy, for numbagraph's stores: the public method is guarded.
_copy_to_device = _FakeArray.copy_to_device

# The classes whose host-facing methods numbagraph guards during capture.
DEVICE_ARRAY_TYPES = (_FakeArray,)
STREAM_TYPE = _Stream
EVENT_TYPE = _sim_api.Event


def in_kernel() -> bool:
    """Simulated kernels run each thread of a block as a Python thread."""
    return isinstance(threading.current_thread(), BlockThread)


def compile_kernel(dispatcher: Any, args: tuple) -> None:
    """Simulated kernels run as Python: nothing to compile, only the kernel
    and the arguments' types to check."""
    argument_types(dispatcher, args)


def argument_types(dispatcher: Any, args: tuple) -> tuple:
    """The numba types of ``args``, as a driver launch would type them."""
    if not isinstance(dispatcher, FakeCUDAKernel):
        raise TypeError(
            f"ng.precompile takes a @cuda.jit kernel, not {type(dispatcher).__name__}")
    return checked_types(dispatcher.fn.__name__, _numba_typeof, args)


def type_launch(dispatcher: Any, args: tuple) -> None:
    """Refuse, before a capture records it, a launch that the driver's numba
    could not compile: simulated kernels run as Python and are not typed,
    so what is refused is what the kernel's source shows, a number given
    where the kernel indexes its parameter (``n[0]``). Other typing errors
    surface as the kernel runs, at the graph's launch."""
    py_func = dispatcher.fn
    if indexed_numbers(py_func, args):
        raise untyped_launch(py_func.__name__, py_func, args, None, "")


def prepared_launch(dispatcher: Any, grid: Any, block: Any, shared: int, handle: int,
                    args: tuple, trusted: bool = False) -> None:
    """Simulated launches have no faster path than the simulator's own."""
    return None


def repeatable_types() -> tuple[frozenset, frozenset]:
    """Simulated arrays never change their memory or shape, nor streams
    their handle; none while fast launches are switched off, as on the
    driver."""
    if fast_launch_off():
        return frozenset(), frozenset()
    return frozenset({_FakeArray}), frozenset({_Stream})


def frees_wait_for_device() -> bool:
    """Simulated work is finished when its call returns."""
    return True


def joins_legacy_stream(handle: int) -> bool:
    """Simulated streams behave as numba's: blocking, so the legacy default
    stream waits on them."""
    return True


def _array_stream(array: Any, stream: Any) -> Any:
    return stream if stream else getattr(array, "stream", 0)


def _device_copy(self, ary, stream=0):
    """``copy_to_device``: on the GPU a device-to-device copy on a capturing
    stream becomes a graph node, so here it is recorded too."""
    if getattr(ary, "__cuda_ndarray__", False):
        _record_or_run(stream_handle(_array_stream(self, stream)),
                       functools.partial(_copy_to_device, self, ary, stream))
        return
    _copy_to_device(self, ary, stream)


def _identity_hash(self: Any) -> int:
    return object.__hash__(self)


def _keeping_stream(make: Callable[..., Any]) -> Callable[..., Any]:
    """Make arrays remember the stream they were made for, as numba's device
    arrays do: their copies then default to it."""

    @functools.wraps(make)
    def made(*args: Any, **kwargs: Any) -> Any:
        array = make(*args, **kwargs)
        stream = args[1] if len(args) > 1 else kwargs.get("stream", 0)
        if stream and isinstance(array, _FakeArray) and not array.stream:
            array.stream = stream
        return array

    return made


# ---------------------------------------------------------------- scalars

def scalar_store(dev: Any, dtype: np.dtype, handle: int) -> Callable[[Any], None]:
    """A call ``store(value)`` that sets ``dev`` to ``value`` (at once: the
    simulator is synchronous)."""
    dtype = np.dtype(dtype)

    def store(value: Any) -> None:
        _copy_to_device(dev, np.array([value], dtype))

    return store


def _store_scalar(dev: Any, held: np.ndarray) -> None:
    """A recorded scalar update: what the driver records as memset nodes."""
    _copy_to_device(dev, held)


def scalar_store_recorded(dev: Any, value: Any, dtype: np.dtype, handle: int) -> None:
    held = np.array([value], np.dtype(dtype))
    key = capture_key(handle)
    _recordings[key].record(key, functools.partial(_store_scalar, dev, held))


def device_pointer(dev: Any) -> int:
    return dev._ary.ctypes.data


def array_interface(dev: Any) -> dict:
    host = dev._ary
    return {
        "shape": host.shape,
        "typestr": host.dtype.str,
        "data": (host.ctypes.data, False),
        "strides": None,
        "version": 3,
        "stream": None,
    }


# ---------------------------------------------------------------- launches

_run_lock = threading.RLock()

# The simulator's block manager polls its threads at every syncthreads, so a
# simulated kernel runs with a short thread switch interval (CPython's
# default makes each barrier wait a whole interval).
_SWITCH_INTERVAL = 5e-5
_numba_shared_array = _sim_kernelapi.FakeCUDAShared.array
_shared_lock = threading.Lock()


def _shared_array(self, shape, dtype, alignment=None):
    """numba's ``cuda.shared.array``, with a block's lookup-or-create made
    atomic: threads switching often could otherwise each make their own."""
    if shape == 0 or alignment is not None:
        return _numba_shared_array(self, shape, dtype, alignment)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _shared_lock:
        array = self._allocations.get(caller)
        if array is None:
            if isinstance(dtype, _numba_types.Type):
                dtype = _numpy_support.as_dtype(dtype)
            array = self._allocations[caller] = np.empty(shape, dtype)
    return array


def _run(kernel: FakeCUDAKernel, grid, block, shared: int, args: tuple) -> None:
    # FakeCUDAKernel keeps its configuration on itself; hold it for the call.
    with _run_lock:
        kernel.grid_dim, kernel.block_dim = grid, block
        kernel.dynshared_size = shared
        previous = sys.getswitchinterval()
        sys.setswitchinterval(min(previous, _SWITCH_INTERVAL))
        try:
            FakeCUDAKernel.__call__(kernel, *args)
        finally:
            sys.setswitchinterval(previous)


# The launch guard, set while a guarded pass of an unrolled loop records.
_guard: list[Any] = [None]


def set_launch_guard(hook: Any) -> None:
    _guard[0] = hook


class _ConfiguredLaunch:
    """``kernel[grid, block, stream, shared]``, remembering the stream; the
    launch passes through ``on_launch``."""

    __slots__ = ("kernel", "grid", "block", "stream", "shared", "on_launch")

    def __init__(self, on_launch: LaunchHook, kernel, grid, block, stream=0, shared=0):
        self.kernel, self.grid, self.block = kernel, grid, block
        self.stream, self.shared = stream, shared
        self.on_launch = on_launch

    def __call__(self, *args: Any) -> None:
        # Ops launch by the handle they already checked.
        stream = self.stream
        handle = stream if type(stream) is int else stream_handle(stream)
        if _guard[0] is not None:
            swapped = _guard[0](handle, self.kernel, args)
            if swapped is not None:
                swapped[0][self.grid, self.block, stream, self.shared](*swapped[1])
                return
        args = self.on_launch(handle, self.kernel, args)
        call = functools.partial(_run, self.kernel, self.grid, self.block, self.shared, args)
        if _diverted:
            taken = _diverted.get(capture_key(handle))
            if taken is not None:
                taken.append((call,))
                return
        _record_or_run(handle, call)


def _kind_of(node: Any) -> str:
    """A recorded call's node kind, in words, as taken work names it."""
    func = getattr(node, "func", None)
    if func is _run:
        return "kernel"
    if func is _device_to_device:
        return "copy"
    if func is _device_to_host:
        return "to host"
    if getattr(func, "__name__", None) == "fill":
        return "fill"
    return "host, child graph or other"


_TAKEN_KINDS = ("kernel", "copy", "to host", "fill")
_WORDS = {"kernel": "a kernel launch", "copy": "a copy", "to host": "a copy into host memory",
          "fill": "a fill"}


# capture key -> the launches taken from that stream, as the recorded calls
# they would be (empty: none is)
_diverted: dict[Any, list] = {}


def divert_launches(handle: int, early: bool = False) -> list:
    """Every launch is taken after ``on_launch``, as ``(the recorded call
    it would be,)``; a copy or fill as ``(its kind, its recorded call)``,
    the kinds the driver takes."""
    taken: list = []
    _diverted[capture_key(handle)] = taken
    return taken


def stop_diverting(handle: int) -> None:
    _diverted.pop(capture_key(handle), None)


def _launch_types(args: tuple) -> tuple:
    """What decides the overload a launch with ``args`` runs, as the
    driver's fast path keys it: an array's dtype, rank and layout, any
    other argument's type."""
    return tuple((a.dtype, a.ndim, a.flags["C_CONTIGUOUS"], a.flags["F_CONTIGUOUS"])
                 if isinstance(a, (_FakeArray, np.ndarray)) else type(a) for a in args)


def _configuring(on_launch: LaunchHook) -> Callable[[FakeCUDAKernel, tuple], _ConfiguredLaunch]:
    def getitem(self: FakeCUDAKernel, configuration: tuple) -> _ConfiguredLaunch:
        if len(configuration) not in (2, 3, 4):
            raise ValueError("must specify at least the griddim and blockdim")
        return _ConfiguredLaunch(on_launch, self, *configuration)

    return getitem


def _record_or_run(handle: int, call: Callable[[], None]) -> None:
    """Run ``call`` now, or record it when the stream is capturing."""
    key = capture_key(handle)
    recording = _recordings.get(key)
    if recording is not None:
        recording.record(key, call)
    else:
        call()


# Recorded copies are calls of their own, so that a graph's description
# tells a copy between device arrays from one into host memory.
def _device_to_device(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, src)


def _device_to_host(host: np.ndarray, src: np.ndarray) -> None:
    np.copyto(host, src)


def copy_device(dst: Any, src: Any, handle: int) -> None:
    """Copy ``src`` into ``dst`` (device arrays of one size and dtype) on the
    stream, as a driver copy does (nothing for no bytes, as on the driver)."""
    if dst._ary.nbytes:
        _take_or_record(handle, "copy",
                        functools.partial(_device_to_device, dst._ary, src._ary))


def _take_or_record(handle: int, kind: str, call: Callable[[], None]) -> None:
    """``call``, a copy or fill, listed as ``(kind, call)`` where work is
    taken from the stream, else run or recorded."""
    if _diverted:
        taken = _diverted.get(capture_key(handle))
        if taken is not None:
            taken.append((kind, call))
            return
    _record_or_run(handle, call)


def mapped_host_array(size: int, dtype: np.dtype) -> np.ndarray:
    """Simulated device memory is host memory: an ordinary array."""
    return np.zeros(size, dtype)


def mapped_device_view(host: np.ndarray) -> Any:
    """A simulated device array sharing ``host``'s memory."""
    return _sim_devicearray.FakeCUDAArray(host)


class _PageLocked(bytearray):
    """The memory of the simulator's pinned and mapped arrays, marked as
    CUDA's page-locked memory is, so that a copy into it is recorded in a
    capture and one into other host memory refused, as on the GPU."""


def _page_locked(shape: Any, dtype: Any, strides: Any, order: str) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if strides is None:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    else:
        nbytes = 0 if 0 in shape else dtype.itemsize + sum(
            (n - 1) * abs(s) for n, s in zip(shape, strides))
    return np.ndarray(shape, dtype, buffer=_PageLocked(max(nbytes, 1)), strides=strides,
                      order=order)


def _pinned_array(shape, dtype=np.float64, strides=None, order="C"):
    """``cuda.pinned_array``: a host array over simulated page-locked memory."""
    return _page_locked(shape, dtype, strides, order)


def _pinned_array_like(ary):
    """``cuda.pinned_array_like``, over simulated page-locked memory."""
    return _page_locked(ary.shape, ary.dtype,
                        _sim_devicearray._contiguous_strides_like_array(ary),
                        _sim_devicearray._order_like_array(ary))


class _MappedArray(_FakeArray):
    """A mapped array (``cuda.mapped_array``): memory the host and the device
    both read. As numba's ``MappedNDArray`` on the driver, an ndarray, its
    elements are read and written on the host with no CUDA call: in a host
    callback, and during a capture, too (issue 33). Kernels take it as any
    simulated device array."""

    def __getitem__(self, idx: Any) -> Any:
        item = self._ary[idx]
        return _MappedArray(item, stream=self.stream) if type(item) is np.ndarray else item

    def __setitem__(self, idx: Any, value: Any) -> None:
        self._ary[idx] = value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._ary if dtype is None else self._ary.astype(dtype, copy=False)


def _mapped_array(shape, dtype=np.float64, strides=None, order="C", stream=0,
                  portable=False, wc=False):
    """``cuda.mapped_array``: the simulator's device array, over simulated
    page-locked memory."""
    return _MappedArray(_page_locked(shape, dtype, strides, order), stream=stream)


def pinned_host_array(obj: Any) -> np.ndarray | None:
    """The array over ``obj``'s memory (a mapped array's own) when that is
    contiguous and made by ``cuda.pinned_array`` or ``cuda.mapped_array``."""
    host = obj._ary if isinstance(obj, _FakeArray) else obj
    if not isinstance(host, np.ndarray) or not host.nbytes:
        return None
    if not (host.flags.c_contiguous or host.flags.f_contiguous):
        return None
    base: Any = host
    while isinstance(base, np.ndarray):
        base = base.base
    return host if isinstance(base, _PageLocked) else None


def copy_to_host_async(host: np.ndarray, dev: Any, handle: int) -> None:
    """Copy ``dev`` into ``host`` on the stream (recorded while it captures)."""
    _take_or_record(handle, "to host", functools.partial(_device_to_host, host, dev._ary))


def host_call(handle: int, call: Callable[[], None]) -> None:
    """Run ``call()`` in the stream's order: now, or at this point of every
    launch of the graph while the stream captures (a recorded call, which
    the graph holds)."""
    _record_or_run(handle, call)


def memset_zero(dev: Any, handle: int) -> None:
    """Zero every byte of ``dev`` on the stream (recorded while it captures;
    nothing for no bytes, as on the driver)."""
    if dev._ary.nbytes:
        _take_or_record(handle, "fill", functools.partial(dev._ary.fill, 0))


def launch(dispatcher: FakeCUDAKernel, grid: Any, block: Any, handle: int, args: tuple,
           on_launch: LaunchHook) -> None:
    """``dispatcher[grid, block, stream](*args)`` for an op's kernel."""
    _ConfiguredLaunch(on_launch, dispatcher, grid, block, handle)(*args)


# ---------------------------------------------------------------- numba

def _replace(value: Any) -> Callable[[Any], Any]:
    return lambda original: value


def numba_patches(on_launch: LaunchHook) -> tuple[Patch, ...]:
    """What the simulator changes in numba's simulator: streams get handles,
    as driver streams have them, and every launch passes through
    ``on_launch`` and is recorded while its stream captures."""
    shared = _sim_kernelapi.FakeCUDAShared
    return (
        Patch(_Stream, "__init__", _replace(_stream_init),
              "simulated streams get integer handles to key captures on"),
        Patch(_Stream, "__repr__", _replace(_stream_repr),
              "a stream names its handle in error messages"),
        Patch(_Stream, "__cuda_stream__", _replace(_stream_protocol),
              "simulated streams speak the CUDA stream protocol, as driver streams do"),
        *(Patch(module, name, _replace(function),
                "the named streams carry the handles CUDA gives them "
                "(0 default, 1 legacy, 2 per-thread)")
          for module in (_sim_api, cuda) for name, function in _STREAM_FUNCTIONS.items()),
        *(Patch(cuda, name, _keeping_stream,
                "arrays remember the stream they were made for, as numba's device "
                "arrays do, so that their copies default to it")
          for name in ("to_device", "device_array_like")),
        Patch(_FakeArray, "__hash__", _replace(_identity_hash),
              "simulated device arrays are hashable by identity, as numba's device "
              "arrays are, so that they can key a rebind() mapping"),
        *(Patch(cuda, name, _replace(function),
                "pinned and mapped arrays are made over memory marked page-locked, so "
                "that a capture records a copy into one and refuses one into other "
                "host memory, as on the GPU")
          for name, function in (("pinned_array", _pinned_array),
                                 ("pinned_array_like", _pinned_array_like),
                                 ("mapped_array", _mapped_array))),
        Patch(_FakeArray, "copy_to_device", _replace(_device_copy),
              "a device-to-device copy on a capturing stream is recorded, as on the GPU"),
        Patch(shared, "array", _replace(_shared_array),
              "a block's shared array is made once even when threads switch often"),
        Patch(FakeCUDAKernel, "__getitem__", _replace(_configuring(on_launch)),
              "every kernel launch passes through numbagraph's launch check and is "
              "recorded while its stream captures"),
    )
