"""``--profile``: where the host time of numbagraph's hot paths goes.

cProfile over (1) a replay loop, ``DeviceScalar.update`` + ``graph.launch``
of a 1-node graph, (2) captures of the tiny kernel, and calls of the
``graphed`` suite's 10-launch step (3) with two sets of arrays in turn (a
rebinding made again) and (4) with an input new to the function each call
(a rebinding worked out). cProfile's own overhead inflates every Python
call, so read the split between functions, not the absolute times; the
``loop``, ``capture`` and ``graphed`` suites give those.
"""

from __future__ import annotations

import cProfile
import io
import pstats

import numpy as np
from numba import cuda

import numbagraph as ng

from .core import Context
from .peers import numba_tiny

__all__ = ["profile_hot_paths"]


def _stats(prof: cProfile.Profile, title: str, calls: int, top: int = 18) -> str:
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    body = buf.getvalue()
    # Drop pstats' preamble up to the column header.
    body = body[body.find("   ncalls"):] if "   ncalls" in body else body
    return f"== {title} ({calls} calls profiled; sorted by own time)\n{body}"


def profile_hot_paths(ctx: Context) -> str:
    """cProfile reports of the replay-loop step and of capture, as text."""
    t = numba_tiny(ctx)
    pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=t.stream)
    t.launch(pos)
    with ng.capture(t.stream) as cap:
        t.launch(pos)
    graph = cap.graph
    steps = ctx.config.launch_repeats
    values = [float(i % 1000) for i in range(steps)]
    for v in values[:100]:
        pos.update(v)
        graph.launch()
    t.sync()

    prof = cProfile.Profile()
    prof.enable()
    for v in values:
        pos.update(v)
        graph.launch()
    t.sync()
    prof.disable()
    report = [_stats(prof, "replay-loop step: pos.update(v); graph.launch()", steps)]
    graph.close()

    launches = max(ctx.config.capture_sizes)
    captures = 5

    def capture_once():
        with ng.capture(t.stream) as c:
            for _ in range(launches):
                t.launch(pos)
        c.graph.close()

    capture_once()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(captures):
        capture_once()
    prof.disable()
    report.append(_stats(prof, f"capture + instantiate of {launches} launches", captures))
    report.extend(_graphed_calls(ctx, steps))
    return "\n".join(report)


def _graphed_calls(ctx: Context, calls: int) -> list[str]:
    """Reports of a graphed step's calls with arrays taking turns (a graph
    for each set, and one graph rebound from set to set), and with an input
    new each call."""
    from .graphed import ROUND, make_step

    s = cuda.stream()
    grid = (1, 4) if ctx.config.simulated else ctx.config.grid
    nodes = 2 if ctx.config.simulated else 10
    inputs = [cuda.device_array(ctx.config.elements, np.float32, stream=s)
              for _ in range(ROUND)]
    y, z = (cuda.device_array(ctx.config.elements, np.float32, stream=s) for _ in range(2))
    reports = []
    for title, turn, graphs in (("two sets of arrays in turn", 2, 16),
                                ("two sets of arrays in turn, max_graphs=1", 2, 1),
                                ("an input new each call", ROUND, 16)):
        f = ng.graphed(make_step(nodes, s, grid), stream=s, max_graphs=graphs)
        # Past the warm-up, the capture and each rebinding's first time.
        for k in range(2 * ROUND):
            f(inputs[k % turn], y, z)
        arguments = [(inputs[k % turn], y, z) for k in range(calls)]
        prof = cProfile.Profile()
        prof.enable()
        for args in arguments:
            f(*args)
        s.synchronize()
        prof.disable()
        reports.append(_stats(prof, f"graphed call of a {nodes}-launch step, {title}", calls))
        f.clear()
    return reports
