"""Suite ``eager``: host cost of launching the tiny kernel once, per framework.

R launches back to back on one stream, timed on the host clock from the
first launch until the stream has finished them all (the host is the
bottleneck, so this is the launch cost); median of the trials, the Python
peers taking turns trial by trial. The last Python column is numbagraph
replaying a graph of the same launches, per kernel.
"""

from __future__ import annotations

from typing import Any

import numbagraph as ng

from .core import Context, SuiteResult
from .floor import floor
from .kernels import tiny
from .peers import numba_tiny
from .replay import cupy_stream_tiny, torch_tiny
from .timing import Contender

__all__ = ["NAME", "TITLE", "run", "CASE", "OP_CASE", "op_case"]

NAME = "eager"
TITLE = "Launch cost of one tiny kernel"
UNIT = "us/kernel"
CASE = "tiny kernel"


def op_case(elements: int) -> str:
    """The name of the case of ``ng.add_into`` on the tiny kernel's array."""
    return f"add_into, {elements} float32"


OP_CASE = op_case(1024)


def _launches(ctx: Context, launch, sync, note: str = "", close=None) -> Contender:
    reps = ctx.config.launch_repeats

    def batch():
        for _ in range(reps):
            launch()

    return Contender(batch, reps, sync, close=close, note=note)


def _numbagraph(ctx: Context) -> Contender:
    t = numba_tiny(ctx)
    return _launches(ctx, lambda: t.launch(t.n_array), t.sync,
                     "kernel[grid, block, stream](a, n) with n a device array, "
                     "numbagraph imported: its fast path")


def _record(ctx: Context) -> Contender:
    t = numba_tiny(ctx)
    rec = ng.launch_record(tiny, t.blocks, t.threads, t.stream, t.a, t.n_array)
    return _launches(ctx, rec.launch, t.sync, "ng.launch_record(...).launch()")


def _numba(ctx: Context) -> Contender:
    t = numba_tiny(ctx)
    return _launches(ctx, lambda: t.launch_numba(t.n_array), t.sync,
                     "kernel.configure(grid, block, stream)(a, n): numba's own path")


def _add_into(ctx: Context) -> Contender:
    t = numba_tiny(ctx)
    ng.add_into(t.a, 1.0, t.a, stream=t.stream)
    return _launches(ctx, lambda: ng.add_into(t.a, 1.0, t.a, stream=t.stream), t.sync,
                     "ng.add_into(a, 1.0, a, stream=s) on the tiny kernel's array")


def _on_torch_stream(tt: Any, contender: Contender) -> Contender:
    """``contender`` with its batch run on PyTorch's side stream."""
    inner = contender.batch

    def batch():
        with tt.torch.cuda.stream(tt.stream):
            inner()

    contender.batch = batch
    return contender


def _torch_add(ctx: Context) -> Contender:
    tt = torch_tiny(ctx)
    add = tt.torch.add
    return _on_torch_stream(tt, _launches(
        ctx, lambda: add(tt.a, 1.0, out=tt.a), tt.stream.synchronize,
        "torch.add(a, 1.0, out=a)"))


def _numba_quiet(ctx: Context) -> Contender:
    # Numba checks the grid of every launch and warns below 128 blocks; the
    # check (on by default) is part of what a tiny launch costs.
    from numba.cuda.core import config

    t = numba_tiny(ctx)
    contender = _launches(ctx, lambda: t.launch_numba(t.n_array), t.sync,
                          "numba's own path, NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0")
    inner = contender.batch

    def batch():
        saved = config.CUDA_LOW_OCCUPANCY_WARNINGS
        config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
        try:
            inner()
        finally:
            config.CUDA_LOW_OCCUPANCY_WARNINGS = saved

    contender.batch = batch
    return contender


def _numba_scalar(ctx: Context) -> Contender:
    t = numba_tiny(ctx)
    return _launches(ctx, lambda: t.launch(t.n), t.sync,
                     "kernel[grid, block, stream](a, n) with n a DeviceScalar")


def _torch(ctx: Context) -> Contender:
    tt = torch_tiny(ctx)
    return _on_torch_stream(tt, _launches(ctx, lambda: tt.a.add_(tt.n), tt.stream.synchronize,
                                          "a.add_(n)"))


def _cupy(ctx: Context) -> Contender:
    ct = cupy_stream_tiny(ctx)
    contender = _launches(ctx, ct.launch, ct.stream.synchronize, "RawKernel call")
    inner = contender.batch

    def batch():
        with ct.stream:
            inner()

    contender.batch = batch
    return contender


def _replay(ctx: Context) -> Contender:
    t = numba_tiny(ctx)
    nodes = max(n for n in ctx.config.graph_sizes if n <= 100)
    with ng.capture(t.stream) as cap:
        for _ in range(nodes):
            t.launch(t.n)
    graph = cap.graph
    graph.upload()
    reps = max(1, ctx.config.launch_repeats // nodes)

    def batch():
        for _ in range(reps):
            graph.launch()

    return Contender(batch, reps * nodes, t.sync, close=graph.close,
                     note=f"graph.launch() of {nodes} launches, per kernel")


def _cpp(ctx: Context):
    cfg = ctx.config
    yield from floor(ctx).rows(
        "eager", lambda line: CASE, UNIT, "wall", elements=cfg.elements,
        trials=cfg.trials, warmup=cfg.warmup, repeats=cfg.launch_repeats,
    )


def run(ctx: Context) -> SuiteResult:
    """Measure the eager launch cost of every peer present."""
    result = SuiteResult(NAME, TITLE, UNIT)
    setups = {
        "numbagraph": _numbagraph, "launch record": _record,
        "numbagraph + DeviceScalar": _numba_scalar, "numba": _numba,
        "numba, occupancy check off": _numba_quiet, "PyTorch": _torch, "CuPy": _cupy,
        "numbagraph replay": _replay,
    }
    ctx.compare(result, CASE, {p: (lambda s=s: s(ctx)) for p, s in setups.items()},
                unit=UNIT)
    ctx.attempt(result, "C++", lambda: _cpp(ctx))
    ctx.compare(result, op_case(ctx.config.elements),
                {"numbagraph": lambda: _add_into(ctx), "PyTorch": lambda: _torch_add(ctx)},
                unit=UNIT)
    result.notes.append(
        f"host clock over {ctx.config.launch_repeats} launches, stopped after the "
        f"stream synchronises; median of {ctx.config.trials} trials after one "
        "untimed batch, the Python peers taking turns. numbagraph is imported, so "
        "plain numba launches also pass through its launch hook"
    )
    return result
