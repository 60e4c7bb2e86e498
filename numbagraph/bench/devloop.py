"""Suite ``devloop``: what a loop run by the GPU costs per iteration and per
pass.

Host clock over one launch of a loop of many passes, stopped after the
stream synchronises; median of the trials. The body is the tiny kernel
(``a[i] += n[0]``, ``n`` the loop's counter).

* ``while, N kernels``: one iteration of ``ng.repeat`` (the ``with`` form,
  one pass per iteration) whose pass launches the tiny kernel N times, and
  the same pass inside an ``ng.if_then`` that a kernel of the pass opens:
  the while node's and the if node's cost per iteration, beside N kernels.
* ``pass, unroll k``: one pass of a 1-kernel ``ng.repeat`` recording k passes
  per iteration; ``counted`` (no kernel can stop it), ``stoppable, guards``
  (the kernel is given the loop's condition, so passes after the first run
  through guards), ``stoppable, if node per pass`` (the other way to skip a
  pass after a stop: each pass inside its own if node, opened by a kernel
  that reads the loop's state).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import numbagraph as ng

from .core import Context, SuiteResult
from .peers import numba_tiny
from .timing import Contender

__all__ = ["NAME", "TITLE", "run", "UNROLLS", "BODIES", "one_launch"]

NAME = "devloop"
TITLE = "Device loops: while and if nodes per iteration, unrolled passes"
UNIT = "us"
UNROLLS = (1, 2, 4, 8, 16, "auto")
BODIES = (1, 2, 4, 8)


@cuda.jit
def _open(cond):
    if cuda.grid(1) == 0:
        ng.set_condition(cond, 1)


@cuda.jit
def _open_from(cond, counter, until):
    """Opens the pass's if node while the counter is below its limit: the
    check a pass skipped by an if node pays."""
    if cuda.grid(1) == 0:
        ng.set_condition(cond, counter[0] < until)


@cuda.jit
def _stop_below_zero(counter, cond):
    if cuda.grid(1) == 0 and counter[0] < 0:
        ng.set_condition(cond, 0)


def _passes(ctx: Context) -> int:
    return max(16, ctx.config.launch_repeats)


def one_launch(ctx: Context, key: str, record, passes: int, note: str) -> Contender:
    """A contender launching the loop ``record(t, pos, until)`` captures
    (returning its RepeatLoop, or None), over ``passes`` passes of the tiny
    kernel per launch (checked once); ``{unroll}`` in ``note`` becomes the
    loop's passes per iteration."""
    def make():
        t = numba_tiny(ctx)
        pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=t.stream)
        t.launch(pos)
        with ng.capture(t.stream) as cap:
            loop = record(t, pos, float(passes))
        graph = cap.graph
        graph.upload()
        ctx.on_close(graph.close)
        pos.update(0.0)
        graph.launch()
        if pos.value != passes:
            raise RuntimeError(f"{key}: the loop ran {pos.value} passes, not {passes}")
        return t, pos, graph, getattr(loop, "unroll", None)

    t, pos, graph, unroll = ctx.shared(f"devloop_{key}", make)

    def batch():
        pos.update(0.0)
        graph.launch()

    return Contender(batch, passes, t.sync, note=note.format(unroll=unroll))


def _while(ctx: Context, kernels: int, with_if: bool) -> Contender:
    def record(t, pos, until):
        with ng.repeat(pos, until=until, unroll=1):
            if with_if:
                inner = ng.Condition()
                _open[1, 1, t.stream](inner)
                with ng.if_then(inner):
                    for _ in range(kernels):
                        t.launch(pos)
            else:
                for _ in range(kernels):
                    t.launch(pos)
    what = "in an if node" if with_if else "alone"
    return one_launch(ctx, f"while{kernels}{with_if}", record, _passes(ctx),
                 f"one iteration of a while node, {kernels} tiny kernel(s) {what}")


def _unrolled(ctx: Context, unroll, way: str) -> Contender:
    def record(t, pos, until):
        if way == "if node per pass":
            _record_if_per_pass(t, pos, until, unroll)
            return

        @ng.repeat(pos, until=until, unroll=unroll)
        def loop(loop):
            t.launch(pos)
            if way == "stoppable, guards":
                _stop_below_zero[1, 1, t.stream](pos, loop.cond)
    return one_launch(ctx, f"unroll{unroll}{way}", record, _passes(ctx),
                 f"one pass of ng.repeat, unroll={unroll}, {way}")


def _record_if_per_pass(t, pos, until, unroll) -> None:
    """k passes per iteration of a while node, each inside an if node opened
    while the counter is below its limit, the counter advanced after each
    pass."""
    s = t.stream
    more = ng.Condition(default=1)
    with ng.while_loop(more):
        for _ in range(unroll):
            guard = ng.Condition()
            _open_from[1, 1, s](guard, pos, until)
            with ng.if_then(guard):
                t.launch(pos)
                ng.increment(pos)
        _stop_at[1, 1, s](pos, until, more)


@cuda.jit
def _stop_at(counter, until, cond):
    if cuda.grid(1) == 0 and not counter[0] < until:
        ng.set_condition(cond, 0)


def run(ctx: Context) -> SuiteResult:
    """Measure while and if nodes per iteration and unrolled passes."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for kernels in BODIES:
        ctx.compare(result, f"while, {kernels} kernels", {
            "while node": lambda k=kernels: _while(ctx, k, False),
            "while node + if node": lambda k=kernels: _while(ctx, k, True),
        }, unit="us/iteration", param=kernels)
    for unroll in UNROLLS:
        ways = ["counted", "stoppable, guards"]
        if unroll != "auto":
            ways.append("if node per pass")
        ctx.compare(result, f"pass, unroll {unroll}", {
            way: (lambda u=unroll, w=way: _unrolled(ctx, u, w)) for way in ways
        }, unit="us/pass", param=None if unroll == "auto" else unroll)
    result.notes.append(
        f"host clock over one launch of {_passes(ctx)} passes, stopped after the stream "
        f"synchronises; median of {ctx.config.trials} trials after one untimed launch")
    return result
