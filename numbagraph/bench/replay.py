"""Suite ``replay``: replay cost per node of graphs of 1..1000 tiny kernels.

Each framework captures N launches of the tiny kernel into a graph, uploads
it, and replays it R times back to back. CUDA events on the replay stream
time the R replays on the GPU; per node = elapsed / (R * N), median of the
trials. Peers: numbagraph, the same numba launches captured and replayed
through cuda.core directly, torch.cuda.CUDAGraph, CuPy stream capture of a
RawKernel, and the C++ floor (cudaStreamBeginCapture + cudaGraphLaunch).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import numbagraph as ng

from .core import Context, Row, SuiteResult
from .floor import floor
from .peers import cupy_cuda, cupy_tiny, numba_tiny, raw_driver, torch_cuda
from .timing import measure

__all__ = ["NAME", "TITLE", "run"]

NAME = "replay"
TITLE = "Replay cost per node"
UNIT = "us/node"


def _case(nodes: int) -> str:
    return f"{nodes} node" if nodes == 1 else f"{nodes} nodes"


def _timed(ctx: Context, peer: str, nodes: int, replay, sync, stream) -> Row:
    cfg = ctx.config
    reps = cfg.repeats_for(nodes)

    def batch():
        for _ in range(reps):
            replay()

    timing = measure(batch, reps * nodes, trials=cfg.trials, sync=sync, stream=stream)
    return Row.of(_case(nodes), peer, timing.scaled(1e6), UNIT, timing.clock,
                  param=nodes, note=f"{reps} replays per trial")


def _numbagraph(ctx: Context):
    t = numba_tiny(ctx)
    for nodes in ctx.config.graph_sizes:
        with ng.capture(t.stream) as cap:
            for _ in range(nodes):
                t.launch(t.n)
        with cap.graph as graph:
            graph.upload()
            yield _timed(ctx, "numbagraph", nodes, graph.launch, t.sync, t.stream)


def _cuda_core(ctx: Context):
    raw = raw_driver(ctx)
    t = numba_tiny(ctx)
    core_stream = raw.Stream.from_handle(int(t.stream.handle))
    for nodes in ctx.config.graph_sizes:
        builder = core_stream.create_graph_builder()
        builder.begin_building("thread_local")
        for _ in range(nodes):
            t.launch(t.n_array)
        builder.end_building()
        graph = builder.complete()
        try:
            graph.upload(core_stream)
            yield _timed(ctx, "cuda.core", nodes, lambda: graph.launch(core_stream),
                         t.sync, t.stream)
        finally:
            graph.close()
            builder.close()


def _torch(ctx: Context):
    torch = torch_cuda(ctx)
    cfg = ctx.config
    ts = torch.cuda.Stream()
    events_on = cuda.external_stream(ts.cuda_stream)
    a = torch.zeros(cfg.elements, device="cuda")
    n = torch.ones(1, device="cuda")
    with torch.cuda.stream(ts):
        for _ in range(3):
            a.add_(n)  # warm-up outside capture, as torch asks
    ts.synchronize()
    for nodes in cfg.graph_sizes:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=ts):
            for _ in range(nodes):
                a.add_(n)
        with torch.cuda.stream(ts):
            yield _timed(ctx, "PyTorch", nodes, graph.replay, ts.synchronize, events_on)
        del graph


def _cupy(ctx: Context):
    cp = cupy_cuda(ctx)
    kernel = cupy_tiny(ctx)
    cfg = ctx.config
    blocks, threads = cfg.grid
    cs = cp.cuda.Stream(non_blocking=True)
    events_on = cuda.external_stream(cs.ptr)
    a = cp.zeros(cfg.elements, cp.float32)
    n = cp.ones(1, cp.float32)
    args = (a, n, np.int32(cfg.elements))
    with cs:
        kernel((blocks,), (threads,), args)
        cs.synchronize()
        for nodes in cfg.graph_sizes:
            cs.begin_capture()
            for _ in range(nodes):
                kernel((blocks,), (threads,), args)
            graph = cs.end_capture()
            if hasattr(graph, "upload"):
                graph.upload(cs)
            yield _timed(ctx, "CuPy", nodes, lambda: graph.launch(cs), cs.synchronize,
                         events_on)


def _cpp(ctx: Context):
    cfg = ctx.config
    yield from floor(ctx).rows(
        "replay", lambda line: _case(int(line["param"])), UNIT, "events",
        sizes=cfg.graph_sizes, elements=cfg.elements, trials=cfg.trials,
        target=cfg.target_units, min_repeats=cfg.min_repeats,
        max_repeats=cfg.max_repeats,
    )


def run(ctx: Context) -> SuiteResult:
    """Measure replay cost per node for every peer present."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for peer, rows in (
        ("numbagraph", _numbagraph), ("cuda.core", _cuda_core), ("PyTorch", _torch),
        ("CuPy", _cupy), ("C++", _cpp),
    ):
        ctx.attempt(result, peer, lambda rows=rows: rows(ctx))
    result.notes.append(
        "CUDA events on the replay stream around R back-to-back replays of an "
        "uploaded graph; per node = elapsed / (R x nodes); median of "
        f"{ctx.config.trials} trials after one untimed batch"
    )
    return result
