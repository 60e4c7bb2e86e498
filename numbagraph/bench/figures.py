"""The figures the README and the benchmarks page quote, rendered from a
run's ``results.json`` and nothing else.

Each quoting file holds a block between two marker lines; the first names
what the block holds and the results it is rendered from, relative to the
file's folder, and may add words after a comma::

    <!-- headline figures from docs/benchmarks/results.json, written by the bench -->
    ...
    <!-- end of figures -->

``headline figures`` is :func:`headline` (a list of what a user compares);
``current results`` is :func:`current` (the environment, the same list, and
every target's verdict). A run rewrites each block that names the
``results.json`` it wrote (:func:`rewrite_quotes`), so a quoted figure is
always one run's, and a suite the run did not hold reads "not measured in
this run". Rows are looked up by the case and peer names the suites write;
a row a run lacks leaves its clause out, and names a suite does not know
are passed over.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from . import SUITES, bandwidth, collectives, eager, graphed, loop, memory, streams
from . import sizes as sizes_suite
from .floor import PEER as CPP
from .report import format_value

__all__ = ["NOT_MEASURED", "BLOCKS", "ITEMS", "headline", "current", "Quote", "quotes",
           "render_quote", "quoting_files", "files_quoting", "rewrite_quotes"]

NOT_MEASURED = "not measured in this run"

_END = "<!-- end of figures -->"


class _Suite:
    """One suite of a results document: its rows by case and peer."""

    def __init__(self, doc: dict[str, Any] | None):
        doc = doc or {}
        self.unjudged = doc.get("unjudged")
        self.rows: list[dict[str, Any]] = [r for r in doc.get("rows") or []
                                           if isinstance(r, dict)]

    def row(self, case: str, peer: str) -> dict[str, Any] | None:
        for r in self.rows:
            if r.get("case") == case and r.get("peer") == peer:
                return r
        return None

    def value(self, case: str, peer: str) -> float | None:
        r = self.row(case, peer)
        value = r.get("value") if r else None
        return float(value) if isinstance(value, (int, float)) else None

    def cases(self) -> list[str]:
        return list(dict.fromkeys(str(r.get("case")) for r in self.rows))


def _num(value: float) -> str:
    return format_value(value)


def _ratio(value: float, ref: float) -> str:
    if not ref or math.isnan(ref) or math.isnan(value):
        return "n/a"
    ratio = value / ref
    return f"{ratio:.2f}×" if ratio < 10 else f"{ratio:.1f}×"


def _series(values: Sequence[float]) -> str:
    return " / ".join(_num(v) for v in values)


def _join(parts: Iterable[str | None], sep: str = ", ") -> str:
    return sep.join(p for p in parts if p)


def _sized_cases(suite: _Suite, pattern: str) -> list[tuple[int, str]]:
    """``(n, case)`` for the cases matching ``pattern`` (one group, an
    integer), smallest first."""
    found = []
    for case in suite.cases():
        m = re.fullmatch(pattern, case)
        if m:
            found.append((int(m.group(1)), case))
    return sorted(found)


def _clauses(suite: _Suite, case: str, peers: Sequence[tuple[str, str]],
             unit: str = "") -> str:
    """``label value`` for each of ``peers`` (``(peer, label)``) measured in
    ``case``; the first value carries ``unit``."""
    parts = []
    for peer, label in peers:
        v = suite.value(case, peer)
        if v is not None:
            parts.append(f"{label} {_num(v)}{unit if not parts else ''}")
    return ", ".join(parts)


# ------------------------------------------------------------ one item per suite

def _replay(s: _Suite, config: dict[str, Any]) -> str | None:
    sizes = [(n, c) for n, c in _sized_cases(s, r"(\d+) nodes?")
             if s.value(c, "numbagraph") is not None]
    if not sizes:
        return None
    ns = [n for n, _ in sizes]
    ours = [s.value(c, "numbagraph") for _, c in sizes]
    text = (f"a graph of {' / '.join(map(str, ns))} tiny kernels replays at "
            f"{_series(ours)} µs per node")
    cpp = [s.value(c, CPP) for _, c in sizes]
    if all(v is not None for v in cpp):
        text += (f", {' / '.join(_ratio(o, c) for o, c in zip(ours, cpp))} C++'s "
                 f"`cudaGraphLaunch` ({_series(cpp)})")
    n, largest = sizes[-1]
    others = _clauses(s, largest, [("cuda.core", "cuda.core"),
                                   ("PyTorch", "PyTorch's `CUDAGraph`"), ("CuPy", "CuPy")])
    if others:
        text += f"; at {n} nodes, {others}"
    return text


def _eager(s: _Suite, config: dict[str, Any]) -> str | None:
    case = eager.CASE
    ours = s.value(case, "numbagraph")
    cpp, torch = s.value(case, CPP), s.value(case, "PyTorch")
    if ours is None:
        first = f"`kernel[grid, block, stream](...)` with numbagraph imported: {NOT_MEASURED}"
    else:
        refs = _join([f"{_ratio(ours, cpp)} C++'s `<<<>>>` ({_num(cpp)})" if cpp else None,
                      f"{_ratio(ours, torch)} PyTorch's `a.add_(n)` ({_num(torch)})"
                      if torch else None], " and ")
        first = (f"`kernel[grid, block, stream](...)` with numbagraph imported "
                 f"{_num(ours)} µs" + (f", {refs}" if refs else ""))
    rest = _clauses(s, case, [
        ("launch record", "`ng.launch_record(...).launch()`"),
        ("numbagraph + DeviceScalar", "with a `DeviceScalar`"),
        ("numba", "numba's own path"),
        *([] if ours is not None else [("PyTorch", "PyTorch"), (CPP, "C++")]),
        ("CuPy", "CuPy"),
        ("numbagraph replay", "a kernel replayed in a numbagraph graph"),
    ], unit=" µs" if ours is None else "")
    if not rest and ours is None:
        return None
    text = _join([first, rest], "; ")
    for op_case in s.cases():
        if op_case.startswith("add_into, "):
            op = s.value(op_case, "numbagraph")
            if op is not None:
                ref = s.value(op_case, "PyTorch")
                text += (f". An eager `ng.add_into` on {op_case.removeprefix('add_into, ')} "
                         f"repeated on the same arrays: {_num(op)} µs"
                         + (f" (PyTorch's `torch.add(out=)`: {_num(ref)})" if ref else ""))
    return text


def _loop(s: _Suite, config: dict[str, Any]) -> str | None:
    ours = s.value(loop.STEP, "numbagraph")
    if ours is None:
        return None
    refs = [f"{_ratio(ours, v)} {label} ({_num(v)})"
            for peer, label in ((CPP, "C++'s pinned `cudaMemcpyAsync` + `cudaGraphLaunch`"),
                                ("PyTorch", "PyTorch's pinned `copy_` + `replay()`"))
            if (v := s.value(loop.STEP, peer)) is not None]
    text = f"{_num(ours)} µs" + (f", {' and '.join(refs)}" if refs else "")
    halves = []
    for case, what in ((loop.UPDATE, "the update alone"), (loop.LAUNCH, "the launch alone")):
        v = s.value(case, "numbagraph")
        if v is not None:
            ref = s.value(case, CPP)
            halves.append(f"{what} {_num(v)}" + (f" (C++ {_num(ref)})" if ref else ""))
    if halves:
        text += "; " + ", ".join(halves)
    return text


def _device_loop(s: _Suite, config: dict[str, Any]) -> str | None:
    ours = s.value(loop.STEP, loop.DEVICE_LOOP)
    if ours is None:
        return None
    cpp = s.value(loop.STEP, CPP)
    return (f"{_num(ours)} µs a step" + (f", {_ratio(ours, cpp)} the C++ host loop "
                                          f"({_num(cpp)})" if cpp else ""))


def _devloop(s: _Suite, config: dict[str, Any]) -> str | None:
    parts = []
    one = s.value("while, 1 kernels", "while node")
    if one is not None:
        inside = s.value("while, 1 kernels", "while node + if node")
        parts.append(f"an iteration of a while node around one tiny kernel {_num(one)} µs"
                     + (f" (inside an if node as well: {_num(inside)})" if inside else ""))
    for unroll, what in (("auto", "a pass of `ng.repeat` with `unroll=\"auto\"`"),
                         ("1", "with `unroll=1`")):
        case = f"pass, unroll {unroll}"
        counted, guarded = s.value(case, "counted"), s.value(case, "stoppable, guards")
        if counted is not None:
            parts.append(f"{what} {_num(counted)} µs counted"
                         + (f", {_num(guarded)} stoppable" if guarded is not None else ""))
    return "; ".join(parts) if parts else None


def _capture(s: _Suite, config: dict[str, Any]) -> str | None:
    sizes = [(n, c) for n, c in _sized_cases(s, r"(\d+) launch(?:es)?")
             if s.value(c, "numbagraph") is not None]
    if not sizes:
        return None
    ns = " / ".join(str(n) for n, _ in sizes)
    ours = [s.value(c, "numbagraph") for _, c in sizes]
    text = f"every launch checked and its arguments kept alive: at {ns} launches, " \
           f"{_series(ours)} µs a launch"
    for peer, label in (("cuda.core", "cuda.core's `GraphBuilder`"), (CPP, "C++")):
        refs = [s.value(c, peer) for _, c in sizes]
        if all(v is not None for v in refs):
            text += (f"; {' / '.join(_ratio(o, r) for o, r in zip(ours, refs))} {label} "
                     f"({_series(refs)})")
    own = [s.value(c, "numba's own launch path") for _, c in sizes]
    if all(v is not None for v in own):
        text += f"; numba's own launch path, captured: {_series(own)}"
    return text


def _graphed(s: _Suite, config: dict[str, Any]) -> str | None:
    steps = [n for n, _ in _sized_cases(s, rf"(\d+) nodes, {re.escape(graphed.SAME)}")]
    steps = [n for n in steps
             if s.value(graphed.case(n, graphed.SAME), graphed.PEER) is not None]
    parts = []
    if steps:
        label = " / ".join(map(str, steps))
        for change in (graphed.SAME, graphed.ONE, graphed.ALL, graphed.UNSEEN):
            values = [s.value(graphed.case(n, change), graphed.PEER) for n in steps]
            if all(v is not None for v in values):
                parts.append(f"{change} {_series(values)}")
        for peer, what in ((graphed.PLAIN, "the captured graph's own `graph.launch()`"),
                           (graphed.RECAPTURE, "capturing and instantiating again")):
            values = [s.value(graphed.case(n, graphed.SAME if peer == graphed.PLAIN
                                           else graphed.ALL), peer) for n in steps]
            if all(v is not None for v in values):
                parts.append(f"{what} {_series(values)}")
        parts[0] = f"a call of a step of {label} launches, {parts[0]} µs"
    inputs = [c for c in s.cases() if c.startswith("input ")
              and s.value(c, graphed.PEER) is not None]
    if inputs:
        ours = [s.value(c, graphed.PEER) for c in inputs]
        torch = [s.value(c, graphed.TORCH) for c in inputs]
        sizes = " / ".join(c.removeprefix("input ") for c in inputs)
        text = f"an input of {sizes} changed each call {_series(ours)} µs"
        if all(v is not None for v in torch):
            text += f" (PyTorch's copy into a static input: {_series(torch)})"
        parts.append(text)
    for case in s.cases():
        fitted = re.fullmatch(r"rebinding (.+) nodes, fitted", case)
        if fitted:
            # The line's parts, named by the suite's own peers.
            line = [f"{r.get('peer')} {_num(r['value'])}" for r in s.rows
                    if r.get("case") == case and isinstance(r.get("value"), (int, float))]
            if line:
                parts.append(f"rebinding {fitted.group(1)} nodes, {', '.join(line)} µs")
    return "; ".join(parts) if parts else None


def _counted(value: float, word: str) -> str:
    return f"{value:g} {word}" + ("" if value == 1 else "s")


def _sizes(s: _Suite, config: dict[str, Any]) -> str | None:
    z = sizes_suite
    parts = []
    steps = [(n, c) for n, c in _sized_cases(s, rf"{re.escape(z.NEW_SIZE)}, (\d+)-node step")
             if s.value(c, z.UPDATE) is not None]
    if steps:
        ours = [s.value(c, z.UPDATE) for _, c in steps]
        text = (f"a call with a new size of a step of {' / '.join(str(n) for n, _ in steps)} "
                f"launches {_series(ours)} µs")
        again = [s.value(c, z.RECAPTURE) for _, c in steps]
        if all(v is not None for v in again):
            text += (f", {' / '.join(_ratio(o, r) for o, r in zip(ours, again))} capturing "
                     f"and instantiating the step at that size ({_series(again)})")
        plain = [s.value(c, z.PLAIN) for _, c in steps]
        if all(v is not None for v in plain):
            text += f"; the step's own `graph.launch()` {_series(plain)}"
        parts.append(text)
    graphs, captures = s.value(z.GRAPHS, z.UPDATE), s.value(z.CAPTURES, z.UPDATE)
    if graphs is not None and captures is not None:
        text = (f"{z.SIZE_COUNT} sizes in turn: {_counted(graphs, 'graph')} held, "
                f"{_counted(captures, 'capture')}")
        per_graphs, per_captures = s.value(z.GRAPHS, z.PER_SIZE), s.value(z.CAPTURES, z.PER_SIZE)
        if per_graphs is not None and per_captures is not None:
            text += (f" (a graph per size: {_counted(per_graphs, 'graph')}, "
                     f"{_counted(per_captures, 'capture')})")
        parts.append(text)
    modes = [r for r in s.rows if r.get("case") == z.PARTICLES and r.get("peer") != z.BEST
             and isinstance(r.get("value"), (int, float))]
    if modes:
        listed = ", ".join(f"{r.get('peer')} {_num(r['value'])}" for r in modes)
        parts.append(f"a particle step at 10% active, per step: {listed} µs")
    return "; ".join(parts) if parts else None


def _memory(s: _Suite, config: dict[str, Any]) -> str | None:
    parts = []
    owned = s.value(memory.REPLAY, memory.OWNED)
    if owned is not None:
        pre = s.value(memory.REPLAY, memory.PREALLOCATED)
        parts.append(f"a step whose temporaries are allocated and freed inside the capture "
                     f"replays in {_num(owned)} µs"
                     + (f", {_ratio(owned, pre)} the same kernels on preallocated "
                        f"temporaries ({_num(pre)})" if pre else ""))
    for case in s.cases():
        if case.endswith("(MiB)"):
            held = _clauses(s, case, [(memory.OWNED, "graph-owned"),
                                      (memory.PREALLOCATED, "preallocated")], " MiB")
            if held:
                parts.append(f"{case.removesuffix(' (MiB)')}: {held}")
    empty = s.value(memory.CAPTURE, memory.ALLOCATION)
    if empty is not None:
        launch = s.value(memory.CAPTURE, memory.LAUNCH)
        parts.append(f"an `ng.empty` inside a capture {_num(empty)} µs"
                     + (f" (a kernel launch: {_num(launch)})" if launch else ""))
    return "; ".join(parts) if parts else None


def _streams(s: _Suite, config: dict[str, Any]) -> str | None:
    parts = []
    forked = s.value(streams.FORK, streams.FORKED)
    if forked is not None:
        seq = s.value(streams.FORK, streams.SEQUENTIAL)
        parts.append(f"two half-GPU kernels forked by `ng.fork` replay in {_num(forked)} µs"
                     + (f", {_ratio(forked, seq)} the same in sequence ({_num(seq)})"
                        if seq else ""))
    child = s.value(streams.CHILD, streams.AS_CHILD)
    if child is not None:
        flat = s.value(streams.CHILD, streams.FLAT)
        parts.append(f"{streams.NODES} launches as a child graph {_num(child)} µs per node"
                     + (f" (flat: {_num(flat)})" if flat else ""))
    plain = s.value(streams.STEP, streams.PLAIN)
    if plain is not None:
        extras = _clauses(s, streams.STEP, [(streams.HOST, "with `ng.on_host`"),
                                            (streams.C_HOST, "with a host node of a C no-op"),
                                            (streams.READBACK,
                                             "with `read_async` into a `HostScalar`")])
        parts.append(f"a replay-loop step {_num(plain)} µs" + (f", {extras}" if extras else ""))
    return "; ".join(parts) if parts else None


def _bandwidth(s: _Suite, config: dict[str, Any]) -> str | None:
    parts = []
    for op in bandwidth.OPS:
        ours = s.value(op, "numbagraph")
        if ours is None:
            continue
        torch, cupy = s.value(op, "PyTorch"), s.value(op, "CuPy")
        refs = _join([f"PyTorch `out=` {_num(torch)}, {_ratio(ours, torch)}" if torch else None,
                      f"CuPy {_num(cupy)}" if cupy else None], "; ")
        parts.append(f"`{op}_into` {_num(ours)}" + (f" ({refs})" if refs else ""))
    if not parts:
        return None
    elements = config.get("bandwidth_elements")
    size = f" on {_bytes(int(elements) * 4)} float32" if isinstance(elements, int) else ""
    text = f"GB/s{size}: " + ", ".join(parts)
    copy = s.value(bandwidth.COPY_CASE, "driver memcpy")
    if copy is not None:
        text += f"; the driver's device-to-device copy {_num(copy)}"
    return text


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            whole = n % (1 << shift) == 0
            return f"{n >> shift if whole else format_value(n / (1 << shift))} {unit}"
    return f"{n} B"


def _ops(s: _Suite, config: dict[str, Any]) -> str | None:
    ratios, measured = [], 0
    for case in s.cases():
        ours, torch = s.row(case, "numbagraph"), s.row(case, "PyTorch")
        if ours is None or not str(ours.get("unit", "")).startswith("us"):
            continue  # a share of a copy's bandwidth, not a time
        measured += 1
        o, t = s.value(case, "numbagraph"), s.value(case, "PyTorch")
        if torch and torch.get("unit") == ours.get("unit") and o is not None and t:
            ratios.append((o / t, case, o, t))
    if not ratios:
        return f"{measured} cases measured, none of them against PyTorch" if measured else None
    within = sum(1 for r, *_ in ratios if r <= 1.0)
    slowest, fastest = max(ratios), min(ratios)
    text = (f"time per call at most PyTorch's in {within} of {len(ratios)} cases; "
            f"the slowest against PyTorch, {slowest[1]}: {_num(slowest[2])} µs against "
            f"{_num(slowest[3])} ({_ratio(slowest[2], slowest[3])})")
    if fastest is not slowest:
        text += (f"; the fastest, {fastest[1]}: {_num(fastest[2])} against "
                 f"{_num(fastest[3])} ({_ratio(fastest[2], fastest[3])})")
    return text


def _dist(s: _Suite, config: dict[str, Any]) -> str | None:
    parts = []
    steps = [c for c in s.cases() if c.startswith("step with an all-reduce of ")]
    if steps:
        case = steps[-1]
        ours, between = s.value(case, collectives.IN_GRAPH), s.value(case, collectives.BETWEEN)
        if ours is not None:
            parts.append(f"a {case} in its graph {_num(ours)} µs a step"
                         + (f", {_ratio(ours, between)} the all-reduce launched eagerly "
                            f"between replays ({_num(between)})" if between else ""))
    widths = [c for c in s.cases() if c.startswith("all-reduce bus bandwidth, ")]
    if widths:
        case = widths[-1]
        ours, torch = s.value(case, collectives.PEER), s.value(case, collectives.TORCH)
        if ours is not None:
            parts.append(f"{case} {_num(ours)} GB/s"
                         + (f" (PyTorch's: {_num(torch)})" if torch else ""))
    if not parts:
        return None
    text = "; ".join(parts)
    if s.unjudged:
        text += f" ({s.unjudged}: a copy, not a collective)"
    return text


def _apps(s: _Suite, config: dict[str, Any]) -> str | None:
    lines = []
    for example in s.cases():
        figures = []
        for r in s.rows:
            label, unit = str(r.get("peer", "")), str(r.get("unit", ""))
            value = r.get("value")
            if (r.get("case") != example or not isinstance(value, (int, float))
                    or not ("speed-up" in label or " per " in label)):
                continue
            shown = {"x": "×", "us": " µs"}.get(unit, f" {unit}".rstrip())
            # As the example prints it: its own digits.
            figures.append(f"{label} {value:g}{shown}")
        if figures:
            lines.append(f"`{example}`: " + "; ".join(figures))
    if not lines:
        return None
    return "\n" + "\n".join(f"    - {line}" for line in lines)


_Item = tuple[str, str, str, Callable[[_Suite, dict[str, Any]], str | None]]

# What the list says, in this order: (title, how it was timed or what it
# is, suite, the item's text from the suite's rows).
ITEMS: list[_Item] = [
    ("Replay", "CUDA events", "replay", _replay),
    ("Replay-loop step", "`DeviceScalar.update` + a 1-node `graph.launch()`, host clock",
     "loop", _loop),
    ("The same step looped by the GPU", "`ng.repeat` over every step in one launch, "
     "host clock", "loop", _device_loop),
    ("Eager launch of the tiny kernel", "host clock", "eager", _eager),
    ("Capture and instantiation", "host clock, per launch captured", "capture", _capture),
    ("Graphed functions", "`ng.graphed`, host clock", "graphed", _graphed),
    ("One graph for many sizes", '`ng.graphed(sizes="update")`, host clock', "sizes", _sizes),
    ("Loops on the GPU", "host clock over one launch", "devloop", _devloop),
    ("Graph-owned memory", "", "memory", _memory),
    ("Several streams in one graph", "", "streams", _streams),
    ("Bandwidth of the `_into` ops", "CUDA events", "bandwidth", _bandwidth),
    ("Ops against PyTorch", "", "ops", _ops),
    ("Collectives", "`ng.dist`, CUDA events", "dist", _dist),
    ("Examples", "each example's own timing", "apps", _apps),
]


# ------------------------------------------------------------ whole blocks

def _setting(doc: dict[str, Any]) -> str:
    env = doc.get("environment") or {}
    config = doc.get("config") or {}
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else {}
    if env.get("numbagraph_backend") == "simulator" or config.get("simulated"):
        where = "Numba's CUDA simulator (tiny sizes: the timings measure Python, not a GPU)"
    else:
        details = _join([f"driver {gpu['driver_version']}" if gpu.get("driver_version")
                         else None,
                         f"CUDA {gpu['cuda_driver_api']}" if gpu.get("cuda_driver_api")
                         else None])
        where = (gpu.get("name") or "a GPU") + (f" ({details})" if details else "")
    kind = "quick" if config.get("quick") else "full"
    trials = config.get("trials")
    medians = f", medians of {trials} trials" if trials else ""
    suites = doc.get("suites") or {}
    ran = list(suites)
    missing = [name for name in SUITES if name not in suites]
    failed = [name for name, suite in suites.items()
              if isinstance(suite, dict) and suite.get("error")]
    text = (f"Measured on {where} by one {kind} run of `python -m numbagraph.bench`"
            f"{medians}. Suites in this run: {', '.join(ran) or 'none'}")
    if missing:
        text += f"; not in this run: {', '.join(missing)}"
    if failed:
        text += f"; failed: {', '.join(failed)}"
    return text + "."


def _verdicts(doc: dict[str, Any]) -> str:
    targets = [t for t in doc.get("targets") or [] if isinstance(t, dict)]
    if not targets:
        return f"**Targets**: none judged ({NOT_MEASURED})."
    met = [t for t in targets if t.get("verdict") == "PASS"]
    missed = [t for t in targets if t.get("verdict") == "MISS"]
    unjudged = [t for t in targets if t not in met and t not in missed]
    text = f"**Targets**: {len(met)} met, {len(missed)} missed"
    if unjudged:
        whys = list(dict.fromkeys(str(t.get("why") or "no reason given") for t in unjudged))
        why = whys[0] if len(whys) == 1 else "each target's reason in results.md"
        text += f", {len(unjudged)} not judged ({why})"
    if missed:
        text += ": " + "; ".join(f"{t.get('target')} ({t.get('ratio', math.nan):.3f}×)"
                                 for t in missed)
    return text + "."


def headline(doc: dict[str, Any]) -> str:
    """The headline figures of the run ``doc`` (a parsed ``results.json``),
    as Markdown: where it ran, a line per figure a user compares, and the
    targets' count; a suite the run did not hold is "not measured"."""
    suites = doc.get("suites") or {}
    config = doc.get("config") or {}
    lines = [_setting(doc), ""]
    for title, how, name, item in ITEMS:
        suite = suites.get(name)
        body = item(_Suite(suite), config) if isinstance(suite, dict) else None
        label = f"**{title}**" + (f" ({how})" if how else "")
        body = body or NOT_MEASURED
        # A body of sub-items begins on the next line.
        lines.append(f"- {label}:" + (body if body.startswith("\n") else f" {body}"))
    lines += ["", _verdicts(doc)]
    return "\n".join(lines)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|")


def current(doc: dict[str, Any]) -> str:
    """The benchmarks page's current results: the environment, the
    headline figures and every target's verdict, from ``doc`` alone."""
    env = doc.get("environment") or {}
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else {}
    packages = env.get("packages") or {}
    machine = _join([gpu.get("name"),
                     f"sm {gpu['compute_capability']}" if gpu.get("compute_capability") else None,
                     gpu.get("memory"),
                     f"max SM clock {gpu['max_sm_clock']}" if gpu.get("max_sm_clock") else None])
    rows = [("GPU", machine),
            ("driver", _join([gpu.get("driver_version"),
                              f"CUDA {gpu['cuda_driver_api']}" if gpu.get("cuda_driver_api")
                              else None])),
            ("nvcc", env.get("nvcc")),
            ("Python", env.get("python")),
            ("packages", ", ".join(f"{k} {v}" for k, v in packages.items()))]
    lines = ["| | |", "|---|---|"]
    lines += [f"| {name} | {_cell(value)} |" for name, value in rows if value]
    lines += ["", headline(doc), ""]
    targets = [t for t in doc.get("targets") or [] if isinstance(t, dict)]
    if targets:
        lines += ["| target | numbagraph | reference | ratio | verdict |",
                  "|---|---:|---:|---:|---|"]
        for t in targets:
            verdict = {"PASS": "met", "MISS": "missed"}.get(t.get("verdict"), "not judged")
            if "ratio" in t:
                lines.append(f"| {_cell(t.get('target'))} | {_num(t['value'])} | "
                             f"{_num(t['ref'])} {_cell(t.get('unit', ''))} | "
                             f"{t['ratio']:.3f}× | {verdict} |")
            else:
                lines.append(f"| {_cell(t.get('target'))} | | | | {verdict}: "
                             f"{_cell(t.get('why', ''))} |")
    return "\n".join(lines).rstrip()


BLOCKS: dict[str, Callable[[dict[str, Any]], str]] = {
    "headline figures": headline,
    "current results": current,
}

# The first marker line of a block: its kind, then its results file (a
# path without spaces, relative to the quoting file's folder), then any
# words after a comma.
_BEGIN = re.compile(rf"^<!-- (?P<kind>{'|'.join(map(re.escape, BLOCKS))}) from "
                    r"(?P<source>[^\s,]+)(?:,[^>]*)? -->$")


# ------------------------------------------------------------ the blocks in files

class Quote:
    """A block of figures in a file: what it holds (a key of ``BLOCKS``), the
    results it is rendered from, and its place (the lines between its
    markers)."""

    def __init__(self, path: Path, kind: str, source: Path, start: int, end: int,
                 text: str):
        self.path, self.kind, self.source = path, kind, source
        self.start, self.end, self.text = start, end, text


def quotes(path: Path) -> list[Quote]:
    """The blocks of figures in the Markdown file ``path``; a block whose
    end marker is missing raises ValueError."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _BEGIN.match(lines[i])
        if m is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == _END), None)
        if end is None:
            raise ValueError(f"{path}:{i + 1}: the block of figures has no {_END!r} line")
        text = "\n".join(lines[i + 1:end]).strip("\n")
        found.append(Quote(path, m["kind"], (path.parent / m["source"]).resolve(),
                           i + 1, end, text))
        i = end + 1
    return found


def render_quote(quote: Quote) -> str:
    """What ``quote`` must hold: its kind rendered from its results file."""
    return BLOCKS[quote.kind](json.loads(quote.source.read_text()))


def quoting_files(out: Path) -> list[Path]:
    """The files a run writing ``out`` may quote in: ``out/README.md`` and
    the README.md of the working folder (the checkout's, run from its root)."""
    found = []
    for path in (out / "README.md", Path("README.md")):
        if path.is_file() and path.resolve() not in [p.resolve() for p in found]:
            found.append(path)
    return found


def files_quoting(results: Path, files: Iterable[Path]) -> list[Path]:
    """Those of ``files`` holding a block rendered from ``results``."""
    target = results.resolve()
    return [path for path in files if any(q.source == target for q in quotes(path))]


def rewrite_quotes(results: Path, files: Iterable[Path]) -> list[Path]:
    """Render again, from ``results``, every block in ``files`` that names
    it; the files changed. A file with a block left open raises ValueError
    before any file is written."""
    target = results.resolve()
    mine = [(path, [q for q in quotes(path) if q.source == target]) for path in files]
    mine = [(path, blocks) for path, blocks in mine if blocks]
    doc = json.loads(results.read_text()) if mine else {}
    changed = []
    for path, blocks in mine:
        lines = path.read_text().splitlines()
        for q in reversed(blocks):
            lines[q.start:q.end] = ["", *BLOCKS[q.kind](doc).splitlines(), ""]
        path.write_text("\n".join(lines) + "\n")
        changed.append(path)
    return changed
