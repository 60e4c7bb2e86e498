"""Suite ``replay``: replay cost per node of graphs of 1..1000 tiny kernels.

Each framework captures N launches of the tiny kernel into a graph, uploads
it, and replays it R times back to back. CUDA events on the replay stream
time the R replays on the GPU; per node = elapsed / (R * N), median of the
trials. Every peer runs in a Python process of its own, as the C++ floor
does (see :mod:`~numbagraph.bench.isolation`), and frees each graph before
building the next: other graphs uploaded and not yet launched, and other
peers in the same process, slow a replay down (docs/benchmarks says by how
much).
Peers: numbagraph (on ``cuda.stream()``, and on a non-blocking stream), the
same numba launches captured and replayed through cuda.core directly,
torch.cuda.CUDAGraph, CuPy stream capture of a RawKernel, and the C++ floor
(cudaStreamBeginCapture + cudaGraphLaunch, on a non-blocking stream and on
a blocking one).
"""

from __future__ import annotations

import gc
import types

import numpy as np
from numba import cuda

import numbagraph as ng

from .core import Context, SuiteResult
from .floor import PEER, PEER_BLOCKING, floor
from .isolation import run_isolated
from .peers import (cupy_cuda, cupy_tiny, numba_tiny, numba_tiny_nonblocking, raw_driver,
                    torch_cuda)
from .timing import Contender

__all__ = ["NAME", "TITLE", "run", "measure_peer", "torch_tiny", "cupy_stream_tiny"]

NAME = "replay"
TITLE = "Replay cost per node"
UNIT = "us/node"


def _case(nodes: int) -> str:
    return f"{nodes} node" if nodes == 1 else f"{nodes} nodes"


def _replays(ctx: Context, nodes: int, replay, sync, stream, close) -> Contender:
    reps = ctx.config.repeats_for(nodes)

    def batch():
        for _ in range(reps):
            replay()

    return Contender(batch, reps * nodes, sync, stream, close,
                     note=f"{reps} replays per trial")


def _numbagraph(tiny_of):
    def setup(ctx: Context, nodes: int) -> Contender:
        t = tiny_of(ctx)
        with ng.capture(t.stream) as cap:
            for _ in range(nodes):
                t.launch(t.n)
        graph = cap.graph
        graph.upload()
        return _replays(ctx, nodes, graph.launch, t.sync, t.stream, graph.close)
    return setup


def _cuda_core(ctx: Context, nodes: int) -> Contender:
    raw = raw_driver(ctx)
    t = numba_tiny(ctx)
    core_stream = raw.Stream.from_handle(int(t.stream.handle))
    builder = core_stream.create_graph_builder()
    builder.begin_building("thread_local")
    for _ in range(nodes):
        t.launch(t.n_array)
    builder.end_building()
    graph = builder.complete()
    graph.upload(core_stream)

    def close():
        graph.close()
        builder.close()

    return _replays(ctx, nodes, lambda: graph.launch(core_stream), t.sync, t.stream, close)


def torch_tiny(ctx: Context) -> types.SimpleNamespace:
    """torch, a side stream, ``a`` and ``n`` for the tiny kernel ``a.add_(n)``."""

    def make():
        torch = torch_cuda(ctx)
        ts = torch.cuda.Stream()
        a = torch.zeros(ctx.config.elements, device="cuda")
        n = torch.ones(1, device="cuda")
        with torch.cuda.stream(ts):
            for _ in range(3):
                a.add_(n)  # warm-up outside capture, as torch asks
        ts.synchronize()
        return types.SimpleNamespace(torch=torch, stream=ts, a=a, n=n,
                                     events_on=cuda.external_stream(ts.cuda_stream))

    return ctx.shared("torch_tiny", make)


def _torch(ctx: Context, nodes: int) -> Contender:
    tt = torch_tiny(ctx)
    torch, ts = tt.torch, tt.stream
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=ts):
        for _ in range(nodes):
            tt.a.add_(tt.n)
    contender = _replays(ctx, nodes, graph.replay, ts.synchronize, tt.events_on, graph.reset)
    inner = contender.batch

    def batch():
        with torch.cuda.stream(ts):  # replay() launches on the current stream
            inner()

    contender.batch = batch
    return contender


def cupy_stream_tiny(ctx: Context) -> types.SimpleNamespace:
    """CuPy, a non-blocking stream, and the RawKernel with its arguments."""

    def make():
        cp = cupy_cuda(ctx)
        kernel = cupy_tiny(ctx)
        cfg = ctx.config
        blocks, threads = cfg.grid
        cs = cp.cuda.Stream(non_blocking=True)
        a = cp.zeros(cfg.elements, cp.float32)
        n = cp.ones(1, cp.float32)
        args = (a, n, np.int32(cfg.elements))
        with cs:
            kernel((blocks,), (threads,), args)
        cs.synchronize()
        return types.SimpleNamespace(
            cp=cp, stream=cs, events_on=cuda.external_stream(cs.ptr),
            launch=lambda: kernel((blocks,), (threads,), args),
        )

    return ctx.shared("cupy_tiny_stream", make)


def _cupy(ctx: Context, nodes: int) -> Contender:
    ct = cupy_stream_tiny(ctx)
    cs = ct.stream
    with cs:
        cs.begin_capture()
        try:
            for _ in range(nodes):
                ct.launch()
        finally:
            graph = cs.end_capture()
    if hasattr(graph, "upload"):
        graph.upload(cs)
    return _replays(ctx, nodes, lambda: graph.launch(cs), cs.synchronize, ct.events_on,
                    None)


def _cpp(blocking: bool):
    def rows(ctx: Context):
        cfg = ctx.config
        yield from floor(ctx).rows(
            "replay", lambda line: _case(int(line["param"])), UNIT, "events",
            peer=PEER_BLOCKING if blocking else PEER, blocking=int(blocking),
            sizes=cfg.graph_sizes, elements=cfg.elements, trials=cfg.trials,
            target=cfg.target_units, min_repeats=cfg.min_repeats,
            max_repeats=cfg.max_repeats,
        )
    return rows


PEERS = {
    "numbagraph": _numbagraph(numba_tiny),
    "numbagraph, non-blocking stream": _numbagraph(numba_tiny_nonblocking),
    "cuda.core": _cuda_core,
    "PyTorch": _torch,
    "CuPy": _cupy,
}


def measure_peer(ctx: Context, result: SuiteResult, peer: str) -> None:
    """Measure ``peer`` at every graph size, one graph alive at a time."""
    setup = PEERS[peer]
    for nodes in ctx.config.graph_sizes:
        ctx.compare(result, _case(nodes),
                    {peer: lambda nodes=nodes: setup(ctx, nodes)},
                    unit=UNIT, param=nodes)
        gc.collect()  # a peer's graph without close() goes with its contender


def run(ctx: Context) -> SuiteResult:
    """Measure replay cost per node for every peer present, each peer in a
    process of its own."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for peer in PEERS:
        run_isolated(ctx, result, __name__, peer)
    ctx.attempt(result, PEER, lambda: _cpp(False)(ctx))
    ctx.attempt(result, PEER_BLOCKING, lambda: _cpp(True)(ctx))
    result.notes.append(
        "CUDA events on the replay stream around R back-to-back replays of an "
        "uploaded graph; per node = elapsed / (R x nodes); median of "
        f"{ctx.config.trials} trials after one untimed batch; each peer in a "
        "Python process of its own, one graph alive at a time"
    )
    return result
