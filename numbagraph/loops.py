"""Replay loops run by the graph itself: counters it advances, and a loop
that runs its body until a counter reaches a limit or a kernel stops it.

``ng.increment(pos, by=1)`` records ``pos += by`` into the capture, so that
each launch moves ``pos`` on with no update from the host.
``with ng.repeat(pos, until=n):`` records a while loop that runs its body
while ``pos < n``, adding ``by`` to ``pos`` after each pass; a kernel in the
body ends it early with ``ng.set_condition(loop.cond, 0)``. One launch then
runs the whole loop, a decode to its end token or a time stepper to its last
step, and ``pos`` says afterwards how far it went.
"""

from __future__ import annotations

import math
import threading
import numbers
from typing import Any, Callable, Literal

import numpy as np
from numba import cuda

from . import _forks, _registry, _unroll
from .backend import active as _backend
from .conditional import Condition, ConditionalBlock, _body_graphs, set_condition, while_loop
from .errors import ConditionalError, ScalarValueError
from .scalar import DeviceScalar

__all__ = ["increment", "repeat", "RepeatLoop", "stop_when", "MAX_UNROLL"]

MAX_UNROLL = _unroll.MAX_UNROLL
"""The most passes per iteration [repeat][numbagraph.repeat] records
(``unroll=``)."""

# What picks ``unroll="auto"``: a while node's iteration costs the GPU about
# ITERATION_US of its own (the node, and the kernel that ends the iteration),
# a kernel node of a pass about KERNEL_US; a pass of n kernels is unrolled
# until the iteration's own cost is at most AUTO_SHARE of a pass, at most
# AUTO_MAX times (docs/benchmarks: "Device loops").
ITERATION_US = 5.5
KERNEL_US = 1.0
AUTO_SHARE = 0.2
AUTO_MAX = 16


def auto_passes(kernels: int) -> int:
    """The passes per iteration ``unroll="auto"`` records for a pass of
    ``kernels`` kernel launches."""
    wanted = math.ceil(ITERATION_US / (AUTO_SHARE * KERNEL_US * max(kernels, 1)))
    return max(1, min(AUTO_MAX, wanted))


def _check_unroll(unroll: Any) -> Any:
    if isinstance(unroll, str) and unroll == "auto":
        return unroll
    if isinstance(unroll, bool) or not isinstance(unroll, numbers.Integral) \
            or not 1 <= int(unroll) <= MAX_UNROLL:
        raise ValueError(
            f"ng.repeat: unroll={unroll!r} must be 'auto' or a whole number of passes "
            f"per iteration from 1 to {MAX_UNROLL}")
    return int(unroll)


@cuda.jit
def _add(x, by):
    """x[0] += by, on one thread."""
    if cuda.grid(1) == 0:
        x[0] += by


@cuda.jit
def _enter_below(counter, until, cond):
    """cond = counter[0] < until (a number)."""
    if cuda.grid(1) == 0:
        set_condition(cond, counter[0] < until)


@cuda.jit
def _enter_below_scalar(counter, until, cond):
    """cond = counter[0] < until[0] (a DeviceScalar)."""
    if cuda.grid(1) == 0:
        set_condition(cond, counter[0] < until[0])


@cuda.jit
def _pass_below(counter, by, until, cond):
    """counter[0] += by; the loop ends once counter[0] < until no longer
    holds, or once the counter failed to move forward (an integer that
    wrapped around, a float too large to change). Never sets cond to 1: a
    kernel of the body may have ended the loop."""
    if cuda.grid(1) == 0:
        before = counter[0]
        counter[0] += by
        after = counter[0]
        if after <= before or not after < until:
            set_condition(cond, 0)


@cuda.jit
def _pass_below_scalar(counter, by, until, cond):
    if cuda.grid(1) == 0:
        before = counter[0]
        counter[0] += by
        after = counter[0]
        if after <= before or not after < until[0]:
            set_condition(cond, 0)


@cuda.jit
def _stop_below(value, limit, cond):
    """End the loop when value[0] < limit."""
    if cuda.grid(1) == 0 and value[0] < limit:
        set_condition(cond, 0)


@cuda.jit
def _stop_above(value, limit, cond):
    """End the loop when value[0] > limit."""
    if cuda.grid(1) == 0 and value[0] > limit:
        set_condition(cond, 0)


def _step_for(counter: Any, by: Any, what: str, forward: bool = False) -> Any:
    """``by`` checked for ``counter``: a number its dtype holds exactly (and,
    ``forward``, above zero)."""
    if not isinstance(counter, DeviceScalar):
        raise TypeError(f"{what} takes a DeviceScalar counter, not {type(counter).__name__}")
    dtype = np.dtype(counter.dtype)
    if dtype.kind not in "iuf":
        raise ScalarValueError(
            f"{what}: a {dtype.name} DeviceScalar cannot be advanced; use an integer "
            "or float DeviceScalar as a counter")
    if isinstance(by, bool) or not isinstance(by, numbers.Real):
        raise ScalarValueError(f"{what}: by={by!r} is not a number")
    if not math.isfinite(by) or (forward and not float(by) > 0):
        raise ScalarValueError(
            f"{what}: by={by!r} must be a finite number"
            + (" above zero: the loop runs while the counter climbs to its limit"
               if forward else ""))
    try:
        # Typed as the counter, so that the kernel adds in its dtype.
        return dtype.type(counter._check(by))
    except ScalarValueError as exc:
        raise ScalarValueError(f"{what}: by={by!r}: {exc}") from exc


def increment(counter: DeviceScalar, by: Any = 1, *, stream: Any = None) -> None:
    """Add ``by`` to ``counter`` on the device, in stream order.

    In a capture on ``stream`` the increment is recorded: every launch of
    the graph advances the counter, with no update from the host. Outside a
    capture it runs at once. Integers wrap around as C integers do on
    overflow; floats round.

    Parameters
    ----------
    counter
        An integer or float DeviceScalar.
    by
        The step, a number the counter's dtype holds.
    stream
        The stream to record or run it on; the counter's stream by default.

    Raises
    ------
    TypeError
        ``counter`` is not a DeviceScalar, or ``stream`` not a stream.
    ScalarValueError
        ``by`` does not fit the counter's dtype, or the counter is a bool.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        step[4, 256, s](x, pos)
        ng.increment(pos)            # each launch reads pos, then moves it on
    for _ in range(3):
        cap.graph.launch()           # pos: 0, 1, 2 -> 3
    ```
    """
    step = _step_for(counter, by, "ng.increment")
    stream = counter.stream if stream is None else stream
    handle = _backend.stream_handle(stream)
    _add[1, 1, _backend.as_numba_stream(stream)](counter, step)
    if _registry.sessions and _registry.on(handle) is None:
        counter._warn_if_meant_for_a_capture(f"ng.increment(by={by!r})", stream)


class RepeatLoop:
    """A loop recorded by [repeat][numbagraph.repeat]: open it with ``with``
    (its block is the pass), or call it with a function that records one
    pass (``loop(fn)``, or ``@ng.repeat(...)`` above the function), which
    lets it record several passes per iteration.

    ``cond`` is the loop's [Condition][numbagraph.Condition], made when the
    loop is recorded (None before): a kernel of the pass given it ends the
    loop after the current pass with ``ng.set_condition(cond, 0)``.
    ``unroll`` is the number of passes each iteration of its while node
    records, once recorded (None before). A loop records once.
    """

    def __init__(self, counter: DeviceScalar, until: Any, by: Any, stream: Any,
                 body: Any = None, unroll: Any = "auto"):
        self._asked = _check_unroll(unroll)
        self.unroll: int | None = None
        self._step = _step_for(counter, by, "ng.repeat", forward=True)
        dtype = np.dtype(counter.dtype)
        if isinstance(until, DeviceScalar):
            # Compared in the counter's own type on the device: a mixed pair
            # (uint64 with int64) would be compared as floats.
            if np.dtype(until.dtype) != dtype:
                raise ScalarValueError(
                    f"ng.repeat: until is a {np.dtype(until.dtype).name} DeviceScalar and "
                    f"the counter {dtype.name}; give until the counter's dtype")
        elif isinstance(until, bool) or not isinstance(until, numbers.Real):
            raise TypeError(
                f"ng.repeat: until={until!r} must be a number or a DeviceScalar")
        else:
            if math.isnan(until):
                raise ScalarValueError("ng.repeat: until is NaN, which no counter reaches")
            try:
                until = dtype.type(counter._check(until))
            except ScalarValueError as exc:
                raise ScalarValueError(
                    f"ng.repeat: until={until!r} is not a value the counter can reach: "
                    f"{exc}") from exc
        self.counter, self.until = counter, until
        self._stream = counter.stream if stream is None else stream
        self.cond: Condition | None = None
        # Claimed by the first thread to record it: a loop records once.
        self._claim = threading.Lock()
        self._block: ConditionalBlock | None = None
        # The captured graph each pass starts with (body=), if any; checked
        # before the loop records anything.
        self._body = _body_graphs(body, 1, "ng.repeat")[0]

    def _check_place(self) -> tuple[int, Any]:
        """The capture stream's handle and session, once sure a loop may be
        recorded there; refused before anything is recorded."""
        if not self._claim.acquire(blocking=False):
            raise ConditionalError(
                "this ng.repeat loop was recorded already; each records once: call "
                "ng.repeat(...) again for another loop")
        try:
            return self._place()
        except BaseException:
            self._claim.release()  # nothing was recorded: the loop may try again
            raise

    def _place(self) -> tuple[int, Any]:
        s = self._stream
        # A while loop records on the capture's own stream, once every
        # stream forked into it is joined back.
        handle = _backend.stream_handle(s)
        session = _registry.on(handle)
        if session is not None:
            if _registry.key_of(handle) in session.forks:
                raise ConditionalError(
                    f"ng.repeat on {s!r}, a stream forked into the capture on "
                    f"{session.stream!r}: a loop records the work of the capture's own "
                    f"stream; open it on {session.stream!r} (stream=) and fork inside "
                    "its body. Nothing was recorded; the capture goes on")
            _forks.guard_restart(session, "ng.repeat")
        return handle, session

    def __enter__(self) -> "RepeatLoop":
        if self._asked not in (1, "auto"):
            raise ConditionalError(
                f"ng.repeat(unroll={self._asked}) records its pass {self._asked} times per "
                "iteration, which a `with` block cannot do (its body runs once). Write the "
                "pass as a function of the loop and give it to the loop: "
                f"`@ng.repeat(pos, until=n, unroll={self._asked})` above `def step(loop): ...`. "
                "Nothing was recorded; the capture goes on")
        self._check_place()
        s, scalar = _backend.as_numba_stream(self._stream), isinstance(self.until, DeviceScalar)
        self.unroll = 1
        # The loop's condition is set by a kernel before the loop, so a
        # counter already at its limit runs no pass.
        self.cond = Condition(stream=s)
        (_enter_below_scalar if scalar else _enter_below)[1, 1, s](
            self.counter, self.until, self.cond)
        block = while_loop(self.cond, stream=s, body=self._body)
        block.__enter__()
        self._block = block
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        block, self._block = self._block, None
        if block is None:
            return False
        if exc_type is None:
            try:
                s = _backend.as_numba_stream(self._stream)
                scalar = isinstance(self.until, DeviceScalar)
                (_pass_below_scalar if scalar else _pass_below)[1, 1, s](
                    self.counter, self._step, self.until, self.cond)
            except BaseException as err:
                block.__exit__(type(err), err, err.__traceback__)
                raise
        return block.__exit__(exc_type, exc, tb)

    def __call__(self, record_pass: Callable[["RepeatLoop"], Any]) -> "RepeatLoop":
        """Record the loop with ``record_pass(loop)`` launching one pass:
        called once per pass an iteration holds (``unroll``), each call
        recording the same launches. Returns the loop."""
        if not callable(record_pass):
            raise TypeError(
                f"ng.repeat(...)(fn) takes a function that records one pass, not "
                f"{type(record_pass).__name__}")
        asked = self._asked
        if self._body is not None:
            if asked not in (1, "auto"):
                raise ConditionalError(
                    f"ng.repeat(unroll={asked}, body=graph): a child graph cannot be "
                    "skipped inside an iteration, so a loop with body= records one pass "
                    "per iteration; leave unroll at 1 or 'auto'. Nothing was recorded")
            asked = 1
        if asked == 1:
            with self:
                record_pass(self)
            return self
        handle, session = self._check_place()
        if session is None:
            self._claim.release()
            raise ConditionalError(
                f"{self._stream!r} is not capturing: ng.repeat records a loop only "
                "inside `with ng.capture(stream):`")
        s, scalar = _backend.as_numba_stream(self._stream), isinstance(self.until, DeviceScalar)
        release = _registry.release_when_idle
        state = _backend.loop_memory(2, np.int32, release)
        slots = _backend.loop_memory(MAX_UNROLL, np.dtype(self.counter.dtype), release)
        self.cond = cond = Condition(stream=s)
        _unroll.enter_kernel(scalar)[1, 1, s](
            self.counter, self.until, self._step, slots, state, cond)
        block = while_loop(cond, stream=s)
        block.__enter__()
        try:
            recording = _unroll.PassRecording(session, state, slots, self.counter)
            with _unroll.recording_passes(recording):
                passes = self._record_passes(record_pass, recording, handle, asked)
            end = _unroll.end_kernel(scalar, passes)
            if passes == 1:
                end[1, 1, s](self.counter, self.until, self._step, state, cond)
            else:
                end[1, 1, s](self.counter, self.until, self._step, slots, state,
                             np.int32(passes), cond)
        except BaseException as err:
            cond._tag = None
            block.__exit__(type(err), err, err.__traceback__)
            raise
        block.__exit__(None, None, None)
        self.unroll = passes
        return self

    def _record_passes(self, record_pass: Callable[["RepeatLoop"], Any],
                       recording: Any, handle: int, asked: Any) -> int:
        """Record pass 1, choose the passes per iteration from it, record the
        rest guarded; returns how many passes were recorded."""
        other = self._record_pass(record_pass, recording, handle, 1)
        if asked == "auto":
            passes = 1 if other else auto_passes(recording.launches)
        else:
            passes = asked
            if other and passes > 1:
                raise ConditionalError(
                    f"ng.repeat(unroll={passes}): the pass recorded {other} node(s) other "
                    "than kernel launches (a copy, a fill, a DeviceScalar update, a "
                    "library's work such as a cuBLAS product, a child graph, a nested "
                    "block or an ng.device_updatable kernel node), which cannot be skipped on the device once the loop stops "
                    "inside an iteration. Launch only kernels and numbagraph's kernel ops "
                    "in an unrolled pass, or use unroll=1 or 'auto' (which records one pass "
                    "per iteration for such a pass). The capture is discarded")
        recording.guarded = True
        for index in range(2, passes + 1):
            other = self._record_pass(record_pass, recording, handle, index)
            if other:
                raise ConditionalError(
                    f"ng.repeat(unroll={passes}): pass {index} recorded {other} node(s) "
                    "other than kernel launches, which pass 1 did not: record the same "
                    "kernel launches in every pass. The capture is discarded")
        return passes

    def _record_pass(self, record_pass: Callable[["RepeatLoop"], Any], recording: Any,
                     handle: int, index: int) -> int:
        """Record pass ``index``, its kernels given the pass's tag for the
        loop's condition; returns how many nodes it added other than its
        kernel launches."""
        cond = self.cond
        assert cond is not None
        recording.index, recording.launches = index, 0
        before = _backend.capture_node_count(handle)
        cond._tag = _backend.pass_condition(recording.state, index)
        try:
            record_pass(self)
        finally:
            cond._tag = None
        return _backend.capture_node_count(handle) - before - recording.launches


def repeat(counter: DeviceScalar, until: Any, *, by: Any = 1, stream: Any = None,
           body: Any = None, unroll: Any = "auto") -> RepeatLoop:
    """Record a loop the GPU runs while ``counter < until``, adding ``by`` to
    ``counter`` after each pass.

    The test comes before each pass, so a counter already at its limit runs
    none. A kernel of the body ends the loop early, after the pass it runs
    in, with ``ng.set_condition(loop.cond, 0)``: an end-of-sequence token, a
    residual below tolerance, a particle out of the box. After the launch
    ``counter`` holds where the loop stopped. Use it inside a capture; the
    body follows the rules of [while_loop][numbagraph.while_loop].

    Parameters
    ----------
    counter
        An integer or float DeviceScalar: the loop's position (a token
        index, a step number, a time).
    until
        Where the loop ends: a number, recorded into the graph, or a
        DeviceScalar, read at each launch and pass.
    by
        The step added after each pass, a number the counter's dtype holds.
    stream
        The capture stream; the counter's stream by default.
    body
        A [CapturedGraph][numbagraph.CapturedGraph] each pass starts with,
        recorded into the body as a child graph node when the loop opens:
        ``with ng.repeat(pos, until=n, body=step): pass`` runs ``step`` until
        ``pos`` reaches ``n``.
    unroll
        Passes per iteration of the loop's while node, for a loop given its
        pass as a function (``loop(fn)``, or ``@ng.repeat(...)`` above it),
        which is called once per pass: a whole number from 1 to
        [MAX_UNROLL][numbagraph.MAX_UNROLL], or ``"auto"`` (the default),
        chosen from the kernels the first pass launches so that the while
        node's own cost is at most about 20% of the passes'. Results are
        those of one pass per iteration: a counted loop runs exactly its
        passes, and no pass after one that stops the loop changes anything.
        Above 1, a pass launches kernels only (``"auto"`` records a pass
        holding other work once per iteration), no kernel writes
        ``counter`` or ``until``, and ``until`` is read as each iteration
        of the while node begins. A ``with`` block records one pass per iteration.

    Returns
    -------
    RepeatLoop
        The loop, to open with ``with`` or to call with the function that
        records a pass; its ``cond`` stops it early.

    Raises
    ------
    TypeError
        ``counter`` is not a DeviceScalar, ``until`` not a number or a
        DeviceScalar, or ``body`` not a CapturedGraph.
    GraphClosedError, GraphMemoryError, NumbagraphError
        ``body`` cannot be a child graph, as
        [CapturedGraph.launch][numbagraph.CapturedGraph.launch] says.
    ScalarValueError
        ``by`` does not fit the counter's dtype, or the counter is a bool.
    ValueError
        ``unroll`` is neither ``"auto"`` nor a whole number from 1 to
        [MAX_UNROLL][numbagraph.MAX_UNROLL].
    ConditionalError
        Not inside a capture on ``stream``, the CUDA in use has no
        conditional nodes, or ``body`` holds one; opening and closing the body raise as
        [while_loop][numbagraph.while_loop] does. A ``with`` block, or
        ``body=``, with ``unroll`` above 1 (nothing is recorded); a pass
        recorded with an explicit ``unroll`` above 1 that holds work other
        than kernel launches (the capture is discarded).

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        with ng.repeat(pos, until=max_len) as loop:
            decode[1, 32, s](tokens, pos, loop.cond)   # sets loop.cond to 0 at the end token
    pos.update(prompt_len)
    cap.graph.launch()                                  # the whole decode, one launch
    with ng.capture(s) as cap:
        @ng.repeat(pos, until=max_len, unroll=8)        # 8 passes per iteration
        def decode_loop(loop):
            decode[1, 32, s](tokens, pos, loop.cond)
    ```
    """
    return RepeatLoop(counter, until, by, stream, body, unroll)


def stop_when(cond: Condition, value: Any, *, below: Any = None, above: Any = None,
              stream: Any = None) -> None:
    """End a loop once a value on the device crosses a limit: records (or
    runs) a kernel that sets ``cond`` to 0 when ``value < below`` (or
    ``value > above``). For a solver that stops at its tolerance, after an
    op has written the residual: ``ng.norm2_into(r, res, stream=s)``, then
    ``ng.stop_when(loop.cond, res, below=tol)``.

    Parameters
    ----------
    cond
        The loop's Condition: ``loop.cond`` of [repeat][numbagraph.repeat],
        or the Condition of a [while_loop][numbagraph.while_loop].
    value
        A DeviceScalar, or a device array whose first element is the value
        (the output of a reduction op).
    below, above
        The limit, exactly one of them: a number.
    stream
        The capture stream; that of ``cond`` by default.

    Raises
    ------
    TypeError
        ``cond`` is not a Condition, ``value`` is not a DeviceScalar or a
        device array, or the limit is not a number.
    ValueError
        Neither or both of ``below`` and ``above`` are given.
    ConditionalError
        ``cond``'s capture has ended.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        with ng.repeat(it, until=500) as loop:
            sweep[blocks, 256, s](u, v, r)
            ng.norm2_into(r, res, stream=s)
            ng.stop_when(loop.cond, res, below=1e-6)
    ```
    """
    if not isinstance(cond, Condition):
        raise TypeError(f"ng.stop_when takes a Condition, not {type(cond).__name__}")
    if (below is None) == (above is None):
        raise ValueError("ng.stop_when takes exactly one of below= and above=")
    limit = below if above is None else above
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or math.isnan(limit):
        raise TypeError(f"ng.stop_when: the limit {limit!r} is not a number")
    if not isinstance(value, DeviceScalar) and not isinstance(value, _backend.DEVICE_ARRAY_TYPES):
        raise TypeError(
            f"ng.stop_when reads a DeviceScalar or a device array, not {type(value).__name__}")
    home = cond.stream
    if stream is not None and _backend.stream_handle(stream) != _backend.stream_handle(home):
        raise ConditionalError(
            f"ng.stop_when(stream={stream!r}): the Condition belongs to the capture on "
            f"{home!r}; record the check there")
    cond._live("ng.stop_when")
    kernel = _stop_below if above is None else _stop_above
    read: Any = value
    dtype = np.dtype(read.dtype)
    kernel[1, 1, _backend.as_numba_stream(home)](value, _typed_limit(dtype, limit), cond)


def _typed_limit(dtype: np.dtype, limit: Any) -> Any:
    """``limit`` in the value's dtype, so that the device compares as the
    host would: an integer limit must be one the dtype holds."""
    if dtype.kind == "f":
        return dtype.type(limit)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if limit != math.floor(limit) or not info.min <= limit <= info.max:
            raise TypeError(
                f"ng.stop_when: the limit {limit!r} is not a {dtype.name} value; "
                "compare an integer value with an integer limit it can hold")
        return dtype.type(int(limit))
    raise TypeError(f"ng.stop_when reads integers and floats, not {dtype.name}")
