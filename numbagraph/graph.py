"""Captured graphs: instantiated, replayable, and owning what they use."""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable, Iterable, Sequence

from . import _graphmem, _hostcalls, _rebind, _registry
from ._rebind import Transition
from ._registry import release_when_idle
from . import nodes as _nodes
from ._hostcalls import attention as _host_attention
from ._registry import sessions as _captures
from .backend import active as _backend
from .errors import (
    CaptureStateError, CaptureWarning, DeviceMismatchError, DeviceNodeError, GraphClosedError,
    NumbagraphError, RebindError,
)
from .safety import (
    embed_child, guard_child_graph, guard_graph_launch, guard_instantiation,
    instantiation_forbidden,
)

__all__ = ["CapturedGraph"]


class _Resources:
    """What a graph must keep alive: its executable and every array its
    kernels were given. Only the graph refers to it, so it is released when
    the graph is closed or dropped, and nothing it holds keeps the graph
    alive; its ``__del__`` is the finalizer, since a ``weakref.finalize`` per
    graph would add to every capture."""

    __slots__ = ("executable", "keepalive", "spans", "launched", "memory", "launches", "fixed",
                 "operands", "device", "lock", "source", "runners", "retired", "epoch",
                 "frees_wait")

    def __init__(self, executable: Any, keepalive: list, memory: Any = None, device: int = 0):
        self.executable = executable
        # Held while the graph launches, is rebound, updated, described or
        # closed: CUDA does not lock an executable graph against calls made
        # at once from several threads, and a call that met an executable
        # destroyed under it would crash the process (issue 33).
        self.lock = threading.Lock()
        # The resources of the graph whose definition the executable runs
        # the parameters of since an update from it (None: its own), kept
        # while it does: a rebinding, a description or an update from this
        # graph reads that definition, under that graph's lock too.
        self.source: _Resources | None = None
        # How many graphs' sources this is, and, once this graph is closed
        # while some are, its executable: their nodes are described, and
        # they are rebound, from its definition, which goes with the last
        # of them (updated again, closed or dropped).
        self.runners = 0
        self.retired: Any = None
        # Moves on whenever the graph changes other than by a graphed
        # function's rebindings: the _rebind.Transitions kept before no
        # longer apply.
        self.epoch = 0
        # Whether freeing the graph's arrays waits for the device (the memory
        # manager numba gives every context), once asked.
        self.frees_wait: bool | None = None
        # The ordinal of the graph's device, on which its memory is freed.
        self.device = device
        self.keepalive = keepalive
        # The memory the graph allocates (a _graphmem.GraphMemory), if any.
        self.memory = memory
        # Once the graph is first rebound: the arrays its nodes use, as
        # [start, end, object], one per span (the rest stays in keepalive).
        self.spans: list[list] | None = None
        # Handles of the streams the graph was launched on.
        self.launched: set[int] = set()
        # The kernel launches described (nodes.Launches), once the launches
        # in keepalive are split up by a rebinding; until then, read there.
        self.launches: Any = None
        # The arrays nodes use where a rebinding cannot move them
        # (_rebind.Fixed entries of keepalive); None until first asked.
        self.fixed: list | None = None
        # The rules ops applied to their operands (_rebind.Operands entries
        # of keepalive, copied); None until first asked.
        self.operands: list | None = None

    def arrays(self) -> list:
        """Everything the graph keeps alive, as one list."""
        if self.spans is None:
            return self.keepalive
        return [*self.keepalive, *(entry[2] for entry in self.spans)]

    def release(self) -> None:
        with _runners_lock:
            executable, self.executable = self.executable, None
            if self.runners and executable is not None:
                self.retired, executable = executable, None
            source, self.source = self.source, None
            done = None if source is None else source.let_go()
        if done is not None:
            release_when_idle(functools.partial(_free, done, [], set()))
        keepalive, self.keepalive = self.arrays(), []
        self.spans = None
        memory, owned = self.memory, []
        if memory is not None and memory.phase == _graphmem.CAPTURED:
            owned = memory.end(_graphmem.CLOSED)
        if executable is None and not keepalive:
            return
        # Destroying a graph or freeing what it used can break a capture in
        # progress (on any thread), so that waits for no capture to be active.
        release_when_idle(functools.partial(
            _free, executable, keepalive, set(self.launched), owned,
            None if memory is None else memory.stream,
            None if memory is None else memory.stream_object, self.device))

    def run_from(self, source: "_Resources | None") -> None:
        """Run the parameters of ``source``'s definition (None: its own)
        from now on; the source run until now is let go."""
        with _runners_lock:
            old, self.source = self.source, source
            if source is not None:
                source.runners += 1
            done = None if old is None else old.let_go()
        if done is not None:
            release_when_idle(functools.partial(_free, done, [], set()))

    def let_go(self) -> Any:
        """One graph fewer runs this one's definition: its executable, kept
        since it was closed, once no graph does; else None. Call with
        ``_runners_lock`` held."""
        self.runners -= 1
        if self.runners or self.retired is None:
            return None
        retired, self.retired = self.retired, None
        return retired

    def _frees_wait(self) -> bool:
        wait = self.frees_wait
        if wait is None:
            wait = self.frees_wait = _backend.frees_wait_for_device()
        return wait

    def drop(self, keepalive: list) -> None:
        """Release ``keepalive``, which the graph no longer uses, as
        :meth:`release` does: at once where no capture runs and no launch of
        the graph needs waiting for."""
        if not _captures and (not self.launched or self._frees_wait()):
            # Under the registry's lock no capture begins while they go.
            lock = _registry.lock
            if lock.acquire(blocking=False):
                try:
                    if not _captures:
                        keepalive.clear()
                        return
                finally:
                    lock.release()
        release_when_idle(functools.partial(_free, None, keepalive, set(self.launched)))

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001  at interpreter exit the driver may be gone
            return


# Held while a graph's source, or the count of graphs whose source it is,
# changes: a source's graph may close on one thread while another lets it go.
# Reentrant: a graph let go may be finalized at once.
_runners_lock = threading.RLock()


def _refused(exc: Exception) -> RebindError:
    """The error of a rebinding whose node updates the driver refused."""
    return RebindError(
        f"rebind: the driver refused to change the graph's nodes ({exc}); the graph is "
        "unchanged. Capture the work again with the new arrays")


def _free(executable: Any, keepalive: list, launched: set[int], owned: Sequence[Any] = (),
          last: int | None = None, last_stream: Any = None, device: int = 0) -> None:
    """Destroy the executable (CUDA lets a running graph be destroyed: it
    goes once its work ends), free the graph-owned memory its last launch
    (on the stream ``last``) left allocated, in that stream's order, and
    drop the arrays it used. Replays may still run: a memory manager whose
    frees do not wait for the device gets them only once the streams the
    graph ran on have finished. ``last_stream``, the object whose handle
    ``last`` is, is held until the frees are enqueued."""
    try:
        if executable is not None:
            executable.close()
    finally:
        if owned:
            # Freed in the graph's device's context, whichever device is
            # current, even where destroying the executable failed.
            _backend.release_graph_memory(owned, last, device)
    if keepalive and launched and not _backend.frees_wait_for_device():
        _wait_for(launched)
    keepalive.clear()


def _wait_for(launched: Iterable[int]) -> None:
    """Wait for the work of the streams a graph was launched on (their
    handles); a stream destroyed since has none left."""
    for handle in launched:
        try:
            _backend.synchronize(handle)
        except Exception:  # noqa: BLE001  a destroyed stream has no work left
            pass


def _counting(launch: Any, memory: Any, handle: int, stream: Any) -> Any:
    """``launch``, counting the launches of a graph that owns memory: its
    memory exists from the first, and each makes it again. The stream of
    the last launch is kept: the graph's memory is freed in its order."""
    def counted() -> None:
        launch()
        memory.launches += 1
        memory.stream, memory.stream_object = handle, stream

    return counted


class _ClosedLaunchers(dict):
    """What a closed graph launches through: every lookup refuses."""

    def get(self, handle: int, default: Any = None) -> Any:
        raise GraphClosedError(
            "this graph was closed; capture a new one to replay the work"
        )


class _Held:
    """The locks of some graphs' resources and of their sources, held for a
    block: taken in one order (by id), so that threads taking several never
    wait on one another in a cycle. A source changes only under its graph's
    lock; one that changed while the locks were taken is taken again."""

    __slots__ = ("_graphs", "_locks")

    def __init__(self, *graphs: _Resources):
        self._graphs = graphs
        self._locks: list = []

    def __enter__(self) -> None:
        graphs = self._graphs
        if len(graphs) == 1 and graphs[0].source is None:
            # One graph that runs its own definition: its lock alone.
            lock = graphs[0].lock
            lock.acquire()
            if graphs[0].source is None:
                self._locks = [lock]
                return
            lock.release()
        while True:
            sources = [res.source for res in graphs]
            wanted = {id(res): res.lock for res in (*graphs, *sources) if res is not None}
            locks = [wanted[key] for key in sorted(wanted)]
            for lock in locks:
                lock.acquire()
            if all(res.source is source for res, source in zip(graphs, sources)):
                self._locks = locks
                return
            for lock in reversed(locks):
                lock.release()

    def __exit__(self, *exc_info: Any) -> None:
        locks, self._locks = self._locks, []
        for lock in reversed(locks):
            lock.release()


class CapturedGraph:
    """An instantiated CUDA graph recorded by
    [capture][numbagraph.capture.capture] or
    [end_capture][numbagraph.end_capture]; not made directly.

    ``launch()`` replays every recorded launch as one submission on the stream
    the graph was captured on (or another one). The graph holds a reference
    to every device array and DeviceScalar its kernels were given, so none is
    freed while the graph lives. ``close()`` (or leaving a ``with`` block)
    frees the graph at once; dropping the last reference does the same later.
    While any capture is in progress the freeing waits for the last one to
    end, because destroying a graph or freeing memory can break a capture.

    A graph may be shared by threads: its launches, rebindings, updates,
    descriptions and ``close()`` take turns (each holds the graph's lock),
    and a call that comes after another thread's ``close()`` raises
    GraphClosedError.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        step[4, 256, s](x, pos)
    with cap.graph as graph:
        for t in range(100):
            pos.update(t)
            graph.launch()
    ```
    """

    def __init__(self, executable: Any, stream: Any, handle: int, keepalive: list,
                 memory: Any = None, device: int = 0):
        self._res = _Resources(executable, keepalive, memory, device)
        self._lock = self._res.lock
        self._stream = stream
        self._handle = handle
        self._device = device
        self._launchers: dict[int, Any] = {}
        self._nodes: tuple[_nodes.Node, ...] | None = None

    def _executable(self) -> Any:
        executable = self._res.executable
        if executable is None:
            raise GraphClosedError(
                "this graph was closed; capture a new one to replay the work"
            )
        return executable

    def _instantiated(self) -> Any:
        executable = self._executable()
        if not executable.instantiated:
            # Captured while another capture was active; instantiating is
            # itself refused during some captures. No capture begins while
            # the registry's lock is held, so none can come to forbid it
            # between the check and the driver's call.
            with _registry.lock:
                if not instantiation_forbidden():
                    executable.instantiate()
            # Releases that could not take the lock meanwhile wait for no one.
            _registry.run_deferred()
            if not executable.instantiated:
                guard_instantiation()  # raises, naming the captures that forbid it
                return self._instantiated()
        return executable

    def _target(self, stream: Any) -> int:
        return self._handle if stream is None else _backend.stream_handle(stream)

    @property
    def device(self) -> int:
        """The ordinal of the device the graph was captured on, where it
        runs: it launches on streams of that device only."""
        return self._device

    def _check_device(self, stream: Any, handle: int, what: str) -> None:
        """Refuse ``stream``, of another device than the graph's; checked once
        per stream the graph launches on, before its first launch there."""
        if stream is None or handle == self._handle or _backend.device_count() < 2:
            return
        device = _backend.stream_device_id(stream)
        if device != self._device:
            raise DeviceMismatchError(
                f"{what}: the graph was captured on device {self._device} and runs "
                f"there, but {stream!r} is a stream of device {device}. Launch it on "
                f"a stream of device {self._device} (made with `with "
                f"cuda.gpus[{self._device}]: s = cuda.stream()`), or capture the "
                f"work again on device {device} for a graph of its own")

    def launch(self, stream: Any = None) -> None:
        """Replay the graph on ``stream`` (default: the capture stream).

        While ``stream`` captures (or is forked into a capture), the graph
        is not run: it is recorded into that capture as one child graph
        node, after the work enqueued on ``stream`` so far, and each launch
        of the new graph runs it there. The node is a copy of this graph as
        it runs now; the new graph keeps the arrays and scalars it uses
        alive, whatever becomes of this one.

        The graph runs on the device it was captured on
        ([device][numbagraph.CapturedGraph.device]), whichever device is
        current: the launch is made in that device's context. ``stream``
        must belong to that device.

        Parameters
        ----------
        stream
            The stream to replay on; the capture stream when None.

        Raises
        ------
        TypeError
            ``stream`` is not a stream.
        GraphClosedError
            The graph was closed.
        GraphMemoryError
            ``stream`` captures and this graph allocates memory inside it,
            which CUDA does not embed in another graph. Nothing was recorded.
        ConditionalError
            ``stream`` captures and this graph holds a conditional node,
            which CUDA forbids in a child graph. Nothing was recorded.
        NumbagraphError
            ``stream`` captures and this graph was rebound since its
            capture. Nothing was recorded.
        UncapturableOperationError
            The graph, captured while another capture was active, must be
            instantiated now and a capture forbids it; or the driver could
            not record it into the capture on ``stream``. The capture is
            ended.
        ForeignStreamInCaptureError
            ``stream`` is the legacy default stream while a stream captures.
        DeviceMismatchError
            ``stream`` (or the capture it records into) belongs to another
            device than the graph's ([device][numbagraph.CapturedGraph.device]);
            nothing was launched.
        HostCallbackError
            A host callback ([on_host][numbagraph.on_host]) raised since the
            last report: its exception, raised from this one; nothing was
            launched.
        CudaInHostCallbackError
            Called from inside a host callback.

        Warns
        -----
        CaptureWarning
            ``stream`` (inside a capture: the capture's own stream, on which
            the new graph launches) is not the stream the updates of the
            graph's DeviceScalars are ordered on, so the replay may read an
            older value.

        Examples
        --------
        ```python
        for t in range(100):
            pos.update(t)
            graph.launch()
        with ng.capture(s) as outer:
            graph.launch(s)              # a child graph node
            graph.launch(s)
        outer.graph.launch()             # runs graph twice
        ```
        """
        handle = self._handle if stream is None else _backend.stream_handle(stream)
        if _host_attention[0]:
            _hostcalls.refuse_here("graph.launch()")
            _hostcalls.report("graph.launch()")
        if _captures:
            session = _registry.on(handle)
            if session is not None:
                with _Held(self._res):
                    self._embed(session, handle)
                return
            guard_graph_launch(handle, "graph.launch()")
        # CUDA requires the calls on one executable to take turns. Under the
        # lock a closed graph's launchers refuse: close() swaps them under it
        # before the executable goes. (acquire/release: half the cost of `with`.)
        lock = self._lock
        lock.acquire()
        try:
            launch = self._launchers.get(handle)
            if launch is None:
                launch = self._launcher(stream, handle)
            launch()
        finally:
            lock.release()

    def _launcher(self, stream: Any, handle: int) -> Any:
        """The call that launches the graph on ``handle``, made at its first
        launch there; the graph's lock is held."""
        if handle != self._handle:
            self._check_device(stream, handle, "graph.launch()")
            self._warn_if_scalars_unordered(stream)
        launch = self._instantiated().launcher(handle)
        memory = self._res.memory
        if memory is not None:
            launch = _counting(launch, memory, handle,
                               self._stream if stream is None else stream)
        self._launchers[handle] = launch
        self._res.launched.add(handle)
        return launch

    def _refuse_other_device(self, session: Any, what: str) -> None:
        """Refuse ``what``, which records the graph into the capture
        ``session``, when that capture records on another device."""
        if session.device != self._device:
            raise DeviceMismatchError(
                f"{what}: the graph was captured on device {self._device}, the capture "
                f"on {session.stream!r} records on device {session.device}, and a "
                "graph runs only on its own device. Capture the work on device "
                f"{session.device} too, or launch the graph outside this capture. "
                "Nothing was recorded")

    def _embeddable(self, what: str) -> Any:
        """The executable, once sure ``what`` may record the graph into a
        capture as a child graph node (raises as guard_child_graph says)."""
        res = self._res
        executable = self._executable()
        guard_child_graph(executable, res.memory, res.spans is not None, what)
        return executable

    def _embed(self, session: Any, handle: int) -> None:
        """Record the graph into the capture ``session``, on its stream
        ``handle``, as a child graph node."""
        what = "graph.launch() inside a capture"
        self._refuse_other_device(session, what)
        executable = self._embeddable(what)
        self._warn_if_scalars_unordered(session.stream)
        kept = list(self._res.arrays())
        if self._res.fixed:
            # Its aligned Fixed entries where its rebinding put them.
            kept = [entry for entry in kept if type(entry) is not _rebind.Fixed
                    or not entry.align] + [entry.copy() for entry in self._res.fixed
                                           if entry.align]
        embed_child(session, handle, executable, kept, what)

    def _warn_if_scalars_unordered(self, stream: Any) -> None:
        """Updates of the graph's scalars are ordered on the scalars' streams,
        not on ``stream``: a launch there may run before them."""
        handle = _backend.stream_handle(stream)
        wrappers = _registry.device_wrappers
        keepalive = self._res.keepalive
        # A scalar whose update the graph records is set inside it, in order.
        recorded = {id(entry) for entry in keepalive if type(entry) in wrappers}
        given = [
            obj
            for entry in keepalive
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], tuple)
            for obj in entry[1]
        ] + [entry[2] for entry in self._res.spans or ()]
        streams = {
            repr(obj.stream)
            for obj in given
            if type(obj) in wrappers and hasattr(obj, "update") and id(obj) not in recorded
            and _backend.stream_handle(obj.stream) != handle
        }
        if streams:
            warnings.warn(
                f"graph.launch(stream={stream!r}): the graph reads DeviceScalars whose "
                f"updates are ordered on {', '.join(sorted(streams))}, not on this "
                "stream, so this launch may run before the latest update() and read "
                "an older value. Launch on the scalars' stream (graph.launch()), or "
                "make this stream wait for it (record an event there and "
                "event.wait(this stream)) after each update",
                CaptureWarning, stacklevel=3,
            )

    def upload(self, stream: Any = None) -> None:
        """Upload the graph to the device ahead of its first launch, so that
        launch does not pay for it.

        As a launch is, the upload (and the graph's instantiation, where it
        comes first) is made on the graph's own device
        ([device][numbagraph.CapturedGraph.device]) whichever device is
        current; ``stream`` must belong to that device.

        Parameters
        ----------
        stream
            The stream to upload on; the capture stream when None.

        Raises
        ------
        TypeError
            ``stream`` is not a stream.
        GraphClosedError
            The graph was closed.
        UncapturableOperationError
            ``stream`` captures (CUDA does not record a graph upload into a
            capture), or the graph, captured while another capture was
            active, must be instantiated now and a capture forbids it; the
            capture that forbids it is ended.
        ForeignStreamInCaptureError
            ``stream`` is the legacy default stream while a stream captures.
        DeviceMismatchError
            ``stream`` belongs to another device than the graph's; nothing
            was uploaded.
        CudaInHostCallbackError
            Called from inside a host callback.
        """
        handle = self._target(stream)
        if _host_attention[0]:
            _hostcalls.refuse_here("graph.upload()")
        if _captures:
            guard_graph_launch(handle, "graph.upload()")
        self._check_device(stream, handle, "graph.upload()")
        with self._lock:
            self._instantiated().upload(handle)

    def update(self, other: "CapturedGraph") -> None:
        """Take the kernel arguments and scalars of ``other``, a graph of the
        same shape (same kernels and launch configurations in the same
        order), without re-instantiating. ``other`` stays usable, and may be
        closed or dropped: this graph keeps its definition, which its nodes
        are described and rebound from, until it is updated again or
        closed.

        Parameters
        ----------
        other
            A graph captured from the same sequence of kernels and launch
            configurations.

        Raises
        ------
        TypeError
            ``other`` is not a CapturedGraph.
        GraphClosedError
            This graph or ``other`` was closed.
        NumbagraphError
            The graphs differ in shape; capture a new graph instead.
        DeviceMismatchError
            ``other`` was captured on another device than this graph
            ([device][numbagraph.CapturedGraph.device]); nothing changed.
        DeviceNodeError
            Either graph holds a device-updatable kernel node
            ([device_updatable][numbagraph.device_updatable]); nothing changed.
        UncapturableOperationError
            This graph must be instantiated now and a capture forbids it.

        Examples
        --------
        ```python
        with ng.capture(s) as cap:
            step[4, 256, s](y, pos)      # same kernel, another array
        graph.update(cap.graph)          # graph now runs on y
        ```
        """
        if not isinstance(other, CapturedGraph):
            raise TypeError(f"update() takes a CapturedGraph, not {type(other).__name__}")
        if _host_attention[0]:
            _hostcalls.refuse_here("graph.update()")
        if other._device != self._device:
            raise DeviceMismatchError(
                f"graph.update(): this graph was captured on device {self._device} and runs "
                f"there, and the graph given was captured on device {other._device}: its "
                f"kernels and arrays are device {other._device}'s. Update from a graph "
                f"captured on device {self._device} (the same work, with `with "
                f"cuda.gpus[{self._device}]:` around its capture), or launch the other graph "
                "on its own device. The graph is unchanged")
        if self._owns_memory() or other._owns_memory():
            raise NumbagraphError(
                "graph update: a graph that allocates memory inside it cannot be "
                "updated from another graph, or be the source of an update: each "
                "graph's memory is its own, at addresses the other's nodes do not "
                "hold. Capture a new graph, or rebind() the arrays made outside it")
        if self._res.executable is not None and other._res.executable is not None and (
                _backend.device_node_count(self._res.executable)
                or _backend.device_node_count(other._res.executable)):
            raise DeviceNodeError(
                "graph update: a graph holding a device-updatable kernel node "
                "(ng.device_updatable) cannot be updated from another graph, or be the "
                "source of an update: CUDA refuses cuGraphExecUpdate for it. Capture a "
                "new graph, or rebind() its arrays. The graph is unchanged")
        with _Held(self._res, other._res):
            self._update(other)

    def _update(self, other: "CapturedGraph") -> None:
        """``update``, checked; both graphs' locks are held."""
        executable, source = self._instantiated(), other._executable()
        try:
            executable.update(source)
        except GraphClosedError:
            raise
        except Exception as exc:
            raise NumbagraphError(
                f"graph update failed: {exc}. update() needs a graph captured "
                "from the same sequence of kernels and launch configurations; "
                "capture a new graph instead"
            ) from exc
        # The graph now runs other's arguments, and only those; the old ones
        # are dropped as a closed graph's are, once no capture runs.
        superseded = self._res.arrays()
        self._res.epoch += 1
        self._res.keepalive = list(other._res.keepalive)
        self._res.launches, self._nodes = other._res.launches, None
        # other's Fixed entries where other's rebinding put them, as copies.
        self._res.fixed = None if other._res.fixed is None else [
            entry.copy() if entry.align else entry for entry in other._res.fixed]
        self._res.spans = None if other._res.spans is None else [
            list(entry) for entry in other._res.spans]
        self._res.operands = None if other._res.operands is None else [
            entry.copy() for entry in other._res.operands]
        # The executable runs the parameters of other's definition, or of the
        # one other runs (the backend's choice too), until updated again.
        runs = other._res.source or other._res
        self._res.run_from(None if runs is self._res else runs)
        self._res.drop(superseded)

    def rebind(self, mapping: Any) -> None:
        """Point the graph at other arrays of the same layout, without
        capturing or instantiating again.

        Every argument of every recorded node that points into an old
        array's memory (the array itself or any view of it: ``x[1:]``, a
        row, a reshape) is re-pointed at the same offset into the new one:
        kernel arguments, device copies and fills, recorded
        ``DeviceScalar.update`` calls and the nodes inside while/if/switch
        bodies alike. The graph then keeps the new arrays alive and drops
        the old ones. Launches already enqueued run with the arrays they
        were launched with (CUDA's rule); launches from now on use the new
        ones. A rebinding and another thread's launch, rebinding, update or
        ``close()`` of the graph take turns; one that comes after the graph
        was closed raises GraphClosedError before anything changes.

        Parameters
        ----------
        mapping
            ``{old: new}``, or an iterable of ``(old, new)`` pairs; each a
            device array, an object with ``__cuda_array_interface__``, or a
            DeviceScalar (rebound to a DeviceScalar), the new one with the
            old one's shape, dtype and strides.

        Raises
        ------
        RebindError
            An old array is not used by the graph, a pair differs in layout
            or kind, two old arrays overlap, or ``mapping`` is not a mapping;
            or an old array is used by cuBLAS's kernels
            ([matmul_into][numbagraph.matmul_into]), which hold its address
            where numbagraph cannot move it; or, after it, an op recorded in
            the graph would be given operands it refuses when called (an
            input shifted over its output). Checked before anything
            changes: the graph is left as it was.
        GraphClosedError
            The graph was closed (by this thread, or by another one before
            the rebinding took its turn); nothing changed.
        CaptureStateError
            Called while the calling thread captures: a rebinding is not
            recorded, and takes effect at once.
        UncapturableOperationError
            The graph, captured while another capture was active, must be
            instantiated now and a capture forbids it.
        DeviceMismatchError
            A new array or DeviceScalar lives on another device than the
            graph's ([device][numbagraph.CapturedGraph.device]). Checked
            before anything changes.

        Examples
        --------
        ```python
        with ng.capture(s) as cap:
            step[4, 256, s](x, pos)
        graph = cap.graph
        graph.rebind({x: y})     # the same step, on y
        graph.launch()
        ```
        """
        self._rebind(_rebind.pairs_of(mapping), strict=True)

    def _rebind(self, pairs: list[tuple[Any, Any]], strict: bool) -> None:
        """``rebind``; with ``strict`` False, old arrays the graph does not
        use are let through (a graphed function's unused arguments)."""
        self._move(pairs, _rebind.moves_for(pairs), strict)

    def _move(self, pairs: list[tuple[Any, Any]], moves: list[Any], strict: bool,
              record: bool = False, keep: bool = True) -> Transition | None:
        """Make ``moves``, checked already, one per pair of ``pairs``; with
        ``record`` (a graphed function's rebinding), return the
        :class:`~numbagraph._rebind.Transition` that makes it again, or None
        where it cannot be made again (nothing moved, device nodes that need
        it made whole each time, new arrays over memory the graph uses
        besides) or is not to be kept (``keep`` false: the transitions kept
        before stay valid, as after any recorded rebinding)."""
        self._refuse_rebinding_here()
        if not moves:
            self._executable()
            return None
        with _Held(self._res):
            return self._make_moves(pairs, moves, strict, record, keep)

    def _redo(self, transition: Transition, news: list[Any],
              targets: Callable[[], list[Any]]) -> bool:
        """Make ``transition`` again, to ``news``, the new objects of the
        rebinding it was made by (``targets()``: their device arrays);
        False, changing nothing, where the graph changed otherwise since."""
        if _host_attention[0] or _captures:
            self._refuse_rebinding_here()
        res = self._res
        # A graph that runs its own definition takes its lock alone, as
        # _Held does, without making one (this is a replay loop's path).
        lock = res.lock
        lock.acquire()
        try:
            if res.source is None:
                return self._redo_held(transition, news, targets)
        finally:
            lock.release()
        with _Held(res):
            return self._redo_held(transition, news, targets)

    def _redo_held(self, transition: Transition, news: list[Any],
                   targets: Callable[[], list[Any]]) -> bool:
        """``_redo`` once the graph's lock is held."""
        res = self._res
        executable = self._executable()
        spans = res.spans
        if res.epoch != transition.epoch or spans is None:
            return False
        try:
            if not executable.redo_rebind(transition.change, targets):
                return False
        except Exception as exc:
            raise _refused(exc) from exc
        res.drop(_rebind.redo_transition(transition, spans, res.keepalive, news))
        return True

    def _refuse_rebinding_here(self) -> None:
        if _host_attention[0]:
            _hostcalls.refuse_here("graph.rebind()")
        if _captures:
            mine = [s for s in _registry.active() if s.thread is threading.current_thread()]
            if mine:
                raise CaptureStateError(
                    f"graph.rebind() while this thread captures on {mine[0].stream!r}: "
                    "a rebinding is not recorded into a capture, it changes the graph "
                    "at once. Rebind before the capture begins or after it ends")

    def _make_moves(self, pairs: list[tuple[Any, Any]], moves: list[Any], strict: bool,
                    record: bool, keep: bool = True) -> Transition | None:
        """``_move`` once the graph's lock is held: a graph closed meanwhile
        raises GraphClosedError here, before the driver is asked anything."""
        self._executable()
        if _backend.device_count() > 1:
            self._refuse_other_device_arrays(pairs, moves)
        res = self._res
        if res.fixed is None:
            res.fixed = _rebind.fixed_of(res.keepalive)
        if res.fixed:
            _rebind.check_fixed(res.fixed, moves)
        plan = self._instantiated().plan_rebind(moves)
        if res.spans is None:
            # What describes the graph's launches is kept before they go.
            if res.launches is None:
                res.launches = _nodes.launches_of(res.keepalive)
            res.keepalive, res.spans = _rebind.spans_of(res.keepalive)
        held = _rebind.check_held(res.spans, pairs, moves)
        for i, used in enumerate(plan.used):
            if used:
                continue
            move = moves[i]
            if any(move.start <= start < move.end for start, end, _ in res.spans if end > start):
                raise RebindError(
                    f"rebind pair {i}: the graph was given this array, but no node of it "
                    "holds a pointer numbagraph can move; the graph is unchanged. "
                    "Capture the work again with the new arrays")
            if strict:
                raise RebindError(
                    f"rebind: the graph does not use the {type(pairs[i][0]).__name__} given "
                    f"as old array of pair {i} (no node points into its memory); "
                    "rebind only arrays the graph's launches, copies or fills were given")
        if res.operands is None:
            res.operands = _rebind.operands_of(res.keepalive)
        if res.operands:
            _rebind.check_operands(res.operands, moves)
        device_nodes = _backend.device_node_count(res.executable)
        if res.launched and device_nodes:
            # CUDA leaves a node's host update undefined while a kernel may be
            # updating it from the device: the graph's launches end first.
            _wait_for(tuple(res.launched))
        try:
            plan.apply()
        except Exception as exc:
            raise _refused(exc) from exc
        if res.fixed:
            _rebind.shift_fixed(res.fixed, moves)
        if res.operands:
            _rebind.shift_operands(res.operands, moves)
        # The old arrays go once no capture runs, as a closed graph's do.
        replaced, scalars = _rebind.rebind_spans(held, res.keepalive, pairs, moves)
        res.drop(replaced)
        if not record:
            res.epoch += 1
            return None
        if device_nodes or not keep:
            return None
        return _rebind.transition_of(res.epoch, plan.change, res.spans, held, scalars, moves,
                                     res.fixed, res.operands)

    def _reparameterise(self, launches: list, keepalive: list) -> str | None:
        """Give the graph's kernel, copy and fill nodes ``launches`` (the
        work the backend's ``divert_launches`` took from a run that recorded
        nothing else), keeping ``keepalive``, what that run's capture kept,
        instead of what it keeps now; or, changing nothing, say why the
        graph cannot take them."""
        with _Held(self._res):
            self._executable()
            res = self._res
            if res.fixed is None:
                res.fixed = _rebind.fixed_of(res.keepalive)
            # Kernels reading 16 bytes at a time are chosen again by the run
            # for its arrays' alignment; a library's nodes are not.
            if any(not fixed.align for fixed in res.fixed):
                return ("the graph holds work of a library (cuBLAS, NCCL) whose nodes keep "
                        "their sizes and addresses")
            if _backend.device_node_count(res.executable):
                return "the graph holds a device-updatable kernel node (ng.device_updatable)"
            if res.memory is not None:
                return "the graph owns memory (ng.empty inside the function)"
            reason = self._instantiated().reparameterise(launches)
            if reason is not None:
                return reason
            old = res.arrays()
            res.epoch += 1
            res.keepalive, res.spans = keepalive, None
            res.launches = res.operands = res.fixed = None
            self._nodes = None
            # The old arrays go once no capture runs, as a rebinding's do.
            res.drop(old)
            return None

    def _refuse_other_device_arrays(self, pairs: list[tuple[Any, Any]],
                                    moves: list[Any]) -> None:
        """Refuse a rebinding to an array or DeviceScalar of another device
        than the graph's, before anything changes: its nodes would read
        memory of another device."""
        wrappers = _registry.device_wrappers
        for i, ((_, new), move) in enumerate(zip(pairs, moves)):
            found = getattr(new, "device", None) if type(new) in wrappers else None
            if not isinstance(found, int):
                found = _backend.array_device_id(move.target)
            if found is not None and found != self._device:
                raise DeviceMismatchError(
                    f"rebind pair {i}: the new {type(new).__name__} lives on device {found}, "
                    f"but the graph was captured on device {self._device} and runs there, "
                    f"where it cannot be read. Rebind to arrays and scalars of device "
                    f"{self._device} (copy it across first), or capture the work again on "
                    f"device {found} for a graph of its own. The graph is unchanged")

    def close(self) -> None:
        """Free the graph now (or, during a capture, once no capture is
        active). Launching it afterwards raises GraphClosedError.

        Closing a closed graph does nothing; ``close`` raises nothing. It
        waits for a launch, rebinding or update of the graph that another
        thread is making; whatever that thread does next with the graph
        raises GraphClosedError.
        """
        with self._lock:
            self._launchers = _ClosedLaunchers()
            self._res.release()

    @property
    def closed(self) -> bool:
        """Whether the graph was closed."""
        return self._res.executable is None

    def _owns_memory(self) -> bool:
        memory = self._res.memory
        return memory is not None and memory.nbytes > 0

    @property
    def memory_bytes(self) -> int:
        """Bytes of device memory the graph allocates inside it (the arrays
        made during its capture), whether freed inside it or not; 0 for a
        graph that allocates nothing.

        Raises
        ------
        GraphClosedError
            The graph was closed.
        """
        self._executable()
        memory = self._res.memory
        return 0 if memory is None else memory.nbytes

    @property
    def num_nodes(self) -> int:
        """How many nodes the graph holds (one per kernel launch or memset).

        Raises
        ------
        GraphClosedError
            The graph was closed.
        """
        with self._lock:
            return self._executable().num_nodes

    @property
    def nodes(self) -> tuple[_nodes.Node, ...]:
        """The graph's nodes, one [Node][numbagraph.Node] record each, in a
        stable topological order (a node after those it depends on), the
        nodes of a conditional body nested in its node's ``bodies``; the
        same on the driver and on the simulator.

        A kernel node names the Python kernel it runs, where it is defined,
        its grid, block and dynamic shared memory, and the arguments its
        launch was given (arrays by shape and dtype, numbers by type and
        value, DeviceScalars and Conditions by the ``name`` they were made
        with). A memset gives its bytes and value, a copy its bytes and
        direction, a memory node the bytes it allocates or frees. The
        records describe the work as captured, or as taken by
        [update][numbagraph.CapturedGraph.update], whatever became of the
        graph it was taken from (closed or dropped since): a rebinding
        keeps every shape and dtype, and they keep the names of what was
        captured.

        Raises
        ------
        GraphClosedError
            The graph was closed.

        Examples
        --------
        ```python
        kernels = [n.name for n in graph.nodes if n.kind == "kernel"]
        ```
        """
        with _Held(self._res):
            executable = self._executable()
            found = self._nodes
            if found is None:
                res = self._res
                launches = res.launches
                if launches is None:
                    launches = _nodes.launches_of(res.keepalive)
                found = self._nodes = _nodes.build(executable, launches)
            return found

    def summary(self) -> str:
        """A table of the graph's [nodes][numbagraph.CapturedGraph.nodes]:
        one row per node (index, kind, name, grid, block, shared bytes, what
        it reads, the indices it depends on), each conditional body's rows
        indented under its node.

        Returns
        -------
        str
            The table, one line per row.

        Raises
        ------
        GraphClosedError
            The graph was closed.

        Examples
        --------
        ```python
        print(graph.summary())
        ```
        """
        return _nodes.summary(self.nodes)

    def to_dot(self) -> str:
        """The graph's [nodes][numbagraph.CapturedGraph.nodes] as Graphviz
        DOT text: a node per graph node, kernels named as in Python, an edge
        per dependency, each conditional body a cluster under its node.

        Returns
        -------
        str
            DOT text, for ``dot -Tsvg`` or any DOT viewer.

        Raises
        ------
        GraphClosedError
            The graph was closed.

        Examples
        --------
        ```python
        text = graph.to_dot()
        ```
        """
        return _nodes.to_dot(self.nodes)

    def save(self, path: Any) -> None:
        """Write the graph's drawing to ``path``: ``.dot`` writes the DOT
        text of [to_dot][numbagraph.CapturedGraph.to_dot]; ``.svg`` and
        ``.png`` draw it with Graphviz's ``dot`` program.

        Parameters
        ----------
        path
            A str or path ending in ``.dot``, ``.svg`` or ``.png``.

        Raises
        ------
        ValueError
            ``path`` ends in another suffix.
        TypeError
            ``path`` is not a str or path.
        GraphClosedError
            The graph was closed.
        NumbagraphError
            ``.svg`` or ``.png``, and Graphviz's ``dot`` is not installed
            (install Graphviz, or save ``.dot``), or it failed.

        Examples
        --------
        ```python
        graph.save("step.dot")
        graph.save("step.svg")      # needs Graphviz
        ```
        """
        _nodes.save(path, self.to_dot)

    @property
    def stream(self) -> Any:
        """The stream the graph was captured on, and launches on by default."""
        return self._stream

    def __enter__(self) -> "CapturedGraph":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            return f"<CapturedGraph {self.num_nodes} nodes on {self._stream!r}>"
        except GraphClosedError:
            return "<CapturedGraph closed>"
