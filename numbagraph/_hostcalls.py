"""Host callbacks as plain data: which threads run one now, and the first
error one raised, kept until a graph launch or a wait for the device
reports it.

A host callback (:mod:`numbagraph.host`) runs on a thread that cannot take its
exception (the driver's own, on the GPU) and must not call CUDA. Each runs
between :func:`enter` and :func:`leave`, and what it raises goes to
:func:`keep`. Entry points that would call CUDA ask :func:`refuse_here`
first; those that launch a graph or wait for the device ask :func:`report`.
``attention[0]`` is non-zero while either can matter (a callback runs on
some thread, or an error is kept): hot paths read it and nothing else.
"""

from __future__ import annotations

import threading

from .errors import CudaInHostCallbackError, HostCallbackError

__all__ = ["attention", "enter", "leave", "running", "refuse_here", "keep", "report"]

attention = [0]
"""Callbacks running now, on every thread, plus one while an error is kept."""

_local = threading.local()
_lock = threading.Lock()
# The first error kept, and what raised it: (exception, callback name).
_kept: list[tuple[BaseException, str]] = []
# Errors raised since the first was kept, which are dropped.
_dropped = [0]


def enter(name: str) -> None:
    """The callback ``name`` starts on this thread."""
    names = getattr(_local, "names", None)
    if names is None:
        names = _local.names = []
    names.append(name)
    with _lock:
        attention[0] += 1


def leave() -> None:
    """The callback this thread entered last has returned."""
    with _lock:
        attention[0] -= 1
    _local.names.pop()


def running() -> str | None:
    """The name of the callback this thread runs now, or None."""
    names = getattr(_local, "names", None)
    return names[-1] if names else None


def refuse_here(operation: str) -> None:
    """Refuse ``operation``, which calls CUDA, when this thread runs a host
    callback: CUDA forbids its calls there."""
    name = running()
    if name is not None:
        raise CudaInHostCallbackError(
            f"{operation} inside the host callback {name}: CUDA forbids any of its "
            "calls in a host function (the driver may wait for the callback that "
            "made the call, and never return), so numbagraph refused it before the "
            "driver saw it. A callback may read host memory (HostScalar.value, "
            "NumPy arrays) and do host work; enqueue CUDA work from the thread that "
            "launches the graph instead")


def keep(error: BaseException, name: str) -> None:
    """Keep ``error``, raised by the callback ``name``, for :func:`report`;
    only the first is kept until reported, later ones are counted."""
    with _lock:
        if _kept:
            _dropped[0] += 1
            return
        _kept.append((error, name))
        attention[0] += 1


def report(operation: str) -> None:
    """Raise the kept error, if any, as a HostCallbackError from it, and
    forget it; ``operation`` is what raises it."""
    with _lock:
        if not _kept:
            return
        error, name = _kept.pop()
        dropped, _dropped[0] = _dropped[0], 0
        attention[0] -= 1
    more = (f"; {dropped} later callback error(s) were raised before this report "
            "and dropped") if dropped else ""
    raise HostCallbackError(
        f"the host callback {name} raised {type(error).__name__}: {error}{more}. "
        f"It ran earlier, in stream order, on a thread that cannot take the "
        f"exception, so {operation} raises it; the work around the callback ran "
        "as recorded") from error
