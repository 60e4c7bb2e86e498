"""Suite ``graphed``: one call of an ``ng.graphed`` step, when the arrays
stay the same, when one of them changes and when all of them do, against
launching the captured graph, capturing the step again, and PyTorch's
static-input copy.

A step is a plain function of N launches (N = 10 and 100) of one numba
kernel, ``z = x + 0.5 y``, on the stream: it reads ``x`` and ``y`` and
writes ``z``. Its kernels cover the first 1024 elements of the arrays
whatever their length, so that a step costs the same at every array size
and a larger input changes only what it costs to bring the input in.
Each call passes one of two sets of arrays:

* same arrays: ``(x, y, z)`` every call;
* one changed: ``x`` alternates between two buffers, ``y`` and ``z`` stay;
* all changed: ping-pong between ``(x, y, z)`` and ``(x', y', z')``;
* one changed, new each call: ``x`` goes round eight buffers, more than a
  graphed function remembers the calls of, so that every call's arrays are
  new to it and its rebinding is worked out from the arrays (in the two
  cases before, after the first calls, it makes a rebinding made before
  again).

Peers in each case: numbagraph (``f(x, y, z)``, ``f = ng.graphed(step,
stream=s)``, which rebinds the arrays that differ from the last call's and
launches), ``graph.launch()`` of the same step captured once (the floor: it
never changes its arrays), the step captured again and instantiated each
call (the graph of the call before closed), and captured again each call
to ``graph.update(new)`` one graph. At inputs of 4 KiB, 1 MiB and 64 MiB
the N = 10 step runs with ``x`` changing each call: numbagraph rebinding
it, and PyTorch copying it into the static input of a
``torch.cuda.CUDAGraph`` of the same numba kernels (``static.copy_(x)``
+ ``replay()``). A new signature each call: the N = 100 step called with
views one element longer than the last call's, a shape it never saw,
through ``ng.graphed(step, stream=s, warmup=0, max_graphs=1)`` (every call
captures, and its graph takes the place of the last), against the step
captured again with ``ng.capture`` (which instantiates) and launched, and
captured again to ``graph.update(new)`` one graph.

Host clock over R calls, stopped after the stream synchronises; median of
the trials after one untimed batch, the peers taking turns trial by trial.
Before it is timed, every peer's calls are checked (the graphed function's
warm-up run and capture fall there): the output of each call poisoned, the
call made, and the output compared with ``x + 0.5 y`` of that call's
arrays. After the trials the graphed function's ``cache_info()`` must show
one capture, no eviction, and rebinds exactly when the case changes arrays
(with a new signature each call: no call run as written).

What a rebinding costs, taken apart:

* Setting one node's parameters on an executable graph with the driver's
  own call (``cuGraphExecKernelNodeSetParams``,
  ``cuGraphExecMemcpyNodeSetParams``, ``cuGraphExecMemsetNodeSetParams``),
  through cuda.bindings and from the C++ floor (the runtime's
  ``cudaGraphExec*NodeSetParams``): one graph of a kernel launch, a device
  copy and a fill, captured by the driver's calls on arrays of their own;
  each call puts one node on the other of two buffers, its parameters
  built beforehand. Nothing is launched while they are timed; one launch
  afterwards checks that the executable still runs. Host clock over R
  calls, us per call.
* A step of 100 nodes (4 on the simulator) of which 1, 10 or 100 (1, 2, 4)
  hold the argument that changes each call, for each kind of node: kernel
  launches (the others launch on ``y`` and ``z``, which stay), device
  copies of ``x`` into ``z`` (the others copy ``y``), and
  ``DeviceScalar.update`` fills of a scalar that alternates between two
  (the others fill one that stays). numbagraph's call against
  ``graph.launch()`` of the step captured once, each timed on the host
  clock from the call until it returns, the stream synchronised (untimed)
  before each call: the host's own time, which a GPU still running the
  last call would hide. numbagraph's time less the plain launch's is the
  rebinding; the least-squares line through it over the nodes moved gives
  its fixed part (the intercept: working out from the call's arguments
  what moved) and its cost per node moved (the slope), from the medians,
  and per trial for their spread. Outputs are checked as above.
* The same steps from the C++ floor (``floor moved``): tiny kernel
  launches, device copies and 4-byte fills, the moved ones on a buffer
  that alternates between two. Each call sets the moved nodes with the
  runtime's ``cudaGraphExec*NodeSetParams`` and launches the graph, against
  the launch alone, timed alone as above; the same line through their
  difference is the driver's own fixed part and cost per node moved, what
  an executable changed since its last launch costs to set and launch.
"""

from __future__ import annotations

import ctypes
import gc
import time
import types
import warnings
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np
from numba import cuda

import numbagraph as ng
from numbagraph.graphed import _SEEN

from .core import Config, Context, Row, SuiteResult, clamp_repeats
from .floor import PEER as CPP
from .floor import floor
from .peers import checked, numba_tiny, raw_driver, torch_cuda
from .timing import Contender

__all__ = [
    "NAME", "TITLE", "run", "case", "size_case", "size_label", "STEPS", "SIZES",
    "SAME", "ONE", "ALL", "UNSEEN", "ROUND", "PEER", "PLAIN", "RECAPTURE", "RECAPTURE_UPDATE",
    "TORCH", "NEW_SIGNATURE", "KERNEL", "MEMCPY", "MEMSET", "NODE_KINDS", "FIT_NODES", "MOVED",
    "SIMULATED_FIT_NODES", "SIMULATED_MOVED", "BINDINGS", "CPP", "PER_NODE", "FIXED",
    "HOST_UNIT", "NODE_UNIT", "FIT_UNIT", "SET_CALLS", "set_case", "moved_case",
    "cpp_fit_case", "CPP_LAUNCH",
    "fit_case", "fit_line",
]

NAME = "graphed"
TITLE = "Graphed step: one call, arrays the same or changed"
UNIT = "us/call"

STEPS = (10, 100)              # launches per step on a GPU
SIMULATED_STEPS = (2, 4)       # on the simulator, where a launch costs milliseconds
SIZES = (4 << 10, 1 << 20, 64 << 20)   # bytes of the input in the size cases
SAME, ONE, ALL = "same arrays", "one changed", "all changed"
UNSEEN = "one changed, new each call"
# Buffers x goes round in the UNSEEN case: more than a graphed function
# remembers the calls of.
ROUND = _SEEN + 2
PEER = "numbagraph"
PLAIN = "plain launch"
RECAPTURE = "recapture + instantiate"
RECAPTURE_UPDATE = "recapture + update"
TORCH = "PyTorch"
NEW_SIGNATURE = "new signature"

# The rebinding taken apart: the driver's call per kind of node, and steps
# moving some of their nodes.
KERNEL, MEMCPY, MEMSET = "kernel", "memcpy", "memset"
NODE_KINDS = (KERNEL, MEMCPY, MEMSET)
SET_CALLS = {KERNEL: "cuGraphExecKernelNodeSetParams",
             MEMCPY: "cuGraphExecMemcpyNodeSetParams",
             MEMSET: "cuGraphExecMemsetNodeSetParams"}
FIT_NODES, MOVED = 100, (1, 10, 100)              # nodes per step, nodes moved
SIMULATED_FIT_NODES, SIMULATED_MOVED = 4, (1, 2, 4)
BINDINGS = "cuda.bindings"
CPP_LAUNCH = "C++ launch alone"
PER_NODE, FIXED = "per node moved", "fixed part"
HOST_UNIT = "us/call, host"    # host time of the call alone, the stream idle as it begins
NODE_UNIT = "us/node"
FIT_UNIT = "us"
_FLOOR_KINDS = {"kernel node": KERNEL, "memcpy node": MEMCPY, "memset node": MEMSET}


def case(nodes: int, change: str) -> str:
    """The name of the case of an ``nodes``-launch step called with ``change``."""
    return f"{nodes} nodes, {change}"


def size_label(nbytes: int) -> str:
    """``nbytes`` as ``4 KiB``, ``1 MiB``, ``64 MiB``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def size_case(nbytes: int) -> str:
    """The name of the case of an input of ``nbytes`` bytes."""
    return f"input {size_label(nbytes)}"


def set_case(kind: str) -> str:
    """The name of the case of the driver's call setting one ``kind`` node."""
    return f"{SET_CALLS[kind]}, one node"


def cpp_fit_case(kind: str) -> str:
    """The name of the case of the line fitted to C++ setting ``kind``
    nodes and launching, less its launch alone: the driver's own cost."""
    return f"C++ setting {kind} nodes and launching, fitted"


def moved_case(nodes: int, moved: int, kind: str) -> str:
    """The name of the case of a ``nodes``-node step whose call moves
    ``moved`` of its ``kind`` nodes."""
    return f"{nodes} nodes, {moved} {kind} node{'' if moved == 1 else 's'} moved"


def fit_case(kind: str) -> str:
    """The name of the case of the line fitted to the rebinding of ``kind``
    nodes: its rows are the fixed part and the part per node moved."""
    return f"rebinding {kind} nodes, fitted"


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line through ``(x, y)``
    points of at least two distinct x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        raise ValueError("a line needs points at two distinct x at least")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return mean_y - slope * mean_x, slope


@cuda.jit
def _node(x, y, z):
    i = cuda.grid(1)
    if i < z.size:
        z[i] = x[i] + 0.5 * y[i]


def _grid(config: Config) -> tuple[int, int]:
    # A simulated launch costs a Python thread per GPU thread.
    return (1, 4) if config.simulated else config.grid


def make_step(nodes: int, stream: Any, grid: tuple[int, int]) -> Callable[..., None]:
    """``step(x, y, z)``: ``nodes`` launches of ``z = x + 0.5 y`` on ``stream``."""
    blocks, threads = grid

    def step(x: Any, y: Any, z: Any) -> None:
        launch = _node[blocks, threads, stream]
        for _ in range(nodes):
            launch(x, y, z)

    return step


class _Arrays:
    """Two sets of three float32 device arrays of ``length`` elements on
    ``stream`` (and, once the UNSEEN case asks, ``ROUND - 2`` more arrays
    for its ``x``); the first ``covered`` elements of each hold a pattern of
    its own, so that a call that used the wrong array gives the wrong
    output."""

    def __init__(self, stream: Any, length: int, covered: int):
        self.stream = stream
        self.covered = covered
        self.sets = tuple(
            tuple(cuda.device_array(length, np.float32, stream=stream) for _ in range(3))
            for _ in range(2)
        )
        self._length = length
        self._host: dict[int, np.ndarray] = {}
        for j, arrays in enumerate(self.sets):
            for r, array in enumerate(arrays):
                self._fill(array, j, r)
        self._round: tuple = ()
        self._nan = np.full(covered, np.nan, np.float32)
        self._views: list = []   # kept, so that the ids in _host name them alone
        stream.synchronize()

    def _fill(self, array: Any, j: int, r: int) -> None:
        """Give ``array``, the ``r``-th of set ``j``, its pattern."""
        values = ((np.arange(self.covered) % 61).astype(np.float32) * np.float32(0.25)
                  + np.float32(100 * j + 10 * r))
        array[:self.covered].copy_to_device(values, stream=self.stream)
        self._host[id(array)] = values

    def triples(self, change: str) -> tuple[tuple, ...]:
        """The arrays of the calls, in turn."""
        (x, y, z), (x2, y2, z2) = self.sets
        if change == UNSEEN:
            if not self._round:
                more = [cuda.device_array(self._length, np.float32, stream=self.stream)
                        for _ in range(ROUND - 2)]
                for j, array in enumerate(more, start=2):
                    self._fill(array, j, 0)
                self.stream.synchronize()
                self._round = (x, x2, *more)
            return tuple((xk, y, z) for xk in self._round)
        second = {SAME: (x, y, z), ONE: (x2, y, z), ALL: (x2, y2, z2)}[change]
        return (x, y, z), second

    def views(self, count: int) -> list[tuple]:
        """``count`` triples of views of the first set's arrays, the i-th
        ``covered + i`` elements long: each of a shape the others lack."""
        made = []
        for i in range(count):
            triple = tuple(a[:self.covered + i] for a in self.sets[0])
            for view, base in zip(triple, self.sets[0]):
                self._host[id(view)] = self._host[id(base)]
            made.append(triple)
        self._views += made
        return made

    def check(self, what: str, call: Callable[[tuple], Any], sequence: Sequence[tuple],
              sync: Callable[[], Any],
              expect: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> None:
        """Make ``call(args)`` for each ``args`` in ``sequence`` and raise
        unless each wrote ``expect(x, y)`` of its own arrays into its ``z``
        (default ``x + 0.5 y``); ``what`` names the case in the error."""
        k = self.covered
        for n, (x, y, z) in enumerate(sequence):
            z[:k].copy_to_device(self._nan, stream=self.stream)
            self.stream.synchronize()
            call((x, y, z))
            sync()
            got = z[:k].copy_to_host(stream=self.stream)
            self.stream.synchronize()
            hx, hy = self._host[id(x)], self._host[id(y)]
            want = hx + np.float32(0.5) * hy if expect is None else expect(hx, hy)
            if not np.array_equal(got, want):
                bad = int(np.argmax(got != want))
                raise AssertionError(
                    f"{what}: call {n + 1} wrote {got[bad]} at element {bad}, expected "
                    f"{want[bad]}: the step ran on other arrays than it was given"
                )


def _calls(config: Config, nodes: int) -> int:
    """Calls per trial of the peers that launch a graph: an even count, so
    that both sets of arrays are used equally."""
    n = clamp_repeats(config.target_units // 10, nodes, config.min_repeats, config.max_repeats)
    return n + n % 2


def _recaptures(config: Config, nodes: int) -> int:
    """Calls per trial of the peers that capture each call: as many as hold
    the capture suite's launches per trial."""
    n = max(2, config.capture_launches // nodes)
    return n + n % 2


def _alternating(sequence: tuple[tuple, ...], count: int) -> list:
    """``count`` calls' arguments, going round ``sequence``."""
    return [sequence[i % len(sequence)] for i in range(count)]


def _setting(ctx: Context) -> types.SimpleNamespace:
    """The stream, the grid, and the arrays of the step cases."""

    def make():
        cfg = ctx.config
        stream = numba_tiny(ctx).stream
        grid = _grid(cfg)
        covered = grid[0] * grid[1]
        return types.SimpleNamespace(stream=stream, grid=grid, covered=covered,
                                     arrays=_Arrays(stream, max(cfg.elements, covered),
                                                    covered))

    return ctx.shared("graphed", make)


def _graphed(ctx: Context, arrays: _Arrays, nodes: int, change: str,
             what: str | None = None, max_graphs: int = 16) -> Contender:
    what = what or case(nodes, change)
    setting = _setting(ctx)
    s = setting.stream
    f = ng.graphed(make_step(nodes, s, setting.grid), stream=s, max_graphs=max_graphs)
    turns = arrays.triples(change)
    arrays.check(what, lambda args: f(*args), [*turns, *turns], s.synchronize)
    # Whole rounds: batches that follow one another keep the turns' order,
    # so that no set comes back sooner than its turn.
    count = -(-_calls(ctx.config, nodes) // len(turns)) * len(turns)
    calls = _alternating(turns, count)

    def batch():
        for args in calls:
            f(*args)

    # Two sets taking turns get a graph each where the function may hold
    # two; else one graph is rebound from set to set.
    twins = change in (ONE, ALL) and max_graphs > 1
    captures, rebinds = (2, False) if twins else (1, change != SAME)

    def close():
        info = f.cache_info()
        f.clear()
        if info.captures != captures or info.evictions or (info.rebinds > 0) != rebinds:
            raise AssertionError(
                f"{what}: cache_info() {info}: expected {captures} capture(s), "
                f"no eviction and {'rebinds' if rebinds else 'no rebind'}"
            )

    return Contender(batch, len(calls), s.synchronize, close=close,
                     note="f(x, y, z), f = ng.graphed(step, stream=s)")


def _plain(ctx: Context, arrays: _Arrays, nodes: int, change: str) -> Contender:
    setting = _setting(ctx)
    s = setting.stream
    step = make_step(nodes, s, setting.grid)
    first = arrays.triples(change)[0]
    with ng.capture(s) as cap:
        step(*first)
    graph = cap.graph
    graph.upload()
    arrays.check(case(nodes, change), lambda args: graph.launch(), [first], s.synchronize)
    reps = _calls(ctx.config, nodes)

    def batch():
        for _ in range(reps):
            graph.launch()

    return Contender(batch, reps, s.synchronize, close=graph.close,
                     note="graph.launch() of the step captured once, arrays never changed")


def _recapturing(step: Callable[..., None], s: Any, first: tuple,
                 update: bool) -> tuple[Callable[[tuple], None], Callable[[], None], str]:
    """``call(args)``, which captures ``step(*args)`` again and launches it,
    ``close()`` and the note: with ``update``, one graph (captured first on
    ``first``) updated from each new capture, which is closed; without, each
    new graph launched and the one before closed."""

    def capture(args: tuple) -> Any:
        with ng.capture(s) as cap:
            step(*args)
        return cap.graph

    held = [capture(first)]

    if update:
        def call(args: tuple) -> None:
            new = capture(args)
            held[0].update(new)
            new.close()
            held[0].launch()
    else:
        def call(args: tuple) -> None:
            new = capture(args)
            new.launch()
            held[0].close()
            held[0] = new

    note = ("ng.capture of the step (which instantiates it) + graph.update(new) "
            "+ launch" if update else
            "ng.capture of the step + launch; the graph of the call before closed")
    return call, lambda: held[0].close(), note


def _recapture(update: bool):
    def setup(ctx: Context, arrays: _Arrays, nodes: int, change: str) -> Contender:
        setting = _setting(ctx)
        s = setting.stream
        turns = arrays.triples(change)
        call, close, note = _recapturing(make_step(nodes, s, setting.grid), s, turns[0],
                                         update)
        arrays.check(case(nodes, change), call, [*turns, *turns], s.synchronize)
        calls = _alternating(turns, _recaptures(ctx.config, nodes))

        def batch():
            for args in calls:
                call(args)

        return Contender(batch, len(calls), s.synchronize, close=close, note=note)
    return setup


STEP_PEERS = {
    PEER: _graphed,
    PLAIN: _plain,
    RECAPTURE: _recapture(False),
    RECAPTURE_UPDATE: _recapture(True),
}


def _torch(ctx: Context, arrays: _Arrays, nodes: int, what: str) -> Contender:
    """PyTorch's way to give a graph a new input: copy it into the tensor
    the graph was captured with, then replay."""
    torch = torch_cuda(ctx)
    setting = _setting(ctx)
    arrays.stream.synchronize()
    ts = torch.cuda.Stream()
    on_ts = cuda.external_stream(ts.cuda_stream)
    pair = arrays.triples(ONE)
    (x, y, z), (x2, _, _) = pair
    inputs = {id(a): torch.as_tensor(a, device="cuda") for a in (x, x2)}
    static = torch.empty_like(inputs[id(x)])
    static_view = cuda.as_cuda_array(static)
    step = make_step(nodes, on_ts, setting.grid)
    with torch.cuda.stream(ts):
        static.copy_(inputs[id(x)])
    step(static_view, y, z)   # compiled and loaded before the capture
    ts.synchronize()
    graph = torch.cuda.CUDAGraph()
    with cuda.current_context().defer_cleanup():   # no numba free inside the capture
        with torch.cuda.graph(graph, stream=ts, capture_error_mode="thread_local"):
            step(static_view, y, z)
    replay, copy, on_stream = graph.replay, static.copy_, torch.cuda.stream

    def call(args: tuple) -> None:
        with on_stream(ts):
            copy(inputs[id(args[0])])
            replay()

    arrays.check(what, call, [*pair, *pair], ts.synchronize)
    sources = [inputs[id(args[0])] for args in _alternating(pair, _calls(ctx.config, nodes))]

    def batch():
        with on_stream(ts):
            for source in sources:
                copy(source)
                replay()

    return Contender(batch, len(sources), ts.synchronize, close=graph.reset,
                     note="static.copy_(x) + CUDAGraph.replay() of the same numba kernels")


def _sized(ctx: Context, arrays: _Arrays, nodes: int, what: str) -> Contender:
    # One graph, rebound to the other input each call.
    contender = _graphed(ctx, arrays, nodes, ONE, what, max_graphs=1)
    contender.note = ("f(x, y, z) with x changed each call, f = ng.graphed(step, stream=s, "
                      "max_graphs=1): a rebind + launch")
    return contender


SIZE_PEERS = {PEER: _sized, TORCH: _torch}


# A new signature each call.

_CHECKED = 2   # calls of each peer checked before the trials


def _signature_setting(ctx: Context, nodes: int) -> types.SimpleNamespace:
    """Arrays long enough for a view of a new length at every call of the
    case, the views checked first, and those of each batch."""

    def make():
        cfg = ctx.config
        setting = _setting(ctx)
        per_batch = _recaptures(cfg, nodes)
        batches = 1 + cfg.trials   # the untimed one, then the trials
        count = _CHECKED + batches * per_batch
        arrays = _Arrays(setting.stream, setting.covered + count, setting.covered)
        views = arrays.views(count)
        return types.SimpleNamespace(
            arrays=arrays, checked=views[:_CHECKED], per_batch=per_batch,
            batches=[views[_CHECKED + j * per_batch:_CHECKED + (j + 1) * per_batch]
                     for j in range(batches)])

    return ctx.shared(f"graphed_signature_{nodes}", make)


def _in_turn(batches: list[list]) -> Callable[[], list]:
    """The next batch's calls at each call, the first again after the last."""
    turn = [0]

    def next_batch() -> list:
        calls = batches[turn[0] % len(batches)]
        turn[0] += 1
        return calls

    return next_batch


def _new_signature_graphed(ctx: Context, nodes: int) -> Contender:
    setting = _setting(ctx)
    s = setting.stream
    sig = _signature_setting(ctx, nodes)
    f = ng.graphed(make_step(nodes, s, setting.grid), stream=s, warmup=0, max_graphs=1)
    what = case(nodes, NEW_SIGNATURE)
    # Each call evicts the graph of the last, which a graphed function warns of.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ng.GraphedWarning)
        sig.arrays.check(what, lambda args: f(*args), sig.checked, s.synchronize)
    next_batch = _in_turn(sig.batches)

    def batch():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ng.GraphedWarning)
            for args in next_batch():
                f(*args)

    def close():
        info = f.cache_info()
        f.clear()
        if info.eager:
            raise AssertionError(f"{what}: cache_info() {info}: with warmup=0 no call "
                                 "may run the step as written")

    return Contender(batch, sig.per_batch, s.synchronize, close=close,
                     note="f(x, y, z) with views of a length never passed before, "
                          "f = ng.graphed(step, stream=s, warmup=0, max_graphs=1)")


def _new_signature_recapture(update: bool):
    def setup(ctx: Context, nodes: int) -> Contender:
        setting = _setting(ctx)
        s = setting.stream
        sig = _signature_setting(ctx, nodes)
        call, close, note = _recapturing(make_step(nodes, s, setting.grid), s,
                                         sig.checked[0], update)
        try:
            sig.arrays.check(case(nodes, NEW_SIGNATURE), call, sig.checked[1:],
                             s.synchronize)
        except BaseException:
            close()
            raise
        next_batch = _in_turn(sig.batches)

        def batch():
            for args in next_batch():
                call(args)

        return Contender(batch, sig.per_batch, s.synchronize, close=close,
                         note=f"{note}; views of a length never passed before")
    return setup


SIGNATURE_PEERS = {
    PEER: _new_signature_graphed,
    RECAPTURE: _new_signature_recapture(False),
    RECAPTURE_UPDATE: _new_signature_recapture(True),
}


# One node's parameters set by the driver's own call.

_LAUNCH_FIELDS = ("func", "kern", "ctx", "gridDimX", "gridDimY", "gridDimZ",
                  "blockDimX", "blockDimY", "blockDimZ", "sharedMemBytes")
_MEMCPY_FIELDS = tuple(
    end + field for end in ("src", "dst")
    for field in ("XInBytes", "Y", "Z", "LOD", "MemoryType", "Host", "Device", "Array",
                  "Pitch", "Height")) + ("WidthInBytes", "Height", "Depth")
_MEMSET_FIELDS = ("dst", "pitch", "value", "elementSize", "width", "height")
# cuLaunchKernel's ``extra`` keys.
_BUFFER_POINTER, _END = 1, 0


def _copied(params: Any, fields: Sequence[str]) -> Any:
    """A new parameter struct of ``params``'s type, holding its ``fields``."""
    copy = type(params)()
    for name in fields:
        setattr(copy, name, getattr(params, name))
    return copy


def _kernel_layout(cu: Any, params: Any) -> list[tuple[int, int]]:
    """``[(offset, size), ...]`` of the kernel's parameters."""
    if int(params.func):
        query, handle = cu.cuFuncGetParamInfo, params.func
    else:
        query, handle = cu.cuKernelGetParamInfo, params.kern
    layout: list[tuple[int, int]] = []
    while True:
        err, offset, size = query(handle, len(layout))
        if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return layout   # past the last parameter
        if err:
            raise RuntimeError(f"cuFuncGetParamInfo/cuKernelGetParamInfo: {err}")
        layout.append((int(offset), int(size)))


def _kernel_values(params: Any, layout: list[tuple[int, int]]) -> bytes:
    """The kernel node's parameter values, packed at their offsets."""
    length = max((offset + size for offset, size in layout), default=0)
    raw = ctypes.create_string_buffer(max(-(-length // 8) * 8, 8))
    if int(params.kernelParams):
        given = ctypes.cast(int(params.kernelParams), ctypes.POINTER(ctypes.c_void_p))
        for i, (offset, size) in enumerate(layout):
            ctypes.memmove(ctypes.addressof(raw) + offset, given[i], size)
    elif int(params.extra):
        items = ctypes.cast(int(params.extra), ctypes.POINTER(ctypes.c_void_p))
        i = 0
        while (items[i] or _END) != _BUFFER_POINTER:
            if (items[i] or _END) == _END:
                raise RuntimeError("the kernel node's extra names no parameter buffer")
            i += 2
        ctypes.memmove(raw, items[i + 1], length)
    return raw.raw


def _kernel_params(cu: Any, node: Any, old: int, new: int) -> list:
    """The kernel node's parameters as captured, holding ``old`` in some
    8-byte slots, and the same with ``new`` there; each kept with the
    buffers its ``kernelParams`` point into."""
    params = checked("cuGraphKernelNodeGetParams", cu.cuGraphKernelNodeGetParams(node))
    layout = _kernel_layout(cu, params)
    raw = _kernel_values(params, layout)
    made = []
    for value in (old, new):
        values = ctypes.create_string_buffer(raw, len(raw))
        words = memoryview(values).cast("B").cast("Q")
        slots = [offset // 8 for offset, size in layout
                 if size == 8 and offset % 8 == 0 and words[offset // 8] == old]
        if not slots:
            raise RuntimeError("no parameter of the captured kernel node holds the array "
                               "its launch was given")
        for slot in slots:
            words[slot] = value
        base = ctypes.addressof(values)
        pointers = (ctypes.c_void_p * max(len(layout), 1))(
            *[base + offset for offset, _ in layout])
        launch = _copied(params, _LAUNCH_FIELDS)
        launch.kernelParams = ctypes.addressof(pointers)
        launch.extra = 0
        made.append((launch, values, pointers))
    return made


def _raw_nodes(ctx: Context) -> types.SimpleNamespace:
    """An executable graph of a launch of the step's kernel, a device copy
    and a fill, captured by the driver's own calls on arrays of its own;
    per kind of node, the node and two parameter sets, one on each of two
    buffers (the launch's and the copy's source ``x`` or ``spare``, the
    fill's destination ``z`` or ``spare``)."""

    def make():
        cu = raw_driver(ctx).cu
        setting = _setting(ctx)
        s = setting.stream
        length = setting.arrays.sets[0][0].size
        x, y, z, spare = (cuda.to_device(np.zeros(length, np.float32), stream=s)
                          for _ in range(4))
        nbytes = length * 4
        address = {name: a.device_ctypes_pointer.value
                   for name, a in (("x", x), ("z", z), ("spare", spare))}
        blocks, threads = setting.grid
        launch = _node[blocks, threads, s]
        launch(x, y, z)   # compiled and loaded outside the capture
        s.synchronize()
        handle = cu.CUstream(int(s.handle))
        checked("cuStreamBeginCapture", cu.cuStreamBeginCapture(
            handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            launch(x, y, z)
            checked("cuMemcpyDtoDAsync", cu.cuMemcpyDtoDAsync(
                cu.CUdeviceptr(address["z"]), cu.CUdeviceptr(address["x"]), nbytes, handle))
            checked("cuMemsetD32Async", cu.cuMemsetD32Async(
                cu.CUdeviceptr(address["z"]), 0, length, handle))
        except BaseException:
            err, graph = cu.cuStreamEndCapture(handle)
            if not err:
                cu.cuGraphDestroy(graph)
            raise
        graph = checked("cuStreamEndCapture", cu.cuStreamEndCapture(handle))
        ctx.on_close(lambda: cu.cuGraphDestroy(graph))
        graph_exec = checked("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0))
        ctx.on_close(lambda: cu.cuGraphExecDestroy(graph_exec))
        found, count = checked("cuGraphGetNodes", cu.cuGraphGetNodes(graph, 3))
        types_of = {cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL: KERNEL,
                    cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY: MEMCPY,
                    cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET: MEMSET}
        nodes = {}
        for node in found[:count]:
            kind = types_of.get(checked("cuGraphNodeGetType", cu.cuGraphNodeGetType(node)))
            if kind is not None:
                nodes[kind] = node
        if set(nodes) != set(NODE_KINDS):
            raise RuntimeError(f"the driver's capture holds {sorted(nodes)} nodes, not a "
                               "kernel, a memcpy and a memset node")
        copies = []
        for new in (address["x"], address["spare"]):
            copy = _copied(checked("cuGraphMemcpyNodeGetParams",
                                   cu.cuGraphMemcpyNodeGetParams(nodes[MEMCPY])),
                           _MEMCPY_FIELDS)
            copy.srcDevice = cu.CUdeviceptr(new)
            copies.append(copy)
        fills = []
        for new in (address["z"], address["spare"]):
            fill = _copied(checked("cuGraphMemsetNodeGetParams",
                                   cu.cuGraphMemsetNodeGetParams(nodes[MEMSET])),
                           _MEMSET_FIELDS)
            fill.dst = cu.CUdeviceptr(new)
            fills.append(fill)
        return types.SimpleNamespace(
            cu=cu, exec=graph_exec, handle=handle, sync=s.synchronize,
            ctx=checked("cuStreamGetCtx", cu.cuStreamGetCtx(handle)), nodes=nodes,
            params={KERNEL: _kernel_params(cu, nodes[KERNEL], address["x"],
                                           address["spare"]),
                    MEMCPY: copies, MEMSET: fills},
            keep=(x, y, z, spare))

    return ctx.shared("graphed_raw_nodes", make)


def _set_params(ctx: Context, kind: str) -> Contender:
    raw = _raw_nodes(ctx)
    cu, graph_exec, node = raw.cu, raw.exec, raw.nodes[kind]
    sets = [p[0] if kind == KERNEL else p for p in raw.params[kind]]
    reps = ctx.config.launch_repeats
    sequence = [sets[i % 2] for i in range(reps)]
    name = SET_CALLS[kind]
    if kind == KERNEL:
        set_kernel = cu.cuGraphExecKernelNodeSetParams

        def batch():
            for params in sequence:
                err, = set_kernel(graph_exec, node, params)
                if err:
                    raise RuntimeError(f"{name}: {err}")
    else:
        set_node = getattr(cu, name)
        node_ctx = raw.ctx

        def batch():
            for params in sequence:
                err, = set_node(graph_exec, node, params, node_ctx)
                if err:
                    raise RuntimeError(f"{name}: {err}")

    def close():
        # The executable runs with the parameters set last.
        checked("cuGraphLaunch", cu.cuGraphLaunch(graph_exec, raw.handle))
        raw.sync()

    return Contender(batch, reps, raw.sync, close=close,
                     note=f"{name}(graph_exec, node, params"
                          f"{'' if kind == KERNEL else ', ctx'}), the node moved to the "
                          "other of two buffers each call, parameters built beforehand")


def _cpp_set_params(ctx: Context):
    cfg = ctx.config
    yield from floor(ctx).rows(
        "setparams", lambda line: set_case(_FLOOR_KINDS[line["label"]]), NODE_UNIT, "wall",
        elements=cfg.elements, trials=cfg.trials, warmup=cfg.warmup,
        repeats=cfg.launch_repeats,
    )


# Steps moving some of their nodes, each call timed alone on the host.

_FILL, _FIXED_FILL = 0.5, 0.25   # what a memset step's fills write


class _HostCalls(NamedTuple):
    """One peer of a host-timed case: ``fn(*args)`` for each ``args`` in
    ``arguments`` is one call; ``close()`` after the trials may raise to
    reject them."""

    fn: Callable[..., Any]
    arguments: list
    sync: Callable[[], Any]
    close: Callable[[], Any]
    note: str


def _host_time(peer: _HostCalls) -> float:
    """Microseconds of host time per call, the stream idle as each begins."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        fn, sync, clock, total = peer.fn, peer.sync, time.perf_counter, 0.0
        for args in peer.arguments:
            sync()
            start = clock()
            fn(*args)
            total += clock() - start
        sync()
    finally:
        if enabled:
            gc.enable()
    return total * 1e6 / len(peer.arguments)


def _host_compare(ctx: Context, result: SuiteResult,
                  setups: dict[tuple[str, str], Callable[[], _HostCalls]]) -> dict:
    """Set up each ``(case, peer)``, time them round-robin trial by trial
    (one untimed trial first), and add a row for each whose trials and
    ``close()`` passed; the rows, by ``(case, peer)``."""
    made: dict[tuple[str, str], _HostCalls] = {}
    for key, setup in setups.items():
        with ctx.recording_errors(result, key[1]):
            made[key] = setup()
    times: dict[tuple[str, str], list] = {key: [] for key in made}
    failed: set = set()
    keys = list(made)
    try:
        for trial in range(-1, ctx.config.trials):
            first = trial % len(keys) if keys else 0
            for key in keys[first:] + keys[:first]:
                if key in failed:
                    continue
                try:
                    took = _host_time(made[key])
                except Exception as exc:
                    failed.add(key)
                    ctx.fail(result, key[1], exc)
                    continue
                if trial >= 0:
                    times[key].append(took)
    finally:
        for key, peer in made.items():
            try:
                peer.close()
            except Exception as exc:
                failed.add(key)
                ctx.fail(result, key[1], exc)
    rows = {}
    for key, peer in made.items():
        if key not in failed:
            row = Row.of(key[0], key[1], times[key], HOST_UNIT, "host", note=peer.note)
            ctx.attempt(result, key[1], lambda row=row: [row])
            rows[key] = row
    return rows


class _Scalars:
    """Two DeviceScalars a memset step's moved fills alternate between, and
    one its other fills write."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.moved = tuple(ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
                           for _ in range(2))
        self.fixed = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)

    def pair(self) -> tuple[tuple, tuple]:
        return (self.moved[0], self.fixed), (self.moved[1], self.fixed)

    def check(self, what: str, call: Callable[[tuple], Any], sequence: Sequence[tuple],
              sync: Callable[[], Any]) -> None:
        """Make ``call(args)`` for each ``(c, d)`` in ``sequence`` and raise
        unless each filled its own ``c``."""
        for n, (c, d) in enumerate(sequence):
            c.update(float("nan"))
            self.stream.synchronize()
            call((c, d))
            sync()
            if c.value != _FILL:
                raise AssertionError(
                    f"{what}: call {n + 1} left {c.value} in its scalar, expected {_FILL}: "
                    "the step filled another scalar than it was given")


def _moving_step(kind: str, nodes: int, moved: int, stream: Any,
                 grid: tuple[int, int]) -> Callable[..., None]:
    """A step of ``nodes`` nodes of ``kind``, the last ``moved`` of them on
    its first argument, the others on arguments that stay."""
    blocks, threads = grid
    kept = nodes - moved
    if kind == KERNEL:
        def step(x: Any, y: Any, z: Any) -> None:
            launch = _node[blocks, threads, stream]
            for _ in range(kept):
                launch(y, y, z)
            for _ in range(moved):
                launch(x, y, z)
    elif kind == MEMCPY:
        def step(x: Any, y: Any, z: Any) -> None:
            for _ in range(kept):
                z.copy_to_device(y, stream=stream)
            for _ in range(moved):
                z.copy_to_device(x, stream=stream)
    else:
        def step(c: Any, d: Any) -> None:
            for _ in range(kept):
                d.update(_FIXED_FILL)
            for _ in range(moved):
                c.update(_FILL)
    return step


def _moving_args(ctx: Context, kind: str) -> tuple[tuple[tuple, tuple], Callable[..., None]]:
    """The arguments of a call and of the next, and the check of calls."""
    setting = _setting(ctx)
    if kind == MEMSET:
        scalars = ctx.shared("graphed_scalars", lambda: _Scalars(setting.stream))
        return scalars.pair(), scalars.check
    arrays = setting.arrays
    if kind == MEMCPY:
        def check(what, call, sequence, sync):
            arrays.check(what, call, sequence, sync, expect=lambda x, y: x)
        return arrays.triples(ONE), check
    return arrays.triples(ONE), arrays.check


def _moving_graphed(ctx: Context, kind: str, nodes: int, moved: int) -> _HostCalls:
    setting = _setting(ctx)
    s = setting.stream
    pair, check = _moving_args(ctx, kind)
    # One graph, so that the arrays taking turns rebind it.
    f = ng.graphed(_moving_step(kind, nodes, moved, s, setting.grid), stream=s, max_graphs=1)
    what = moved_case(nodes, moved, kind)
    check(what, lambda args: f(*args), [*pair, *pair], s.synchronize)

    def close():
        info = f.cache_info()
        f.clear()
        if info.captures != 1 or info.evictions or not info.rebinds:
            raise AssertionError(f"{what}: cache_info() {info}: expected one capture, "
                                 "no eviction and rebinds")

    return _HostCalls(f, _alternating(pair, _calls(ctx.config, nodes)), s.synchronize,
                      close, f"f(...) moving {moved} {kind} nodes of {nodes} each call, "
                             "f = ng.graphed(step, stream=s, max_graphs=1)")


def _moving_plain(ctx: Context, kind: str, nodes: int, moved: int) -> _HostCalls:
    setting = _setting(ctx)
    s = setting.stream
    pair, check = _moving_args(ctx, kind)
    with ng.capture(s) as cap:
        _moving_step(kind, nodes, moved, s, setting.grid)(*pair[0])
    graph = cap.graph
    try:
        graph.upload()
        check(moved_case(nodes, moved, kind), lambda args: graph.launch(), [pair[0]],
              s.synchronize)
    except BaseException:
        graph.close()
        raise
    return _HostCalls(graph.launch, [()] * _calls(ctx.config, nodes), s.synchronize,
                      graph.close, "graph.launch() of the step captured once")


MOVING_PEERS = {PEER: _moving_graphed, PLAIN: _moving_plain}


def _fit(ctx: Context, result: SuiteResult, kind: str, nodes: int,
         moved: Sequence[int], rows: dict, peers: tuple[str, str] = (PEER, PLAIN)) -> None:
    """Add the rebinding's fixed part and part per node moved, from the
    rows of the steps moving ``moved`` of ``kind`` nodes: the first of
    ``peers``' call less the second's plain launch; none where a peer's
    rows are missing (its failure is recorded)."""
    mover, launcher = peers
    found = [(k, rows.get((moved_case(nodes, k, kind), mover)),
              rows.get((moved_case(nodes, k, kind), launcher))) for k in moved]
    if any(mine is None or plain is None for _, mine, plain in found):
        return
    fixed, per_node = fit_line([(k, mine.value - plain.value) for k, mine, plain in found])
    trials = min(len(row.trials) for _, *pair in found for row in pair)
    per_trial = [fit_line([(k, mine.trials[t] - plain.trials[t]) for k, mine, plain in found])
                 for t in range(trials)]
    what = (("numbagraph's call", "the plain launch") if mover == PEER else
            ("C++ setting the nodes and launching", "its launch alone"))
    how = (f"least-squares line through {what[0]} less {what[1]} (host "
           f"time) at {', '.join(map(str, moved))} of {nodes} {kind} nodes moved; value "
           "from the medians, trials from each trial's line")
    case = fit_case(kind) if mover == PEER else cpp_fit_case(kind)
    made = [Row(case, PER_NODE, per_node, FIT_UNIT, [p for _, p in per_trial],
                "host", note=f"slope: {how}"),
            Row(case, FIXED, fixed, FIT_UNIT, [f for f, _ in per_trial], "host",
                note=f"intercept: {how}")]
    ctx.attempt(result, mover, lambda: made)


def _cpp_new_each_call(ctx: Context, result: SuiteResult, steps: Sequence[int]) -> None:
    """The C++ floor of a call of the steps whose array is new each call,
    which rebinds the one graph: tiny kernel launches whose every node is
    set to the other of two buffers, then the graph launched, calls back to
    back as numbagraph's are; against the launch alone."""
    cfg = ctx.config

    def made() -> Iterable[Row]:
        for nodes in steps:
            lines = floor(ctx).run("moved", nodes=nodes, sizes=[nodes], alone=0, kind=KERNEL,
                                   elements=cfg.elements, trials=cfg.trials,
                                   warmup=_calls(cfg, nodes), repeats=_calls(cfg, nodes))
            for line in lines:
                what = line["label"].split()[1]
                yield Row.of(case(nodes, UNSEEN), CPP if what == "moved" else CPP_LAUNCH,
                             line["trials"], UNIT, "wall",
                             note=(f"cudaGraphExecKernelNodeSetParams of all {nodes} nodes, "
                                   "then cudaGraphLaunch" if what == "moved" else
                                   "cudaGraphLaunch alone") + ", calls back to back")

    ctx.attempt(result, CPP, made)


def _cpp_moved(ctx: Context, result: SuiteResult, nodes: int, moved: Sequence[int]) -> None:
    """The C++ floor of the steps moving nodes: each call sets the moved
    nodes (the runtime's ``cudaGraphExec*NodeSetParams``) and launches,
    against the launch alone, each call timed alone as numbagraph's are;
    and the line fitted through them, per kind of node."""
    cfg = ctx.config
    rows: dict[tuple[str, str], Row] = {}

    def made() -> Iterable[Row]:
        lines = floor(ctx).run("moved", nodes=nodes, sizes=moved, elements=cfg.elements,
                               trials=cfg.trials, warmup=_calls(cfg, nodes),
                               repeats=_calls(cfg, nodes))
        for line in lines:
            kind, what = line["label"].split()
            peer = CPP if what == "moved" else CPP_LAUNCH
            row = Row.of(moved_case(nodes, int(line["param"]), kind), peer, line["trials"],
                         HOST_UNIT, "host",
                         note=("cudaGraphExec*NodeSetParams of the moved nodes, then "
                               "cudaGraphLaunch" if peer == CPP else "cudaGraphLaunch alone"))
            rows[(row.case, peer)] = row
            yield row

    ctx.attempt(result, CPP, made)
    for kind in NODE_KINDS:
        _fit(ctx, result, kind, nodes, moved, rows, (CPP, CPP_LAUNCH))


def run(ctx: Context) -> SuiteResult:
    """Measure a graphed step's call in each case, with its peers."""
    result = SuiteResult(NAME, TITLE, UNIT)
    cfg = ctx.config
    setting = _setting(ctx)
    steps = SIMULATED_STEPS if cfg.simulated else STEPS
    for nodes in steps:
        for change in (SAME, ONE, ALL, UNSEEN):
            setups = {peer: (lambda setup=setup, n=nodes, c=change:
                             setup(ctx, setting.arrays, n, c))
                      for peer, setup in STEP_PEERS.items()}
            ctx.compare(result, case(nodes, change), setups, unit=UNIT)
    if not cfg.simulated:
        _cpp_new_each_call(ctx, result, steps)
    for nbytes in SIZES:
        arrays = _Arrays(setting.stream, nbytes // 4, setting.covered)
        setups = {peer: (lambda setup=setup, a=arrays, n=nbytes:
                         setup(ctx, a, steps[0], size_case(n)))
                  for peer, setup in SIZE_PEERS.items()}
        ctx.compare(result, size_case(nbytes), setups, unit=UNIT)
        del arrays, setups
    ctx.compare(result, case(steps[-1], NEW_SIGNATURE),
                {peer: (lambda setup=setup: setup(ctx, steps[-1]))
                 for peer, setup in SIGNATURE_PEERS.items()},
                unit=UNIT, trials=cfg.trials)
    for kind in NODE_KINDS:
        ctx.compare(result, set_case(kind), {BINDINGS: lambda kind=kind: _set_params(ctx, kind)},
                    unit=NODE_UNIT)
    ctx.attempt(result, CPP, lambda: _cpp_set_params(ctx))
    nodes = SIMULATED_FIT_NODES if cfg.simulated else FIT_NODES
    moved = SIMULATED_MOVED if cfg.simulated else MOVED
    for kind in NODE_KINDS:
        rows = _host_compare(ctx, result, {
            (moved_case(nodes, k, kind), peer): (lambda setup=setup, k=k, kind=kind:
                                                 setup(ctx, kind, nodes, k))
            for k in moved for peer, setup in MOVING_PEERS.items()})
        _fit(ctx, result, kind, nodes, moved, rows)
    if not cfg.simulated:
        _cpp_moved(ctx, result, nodes, moved)
    result.notes.append(
        f"steps of {' and '.join(map(str, steps))} launches of z = x + 0.5 y over the "
        f"first {setting.covered} elements; size cases: the {steps[0]}-launch step, "
        "x changed each call; host clock over R calls "
        f"({_calls(cfg, steps[0])} and {_calls(cfg, steps[-1])} graph launches, "
        f"{_recaptures(cfg, steps[0])} and {_recaptures(cfg, steps[-1])} recaptures), "
        f"stopped after the stream synchronises; median of {cfg.trials} trials after "
        "one untimed batch, the peers taking turns; every peer's output checked first"
    )
    result.notes.append(
        f"{', '.join(SET_CALLS.values())}: host clock over {cfg.launch_repeats} calls, "
        "each moving one node to the other of two buffers, nothing launched; the C++ "
        "floor calls the runtime's cudaGraphExec*NodeSetParams. Nodes moved: steps of "
        f"{nodes} nodes, {', '.join(map(str, moved))} of them moved per call, each call "
        f"timed alone on the host clock ({HOST_UNIT}) with the stream synchronised "
        "before it, untimed; the rebinding fitted as fixed + per node moved"
    )
    return result
