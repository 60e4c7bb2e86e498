"""``--profile``: where the host time of numbagraph's hot paths goes.

cProfile over (1) a replay loop, ``DeviceScalar.update`` + ``graph.launch``
of a 1-node graph, and (2) captures of the tiny kernel. cProfile's own
overhead inflates every Python call, so read the split between functions,
not the absolute times; the ``loop`` and ``capture`` suites give those.
"""

from __future__ import annotations

import cProfile
import io
import pstats

import numpy as np

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
    return "\n".join(report)
