"""What every workload shares: how hard it works (Plan), what it reports
(Result), and the exact check of what the device computed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .memory import (EACH_SECOND, Growth, Limits, Trend, assess, describe_bytes,
                     each_second)

__all__ = ["Plan", "Result", "mismatch", "describe_bytes"]


@dataclass(frozen=True)
class Plan:
    """Counts for one run. ``Plan.for_run(quick=False)`` is the run stated
    for the GPU; ``Plan.for_run(quick=True)`` the same workloads at sizes
    that finish in seconds on Numba's simulator, which runs one Python thread
    per GPU thread."""

    quick: bool
    width: int                 # threads (and array elements) of every launch
    cycles: int                # capture / instantiate / launch / close cycles
    cycle_warmup: int
    replays: int               # replays of the replay workload's graph
    replay_nodes: int
    replay_warmup: int
    threads: int               # threads of the threads workload, per mode
    thread_seconds: float      # how long they capture and replay, per mode
    thread_warmup_seconds: float
    shared_rounds: int         # rounds of threads sharing one graphed function and one graph
    shared_warmup: int
    shared_calls: int          # calls of each per thread per round
    refusals: int              # refused operations, the kinds taken in turn
    conditionals: int          # while-loop graphs made, launched and closed
    conditional_warmup: int
    rebinds: int               # calls of a graphed step, rebound at each
    rebind_warmup: int
    samples: int = 10          # memory samples per workload after its warm-up
    leak_bytes: int = 64 * 1024  # kept per cycle by the injected leak (--inject-leak)
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def for_run(cls, quick: bool) -> "Plan":
        if quick:
            return cls(quick=True, width=1, cycles=2_000, cycle_warmup=200,
                       replays=500, replay_nodes=10, replay_warmup=20,
                       threads=8, thread_seconds=1.5, thread_warmup_seconds=0.3,
                       shared_rounds=6, shared_warmup=2, shared_calls=12,
                       refusals=340, conditionals=100, conditional_warmup=5,
                       rebinds=500, rebind_warmup=50)
        return cls(quick=False, width=32, cycles=20_000, cycle_warmup=1_000,
                   replays=1_000_000, replay_nodes=10, replay_warmup=10_000,
                   threads=8, thread_seconds=30.0, thread_warmup_seconds=2.0,
                   shared_rounds=1_000, shared_warmup=20, shared_calls=50,
                   refusals=1_000, conditionals=2_000, conditional_warmup=50,
                   rebinds=200_000, rebind_warmup=2_000)

    @property
    def leak_cycles(self) -> int:
        """Cycles of the injected leak (``--inject-leak``): a tenth of ``cycles``."""
        return max(1, self.cycles // 10)

    @property
    def leak_warmup(self) -> int:
        """Its warm-up cycles: a tenth of ``cycle_warmup``."""
        return self.cycle_warmup // 10

    def every(self, count: int) -> int:
        """Units of work between two memory samples."""
        return max(1, count // self.samples)


@dataclass
class Result:
    """One workload's outcome: ``count`` units of ``unit`` in ``seconds``,
    what memory grew, what failed (empty when it passed), a line for the
    report and details for the JSON."""

    name: str
    count: int
    unit: str
    seconds: float = 0.0
    growth: Growth | None = None
    failures: list = field(default_factory=list)
    note: str = ""
    details: dict = field(default_factory=dict)
    trends: dict[str, Trend] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def unit_name(self) -> str:
        """One unit of work: ``cycle`` for ``cycles``."""
        return self.unit.rstrip("s") or "unit"

    def judge(self, growth: Growth, limits: Limits) -> None:
        """Keep ``growth``, judge it by the rule of :mod:`.memory` (device
        memory sampled each second, where the details hold it, in place of
        the device's own samples) and fail on every bound it breaks."""
        self.growth = growth
        during = self.details.get(EACH_SECOND)
        series = each_second(during, growth.device, self.seconds) if during else None
        self.trends = assess(growth, limits, self.unit_name, device_each_second=series)
        self.failures += [why for trend in self.trends.values() for why in trend.failures]

    def as_dict(self) -> dict[str, Any]:
        growth = None
        if self.growth is not None:
            g = self.growth
            growth = {"device_bytes": g.device, "host_bytes": g.host,
                      "objects": g.objects, "peak_host_bytes": g.peak_host, "units": g.units,
                      "samples": g.samples,
                      "device_bytes_per_unit": g.per_unit(g.device),
                      "host_bytes_per_unit": g.per_unit(g.host),
                      "judged": {name: t.as_dict() for name, t in self.trends.items()}}
        return {"name": self.name, "count": self.count, "unit": self.unit,
                "seconds": round(self.seconds, 3), "passed": self.passed,
                "failures": list(self.failures), "note": self.note, "growth": growth,
                "details": self.details}


def mismatch(what: str, expected: Any, got: Any) -> str | None:
    """None when ``got`` equals ``expected`` exactly, element by element;
    else a sentence naming the first element that differs."""
    want, have = np.asarray(expected), np.asarray(got)
    if want.shape != have.shape:
        return f"{what}: expected shape {want.shape}, got {have.shape}"
    wrong = np.flatnonzero(want.ravel() != have.ravel())
    if not wrong.size:
        return None
    i = int(wrong[0])
    return (f"{what}: {wrong.size} of {want.size} values wrong; element {i} is "
            f"{have.ravel()[i].item()!r}, expected {want.ravel()[i].item()!r}")
