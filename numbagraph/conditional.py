"""Conditional graph nodes: loops and branches decided on the GPU.

Inside ``ng.capture(s)``, ``with ng.while_loop(cond):`` records the work
enqueued on ``s`` in the block into the body of a loop instead of into the
graph itself. When the graph runs, the GPU repeats the body while ``cond`` is
non-zero, and a kernel in the body changes ``cond`` with
``ng.set_condition(cond, value)``: an iterative solver runs to convergence in
one graph launch, with no round trip to the host per iteration.
``ng.if_then``, ``ng.if_else`` and ``ng.switch`` select bodies the same way.

Rules of conditionals:

* A :class:`Condition` is made inside a capture and belongs to it: kernels of
  that capture receive it as an argument, and it drives exactly one block,
  opened in the capture (or block) where the condition was made or deeper.
* A block records what is launched on the capture stream inside it, nothing
  else; blocks nest. A body holds kernels, DeviceScalar updates and
  device-to-device copies, not work that involves the host.
* A while loop's body must launch a kernel that is given its Condition:
  nothing else can end the loop.
"""

from __future__ import annotations

import numbers
import threading
from typing import Any, Literal

from . import _forks, _registry
from .backend import active as _backend
from .errors import CaptureInvalidatedError, ConditionalError
from .graph import CapturedGraph

__all__ = [
    "Condition",
    "ConditionalBlock",
    "set_condition",
    "while_loop",
    "if_then",
    "if_else",
    "switch",
    "IF_WHILE_CUDA",
    "ELSE_SWITCH_CUDA",
]

IF_WHILE_CUDA = (12, 3)
"""The CUDA version that introduced conditional nodes (if and while):
[Condition][numbagraph.Condition], [while_loop][numbagraph.while_loop] and
[if_then][numbagraph.if_then] need it."""

ELSE_SWITCH_CUDA = (12, 8)
"""The CUDA version that added if/else and switch nodes:
[if_else][numbagraph.if_else] and [switch][numbagraph.switch] need it."""

_UINT32_MAX = 2**32 - 1

set_condition = _backend.set_condition
"""``ng.set_condition(cond, value)``, called from a kernel: set the
[Condition][numbagraph.Condition] the kernel was given to ``value`` (an
unsigned 32-bit integer or a bool; non-zero is true). A graph node reading
the condition afterwards sees the new value.

It runs on the device, inside the kernel, and raises nothing on the host; on
the simulator, ``cond`` that is not a Condition's handle raises TypeError.

Examples
--------
```python
@cuda.jit
def keep_going(counter, limit, cond):
    if cuda.grid(1) == 0:
        ng.set_condition(cond, counter[0] < limit)
```
"""


def _require_cuda(version: tuple[int, int], what: str) -> None:
    have = _backend.conditional_version()
    if tuple(have) < version:
        raise ConditionalError(
            f"{what} needs CUDA {version[0]}.{version[1]} or newer, but the "
            f"driver or cuda-bindings in use offers CUDA {have[0]}.{have[1]}; "
            "update the NVIDIA driver and cuda-bindings"
        )


# ---------------------------------------------------------------- per capture

class _Frame:
    """The capture itself, or one open block inside it."""

    __slots__ = ("name", "condition", "node", "sets_condition")

    def __init__(self, name: str, condition: "Condition | None" = None, node: Any = None):
        self.name = name
        self.condition = condition  # a while loop's condition, which its body must set
        self.node = node
        self.sets_condition = False


class _Blocks:
    """The conditional state of one capture: its open blocks, innermost last,
    and the conditions made in it."""

    def __init__(self, session: Any):
        self.session = session
        self.stream = session.stream
        self.stack = [_Frame("the capture")]
        self.conditions: list[Condition] = []
        self.broken: str | None = None
        session.recording.finish_checks.append(self._finish)

    @property
    def current(self) -> _Frame:
        return self.stack[-1]

    def alive(self) -> bool:
        session = self.session
        return session is not None and session.current

    def _finish(self) -> None:
        """Run as the capture ends, before the graph is built."""
        session, self.session = self.session, None
        if _by_key.get(session.key) is self:
            del _by_key[session.key]
        still_open = self.stack[1:]
        del self.stack[1:]
        if still_open:
            _forks.settle(session)  # a body with a fork left unjoined does not end
        for frame in reversed(still_open):
            frame.node.abandon_branch(resume=True)
        if still_open:
            raise ConditionalError(
                f"the capture ended inside {still_open[-1].name}: end each "
                "conditional block (leave its `with`) before ending the capture"
            )
        if self.broken:
            raise ConditionalError(self.broken)
        unused = sum(1 for c in self.conditions if not c._used)
        if unused:
            raise ConditionalError(
                f"{unused} Condition(s) made in this capture drive no block, and "
                "CUDA does not instantiate a graph with an unused condition: "
                "open a block with each Condition, or do not make it"
            )


# capture key -> the blocks of the capture on that stream
_by_key: dict[Any, _Blocks] = {}


def _raise_if_lost(session: Any, what: str, exc: BaseException) -> None:
    """After ``what`` failed: if the stream no longer captures (its capture
    could not be begun again after a block paused it), end the capture
    here and say so, so that later launches are not taken for recorded ones."""
    if session is None or not session.current or _backend.is_capturing(session.handle):
        return
    _registry.discard(session)
    raise CaptureInvalidatedError(
        f"{what} failed ({exc}), and the capture on {session.stream!r} could not "
        "be resumed after it: the capture has been ended and its graph "
        "discarded. The stream is usable and a new capture may begin"
    ) from exc


def _blocks_for(session: Any) -> _Blocks:
    blocks = _by_key.get(session.key)
    if blocks is None or blocks.session is not session:
        # Drop the state of captures aborted since: it holds their sessions.
        for key, stale in list(_by_key.items()):
            if not stale.alive():
                del _by_key[key]
        blocks = _by_key[session.key] = _Blocks(session)
    return blocks


def _session_for(stream: Any, what: str) -> Any:
    if stream is not None:
        session = _registry.on(_backend.stream_handle(stream))
        if session is None:
            raise ConditionalError(
                f"{stream!r} is not capturing: {what} only inside "
                "`with ng.capture(stream):`"
            )
        return session
    here = threading.current_thread()
    sessions = [s for s in _registry.active() if s.thread is here]
    if len(sessions) == 1:
        return sessions[0]
    if not sessions:
        raise ConditionalError(
            f"no capture is in progress: {what} only inside `with ng.capture(s):`"
        )
    raise ConditionalError(
        f"{len(sessions)} captures are in progress on this thread; say which "
        "one with stream="
    )


# ---------------------------------------------------------------- conditions

def _check_default(default: Any) -> int | None:
    if default is None:
        return None
    if isinstance(default, (bool, numbers.Integral)):
        value = int(default)
        if 0 <= value <= _UINT32_MAX:
            return value
        raise ValueError(
            f"a Condition holds an unsigned 32-bit value; {default!r} is out of "
            f"range 0..{_UINT32_MAX}"
        )
    raise TypeError(
        f"a Condition's default is an int or bool (or None), not "
        f"{type(default).__name__}"
    )


class Condition:
    """A value the GPU reads to decide a conditional node: loop again, or
    which branch to take.

    Make it inside a capture, pass it to kernels as an argument (they receive
    a handle and call ``ng.set_condition(cond, value)``), and open one block
    with it: [while_loop][numbagraph.while_loop], [if_then][numbagraph.if_then],
    [if_else][numbagraph.if_else] or [switch][numbagraph.switch].

    ``default`` is assigned as each launch of the graph starts. With
    ``default=None`` the value is not reset between launches, so a kernel
    must set it before the conditional node reads it.

    Parameters
    ----------
    default
        An unsigned 32-bit int or a bool, or None.
    stream
        The capturing stream; needed only while this thread has several
        captures in progress.
    name
        What to call the condition where a graph's nodes are described
        ([CapturedGraph.nodes][numbagraph.CapturedGraph.nodes],
        ``summary()``, ``to_dot()``); unnamed if omitted.

    Raises
    ------
    TypeError
        ``default`` is not an int, a bool or None, or ``name`` is not a str.
    ValueError
        ``default`` is outside 0..2**32-1.
    ConditionalError
        No capture is in progress on this thread (or ``stream`` does not
        capture), this thread has several captures and ``stream`` was not
        given, the CUDA in use is older than
        [IF_WHILE_CUDA][numbagraph.IF_WHILE_CUDA], or the driver could not
        make the condition. Nothing was recorded.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            sweep[grid, block, s](u, residual, more)
    ```
    """

    __slots__ = ("_blocks", "_scope", "_state", "_default", "_used", "_passed", "_name",
                 "_tag", "__weakref__")

    def __init__(self, default: int | bool | None = None, *, stream: Any = None,
                 name: str | None = None):
        default = _check_default(default)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a Condition's name is a str, not {type(name).__name__}")
        self._name = name
        session = _session_for(stream, "make an ng.Condition")
        _require_cuda(IF_WHILE_CUDA, "ng.Condition (a conditional graph node)")
        blocks = _blocks_for(session)
        try:
            state = _backend.condition_create(session.recording, default)
        except Exception as exc:
            raise ConditionalError(
                f"could not make a condition in the capture on {session.stream!r}: {exc}"
            ) from exc
        self._blocks = blocks
        self._scope = blocks.current
        self._state = state
        self._default = default
        self._used = False
        self._passed = False  # given to a kernel, which may set it
        # While a pass of an unrolled loop records: what its kernels are
        # given instead of the handle (the backend's pass tag).
        self._tag: Any = None
        blocks.conditions.append(self)

    @property
    def default(self) -> int | None:
        """The value assigned as each launch starts; None: not reset."""
        return self._default

    @property
    def name(self) -> str | None:
        """The name given when the condition was made, or None."""
        return self._name

    @property
    def stream(self) -> Any:
        """The stream whose capture the condition belongs to."""
        return self._blocks.stream

    def _live(self, what: str) -> _Blocks:
        """The capture's state, once sure the condition may be used there now."""
        blocks = self._blocks
        if not blocks.alive():
            raise ConditionalError(
                f"{what}: this Condition belongs to a capture on "
                f"{blocks.stream!r} that has ended. A Condition lives in the "
                "capture that made it; make a new one inside the capture that uses it"
            )
        if self._scope not in blocks.stack:
            raise ConditionalError(
                f"{what}: this Condition was made inside {self._scope.name}, "
                "which has ended; make it outside that block"
            )
        return blocks

    def __repr__(self) -> str:
        blocks = getattr(self, "_blocks", None)
        if blocks is None:
            return "<ng.Condition (not made)>"
        named = "" if self._name is None else f" {self._name!r}"
        return f"<ng.Condition{named} default={self._default} on {blocks.stream!r}>"


def _kernel_argument(cond: Condition) -> Any:
    blocks = cond._live("cannot pass this Condition to a kernel")
    if cond._tag is not None:
        return cond._tag
    cond._passed = True
    for frame in blocks.stack:
        if frame.condition is cond:
            frame.sets_condition = True
    return _backend.condition_argument(cond._state)


_registry.register_device_wrapper(Condition, _kernel_argument)


# ---------------------------------------------------------------- blocks

class _Conditional:
    """One conditional node: what drives it, where it sits, its bodies."""

    def __init__(self, cond: Any, kind: str, size: int, name: str, stream: Any):
        if not isinstance(cond, Condition):
            raise TypeError(f"{name} takes an ng.Condition, not {type(cond).__name__}")
        blocks = cond._live(f"cannot use {name}")
        key = None if stream is None else _registry.key_of(_backend.stream_handle(stream))
        if key is not None and key in blocks.session.forks:
            raise ConditionalError(
                f"{name} was given {stream!r}, a stream forked into the capture on "
                f"{blocks.stream!r}: conditional blocks record the work of the "
                "capture's own stream, which CUDA records them on by ending the "
                "capture and beginning it again there, and a forked stream cannot. "
                f"Open the block on {blocks.stream!r} (outside the `with ng.fork` "
                "block) and fork inside its body. Nothing was recorded; the capture "
                "goes on"
            )
        if key is not None and key != blocks.session.key:
            raise ConditionalError(
                f"{name} was given {stream!r}, but its Condition belongs to the "
                f"capture on {blocks.stream!r}: blocks record work launched on "
                "the stream whose capture made the Condition"
            )
        self._check_unused(cond, name)
        # Inside a body, a kernel later in an enclosing loop may set it for
        # the next pass; at the capture's top level nothing can.
        if cond._default is None and not cond._passed and len(blocks.stack) == 1:
            raise ConditionalError(
                f"{name} reads a Condition that has no default and that no kernel "
                "was given before it: its value at each launch is whatever the "
                "last launch left (0 at first), so "
                + ("the loop would never run" if kind == "while" else
                   "every launch would take the branch of 0")
                + ". Make it with a default (ng.Condition(default=1)), or launch a "
                "kernel that calls ng.set_condition on it before the block. "
                "Nothing was recorded; the capture goes on"
            )
        self.cond, self.kind, self.size, self.name = cond, kind, size, name
        self.blocks = blocks
        self.frame = blocks.current
        self.node: Any = None
        self.recorded = [False] * size

    @staticmethod
    def _check_unused(cond: Condition, name: str) -> None:
        if cond._used:
            raise ConditionalError(
                f"cannot use {name}: this Condition already drives a block, and "
                "CUDA ties each condition to one conditional node; make one "
                "Condition per block"
            )

    def add_node(self) -> None:
        """Add the node where the capture stands now."""
        self._check_unused(self.cond, self.name)
        session = self.blocks.session
        _forks.guard_restart(session, self.name)
        session.restarts += 1
        try:
            self.node = _backend.ConditionalNode(
                session.recording, self.cond._state, self.kind, self.size, session.mode
            )
        except Exception as exc:
            _forks.restarted(session)
            _raise_if_lost(session, f"adding {self.name}", exc)
            raise ConditionalError(
                f"could not add {self.name} to the capture on {self.blocks.stream!r}: {exc}"
            ) from exc
        _forks.restarted(session)
        self.cond._used = True


class ConditionalBlock:
    """One body of a conditional node: ``with block:`` records the work
    launched on the capture stream inside it into that body.

    Each block records once, where its node was made (directly in the
    capture, or in the block the node was made in). A block made with a
    captured graph (``body=``) records it first, as a child graph node.
    Blocks are returned by
    [while_loop][numbagraph.while_loop], [if_then][numbagraph.if_then],
    [if_else][numbagraph.if_else] and [switch][numbagraph.switch], not made
    directly.

    Raises
    ------
    ConditionalError
        On entering: the block was recorded already, it is opened somewhere
        other than where its node was made, its Condition's capture has
        ended, a stream forked into the capture is not joined back
        (nothing is recorded), or the node or body could not be added. On
        leaving: the body could not be recorded (it held work that involves
        the host), a while loop's body never passed its Condition to a
        kernel, or a stream forked into the capture inside the body was not
        joined back.
    GraphClosedError, GraphMemoryError, NumbagraphError
        On entering: the ``body=`` graph can no longer be a child graph.
    CaptureInvalidatedError
        Adding, opening or closing the body failed and the capture could not
        be resumed after it: the capture has been ended and its graph
        discarded.

    Examples
    --------
    ```python
    then, orelse = ng.if_else(cond)
    with then:
        grow[1, 32, s](x)
    with orelse:
        shrink[1, 32, s](x)
    ```
    """

    __slots__ = ("_conditional", "_index", "_name", "_frame", "_graph")

    def __init__(self, conditional: _Conditional, index: int, name: str,
                 graph: CapturedGraph | None = None):
        self._conditional = conditional
        self._index = index
        self._name = name
        self._frame: _Frame | None = None
        # The captured graph the body starts with (body=), if any.
        self._graph = graph

    def __enter__(self) -> "ConditionalBlock":
        c = self._conditional
        blocks = c.cond._live(f"cannot open {self._name}")
        if c.recorded[self._index]:
            raise ConditionalError(
                f"{self._name} was recorded already; each block records once"
            )
        if blocks.current is not c.frame:
            raise ConditionalError(
                f"{self._name} must open where its node was made ({c.frame.name}), "
                f"not inside {blocks.current.name}"
            )
        session = blocks.session
        if self._graph is not None:
            self._graph._refuse_other_device(session, f"{self._name} (body=)")
            self._graph._embeddable(f"{self._name} (body=)")
        if c.node is None:
            c.add_node()
        _forks.guard_restart(session, f"opening {self._name}")
        session.restarts += 1
        try:
            c.node.begin_branch(self._index)
        except Exception as exc:
            _forks.restarted(session)
            _raise_if_lost(session, f"opening {self._name}", exc)
            raise ConditionalError(f"could not open {self._name}: {exc}") from exc
        _forks.restarted(session)
        c.recorded[self._index] = True
        self._frame = _Frame(
            self._name, c.cond if c.kind == "while" else None, c.node
        )
        blocks.stack.append(self._frame)
        session.block = self._name
        if self._graph is not None:
            try:
                self._graph.launch(session.stream)  # a child graph node, in the body
            except BaseException as err:
                self.__exit__(type(err), err, err.__traceback__)
                raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        frame, self._frame = self._frame, None
        blocks = self._conditional.blocks
        if frame is None or frame not in blocks.stack:
            return False  # the capture ended while the block was open, and said so
        del blocks.stack[blocks.stack.index(frame):]
        session = blocks.session
        # A body with a fork left unjoined does not end: join it, and refuse
        # the body once it has ended.
        forked = _forks.settle(session) if session is not None else []
        if session is not None:
            session.restarts += 1
            session.block = blocks.stack[-1].name if len(blocks.stack) > 1 else None
        if exc_type is not None or not blocks.alive():
            frame.node.abandon_branch(resume=blocks.alive())
            if session is not None:
                _forks.restarted(session)
            return False
        try:
            frame.node.end_branch()
        except Exception as err:
            _forks.restarted(session)
            _raise_if_lost(session, f"closing {self._name}", err)
            blocks.broken = f"{self._name} could not be recorded: {err}"
            raise ConditionalError(
                f"{blocks.broken}. A conditional body holds kernels, DeviceScalar "
                "updates, device-to-device copies, copies into a HostScalar and "
                "nested conditional blocks; no other copy to or from the host, and "
                "nothing that waits for it"
            ) from err
        _forks.restarted(session)
        if forked:
            blocks.broken = (
                f"{self._name} ended while {_forks.names(forked)}, forked into the "
                "capture inside it, was not joined back, and CUDA ends a body only "
                "once every stream forked into it is (it reports an unjoined capture "
                "otherwise). "
                "Leave each `with ng.fork` block inside the body, or join the stream "
                "back (an event recorded on it, waited on by the capturing stream) "
                "before the body ends"
            )
            raise ConditionalError(blocks.broken)
        if frame.condition is not None and not frame.sets_condition:
            blocks.broken = (
                f"{self._name} never passes its Condition to a kernel, so nothing "
                "can end the loop: launch a kernel inside the block that calls "
                "ng.set_condition(cond, 0) when the loop is done"
            )
            raise ConditionalError(blocks.broken)
        return False

    def __repr__(self) -> str:
        return f"<ng.ConditionalBlock {self._name}>"


def _body_graphs(body: Any, n: int, name: str) -> list[CapturedGraph | None]:
    """The captured graphs each of the ``n`` blocks of ``name`` starts with,
    from its ``body=`` (a graph for one block, a sequence of ``n`` graphs or
    None for several), each checked as a child graph before anything is
    recorded."""
    if body is None:
        return [None] * n
    if n == 1:
        graphs = [body]
    elif isinstance(body, (CapturedGraph, str, bytes)) or not hasattr(body, "__len__"):
        raise TypeError(
            f"{name}(body=...) takes a sequence of {n} captured graphs (or None), one "
            f"per block, not {type(body).__name__}")
    else:
        graphs = list(body)
        if len(graphs) != n:
            raise ValueError(
                f"{name}(body=...) was given {len(graphs)} graphs for its {n} blocks; "
                "give one per block, None for a block that starts empty")
    for graph in graphs:
        if graph is None and n > 1:
            continue
        if not isinstance(graph, CapturedGraph):
            raise TypeError(
                f"{name}(body=...) takes a captured graph (the graph of an "
                f"ng.capture block), not {type(graph).__name__}")
        graph._embeddable(f"{name}(body=...)")
    return graphs


def while_loop(cond: Condition, *, stream: Any = None,
               body: CapturedGraph | None = None) -> ConditionalBlock:
    """Record the block into a loop the GPU runs while ``cond`` is non-zero.

    The condition is tested before each pass, so the body may run zero
    times. A kernel in the body must be given ``cond`` and set it with
    ``ng.set_condition`` to end the loop. ``stream``, if given, must be the
    capture stream.

    With ``body=graph``, each pass runs ``graph`` (a captured graph,
    recorded into the body as a child graph node when the block opens)
    before the work the ``with`` block launches, which still holds the
    kernel that ends the loop: nothing in another capture's graph can set
    ``cond``.

    Parameters
    ----------
    cond
        The loop's condition, made in this capture and driving no other block.
    stream
        The capture stream; by default, that of ``cond``.
    body
        A [CapturedGraph][numbagraph.CapturedGraph] the body starts with.

    Returns
    -------
    ConditionalBlock
        The loop's body, to open with ``with``.

    Raises
    ------
    TypeError
        ``cond`` is not a [Condition][numbagraph.Condition], or ``body`` is
        not a CapturedGraph.
    ConditionalError
        ``cond``'s capture has ended, ``cond`` was made inside a block that
        has ended, ``cond`` already drives a block, or ``stream`` is not the
        capture stream of ``cond``; or ``body`` holds a conditional node.
        Opening and closing the body raise as
        [ConditionalBlock][numbagraph.ConditionalBlock] says.
    GraphClosedError, GraphMemoryError, NumbagraphError
        ``body`` cannot be a child graph, as
        [CapturedGraph.launch][numbagraph.CapturedGraph.launch] says.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            step[1, 32, s](x, more)     # sets more to 0 when done
    with ng.capture(s) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more, body=sweep_graph):
            converged[1, 1, s](residual, more)
    ```
    """
    graphs = _body_graphs(body, 1, "ng.while_loop")
    conditional = _Conditional(cond, "while", 1, "ng.while_loop", stream)
    return ConditionalBlock(conditional, 0, "the body of an ng.while_loop", graphs[0])


def if_then(cond: Condition, *, stream: Any = None,
            body: CapturedGraph | None = None) -> ConditionalBlock:
    """Record the block into a branch the GPU runs when ``cond`` is non-zero.

    With ``body=graph``, the branch starts with ``graph`` (a captured graph,
    recorded into it as a child graph node when the block opens); ``with
    ng.if_then(cond, body=graph): pass`` records a branch that runs it.

    Parameters
    ----------
    cond
        The branch's condition, made in this capture and driving no other
        block.
    stream
        The capture stream; by default, that of ``cond``.
    body
        A [CapturedGraph][numbagraph.CapturedGraph] the branch starts with.

    Returns
    -------
    ConditionalBlock
        The branch's body, to open with ``with``.

    Raises
    ------
    TypeError
        ``cond`` is not a [Condition][numbagraph.Condition], or ``body`` is
        not a CapturedGraph.
    ConditionalError
        ``cond``'s capture has ended, ``cond`` was made inside a block that
        has ended, ``cond`` already drives a block, or ``stream`` is not the
        capture stream of ``cond``; or ``body`` holds a conditional node.
        Opening and closing the body raise as
        [ConditionalBlock][numbagraph.ConditionalBlock] says.
    GraphClosedError, GraphMemoryError, NumbagraphError
        ``body`` cannot be a child graph, as
        [CapturedGraph.launch][numbagraph.CapturedGraph.launch] says.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        flagged = ng.Condition(default=0)
        check[1, 1, s](x, flagged)      # sets flagged
        with ng.if_then(flagged):
            repair[1, 32, s](x)
    ```
    """
    graphs = _body_graphs(body, 1, "ng.if_then")
    conditional = _Conditional(cond, "if", 1, "ng.if_then", stream)
    return ConditionalBlock(conditional, 0, "the body of an ng.if_then", graphs[0])


def if_else(cond: Condition, *, stream: Any = None,
            body: Any = None) -> tuple[ConditionalBlock, ConditionalBlock]:
    """A node that runs one of two bodies: the first block when ``cond`` is
    non-zero, the second when it is zero. The node takes its place in the
    capture here; open each block (in any order) with ``with``. Needs CUDA 12.8.

    Parameters
    ----------
    cond
        The node's condition, made in this capture and driving no other
        block.
    stream
        The capture stream; by default, that of ``cond``.
    body
        ``(then_graph, else_graph)``: the captured graph each block starts
        with (recorded as a child graph node when it opens), or None for a
        block that starts empty.

    Returns
    -------
    tuple[ConditionalBlock, ConditionalBlock]
        The then block and the else block.

    Raises
    ------
    TypeError
        ``cond`` is not a [Condition][numbagraph.Condition], or ``body`` is
        not a pair of CapturedGraphs or None.
    ValueError
        ``body`` does not hold two entries.
    GraphClosedError, GraphMemoryError, NumbagraphError
        A graph of ``body`` cannot be a child graph, as
        [CapturedGraph.launch][numbagraph.CapturedGraph.launch] says.
    ConditionalError
        ``cond``'s capture has ended, ``cond`` was made inside a block that
        has ended, ``cond`` already drives a block, or ``stream`` is not the
        capture stream of ``cond``; or a graph of ``body`` holds a
        conditional node.
        Also: the CUDA in use is older than
        [ELSE_SWITCH_CUDA][numbagraph.ELSE_SWITCH_CUDA], or the node could
        not be added. Opening and closing the blocks raise as
        [ConditionalBlock][numbagraph.ConditionalBlock] says.
    CaptureInvalidatedError
        Adding the node failed and the capture could not be resumed after
        it: the capture has been ended and its graph discarded.

    Examples
    --------
    ```python
    then, orelse = ng.if_else(cond)
    with then:
        grow[1, 32, s](x)
    with orelse:
        shrink[1, 32, s](x)
    ```
    """
    _require_cuda(ELSE_SWITCH_CUDA, "ng.if_else")
    graphs = _body_graphs(body, 2, "ng.if_else")
    conditional = _Conditional(cond, "if", 2, "ng.if_else", stream)
    conditional.add_node()
    return (
        ConditionalBlock(conditional, 0, "the then block of an ng.if_else", graphs[0]),
        ConditionalBlock(conditional, 1, "the else block of an ng.if_else", graphs[1]),
    )


def switch(cond: Condition, n: int, *, stream: Any = None,
           body: Any = None) -> tuple[ConditionalBlock, ...]:
    """A node with ``n`` bodies that runs body ``cond`` (none when
    ``cond >= n``). The node takes its place in the capture here; open each
    block with ``with``. Needs CUDA 12.8.

    Parameters
    ----------
    cond
        The node's condition, made in this capture and driving no other
        block: the index of the body to run.
    n
        How many bodies, 1 or more.
    stream
        The capture stream; by default, that of ``cond``.
    body
        ``n`` captured graphs, the one each body starts with (recorded as a
        child graph node when it opens), or None for a body that starts
        empty.

    Returns
    -------
    tuple[ConditionalBlock, ...]
        The ``n`` bodies, in order.

    Raises
    ------
    ValueError
        ``n`` is not a whole number of cases >= 1, or ``body`` does not
        hold ``n`` entries.
    TypeError
        ``cond`` is not a [Condition][numbagraph.Condition], or ``body`` is
        not a sequence of CapturedGraphs or None.
    GraphClosedError, GraphMemoryError, NumbagraphError
        A graph of ``body`` cannot be a child graph, as
        [CapturedGraph.launch][numbagraph.CapturedGraph.launch] says.
    ConditionalError
        ``cond``'s capture has ended, ``cond`` was made inside a block that
        has ended, ``cond`` already drives a block, ``stream`` is not the
        capture stream of ``cond``, a graph of ``body`` holds a conditional
        node, the CUDA in use is older than
        [ELSE_SWITCH_CUDA][numbagraph.ELSE_SWITCH_CUDA], or the node could
        not be added. Opening and closing the bodies raise as
        [ConditionalBlock][numbagraph.ConditionalBlock] says.
    CaptureInvalidatedError
        Adding the node failed and the capture could not be resumed after
        it: the capture has been ended and its graph discarded.

    Examples
    --------
    ```python
    cases = ng.switch(mode, 3)
    for k, case in enumerate(cases):
        with case:
            kernels[k][1, 32, s](x)
    ```
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"ng.switch needs a whole number of cases >= 1, not {n!r}")
    _require_cuda(ELSE_SWITCH_CUDA, "ng.switch")
    graphs = _body_graphs(body, int(n), "ng.switch")
    conditional = _Conditional(cond, "switch", int(n), "ng.switch", stream)
    conditional.add_node()
    return tuple(
        ConditionalBlock(conditional, k, f"case {k} of an ng.switch", graphs[k])
        for k in range(n)
    )
