"""Suite ``eager``: host cost of launching the tiny kernel once, per framework.

R launches back to back on one stream, timed on the host clock from the
first launch until the stream has finished them all (the host is the
bottleneck, so this is the launch cost); median of the trials. The last
column is numbagraph replaying a graph of the same launches, per kernel.
"""

from __future__ import annotations

import numpy as np

import numbagraph as ng

from .core import Context, Row, SuiteResult
from .floor import floor
from .peers import cupy_cuda, cupy_tiny, numba_tiny, torch_cuda
from .timing import measure

__all__ = ["NAME", "TITLE", "run"]

NAME = "eager"
TITLE = "Launch cost of one tiny kernel"
UNIT = "us/kernel"
CASE = "tiny kernel"


def _timed(ctx: Context, peer: str, launch, sync, per_call: int = 1, note: str = "") -> Row:
    cfg = ctx.config
    reps = cfg.launch_repeats

    def batch():
        for _ in range(reps):
            launch()

    timing = measure(batch, reps * per_call, trials=cfg.trials, sync=sync)
    return Row.of(CASE, peer, timing.scaled(1e6), UNIT, timing.clock, note=note)


def _numba(ctx: Context):
    t = numba_tiny(ctx)
    yield _timed(ctx, "numba", lambda: t.launch(t.n_array), t.sync,
                 note="kernel[grid, block, stream](a, n) with n a device array")


def _numba_quiet(ctx: Context):
    # Numba checks the grid of every launch and warns below 128 blocks; the
    # check (on by default) is part of what a tiny launch costs.
    from numba.cuda.core import config

    t = numba_tiny(ctx)
    saved = config.CUDA_LOW_OCCUPANCY_WARNINGS
    config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    try:
        yield _timed(ctx, "numba, occupancy check off", lambda: t.launch(t.n_array), t.sync,
                     note="NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0")
    finally:
        config.CUDA_LOW_OCCUPANCY_WARNINGS = saved


def _numba_scalar(ctx: Context):
    t = numba_tiny(ctx)
    yield _timed(ctx, "numba + DeviceScalar", lambda: t.launch(t.n), t.sync,
                 note="kernel[grid, block, stream](a, n) with n a DeviceScalar")


def _torch(ctx: Context):
    torch = torch_cuda(ctx)
    ts = torch.cuda.Stream()
    a = torch.zeros(ctx.config.elements, device="cuda")
    n = torch.ones(1, device="cuda")
    with torch.cuda.stream(ts):
        yield _timed(ctx, "PyTorch", lambda: a.add_(n), ts.synchronize, note="a.add_(n)")


def _cupy(ctx: Context):
    cp = cupy_cuda(ctx)
    kernel = cupy_tiny(ctx)
    cfg = ctx.config
    blocks, threads = cfg.grid
    cs = cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(cfg.elements, cp.float32)
    n = cp.ones(1, cp.float32)
    args = (a, n, np.int32(cfg.elements))
    with cs:
        yield _timed(ctx, "CuPy", lambda: kernel((blocks,), (threads,), args),
                     cs.synchronize, note="RawKernel call")


def _cpp(ctx: Context):
    cfg = ctx.config
    yield from floor(ctx).rows(
        "eager", lambda line: CASE, UNIT, "wall", elements=cfg.elements,
        trials=cfg.trials, warmup=cfg.warmup, repeats=cfg.launch_repeats,
    )


def _replay(ctx: Context):
    t = numba_tiny(ctx)
    nodes = max(n for n in ctx.config.graph_sizes if n <= 100)
    with ng.capture(t.stream) as cap:
        for _ in range(nodes):
            t.launch(t.n)
    with cap.graph as graph:
        graph.upload()
        reps = max(1, ctx.config.launch_repeats // nodes)
        timing = measure(lambda: [graph.launch() for _ in range(reps)], reps * nodes,
                         trials=ctx.config.trials, sync=t.sync)
        yield Row.of(CASE, f"numbagraph replay ({nodes} nodes)", timing.scaled(1e6), UNIT,
                     timing.clock, note="graph.launch() of the same launches, per kernel")


def run(ctx: Context) -> SuiteResult:
    """Measure the eager launch cost of every peer present."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for peer, rows in (
        ("numba", _numba), ("numba, occupancy check off", _numba_quiet),
        ("numba + DeviceScalar", _numba_scalar), ("PyTorch", _torch),
        ("CuPy", _cupy), ("C++", _cpp), ("numbagraph replay", _replay),
    ):
        ctx.attempt(result, peer, lambda rows=rows: rows(ctx))
    result.notes.append(
        f"host clock over {ctx.config.launch_repeats} launches, stopped after the "
        f"stream synchronises; median of {ctx.config.trials} trials after one "
        "untimed batch. numbagraph is imported, so plain numba launches also pass "
        "through its launch hook"
    )
    return result
