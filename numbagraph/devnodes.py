"""Device-updatable kernel nodes: a kernel sets another kernel's grid, or
turns it off, from the GPU.

Inside ``ng.capture(s)``, ``node = ng.DeviceNode()`` makes a handle, and
the one kernel launched inside ``with ng.device_updatable(node):`` becomes
its kernel node. Kernels of the same capture given ``node`` call
``ng.set_grid(node, blocks)`` and ``ng.set_enabled(node, flag)``: a node
that runs after such a kernel, in the graph's order, runs with the new grid
(or not at all) in the same launch, also inside while bodies, and keeps it
in later launches until changed again. A compaction, a sparse step or a
loop whose work shrinks launches just the blocks it needs, decided on the
GPU, with no round trip to the host.

Rules of device nodes (CUDA's, see docs/device-nodes.md):

* A DeviceNode is made inside a capture and belongs to it; its block
  records exactly one kernel launch, on the capture's stream (or the stream
  given), at the top level or inside a conditional body. A node made is
  attached before the capture ends.
* A kernel that updates a node must run before it, in the graph's order,
  for the node to see the update in the same launch; one running after it
  is seen from the next launch.
* A graph holding such a node is neither updated from nor into another
  graph (``CapturedGraph.update``), nor recorded into another capture as a
  child graph. ``rebind`` works; it sets the grid of a node whose arrays it
  moves back to the one captured.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import _registry, _unroll
from .backend import active as _backend
from .conditional import _session_for
from .errors import ConditionalError, DeviceNodeError

__all__ = [
    "DEVICE_NODES_CUDA",
    "DeviceNode",
    "device_updatable",
    "set_enabled",
    "set_grid",
]

DEVICE_NODES_CUDA = (12, 4)
"""The CUDA version that introduced device-updatable kernel nodes:
[DeviceNode][numbagraph.DeviceNode] needs it."""

set_grid = _backend.set_grid
"""``ng.set_grid(node, x, y=1, z=1)``, called from a kernel: set the grid of
the [DeviceNode][numbagraph.DeviceNode] ``node`` (the kernel was given it) to
``(x, y, z)`` blocks, each dimension taken as an unsigned 32-bit integer.

Returns CUDA's error code as an int32: 0 when the grid was set; 1
(``cudaErrorInvalidValue``) when a dimension is 0 or beyond the device's
grid limits, and then nothing changed: the node launches with the grid it
had. A node that runs after the calling kernel in the graph's order sees
the grid in this launch; the grid stays until set again (or until a
rebinding moves the node's arrays, which sets the grid it was captured
with). Call it from one thread (e.g. ``cuda.grid(1) == 0``).

It runs on the device and raises nothing on the host; on the simulator,
``node`` that is not a DeviceNode's handle raises TypeError.

Examples
--------
```python
@cuda.jit
def plan(count, node):
    if cuda.grid(1) == 0:
        ng.set_grid(node, max(1, (count[0] + 127) // 128))
```
"""

set_enabled = _backend.set_enabled
"""``ng.set_enabled(node, enabled)``, called from a kernel: enable
(``enabled`` non-zero) or disable the [DeviceNode][numbagraph.DeviceNode]
``node``. A disabled node does nothing when the graph reaches it, until a
kernel enables it again; the state lasts across launches of the graph.
Returns CUDA's error code as an int32, 0.

Examples
--------
```python
@cuda.jit
def gate(count, node):
    if cuda.grid(1) == 0:
        ng.set_enabled(node, count[0] > 0)
```
"""


def _session(stream: Any, what: str) -> Any:
    try:
        return _session_for(stream, what)
    except ConditionalError as exc:
        raise DeviceNodeError(str(exc)) from None


class DeviceNode:
    """A kernel node of a capture that kernels of the same graph update from
    the GPU: its grid ([set_grid][numbagraph.set_grid]) and whether it runs
    ([set_enabled][numbagraph.set_enabled]).

    Make it inside a capture, pass it to the kernels that update it (as an
    argument; they receive a handle), and launch its own kernel inside
    ``with ng.device_updatable(node):``. Kernels may be given it before its
    kernel is launched: that is where an update is seen in the same launch.

    Parameters
    ----------
    stream
        The capturing stream; needed only while this thread has several
        captures in progress.
    name
        What to call the node in messages; unnamed if omitted.

    Raises
    ------
    TypeError
        ``name`` is not a str.
    DeviceNodeError
        No capture is in progress on this thread (or ``stream`` does not
        capture), this thread has several captures and ``stream`` was not
        given, or the CUDA in use is older than
        [DEVICE_NODES_CUDA][numbagraph.DEVICE_NODES_CUDA]. Nothing was
        recorded. Raised as the capture ends (which discards it) when the
        node was never given its kernel.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        node = ng.DeviceNode()
        count_active[blocks, 128, s](flags, count, node)  # sets node's grid
        with ng.device_updatable(node):
            compact[1, 128, s](flags, data, out)           # launches that grid
    ```
    """

    __slots__ = ("_session", "_state", "_name", "_attached", "__weakref__")

    def __init__(self, *, stream: Any = None, name: str | None = None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a DeviceNode's name is a str, not {type(name).__name__}")
        session = _session(stream, "make an ng.DeviceNode")
        have = tuple(_backend.conditional_version())
        if have < DEVICE_NODES_CUDA:
            raise DeviceNodeError(
                f"ng.DeviceNode (a device-updatable kernel node) needs CUDA "
                f"{DEVICE_NODES_CUDA[0]}.{DEVICE_NODES_CUDA[1]} or newer, but the driver "
                f"or cuda-bindings in use offers CUDA {have[0]}.{have[1]}; update the "
                "NVIDIA driver and cuda-bindings")
        try:
            state = _backend.device_node_create(session.recording, _registry.release_when_idle)
        except Exception as exc:
            raise DeviceNodeError(
                f"could not make a device node in the capture on {session.stream!r}: {exc}"
            ) from exc
        self._session = session
        self._state = state
        self._name = name
        self._attached = False
        session.recording.finish_checks.append(self._finish)

    @property
    def name(self) -> str | None:
        """The name given when the node was made, or None."""
        return self._name

    @property
    def stream(self) -> Any:
        """The stream whose capture the node belongs to."""
        return self._session.stream

    @property
    def attached(self) -> bool:
        """Whether its kernel was launched inside its
        [device_updatable][numbagraph.device_updatable] block."""
        return self._attached

    def _called(self) -> str:
        return "this DeviceNode" if self._name is None else f"DeviceNode {self._name!r}"

    def _live(self, what: str) -> Any:
        session = self._session
        if not session.current:
            raise DeviceNodeError(
                f"{what}: {self._called()} belongs to a capture on {session.stream!r} "
                "that has ended. A DeviceNode lives in the capture that made it; make "
                "a new one inside the capture that uses it")
        return session

    def _finish(self) -> None:
        """Run as the capture ends, before the graph is built."""
        if not self._attached:
            raise DeviceNodeError(
                f"{self._called()}, made in this capture, was never given its kernel: "
                "launch one kernel inside `with ng.device_updatable(node):` before the "
                "capture ends, or do not make the node. The capture is discarded")

    def __repr__(self) -> str:
        named = "" if self._name is None else f" {self._name!r}"
        state = "attached" if self._attached else "not attached"
        return f"<ng.DeviceNode{named} {state} on {self._session.stream!r}>"


def _kernel_argument(node: DeviceNode) -> Any:
    node._live("cannot pass a DeviceNode to a kernel")
    return _backend.device_node_argument(node._state)


def _launched_into(node: DeviceNode, session: Any) -> None:
    """Refuse a kernel given ``node`` unless it records into the node's own
    capture: CUDA lets only the node's own graph update it."""
    own = node._live("cannot pass a DeviceNode to a kernel")
    if session is not own:
        where = ("runs at once" if session is None
                 else f"records into another capture, on {session.stream!r}")
        raise DeviceNodeError(
            f"a kernel given {node._called()} {where}; only kernels of the node's own "
            f"capture, on {own.stream!r} or a stream forked into it, may update it, as "
            "CUDA lets only the node's own graph change it. Launch the kernel on that "
            "stream inside the capture. Nothing was launched or recorded")


_registry.register_device_wrapper(DeviceNode, _kernel_argument, _launched_into)


@contextlib.contextmanager
def device_updatable(node: DeviceNode, *, stream: Any = None) -> Iterator[DeviceNode]:
    """``with ng.device_updatable(node):`` the one kernel launched in the
    block becomes ``node``'s kernel node, which kernels given ``node``
    update from the GPU with [set_grid][numbagraph.set_grid] and
    [set_enabled][numbagraph.set_enabled].

    The block records exactly one kernel launch on the node's capture stream
    (or ``stream``, a stream forked into that capture), at the top level of
    the capture or inside a conditional body (a ``while_loop``, an
    ``ng.repeat`` pass: a loop holding such a node records one pass per
    iteration).

    Parameters
    ----------
    node
        A DeviceNode of the capture, not yet attached.
    stream
        The stream the kernel is launched on, if not the node's capture
        stream.

    Raises
    ------
    TypeError
        ``node`` is not a DeviceNode.
    DeviceNodeError
        As the block opens, nothing recorded: the node's capture has ended,
        the node already has its kernel, ``stream`` is not in the node's
        capture, or a repeated pass of an unrolled loop records. As the
        block ends: it recorded something other than exactly one kernel
        launch on the stream; what it recorded stays, as ordinary nodes, and
        the node is not attached.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        node = ng.DeviceNode()
        plan[1, 32, s](count, node)          # ng.set_grid(node, ...)
        with ng.device_updatable(node):
            work[1, 128, s](data, count)     # runs with the grid plan set
    ```
    """
    if not isinstance(node, DeviceNode):
        raise TypeError(f"device_updatable takes an ng.DeviceNode, not {type(node).__name__}")
    what = "ng.device_updatable"
    session = node._live(f"cannot open {what}")
    recording = session.recording
    if node._attached:
        raise DeviceNodeError(
            f"{what}: {node._called()} already has its kernel node; a DeviceNode "
            "stands for one node. Make another DeviceNode. Nothing was recorded")
    handle = session.handle if stream is None else _backend.stream_handle(stream)
    if _registry.on(handle) is not session:
        raise DeviceNodeError(
            f"{what} was given {stream!r}, which does not record into the capture on "
            f"{session.stream!r} that {node._called()} belongs to. Nothing was recorded")
    if _unroll.pass_guarded(session):
        raise DeviceNodeError(
            f"{what}: a repeated pass of an unrolled loop (ng.repeat with unroll > 1) "
            "records now, and a DeviceNode stands for one node. Use unroll=1 or "
            "'auto'. Nothing was recorded")
    before = _backend.capture_node_count(handle)
    frontier = _backend.capture_frontier(handle)
    yield node
    added = _backend.capture_node_count(handle) - before
    problem = None
    if added != 1 or _backend.capture_frontier(handle) == frontier:
        problem = (f"the block recorded {added} node(s) in the graph the stream "
                   "records into, not one kernel launch on the stream")
    else:
        try:
            _backend.device_node_attach(recording, node._state, handle)
        except TypeError as exc:
            problem = str(exc)
    if problem is not None:
        raise DeviceNodeError(
            f"{what}: {problem}. Launch exactly one kernel inside the block. What it "
            f"recorded stays as ordinary nodes, and {node._called()} is not attached; "
            "the capture goes on")
    node._attached = True
    _unroll.held_launch(session)
