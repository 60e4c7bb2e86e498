"""Suite ``sizes``: one graph for many sizes. A graphed function with
``ng.graphed(step, stream=s, sizes="update")`` given a call whose arrays
differ from its kept graph's only in shape runs the step's Python again
without capturing, and sets the new grids and kernel arguments on that
graph's nodes.

* ``new size, N-node step`` (N = 10 and 100; 2 and 4 on the simulator): a
  step of N launches of ``y[i] += x[i]`` over views ``x[:n]``, ``y[:n]`` of
  arrays of 4096 float32, its grid sized to ``n`` (blocks of 256), called
  with ``n`` alternating between 1000 and 3000: every call is a new size
  for the graph kept. Peers: ``sizes="update"`` (the call re-sizes the one
  graph and launches it); ``capture + instantiate``, the reference of the
  target: the step captured with ``ng.capture`` at each call's size (the
  capture instantiates the graph as it ends) and launched, the graph of the
  call before closed, which is what a new size costs without node updates,
  with no graphed function's bookkeeping on top; ``sizes="capture"``, the
  graphed function as it is without the mode (``warmup=0, max_graphs=1``:
  every call captures its size and evicts the graph of the last); and the
  ``plain launch`` of the step captured once at the larger size, the floor.
  Every peer's launch is in its time.
* ``16 sizes``: the 10-node step (2 on the simulator) called with 16
  sizes in turn (grids of 1 to 16 blocks), each call a size other than the
  last's: ``sizes="update"`` against ``sizes="capture"`` with
  ``max_graphs=16`` (a graph per size, each call a replay of its own).
  After the trials, each function's ``cache_info()`` gives the rows ``16
  sizes, graphs held`` and ``16 sizes, captures``, which the targets ask to
  be one graph, captured once. The step allocates no temporary: in this
  mode a step whose capture records graph memory (``ng.empty``) is
  captured again at each new size, with a GraphedWarning, since memory
  nodes take no new sizes by node updates; its graph memory would be a set
  per capture, not one set for every size, so none is reported.
* ``particles, 10% active``: the particle step of ``examples/particles.py``
  (move, drop the particles that leave [0, 1), compact the rest in order,
  append a few new ones: the active count changes every step), in buffers
  of 1<<20 particles with a tenth of them active at the start (128 on the
  simulator), in the example's four modes: ``(a) graph per count``
  (``ng.graphed``, a capture per new count), ``(b) max grid, early exit``
  (one graph over every particle the buffers hold, blocks past the count
  returning at once), ``(c) sizes="update"`` (one graph given each count's
  grids and views by node updates) and ``(d) device-sized grids`` (the
  whole run one launch, the grids set on the GPU by ``ng.set_grid``); (a)
  and (c) read the count back after each step, to size the next call. The
  example times each mode on the host clock over all its steps and checks
  it against NumPy; the suite runs it once untimed, then once per trial,
  and a mode that differs from NumPy fails. ``best mode`` is the fastest
  mode other than (b), which its note names. :func:`particle_rows` turns
  per-step costs of any modes into these rows.

Host clock over R calls, stopped after the stream synchronises; median of
the trials after one untimed batch, the peers taking turns trial by trial.
Before the trials every peer's calls are checked: ``y`` zeroed over
``[:n]`` and poisoned past it, the call made, ``y[:n]`` compared with N
times ``x[:n]`` and the rest left as it was. After the trials the graphed
functions' ``cache_info()`` must show what each mode does: with
``sizes="update"`` one capture and every later call a resize (in the new
size cases), with ``sizes="capture"`` a capture per call.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import types
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from numba import cuda

import numbagraph as ng

from .apps import examples_dir
from .core import Config, Context, PeerMissing, Row, SuiteResult, clamp_repeats
from .peers import numba_tiny
from .timing import Contender

__all__ = [
    "NAME", "TITLE", "UNIT", "run", "STEPS", "SIMULATED_STEPS", "NEW_SIZE", "case",
    "UPDATE", "RECAPTURE", "PER_SIZE", "PLAIN", "SIZE_COUNT", "SIXTEEN", "GRAPHS", "CAPTURES",
    "COUNT_UNIT", "PARTICLES", "PER_COUNT", "MAX_GRID", "UPDATE_MODE", "DEVICE_GRIDS",
    "BEST", "STEP_UNIT", "ACTIVE", "EXAMPLE", "EXAMPLE_MODES", "particle_rows", "parse_modes",
]

NAME = "sizes"
TITLE = "One graph for many sizes: a new size each call, 16 sizes, particles"
UNIT = "us/call"

STEPS = (10, 100)              # launches per step on a GPU
SIMULATED_STEPS = (2, 4)       # on the simulator, where a launch costs milliseconds
NEW_SIZE = "new size"
UPDATE = 'sizes="update"'
RECAPTURE = "capture + instantiate"
PER_SIZE = 'sizes="capture"'
PLAIN = "plain launch"

SIZE_COUNT = 16
SIXTEEN = f"{SIZE_COUNT} sizes"
GRAPHS = f"{SIXTEEN}, graphs held"
CAPTURES = f"{SIXTEEN}, captures"
COUNT_UNIT = "count"

PARTICLES = "particles, 10% active"
ACTIVE = 0.1
PER_COUNT = "(a) graph per count"
MAX_GRID = "(b) max grid, early exit"
UPDATE_MODE = '(c) sizes="update"'
DEVICE_GRIDS = "(d) device-sized grids"
BEST = "best mode"
STEP_UNIT = "us/step"


def case(nodes: int) -> str:
    """The name of the case of an ``nodes``-launch step called at a new size."""
    return f"{NEW_SIZE}, {nodes}-node step"


@cuda.jit
def _accumulate(x, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] += x[i]


class _Shape(types.SimpleNamespace):
    """Sizes of one run: threads per block, the arrays' length, the two
    sizes of the new-size cases and the sixteen of the ``16 sizes`` case."""


def _shape(config: Config) -> _Shape:
    if config.simulated:
        # A simulated launch costs a Python thread per GPU thread.
        return _Shape(threads=4, length=16, pair=(6, 11),
                      sixteen=tuple(k + 1 for k in range(SIZE_COUNT)))
    return _Shape(threads=256, length=4096, pair=(1000, 3000),
                  sixteen=tuple(256 * k + 200 for k in range(SIZE_COUNT)))


def make_step(nodes: int, stream: Any, threads: int) -> Callable[[Any, Any], None]:
    """``step(x, y)``: ``nodes`` launches of ``y += x`` on ``stream``, the
    grid sized to ``y``."""

    def step(x: Any, y: Any) -> None:
        launch = _accumulate[(y.size + threads - 1) // threads, threads, stream]
        for _ in range(nodes):
            launch(x, y)

    return step


def _graphed(step: Callable[..., Any], stream: Any, **options: Any) -> Any:
    """``ng.graphed(step, stream=stream, **options)``; a numbagraph whose
    ``ng.graphed`` takes no ``sizes`` is a peer missing, not a failure."""
    try:
        return ng.graphed(step, stream=stream, **options)
    except TypeError as exc:
        if "sizes" in options and "sizes" in str(exc):
            raise PeerMissing(f"this numbagraph's ng.graphed takes no sizes= ({exc})") from None
        raise


class _Arrays:
    """``x`` and ``y`` of ``length`` float32 on ``stream``, and their views
    of each size, kept: ``x`` holds a pattern exact in float32."""

    def __init__(self, stream: Any, length: int):
        self.stream = stream
        self.length = length
        self.host_x = (np.arange(length) % 61).astype(np.float32) * np.float32(0.25) + 1
        self.x = cuda.to_device(self.host_x, stream=stream)
        self.y = cuda.device_array(length, np.float32, stream=stream)
        self._views: dict[int, tuple] = {}
        stream.synchronize()

    def views(self, n: int) -> tuple:
        """``(x[:n], y[:n])``, the same objects at every call."""
        found = self._views.get(n)
        if found is None:
            found = self._views[n] = (self.x[:n], self.y[:n])
        return found

    def check(self, what: str, nodes: int, call: Callable[[tuple], Any],
              sizes: Sequence[int], sync: Callable[[], Any]) -> None:
        """Make ``call(views(n))`` for each ``n`` in ``sizes`` and raise
        unless each added ``nodes`` times ``x[:n]`` to a zeroed ``y[:n]``
        and left ``y[n:]`` as it was."""
        for k, n in enumerate(sizes):
            start = np.full(self.length, np.nan, np.float32)
            start[:n] = 0
            self.y.copy_to_device(start, stream=self.stream)
            self.stream.synchronize()
            call(self.views(n))
            sync()
            got = self.y.copy_to_host(stream=self.stream)
            self.stream.synchronize()
            want = start.copy()
            want[:n] = np.float32(nodes) * self.host_x[:n]
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            if not same.all():
                bad = int(np.argmax(~same))
                raise AssertionError(
                    f"{what}: call {k + 1}, of size {n}, left {got[bad]} at element {bad}, "
                    f"expected {want[bad]}: the step ran at another size or on other "
                    "arrays than it was given")


def _setting(ctx: Context) -> types.SimpleNamespace:
    """The stream, the sizes and the arrays the cases share."""

    def make():
        shape = _shape(ctx.config)
        stream = numba_tiny(ctx).stream
        return types.SimpleNamespace(stream=stream, shape=shape,
                                     arrays=_Arrays(stream, shape.length))

    return ctx.shared("sizes", make)


def _even(n: int) -> int:
    return n + n % 2


def _launches(config: Config, nodes: int) -> int:
    """Calls per trial of the plain launch: an even count, so that both
    sizes take turns equally."""
    return _even(clamp_repeats(config.target_units // 10, nodes, config.min_repeats,
                               config.max_repeats))


def _calls(config: Config, nodes: int) -> int:
    """Calls per trial of the peers that re-size or capture: as many as
    hold the capture suite's launches per trial."""
    return _even(max(2, config.capture_launches // nodes))


class _Counted:
    """``fn`` counting its calls."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.fn(*args)


def _quiet(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` with GraphedWarning ignored: evictions the case makes on
    purpose, and fallbacks its ``cache_info()`` check reports."""

    def quiet(*args: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ng.GraphedWarning)
            return call(*args)

    return quiet


def _sequence(sizes: Sequence[int], count: int) -> list[int]:
    return [sizes[i % len(sizes)] for i in range(count)]


def _expect(what: str, info: Any, **wanted: int) -> None:
    """Raise unless ``info`` (a GraphedCacheInfo) has the ``wanted`` counts."""
    wrong = {k: getattr(info, k, None) for k, v in wanted.items() if getattr(info, k, None) != v}
    if wrong:
        raise AssertionError(
            f"{what}: cache_info() {info}: expected "
            + ", ".join(f"{k}={v}" for k, v in wanted.items())
            + "; got " + ", ".join(f"{k}={v}" for k, v in wrong.items()))


# ----------------------------------------------------------------- a new size

def _update(ctx: Context, nodes: int) -> Contender:
    setting = _setting(ctx)
    s, arrays, shape = setting.stream, setting.arrays, setting.shape
    f = _graphed(make_step(nodes, s, shape.threads), s, sizes="update")
    call = _Counted(_quiet(f))
    what = case(nodes)
    # The first call of each size runs as written, the next captures, every
    # later one re-sizes the graph kept.
    arrays.check(what, nodes, lambda views: call(*views), [*shape.pair, *shape.pair],
                 s.synchronize)
    calls = [arrays.views(n) for n in _sequence(shape.pair, _calls(ctx.config, nodes))]

    def batch():
        for views in calls:
            call(*views)

    def close():
        info = f.cache_info()
        f.clear()
        _expect(what, info, captures=1, graphs=1, evictions=0,
                resizes=call.calls - info.eager - 1)

    return Contender(batch, len(calls), s.synchronize, close=close,
                     note='f(x[:n], y[:n]), n alternating, f = ng.graphed(step, stream=s, '
                          'sizes="update"): a re-size of the graph kept + launch')


def _recapture(ctx: Context, nodes: int) -> Contender:
    setting = _setting(ctx)
    s, arrays, shape = setting.stream, setting.arrays, setting.shape
    step = make_step(nodes, s, shape.threads)
    held: list = []

    def call(views: tuple) -> None:
        with ng.capture(s) as cap:
            step(*views)
        cap.graph.launch()
        if held:
            held.pop().close()
        held.append(cap.graph)

    def close():
        while held:
            held.pop().close()

    step(*arrays.views(shape.pair[0]))   # compiled outside the captures
    try:
        arrays.check(case(nodes), nodes, call, list(shape.pair), s.synchronize)
    except BaseException:
        close()
        raise
    calls = [arrays.views(n) for n in _sequence(shape.pair, _calls(ctx.config, nodes))]

    def batch():
        for views in calls:
            call(views)

    return Contender(batch, len(calls), s.synchronize, close=close,
                     note="ng.capture of the step at the call's size (instantiated as the "
                          "capture ends) + launch; the graph of the call before closed")


def _per_size(ctx: Context, nodes: int) -> Contender:
    setting = _setting(ctx)
    s, arrays, shape = setting.stream, setting.arrays, setting.shape
    step = make_step(nodes, s, shape.threads)
    step(*arrays.views(shape.pair[0]))   # compiled outside the captures
    f = ng.graphed(step, stream=s, warmup=0, max_graphs=1)
    call = _Counted(_quiet(f))
    what = case(nodes)
    arrays.check(what, nodes, lambda views: call(*views), list(shape.pair), s.synchronize)
    calls = [arrays.views(n) for n in _sequence(shape.pair, _calls(ctx.config, nodes))]

    def batch():
        for views in calls:
            call(*views)

    def close():
        info = f.cache_info()
        f.clear()
        _expect(what, info, captures=call.calls, eager=0, graphs=1)

    return Contender(batch, len(calls), s.synchronize, close=close,
                     note="f(x[:n], y[:n]), n alternating, f = ng.graphed(step, stream=s, "
                          "warmup=0, max_graphs=1): a capture + instantiate per call, the "
                          "graph of the last evicted")


def _plain(ctx: Context, nodes: int) -> Contender:
    setting = _setting(ctx)
    s, arrays, shape = setting.stream, setting.arrays, setting.shape
    step = make_step(nodes, s, shape.threads)
    views = arrays.views(shape.pair[-1])
    step(*views)   # compiled outside the capture
    with ng.capture(s) as cap:
        step(*views)
    graph = cap.graph
    try:
        graph.upload()
        arrays.check(case(nodes), nodes, lambda _: graph.launch(), [shape.pair[-1]],
                     s.synchronize)
    except BaseException:
        graph.close()
        raise
    reps = _launches(ctx.config, nodes)

    def batch():
        for _ in range(reps):
            graph.launch()

    return Contender(batch, reps, s.synchronize, close=graph.close,
                     note="graph.launch() of the step captured once at the larger size")


NEW_SIZE_PEERS = {UPDATE: _update, RECAPTURE: _recapture, PER_SIZE: _per_size, PLAIN: _plain}


# ----------------------------------------------------------------- 16 sizes

def _sixteen(ctx: Context, nodes: int, update: bool, infos: dict) -> Contender:
    setting = _setting(ctx)
    s, arrays, shape = setting.stream, setting.arrays, setting.shape
    step = make_step(nodes, s, shape.threads)
    if update:
        f = _graphed(step, s, sizes="update")
    else:
        f = ng.graphed(step, stream=s, max_graphs=SIZE_COUNT)
    call = _quiet(f)
    peer = UPDATE if update else PER_SIZE
    # The first call of each size runs as written; the next captures it, or
    # (sizes="update") re-sizes the graph of the first size captured.
    arrays.check(SIXTEEN, nodes, lambda views: call(*views), [*shape.sixteen, *shape.sixteen],
                 s.synchronize)
    rounds = max(1, _calls(ctx.config, nodes) // SIZE_COUNT)
    calls = [arrays.views(n) for n in _sequence(shape.sixteen, rounds * SIZE_COUNT)]

    def batch():
        for views in calls:
            call(*views)

    def close():
        info = f.cache_info()
        f.clear()
        infos[peer] = info
        # The update mode's graphs and captures are rows its targets judge.
        if not update:
            _expect(SIXTEEN, info, captures=SIZE_COUNT, graphs=SIZE_COUNT, evictions=0)

    note = ('f(x[:n], y[:n]), n through 16 sizes in turn, f = ng.graphed(step, stream=s, '
            'sizes="update"): one graph re-sized at each call' if update else
            "f(x[:n], y[:n]), n through 16 sizes in turn, f = ng.graphed(step, stream=s, "
            "max_graphs=16): a graph per size, each call a replay of its own")
    return Contender(batch, len(calls), s.synchronize, close=close, note=note)


def _count_rows(infos: Mapping[str, Any]) -> Iterator[Row]:
    for peer, info in infos.items():
        for what, value in ((GRAPHS, info.graphs), (CAPTURES, info.captures)):
            yield Row.of(what, peer, [float(value)], COUNT_UNIT, "cache_info",
                         note=f"cache_info() after the trials: {info}")


# ----------------------------------------------------------------- particles

def particle_rows(costs: Mapping[str, Sequence[float]], *, clock: str = "wall",
                  notes: Mapping[str, str] | None = None) -> list[Row]:
    """The rows of the particles case from each mode's time per step (us,
    one value per trial), by mode name (:data:`PER_COUNT`, :data:`MAX_GRID`,
    :data:`UPDATE_MODE`, :data:`DEVICE_GRIDS`, or any other): a row per mode,
    and a :data:`BEST` row, the mode other than the max grid whose median
    is least, when the max grid and another mode were timed."""
    rows = [Row.of(PARTICLES, mode, list(trials), STEP_UNIT, clock,
                   note=(notes or {}).get(mode, ""))
            for mode, trials in costs.items() if trials]
    others = [row for row in rows if row.peer != MAX_GRID]
    if others and any(row.peer == MAX_GRID for row in rows):
        best = min(others, key=lambda row: row.value)
        rows.append(Row(PARTICLES, BEST, best.value, STEP_UNIT, list(best.trials), clock,
                        note=f"{best.peer}, the fastest mode other than {MAX_GRID}"))
    return rows


EXAMPLE = "examples/particles.py"
# The example's modes by the letter it prints them under.
EXAMPLE_MODES = {"a": PER_COUNT, "b": MAX_GRID, "c": UPDATE_MODE, "d": DEVICE_GRIDS}
_MODE_LINE = re.compile(r"^\s*\((?P<letter>[a-z])\)[^:]*:\s*(?P<value>\d+(?:\.\d+)?)\s*"
                        r"us/step\s*(?P<rest>.*)$")


def parse_modes(text: str) -> dict[str, tuple[float, str]]:
    """``{mode: (us per step, the rest of its line)}`` from what
    ``examples/particles.py`` prints, a mode named as in
    :data:`EXAMPLE_MODES`."""
    found = {}
    for line in text.splitlines():
        m = _MODE_LINE.match(line)
        if m and m["letter"] in EXAMPLE_MODES:
            found[EXAMPLE_MODES[m["letter"]]] = (float(m["value"]), m["rest"].strip())
    return found


def _example_main(ctx: Context) -> Callable[[list[str]], Any]:
    """``main`` of ``examples/particles.py``, loaded once."""

    def load():
        path = examples_dir() / "particles.py"
        if not path.is_file():
            raise PeerMissing(f"{EXAMPLE} not found (it runs from a source checkout)")
        spec = importlib.util.spec_from_file_location("_numbagraph_bench_particles", path)
        if spec is None or spec.loader is None:
            raise PeerMissing(f"{EXAMPLE} cannot be loaded")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not callable(getattr(module, "main", None)):
            raise PeerMissing(f"{EXAMPLE} defines no main(argv)")
        return module.main

    return ctx.shared("sizes_particles", load)


def _run_example(main: Callable[[list[str]], Any]) -> str:
    """What one run of the example at 10% active prints; a run whose modes
    differ from NumPy (it exits) raises."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main(["--active", str(ACTIVE)])
    except SystemExit as exc:
        raise RuntimeError(f"{EXAMPLE} exited: {exc}\n{out.getvalue()[-1500:]}") from None
    return out.getvalue()


def _particle_rows(ctx: Context, result: SuiteResult) -> list[Row]:
    main = _example_main(ctx)
    trials = ctx.config.trials
    costs: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    text = ""
    for trial in range(-1, trials):   # trial -1: untimed (kernels compile)
        text = _run_example(main)
        found = parse_modes(text)
        if set(found) != set(EXAMPLE_MODES.values()):
            raise RuntimeError(f"{EXAMPLE} printed the time per step of "
                               f"{sorted(found) or 'no mode'}, not of "
                               f"{sorted(EXAMPLE_MODES.values())}:\n{text[-1500:]}")
        for mode, (value, rest) in found.items():
            if not rest.startswith("matches NumPy"):
                raise AssertionError(f"{EXAMPLE}, {mode}: {rest}")
            if trial >= 0:
                costs.setdefault(mode, []).append(value)
                notes[mode] = f"{EXAMPLE}: {rest}"
    setting = [line.strip() for line in text.splitlines()[1:3]]
    result.notes.append(
        f"particles: {EXAMPLE} --active {ACTIVE} run {trials} times after an untimed run, "
        "each run timing its four modes in turn on the host clock over all its steps; "
        + "; ".join(setting))
    return particle_rows(costs, notes=notes)


def run(ctx: Context) -> SuiteResult:
    """Measure a new size's call, 16 sizes held by one graph, and the
    particle step's modes."""
    result = SuiteResult(NAME, TITLE, UNIT)
    cfg = ctx.config
    setting = _setting(ctx)
    shape = setting.shape
    steps = SIMULATED_STEPS if cfg.simulated else STEPS
    for nodes in steps:
        ctx.compare(result, case(nodes),
                    {peer: (lambda setup=setup, n=nodes: setup(ctx, n))
                     for peer, setup in NEW_SIZE_PEERS.items()}, unit=UNIT)
    infos: dict[str, Any] = {}
    ctx.compare(result, SIXTEEN,
                {UPDATE: lambda: _sixteen(ctx, steps[0], True, infos),
                 PER_SIZE: lambda: _sixteen(ctx, steps[0], False, infos)}, unit=UNIT)
    ctx.attempt(result, UPDATE, lambda: _count_rows(infos))
    ctx.attempt(result, EXAMPLE, lambda: _particle_rows(ctx, result))
    result.notes.append(
        f"steps of {' and '.join(map(str, steps))} launches of y += x over views of "
        f"{shape.length} float32, grids of {shape.threads}-thread blocks sized to the view; "
        f"new size: n alternating between {shape.pair[0]} and {shape.pair[1]}; "
        f"{SIXTEEN}: n from {shape.sixteen[0]} to {shape.sixteen[-1]} in turn, the "
        f"{steps[0]}-launch step; host clock over R calls ({_launches(cfg, steps[-1])} "
        f"plain launches, {_calls(cfg, steps[-1])} calls of the other peers at "
        f"{steps[-1]} launches), stopped after the stream synchronises; median of "
        f"{cfg.trials} trials after one untimed batch, the peers taking turns; every "
        "peer's output checked first")
    result.notes.append(
        f"{SIXTEEN}: the step allocates no temporary; with sizes=\"update\" a capture that "
        "records graph memory is captured again at each new size (memory nodes take no "
        "new sizes), so graph memory is not reported")
    return result
