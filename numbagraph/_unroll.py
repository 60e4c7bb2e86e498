"""Unrolled passes of a device loop: several passes of a loop's body in one
iteration of its while node, each pass after the first skipped on the
device once the loop has stopped.

A while node costs the GPU a few microseconds per iteration whatever its
body holds, so a loop of small passes runs several of them per iteration.
The passes are recorded by calling the pass function again; the loop's
state (an int32 pair on the device) says how many passes of the current
iteration may run: its kernels set it from the counter and the limit, and a
kernel that stops the loop (``ng.set_condition(loop.cond, 0)``) lowers it to
its own pass. Every kernel of pass ``p > 1`` is launched through a guard: a
kernel compiled from the launched kernel's Python function that returns at
once unless ``p`` may run. Kernels that read the counter in pass ``p`` read
the counter's value for that pass, which the loop's kernels keep in a slot
of their own: the counter itself moves once per iteration.

Rules: a pass recorded more than once holds kernel launches only (a copy, a
fill, a library's work or a nested block could not be skipped), and no
kernel of a pass writes the loop's counter.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
from numba import cuda

from . import _registry
from .backend import active as _backend
from .conditional import _blocks_for, set_condition

__all__ = ["MAX_UNROLL", "PassRecording", "guard_for", "held_launch", "pass_guarded",
           "recording_passes"]

MAX_UNROLL = 64
"""The most passes one iteration of an unrolled loop records."""

# ---------------------------------------------------------------- device side


@cuda.jit(device=True)
def _fill(start, limit, by, slots, cap):
    """The counter's value before each of the next passes (up to ``cap``)
    into ``slots``; returns how many passes may run: while the counter is
    below its limit and has not failed to move forward (the pass whose step
    wraps around or does not change it is the last)."""
    c = start
    n = 0
    while n < cap and c < limit:
        slots[n] = c
        n += 1
        after = c + by
        if after <= c:
            break
        c = after
    return n


@cuda.jit
def _enter(counter, until, by, slots, state, cond):
    if cuda.grid(1) == 0:
        n = _fill(counter[0], until, by, slots, slots.size)
        state[0] = n
        state[1] = 0
        set_condition(cond, n > 0)


@cuda.jit
def _enter_scalar(counter, until, by, slots, state, cond):
    if cuda.grid(1) == 0:
        n = _fill(counter[0], until[0], by, slots, slots.size)
        state[0] = n
        state[1] = 0
        set_condition(cond, n > 0)


@cuda.jit(device=True)
def _next(counter, limit, by, slots, state, k, cond):
    ran = min(state[0], k)
    before = slots[ran - 1]
    c = before + by
    counter[0] = c
    if state[1] != 0 or ran < k or c <= before:
        set_condition(cond, 0)
        return
    n = _fill(c, limit, by, slots, k)
    state[0] = n
    if n == 0:
        set_condition(cond, 0)


@cuda.jit
def _iteration_end(counter, until, by, slots, state, k, cond):
    """After the last pass of an iteration: the counter moves past the passes
    that ran; the loop ends if it stopped or ran out, else the next
    iteration's passes are worked out."""
    if cuda.grid(1) == 0:
        _next(counter, until, by, slots, state, k, cond)


@cuda.jit
def _iteration_end_scalar(counter, until, by, slots, state, k, cond):
    if cuda.grid(1) == 0:
        _next(counter, until[0], by, slots, state, k, cond)


@cuda.jit(device=True)
def _single(counter, limit, by, state, cond):
    before = counter[0]
    counter[0] += by
    after = counter[0]
    if state[1] != 0 or after <= before or not after < limit:
        set_condition(cond, 0)


@cuda.jit
def _pass_end(counter, until, by, state, cond):
    """After the one pass of an iteration (an unrolled loop that records its
    pass once): the counter moves on from where the pass left it."""
    if cuda.grid(1) == 0:
        _single(counter, until, by, state, cond)


@cuda.jit
def _pass_end_scalar(counter, until, by, state, cond):
    if cuda.grid(1) == 0:
        _single(counter, until[0], by, state, cond)


def enter_kernel(scalar_until: bool) -> Any:
    return _enter_scalar if scalar_until else _enter


def end_kernel(scalar_until: bool, passes: int) -> Any:
    if passes == 1:
        return _pass_end_scalar if scalar_until else _pass_end
    return _iteration_end_scalar if scalar_until else _iteration_end


# ---------------------------------------------------------------- guards

_guards: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()
_guard_kernels: "weakref.WeakSet[Any]" = weakref.WeakSet()
_guards_lock = threading.Lock()

# Options of a kernel that its guard and the device function inside keep.
_KEPT_OPTIONS = ("fastmath", "debug", "lineinfo", "opt")


def _options(kernel: Any) -> dict:
    found = getattr(kernel, "targetoptions", None)
    if found is None:  # the simulator's kernels
        found = {"fastmath": getattr(kernel, "_fastmath", False),
                 "debug": getattr(kernel, "_debug", False)}
    return {key: found[key] for key in _KEPT_OPTIONS if key in found}


def guard_for(kernel: Any, nargs: int) -> Any:
    """The guard of ``kernel`` for ``nargs`` arguments: a kernel taking the
    loop's state and a pass number before them, that runs ``kernel``'s
    Python function (compiled as a device function) only when the pass may
    run, and returns at once otherwise."""
    with _guards_lock:
        per_kernel = _guards.get(kernel)
        if per_kernel is None:
            per_kernel = _guards[kernel] = {}
        guard = per_kernel.get(nargs)
        if guard is not None:
            return guard
        function = getattr(kernel, "py_func", None)
        if function is None:
            raise TypeError(f"{kernel!r} has no Python function to guard")
        options = _options(kernel)
        inner = cuda.jit(device=True, **options)(function)
        names = ", ".join(f"a{i}" for i in range(nargs))
        name = function.__name__ if function.__name__.isidentifier() else "kernel"
        source = (f"def {name}(loop_state, loop_pass{', ' if names else ''}{names}):\n"
                  f"    if loop_pass <= loop_state[0]:\n"
                  f"        inner({names})\n")
        namespace: dict[str, Any] = {"inner": inner}
        exec(compile(source, f"<guard of {name}>", "exec"), namespace)
        guard = cuda.jit(**options)(namespace[name])
        per_kernel[nargs] = guard
        _guard_kernels.add(guard)
        return guard


# ---------------------------------------------------------------- recording

class PassRecording:
    """One pass of an unrolled loop being recorded: which pass, the loop's
    state and counter slots, and the launches counted so far."""

    __slots__ = ("session", "index", "state", "slots", "counter", "launches", "guarded",
                 "blocks", "depth")

    def __init__(self, session: Any, state: Any, slots: Any, counter: Any):
        self.session = session
        self.state, self.slots, self.counter = state, slots, counter
        self.index = 1
        self.launches = 0
        self.guarded = False
        # The conditional blocks open as the pass records (the loop's own
        # innermost): a launch inside a block the pass opens is that block's
        # work, which the block's node stands for in the pass.
        self.blocks = _blocks_for(session).stack
        self.depth = len(self.blocks)

    def swap(self, kernel: Any, args: tuple) -> tuple | None:
        """The kernel and arguments a launch in this pass records instead,
        or None to record it as it is."""
        if kernel in _guard_kernels or len(self.blocks) != self.depth:
            return None
        self.launches += 1
        if not self.guarded:
            return None
        counter, index = self.counter, self.index
        slot = None
        moved = []
        for arg in args:
            if arg is counter or arg is counter._dev:
                if slot is None:
                    slot = self.slots[index - 1:index]
                arg = slot
            moved.append(arg)
        return guard_for(kernel, len(args)), (self.state, np.int32(index), *moved)


# session -> the pass it records now
_passes: dict[Any, PassRecording] = {}
_passes_lock = threading.Lock()


def _hook(handle: int, kernel: Any, args: tuple) -> tuple | None:
    """The launch guard the backend calls while a pass records: launches on
    the streams of that pass's capture (forked ones too) are counted, and
    swapped for their guard in a guarded pass."""
    session = _registry.on(handle)
    recording = _passes.get(session) if session is not None else None
    return None if recording is None else recording.swap(kernel, args)


def pass_guarded(session: Any) -> bool:
    """Whether a guarded pass records in ``session`` now: its launches are
    swapped for their guards."""
    recording = _passes.get(session)
    return recording is not None and recording.guarded


def held_launch(session: Any) -> None:
    """The launch just recorded in the pass recording in ``session`` (if
    any) must stay one node, which a pass repeated per iteration would not
    be (a device-updatable kernel node): it counts as a node other than a
    kernel launch, so the loop records one pass per iteration."""
    recording = _passes.get(session)
    if recording is not None and recording.launches:
        recording.launches -= 1


class recording_passes:
    """``with recording_passes(pass_):`` launches on ``pass_``'s capture
    are counted, and guarded once ``pass_.guarded`` is set."""

    def __init__(self, recording: PassRecording):
        self.recording = recording
        # The pass of an enclosing loop this one records inside, if any.
        self.outer: PassRecording | None = None

    def __enter__(self) -> PassRecording:
        with _passes_lock:
            self.outer = _passes.get(self.recording.session)
            _passes[self.recording.session] = self.recording
            _backend.set_launch_guard(_hook)
        return self.recording

    def __exit__(self, *exc_info: Any) -> None:
        with _passes_lock:
            if self.outer is not None:
                _passes[self.recording.session] = self.outer
            else:
                _passes.pop(self.recording.session, None)
            if not _passes:
                _backend.set_launch_guard(None)
