"""Suite ``loop``: one step of a replay loop, a scalar update then the replay
of a 1-node graph, and each half alone.

Host clock over R steps, stopped after the stream synchronises; median of
the trials, the Python peers taking turns trial by trial. Each step writes a
new value. The columns take the Python path apart: numbagraph
(``DeviceScalar.update`` + ``CapturedGraph.launch``) on ``cuda.stream()`` and
on a non-blocking stream; the same graph built by cuda.core and launched by
``Graph.launch``; the driver calls themselves, on an executable made by
``cuGraphInstantiate`` as numbagraph's is, through cuda.bindings and through
ctypes into libcuda, with the update as ``cuMemsetD32Async`` (the value
travels inside the call: what DeviceScalar does for scalars of up to 4
bytes) or as ``cuMemcpyHtoDAsync`` from a pageable buffer (what it does for
8-byte ones); PyTorch (pinned ``copy_(non_blocking=True)``
+ ``CUDAGraph.replay``); the C++ floor (pinned ``cudaMemcpyAsync`` +
``cudaGraphLaunch``) on a non-blocking stream and on a blocking one.
"""

from __future__ import annotations

import struct

import numpy as np

import numbagraph as ng

from .core import Context, SuiteResult
from .devloop import one_launch
from .floor import PEER, PEER_BLOCKING, floor
from .peers import libcuda, numba_tiny, numba_tiny_nonblocking, raw_driver
from .replay import torch_tiny
from .timing import Contender

__all__ = ["NAME", "TITLE", "run", "STEP", "UPDATE", "LAUNCH", "DEVICE_LOOP"]

NAME = "loop"
TITLE = "Replay-loop step: scalar update + 1-node graph launch"
UNIT = "us/step"
STEP, UPDATE, LAUNCH = "update + launch", "update only", "launch only"
_FLOAT_BITS = struct.Struct("<f")
_UINT_BITS = struct.Struct("<I")


def _values(ctx: Context) -> list:
    return [float(i % 1000) for i in range(ctx.config.launch_repeats)]


def _contender(ctx: Context, case: str, update, launch, sync, note: str = "") -> Contender:
    """The batch of ``case`` built from ``update(v)`` and ``launch()``."""
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

    batch = {STEP: step, UPDATE: update_only, LAUNCH: launch_only}[case]
    return Contender(batch, len(values), sync, note=note)


def _numbagraph_state(tiny_of, key: str):
    def state(ctx: Context):
        def make():
            t = tiny_of(ctx)
            pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=t.stream)
            t.launch(pos)
            with ng.capture(t.stream) as cap:
                t.launch(pos)
            graph = cap.graph
            graph.upload()
            ctx.on_close(graph.close)
            return t, pos, graph
        return ctx.shared(key, make)
    return state


def _numbagraph(tiny_of, key: str):
    state = _numbagraph_state(tiny_of, key)

    def setup(ctx: Context, case: str) -> Contender:
        t, pos, graph = state(ctx)
        return _contender(ctx, case, pos.update, graph.launch, t.sync,
                          "DeviceScalar.update + CapturedGraph.launch")
    return setup


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
        # The driver-call peers launch an executable made by cuGraphInstantiate,
        # as numbagraph does: complete()'s executables launch slower.
        cu = raw.cu
        err, self.exec = cu.cuGraphInstantiate(builder.graph_definition.handle, 0)
        if err:
            raise RuntimeError(f"cuGraphInstantiate: {err}")
        self.cu = cu
        ctx.on_close(self.close)
        self.stream_int = int(t.stream.handle)
        self.exec_int = int(self.exec)
        self.dst_int = t.n_array.device_ctypes_pointer.value
        self.host = np.zeros(1, np.float32)  # pageable, like DeviceScalar's 8-byte buffer
        self.host_int = self.host.ctypes.data

    def close(self) -> None:
        self.cu.cuGraphExecDestroy(self.exec)
        self.graph.close()
        self.builder.close()


def _raw_graph(ctx: Context) -> _RawGraph:
    return ctx.shared("raw_graph", lambda: _RawGraph(ctx))


def _cuda_core(ctx: Context, case: str) -> Contender:
    g = _raw_graph(ctx)
    launch, stream = g.graph.launch, g.core_stream
    return _contender(ctx, case, None, lambda: launch(stream), g.tiny.sync,
                      "Graph.launch(stream)")


def _bindings_calls(ctx: Context, memset: bool):
    """update(v) and launch() through cuda.bindings, arguments converted once."""
    cu = raw_driver(ctx).cu
    g = _raw_graph(ctx)
    stream = cu.CUstream(g.stream_int)
    graph_exec = g.exec
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


def _driver_peer(calls, memset: bool, note: str):
    def setup(ctx: Context, case: str) -> Contender:
        update, launch = calls(ctx, memset)
        return _contender(ctx, case, update, launch, numba_tiny(ctx).sync, note)
    return setup


def _torch_state(ctx: Context):
    def make():
        tt = torch_tiny(ctx)
        torch, ts = tt.torch, tt.stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=ts):
            tt.a.add_(tt.n)
        # One pinned slot per step, so no copy in flight sees a later value.
        ring = torch.empty(ctx.config.launch_repeats, dtype=torch.float32, pin_memory=True)
        slots = [ring[i:i + 1] for i in range(ctx.config.launch_repeats)]
        return tt, graph, ring.numpy(), slots
    return ctx.shared("loop_torch", make)


def _torch(ctx: Context, case: str) -> Contender:
    tt, graph, ring_np, slots = _torch_state(ctx)
    values = _values(ctx)
    replay, copy, on_stream = graph.replay, tt.n.copy_, tt.torch.cuda.stream

    def step():
        with on_stream(tt.stream):
            for i, v in enumerate(values):
                ring_np[i] = v
                copy(slots[i], non_blocking=True)
                replay()

    def update_only():
        with on_stream(tt.stream):
            for i, v in enumerate(values):
                ring_np[i] = v
                copy(slots[i], non_blocking=True)

    def launch_only():
        with on_stream(tt.stream):
            for _ in values:
                replay()

    batch = {STEP: step, UPDATE: update_only, LAUNCH: launch_only}[case]
    return Contender(batch, len(values), tt.stream.synchronize,
                     note="pinned copy_(non_blocking=True) + CUDAGraph.replay()")


def _cpp(blocking: bool):
    def rows(ctx: Context):
        cfg = ctx.config
        yield from floor(ctx).rows(
            "loop", lambda line: line["label"], UNIT, "wall",
            peer=PEER_BLOCKING if blocking else PEER, blocking=int(blocking),
            elements=cfg.elements, trials=cfg.trials, warmup=cfg.warmup,
            repeats=cfg.launch_repeats,
        )
    return rows


DEVICE_LOOP = "numbagraph, device loop"


def _device_loop(ctx: Context, case: str) -> Contender:
    """The whole loop in one launch: ``ng.repeat`` runs the 1-node step on
    the GPU, as many passes per iteration of its while node as
    ``unroll="auto"`` records; a batch is one launch of as many passes as
    the other peers take steps."""
    def record(t, pos, until):
        @ng.repeat(pos, until=until)
        def loop(loop):
            t.launch(pos)
        return loop

    n = ctx.config.launch_repeats
    return one_launch(ctx, "loop_device", record, n,
                      f"one launch of ng.repeat over {n} passes, {{unroll}} per iteration "
                      "of its while node (unroll='auto')")


PEERS = {
    "numbagraph": _numbagraph(numba_tiny, "loop_numbagraph"),
    "numbagraph, non-blocking stream": _numbagraph(numba_tiny_nonblocking,
                                                   "loop_numbagraph_nonblocking"),
    "cuda.core": _cuda_core,
    "cuda.bindings": _driver_peer(_bindings_calls, False,
                                  "cuMemcpyHtoDAsync (pageable) + cuGraphLaunch"),
    "cuda.bindings memset": _driver_peer(_bindings_calls, True,
                                         "cuMemsetD32Async + cuGraphLaunch"),
    "ctypes": _driver_peer(_ctypes_calls, False,
                           "libcuda cuMemcpyHtoDAsync_v2 (pageable) + cuGraphLaunch"),
    "ctypes memset": _driver_peer(_ctypes_calls, True,
                                  "libcuda cuMemsetD32Async + cuGraphLaunch"),
    "PyTorch": _torch,
    DEVICE_LOOP: _device_loop,
}
_LAUNCH_ONLY = {"cuda.core"}  # peers with nothing to update
_STEP_ONLY = {DEVICE_LOOP}    # peers whose update and launch are one


def run(ctx: Context) -> SuiteResult:
    """Measure a replay-loop step for numbagraph and its peers."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for case in (STEP, UPDATE, LAUNCH):
        setups = {peer: (lambda setup=setup, case=case: setup(ctx, case))
                  for peer, setup in PEERS.items()
                  if (case == LAUNCH or peer not in _LAUNCH_ONLY)
                  and (case == STEP or peer not in _STEP_ONLY)}
        ctx.compare(result, case, setups, unit=UNIT)
    ctx.attempt(result, PEER, lambda: _cpp(False)(ctx))
    ctx.attempt(result, PEER_BLOCKING, lambda: _cpp(True)(ctx))
    result.notes.append(
        f"host clock over {ctx.config.launch_repeats} steps, stopped after the stream "
        f"synchronises; median of {ctx.config.trials} trials after one untimed batch, "
        "the Python peers taking turns"
    )
    return result
