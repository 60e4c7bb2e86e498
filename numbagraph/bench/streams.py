"""Suite ``streams``: what several streams in one capture, child graphs,
host nodes and pinned read-backs cost a replay.

* fork: two independent compute-bound kernels, each a long chain of
  dependent multiply-adds on half as many blocks as the device has
  multiprocessors, captured in one graph on two streams (``ng.fork``)
  against the same two kernels in sequence on one stream. CUDA events on
  the replay stream around R replays; time per replay. Before timing, each
  graph's nodes are checked (the forked kernels independent of each other,
  the sequential ones one after the other) and both kernels' outputs
  checked after one replay.
* child: 100 launches of the tiny kernel captured into a graph, then that
  graph launched inside another capture (one child graph node), against the
  same 100 launches captured flat. CUDA events around R replays; time per
  node. Both graphs' outputs are checked after one replay.
* step: a replay-loop step, one graph of one small kernel advancing a
  counter, launched N times back to back: as it is, with an ``ng.on_host``
  callback recorded after the kernel (a host node), and with the counter's
  ``DeviceScalar.read_async`` into a pinned ``ng.HostScalar`` recorded
  after it (a kernel node storing into the mapped memory). Host clock over N launches, stopped after the
  stream synchronises; time per step. Before timing, three launches must
  advance the counter by three, call the callback three times and leave
  three in the HostScalar. A fourth variant records a host node whose
  function is C (libc's ``free`` of a null pointer, which does nothing),
  straight through the driver's ``cuLaunchHostFunc``: the driver's own
  cost of a host node, under any Python callback's.

Every case times its peers round-robin, trial by trial, median of the
trials.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

import numpy as np
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active as _backend

from .core import Context, PeerMissing, SuiteResult
from .kernels import tiny
from .peers import numba_tiny
from .timing import Contender

__all__ = ["NAME", "TITLE", "UNIT", "run", "FORK", "FORKED", "SEQUENTIAL", "CHILD",
           "AS_CHILD", "FLAT", "STEP", "PLAIN", "HOST", "C_HOST", "READBACK", "NODES"]

NAME = "streams"
TITLE = "Forked streams, child graphs, host nodes and read-backs"
UNIT = "us"

FORK = "2 half-GPU kernels, per replay"
FORKED = "ng.fork, two streams"
SEQUENTIAL = "in sequence, one stream"

NODES = 100
CHILD = f"{NODES} tiny kernels, per node"
AS_CHILD = "child graph"
FLAT = "flat"

STEP = "replay-loop step, per step"
PLAIN = "kernel only"
HOST = "+ ng.on_host"
C_HOST = "+ host node of a C no-op"
READBACK = "+ read_async to HostScalar"

# Multiply-adds per thread of a forked kernel: tens of microseconds on a
# GPU (a dependent chain of FMAs, a few cycles each); a few on the simulator,
# which runs a Python thread per GPU thread.
SPIN = 20_000
SIMULATED_SPIN = 8


@cuda.jit
def _spin(x, iterations, scale, shift):
    """``iterations`` dependent multiply-adds on each element: with scale 1
    and shift k, x[i] grows by exactly k * iterations (below 2**24)."""
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        for _ in range(iterations):
            v = v * scale + shift
        x[i] = v


@cuda.jit
def _advance(count):
    if cuda.grid(1) == 0:
        count[0] += 1


def _graph_of(s: Any, record: Callable[[], None]) -> Any:
    with ng.capture(s) as cap:
        record()
    return cap.graph


def _checked(graph: Any, check: Callable[[], None]) -> Any:
    """``graph`` once ``check()`` has passed; closed if it raises."""
    try:
        check()
    except BaseException:
        graph.close()
        raise
    return graph


def _kernel_dependencies(graph: Any) -> list:
    """For each kernel node, the kernel nodes it depends on, by position
    among the kernels."""
    nodes = graph.nodes
    kernels = [i for i, node in enumerate(nodes) if node.kind == "kernel"]
    return [sorted(kernels.index(d) for d in nodes[i].depends if d in kernels)
            for i in kernels]


def _fork(ctx: Context, forked: bool) -> Contender:
    cfg = ctx.config
    s = numba_tiny(ctx).stream
    other = cuda.stream() if forked else None
    sms, threads = _backend.launch_limits()
    blocks, threads = max(1, sms // 2), (4 if cfg.simulated else threads)
    iterations = SIMULATED_SPIN if cfg.simulated else SPIN
    n = blocks * threads
    start = (np.arange(n) % 7).astype(np.float32)
    left = cuda.to_device(start, stream=s)
    right = cuda.to_device(start, stream=s)
    one, two = np.float32(1.0), np.float32(2.0)
    _spin[blocks, threads, s](left, iterations, one, one)   # compile outside the capture
    s.synchronize()

    def record() -> None:
        if forked:
            with ng.fork(other):
                _spin[blocks, threads, other](right, iterations, one, two)
                _spin[blocks, threads, s](left, iterations, one, one)
        else:
            _spin[blocks, threads, s](right, iterations, one, two)
            _spin[blocks, threads, s](left, iterations, one, one)

    graph = _graph_of(s, record)
    which = "forked" if forked else "sequential"

    def check() -> None:
        depends = _kernel_dependencies(graph)
        expected = [[], []] if forked else [[], [0]]
        if depends != expected:
            raise AssertionError(
                f"the {which} graph's kernels depend on {depends}, not {expected}")
        graph.upload()
        left.copy_to_device(start, stream=s)
        right.copy_to_device(start, stream=s)
        graph.launch()
        got = left.copy_to_host(stream=s), right.copy_to_host(stream=s)
        s.synchronize()
        for out, shift in zip(got, (1, 2)):
            want = start + np.float32(shift * iterations)
            if not np.array_equal(out, want):
                raise AssertionError(
                    f"one replay of the {which} graph: its kernel adding {shift} per "
                    f"pass wrote {out[:4]}..., expected {want[:4]}...")

    _checked(graph, check)
    reps = 4 if cfg.simulated else (100 if cfg.quick else 200)
    launch = graph.launch

    def batch() -> None:
        for _ in range(reps):
            launch()

    how = ("the second kernel on a stream forked into the capture by ng.fork" if forked
           else "both kernels on the capturing stream")
    return Contender(batch, reps, s.synchronize, stream=s, close=graph.close,
                     note=f"{how}; {blocks} blocks of {threads} threads each, "
                          f"{iterations} multiply-adds per thread; {reps} replays per trial")


def _hundred(ctx: Context, child: bool) -> Contender:
    cfg = ctx.config
    s = numba_tiny(ctx).stream
    blocks, threads = cfg.grid
    a = cuda.to_device(np.zeros(cfg.elements, np.float32), stream=s)
    n = ng.DeviceScalar(1.0, dtype=np.float32, stream=s)
    tiny[blocks, threads, s](a, n)   # compile outside the capture

    def record() -> None:
        for _ in range(NODES):
            tiny[blocks, threads, s](a, n)

    graph = _graph_of(s, record)
    if child:
        inner = graph
        graph = _graph_of(s, lambda: inner.launch(s))
        inner.close()   # the parent holds a copy; no executable left unlaunched
    which = "parent" if child else "flat"

    def check() -> None:
        kinds = [node.kind for node in graph.nodes]
        expected = ["child"] if child else ["kernel"] * NODES
        if kinds != expected:
            raise AssertionError(f"the {which} graph holds {len(kinds)} nodes of kinds "
                                 f"{sorted(set(kinds))}, expected {len(expected)} of "
                                 f"{sorted(set(expected))}")
        graph.upload()
        a.copy_to_device(np.zeros(cfg.elements, np.float32), stream=s)
        graph.launch()
        got = a.copy_to_host(stream=s)
        s.synchronize()
        if not np.array_equal(got, np.full(cfg.elements, NODES, np.float32)):
            raise AssertionError(f"one replay of the {which} graph left {got[:4]}..., "
                                 f"expected {NODES} everywhere")

    _checked(graph, check)
    reps = cfg.repeats_for(NODES)
    launch = graph.launch

    def batch() -> None:
        for _ in range(reps):
            launch()

    how = ("the launches captured into a graph, launched inside a second capture: "
           "one child graph node" if child else "the launches captured into one graph")
    return Contender(batch, reps * NODES, s.synchronize, stream=s, close=graph.close,
                     note=f"{how}; {reps} replays per trial")


def _c_noop_host_node(ctx: Context) -> Callable[[Any], None]:
    """``record(stream)``: a host node calling libc's ``free(NULL)``, added
    through the driver's ``cuLaunchHostFunc`` without numbagraph."""
    if ctx.config.simulated:
        raise PeerMissing("the simulator has no driver host nodes")
    try:
        cuda_lib = ctypes.CDLL("libcuda.so.1")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError as exc:
        raise PeerMissing(f"libcuda or libc not loadable ({exc})") from exc
    launch = cuda_lib.cuLaunchHostFunc
    launch.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    launch.restype = ctypes.c_int
    free = ctypes.cast(libc.free, ctypes.c_void_p)

    def record(stream: Any) -> None:
        status = launch(int(stream.handle), free, None)
        if status:
            raise RuntimeError(f"cuLaunchHostFunc failed with CUDA error {status}")
    return record


def _step(ctx: Context, extra: str) -> Contender:
    c_host = _c_noop_host_node(ctx) if extra == C_HOST else None
    s = numba_tiny(ctx).stream
    count = ng.DeviceScalar(0, dtype=np.int32, stream=s)
    _advance[1, 32, s](count)   # compile outside the capture
    seen = ng.HostScalar(np.int32)
    calls = [0]

    def called() -> None:
        calls[0] += 1

    def record() -> None:
        _advance[1, 32, s](count)
        if extra == HOST:
            ng.on_host(called, stream=s)
        elif extra == READBACK:
            count.read_async(seen)
        elif c_host is not None:
            c_host(s)

    graph = _graph_of(s, record)

    def check() -> None:
        graph.upload()
        count.update(0)
        for _ in range(3):
            graph.launch()
        s.synchronize()
        got = {"counter": count.value, "callbacks": calls[0], "HostScalar": seen.value}
        want = {"counter": 3, "callbacks": 3 if extra == HOST else 0,
                "HostScalar": 3 if extra == READBACK else 0}
        if got != want:
            raise AssertionError(f"three launches of the step ({extra}) left {got}, "
                                 f"expected {want}")

    _checked(graph, check)
    steps = ctx.config.launch_repeats
    launch = graph.launch

    def batch() -> None:
        for _ in range(steps):
            launch()

    how = {PLAIN: "a 1-kernel graph",
           HOST: "the kernel, then a host node counting its calls",
           C_HOST: "the kernel, then a host node of libc's free(NULL), no Python",
           READBACK: "the kernel, then a copy of its counter into pinned memory"}[extra]
    return Contender(batch, steps, s.synchronize, close=graph.close,
                     note=f"{how}; {steps} launches per trial")


def run(ctx: Context) -> SuiteResult:
    """Measure forked streams, child graphs, host nodes and read-backs."""
    result = SuiteResult(NAME, TITLE, UNIT)
    ctx.compare(result, FORK, {FORKED: lambda: _fork(ctx, True),
                               SEQUENTIAL: lambda: _fork(ctx, False)}, unit=UNIT)
    ctx.compare(result, CHILD, {AS_CHILD: lambda: _hundred(ctx, True),
                                FLAT: lambda: _hundred(ctx, False)}, unit=UNIT)
    ctx.compare(result, STEP, {extra: (lambda extra=extra: _step(ctx, extra))
                               for extra in (PLAIN, HOST, C_HOST, READBACK)}, unit=UNIT)
    cfg = ctx.config
    result.notes.append(
        f"fork and child: CUDA events on the replay stream around R back-to-back "
        f"replays (fork per replay, child per node); step: host clock over "
        f"{cfg.launch_repeats} launches, stopped after the stream synchronises. Median of "
        f"{cfg.trials} trials after one untimed batch, the peers of a case taking "
        "turns; outputs and each graph's nodes checked before timing")
    return result
