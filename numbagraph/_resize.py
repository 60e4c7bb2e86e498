"""New sizes for a graph by node updates: the work run again, its kernel
launches, copies and fills taken instead of made, and given to the graph's
nodes.

A graphed function with ``sizes="update"`` keeps one graph per *family* of
signatures: signatures whose arrays differ only in shape and strides (the
same kinds, dtypes, ranks and layouts, so the same compiled overloads). A
call of a new signature of a known family runs the function again inside a
capture of its stream, with the stream's work diverted
(``divert_launches``): each kernel launch passes the checks a captured
launch passes, then is listed instead of recorded, and so is each copy and
fill numbagraph makes itself. The capture must record nothing else:
anything it records (memory, a host call, a loop, a copy numba makes, a
launch numbagraph does not pack) is work node updates cannot re-size, and
the call is captured instead. The work listed then goes to the graph's
kernel, copy and fill nodes one for one (``CapturedGraph._reparameterise``),
which refuses, in words, another count, another kind, kernel or overload.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import _graphmem, _registry
from .backend import active as _backend
from .capture import capture
from .errors import NumbagraphError, RebindError
from .graph import CapturedGraph
from .nodes import is_launch

__all__ = ["family_of", "rerun", "MODES"]

# What ``ng.graphed(sizes=...)`` takes: a graph per signature, or one per
# family updated to each signature's sizes.
MODES = ("capture", "update")


def _layout(shape: tuple, strides: tuple, itemsize: int) -> str:
    """numba's layout of an array: "C", "F", "CF" (both, as a 1-d or
    one-element array is) or "A"."""
    if not strides:
        return "C"  # an interface without strides describes a C-contiguous array

    def contiguous(dims: Any) -> bool:
        expected = itemsize
        for n, stride in dims:
            if n != 1 and stride != expected:
                return False
            expected *= n
        return True

    dims = list(zip(shape, strides))
    found = ("C" if contiguous(reversed(dims)) else "") + ("F" if contiguous(dims) else "")
    return found or "A"


_itemsizes: dict[Any, int] = {}


def family_of(sig: tuple) -> tuple:
    """A graphed call's signature with each array's shape and strides
    replaced by its rank and layout."""
    family = []
    for item in sig[:-2]:
        if item[0] == "array":
            _, kind, shape, typestr, strides = item
            itemsize = _itemsizes.get(typestr)
            if itemsize is None:
                itemsize = _itemsizes[typestr] = np.dtype(typestr).itemsize
            item = ("array", kind, len(shape), typestr, _layout(shape, strides, itemsize))
        family.append(item)
    return (*family, *sig[-2:])


def _recorded(graph: CapturedGraph) -> str:
    """Why a run whose capture recorded ``graph``'s nodes cannot re-size."""
    try:
        kind = graph.nodes[0].kind
    except Exception:  # noqa: BLE001  the reason given is only less precise
        kind = "other"
    if kind == "kernel":
        return ("the call made a kernel launch that numbagraph does not pack itself "
                "(through numba's own launch: NUMBAGRAPH_FAST_LAUNCH=0, a kernel with "
                "extensions, or an argument of a kind the fast path does not take), "
                "or one on another stream than its own")
    what = {"memset": "a fill numbagraph does not make itself",
            "memcpy": "a copy numbagraph does not make itself", "memory": "graph memory (ng.empty)",
            "host": "a host call (ng.on_host)", "conditional": "a device loop or branch",
            "child": "a child graph"}.get(kind, f"a {kind} node")
    return f"the call recorded {what}, which takes no new sizes by node updates"


def _keepalive(taken: list, kept: list) -> list:
    """What a graph given the work ``taken`` (kernel launches, and copies
    and fills, named by their first item) keeps alive: each launch's
    ``(kernel, args)`` in order (from the capture's ``kept`` for those taken
    after the launch checks, which it recorded as it would have), then the
    rest of ``kept``."""
    recorded = iter([entry for entry in kept if is_launch(entry)])
    launches = [(t[3], t[4]) if type(t) is tuple and len(t) == 5 else next(recorded)
                for t in taken if type(t[0]) is not str]
    return [*launches, *(entry for entry in kept if not is_launch(entry))]


def rerun(graphs: Sequence[CapturedGraph], fn: Callable[..., Any], args: tuple,
          kwargs: dict, stream: Any, handle: int,
          accept: Callable[[Any], None]) -> tuple[int, str | None]:
    """Run ``fn(*args, **kwargs)`` with its work on ``stream`` taken
    instead of made, and give it to the first of ``graphs`` that takes it,
    once ``accept`` took the function's result: ``(its position, None)``,
    or ``(-1, why the first cannot take it)``, every graph unchanged. An
    error ``accept`` raises, or one the function raises that is not
    numbagraph's, propagates, the graphs unchanged; one of numbagraph's
    (a device loop, a device node, a capture rule the run broke) is the
    reason, and the call is captured, which raises it where it holds."""
    # Launches of device arrays and numbers alone are taken before the
    # launch checks, which pass them where no graph memory exists (none to
    # check them against) and a capture on this thread's graphed stream
    # runs; the graph keeps what they were given.
    early = not _graphmem.held[0]
    try:
        with capture(stream) as cap:
            taken = _backend.divert_launches(handle, early)
            try:
                # Kept by the capture: its launches taken before the checks
                # are what it holds, not nothing recorded.
                session = _registry.on(handle)
                if session is not None:
                    session.keep(taken)
                    session.instantiate = False  # its graph is never launched
                result = fn(*args, **kwargs)
            finally:
                _backend.stop_diverting(handle)
    except NumbagraphError as exc:
        return -1, f"the run that would re-size it raised {type(exc).__name__} ({exc})"
    dry = cap.graph
    try:
        if dry.num_nodes:
            return -1, _recorded(dry)
        accept(result)
        res = dry._res
        kept, res.keepalive = res.keepalive, []
        keepalive = _keepalive(taken, [entry for entry in kept if entry is not taken])
        first = None
        for i, graph in enumerate(graphs):
            try:
                reason = graph._reparameterise(taken, keepalive)
            except RebindError as exc:
                reason = str(exc)
            if reason is None:
                return i, None
            first = first or reason
        return -1, first
    finally:
        dry.close()
