"""What a graphed function reaches besides its arguments.

A graph's nodes hold addresses, not names: an array a function uses through
its closure and is also given as an argument puts the same addresses in
both kinds of node, and a rebinding, which moves every node pointing into
the argument's old memory, would move the function's own uses with it.
``reached`` lists the device arrays and DeviceScalars a function reaches
other than through its arguments, with how it reaches them, so that such a
rebinding is refused (``shared``) and the call captured again.
"""

from __future__ import annotations

import dis
import functools
import types
from typing import Any, Callable, Iterator, Sequence

from ._rebind import device_array_of, span
from .backend import active as _backend
from .errors import RebindError
from .scalar import DeviceScalar

__all__ = ["Reached", "reached", "shared", "Shared"]

# (start, end, how the function reaches the memory: "'w' (its closure)")
Reached = tuple[int, int, str]

_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
# Functions wrapping others are followed this deep (decorators, partials).
_DEPTH = 8


class Shared(RebindError):
    """A rebinding refused: an argument's old array is memory the function
    also reaches another way, whose nodes would move with it."""


@functools.lru_cache(maxsize=512)
def _loaded(code: types.CodeType, loads: frozenset[str]) -> frozenset[str]:
    """The names ``code``, and the code nested in it, load by one of the
    instructions ``loads`` (code never changes: read once)."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in loads}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _loaded(const, loads)
    return frozenset(names)


def _unused_defaults(fn: Any, code: types.CodeType, nargs: int,
                     keywords: Sequence[str]) -> Iterator[tuple[str, Any]]:
    """The defaults a call with ``nargs`` positional arguments and
    ``keywords`` leaves in place, by parameter name."""
    defaults = getattr(fn, "__defaults__", None) or ()
    positional = code.co_varnames[:code.co_argcount]
    first = len(positional) - len(defaults)
    for name, value in zip(positional[first:], defaults):
        if positional.index(name) >= nargs and name not in keywords:
            yield name, value
    for name, value in (getattr(fn, "__kwdefaults__", None) or {}).items():
        if name not in keywords:
            yield name, value


def _sources(fn: Any, nargs: int, keywords: Sequence[str],
             depth: int = 0) -> Iterator[tuple[str, str, Any]]:
    """``(name, where, value)`` of each value ``fn`` reaches besides its
    arguments: the arguments a partial binds, the attributes of a bound
    method's instance its code reads, and for plain functions (the one a
    decorator wraps too) closure cells, unused defaults and the globals
    their code loads."""
    if depth > _DEPTH:
        return
    if isinstance(fn, functools.partial):
        yield from ((f"argument {i}", "bound by a partial", v) for i, v in enumerate(fn.args))
        yield from ((repr(k), "bound by a partial", v) for k, v in fn.keywords.items())
        yield from _sources(fn.func, nargs + len(fn.args), [*keywords, *fn.keywords],
                            depth + 1)
        return
    function = getattr(fn, "__func__", fn)
    code = getattr(function, "__code__", None)
    owner = getattr(fn, "__self__", None)
    if isinstance(code, types.CodeType) and owner is not None:
        # A bound method's instance: the attributes its code reads.
        attributes = getattr(owner, "__dict__", None) or {}
        for name in sorted(_loaded(code, _ATTRIBUTE_LOADS)):
            if name in attributes:
                yield f"self.{name}", "", attributes[name]
    if isinstance(code, types.CodeType):
        cells = getattr(function, "__closure__", None) or ()
        for name, cell in zip(code.co_freevars, cells):
            try:
                yield repr(name), "its closure", cell.cell_contents
            except ValueError:  # a cell not yet filled
                continue
        # A bound method's instance is its first positional argument.
        given = nargs + (function is not fn)
        for name, value in _unused_defaults(function, code, given, keywords):
            yield repr(name), "a default", value
        module = getattr(function, "__globals__", None) or {}
        for name in sorted(_loaded(code, _GLOBAL_LOADS)):
            if name in module:
                yield repr(name), "a global", module[name]
    wrapped = getattr(function, "__wrapped__", None)
    if wrapped is not None:
        yield from _sources(wrapped, nargs, keywords, depth + 1)


def _arrays(value: Any) -> Iterator[tuple[str, Any]]:
    """The value, or each item of a tuple, list or dict value, that is one
    of numba's device arrays or a DeviceScalar; another library's array is
    not converted here, where its stream may be waited for."""
    kinds = (*_backend.DEVICE_ARRAY_TYPES, DeviceScalar)
    if isinstance(value, kinds):
        yield "", value
    elif isinstance(value, (tuple, list)):
        yield from ((f"[{i}]", v) for i, v in enumerate(value) if isinstance(v, kinds))
    elif isinstance(value, dict):
        yield from ((f"[{k!r}]", v) for k, v in value.items() if isinstance(v, kinds))


def reached(fn: Callable[..., Any], nargs: int = 0,
            keywords: Sequence[str] = ()) -> list[Reached]:
    """``(start, end, how)`` of each device array and DeviceScalar ``fn``,
    called with ``nargs`` positional arguments and ``keywords``, reaches
    other than through its arguments, as it is now. What it reaches
    through another function it calls is not seen."""
    found = []
    for name, where, value in _sources(fn, nargs, keywords):
        for item, array in _arrays(value):
            dev = device_array_of(array)
            if dev is None:
                continue
            _, start, end = span(dev)
            if end > start:
                how = f"{name}{item}" + (f" ({where})" if where else "")
                found.append((start, end, how))
    return found


def shared(reached: Sequence[Reached], moves: Sequence[Any], positions: Sequence[int],
           names: Callable[[int], str], fn_name: str) -> Shared | None:
    """The refusal of moves (``Move``, of the arguments at ``positions``)
    one of which moves memory the function reaches another way; None
    where none does."""
    for move, i in zip(moves, positions):
        for start, end, how in reached:
            if move.start < end and start < move.end:
                return Shared(
                    f"argument {names(i)} of {fn_name}() was bound to memory the "
                    f"function also reaches as {how}: a rebinding to this call's array "
                    "would move the function's own uses of that memory too, so "
                    f"{fn_name}() is captured again instead. Give the function that "
                    "array one way only, as an argument of every call or not at all")
    return None
