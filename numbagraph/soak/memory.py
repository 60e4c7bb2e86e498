"""What a workload holds: device memory, host memory, Python objects, and
whether any of them keeps growing.

A workload's :class:`Gauge` takes a baseline after the workload's warm-up,
samples every so often, each sample at a position (units of work done since
the baseline), and takes one more at the end; every sample is taken after a
garbage collection and with the workload's streams idle, so that only what
the workload holds is counted. The ``threads`` workload also records device
memory each second while its threads run (:data:`EACH_SECOND` in its
details); that series is judged in place of its two device samples.

The rule, :func:`judge_series`, on one quantity's samples:

* the samples in the first half of the run (:data:`WARMUP_FRACTION` of its
  span) are its warm-up, where pools, caches and the allocator's blocks
  fill; they are reported, not judged;
* of the rest, the *trend*: the Theil–Sen slope (the median of the slopes
  between every two judged samples, which a step or an outlier does not
  move), extrapolated over the whole run, must stay within the trend bound;
* and the *rise*: the last sample less the first judged one must stay
  within the rise bound (one allocator block of device memory).

A step up that stays flat afterwards passes; growth that goes on after the
warm-up, however small per unit of work, fails once it would add more than
the trend bound over the run. With fewer than :data:`MIN_JUDGED` judged
samples there is no trend to fit, and the whole growth, last sample less
the baseline, is held to the rise bound. The functions here are pure on
lists of numbers, so the rule is tested directly.

Resident host memory moves by pages and arenas, so a small leak per unit of
work shows first in the count of Python objects the collector tracks.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numbagraph as ng  # noqa: F401,I001  (picks the backend before numba.cuda loads)

from numba import cuda

from ..backend import active as _backend

__all__ = ["Limits", "Sample", "Growth", "Gauge", "Trend", "host_memory_used",
           "device_memory_used", "theil_sen_slope", "judge_series", "assess", "judge_growth",
           "describe_bytes", "summary", "each_second", "EACH_SECOND", "WARMUP_FRACTION",
           "MIN_JUDGED", "MIB"]

MIB = 1 << 20

WARMUP_FRACTION = 0.5
"""The part of a run's span whose samples are warm-up, not judged."""

MIN_JUDGED = 3
"""The fewest judged samples (at distinct positions) a trend is fitted to."""

EACH_SECOND = "device_growth_each_second"
"""The key of a result's details under which device memory above the
baseline, sampled once a second while the work ran, is kept (the
``threads`` workload's); judged in place of the device's own samples."""


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


def describe_bytes(amount: float | None) -> str:
    """A signed size for the report: ``+0 B``, ``-12.0 KiB``, ``+1.50 MiB``."""
    if amount is None:
        return "n/a"
    sign = "+" if amount >= 0 else "-"
    size = abs(amount)
    if size >= MIB:
        return f"{sign}{size / MIB:.2f} MiB"
    if size >= 1024:
        return f"{sign}{size / 1024:.1f} KiB"
    if size == int(size):
        return f"{sign}{int(size)} B"
    return f"{sign}{size:.1f} B"


@dataclass(frozen=True)
class Limits:
    """How much a workload may grow after its warm-up.

    The rise bounds (``device``, ``host``, ``objects``) hold the last sample
    less the first judged one. The device's is the allocator's granularity:
    a workload that keeps nothing stays within one block of it. The host's
    covers the interpreter's own arenas, which keep freed memory for reuse
    rather than return it at once. The objects bound is far below the units
    of work of a full run.

    The trend bounds (``*_trend``) hold the growth the judged samples'
    slope makes over the whole run: below one allocator block for the
    device, half the rise bound for the host and the objects, so that
    steady growth fails before it adds what a plateau may."""

    device: int = 2 * MIB
    host: int = 4 * MIB
    objects: int = 256
    device_trend: int = 1 * MIB
    host_trend: int = 2 * MIB
    objects_trend: int = 128

    def capturing_at_once(self, streams: int) -> "Limits":
        """These limits for a workload whose ``streams`` streams capture at
        the same time: the driver keeps a block of its pool for each stream
        that captured alongside others, so the device may rise by a block
        per stream; the trend bound, which a leak breaks, stays."""
        return replace(self, device=max(self.device, streams * self.device))


@dataclass(frozen=True)
class Sample:
    device: int | None
    host: int
    objects: int


# ------------------------------------------------------------------ the rule


def theil_sen_slope(positions: Sequence[float], values: Sequence[float]) -> float | None:
    """The median of the slopes between every two samples at distinct
    positions; None with no such pair. Steady growth raises every slope; a
    lone outlier, or one step anywhere but near the middle of the samples,
    raises fewer than half of them, and leaves the median where it was."""
    slopes = sorted((values[j] - values[i]) / (positions[j] - positions[i])
                    for i in range(len(positions)) for j in range(i + 1, len(positions))
                    if positions[j] != positions[i])
    if not slopes:
        return None
    middle = len(slopes) // 2
    return slopes[middle] if len(slopes) % 2 else (slopes[middle - 1] + slopes[middle]) / 2


@dataclass(frozen=True)
class Trend:
    """One quantity's samples and what the rule made of them.

    ``positions`` and ``values`` are every sample, the baseline first (value
    0); ``first`` is the index of the first judged one (0 where too few were
    left to fit a trend, and the whole growth was judged); ``slope`` is per
    unit of position (None where no trend was fitted); ``projected`` is the
    slope times the run's span; ``rise`` the last value less the first
    judged one; ``failures`` why it broke a bound, empty when it held."""

    what: str
    unit: str
    positions: tuple
    values: tuple
    first: int
    slope: float | None
    projected: float | None
    rise: float
    rise_bound: float
    trend_bound: float
    failures: tuple = ()

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def span(self) -> float:
        return self.positions[-1] - self.positions[0] if self.positions else 0.0

    @property
    def judged(self) -> int:
        return len(self.values) - self.first

    def amount(self, value: float | None) -> str:
        """``value`` as this quantity is counted: bytes or objects."""
        if value is None:
            return "n/a"
        if self.what == "Python objects":
            return f"{value:+.0f}" if value == int(value) else f"{value:+.2f}"
        return describe_bytes(value)

    def at(self, position: float) -> str:
        if self.unit == "s":
            return f"{position:.1f} s"
        return f"{position:g} {self.unit}s"

    def window(self) -> str:
        """Which samples were judged: ``samples 6-11 of 0-11 (cycles 1000-2000)``,
        the baseline being sample 0."""
        last = len(self.values) - 1
        a, b = self.positions[self.first], self.positions[-1]
        where = f"{a:.1f}-{b:.1f} s" if self.unit == "s" else f"{self.unit}s {a:g}-{b:g}"
        return f"samples {self.first}-{last} of 0-{last} ({where})"

    def bound(self, value: float) -> str:
        """A bound as this quantity is counted, unsigned: ``2.00 MiB``, ``128``."""
        return self.amount(value).lstrip("+")

    def brief(self, window: bool = True) -> str:
        """A phrase for the report line: the judged samples' slope and what
        it makes over the run, with its bound (and which samples, unless
        ``window`` is False); or, where no trend was fitted, the whole
        growth and its bound."""
        name = {"device memory": "device", "host memory": "host"}.get(self.what, "objects")
        if self.slope is None:
            return f"{name} {self.amount(self.rise)} in all (bound {self.bound(self.rise_bound)})"
        return (f"{name} {self.amount(self.slope)}/{self.unit}"
                + (f" over {self.window()}" if window else "")
                + f" -> {self.amount(self.projected)}/run (bound {self.bound(self.trend_bound)})")

    def as_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "positions": list(self.positions),
                "values": list(self.values), "judged_from": self.first,
                "judged_positions": [self.positions[self.first], self.positions[-1]],
                "slope_per_unit": self.slope, "projected_over_run": self.projected,
                "trend_bound": self.trend_bound, "rise": self.rise,
                "rise_bound": self.rise_bound, "passed": self.passed,
                "failures": list(self.failures)}


def summary(trends: Sequence[Trend]) -> str:
    """What was judged, for the report line: the window of samples once
    where the fitted trends share it, then each quantity's slope and bound."""
    fitted = [t for t in trends if t.slope is not None]
    windows = {(t.positions, t.first) for t in fitted}
    shared = len(windows) == 1 and len(fitted) > 1
    phrases = [t.brief(window=not shared) for t in trends]
    head = f"judged {fitted[0].window()}: " if shared else "judged: "
    return head + ", ".join(phrases)


def judge_series(positions: Sequence[float], values: Sequence[float], *, rise_bound: float,
                 trend_bound: float, what: str = "device memory", unit: str = "unit",
                 warmup: float = WARMUP_FRACTION) -> Trend:
    """The rule on one quantity's samples: ``values[i]`` above the baseline at
    ``positions[i]`` (ascending, the baseline first). The samples before
    ``warmup`` of the span are warm-up; of the rest, the Theil–Sen slope
    times the span must stay within ``trend_bound`` and the last value less
    the first judged one within ``rise_bound``. With fewer than
    :data:`MIN_JUDGED` judged samples at distinct positions, the last value
    less the first is held to ``rise_bound``."""
    positions, values = tuple(positions), tuple(values)
    if len(positions) != len(values) or not values:
        raise ValueError("judge_series needs one position per value, and at least one")
    if any(b < a for a, b in zip(positions, positions[1:])):
        raise ValueError("positions must not decrease")
    cut = positions[0] + warmup * (positions[-1] - positions[0])
    first = next(i for i, p in enumerate(positions) if p >= cut)
    failures = []
    if len(set(positions[first:])) < MIN_JUDGED:
        rise = values[-1] - values[0]
        trend = Trend(what, unit, positions, values, 0, None, None, rise, rise_bound, trend_bound)
        if rise > rise_bound:
            failures.append(_grew(trend))
        return _with(trend, failures)
    slope = theil_sen_slope(positions[first:], values[first:])
    projected = slope * (positions[-1] - positions[0])
    rise = values[-1] - values[first]
    trend = Trend(what, unit, positions, values, first, slope, projected, rise, rise_bound,
                  trend_bound)
    verb = "keep" if what.endswith("s") else "keeps"
    if projected > trend_bound:
        failures.append(
            f"{what} {verb} growing after warm-up: {trend.amount(slope)}/{unit}, the "
            f"Theil-Sen slope of {trend.window()}, makes {trend.amount(projected)} over the "
            f"run's {trend.at(trend.span)} (bound {trend.bound(trend_bound)})")
    if rise > rise_bound:
        failures.append(f"{what} rose {trend.amount(rise)} after warm-up, over "
                        f"{trend.window()} (bound {trend.bound(rise_bound)})")
    return _with(trend, failures)


def _grew(trend: Trend) -> str:
    """The whole growth's failure, worded as before the trend rule."""
    if trend.what == "Python objects":
        return f"{trend.rise:.0f} more Python objects (bound {trend.rise_bound:.0f})"
    return (f"{trend.what} grew {trend.rise / MIB:.2f} MiB "
            f"(bound {trend.rise_bound / MIB:.0f} MiB)")


def _with(trend: Trend, failures: list) -> Trend:
    return Trend(trend.what, trend.unit, trend.positions, trend.values, trend.first,
                 trend.slope, trend.projected, trend.rise, trend.rise_bound, trend.trend_bound,
                 tuple(failures))


def each_second(during: Sequence[Any], last: int | None,
                seconds: float) -> tuple[tuple, tuple] | None:
    """Positions and values of a series sampled once a second while the work
    ran (``during``, the first a second after the baseline) and once at its
    end (``last``, at ``seconds``); None where any of it was not counted."""
    if not during or last is None or any(d is None for d in during):
        return None
    positions = (0.0, *(float(i + 1) for i in range(len(during))),
                 max(float(len(during) + 1), seconds))
    return positions, (0, *during, last)


# ------------------------------------------------------------------ samples


@dataclass
class Growth:
    """Bytes gained between the baseline and the last sample, over ``units``
    units of work (cycles, replays, refusals); ``peak_host`` is the most the
    host held above the baseline at any sample. ``positions`` and ``trail``
    are every sample (the baseline first) and where it was taken, in units
    of work; empty where only the totals are known."""

    device: int | None
    host: int
    objects: int
    peak_host: int
    units: int
    samples: int
    positions: tuple = ()
    trail: tuple = ()

    def per_unit(self, amount: int | None) -> float | None:
        if amount is None or not self.units:
            return None
        return amount / self.units


def assess(growth: Growth, limits: Limits, unit: str = "unit",
           device_each_second: tuple[tuple, tuple] | None = None) -> dict[str, Trend]:
    """The rule on each quantity ``growth`` sampled: ``device`` (where it is
    counted), ``host``, ``objects``. Device memory sampled each second
    (:func:`each_second`) is judged in place of the device's own samples.
    Without a trail, the totals are judged as one sample after the baseline."""
    if growth.trail:
        base = growth.trail[0]
        positions = growth.positions
        device = (None if any(s.device is None for s in growth.trail)
                  else [s.device - base.device for s in growth.trail])
        host = [s.host - base.host for s in growth.trail]
        objects = [s.objects - base.objects for s in growth.trail]
    else:
        positions = (0, growth.units)
        device = None if growth.device is None else [0, growth.device]
        host, objects = [0, growth.host], [0, growth.objects]
    trends = {}
    if device_each_second is not None:
        trends["device"] = judge_series(*device_each_second, rise_bound=limits.device,
                                        trend_bound=limits.device_trend,
                                        what="device memory", unit="s")
    elif device is not None:
        trends["device"] = judge_series(positions, device, rise_bound=limits.device,
                                        trend_bound=limits.device_trend,
                                        what="device memory", unit=unit)
    trends["host"] = judge_series(positions, host, rise_bound=limits.host,
                                  trend_bound=limits.host_trend, what="host memory", unit=unit)
    trends["objects"] = judge_series(positions, objects, rise_bound=limits.objects,
                                     trend_bound=limits.objects_trend, what="Python objects",
                                     unit=unit)
    return trends


def judge_growth(growth: Growth, limits: Limits, unit: str = "unit",
                 device_each_second: tuple[tuple, tuple] | None = None) -> list[str]:
    """Why ``growth`` breaks ``limits``: one reason per bound exceeded, none
    when it holds (see :func:`assess`)."""
    return [why for trend in assess(growth, limits, unit, device_each_second).values()
            for why in trend.failures]


@dataclass
class Gauge:
    """Samples memory for one workload: ``start()`` after its warm-up,
    ``sample(at)`` every so often (``at``: units of work done since
    ``start()``), ``growth(units)`` at its end. ``idle`` is called before
    each sample to wait for the workload's streams. Samples taken without
    ``at`` are placed evenly between the baseline and the end."""

    idle: Callable[[], None] = lambda: None
    baseline: Sample | None = None
    samples: list = field(default_factory=list)
    positions: list = field(default_factory=list)

    def _take(self) -> Sample:
        self.idle()
        gc.collect()
        # The samples kept so far are objects too, and not the workload's.
        objects = len(gc.get_objects()) - len(self.samples)
        return Sample(device_memory_used(), host_memory_used(), objects)

    def start(self) -> None:
        self.baseline = self._take()
        self.samples = []
        self.positions = []

    def sample(self, at: float | None = None) -> None:
        self.samples.append(self._take())
        self.positions.append(at)

    def growth(self, units: int) -> Growth:
        """Take the last sample and say what grew since ``start()``."""
        self.sample(at=units)
        base, last = self.baseline, self.samples[-1]
        device = None if base.device is None or last.device is None else last.device - base.device
        return Growth(device, last.host - base.host, last.objects - base.objects,
                      max(s.host for s in self.samples) - base.host, units, len(self.samples),
                      positions=(0, *self._placed(units)), trail=(base, *self.samples))

    def _placed(self, units: int) -> list:
        """Every sample's position; those taken without one spread evenly
        up to ``units``, the others kept in order."""
        count = len(self.positions) - 1
        placed = [units * (i + 1) / count if at is None else at
                  for i, at in enumerate(self.positions[:-1])] + [units]
        for i in range(1, len(placed)):
            placed[i] = max(placed[i], placed[i - 1])
        return placed
