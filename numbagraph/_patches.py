"""Everything numbagraph changes in numba, installed in one place.

numbagraph cannot own numba's entry points, so it changes a few of them as
it is imported: every kernel launch passes through
:func:`numbagraph.safety.on_launch`; the calls a capture cannot record are
checked first (:data:`numbagraph.safety.CHECKS`); and, on the simulator,
streams get handles and launches are recorded. :func:`table` lists every
change, what it is for, and the numba-cuda versions it was checked against;
:func:`install` makes them, once. ``tests/test_patches.py`` compares the
table with what is changed in numba.

Code that bound one of these functions before numbagraph was imported
(``from numba.cuda import to_device``) keeps numba's own; the driver's error
is then translated when the capture ends.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from numba import cuda

from . import _hostcalls, safety
from ._graphmem import held as _held
from ._registry import sessions as _sessions
from ._registry import unsafe_call
from .backend import active as _backend
from .backend.interface import Patch

__all__ = ["Patch", "table", "install", "installed"]

# (id(owner), name) -> [(row, its replacement)], in the order installed: what
# install() changed, for installed() and a second call.
_made: dict[tuple[int, str], list[tuple[Patch, Any]]] = {}


def _guarded(check: safety.Check) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        before, after, instead, memory = check.check, check.after, check.instead, check.memory
        in_kernel = _backend.in_kernel
        host = _hostcalls.attention
        operation = f"{getattr(original, '__qualname__', 'a numba call')}()"

        # Hot path: with no capture in progress, no graph-owned memory and
        # no host callback running, lists and a dict tested, then numba.
        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if host[0]:
                _hostcalls.refuse_here(operation)
            if memory is not None and _held[0]:
                memory(*args, **kwargs)
            if _sessions:
                if instead is not None:
                    made = instead(*args, **kwargs)
                    if made is not None:
                        return made
                before(*args, **kwargs)
                result = original(*args, **kwargs)
                if after is not None:
                    after(*args, **kwargs)
                return result
            return original(*args, **kwargs)

        if not check.unsafe:
            return guarded

        # The check and the call are one unsafe call: no "global" capture
        # begins between them. Inside a simulated kernel an array's element
        # is device memory, read by no driver call. A host callback is
        # refused first: it must not wait for a capture that begins.
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if in_kernel():
                return original(*args, **kwargs)
            if host[0]:
                _hostcalls.refuse_here(operation)
            with unsafe_call:
                return guarded(*args, **kwargs)

        if not check.waits:
            return counted

        # Once the device's work is waited for, the callbacks in it have run:
        # what one raised is raised here.
        @functools.wraps(original)
        def waited(*args: Any, **kwargs: Any) -> Any:
            result = counted(*args, **kwargs)
            if host[0]:
                _hostcalls.report(operation)
            return result

        return waited

    return make


def _same_function(a: Any, b: Any) -> bool:
    # Replacements keep the module and name of what they replace.
    return (a is not None and b is not None
            and (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__))


def _owners(kind: str, name: str) -> tuple[Any, ...]:
    """The classes or modules that have the entry point ``name`` of ``kind``."""
    if kind == "function":
        # numba.cuda re-exports numba.cuda.api's functions on the driver: both
        # names are changed, so that either spelling is checked.
        api = sys.modules.get("numba.cuda.api")
        owners = [cuda]
        if api is not None and api is not cuda and _same_function(
                getattr(api, name, None), getattr(cuda, name, None)):
            owners.append(api)
        return tuple(o for o in owners if getattr(o, name, None) is not None)
    classes = {"array": tuple(_backend.DEVICE_ARRAY_TYPES),
               "stream": (_backend.STREAM_TYPE,), "event": (_backend.EVENT_TYPE,)}[kind]
    # A class is changed where it defines the method itself.
    return tuple(cls for cls in classes if name in vars(cls))


def _guard_rows() -> list[Patch]:
    return [
        Patch(owner, name, _guarded(check), f"capture check: {check.why}")
        for kind, checks in safety.CHECKS.items()
        for name, check in checks.items()
        for owner in _owners(kind, name)
    ]


def table() -> tuple[Patch, ...]:
    """Every change numbagraph makes to numba on the backend in use, in the
    order they are made (a later row on the same target wraps an earlier)."""
    return (*_backend.numba_patches(safety.on_launch), *_guard_rows())


def _current(owner: Any, name: str) -> Any:
    """``owner.name`` as the owner itself holds it (a class's own attribute,
    not one it inherits), or None."""
    return vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)


def installed() -> list[tuple[Patch, bool]]:
    """Each row of :func:`table`, and whether its change is in place now:
    made by :func:`install`, and the outermost change on its target is what
    numba has."""
    result, position = [], {}
    for row in table():
        key = (id(row.owner), row.name)
        k = position[key] = position.get(key, -1) + 1
        made = _made.get(key, [])
        result.append((row, k < len(made) and made[k][0].target == row.target
                       and _current(row.owner, row.name) is made[-1][1]))
    return result


def install() -> None:
    """Make every change of :func:`table`, once: calling it again changes
    nothing. Raises ImportError, naming it, when numba lacks a target."""
    targets: dict[tuple[int, str], list[Patch]] = {}
    for row in table():
        targets.setdefault((id(row.owner), row.name), []).append(row)
    for key, rows in targets.items():
        if key in _made:
            continue
        owner, name = rows[0].owner, rows[0].name
        current = _current(owner, name)
        if current is None and not name.startswith("__"):
            raise ImportError(
                f"numbagraph changes {rows[0].target}, which this numba-cuda does "
                f"not have (checked against numba-cuda {', '.join(rows[0].checked)}); "
                "install a checked version"
            )
        made = []
        for row in rows:
            current = row.make(current)
            made.append((row, current))
        setattr(owner, name, current)
        _made[key] = made
