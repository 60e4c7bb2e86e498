"""Timing: warm up, run trials, synchronise before every clock stops.

A trial runs ``batch()`` once; ``batch`` does ``units`` units of work (launches,
replays, nodes, bytes). Each trial gives seconds per unit. With a stream, a
trial is also timed on the GPU by CUDA events recorded on that stream around
the batch; those times are used when the events time at all (Numba's
simulator returns no event times, so there the host clock is used).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from numba import cuda

__all__ = ["Timing", "measure"]


@dataclass
class Timing:
    """Seconds per unit for each trial, and which clock measured them."""

    trials: list
    clock: str

    def scaled(self, factor: float) -> list:
        return [t * factor for t in self.trials]


def measure(
    batch: Callable[[], Any],
    units: float,
    *,
    trials: int,
    sync: Callable[[], Any],
    warmup: int = 1,
    stream: Any = None,
) -> Timing:
    """Time ``batch()`` (which does ``units`` units of work).

    ``warmup`` untimed batches run first. ``sync()`` waits for the device
    and runs before every clock stops. With ``stream`` (a numba stream,
    possibly ``cuda.external_stream`` of another framework's), trials are
    timed by CUDA events recorded on it.

    Example::

        t = measure(lambda: [graph.launch() for _ in range(1000)], 1000,
                    trials=9, sync=s.synchronize, stream=s)
        per_replay_us = statistics.median(t.trials) * 1e6
    """
    for _ in range(warmup):
        batch()
    sync()
    start = end = None
    if stream is not None:
        start, end = cuda.event(), cuda.event()
    wall, device = [], []
    for _ in range(trials):
        if start is not None:
            start.record(stream)
        t0 = time.perf_counter()
        batch()
        if end is not None:
            end.record(stream)
        sync()
        wall.append((time.perf_counter() - t0) / units)
        if end is not None:
            end.synchronize()
            ms = start.elapsed_time(end)
            device.append(ms * 1e-3 / units if ms > 0 else math.nan)
    if device and not any(math.isnan(t) for t in device):
        return Timing(device, "events")
    return Timing(wall, "wall")
