"""Suite ``graphed``: one call of an ``ng.graphed`` step, when the arrays
stay the same, when one of them changes and when all of them do, against
launching the captured graph, capturing the step again, and PyTorch's
static-input copy.

A step is a plain function of N launches (N = 10 and 100) of one numba
kernel, ``z = x + 0.5 y``, on the stream: it reads ``x`` and ``y`` and
writes ``z``. Its kernels cover the first 1024 elements of the arrays
whatever their length, so that a step costs the same at every array size
and a larger input changes only what it costs to bring the input in.
Each call passes one of two sets of arrays:

* same arrays: ``(x, y, z)`` every call;
* one changed: ``x`` alternates between two buffers, ``y`` and ``z`` stay;
* all changed: ping-pong between ``(x, y, z)`` and ``(x', y', z')``.

Peers in each case: numbagraph (``f(x, y, z)``, ``f = ng.graphed(step,
stream=s)``, which rebinds the arrays that differ from the last call's and
launches), ``graph.launch()`` of the same step captured once (the floor: it
never changes its arrays), the step captured again and instantiated each
call (the graph of the call before closed), and captured again each call
to ``graph.update(new)`` one graph. At inputs of 4 KiB, 1 MiB and 64 MiB
the N = 10 step runs with ``x`` changing each call: numbagraph rebinding
it, and PyTorch copying it into the static input of a
``torch.cuda.CUDAGraph`` of the same numba kernels (``static.copy_(x)``
+ ``replay()``).

Host clock over R calls, stopped after the stream synchronises; median of
the trials after one untimed batch, the peers taking turns trial by trial.
Before it is timed, every peer's calls are checked (the graphed function's
warm-up run and capture fall there): the output of each call poisoned, the
call made, and the output compared with ``x + 0.5 y`` of that call's
arrays. After the trials the graphed function's ``cache_info()`` must show
one capture, no eviction, and rebinds exactly when the case changes arrays.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import numpy as np
from numba import cuda

import numbagraph as ng

from .core import Config, Context, SuiteResult, clamp_repeats
from .peers import numba_tiny, torch_cuda
from .timing import Contender

__all__ = [
    "NAME", "TITLE", "run", "case", "size_case", "size_label", "STEPS", "SIZES",
    "SAME", "ONE", "ALL", "PEER", "PLAIN", "RECAPTURE", "RECAPTURE_UPDATE", "TORCH",
]

NAME = "graphed"
TITLE = "Graphed step: one call, arrays the same or changed"
UNIT = "us/call"

STEPS = (10, 100)              # launches per step on a GPU
SIMULATED_STEPS = (2, 4)       # on the simulator, where a launch costs milliseconds
SIZES = (4 << 10, 1 << 20, 64 << 20)   # bytes of the input in the size cases
SAME, ONE, ALL = "same arrays", "one changed", "all changed"
PEER = "numbagraph"
PLAIN = "plain launch"
RECAPTURE = "recapture + instantiate"
RECAPTURE_UPDATE = "recapture + update"
TORCH = "PyTorch"


def case(nodes: int, change: str) -> str:
    """The name of the case of an ``nodes``-launch step called with ``change``."""
    return f"{nodes} nodes, {change}"


def size_label(nbytes: int) -> str:
    """``nbytes`` as ``4 KiB``, ``1 MiB``, ``64 MiB``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def size_case(nbytes: int) -> str:
    """The name of the case of an input of ``nbytes`` bytes."""
    return f"input {size_label(nbytes)}"


@cuda.jit
def _node(x, y, z):
    i = cuda.grid(1)
    if i < z.size:
        z[i] = x[i] + 0.5 * y[i]


def _grid(config: Config) -> tuple[int, int]:
    # A simulated launch costs a Python thread per GPU thread.
    return (1, 4) if config.simulated else config.grid


def make_step(nodes: int, stream: Any, grid: tuple[int, int]) -> Callable[..., None]:
    """``step(x, y, z)``: ``nodes`` launches of ``z = x + 0.5 y`` on ``stream``."""
    blocks, threads = grid

    def step(x: Any, y: Any, z: Any) -> None:
        launch = _node[blocks, threads, stream]
        for _ in range(nodes):
            launch(x, y, z)

    return step


class _Arrays:
    """Two sets of three float32 device arrays of ``length`` elements on
    ``stream``; the first ``covered`` elements of each hold a pattern of its
    own, so that a call that used the wrong array gives the wrong output."""

    def __init__(self, stream: Any, length: int, covered: int):
        self.stream = stream
        self.covered = covered
        self.sets = tuple(
            tuple(cuda.device_array(length, np.float32, stream=stream) for _ in range(3))
            for _ in range(2)
        )
        base = (np.arange(covered) % 61).astype(np.float32) * np.float32(0.25)
        self._host = {}
        for j, arrays in enumerate(self.sets):
            for r, array in enumerate(arrays):
                values = base + np.float32(100 * j + 10 * r)
                array[:covered].copy_to_device(values, stream=stream)
                self._host[id(array)] = values
        self._nan = np.full(covered, np.nan, np.float32)
        stream.synchronize()

    def triples(self, change: str) -> tuple[tuple, tuple]:
        """The arrays of even and of odd calls."""
        (x, y, z), (x2, y2, z2) = self.sets
        second = {SAME: (x, y, z), ONE: (x2, y, z), ALL: (x2, y2, z2)}[change]
        return (x, y, z), second

    def check(self, what: str, call: Callable[[tuple], Any], sequence: Sequence[tuple],
              sync: Callable[[], Any]) -> None:
        """Make ``call(args)`` for each ``args`` in ``sequence`` and raise
        unless each wrote ``x + 0.5 y`` of its own arrays into its ``z``;
        ``what`` names the case in the error."""
        k = self.covered
        for n, (x, y, z) in enumerate(sequence):
            z[:k].copy_to_device(self._nan, stream=self.stream)
            self.stream.synchronize()
            call((x, y, z))
            sync()
            got = z[:k].copy_to_host(stream=self.stream)
            self.stream.synchronize()
            want = self._host[id(x)] + np.float32(0.5) * self._host[id(y)]
            if not np.array_equal(got, want):
                bad = int(np.argmax(got != want))
                raise AssertionError(
                    f"{what}: call {n + 1} wrote {got[bad]} at element {bad}, expected "
                    f"{want[bad]}: the step ran on other arrays than it was given"
                )


def _calls(config: Config, nodes: int) -> int:
    """Calls per trial of the peers that launch a graph: an even count, so
    that both sets of arrays are used equally."""
    n = clamp_repeats(config.target_units // 10, nodes, config.min_repeats, config.max_repeats)
    return n + n % 2


def _recaptures(config: Config, nodes: int) -> int:
    """Calls per trial of the peers that capture each call: as many as hold
    the capture suite's launches per trial."""
    n = max(2, config.capture_launches // nodes)
    return n + n % 2


def _alternating(pair: tuple[tuple, tuple], count: int) -> list:
    return [pair[i % 2] for i in range(count)]


def _setting(ctx: Context) -> types.SimpleNamespace:
    """The stream, the grid, and the arrays of the step cases."""

    def make():
        cfg = ctx.config
        stream = numba_tiny(ctx).stream
        grid = _grid(cfg)
        covered = grid[0] * grid[1]
        return types.SimpleNamespace(stream=stream, grid=grid, covered=covered,
                                     arrays=_Arrays(stream, max(cfg.elements, covered),
                                                    covered))

    return ctx.shared("graphed", make)


def _graphed(ctx: Context, arrays: _Arrays, nodes: int, change: str,
             what: str | None = None) -> Contender:
    what = what or case(nodes, change)
    setting = _setting(ctx)
    s = setting.stream
    f = ng.graphed(make_step(nodes, s, setting.grid), stream=s)
    pair = arrays.triples(change)
    arrays.check(what, lambda args: f(*args), [*pair, *pair], s.synchronize)
    calls = _alternating(pair, _calls(ctx.config, nodes))

    def batch():
        for args in calls:
            f(*args)

    def close():
        info = f.cache_info()
        f.clear()
        changes = change != SAME
        if info.captures != 1 or info.evictions or (info.rebinds > 0) != changes:
            raise AssertionError(
                f"{what}: cache_info() {info}: expected one capture, "
                f"no eviction and {'rebinds' if changes else 'no rebind'}"
            )

    return Contender(batch, len(calls), s.synchronize, close=close,
                     note="f(x, y, z), f = ng.graphed(step, stream=s)")


def _plain(ctx: Context, arrays: _Arrays, nodes: int, change: str) -> Contender:
    setting = _setting(ctx)
    s = setting.stream
    step = make_step(nodes, s, setting.grid)
    first = arrays.triples(change)[0]
    with ng.capture(s) as cap:
        step(*first)
    graph = cap.graph
    graph.upload()
    arrays.check(case(nodes, change), lambda args: graph.launch(), [first], s.synchronize)
    reps = _calls(ctx.config, nodes)

    def batch():
        for _ in range(reps):
            graph.launch()

    return Contender(batch, reps, s.synchronize, close=graph.close,
                     note="graph.launch() of the step captured once, arrays never changed")


def _recapture(update: bool):
    def setup(ctx: Context, arrays: _Arrays, nodes: int, change: str) -> Contender:
        setting = _setting(ctx)
        s = setting.stream
        step = make_step(nodes, s, setting.grid)

        def capture(args: tuple) -> Any:
            with ng.capture(s) as cap:
                step(*args)
            return cap.graph

        pair = arrays.triples(change)
        held = [capture(pair[0])]

        if update:
            def call(args: tuple) -> None:
                new = capture(args)
                held[0].update(new)
                new.close()
                held[0].launch()
        else:
            def call(args: tuple) -> None:
                new = capture(args)
                new.launch()
                held[0].close()
                held[0] = new

        arrays.check(case(nodes, change), call, [*pair, *pair], s.synchronize)
        calls = _alternating(pair, _recaptures(ctx.config, nodes))

        def batch():
            for args in calls:
                call(args)

        note = ("ng.capture of the step (which instantiates it) + graph.update(new) "
                "+ launch" if update else
                "ng.capture of the step + launch; the graph of the call before closed")
        return Contender(batch, len(calls), s.synchronize,
                         close=lambda: held[0].close(), note=note)
    return setup


STEP_PEERS = {
    PEER: _graphed,
    PLAIN: _plain,
    RECAPTURE: _recapture(False),
    RECAPTURE_UPDATE: _recapture(True),
}


def _torch(ctx: Context, arrays: _Arrays, nodes: int, what: str) -> Contender:
    """PyTorch's way to give a graph a new input: copy it into the tensor
    the graph was captured with, then replay."""
    torch = torch_cuda(ctx)
    setting = _setting(ctx)
    arrays.stream.synchronize()
    ts = torch.cuda.Stream()
    on_ts = cuda.external_stream(ts.cuda_stream)
    pair = arrays.triples(ONE)
    (x, y, z), (x2, _, _) = pair
    inputs = {id(a): torch.as_tensor(a, device="cuda") for a in (x, x2)}
    static = torch.empty_like(inputs[id(x)])
    static_view = cuda.as_cuda_array(static)
    step = make_step(nodes, on_ts, setting.grid)
    with torch.cuda.stream(ts):
        static.copy_(inputs[id(x)])
    step(static_view, y, z)   # compiled and loaded before the capture
    ts.synchronize()
    graph = torch.cuda.CUDAGraph()
    with cuda.current_context().defer_cleanup():   # no numba free inside the capture
        with torch.cuda.graph(graph, stream=ts, capture_error_mode="thread_local"):
            step(static_view, y, z)
    replay, copy, on_stream = graph.replay, static.copy_, torch.cuda.stream

    def call(args: tuple) -> None:
        with on_stream(ts):
            copy(inputs[id(args[0])])
            replay()

    arrays.check(what, call, [*pair, *pair], ts.synchronize)
    sources = [inputs[id(args[0])] for args in _alternating(pair, _calls(ctx.config, nodes))]

    def batch():
        with on_stream(ts):
            for source in sources:
                copy(source)
                replay()

    return Contender(batch, len(sources), ts.synchronize, close=graph.reset,
                     note="static.copy_(x) + CUDAGraph.replay() of the same numba kernels")


def _sized(ctx: Context, arrays: _Arrays, nodes: int, what: str) -> Contender:
    contender = _graphed(ctx, arrays, nodes, ONE, what)
    contender.note = "f(x, y, z) with x changed each call: a rebind + launch"
    return contender


SIZE_PEERS = {PEER: _sized, TORCH: _torch}


def run(ctx: Context) -> SuiteResult:
    """Measure a graphed step's call in each case, with its peers."""
    result = SuiteResult(NAME, TITLE, UNIT)
    cfg = ctx.config
    setting = _setting(ctx)
    steps = SIMULATED_STEPS if cfg.simulated else STEPS
    for nodes in steps:
        for change in (SAME, ONE, ALL):
            setups = {peer: (lambda setup=setup, n=nodes, c=change:
                             setup(ctx, setting.arrays, n, c))
                      for peer, setup in STEP_PEERS.items()}
            ctx.compare(result, case(nodes, change), setups, unit=UNIT)
    for nbytes in SIZES:
        arrays = _Arrays(setting.stream, nbytes // 4, setting.covered)
        setups = {peer: (lambda setup=setup, a=arrays, n=nbytes:
                         setup(ctx, a, steps[0], size_case(n)))
                  for peer, setup in SIZE_PEERS.items()}
        ctx.compare(result, size_case(nbytes), setups, unit=UNIT)
        del arrays, setups
    result.notes.append(
        f"steps of {' and '.join(map(str, steps))} launches of z = x + 0.5 y over the "
        f"first {setting.covered} elements; size cases: the {steps[0]}-launch step, "
        "x changed each call; host clock over R calls "
        f"({_calls(cfg, steps[0])} and {_calls(cfg, steps[-1])} graph launches, "
        f"{_recaptures(cfg, steps[0])} and {_recaptures(cfg, steps[-1])} recaptures), "
        f"stopped after the stream synchronises; median of {cfg.trials} trials after "
        "one untimed batch, the peers taking turns; every peer's output checked first"
    )
    return result
