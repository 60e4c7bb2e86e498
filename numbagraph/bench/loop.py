"""Suite ``loop``: one step of a replay loop, a scalar update then the replay
of a 1-node graph, and each half alone.

Host clock over R steps, stopped after the stream synchronises; median of
the trials. Each step writes a new value. The columns take the Python path
apart: numbagraph (``DeviceScalar.update`` + ``CapturedGraph.launch``); the
same graph built by cuda.core and launched by ``Graph.launch``; the driver
calls themselves through cuda.bindings and through ctypes into libcuda,
with the update as ``cuMemcpyHtoDAsync`` from a pageable buffer (what
DeviceScalar does) or as ``cuMemsetD32Async`` (the value travels inside the
call); the C++ floor (pinned ``cudaMemcpyAsync`` + ``cudaGraphLaunch``);
PyTorch (pinned ``copy_(non_blocking=True)`` + ``CUDAGraph.replay``).
"""

from __future__ import annotations

import struct

import numpy as np

import numbagraph as ng

from .core import Context, Row, SuiteResult
from .floor import floor
from .peers import libcuda, numba_tiny, raw_driver, torch_cuda
from .timing import measure

__all__ = ["NAME", "TITLE", "run", "STEP", "UPDATE", "LAUNCH"]

NAME = "loop"
TITLE = "Replay-loop step: scalar update + 1-node graph launch"
UNIT = "us/step"
STEP, UPDATE, LAUNCH = "update + launch", "update only", "launch only"
_FLOAT_BITS = struct.Struct("<f")
_UINT_BITS = struct.Struct("<I")


def _values(ctx: Context) -> list:
    return [float(i % 1000) for i in range(ctx.config.launch_repeats)]


def _timed(ctx: Context, case: str, peer: str, batch, sync, note: str = "") -> Row:
    cfg = ctx.config
    timing = measure(batch, cfg.launch_repeats, trials=cfg.trials, sync=sync)
    return Row.of(case, peer, timing.scaled(1e6), UNIT, timing.clock, note=note)


def _numbagraph(ctx: Context):
    t = numba_tiny(ctx)
    pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=t.stream)
    t.launch(pos)
    with ng.capture(t.stream) as cap:
        t.launch(pos)
    values = _values(ctx)
    with cap.graph as graph:
        graph.upload()
        update, launch = pos.update, graph.launch

        def step():
            for v in values:
                update(v)
                launch()

        def update_only():
            for v in values:
                update(v)

        def launch_only():
            for _ in values:
                launch()

        yield _timed(ctx, STEP, "numbagraph", step, t.sync)
        yield _timed(ctx, UPDATE, "numbagraph", update_only, t.sync)
        yield _timed(ctx, LAUNCH, "numbagraph", launch_only, t.sync)


class _RawGraph:
    """A 1-node graph of the tiny kernel captured by cuda.core directly."""

    def __init__(self, ctx: Context):
        raw = raw_driver(ctx)
        t = numba_tiny(ctx)
        self.tiny = t
        self.core_stream = raw.Stream.from_handle(int(t.stream.handle))
        builder = self.core_stream.create_graph_builder()
        builder.begin_building("thread_local")
        t.launch(t.n_array)
        builder.end_building()
        self.builder = builder
        self.graph = builder.complete()
        self.graph.upload(self.core_stream)
        ctx.on_close(self.close)
        self.stream_int = int(t.stream.handle)
        self.exec_int = int(self.graph.handle)
        self.dst_int = t.n_array.device_ctypes_pointer.value
        self.host = np.zeros(1, np.float32)  # pageable, like DeviceScalar's buffer
        self.host_int = self.host.ctypes.data

    def close(self) -> None:
        self.graph.close()
        self.builder.close()


def _raw_graph(ctx: Context) -> _RawGraph:
    return ctx.shared("raw_graph", lambda: _RawGraph(ctx))


def _cuda_core(ctx: Context):
    g = _raw_graph(ctx)
    launch, stream = g.graph.launch, g.core_stream

    def launch_only():
        for _ in range(ctx.config.launch_repeats):
            launch(stream)

    yield _timed(ctx, LAUNCH, "cuda.core", launch_only, g.tiny.sync, "Graph.launch(stream)")


def _bindings_calls(ctx: Context, memset: bool):
    """update(v) and launch() through cuda.bindings, arguments converted once."""
    cu = raw_driver(ctx).cu
    g = _raw_graph(ctx)
    stream = cu.CUstream(g.stream_int)
    graph_exec = g.graph.handle
    dst = cu.CUdeviceptr(g.dst_int)
    graph_launch, copy, memset32 = cu.cuGraphLaunch, cu.cuMemcpyHtoDAsync, cu.cuMemsetD32Async
    host, src = g.host, g.host_int
    pack, unpack = _FLOAT_BITS.pack, _UINT_BITS.unpack

    def launch():
        err, = graph_launch(graph_exec, stream)
        if err:
            raise RuntimeError(f"cuGraphLaunch: {err}")

    if memset:
        def update(v):
            err, = memset32(dst, unpack(pack(v))[0], 1, stream)
            if err:
                raise RuntimeError(f"cuMemsetD32Async: {err}")
    else:
        def update(v):
            host[0] = v
            err, = copy(dst, src, 4, stream)
            if err:
                raise RuntimeError(f"cuMemcpyHtoDAsync: {err}")
    return update, launch


def _ctypes_calls(ctx: Context, memset: bool):
    """update(v) and launch() through ctypes into libcuda."""
    lib = libcuda(ctx)
    g = _raw_graph(ctx)
    stream, graph_exec, dst = g.stream_int, g.exec_int, g.dst_int
    graph_launch, copy, memset32 = lib.cuGraphLaunch, lib.cuMemcpyHtoDAsync_v2, lib.cuMemsetD32Async
    host, src = g.host, g.host_int
    pack, unpack = _FLOAT_BITS.pack, _UINT_BITS.unpack

    def launch():
        err = graph_launch(graph_exec, stream)
        if err:
            raise RuntimeError(f"cuGraphLaunch: {err}")

    if memset:
        def update(v):
            err = memset32(dst, unpack(pack(v))[0], 1, stream)
            if err:
                raise RuntimeError(f"cuMemsetD32Async: {err}")
    else:
        def update(v):
            host[0] = v
            err = copy(dst, src, 4, stream)
            if err:
                raise RuntimeError(f"cuMemcpyHtoDAsync: {err}")
    return update, launch


def _three(ctx: Context, peer: str, update, launch, sync, note: str):
    values = _values(ctx)

    def step():
        for v in values:
            update(v)
            launch()

    def update_only():
        for v in values:
            update(v)

    def launch_only():
        for _ in values:
            launch()

    yield _timed(ctx, STEP, peer, step, sync, note)
    yield _timed(ctx, UPDATE, peer, update_only, sync, note)
    yield _timed(ctx, LAUNCH, peer, launch_only, sync, note)


def _driver_peer(calls, memset: bool, peer: str, note: str):
    def rows(ctx: Context):
        update, launch = calls(ctx, memset)
        yield from _three(ctx, peer, update, launch, numba_tiny(ctx).sync, note)
    return rows


def _torch(ctx: Context):
    torch = torch_cuda(ctx)
    cfg = ctx.config
    ts = torch.cuda.Stream()
    a = torch.zeros(cfg.elements, device="cuda")
    n = torch.ones(1, device="cuda")
    with torch.cuda.stream(ts):
        for _ in range(3):
            a.add_(n)
    ts.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=ts):
        a.add_(n)
    # One pinned slot per step, so no copy in flight sees a later value.
    ring = torch.empty(cfg.launch_repeats, dtype=torch.float32, pin_memory=True)
    ring_np = ring.numpy()
    slots = [ring[i:i + 1] for i in range(cfg.launch_repeats)]
    values = _values(ctx)
    replay, copy = graph.replay, n.copy_

    def step():
        for i, v in enumerate(values):
            ring_np[i] = v
            copy(slots[i], non_blocking=True)
            replay()

    def update_only():
        for i, v in enumerate(values):
            ring_np[i] = v
            copy(slots[i], non_blocking=True)

    def launch_only():
        for _ in values:
            replay()

    note = "pinned copy_(non_blocking=True) + CUDAGraph.replay()"
    with torch.cuda.stream(ts):
        yield _timed(ctx, STEP, "PyTorch", step, ts.synchronize, note)
        yield _timed(ctx, UPDATE, "PyTorch", update_only, ts.synchronize, note)
        yield _timed(ctx, LAUNCH, "PyTorch", launch_only, ts.synchronize, note)


def _cpp(ctx: Context):
    cfg = ctx.config
    yield from floor(ctx).rows(
        "loop", lambda line: line["label"], UNIT, "wall", elements=cfg.elements,
        trials=cfg.trials, warmup=cfg.warmup, repeats=cfg.launch_repeats,
    )


def run(ctx: Context) -> SuiteResult:
    """Measure a replay-loop step for numbagraph and its peers."""
    result = SuiteResult(NAME, TITLE, UNIT)
    peers = (
        ("numbagraph", _numbagraph),
        ("cuda.core", _cuda_core),
        ("cuda.bindings", _driver_peer(_bindings_calls, False, "cuda.bindings",
                                       "cuMemcpyHtoDAsync (pageable) + cuGraphLaunch")),
        ("cuda.bindings memset", _driver_peer(_bindings_calls, True, "cuda.bindings memset",
                                              "cuMemsetD32Async + cuGraphLaunch")),
        ("ctypes", _driver_peer(_ctypes_calls, False, "ctypes",
                                "libcuda cuMemcpyHtoDAsync_v2 (pageable) + cuGraphLaunch")),
        ("ctypes memset", _driver_peer(_ctypes_calls, True, "ctypes memset",
                                       "libcuda cuMemsetD32Async + cuGraphLaunch")),
        ("C++", _cpp),
        ("PyTorch", _torch),
    )
    for peer, rows in peers:
        ctx.attempt(result, peer, lambda rows=rows: rows(ctx))
    result.notes.append(
        f"host clock over {ctx.config.launch_repeats} steps, stopped after the stream "
        f"synchronises; median of {ctx.config.trials} trials after one untimed batch"
    )
    return result
