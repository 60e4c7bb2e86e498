"""The performance targets, as ratios of numbers measured in the same run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .bandwidth import COPY_CASE, OPS
from .core import SuiteResult
from .graphed import (ALL, BINDINGS, FIXED, NEW_SIGNATURE, NODE_KINDS, ONE, PER_NODE, PLAIN,
                      RECAPTURE, RECAPTURE_UPDATE, SAME, SET_CALLS, SIZES, STEPS, TORCH, case,
                      fit_case, set_case, size_case, size_label)
from .graphed import PEER as GRAPHED
from .eager import CASE as EAGER, OP_CASE
from .loop import DEVICE_LOOP, STEP
from . import collectives, ops
from .memory import FOOTPRINT_1, FOOTPRINT_8, OWNED, PREALLOCATED, REPLAY
from . import sizes, streams

__all__ = ["Target", "TARGETS", "evaluate"]


@dataclass(frozen=True)
class Target:
    """``suite/case/peer`` over ``ref_case/ref_peer`` must stay at or under
    ``limit`` (``at_least=False``) or reach at least ``limit`` (``True``).

    ``slack``, in the rows' unit, is added to ``limit`` times the reference
    (a target of 1 us over a floor): the verdict's ``limit`` is then that
    bound over the reference."""

    name: str
    suite: str
    case: str
    peer: str
    ref_case: str
    ref_peer: str
    limit: float
    at_least: bool = False
    slack: float = 0.0

    def check(self, results: dict[str, SuiteResult]) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.name, "limit": self.limit,
                               "at_least": self.at_least}
        suite = results[self.suite]
        row, ref = suite.find(self.case, self.peer), suite.find(self.ref_case, self.ref_peer)
        for what, peer, found in ((self.case, self.peer, row),
                                  (self.ref_case, self.ref_peer, ref)):
            if found is None:
                reasons = dict(suite.skipped)
                why = suite.unjudged or reasons.get(peer, f"no {peer} result for {what}")
                return {**out, "verdict": "n/a", "why": why}
        if ref.value == 0:
            return {**out, "verdict": "n/a",
                    "why": f"{self.ref_peer} measured 0 {ref.unit} for {self.ref_case}"}
        ratio = row.value / ref.value
        limit = self.limit + self.slack / ref.value
        passed = ratio >= limit if self.at_least else ratio <= limit
        verdict = {**out, "limit": limit, "value": row.value, "ref": ref.value,
                   "unit": row.unit, "ratio": ratio, "verdict": "PASS" if passed else "MISS"}
        if suite.unjudged:
            verdict.update(verdict="n/a", why=suite.unjudged)
        return verdict


def _targets() -> list[Target]:
    found = [
        Target(f"replay per node at {n} nodes <= 1.05x C++", "replay",
               f"{n} nodes", "numbagraph", f"{n} nodes", "C++", 1.05)
        for n in (100, 1000)
    ]
    found += [
        Target("replay-loop step <= 1.3x C++", "loop", STEP, "numbagraph", STEP, "C++", 1.3),
        Target("replay-loop step faster than PyTorch", "loop", STEP, "numbagraph",
               STEP, "PyTorch", 1.0),
        Target("replay-loop step run on the GPU by ng.repeat <= 0.5x C++", "loop", STEP,
               DEVICE_LOOP, STEP, "C++", 0.5),
        Target("decode to the end token in one launch, small step, <= 0.8x the graph "
               "per token checked by the host", "apps", "decode_loop",
               "small one launch per token", "decode_loop",
               "small graph, host-checked per token", 0.8),
        Target("decode to the end token in one launch, GPU-bound step, no slower than "
               "the graph per token", "apps", "decode_loop", "one launch per token",
               "decode_loop", "graph per token", 1.0),
        Target("heat to t_end in one launch <= 0.6x the graph per pass", "apps",
               "heat_to_t_end", "one launch per step", "heat_to_t_end",
               "graph/step per step", 0.6),
        Target("Jacobi to convergence in one launch >= 3x faster per iteration than the "
               "iteration graph", "apps", "jacobi_converge",
               "one graph launch, while loop per iteration", "jacobi_converge",
               "host-checked, iteration graph per iteration", 1 / 3),
    ]
    found += [
        Target("eager tiny launch <= 1.3x C++ eager", "eager", EAGER, "numbagraph",
               EAGER, "C++", 1.3),
        Target("eager tiny launch faster than PyTorch eager", "eager", EAGER, "numbagraph",
               EAGER, "PyTorch", 1.0),
        Target("eager tiny launch faster than CuPy eager", "eager", EAGER, "numbagraph",
               EAGER, "CuPy", 1.0),
        Target("launch_record(...).launch() <= 1.2x C++ eager", "eager", EAGER,
               "launch record", EAGER, "C++", 1.2),
        Target("eager ng.add_into on 1024 floats <= 10 us", "eager", OP_CASE, "numbagraph",
               OP_CASE, "numbagraph", 0.0, slack=10.0),
    ]
    found += [
        Target(f"capture+instantiate of {n} launches <= 5 us per launch", "capture",
               f"{n} launches", "numbagraph (array arg)", f"{n} launches",
               "numbagraph (array arg)", 0.0, slack=5.0)
        for n in (100, 1000)
    ]
    found.append(Target("capture+instantiate of 1000 launches <= 2.5x C++", "capture",
                        "1000 launches", "numbagraph (array arg)", "1000 launches", "C++",
                        2.5))
    found += [
        Target("replay of a step with graph-owned temporaries <= 1.1x preallocated",
               "memory", REPLAY, OWNED, REPLAY, PREALLOCATED, 1.1),
        Target("8 graphs' graph-owned temporaries on one stream <= 1.25x one graph's",
               "memory", FOOTPRINT_8, OWNED, FOOTPRINT_1, OWNED, 1.25),
    ]
    found += _streams_targets()
    found += [
        Target(f"capture+instantiate of {n} launches <= cuda.core's", "capture",
               f"{n} launches", "numbagraph (array arg)", f"{n} launches", "cuda.core", 1.0)
        for n in (10, 100, 1000)
    ]
    found += [
        Target(f"graphed call, {SAME}, {n}-node step <= plain launch + 1 us", "graphed",
               case(n, SAME), GRAPHED, case(n, SAME), PLAIN, 1.0, slack=1.0)
        for n in STEPS
    ]
    found += [
        Target(f"graphed call, {change}, {STEPS[-1]}-node step <= 2x plain launch",
               "graphed", case(STEPS[-1], change), GRAPHED, case(STEPS[-1], change),
               PLAIN, 2.0)
        for change in (ONE, ALL)
    ]
    found += [
        Target(f"graphed call, {change}, {STEPS[0]}-node step <= plain launch + {slack:g} us",
               "graphed", case(STEPS[0], change), GRAPHED, case(STEPS[0], change), PLAIN,
               1.0, slack=slack)
        for change, slack in ((ONE, 4.0), (ALL, 10.0))
    ]
    found += [
        Target(f"graphed rebinding call at {size_label(n)} faster than PyTorch "
               "static copy", "graphed", size_case(n), GRAPHED, size_case(n), TORCH, 1.0)
        for n in SIZES
    ]
    found += _rebinding_targets()
    found.append(Target(
        f"graphed call, {NEW_SIGNATURE}, {STEPS[-1]}-node step <= 0.6x capture + instantiate",
        "graphed", case(STEPS[-1], NEW_SIGNATURE), GRAPHED, case(STEPS[-1], NEW_SIGNATURE),
        RECAPTURE, 0.6))
    found += [
        Target(f"graphed call, {ALL}, {n}-node step >= 100x faster than {peer}",
               "graphed", case(n, ALL), GRAPHED, case(n, ALL), peer, 0.01)
        for n in STEPS for peer in (RECAPTURE, RECAPTURE_UPDATE)
    ]
    found += _sizes_targets()
    for op in OPS:
        found.append(Target(f"{op}_into bandwidth >= 0.85x device copy", "bandwidth",
                            op, "numbagraph", COPY_CASE, "driver memcpy", 0.85, True))
        found.append(Target(f"{op}_into bandwidth >= 1.0x PyTorch out=", "bandwidth",
                            op, "numbagraph", op, "PyTorch", 1.0, True))
    found += _ops_targets()
    found += _dist_targets()
    return found


def _rebinding_targets() -> list[Target]:
    """A rebinding costs what the driver's calls cost: per node moved (the
    slope of the line fitted to the rebinding's host time over 1, 10 and 100
    nodes moved) at most 1.3x the cuda.bindings call setting one node of
    that kind, and its fixed part (the line's intercept) at most 2 us, for
    kernel, copy and fill nodes. The fixed part is judged against the same
    call, with the 2 us as slack: a bound of 2 us whatever that call costs."""
    found = []
    for kind in NODE_KINDS:
        found.append(Target(
            f"rebinding per {kind} node moved <= 1.3x cuda.bindings {SET_CALLS[kind]}",
            "graphed", fit_case(kind), PER_NODE, set_case(kind), BINDINGS, 1.3))
        found.append(Target(
            f"rebinding of {kind} nodes, fixed part <= 2 us", "graphed", fit_case(kind),
            FIXED, set_case(kind), BINDINGS, 0.0, slack=2.0))
    return found


def _sizes_targets() -> list[Target]:
    """One graph for many sizes: a call at a new size of the 100-node step
    at most 0.3x capturing and instantiating that step at that size; 16
    sizes held by one graph, captured once (each count judged against
    itself, the bound of 1 as slack); and in the particle step at 10%
    active, the fastest mode other than the max grid at most 0.8x the max
    grid's time per step."""
    z = sizes
    nodes = z.STEPS[-1]
    found = [Target(f"a call with a new size of a {nodes}-node step <= 0.3x capture + "
                    "instantiate of that step", z.NAME, z.case(nodes), z.UPDATE,
                    z.case(nodes), z.RECAPTURE, 0.3)]
    found += [
        Target(f'{z.SIXTEEN} with sizes="update": {what} <= 1', z.NAME, row, z.UPDATE, row,
               z.UPDATE, 0.0, slack=1.0)
        for what, row in (("graphs held", z.GRAPHS), ("captures", z.CAPTURES))
    ]
    found.append(Target("particles at 10% active: best mode <= 0.8x the max-grid mode",
                        z.NAME, z.PARTICLES, z.BEST, z.PARTICLES, z.MAX_GRID, 0.8))
    return found


def _streams_targets() -> list[Target]:
    """Two forked half-GPU kernels in about the time of one; a child graph
    replayed as fast as the same launches flat; a host node or a pinned
    read-back adding at most 2 us to a replay-loop step; ng.on_host's host
    node at most 5 us over a host node of a C function added by the
    driver's own call."""
    s = streams
    found = [
        Target("2 half-GPU kernels forked by ng.fork replay in <= 0.6x their sequence",
               s.NAME, s.FORK, s.FORKED, s.FORK, s.SEQUENTIAL, 0.6),
        Target(f"{s.NODES} launches as a child graph replay per node <= 1.05x flat",
               s.NAME, s.CHILD, s.AS_CHILD, s.CHILD, s.FLAT, 1.05),
    ]
    found += [
        Target(f"{what} in a replay-loop step adds <= 2 us", s.NAME, s.STEP, peer,
               s.STEP, s.PLAIN, 1.0, slack=2.0)
        for what, peer in (("ng.on_host", s.HOST),
                           ("read_async into a HostScalar", s.READBACK))
    ]
    found.append(Target("ng.on_host in a replay-loop step <= the driver's C host node + 5 us",
                        s.NAME, s.STEP, s.HOST, s.STEP, s.C_HOST, 1.0, slack=5.0))
    return found


def _dist_targets() -> list[Target]:
    """A step replayed with its all-reduce inside the graph at most as long
    as the graph replayed with the all-reduce eager after it, at every
    size; the eager all-reduce's bus bandwidth at 64 MiB at least 0.9x
    PyTorch's. Judged with two ranks or more (n/a on one)."""
    d = collectives
    found = [
        Target(f"step with a {d.size_label(n)} all-reduce in its graph <= the all-reduce "
               "eager between replays", d.NAME, d.step_case(n), d.IN_GRAPH, d.step_case(n),
               d.BETWEEN, 1.0)
        for n in d.SIZES
    ]
    largest = d.SIZES[-1]
    found.append(Target(f"all_reduce_into bus bandwidth at {d.size_label(largest)} >= 0.9x "
                        "PyTorch's", d.NAME, d.bandwidth_case(largest), d.PEER,
                        d.bandwidth_case(largest), d.TORCH, 0.9, at_least=True))
    return found


def _ops_targets() -> list[Target]:
    """numbagraph's time per call over PyTorch's, at every case of the ops
    suite: at least 0.9x PyTorch's speed is a time at most 1/0.9 of its
    time; take_into, bound by the host, at most 2x PyTorch's eager call."""
    speed = 0.9
    cases = [ops.matmul_case(*shape, kind) for kind in (ops.FLOAT32, ops.TF32)
             for shape in ops.MATMUL_SHAPES]
    cases += [ops.matmul_case(*shape, ops.FLOAT16) for shape in ops.FLOAT16_MATMUL_SHAPES]
    cases += [ops.matmul_case(*shape, ops.BFLOAT16) for shape in ops.BFLOAT16_MATMUL_SHAPES]
    cases += [ops.matvec_case(*shape) for shape in ops.MATVEC_SHAPES]
    cases += [ops.rows_case("softmax", *shape) for shape in ops.SOFTMAX_SHAPES]
    cases += [ops.rows_case(op, *ops.NORM_SHAPE) for op in ("layernorm", "rmsnorm")]
    cases += [ops.reduce_case(op, ops.REDUCE_SIZE) for op in ("max", "argmax")]
    found = [Target(f"{case} >= {speed}x PyTorch's speed", "ops", case, "numbagraph",
                    case, "PyTorch", 1 / speed)
             for case in cases]
    take = ops.take_case(*ops.TAKE_SHAPE)
    found.append(Target(f"{take} <= 2x PyTorch's eager call", "ops", take, "numbagraph",
                        take, "PyTorch", 2.0))
    return found


TARGETS = _targets()


def evaluate(results: dict[str, SuiteResult], *,
             unjudged: str | None = None) -> list[dict[str, Any]]:
    """The verdict of every target whose suite ran: PASS, MISS, or n/a with
    the reason. With ``unjudged`` (why the numbers say nothing, as on the
    simulator) every verdict is n/a for that reason, ratios still shown."""
    verdicts = [t.check(results) for t in TARGETS if t.suite in results]
    if unjudged:
        for v in verdicts:
            if v["verdict"] != "n/a":
                v.update(verdict="n/a", why=unjudged)
    return verdicts
