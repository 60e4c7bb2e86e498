"""What a workload holds: device memory, host memory, Python objects, and
whether any of them grew.

Growth is judged between a sample taken after a workload's warm-up and one
taken at its end, both after a garbage collection and with the workload's
streams idle, so that only what the workload kept is counted. Resident host
memory moves by pages and arenas, so a small leak per unit of work shows
first in the count of Python objects the collector tracks.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
from dataclasses import dataclass, field
from typing import Callable

import numbagraph as ng  # noqa: F401,I001  (picks the backend before numba.cuda loads)

from numba import cuda

from ..backend import active as _backend

__all__ = ["Limits", "Sample", "Growth", "Gauge", "host_memory_used", "device_memory_used",
           "judge_growth", "MIB"]

MIB = 1 << 20


def host_memory_used() -> int:
    """Bytes of this process resident in host memory: ``/proc/self/statm``
    where there is one, else the peak ``getrusage`` reports (which can only
    grow, so it overstates growth, never hides it)."""
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Linux reports KiB, macOS bytes.
        return peak if sys.platform == "darwin" else peak * 1024


def device_memory_used() -> int | None:
    """Bytes in use on the current device, or None where none is counted
    (the simulator's arrays are host memory)."""
    cuda.current_context()  # the driver answers only a thread with a context
    return _backend.device_memory_used()


@dataclass(frozen=True)
class Limits:
    """How much a workload may grow after its warm-up. The device bound is the
    allocator's granularity: a workload that keeps nothing stays within one
    block of it. The host bound covers the interpreter's own arenas, which
    keep freed memory for reuse rather than return it at once. The objects
    bound is far below the units of work of a full run, so that one object
    kept per cycle, replay or refusal fails it."""

    device: int = 2 * MIB
    host: int = 4 * MIB
    objects: int = 256


@dataclass(frozen=True)
class Sample:
    device: int | None
    host: int
    objects: int


@dataclass
class Growth:
    """Bytes gained between the baseline and the last sample, over ``units``
    units of work (cycles, replays, refusals); ``peak_host`` is the most the
    host held above the baseline at any sample."""

    device: int | None
    host: int
    objects: int
    peak_host: int
    units: int
    samples: int

    def per_unit(self, amount: int | None) -> float | None:
        if amount is None or not self.units:
            return None
        return amount / self.units


def judge_growth(growth: Growth, limits: Limits) -> list[str]:
    """Why ``growth`` breaks ``limits``: one reason per bound exceeded, none
    when it holds."""
    why = []
    if growth.device is not None and growth.device > limits.device:
        why.append(f"device memory grew {growth.device / MIB:.2f} MiB "
                   f"(bound {limits.device / MIB:.0f} MiB)")
    if growth.host > limits.host:
        why.append(f"host memory grew {growth.host / MIB:.2f} MiB "
                   f"(bound {limits.host / MIB:.0f} MiB)")
    if growth.objects > limits.objects:
        why.append(f"{growth.objects} more Python objects (bound {limits.objects})")
    return why


@dataclass
class Gauge:
    """Samples memory for one workload: ``start()`` after its warm-up,
    ``sample()`` every so often, ``growth(units)`` at its end. ``idle`` is
    called before each sample to wait for the workload's streams."""

    idle: Callable[[], None] = lambda: None
    baseline: Sample | None = None
    samples: list = field(default_factory=list)

    def _take(self) -> Sample:
        self.idle()
        gc.collect()
        # The samples kept so far are objects too, and not the workload's.
        objects = len(gc.get_objects()) - len(self.samples)
        return Sample(device_memory_used(), host_memory_used(), objects)

    def start(self) -> None:
        self.baseline = self._take()
        self.samples = []

    def sample(self) -> None:
        self.samples.append(self._take())

    def growth(self, units: int) -> Growth:
        """Take the last sample and say what grew since ``start()``."""
        self.sample()
        base, last = self.baseline, self.samples[-1]
        device = None if base.device is None or last.device is None else last.device - base.device
        return Growth(device, last.host - base.host, last.objects - base.objects,
                      max(s.host for s in self.samples) - base.host, units, len(self.samples))
