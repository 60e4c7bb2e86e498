"""What a rebinding moves: the memory of each array named, and where to.

An array given to ``rebind`` is known by the memory it covers, so a node
that was given a view of it (``x[1:]``, a row, a reshape) moves with it, to
the same offset in the new array. Both arrays must have one layout (shape,
dtype, strides), so that every such offset exists in the new one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _registry
from .backend import active as _backend
from .backend.interface import Move
from .errors import RebindError

__all__ = ["moves_for", "pairs_of", "device_array_of", "spans_of", "rebind_spans", "check_held",
           "Transition", "transition_of", "redo_transition",
           "Fixed", "FixedNodesError", "fixed_of", "check_fixed", "shift_fixed",
           "Operands", "OperandsError", "operands_of", "check_operands", "shift_operands"]


def pairs_of(mapping: Any) -> list[tuple[Any, Any]]:
    """``mapping`` as a list of ``(old, new)`` pairs: a dict, or an iterable
    of pairs (for arrays that cannot be dict keys)."""
    if hasattr(mapping, "items"):
        return list(mapping.items())
    try:
        pairs = [tuple(pair) for pair in mapping]
    except TypeError:
        raise RebindError(
            f"rebind() takes a dict {{old: new}} or (old, new) pairs, not "
            f"{type(mapping).__name__}") from None
    for pair in pairs:
        if len(pair) != 2:
            raise RebindError(f"rebind() takes (old, new) pairs; got one of {len(pair)} items")
    return pairs


def device_array_of(obj: Any) -> Any:
    """The device array behind ``obj`` (a device array, a DeviceScalar, or
    anything with ``__cuda_array_interface__``), or None."""
    unwrap = _registry.device_wrappers.get(type(obj))
    if unwrap is not None:
        # A DeviceScalar's array; a Condition holds none (and unwrapping one
        # would mark it set).
        return getattr(obj, "_dev", None)
    if isinstance(obj, _backend.DEVICE_ARRAY_TYPES):
        return obj
    if getattr(obj, "__cuda_array_interface__", None) is None:
        return None
    return _backend.as_device_array(obj)


def _layout(dev: Any) -> tuple[tuple[int, ...], np.dtype, tuple[int, ...]]:
    return tuple(dev.shape), np.dtype(dev.dtype), tuple(dev.strides)


def span(dev: Any) -> tuple[int, int, int]:
    """``(pointer, start, end)``: the address of the first element and the
    bytes ``[start, end)`` the array covers."""
    ptr = _backend.device_pointer(dev)
    low = high = 0
    for n, stride in zip(dev.shape, dev.strides):
        if n == 0:
            return ptr, ptr, ptr
        if stride < 0:
            low += (n - 1) * stride
        else:
            high += (n - 1) * stride
    return ptr, ptr + low, ptr + high + np.dtype(dev.dtype).itemsize


def _describe(obj: Any) -> str:
    dev = device_array_of(obj)
    kind = type(obj).__name__
    if dev is None:
        return kind
    shape, dtype, strides = _layout(dev)
    return f"{kind} of shape {shape}, dtype {dtype}, strides {strides}"


def moves_for(pairs: list[tuple[Any, Any]]) -> list[Move]:
    """One move per pair, each checked: both sides arrays of one kind and
    layout, no two old arrays overlapping. Raises RebindError naming the
    pair and the fix."""
    moves: list[Move] = []
    for i, (old, new) in enumerate(pairs):
        old_dev, new_dev = device_array_of(old), device_array_of(new)
        for side, obj, dev in (("key", old, old_dev), ("value", new, new_dev)):
            if dev is None:
                raise RebindError(
                    f"rebind pair {i}: the {side} is a {type(obj).__name__}, not a device "
                    "array, DeviceScalar or object with __cuda_array_interface__")
            if _backend.graph_memory_of(dev) is not None:
                raise RebindError(
                    f"rebind pair {i}: the {side} is memory a graph allocated inside it, "
                    "which exists only as that graph's and is made again at each of its "
                    "launches; rebind only arrays made outside any capture")
        old_scalar = type(old) in _registry.device_wrappers
        if old_scalar != (type(new) in _registry.device_wrappers):
            raise RebindError(
                f"rebind pair {i}: {type(old).__name__} and {type(new).__name__} are not "
                "both DeviceScalars or both arrays; a scalar is rebound to a scalar")
        if _layout(old_dev) != _layout(new_dev):
            raise RebindError(
                f"rebind pair {i}: the new array ({_describe(new)}) does not have the "
                f"layout of the old one ({_describe(old)}); rebinding keeps every "
                "recorded shape and offset, so both need the same shape, dtype and "
                "strides. Capture a new graph for another layout")
        old_ptr, start, end = span(old_dev)
        new_ptr = _backend.device_pointer(new_dev)
        if end == start:
            raise RebindError(f"rebind pair {i}: the old array is empty; no node can use it")
        moves.append(Move(start, end, new_ptr - old_ptr, new_dev))
    ordered = sorted(range(len(moves)), key=lambda k: moves[k].start)
    for a, b in zip(ordered, ordered[1:]):
        if moves[b].start < moves[a].end:
            raise RebindError(
                f"rebind pairs {min(a, b)} and {max(a, b)}: the old arrays overlap "
                "(one is a view of the other); name the array once, as its views "
                "move with it")
    return moves


_PLAIN = (int, float, complex, str, bytes, np.generic, type(None))


def spans_of(keepalive: list) -> tuple[list, list[list]]:
    """Split what a graph keeps alive into what holds no array (kernels,
    recorded scalars, conditions: kept once each) and the arrays its
    launches were given, as ``[start, end, object]``, one per distinct span
    (views of one array made at every launch come down to a few)."""
    rest: dict[int, Any] = {}
    spans: dict[tuple[int, int], list] = {}

    def visit(value: Any, top: bool) -> None:
        if isinstance(value, tuple):
            for item in value:
                visit(item, False)
            return
        dev = None if isinstance(value, _PLAIN) else device_array_of(value)
        if dev is None:
            if not isinstance(value, _PLAIN):
                rest.setdefault(id(value), value)
            return
        if top and type(value) in _registry.device_wrappers:
            rest.setdefault(id(value), value)  # a scalar whose update the graph records
        _, start, end = span(dev)
        spans.setdefault((start, end), [start, end, value])

    for entry in keepalive:
        visit(entry, True)
    return list(rest.values()), list(spans.values())


def rebind_spans(held: list[tuple[list, int]], keepalive: list,
                 pairs: list[tuple[Any, Any]], moves: list[Move]) -> tuple[list, list]:
    """Point the spans ``held`` (from :func:`check_held`) and the
    DeviceScalars in ``keepalive`` at the new objects of ``pairs``, in place;
    returns the objects they held before, and ``(index in keepalive, index
    of the pair)`` of each scalar replaced."""
    replaced = []
    for entry, i in held:
        shift = moves[i].shift
        replaced.append(entry[2])
        entry[0] += shift
        entry[1] += shift
        entry[2] = pairs[i][1]
    # Arrays are in spans; keepalive holds no array but a recorded scalar.
    wrappers = _registry.device_wrappers
    scalars = [(i, pair) for i, pair in enumerate(pairs) if type(pair[0]) in wrappers]
    placed = []
    if scalars:
        for k, value in enumerate(keepalive):
            for i, (old, new) in scalars:
                if value is old:
                    replaced.append(value)
                    keepalive[k] = new
                    placed.append((k, i))
                    break
    return replaced, placed


class Transition:
    """A rebinding kept to be made again, from the same arrays to the same
    arrays, at the cost of the driver's calls alone: what it did to the
    graph's nodes (the backend's ``plan.change``) and where it left the
    graph's spans, recorded scalars, aligned entries and op rules. Valid
    while the graph's ``epoch`` is the one it was made in (nothing but
    rebindings changed the graph since). It holds no array: spans and
    scalars are named by their index in the graph's lists, and the new
    arrays are given again, by the index of their pair, each time it is
    made."""

    __slots__ = ("epoch", "change", "spans", "scalars", "places")

    def __init__(self, epoch: int, change: Any, spans: list[tuple[int, int, int, int]],
                 scalars: list[tuple[int, int]], places: list[tuple[list, int, int]]):
        self.epoch, self.change = epoch, change
        self.spans = spans        # (index in spans, start, end, index of the pair it now holds)
        self.scalars = scalars    # (index in keepalive, index of the pair it now holds)
        self.places = places      # ([start, end] of a Fixed or Operands entry, start, end)


def transition_of(epoch: int, change: Any, spans: list[list], held: list[tuple[list, int]],
                  scalars: list[tuple[int, int]], moves: list[Move],
                  fixed: list[Fixed] | None,
                  operands: list[Operands] | None) -> Transition | None:
    """The :class:`Transition` of a rebinding just made (``held`` from
    :func:`check_held`, ``scalars`` from :func:`rebind_spans`), or None
    where a new array overlaps memory the graph uses that did not move: its
    nodes then hold pointers into the new array that no move of it made,
    and what the rebinding did depends on more than the arrays on both
    sides."""
    index = {id(span): k for k, span in enumerate(spans)}
    moved = {id(span) for span, _ in held}
    for span in spans:
        if id(span) in moved or span[0] == span[1]:
            continue
        for move in moves:
            if span[0] < move.end + move.shift and move.start + move.shift < span[1]:
                return None
    places = [(where, where[0], where[1])
              for entry in (*(e for e in fixed or () if e.align), *(operands or ()))
              for where in entry.spans]
    return Transition(epoch, change,
                      [(index[id(span)], span[0], span[1], i) for span, i in held],
                      scalars, places)


def redo_transition(transition: Transition, spans: list[list], keepalive: list,
                    news: list[Any]) -> list:
    """Put the graph's ``spans``, scalars and places where ``transition``
    left them, each holding the new object (``news``, by the index of its
    pair in the rebinding that made it); returns the objects let go."""
    replaced = []
    for k, start, end, i in transition.spans:
        span = spans[k]
        replaced.append(span[2])
        span[0], span[1], span[2] = start, end, news[i]
    for k, i in transition.scalars:
        replaced.append(keepalive[k])
        keepalive[k] = news[i]
    for where, start, end in transition.places:
        where[0], where[1] = start, end
    return replaced


def _element_offset(offset: int, shape: tuple[int, ...], strides: tuple[int, ...],
                    itemsize: int) -> bool:
    """Whether ``offset`` bytes past the lowest address of an array of this
    layout falls inside one of its elements (not in a gap between them)."""
    for n, stride in sorted(zip(shape, (abs(s) for s in strides)), key=lambda p: -p[1]):
        if stride == 0 or n == 1:
            continue
        index = min(offset // stride, n - 1)
        offset -= index * stride
    return 0 <= offset < itemsize


def check_held(spans: list[list], pairs: list[tuple[Any, Any]],
               moves: list[Move]) -> list[tuple[list, int]]:
    """The spans each move holds, as ``(span, index of the move)``. Refuses a
    rebinding that would move part of an array the graph uses: one that
    starts inside an old array but reaches past its end, or lies in the gaps
    of a strided old array."""
    held = []
    layouts: dict[int, tuple] = {}
    for entry in spans:
        start, end, obj = entry
        for i, move in enumerate(moves):
            if not move.start <= start < move.end:
                continue
            if end > move.end:
                raise RebindError(
                    f"rebind pair {i}: the graph uses {_describe(obj)}, which starts "
                    "inside the old array but reaches past its end; rebind the array "
                    "that holds it whole")
            held.append((entry, i))
            if start == move.start:
                break  # the first byte of the first element
            layout = layouts.get(i)
            if layout is None:
                shape, dtype, strides = _layout(device_array_of(pairs[i][0]))
                dense = move.end - move.start == math.prod(shape) * dtype.itemsize
                layout = layouts[i] = (dense, shape, strides, dtype.itemsize)
            dense, shape, strides, itemsize = layout
            if not dense and not _element_offset(start - move.start, shape, strides, itemsize):
                raise RebindError(
                    f"rebind pair {i}: the old array is strided, and the graph uses "
                    f"{_describe(obj)} in the gaps between its elements, which is not "
                    "part of it; rebind the array that holds both")
            break
    return held


# ---------------------------------------------------------------- nodes that cannot move

class Fixed:
    """Arrays that nodes of a graph use where numbagraph cannot move them:
    a library's kernels (cuBLAS's) take their addresses inside parameter
    blocks numbagraph does not read. The graph keeps this entry, and with it
    the arrays; a rebinding that would move one of them is refused, since
    the library's nodes would go on using the old memory.

    With ``align``, the nodes can move, but only by a multiple of ``align``
    bytes: a kernel that reads the arrays with 16-byte vector loads faults
    on an address that is not a multiple of 16. Such an entry keeps no
    array (the graph's own spans keep those its nodes use), only where the
    arrays start and end; each graph works on copies of it
    (:func:`fixed_of`), moved as its nodes move."""

    __slots__ = ("what", "arrays", "instead", "align", "spans")

    def __init__(self, what: str, arrays: tuple, instead: str, align: int = 0):
        self.what = what          # the work, as the error names it
        self.instead = instead    # what to do instead, as the error says it
        self.align = align        # bytes a move must be a multiple of; 0: no move
        # [start, end) of the memory the nodes use, from the address they hold.
        self.spans = [list(span(dev)[1:]) for dev in arrays]
        self.arrays = () if align else arrays     # device arrays, kept alive

    def copy(self) -> Fixed:
        """This entry with spans of its own."""
        twin = Fixed(self.what, (), self.instead, self.align)
        twin.arrays = self.arrays
        twin.spans = [list(where) for where in self.spans]
        return twin


class FixedNodesError(RebindError):
    """A rebinding refused because it would move an array a library's nodes
    use (see :class:`Fixed`). Nothing changed."""


def fixed_of(keepalive: list) -> list[Fixed]:
    """The :class:`Fixed` entries among what a graph keeps alive, those with
    an alignment copied, so that rebinding this graph moves its own."""
    return [entry.copy() if entry.align else entry
            for entry in keepalive if type(entry) is Fixed]


def _moves_nodes(move: Move, start: int, end: int, align: int) -> bool:
    """Whether ``move`` moves nodes that use ``[start, end)``: an aligned
    entry's nodes hold its first address, which moves when the move covers
    it; a library's nodes use the whole span, reached by any overlap."""
    if align:
        return move.start <= start < move.end
    return start < move.end and move.start < end


def check_fixed(fixed: list[Fixed], moves: list[Move]) -> None:
    """Refuse ``moves`` when one reaches memory an entry of ``fixed`` names."""
    for entry in fixed:
        for start, end in entry.spans:
            if start == end:
                continue
            for i, move in enumerate(moves):
                if not _moves_nodes(move, start, end, entry.align):
                    continue
                if entry.align and move.shift % entry.align == 0:
                    continue
                if entry.align:
                    raise FixedNodesError(
                        f"rebind pair {i}: the graph's {entry.what} reads this array "
                        f"{entry.align} bytes at a time, and the new array lies "
                        f"{move.shift % entry.align} bytes off that alignment (it moves "
                        f"by {move.shift} bytes); the graph is unchanged. {entry.instead}")
                raise FixedNodesError(
                    f"rebind pair {i}: the graph's {entry.what} uses this array, and "
                    "its kernels hold the array's address where numbagraph cannot "
                    f"move it; the graph is unchanged. {entry.instead}")


def shift_fixed(fixed: list[Fixed], moves: list[Move]) -> None:
    """After ``moves`` were made: the memory of nodes that moved with them
    (entries with an alignment) is where the moves put it."""
    for entry in fixed:
        if not entry.align:
            continue
        for where in entry.spans:
            start, end = where
            for move in moves:
                if start < end and _moves_nodes(move, start, end, entry.align):
                    where[0], where[1] = start + move.shift, end + move.shift
                    break


# ---------------------------------------------------------------- the rules of ops

class Operands:
    """The rule an op applied to the memory of its operands as a capture
    recorded it, kept by the graph so that a rebinding applies it too: the
    op refuses such arrays when called, and its kernels, replayed on them,
    would compute wrong values (issue 33).

    ``IN_PLACE``: each input either shares no memory with the output or is
    the output itself (the same bytes and shape), as threads read each
    element of an input in the thread that writes the same element of the
    output. ``DISJOINT``: no input shares memory with the output (threads
    read what other threads write). The entry holds no array, only where
    the operands lie (``[start, end)``, moved with the graph's nodes) and
    their shapes; each graph works on copies of it (:func:`operands_of`)."""

    IN_PLACE, DISJOINT = "in place", "disjoint"

    __slots__ = ("op", "kind", "names", "shapes", "spans")

    def __init__(self, op: str, kind: str, operands: list[tuple[str, Any, tuple]]):
        self.op = op          # the op, as its errors name it
        self.kind = kind      # IN_PLACE or DISJOINT
        # The output first, then the inputs: names, shapes as read, spans.
        self.names = tuple(name for name, _, _ in operands)
        self.shapes = tuple(tuple(shape) for _, _, shape in operands)
        self.spans = [list(span(dev)[1:]) for _, dev, _ in operands]

    def copy(self) -> Operands:
        """This entry with spans of its own."""
        twin = Operands(self.op, self.kind, [])
        twin.names, twin.shapes = self.names, self.shapes
        twin.spans = [list(where) for where in self.spans]
        return twin

    def _key(self) -> tuple:
        return self.op, self.kind, self.names, self.shapes, tuple(map(tuple, self.spans))


def operands_of(keepalive: list) -> list[Operands]:
    """Copies of the :class:`Operands` entries among what a graph keeps
    alive, one per distinct rule (a loop's passes record the same one many
    times), for this graph's rebindings to move."""
    found: dict[tuple, Operands] = {}
    for entry in keepalive:
        if type(entry) is Operands:
            found.setdefault(entry._key(), entry)
    return [entry.copy() for entry in found.values()]


def _moved(start: int, moves: list[Move]) -> int | None:
    """The index of the move that takes the span starting at ``start``
    (rebinding moves each span with the array holding its first byte)."""
    for i, move in enumerate(moves):
        if move.start <= start < move.end:
            return i
    return None


def check_operands(rules: list[Operands], moves: list[Move]) -> None:
    """Refuse ``moves`` when, after them, the operands of an op recorded in
    the graph would break the rule the op applies to them when called."""
    for rule in rules:
        by = [None if start == end else _moved(start, moves) for start, end in rule.spans]
        if all(i is None for i in by):
            continue  # as recorded, where the op accepted them
        placed = [(start, end) if i is None else (start + moves[i].shift, end + moves[i].shift)
                  for (start, end), i in zip(rule.spans, by)]
        out_lo, out_hi = placed[0]
        for k in range(1, len(placed)):
            lo, hi = placed[k]
            if lo == hi or out_lo == out_hi or hi <= out_lo or out_hi <= lo:
                continue
            if (rule.kind == Operands.IN_PLACE and (lo, hi) == (out_lo, out_hi)
                    and rule.shapes[k] == rule.shapes[0]):
                continue
            _refuse(rule, k, by)


def _refuse(rule: Operands, k: int, by: list[int | None]) -> None:
    name, out, op = rule.names[k], rule.names[0], rule.op
    pairs = sorted({i for i in (by[0], by[k]) if i is not None})
    which = f"pair{'s' if len(pairs) > 1 else ''} {' and '.join(map(str, pairs))}"
    if rule.kind == Operands.IN_PLACE:
        why = (f"{name} of the graph's {op} would share memory with {out} without being "
               f"{out} itself ({name} has shape {rule.shapes[k]}, {out} "
               f"{rule.shapes[0]}): threads would read elements of {name} that others "
               f"have already written, and {op} refuses such operands when called. "
               f"Rebind {name} to {out} itself or to memory of its own")
    else:
        why = (f"{out} of the graph's {op} would overlap {name}: {op}, as recorded, "
               f"needs an output that shares no memory with its inputs. Rebind them "
               "to memory of their own")
    raise OperandsError(f"rebind {which}: after this rebinding, {why}, or capture the "
                        "work again; the graph is unchanged")


def shift_operands(rules: list[Operands], moves: list[Move]) -> None:
    """After ``moves`` were made: each rule's operands where the moves put
    them."""
    for rule in rules:
        for where in rule.spans:
            if where[0] < where[1]:
                i = _moved(where[0], moves)
                if i is not None:
                    where[0] += moves[i].shift
                    where[1] += moves[i].shift


class OperandsError(RebindError):
    """A rebinding refused because, after it, an op recorded in the graph
    would be given operands it refuses when called (see :class:`Operands`).
    Nothing changed."""
