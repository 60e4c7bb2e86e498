"""Suite ``memory``: graph-owned memory, against preallocated buffers.

* replay: a step of three kernels through two temporaries of 1 Mi float32
  (16 on the simulator): ``t1 = 2 x``, ``t2 = t1 + 1``, ``out = t2 - x``,
  replayed as a graph. numbagraph allocates the temporaries inside the
  capture and frees them there (``ng.empty`` + ``ng.free``: memory nodes);
  the peer captured the same kernels on temporaries made before the
  capture. Host clock over R replays, stopped after the stream
  synchronises; median of the trials, the peers taking turns. Both outputs
  are checked first.
* footprint: eight graphs, each allocating and freeing a temporary of
  256 MiB (64 KiB on the simulator) inside, launched one after another on
  one stream: the device's graph memory reserved afterwards
  (``ng.graph_memory_info().reserved``, trimmed before), against one such
  graph alone; and the eight graphs of the same kernels on preallocated
  temporaries (device memory in use before and after making them). In MiB.
* capture: what one ``ng.empty`` inside a capture costs the host, against
  one captured kernel launch (us per call; host clock over a capture of
  many calls).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active as _backend

from .core import Context, Row, SuiteResult, clamp_repeats
from .graphed import size_label
from .peers import numba_tiny
from .timing import Contender

__all__ = ["NAME", "TITLE", "run", "REPLAY", "FOOTPRINT_8", "FOOTPRINT_1", "CAPTURE",
           "OWNED", "PREALLOCATED", "ALLOCATION", "LAUNCH", "footprint_case"]

NAME = "memory"
TITLE = "Graph-owned memory: replay, footprint, capture"
UNIT = "us/replay"

GRAPHS = 8
TEMPORARY = 256 << 20
SIMULATED_TEMPORARY = 64 << 10


def footprint_case(graphs: int, nbytes: int) -> str:
    """The name of the footprint case of ``graphs`` graphs, each with a
    temporary of ``nbytes`` bytes."""
    if graphs == 1:
        return f"1 graph of {size_label(nbytes)} temporaries (MiB)"
    return f"{graphs} graphs of {size_label(nbytes)} temporaries, one stream (MiB)"


REPLAY = "step with two temporaries, replay"
FOOTPRINT_8 = footprint_case(GRAPHS, TEMPORARY)
FOOTPRINT_1 = footprint_case(1, TEMPORARY)
CAPTURE = "capture, per call (us)"
OWNED = "graph-owned"
PREALLOCATED = "preallocated"
ALLOCATION = "ng.empty"
LAUNCH = "kernel launch"


@cuda.jit
def _scale(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2.0 * x[i]


@cuda.jit
def _shift(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + 1.0


@cuda.jit
def _minus(a, x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] - x[i]


@cuda.jit
def _touch(t):
    i = cuda.grid(1)
    if i < t.size:
        t[i] = 1.0


def _grid(n: int, simulated: bool) -> tuple[int, int]:
    threads = 4 if simulated else 256
    return (n + threads - 1) // threads, threads


def _step(s: Any, x: Any, t1: Any, t2: Any, out: Any, grid: tuple[int, int]) -> None:
    _scale[grid[0], grid[1], s](x, t1)
    _shift[grid[0], grid[1], s](t1, t2)
    _minus[grid[0], grid[1], s](t2, x, out)


def _replay_elements(simulated: bool) -> int:
    return 16 if simulated else 1 << 20


def _temporary(simulated: bool) -> int:
    return SIMULATED_TEMPORARY if simulated else TEMPORARY


def _replay(ctx: Context, owned: bool) -> Contender:
    cfg = ctx.config
    s = numba_tiny(ctx).stream
    n = _replay_elements(cfg.simulated)
    grid = _grid(n, cfg.simulated)
    x = cuda.to_device(np.arange(n, dtype=np.float32) % 13, stream=s)
    out = cuda.device_array(n, np.float32, stream=s)
    held = [] if owned else [cuda.device_array(n, np.float32, stream=s) for _ in range(2)]
    _step(s, x, *(held or [cuda.device_array(n, np.float32, stream=s)] * 2), out, grid)
    with ng.capture(s) as cap:
        if owned:
            t1, t2 = ng.empty(n, np.float32, stream=s), ng.empty(n, np.float32, stream=s)
            _step(s, x, t1, t2, out, grid)
            ng.free(t1)
            ng.free(t2)
        else:
            _step(s, x, held[0], held[1], out, grid)
    graph = cap.graph
    graph.upload()
    out.copy_to_device(np.full(n, np.nan, np.float32), stream=s)
    graph.launch()
    got = out.copy_to_host(stream=s)
    s.synchronize()
    if not np.array_equal(got, (np.arange(n, dtype=np.float32) % 13) + 1):
        raise AssertionError("the step with temporaries wrote a wrong output")
    reps = clamp_repeats(cfg.target_units // 10, 3, cfg.min_repeats, cfg.max_repeats)
    launch = graph.launch

    def batch() -> None:
        for _ in range(reps):
            launch()

    note = ("ng.empty + ng.free of both temporaries inside the capture" if owned
            else "the same kernels on temporaries made before the capture")
    return Contender(batch, reps, s.synchronize, close=graph.close, note=note)


def _footprint(ctx: Context, owned: bool, count: int) -> float:
    """MiB the device holds for ``count`` graphs of one temporary each, all
    launched once on one stream."""
    cfg = ctx.config
    s = numba_tiny(ctx).stream
    n = _temporary(cfg.simulated) // 4
    blocks, threads = _grid(16 if cfg.simulated else n, cfg.simulated)
    s.synchronize()
    ng.trim_graph_memory()
    used = _backend.device_memory_used()
    before = ng.graph_memory_info().reserved if owned else used
    graphs: list = []
    buffers: list = []
    try:
        for _ in range(count):
            if not owned:
                buffers.append(cuda.device_array(n, np.float32, stream=s))
            with ng.capture(s) as cap:
                t = ng.empty(n, np.float32, stream=s) if owned else buffers[-1]
                _touch[blocks, threads, s](t)
                if owned:
                    ng.free(t)
            graphs.append(cap.graph)
        for graph in graphs:
            graph.launch()
        s.synchronize()
        if owned:
            after = ng.graph_memory_info().reserved
        else:
            after = _backend.device_memory_used()
            if after is None or before is None:  # the simulator counts no device
                before, after = 0, sum(b.nbytes for b in buffers)
        return (after - before) / 2**20
    finally:
        for graph in graphs:
            graph.close()
        buffers.clear()
        s.synchronize()
        ng.trim_graph_memory()


def _capture_cost(ctx: Context, allocate: bool) -> Contender:
    cfg = ctx.config
    s = numba_tiny(ctx).stream
    calls = 10 if cfg.simulated else 200
    x = cuda.device_array(4, np.float32, stream=s)
    _touch[1, 4, s](x)
    graphs: list = []

    def batch() -> None:
        with ng.capture(s) as cap:
            if allocate:
                for _ in range(calls):
                    ng.empty(4, np.float32, stream=s)
            else:
                for _ in range(calls):
                    _touch[1, 4, s](x)
        graphs.append(cap.graph)

    def close() -> None:
        for graph in graphs:
            graph.close()

    return Contender(batch, calls, s.synchronize, close=close,
                     lead=close,
                     note=("ng.empty(4) inside a capture: an allocation node" if allocate
                           else "a tiny kernel launched inside a capture"))


def run(ctx: Context) -> SuiteResult:
    """Measure graph-owned memory's replay, footprint and capture costs."""
    result = SuiteResult(NAME, TITLE, UNIT)
    ctx.compare(result, REPLAY, {OWNED: lambda: _replay(ctx, True),
                                 PREALLOCATED: lambda: _replay(ctx, False)}, unit=UNIT)
    simulated = ctx.config.simulated
    temporary = _temporary(simulated)
    for owned, count in ((True, 1), (True, GRAPHS), (False, GRAPHS)):
        case = footprint_case(count, temporary)
        peer = OWNED if owned else PREALLOCATED
        with ctx.recording_errors(result, peer):
            ctx.progress(f"{case}: {peer}")
            mib = _footprint(ctx, owned, count)
            result.rows.append(Row.of(case, peer, [mib], "MiB", "device memory"))
    ctx.compare(result, CAPTURE, {ALLOCATION: lambda: _capture_cost(ctx, True),
                                  LAUNCH: lambda: _capture_cost(ctx, False)},
                unit="us/call")
    elements = _replay_elements(simulated)
    result.notes.append(
        f"replay: three kernels through two temporaries of {elements} float32, the "
        "temporaries allocated and freed inside the graph or made before it; host "
        "clock over R replays after the stream synchronises, median of the trials. "
        f"footprint: graphs each writing a {size_label(temporary)} temporary, launched "
        "once each on one stream; graph memory reserved (graph-owned) or device memory in use "
        "(preallocated), before and after. capture: host time of one call inside "
        "a capture of many")
    return result
