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
"""

from __future__ import annotations

import numbagraph as ng

from .core import Context, SuiteResult
from .floor import floor
from .peers import numba_tiny, raw_driver
from .timing import Contender

__all__ = ["NAME", "TITLE", "run"]

NAME = "capture"
TITLE = "Capture + instantiate cost, per launch captured"
UNIT = "us/launch"


def _case(launches: int) -> str:
    return f"{launches} launches"


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


def run(ctx: Context) -> SuiteResult:
    """Measure capture + instantiate for numbagraph and its peers."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for launches in ctx.config.capture_sizes:
        setups = {peer: (lambda setup=setup, n=launches: setup(ctx, n))
                  for peer, setup in PEERS.items()}
        ctx.compare(result, _case(launches), setups, unit=UNIT, param=launches,
                    trials=ctx.config.capture_trials)
    ctx.attempt(result, "C++", lambda: _cpp(ctx))
    result.notes.append(
        "host clock from the start of the capture to the instantiated graph; "
        f"each trial makes captures until they hold {ctx.config.capture_launches} "
        "launches (or one capture of more); "
        f"median of {ctx.config.capture_trials} trials after one untimed trial, "
        "the peers taking turns"
    )
    return result
