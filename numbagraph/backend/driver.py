"""The CUDA driver backend: real graphs through cuda.core and cuda.bindings.

Captures are begun and ended on the user's own stream with the driver's
calls, so numba launches made on that very stream are recorded. Ops launch
through cuda.core, on a non-owning view of the stream.
"""

from __future__ import annotations

import functools
import struct
import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np
from cuda.bindings import driver as cu
from cuda.core import Stream as _CoreStream
from numba import cuda
from numba.cuda import types as numba_types
from numba.cuda.typeconv import Conversion
from numba.cuda.dispatcher import CUDADispatcher

from numba.cuda.cudadrv import devicearray as _devicearray
from numba.cuda.cudadrv import driver as _numba_driver

from ._streams import stream_handle  # noqa: F401  (a backend member)
from ..errors import GraphClosedError, KernelArgumentError
from ._arguments import checked_types
from .driver_ops import device_count as _device_count
from .driver_base import (
    CAPTURE_ACTIVE, CAPTURE_INVALIDATED, CAPTURE_MODES, CAPTURE_NONE, DriverError,
    capture_status, check, in_context,
)
from .driver_devnodes import Ready, opt_in
from .driver_rebind import NodeIndex, graph_nodes
from .driver_streams import join_forks
from .interface import Move

NAME = "cuda"


# ---------------------------------------------------------------- streams

_core_streams: dict[int, tuple[Any, _CoreStream]] = {}


def _core_stream(handle: int, ctx: Any = None) -> _CoreStream:
    """A non-owning cuda.core view of the stream, made once per handle:
    ops launch through it. A view remembers
    the stream's context, so it is made again once numba's context for the
    thread (``ctx``, looked up if not given) has changed: after a device
    reset a new stream may get an old handle."""
    if ctx is None:
        ctx = _numba_context()
    entry = _core_streams.get(handle)
    if entry is None or entry[0] is not ctx:
        if len(_core_streams) > 1024:
            _core_streams.clear()
        entry = _core_streams[handle] = (ctx, _CoreStream.from_handle(handle))
    return entry[1]


def synchronize(handle: int) -> None:
    check("cuStreamSynchronize", cu.cuStreamSynchronize(handle))


# ---------------------------------------------------------------- capture

def _in_stream_context(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of a :class:`Recording`, called with its stream's context
    current on a thread that has none: CUDA lets a "relaxed" capture end on
    any thread, and a thread that never used CUDA has no context for the
    calls that end it (issue 33)."""
    @functools.wraps(method)
    def made(self: Any, *args: Any, **kwargs: Any) -> Any:
        failed, current = cu.cuCtxGetCurrent()
        if failed or int(current):
            return method(self, *args, **kwargs)
        err, ctx = cu.cuStreamGetCtx(self.handle)
        if err != cu.CUresult.CUDA_SUCCESS or cu.cuCtxPushCurrent(ctx)[0]:
            return method(self, *args, **kwargs)
        try:
            return method(self, *args, **kwargs)
        finally:
            cu.cuCtxPopCurrent()

    return made


class Recording:
    """One capture in progress on one stream.

    The capture is begun and ended with the driver's own calls, and the
    graph it makes belongs to this recording until an :class:`Executable`
    takes it: every graph is destroyed once, by whoever holds it.

    cuMemFree during a capture is refused and invalidates it, so numba's
    frees (memory, streams, events) wait from the start of the recording
    until ``release_frees()``, called once the capture has ended.
    """

    def __init__(self, handle: int, mode: str):
        self.handle = handle
        # Checks that must pass before the capture may end.
        self.finish_checks: list[Callable[[], None]] = []
        # Conditional bodies being recorded, innermost last.
        self.open_bodies: list = []
        # Every conditional body graph made in the capture, in order; and
        # each conditional node, by handle: (kind, its bodies, its condition).
        self.bodies: list = []
        self.conditionals: dict[int, tuple] = {}
        # The capture's own graph, if a conditional block ended the capture
        # and the driver refused to begin it again: abort destroys it.
        self.stranded: Any = None
        # The handles of the other streams forked into the capture.
        self.forks: list[int] = []
        self._release: Callable[[], None] | None = _hold_frees(_stream_context(handle))
        try:
            check("cuStreamBeginCapture",
                  cu.cuStreamBeginCapture(handle, CAPTURE_MODES[mode]))
        except BaseException:
            self.release_frees()
            raise

    def release_frees(self) -> None:
        """Let numba free again; once is enough."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def strand(self) -> None:
        """The graph being built holds device pointers, not Python objects:
        nothing to drop. The capture is left as it is, since only its own
        thread may end it."""

    @_in_stream_context
    def finish(self, instantiate: bool = True) -> "Executable":
        """End the capture. With ``instantiate=False`` the graph is
        instantiated on first use instead: CUDA refuses to instantiate while
        another capture is active in a way that covers this thread."""
        try:
            for finish_check in self.finish_checks:
                finish_check()
        except Exception:
            self.abort()
            raise
        err, graph = cu.cuStreamEndCapture(self.handle)
        if err != cu.CUresult.CUDA_SUCCESS:
            # An invalidated or unjoined capture ends with the failed call
            # and leaves no graph; anything still capturing is ended here.
            self.abort()
            raise DriverError("cuStreamEndCapture", err)
        err, ctx = cu.cuStreamGetCtx(self.handle)
        executable = Executable(graph, self.bodies,
                                ctx if err == cu.CUresult.CUDA_SUCCESS else None,
                                self.conditionals)
        try:
            # Device-updatable nodes are opted in before any instantiation.
            executable.device_nodes = opt_in(self)
            if instantiate:
                executable.instantiate()
        except Exception:
            executable.close()
            raise
        return executable

    @_in_stream_context
    def abort(self) -> None:
        """End the capture without a graph; the stream stops capturing.

        Never raises: it runs while another error propagates (the body of a
        ``with ng.capture`` block raised), which it must not hide."""
        # Streams forked into the capture are joined back first: a capture,
        # or a body, with a fork left unjoined does not end.
        join_forks(self)
        # The stream may be capturing into a conditional body: go back to the
        # capture's own graph first, so that is what ends (and is freed).
        for body in reversed(list(self.open_bodies)):
            try:
                body.abandon_branch(resume=True)
            except Exception:  # noqa: BLE001  the capture is ended below regardless
                pass
        if capture_status(self.handle) in (CAPTURE_ACTIVE, CAPTURE_INVALIDATED):
            err, graph = cu.cuStreamEndCapture(self.handle)
            if err == cu.CUresult.CUDA_SUCCESS and graph is not None and int(graph):
                cu.cuGraphDestroy(graph)
        stranded, self.stranded = self.stranded, None
        if stranded is not None:
            cu.cuGraphDestroy(stranded)


_AUTO_FREE_ON_LAUNCH = int(
    cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)


class Executable:
    """A captured graph, which it owns, and its instantiation."""

    # Its device-updatable kernel nodes, if any (driver_devnodes).
    device_nodes: Ready | None = None

    def __init__(self, graph: Any, bodies: Sequence[Any] = (), ctx: Any = None,
                 conditionals: dict[int, tuple] | None = None):
        LIVE.add(self)
        self._definition = graph
        self._bodies = tuple(bodies)
        self._conditionals = dict(conditionals or {})
        self._ctx = ctx
        self._graph = None
        self._num_nodes: int | None = None
        # The executable whose definition this one's parameters come from
        # since its last update (None: its own). Definitions never change,
        # so this is the definition to update another graph from.
        self._applied: "Executable | None" = None
        # The pointers its nodes hold now, once a rebinding or an update from
        # a rebound graph has changed them (None: those of the definition).
        self._index: NodeIndex | None = None

    @property
    def num_nodes(self) -> int:
        if self._num_nodes is None:
            self._num_nodes = int(check("cuGraphGetNodes", cu.cuGraphGetNodes(self._definition))[1])
        return self._num_nodes

    @property
    def instantiated(self) -> bool:
        return self._graph is not None

    def instantiate(self) -> Any:
        # Graph-owned memory the graph does not free itself lives until its
        # next launch, which frees it and makes it again. Instantiated in the
        # graph's own context, whichever device is current: a graph captured
        # while another capture was active is instantiated at its first use.
        if self._graph is None:
            self._graph = check("cuGraphInstantiate", in_context(
                self._ctx, cu.cuGraphInstantiate, self._definition, _AUTO_FREE_ON_LAUNCH))
        return self._graph

    def launcher(self, handle: int) -> Callable[[], None]:
        """A call that launches the graph on the stream, with every argument
        converted once: replay loops pay for the driver call alone."""
        graph_exec = self.instantiate()
        stream = cu.CUstream(handle)
        graph_launch = cu.cuGraphLaunch
        ctx = self._ctx

        def launch() -> None:
            err, = graph_launch(graph_exec, stream)
            if err:
                # Another device is current: the launch is made again in the
                # graph's own context; a launch that succeeds costs nothing more.
                err = _again_in(ctx, err, graph_launch, graph_exec, stream)
                if err:
                    raise DriverError("cuGraphLaunch", err)

        if self.device_nodes is not None:
            return self.device_nodes.launcher(graph_exec, stream, ctx, launch)
        return launch

    def upload(self, handle: int) -> None:
        if self.device_nodes is not None:
            self.device_nodes.prepare(self.instantiate(), cu.CUstream(handle), self._ctx)
            return
        check("cuGraphUpload", in_context(self._ctx, cu.cuGraphUpload, self.instantiate(),
                                           cu.CUstream(handle)))

    def update(self, other: "Executable") -> None:
        in_context(self._ctx, self._update, other)

    def _update(self, other: "Executable") -> None:
        source = other._applied or other
        if source._definition is None:
            raise GraphClosedError(
                "the graph given was itself updated from a graph that has since "
                "been closed, whose parameters are gone; update from a graph "
                "that is still open")
        graph_exec = self.instantiate()
        previous = (self._applied, self._index)
        check("cuGraphExecUpdate", cu.cuGraphExecUpdate(graph_exec, source._definition))
        self._applied, self._index = (None if source is self else source), None
        if other._index is not None:
            # What other's rebindings changed, it runs on top of its definition.
            try:
                self._index = other._index.copy_onto(graph_exec, self._ctx, self._nodes())
            except Exception:
                self._restore(*previous)
                raise

    def _restore(self, applied: "Executable | None", index: NodeIndex | None) -> None:
        """Run again the parameters it ran before an update that failed
        half-way; what cannot be restored leaves the index unknown (None)."""
        source = applied or self
        try:
            check("cuGraphExecUpdate", cu.cuGraphExecUpdate(self._graph, source._definition))
            self._applied = applied
            if index is not None:
                for entry in index.entries:
                    entry.set_on(self._graph, self._ctx)
            self._index = index
        except Exception:  # noqa: BLE001  the update's own error is the one raised
            self._index = None

    def _nodes(self) -> list[Any]:
        return graph_nodes(self._definition, self._bodies)

    def definition(self) -> tuple[Any, dict[int, tuple]]:
        """The definition whose parameters the executable runs (its own, or
        that of the graph it was last updated from), and that definition's
        conditional nodes by handle: ``(kind, bodies, condition)``."""
        source = self._applied or self
        if source._definition is None:
            raise GraphClosedError(
                "this graph was updated from a graph that has since been closed, "
                "whose nodes are gone; update it again from a graph that is still open")
        return source._definition, source._conditionals

    def plan_rebind(self, moves: Sequence[Move]) -> Any:
        if self.device_nodes is not None:
            self.device_nodes.due = True  # an update from the host: upload again
        return self._node_index().plan(moves)

    def redo_rebind(self, change: Any, targets: Callable[[], Sequence[Any]]) -> bool:
        """Make the change a rebinding's plan made (``plan.change``) again;
        False, changing nothing, where the nodes were set otherwise since."""
        index = self._index
        if index is None or change.index() is not index:
            return False
        if self.device_nodes is not None:
            self.device_nodes.due = True
        return in_context(self._ctx, index.redo, change)

    def reparameterise(self, launches: Sequence[Any]) -> str | None:
        """Give each kernel, copy and fill node the work at its place among
        ``launches`` (``driver_divert.Taken``, in the order the capture made
        the nodes); or, changing nothing, say why that cannot be done."""
        if self._conditionals or self._bodies:
            return "the graph holds a conditional node (a device loop or branch)"
        return in_context(self._ctx, self._reparameterise, launches)

    def _reparameterise(self, launches: Sequence[Any]) -> str | None:
        return self._node_index().reparameterise(launches, self.num_nodes)

    def node_params(self) -> dict[int, Any]:
        """The parameters its kernel, copy and fill nodes run with, by node
        handle, where they may differ from its definition's (set since the
        capture); empty where it runs another graph's parameters."""
        index = self._index
        if index is None or self._applied is not None:
            return {}
        return {int(entry.node): entry.params for entry in index.entries}

    def _node_index(self) -> NodeIndex:
        if self._index is None:
            source = self._applied or self
            if source._definition is None:
                raise GraphClosedError(
                    "this graph was updated from a graph that has since been "
                    "closed, whose parameters are gone; update it again from a "
                    "graph that is still open")
            nodes = self._nodes()
            self._index = NodeIndex(self.instantiate(), self._ctx, nodes,
                                    nodes if source is self else source._nodes())
        return self._index

    def close(self) -> None:
        """Destroy the instantiation and the graph; once is enough."""
        graph, self._graph = self._graph, None
        definition, self._definition = self._definition, None
        if graph is not None:
            cu.cuGraphExecDestroy(graph)
        if definition is not None:
            cu.cuGraphDestroy(definition)


# Every executable not yet collected, for what must close them before exit.
LIVE: "weakref.WeakSet[Executable]" = weakref.WeakSet()


# ---------------------------------------------------------------- capture safety

_NUMBA_DEFER_CLEANUP = _numba_driver.HostOnlyCUDAMemoryManager.defer_cleanup

# The numba classes whose host-facing methods numbagraph guards during capture.
DEVICE_ARRAY_TYPES = (
    _devicearray.DeviceNDArrayBase,
    _devicearray.DeviceNDArray,
    _devicearray.DeviceRecord,
)
STREAM_TYPE = _numba_driver.Stream
EVENT_TYPE = _numba_driver.Event

_NON_BLOCKING = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)


def in_kernel() -> bool:
    """Kernels run on the GPU: Python code never runs inside one."""
    return False


def compile_kernel(dispatcher: Any, args: tuple) -> None:
    """numba's compile for a signature, typed as a launch types its arguments.
    A kernel of explicit signatures compiles no other: its launch converts
    the arguments to one of them, which must be there to pick."""
    types = argument_types(dispatcher, args)  # checks the kernel first
    if (types in dispatcher.overloads or dispatcher._can_compile
            or getattr(dispatcher, "specialized", False)):
        dispatcher.compile(types)
        return
    _picked_overload(dispatcher, types)


# What each conversion counts in numba's rating of an overload: (unsafe,
# safe, promotions), the fewest unsafe conversions first.
_RATED = {Conversion.exact: (0, 0, 0), Conversion.promote: (0, 0, 1),
          Conversion.safe: (0, 1, 0), Conversion.unsafe: (1, 0, 0)}


def _picked_overload(dispatcher: Any, types: tuple) -> tuple:
    """The argument types of the overload a launch of a kernel that compiles
    no other picks for arguments of ``types``: as numba's dispatcher rates
    them (its type manager's selectOverload), each argument converted to
    the overload's type, the fewest unsafe conversions winning, then the
    fewest safe ones, then the fewest promotions. KernelArgumentError,
    naming the signatures, where none converts or several rate the same
    (numba refuses that launch as ambiguous)."""
    typing = dispatcher.typingctx
    rated: list[tuple[tuple[int, ...], tuple]] = []
    for formal in dispatcher.overloads:
        if len(formal) != len(types):
            continue
        counts = [_RATED.get(typing.can_convert(given, wanted)) for given, wanted
                  in zip(types, formal)]
        if None not in counts:
            rated.append((tuple(map(sum, zip((0, 0, 0), *counts))), formal))
    best = min((rating for rating, _ in rated), default=None)
    picked = [formal for rating, formal in rated if rating == best]
    if len(picked) == 1:
        return picked[0]

    def listed(signatures: Any) -> str:
        return "; ".join(f"({', '.join(map(str, s))})" for s in signatures)

    given = ", ".join(map(str, types))
    how = ("convert to none of them" if not picked else
           f"convert equally well to {listed(picked)}, so numba would not know which "
           "to launch")
    raise KernelArgumentError(
        f"{_kernel_name(dispatcher)} was compiled for explicit signatures only "
        f"({listed(dispatcher.overloads)}) and compiles no other, and arguments of types "
        f"({given}) {how}. Pass arguments of one signature's types: an array of its "
        "dtype and layout, a number as a NumPy scalar of its type (np.int32(5), "
        "np.float64(5))")


def argument_types(dispatcher: Any, args: tuple) -> tuple:
    """The numba types a launch of ``dispatcher`` gives ``args``."""
    if not isinstance(dispatcher, CUDADispatcher):
        raise TypeError(
            f"ng.precompile takes a @cuda.jit kernel, not {type(dispatcher).__name__}")
    typeof = dispatcher.typeof_pyval

    def launch_type(arg: Any) -> Any:
        # A launch types every Python int as int64 (numba's C dispatcher),
        # where typeof would make a large one uint64.
        return numba_types.int64 if type(arg) is int else typeof(arg)

    return checked_types(_kernel_name(dispatcher), launch_type, args)


def _kernel_name(dispatcher: Any) -> str:
    return getattr(getattr(dispatcher, "py_func", None), "__name__", "kernel")


def frees_wait_for_device() -> bool:
    """numba's own memory manager frees with cuMemFree, which waits for the
    device; a plugged-in one may free in stream order. numba gives a context
    its manager as it makes it, so the answer is worked out once a context."""
    key = _context_key()
    known = _frees_wait.get(key)
    if known is None:
        known = _frees_wait[key] = (
            type(_numba_context().memory_manager) is _numba_driver.NumbaCUDAMemoryManager)
    return known


# context handle -> whether frees through its memory manager wait for the device
_frees_wait: dict[int, bool] = {}


def joins_legacy_stream(handle: int) -> bool:
    """Whether work on the legacy default stream waits on this stream (it
    was not created non-blocking).

    The driver invalidates a capture whose stream is asked for its flags, so
    a capturing stream is answered from what was seen of it before it
    captured, or as blocking (the answer that refuses more) if nothing was."""
    err, status = cu.cuStreamIsCapturing(cu.CUstream(handle))
    if err != cu.CUresult.CUDA_SUCCESS or status != CAPTURE_NONE:
        return _blocking.get(handle, True)
    err, flags = cu.cuStreamGetFlags(cu.CUstream(handle))
    if err != cu.CUresult.CUDA_SUCCESS:
        return True
    blocking = not int(flags) & _NON_BLOCKING
    if len(_blocking) > 4096:
        _blocking.clear()
    _blocking[handle] = blocking
    return blocking


# handle -> whether the stream was blocking when last asked outside a capture.
_blocking: dict[int, bool] = {}


# numba's Context per CUDA context handle, looked up once: capture begins and
# op launches need it, and cuda.current_context() is a slow call.
_numba_contexts: dict[int, Any] = {}


def _current_context() -> tuple[int, Any]:
    """(the current CUDA context's handle, numba's Context for it), made
    current if no context is."""
    err, current = cu.cuCtxGetCurrent()
    key = int(current) if err == cu.CUresult.CUDA_SUCCESS else 0
    ctx = _numba_contexts.get(key) if key else None
    # A device reset (cuda.close()) gives the device a new Context object.
    if ctx is None or ctx.device.primary_context is not ctx:
        ctx = cuda.current_context()
        key = int(ctx.handle)
        _numba_contexts[key] = ctx
    return key, ctx


def _context_key() -> int:
    """The current CUDA context's handle, as :func:`_current_context` gives
    it, in one driver call when a context is current."""
    err, current = cu.cuCtxGetCurrent()
    key = 0 if err else int(current)
    return key if key else _current_context()[0]


def _numba_context() -> Any:
    return _current_context()[1]


def _stream_context(handle: int) -> Any:
    """numba's Context for the context the stream belongs to: the frees a
    capture holds are those of its stream's device, whichever device is
    current."""
    key, ctx = _current_context()
    err, owner = cu.cuStreamGetCtx(handle)
    if err != cu.CUresult.CUDA_SUCCESS or int(owner) in (0, key):
        return ctx
    found = _numba_contexts.get(int(owner))
    if found is None:
        for gpu in cuda.gpus:
            with gpu:
                candidate = cuda.current_context()
            _numba_contexts[int(candidate.handle)] = candidate
        found = _numba_contexts.get(int(owner), ctx)
    return found


def _hold_frees(ctx: Any) -> Callable[[], None]:
    """Defer numba's frees in ``ctx``; returns the call that ends the hold.

    Numba's own ``Context.defer_cleanup`` raises the disable count of two
    pending-free queues, the context's and its memory manager's, through
    three generator context managers. With numba's memory manager the counts
    are raised here directly (every capture begins here: hot path), which is
    the same hold; a memory-manager plugin gets its own context manager.
    """
    entry = _free_queues.get(id(ctx))
    if entry is None or entry[0] is not ctx:
        entry = _free_queues[id(ctx)] = (ctx, _counted_queues(ctx))
    queues = entry[1]
    if queues is None:
        hold = ctx.defer_cleanup()
        hold.__enter__()
        return functools.partial(hold.__exit__, None, None, None)
    for queue in queues:
        queue._disable_count += 1
    return functools.partial(_release_queues, queues)


# id(numba Context) -> (the Context, its pending-free queues or None)
_free_queues: dict[int, tuple[Any, tuple | None]] = {}


def _counted_queues(ctx: Any) -> tuple | None:
    """The queues whose counts numba's defer_cleanup raises in ``ctx``, when
    its memory manager is numba's own; else None."""
    manager = ctx.memory_manager
    queues = (getattr(manager, "deallocations", None), ctx.deallocations)
    if (type(manager).defer_cleanup is _NUMBA_DEFER_CLEANUP
            and all(isinstance(getattr(q, "_disable_count", None), int) for q in queues)):
        return queues
    return None


def _release_queues(queues: tuple) -> None:
    for queue in queues:
        queue._disable_count -= 1


def _again_in(ctx: Any, err: Any, call: Callable[..., tuple], *args: Any) -> Any:
    """The ``CUresult`` of ``call(*args)`` made again with ``ctx`` current,
    after it failed with ``err``; ``err`` itself when ``ctx`` is unknown or
    was current already (another try would fail alike)."""
    failed, current = cu.cuCtxGetCurrent()
    if ctx is None or (not failed and int(current) == int(ctx)):
        return err
    check("cuCtxPushCurrent", cu.cuCtxPushCurrent(ctx))
    try:
        return call(*args)[0]
    finally:
        cu.cuCtxPopCurrent()


# ---------------------------------------------------------------- scalars

# struct codes of each scalar dtype, and of the unsigned word of its size.
_STRUCT_CODES = {
    "b1": "?", "i1": "b", "i2": "h", "i4": "i", "i8": "q",
    "u1": "B", "u2": "H", "u4": "I", "u8": "Q", "f2": "e", "f4": "f", "f8": "d",
}
_WORDS = {1: "B", 2: "H", 4: "I", 8: "Q"}
_MEMSETS = {1: "cuMemsetD8Async", 2: "cuMemsetD16Async", 4: "cuMemsetD32Async"}


def _bits_of(dtype: np.dtype) -> Callable[[Any], int]:
    """``value`` (already checked to fit ``dtype``) -> its bits as an unsigned int."""
    if dtype.kind in "biu":
        mask = (1 << (8 * dtype.itemsize)) - 1
        return lambda value: int(value) & mask
    pack = struct.Struct("<" + _STRUCT_CODES[dtype.kind + str(dtype.itemsize)]).pack
    unpack = struct.Struct("<" + _WORDS[dtype.itemsize]).unpack
    return lambda value: unpack(pack(value))[0]


def scalar_store(dev: Any, dtype: np.dtype, handle: int) -> Callable[[Any], None]:
    """A call ``store(value)`` that enqueues "set ``dev`` to ``value``" on the
    stream; ``value`` has been checked to fit ``dtype``.

    Scalars of up to 4 bytes are set by a memset that carries the value in
    the call itself: no host buffer is involved, and it is the cheaper call
    (docs/benchmarks). 8-byte scalars are copied from a pageable buffer, one
    call where a memset would take two; the driver has consumed the buffer
    when the call returns, so back-to-back updates never overwrite one
    another, and threads take turns at the buffer.
    """
    dtype = np.dtype(dtype)
    dst = cu.CUdeviceptr(dev.device_ctypes_pointer.value)
    stream = cu.CUstream(handle)
    # The stream's context, in which a store made while another device is
    # current is made again; with one device there is no other.
    ctx = None
    if _device_count() > 1:
        err, ctx = cu.cuStreamGetCtx(handle)
        ctx = None if err else ctx
    if dtype.itemsize in _MEMSETS:
        # Hot path (one call per replay-loop step): the value's bits are
        # worked out inline, as _bits_of does, without its extra call.
        name = _MEMSETS[dtype.itemsize]
        memset = getattr(cu, name)
        if dtype.kind in "biu":
            mask = (1 << (8 * dtype.itemsize)) - 1

            def store(value: Any) -> None:
                err, = memset(dst, int(value) & mask, 1, stream)
                if err:
                    err = _again_in(ctx, err, memset, dst, int(value) & mask, 1, stream)
                    if err:
                        raise DriverError(name, err)

            return store

        pack = struct.Struct("<" + _STRUCT_CODES[dtype.kind + str(dtype.itemsize)]).pack
        unpack = struct.Struct("<" + _WORDS[dtype.itemsize]).unpack

        def store(value: Any) -> None:
            err, = memset(dst, unpack(pack(value))[0], 1, stream)
            if err:
                err = _again_in(ctx, err, memset, dst, unpack(pack(value))[0], 1, stream)
                if err:
                    raise DriverError(name, err)

        return store

    buf = np.zeros(1, dtype)
    src, nbytes = buf.ctypes.data, buf.nbytes
    copy = cu.cuMemcpyHtoDAsync
    # The buffer is the scalar's: threads updating one scalar take turns, so
    # that none writes it while the driver reads another's value from it.
    lock = threading.Lock()

    def store(value: Any) -> None:
        lock.acquire()
        try:
            buf[0] = value
            err, = copy(dst, src, nbytes, stream)
            if err:
                err = _again_in(ctx, err, copy, dst, src, nbytes, stream)
                if err:
                    raise DriverError("cuMemcpyHtoDAsync", err)
        finally:
            lock.release()

    return store


def scalar_store_recorded(dev: Any, value: Any, dtype: np.dtype, handle: int) -> None:
    """Record "set the scalar to ``value``" into the capture on the stream.

    Memset nodes carry their value inside the graph, so nothing on the host
    has to outlive the call; an 8-byte value takes two 4-byte memsets.
    """
    dtype = np.dtype(dtype)
    ptr = dev.device_ctypes_pointer.value
    bits = _bits_of(dtype)(value)
    if dtype.itemsize in _MEMSETS:
        name = _MEMSETS[dtype.itemsize]
        check(name, getattr(cu, name)(ptr, bits, 1, handle))
        return
    for i in range(dtype.itemsize // 4):
        word = (bits >> (32 * i)) & 0xFFFFFFFF
        check("cuMemsetD32Async", cu.cuMemsetD32Async(ptr + 4 * i, word, 1, handle))


def device_pointer(dev: Any) -> int:
    return dev.device_ctypes_pointer.value or 0


def array_interface(dev: Any) -> dict:
    return dict(dev.__cuda_array_interface__, stream=None)
