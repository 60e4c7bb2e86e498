"""Suite ``capture``: the cost of capturing N tiny-kernel launches and
instantiating the graph, per launch captured.

Host clock from the start of the capture until the instantiated graph is in
hand; freeing it is not timed. A trial makes captures back to back until
they hold ``capture_launches`` launches (100 captures of 10 launches, 10 of
100, one of 1000), so that a trial of small captures is not a few hundred
microseconds, where one stray interruption moves the median; the graphs a
trial made are freed before the next trial's clock starts. Median of the
trials after one untimed trial, the peers taking turns trial by trial.
Peers: numbagraph (``with ng.capture(s)``, the scalar argument a
DeviceScalar, and a plain device array), cuda.core directly
(``GraphBuilder.begin_building`` ... ``end_building`` + ``complete``), the
same numba launches run eagerly without any capture (what the launches alone
cost), and the C++ floor.

The phases apart, per node (us/node): the capture alone (begin, the
launches, end), the instantiation alone, and the update alone
(``cuGraphExecUpdate`` of each executable from a graph of the same launches
on another array: what a new signature of the same topology needs instead
of an instantiation). A trial makes as many graphs as hold
``capture_launches`` launches and times each phase over all of them; the
update's source graphs are captured, and everything freed, untimed. Peers:
the C++ floor, the same numba launches captured by the driver's calls
through cuda.bindings (``cuStreamBeginCapture``/``cuStreamEndCapture``,
``cuGraphInstantiate``, ``cuGraphExecUpdate``), and numbagraph's
``graph.update(other)`` of two graphs captured with ``ng.capture``
(numbagraph instantiates as its capture ends, so its capture and
instantiation are the case above, together). Median of the trials after
one untimed trial.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable, Iterator

from numba import cuda

import numbagraph as ng

from .core import Context, Row, SuiteResult
from .floor import floor
from .kernels import tiny
from .peers import checked, numba_tiny, raw_driver
from .timing import Contender

__all__ = ["NAME", "TITLE", "run", "PHASES", "CAPTURE_ALONE", "INSTANTIATE_ALONE",
           "UPDATE_ALONE", "PHASE_UNIT", "phase_case"]

NAME = "capture"
TITLE = "Capture + instantiate cost, per launch captured"
UNIT = "us/launch"
PHASE_UNIT = "us/node"
CAPTURE_ALONE, INSTANTIATE_ALONE, UPDATE_ALONE = (
    "capture alone", "instantiate alone", "update alone")
PHASES = (CAPTURE_ALONE, INSTANTIATE_ALONE, UPDATE_ALONE)


def _case(launches: int) -> str:
    return f"{launches} launches"


def phase_case(phase: str, launches: int) -> str:
    """The name of the case of one phase of a graph of ``launches`` launches."""
    return f"{phase}, {launches} launches"


def _captures(ctx: Context, launches: int, once, free) -> Contender:
    """Each batch makes captures of ``launches`` launches with ``once()``
    until they hold ``capture_launches`` launches; ``free`` frees one
    capture's result, untimed, before the next batch and after the trials."""
    captures = max(1, ctx.config.capture_launches // launches)
    made: list = []

    def batch():
        for _ in range(captures):
            made.append(once())

    def free_all():
        while made:
            free(made.pop())

    return Contender(batch, launches * captures, numba_tiny(ctx).sync,
                     close=free_all, lead=free_all)


def _numbagraph(scalar: bool):
    def setup(ctx: Context, launches: int) -> Contender:
        t = numba_tiny(ctx)
        n = t.n if scalar else t.n_array

        def once():
            with ng.capture(t.stream) as cap:
                for _ in range(launches):
                    t.launch(n)
            return cap.graph

        return _captures(ctx, launches, once, lambda graph: graph.close())
    return setup


def _cuda_core(ctx: Context, launches: int) -> Contender:
    raw = raw_driver(ctx)
    t = numba_tiny(ctx)
    core_stream = raw.Stream.from_handle(int(t.stream.handle))

    def once():
        builder = core_stream.create_graph_builder()
        builder.begin_building("thread_local")
        for _ in range(launches):
            t.launch(t.n_array)
        builder.end_building()
        return builder, builder.complete()

    def free(made):
        made[1].close()
        made[0].close()

    return _captures(ctx, launches, once, free)


def _eager(ctx: Context, launches: int) -> Contender:
    t = numba_tiny(ctx)

    def once():
        for _ in range(launches):
            t.launch(t.n_array)

    return _captures(ctx, launches, once, lambda _: None)


def _cpp(ctx: Context):
    cfg = ctx.config
    for row in floor(ctx).rows(
        "capture", lambda line: _case(int(line["param"])), UNIT, "wall",
        sizes=cfg.capture_sizes, elements=cfg.elements, trials=cfg.capture_trials,
        warmup=1,
    ):
        # The floor reports per capture; per launch makes sizes comparable.
        row.trials = [v / row.param for v in row.trials]
        row.value /= row.param
        yield row


def _numba_path(ctx: Context, launches: int) -> Contender:
    t = numba_tiny(ctx)

    def once():
        with ng.capture(t.stream) as cap:
            for _ in range(launches):
                t.launch_numba(t.n_array)
        return cap.graph

    return _captures(ctx, launches, once, lambda graph: graph.close())


PEERS = {
    "numbagraph": _numbagraph(True),
    "numbagraph (array arg)": _numbagraph(False),
    "numba's own launch path": _numba_path,
    "cuda.core": _cuda_core,
    "numba launches, no capture": _eager,
}


def _timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` took, the garbage collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        if enabled:
            gc.enable()


def _phase_rows(ctx: Context, peer: str, launches: int, trials: dict[str, list],
                note: str) -> list[Row]:
    return [Row.of(phase_case(phase, launches), peer, times, PHASE_UNIT, "wall",
                   param=launches, note=note)
            for phase, times in trials.items()]


def _phases_bindings(ctx: Context) -> Iterator[Row]:
    """Capture, instantiation and update apart, through cuda.bindings, of
    the numba launches the other peers capture."""
    cfg = ctx.config
    cu = raw_driver(ctx).cu
    t = numba_tiny(ctx)
    other = cuda.device_array_like(t.a, stream=t.stream)
    handle = cu.CUstream(int(t.stream.handle))
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL

    def record(target: Any, launches: int) -> Any:
        checked("cuStreamBeginCapture", cu.cuStreamBeginCapture(handle, mode))
        try:
            for _ in range(launches):   # as NumbaTiny.launch makes them
                tiny[t.blocks, t.threads, t.stream](target, t.n_array)
        except BaseException:
            err, graph = cu.cuStreamEndCapture(handle)
            if not err:
                cu.cuGraphDestroy(graph)
            raise
        return checked("cuStreamEndCapture", cu.cuStreamEndCapture(handle))

    for launches in cfg.capture_sizes:
        reps = max(1, cfg.capture_launches // launches)
        nodes = reps * launches
        times: dict[str, list] = {phase: [] for phase in PHASES}
        for trial in range(-1, cfg.capture_trials):   # trial -1: untimed
            graphs: list = []
            execs: list = []
            sources: list = []
            try:
                took = {CAPTURE_ALONE: _timed(lambda: graphs.extend(
                    record(t.a, launches) for _ in range(reps)))}
                took[INSTANTIATE_ALONE] = _timed(lambda: execs.extend(
                    checked("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0))
                    for graph in graphs))
                sources.extend(record(other, launches) for _ in range(reps))

                def update() -> None:
                    for graph_exec, source in zip(execs, sources):
                        checked("cuGraphExecUpdate", cu.cuGraphExecUpdate(graph_exec, source))

                took[UPDATE_ALONE] = _timed(update)
            finally:
                for graph_exec in execs:
                    cu.cuGraphExecDestroy(graph_exec)
                for graph in graphs + sources:
                    cu.cuGraphDestroy(graph)
            if trial >= 0:
                for phase, seconds in took.items():
                    times[phase].append(seconds * 1e6 / nodes)
        yield from _phase_rows(
            ctx, "cuda.bindings", launches, times,
            "cuStreamBeginCapture + numba launches + cuStreamEndCapture; "
            "cuGraphInstantiate(graph, 0); cuGraphExecUpdate from the launches on "
            "another array")


def _update_numbagraph(ctx: Context) -> Iterator[Row]:
    """numbagraph's ``graph.update(other)`` of graphs captured untimed,
    ``other`` launching on another array."""
    cfg = ctx.config
    t = numba_tiny(ctx)
    other = cuda.device_array_like(t.a, stream=t.stream)
    configured = tiny[t.blocks, t.threads, t.stream]

    def capture(target: Any, launches: int) -> Any:
        with ng.capture(t.stream) as cap:
            for _ in range(launches):
                configured(target, t.n_array)
        return cap.graph

    for launches in cfg.capture_sizes:
        reps = max(1, cfg.capture_launches // launches)
        times: dict[str, list] = {UPDATE_ALONE: []}
        for trial in range(-1, cfg.capture_trials):   # trial -1: untimed
            graphs: list = []
            try:
                for _ in range(reps):
                    graphs.append((capture(t.a, launches), capture(other, launches)))

                def update() -> None:
                    for graph, source in graphs:
                        graph.update(source)

                seconds = _timed(update)
            finally:
                for pair in graphs:
                    for graph in pair:
                        graph.close()
            if trial >= 0:
                times[UPDATE_ALONE].append(seconds * 1e6 / (reps * launches))
        yield from _phase_rows(ctx, "numbagraph", launches, times,
                               "graph.update(other), both captured with ng.capture, "
                               "other's launches on another array")


def _phases_cpp(ctx: Context) -> Iterator[Row]:
    cfg = ctx.config
    for row in floor(ctx).rows(
        "phases", lambda line: phase_case(line["label"], int(line["param"])), PHASE_UNIT,
        "wall", sizes=cfg.capture_sizes, elements=cfg.elements, trials=cfg.capture_trials,
        target=cfg.capture_launches,
    ):
        # The floor reports per capture; per node makes sizes comparable.
        row.trials = [v / row.param for v in row.trials]
        row.value /= row.param
        yield row


def run(ctx: Context) -> SuiteResult:
    """Measure capture + instantiate for numbagraph and its peers."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for launches in ctx.config.capture_sizes:
        setups = {peer: (lambda setup=setup, n=launches: setup(ctx, n))
                  for peer, setup in PEERS.items()}
        ctx.compare(result, _case(launches), setups, unit=UNIT, param=launches,
                    trials=ctx.config.capture_trials)
    ctx.attempt(result, "C++", lambda: _cpp(ctx))
    ctx.attempt(result, "C++", lambda: _phases_cpp(ctx))
    ctx.attempt(result, "cuda.bindings", lambda: _phases_bindings(ctx))
    ctx.attempt(result, "numbagraph", lambda: _update_numbagraph(ctx))
    result.notes.append(
        "host clock from the start of the capture to the instantiated graph; "
        f"each trial makes captures until they hold {ctx.config.capture_launches} "
        "launches (or one capture of more); "
        f"median of {ctx.config.capture_trials} trials after one untimed trial, "
        "the peers taking turns"
    )
    result.notes.append(
        f"phases apart ({PHASE_UNIT}): host clock over the graphs of a trial, each "
        "phase timed alone; the update's source graphs captured, and everything freed, "
        f"untimed; median of {ctx.config.capture_trials} trials after one untimed trial"
    )
    return result
