"""Suite ``capture``: the cost of capturing N tiny-kernel launches and
instantiating the graph, per launch captured.

Host clock from the start of the capture until the instantiated graph is in
hand; freeing it is not timed. Median of the trials, after one untimed
capture. Peers: numbagraph (``with ng.capture(s)`` with the scalar argument a
DeviceScalar, and with a plain device array), cuda.core directly
(``GraphBuilder.begin_building`` ... ``end_building`` + ``complete``), the same
numba launches run eagerly without any capture (what the launches alone
cost), and the C++ floor.
"""

from __future__ import annotations

import numbagraph as ng

from .core import Context, Row, SuiteResult
from .floor import floor
from .peers import numba_tiny, raw_driver
from .timing import measure

__all__ = ["NAME", "TITLE", "run"]

NAME = "capture"
TITLE = "Capture + instantiate cost, per launch captured"
UNIT = "us/launch"


def _case(launches: int) -> str:
    return f"{launches} launches"


def _timed(ctx: Context, peer: str, launches: int, once, cleanup, sync) -> Row:
    made: list = []
    timing = measure(lambda: made.append(once()), launches,
                     trials=ctx.config.capture_trials, sync=sync)
    for item in made:
        cleanup(item)
    return Row.of(_case(launches), peer, timing.scaled(1e6), UNIT, timing.clock,
                  param=launches)


def _numbagraph(scalar: bool):
    def rows(ctx: Context):
        t = numba_tiny(ctx)
        n = t.n if scalar else t.n_array
        peer = "numbagraph" if scalar else "numbagraph (array arg)"

        def once():
            with ng.capture(t.stream) as cap:
                for _ in range(launches):
                    t.launch(n)
            return cap.graph

        for launches in ctx.config.capture_sizes:
            yield _timed(ctx, peer, launches, once, lambda g: g.close(), t.sync)
    return rows


def _cuda_core(ctx: Context):
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

    def cleanup(made):
        made[1].close()
        made[0].close()

    for launches in ctx.config.capture_sizes:
        yield _timed(ctx, "cuda.core", launches, once, cleanup, t.sync)


def _eager(ctx: Context):
    t = numba_tiny(ctx)

    def once():
        for _ in range(launches):
            t.launch(t.n_array)

    for launches in ctx.config.capture_sizes:
        yield _timed(ctx, "numba launches, no capture", launches, once, lambda _: None, t.sync)


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


def run(ctx: Context) -> SuiteResult:
    """Measure capture + instantiate for numbagraph and its peers."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for peer, rows in (
        ("numbagraph", _numbagraph(True)), ("numbagraph (array arg)", _numbagraph(False)),
        ("cuda.core", _cuda_core), ("numba launches, no capture", _eager), ("C++", _cpp),
    ):
        ctx.attempt(result, peer, lambda rows=rows: rows(ctx))
    result.notes.append(
        "host clock from the start of the capture to the instantiated graph; "
        f"median of {ctx.config.capture_trials} trials after one untimed capture"
    )
    return result
