"""What every suite shares: the run's configuration, result rows, and the
context (stream, progress, peers) a suite runs in."""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numbagraph as ng

from .timing import Contender, measure_many

__all__ = [
    "Config",
    "Context",
    "PeerMissing",
    "Row",
    "SuiteResult",
    "clamp_repeats",
]


class PeerMissing(Exception):
    """A peer (PyTorch, CuPy, nvcc, the raw driver, an example) cannot run
    here; the message says why, and the suite goes on without it."""


@dataclass(frozen=True)
class Config:
    """How hard each suite works.

    ``Config.for_run(quick)`` picks the sizes: on the GPU, the sizes the
    targets are stated for; on Numba's simulator, which runs one Python thread
    per GPU thread, sizes small enough to prove the code path in seconds.
    """

    quick: bool
    simulated: bool
    elements: int              # length of the tiny kernel's array
    graph_sizes: tuple         # nodes per graph in the replay suite
    capture_sizes: tuple       # launches per capture in the capture suite
    trials: int                # timed trials per measurement; the median is kept
    warmup: int                # untimed units before the trials
    target_units: int          # replayed nodes per trial
    min_repeats: int
    max_repeats: int
    launch_repeats: int        # eager launches or loop steps per trial
    capture_trials: int
    capture_launches: int      # launches per capture-suite trial (several captures when small)
    bandwidth_elements: int    # float32 elements per array in the bandwidth suite
    bandwidth_repeats: int
    app_timeout: float         # seconds an example may run
    warm_seconds: float = 0.0  # tiny launches before the first suite, to settle clocks

    @classmethod
    def for_run(cls, quick: bool) -> "Config":
        if ng.backend() == "simulator":
            return cls(
                quick=quick, simulated=True, elements=32,
                graph_sizes=(1, 4), capture_sizes=(2, 4),
                trials=2, warmup=1, target_units=8, min_repeats=1, max_repeats=4,
                launch_repeats=4, capture_trials=2, capture_launches=4,
                bandwidth_elements=64, bandwidth_repeats=1,
                app_timeout=600.0, warm_seconds=0.0,
            )
        if quick:
            return cls(
                quick=True, simulated=False, elements=1024,
                graph_sizes=(1, 10, 100, 1000), capture_sizes=(10, 100, 1000),
                trials=5, warmup=200, target_units=50_000, min_repeats=20,
                max_repeats=2_000, launch_repeats=2_000, capture_trials=5, capture_launches=1000,
                bandwidth_elements=1 << 28, bandwidth_repeats=5,
                app_timeout=60.0, warm_seconds=1.0,
            )
        return cls(
            quick=False, simulated=False, elements=1024,
            graph_sizes=(1, 10, 100, 1000), capture_sizes=(10, 100, 1000),
            trials=11, warmup=500, target_units=200_000, min_repeats=50,
            max_repeats=5_000, launch_repeats=5_000, capture_trials=11, capture_launches=1000,
            bandwidth_elements=1 << 28, bandwidth_repeats=10,
            app_timeout=100.0, warm_seconds=2.0,
        )

    def repeats_for(self, nodes: int) -> int:
        """Replays per trial of a graph of ``nodes`` nodes."""
        return clamp_repeats(self.target_units, nodes, self.min_repeats, self.max_repeats)

    @property
    def grid(self) -> tuple[int, int]:
        """Blocks and threads per block for the tiny kernel."""
        block = min(self.elements, 256)
        return (self.elements + block - 1) // block, block


def clamp_repeats(target: int, units: int, lo: int, hi: int) -> int:
    """``target // units`` clamped to ``[lo, hi]`` (the C++ floor uses the same)."""
    return max(lo, min(hi, target // units))


@dataclass
class Row:
    """One measured number: ``peer`` doing ``case``, the median of ``trials``."""

    case: str
    peer: str
    value: float
    unit: str
    trials: list = field(default_factory=list)
    clock: str = "wall"        # "events" (GPU-side) or "wall" (host clock after sync)
    param: float | None = None  # numeric x for plots (nodes, launches)
    note: str = ""

    @classmethod
    def of(cls, case: str, peer: str, trials: list, unit: str, clock: str,
           param: float | None = None, note: str = "") -> "Row":
        return cls(case, peer, statistics.median(trials), unit, list(trials),
                   clock, param, note)


@dataclass
class SuiteResult:
    name: str
    title: str
    unit: str
    higher_is_better: bool = False
    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)   # (peer, reason)
    notes: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # tracebacks of peers that raised
    error: str | None = None
    seconds: float = 0.0
    unjudged: str | None = None  # why this run's rows judge none of the suite's targets

    def add_skip(self, peer: str, why: str) -> bool:
        """Record that ``peer`` was skipped and why, once per peer; True when
        this is the first record of it."""
        if any(p == peer for p, _ in self.skipped):
            return False
        self.skipped.append([peer, why])
        return True

    def find(self, case: str, peer: str) -> Row | None:
        for row in self.rows:
            if row.case == case and row.peer == peer:
                return row
        return None


class Context:
    """What a suite is given: the configuration, a progress line printer,
    and peers it can share with other suites (built once per run).

    Progress lines go to ``stream`` (default: stderr), or to ``say(message)``
    when given (a child process relaying them to its parent)."""

    def __init__(self, config: Config, *, stream: Any = None,
                 say: Callable[[str], None] | None = None):
        self.config = config
        self._out = stream
        self._say = say
        self._start = time.perf_counter()
        self._suite = ""
        self._shared: dict[str, Any] = {}
        self._closers: list[Callable[[], None]] = []

    def begin_suite(self, label: str) -> None:
        self._suite = label

    def progress(self, message: str) -> None:
        if self._say is not None:
            self._say(message)
            return
        elapsed = time.perf_counter() - self._start
        print(f"[{elapsed:6.1f}s {self._suite}] {message}",
              file=self._out or sys.stderr, flush=True)

    def _report(self, row: Row) -> None:
        self.progress(f"{row.peer}, {row.case}: {row.value:.4g} {row.unit} ({row.clock})")

    def skip(self, result: SuiteResult, peer: str, why: str) -> None:
        """Record once that ``peer`` could not run in this suite, and why."""
        if result.add_skip(peer, why):
            self.progress(f"{peer}: skipped: {why}")

    def fail(self, result: SuiteResult, peer: str, exc: BaseException) -> None:
        """Record that ``peer`` raised: a bug, reported with its traceback."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        result.failures.append(f"{peer}:\n{text}")
        self.skip(result, peer, f"failed: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def recording_errors(self, result: SuiteResult, peer: str) -> Iterator[None]:
        """Run the block for ``peer``: if it raises PeerMissing, the peer is
        recorded as skipped with the reason; any other exception, as failed.
        Either way the suite goes on after the block."""
        try:
            yield
        except PeerMissing as exc:
            self.skip(result, peer, str(exc))
        except Exception as exc:
            self.fail(result, peer, exc)

    def attempt(self, result: SuiteResult, peer: str,
                rows: Callable[[], Iterable[Row]]) -> None:
        """Add the rows ``rows()`` yields to ``result``, reporting each as it
        comes. A peer that is missing or fails is recorded as skipped with
        its reason, and the suite goes on."""
        with self.recording_errors(result, peer):
            for row in rows():
                result.rows.append(row)
                self._report(row)

    def compare(self, result: SuiteResult, case: str,
                setups: dict[str, Callable[[], Contender]], *, unit: str,
                scale: float = 1e6, param: float | None = None,
                trials: int | None = None,
                convert: Callable[[float], float] | None = None,
                notes: dict[str, str] | None = None) -> None:
        """Set up one contender per peer for ``case``, time them round-robin
        (see :func:`~numbagraph.bench.timing.measure_many`) and add a row for
        each; ``scale`` turns seconds per unit into ``unit``, or ``convert``
        does (for units that are not proportional to time, like GB/s).
        ``notes`` replace the contenders' own notes, per peer. Missing peers
        are skipped with the reason, failing ones recorded."""
        contenders: dict[str, Contender] = {}
        for peer, setup in setups.items():
            with self.recording_errors(result, peer):
                contenders[peer] = setup()
        try:
            timings = measure_many(
                contenders, trials=trials or self.config.trials,
                on_error=lambda peer, exc: self.fail(result, peer, exc),
            )
            for peer, timing in timings.items():
                values = ([convert(t) for t in timing.trials] if convert is not None
                          else timing.scaled(scale))
                note = (notes or {}).get(peer, contenders[peer].note)
                row = Row.of(case, peer, values, unit, timing.clock, param=param, note=note)
                result.rows.append(row)
                self._report(row)
        finally:
            for peer, contender in contenders.items():
                if contender.close is not None:
                    try:
                        contender.close()
                    except Exception as exc:
                        self.fail(result, peer, exc)

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        """The peer stored under ``key``, made on first use. A PeerMissing
        raised by ``make`` is remembered and raised again on later calls."""
        if key not in self._shared:
            try:
                self._shared[key] = make()
            except PeerMissing as exc:
                self._shared[key] = exc
        value = self._shared[key]
        if isinstance(value, PeerMissing):
            raise value
        return value

    def on_close(self, fn: Callable[[], None]) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        while self._closers:
            try:
                self._closers.pop()()
            except Exception:
                pass  # cleanup of a temporary folder or a peer must not hide results
