"""Timing: warm up, run trials, synchronise before every clock stops.

A contender's ``batch()`` does ``units`` units of work (launches, replays,
nodes, bytes); each trial times one batch and gives seconds per unit. With a
stream, a trial is also timed on the GPU by CUDA events recorded on that
stream around the batch; those times are used when the events time at all
(Numba's simulator returns no event times, so there the host clock is used).

Contenders compared with each other are measured round-robin, one trial of
each in turn (the starting one rotating), so that a change of machine state
during the run (clocks, another process) falls on all of them alike. The
garbage collector is off inside each timed batch, as in ``timeit``.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from numba import cuda

__all__ = ["Contender", "Timing", "measure", "measure_many"]


@dataclass
class Timing:
    """Seconds per unit for each trial, and which clock measured them."""

    trials: list
    clock: str

    def scaled(self, factor: float) -> list:
        return [t * factor for t in self.trials]


@dataclass
class Contender:
    """One thing to time: ``batch()`` does ``units`` units of work, ``sync()``
    waits for the device; ``stream`` (a numba stream, possibly an external
    one wrapping another framework's) enables CUDA-event timing; ``close()``
    frees what it used, after the trials; ``lead()``, if given, runs before
    each trial's clocks start: untimed work, such as a call that keeps the
    GPU busy while the host enqueues the first timed unit, or freeing what
    the last trial made."""

    batch: Callable[[], Any]
    units: float
    sync: Callable[[], Any]
    stream: Any = None
    close: Callable[[], Any] | None = None
    note: str = ""
    lead: Callable[[], Any] | None = None


def _trial(c: Contender, events) -> tuple[float, float]:
    """(wall seconds, event seconds or NaN) per unit, for one batch."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        if c.lead is not None:
            c.lead()
        if events is not None:
            events[0].record(c.stream)
        t0 = time.perf_counter()
        c.batch()
        if events is not None:
            events[1].record(c.stream)
        c.sync()
        wall = (time.perf_counter() - t0) / c.units
    finally:
        if enabled:
            gc.enable()
    if events is None:
        return wall, math.nan
    events[1].synchronize()
    ms = events[0].elapsed_time(events[1])
    return wall, (ms * 1e-3 / c.units if ms > 0 else math.nan)


def measure_many(
    contenders: dict[str, Contender],
    *,
    trials: int,
    warmup: int = 1,
    on_error: Callable[[str, BaseException], None] | None = None,
) -> dict[str, Timing]:
    """Time every contender, round-robin, ``trials`` times after ``warmup``
    untimed batches each. A contender that raises is dropped (and reported
    to ``on_error`` if given, else re-raised); the others go on.

    Example::

        timings = measure_many({
            "numbagraph": Contender(lambda: [g.launch() for _ in range(1000)],
                                    1000, s.synchronize, stream=s),
            "cuda.core": Contender(...),
        }, trials=9)
        per_replay_us = statistics.median(timings["numbagraph"].trials) * 1e6
    """
    live = dict(contenders)

    def drop(name: str, exc: BaseException) -> None:
        live.pop(name, None)
        if on_error is None:
            raise exc
        on_error(name, exc)

    for name, c in list(live.items()):
        try:
            for _ in range(warmup):
                c.batch()
            c.sync()
        except Exception as exc:
            drop(name, exc)
    events = {name: (cuda.event(), cuda.event()) if c.stream is not None else None
              for name, c in live.items()}
    wall: dict[str, list] = {name: [] for name in live}
    device: dict[str, list] = {name: [] for name in live}
    names = list(live)
    gc.collect()
    for trial in range(trials):
        k = trial % len(names) if names else 0
        for name in names[k:] + names[:k]:
            if name not in live:
                continue
            try:
                w, d = _trial(live[name], events[name])
            except Exception as exc:
                drop(name, exc)
                continue
            wall[name].append(w)
            device[name].append(d)
    out = {}
    for name in live:
        if events[name] is not None and not any(math.isnan(t) for t in device[name]):
            out[name] = Timing(device[name], "events")
        else:
            out[name] = Timing(wall[name], "wall")
    return out


def measure(
    batch: Callable[[], Any],
    units: float,
    *,
    trials: int,
    sync: Callable[[], Any],
    warmup: int = 1,
    stream: Any = None,
) -> Timing:
    """Time ``batch()`` alone (which does ``units`` units of work); see
    :func:`measure_many`.

    Example::

        t = measure(lambda: [graph.launch() for _ in range(1000)], 1000,
                    trials=9, sync=s.synchronize, stream=s)
    """
    contender = Contender(batch, units, sync, stream)
    return measure_many({"": contender}, trials=trials, warmup=warmup)[""]
