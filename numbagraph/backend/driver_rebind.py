"""Re-pointing a graph's nodes at other memory, node by node, on the driver.

A graph's nodes are read once, from the definition whose parameters the
executable runs, into an index of every device pointer they hold: each
8-byte, 8-aligned kernel parameter, the device ends of copies and the
destination of fills. A rebinding moves each pointer that falls inside a
moved range by that range's shift and sets the changed nodes on the
executable (``cuGraphExec*NodeSetParams``); definitions never change, so the
index is what the executable runs.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any, Sequence

from cuda.bindings import driver as cu

from ..errors import RebindError
from .driver_base import DriverError, check, in_context
from .interface import Move

__all__ = ["Change", "NodeIndex", "graph_nodes"]

_TYPES = cu.CUgraphNodeType
_KERNEL = _TYPES.CU_GRAPH_NODE_TYPE_KERNEL
_MEMCPY = _TYPES.CU_GRAPH_NODE_TYPE_MEMCPY
_MEMSET = _TYPES.CU_GRAPH_NODE_TYPE_MEMSET
_DEVICE_MEMORY = (cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, cu.CUmemorytype.CU_MEMORYTYPE_UNIFIED)


def graph_nodes(graph: Any, bodies: Sequence[Any]) -> list[Any]:
    """Every node of ``graph`` and then of its conditional ``bodies``, each
    graph's nodes in the order the driver gives them (that of their making,
    which graph updates pair nodes by)."""
    nodes: list[Any] = []
    for g in (graph, *bodies):
        _, count = check("cuGraphGetNodes", cu.cuGraphGetNodes(g))
        if count:
            found, count = check("cuGraphGetNodes", cu.cuGraphGetNodes(g, count))
            nodes.extend(found[:count])
    return nodes


# A kernel's parameter layout, ``[(offset, size), ...]``, by function handle.
_layouts: dict[tuple[str, int], list[tuple[int, int]]] = {}


def _layout(params: Any) -> list[tuple[int, int]]:
    if int(params.func):
        key, query, handle = ("func", int(params.func)), cu.cuFuncGetParamInfo, params.func
    else:
        key, query, handle = ("kern", int(params.kern)), cu.cuKernelGetParamInfo, params.kern
    layout = _layouts.get(key)
    if layout is None:
        layout = []
        while True:
            err, offset, size = query(handle, len(layout))
            if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
                break  # past the last parameter
            if err != cu.CUresult.CUDA_SUCCESS:
                raise DriverError(query.__name__, err)
            layout.append((int(offset), int(size)))
        _layouts[key] = layout
    return layout


# cuLaunchKernel's ``extra`` keys.
_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0


def _packed(extra: int) -> int:
    """The address of the packed parameter buffer an ``extra`` array names
    (a launch made with ``CU_LAUNCH_PARAM_BUFFER_POINTER``)."""
    items = ctypes.cast(extra, ctypes.POINTER(ctypes.c_void_p))
    i = 0
    while (items[i] or _END) != _END:
        if items[i] == _BUFFER_POINTER:
            return int(items[i + 1] or 0)
        i += 2
    raise DriverError("cuGraphKernelNodeGetParams", cu.CUresult.CUDA_ERROR_INVALID_VALUE)


_DIM_FIELDS = ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
               "sharedMemBytes")
_LAUNCH_FIELDS = ("func", "kern", "ctx", "gridDimX", "gridDimY", "gridDimZ",
                  "blockDimX", "blockDimY", "blockDimZ", "sharedMemBytes")
_MEMCPY_FIELDS = tuple(
    end + field for end in ("src", "dst")
    for field in ("XInBytes", "Y", "Z", "LOD", "MemoryType", "Host", "Device", "Array",
                  "Pitch", "Height")) + ("WidthInBytes", "Height", "Depth")
_MEMSET_FIELDS = ("dst", "pitch", "value", "elementSize", "width", "height")


def _copied(params: Any, fields: Sequence[str]) -> Any:
    copy = type(params)()
    for name in fields:
        setattr(copy, name, getattr(params, name))
    return copy


# The calls that set a node on an executable, each checked by its caller.
_set_kernel = cu.cuGraphExecKernelNodeSetParams
_set_memcpy = cu.cuGraphExecMemcpyNodeSetParams
_set_memset = cu.cuGraphExecMemsetNodeSetParams


class _Kernel:
    """A kernel node's parameters, held in a buffer the node's
    ``kernelParams`` point into; pointer slots are byte offsets in it."""

    __slots__ = ("node", "params", "buffer", "layout", "slots", "offsets", "dims", "runs", "raw", "length", "plan",
                 "_words", "_bytes",
                 "_pointers")

    def __init__(self, node: Any, launch: Any, raw: bytes, layout: list[tuple[int, int]]):
        self.node, self.layout = node, layout
        self.buffer = ctypes.create_string_buffer(raw, max(-(-len(raw) // 8) * 8, 8))
        self._bytes = memoryview(self.buffer).cast("B")
        self._words = self._bytes.cast("Q")
        base = ctypes.addressof(self.buffer)
        self._pointers = (ctypes.c_void_p * max(len(layout), 1))(
            *[base + offset for offset, _ in layout])
        self.params = _copied(launch, _LAUNCH_FIELDS)
        self.params.kernelParams = ctypes.addressof(self._pointers)
        self.params.extra = 0
        self.slots = [offset // 8 for offset, size in layout if size == 8 and offset % 8 == 0]
        self.offsets: list[int] | None = None
        p = self.params
        # (grid x, y, z, block x, y, z, shared bytes), as ``dims_for``; read
        # once, as the bindings' fields are slow to read.
        self.dims = (p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY,
                     p.blockDimZ, p.sharedMemBytes)
        # (function, kernel) handles the node runs
        self.runs = (int(p.func), int(p.kern))
        # The parameters as packed bytes, and the launch plan found to run
        # this node's function with its layout.
        self.length = max((o + n for o, n in layout), default=0)
        self.raw = bytes(raw[:self.length])
        self.plan: Any = None

    def state(self) -> tuple:
        """(dims, the parameters as packed bytes), what the node runs."""
        return self.dims, self.raw or self.buffer.raw[:self.length]

    def assign(self, state: tuple) -> None:
        """Hold ``(dims, raw)``: dimensions and the parameters packed in
        ``raw`` (laid out as this node's), to be set on the executable."""
        dims, raw = state
        old = self.dims
        if dims != old:
            p = self.params
            for field, new, was in zip(_DIM_FIELDS, dims, old):
                if new != was:
                    setattr(p, field, new)
            self.dims = dims
        self.put(raw)

    @classmethod
    def of(cls, node: Any, source: Any) -> "_Kernel":
        params = check("cuGraphKernelNodeGetParams", cu.cuGraphKernelNodeGetParams(source))
        layout = _layout(params)
        length = max((offset + size for offset, size in layout), default=0)
        raw = ctypes.create_string_buffer(length)
        if int(params.kernelParams):
            given = ctypes.cast(int(params.kernelParams), ctypes.POINTER(ctypes.c_void_p))
            for i, (offset, size) in enumerate(layout):
                ctypes.memmove(ctypes.addressof(raw) + offset, given[i], size)
        elif int(params.extra):
            ctypes.memmove(raw, _packed(int(params.extra)), length)
        return cls(node, params, raw.raw, layout)

    def twin(self, node: Any) -> "_Kernel":
        return _Kernel(node, self.params, self.buffer.raw, self.layout)

    def read(self, slot: int) -> int:
        return self._words[slot]

    def write(self, slot: int, value: int) -> None:
        self._words[slot] = value
        self.raw = b""  # known again once assigned whole

    def pointers(self) -> bytes:
        """The parameters as packed bytes, what :meth:`put` takes back."""
        raw = self.raw
        if not raw:
            raw = self.raw = self.buffer.raw[:self.length]
        return raw

    def put(self, raw: bytes) -> None:
        """Hold the parameters ``raw`` (from :meth:`pointers`), the
        dimensions unchanged."""
        self._bytes[:len(raw)] = raw
        self.raw = raw

    def set_on(self, graph_exec: Any, ctx: Any) -> None:
        err, = _set_kernel(graph_exec, self.node, self.params)
        if err:
            raise DriverError("cuGraphExecKernelNodeSetParams", err)


class _Prepared:
    """A copy or fill node's parameters: a driver struct, which may be one a
    Change made ready for the state it sets (``shared``), copied before the
    entry writes into it; and its pointers, where known (``raw``)."""

    __slots__ = ("node", "params", "slots", "raw", "shared")
    _FIELDS: tuple[str, ...] = ()
    slots: list[str]

    def __init__(self, node: Any, params: Any):
        self.node, self.params = node, _copied(params, self._FIELDS)
        self.raw: tuple[int, ...] | None = None
        self.shared = False

    def _own(self) -> Any:
        """The parameters, the entry's own to write into."""
        self.raw = None
        if self.shared:
            self.params, self.shared = _copied(self.params, self._FIELDS), False
        return self.params

    def prepared(self) -> Any:
        """A copy of the parameters, for a Change to set them with again."""
        return _copied(self.params, self._FIELDS)

    def hold(self, params: Any, raw: tuple) -> None:
        """Hold ``params`` (from :meth:`prepared`, with pointers ``raw``)
        as the parameters, without copying them."""
        self.params, self.raw, self.shared = params, raw, True


class _Memcpy(_Prepared):
    """A copy node's parameters; its slots are its device ends."""

    __slots__ = ()
    _FIELDS = _MEMCPY_FIELDS

    def __init__(self, node: Any, params: Any):
        super().__init__(node, params)
        self.slots = [end + "Device" for end in ("src", "dst")
                      if getattr(params, end + "MemoryType") in _DEVICE_MEMORY]

    @classmethod
    def of(cls, node: Any, source: Any) -> "_Memcpy":
        return cls(node, check("cuGraphMemcpyNodeGetParams",
                               cu.cuGraphMemcpyNodeGetParams(source)))

    def twin(self, node: Any) -> "_Memcpy":
        return _Memcpy(node, self.params)

    def read(self, slot: str) -> int:
        return int(getattr(self.params, slot))

    def write(self, slot: str, value: int) -> None:
        setattr(self._own(), slot, cu.CUdeviceptr(value))

    def pointers(self) -> tuple:
        raw = self.raw
        if raw is None:
            raw = self.raw = tuple([int(getattr(self.params, slot)) for slot in self.slots])
        return raw

    def put(self, values: tuple) -> None:
        params = self._own()
        for slot, value in zip(self.slots, values):
            setattr(params, slot, cu.CUdeviceptr(value))
        self.raw = tuple(values)

    def state(self) -> tuple:
        """(source, target, bytes) of a one-row copy."""
        p = self.params
        host = "srcDevice" in self.slots and "dstDevice" not in self.slots
        return (int(p.srcDevice), int(p.dstHost) if host else int(p.dstDevice),
                int(p.WidthInBytes))

    def state_for(self, item: tuple, i: int) -> tuple | str:
        """The state copy ``item`` (a taken copy) gives this node, or why it
        cannot."""
        p = self.params
        wanted = {"copy": ["srcDevice", "dstDevice"], "to host": ["srcDevice"]}.get(item[0])
        if wanted != self.slots or int(p.Height) > 1 or int(p.Depth) > 1:
            return (f"the call made {_made(item)} where the graph's node {i} is another "
                    "kind of node or copy")
        return item[2], item[1], item[3]

    def assign(self, state: tuple) -> None:
        p = self._own()
        p.srcDevice = cu.CUdeviceptr(state[0])
        if "dstDevice" in self.slots:
            p.dstDevice = cu.CUdeviceptr(state[1])
        else:
            p.dstHost = state[1]
        p.WidthInBytes = state[2]
        # A one-row copy's rows are as long as the row.
        p.srcPitch = p.dstPitch = state[2]

    def set_on(self, graph_exec: Any, ctx: Any) -> None:
        err, = _set_memcpy(graph_exec, self.node, self.params, ctx)
        if err:
            raise DriverError("cuGraphExecMemcpyNodeSetParams", err)


class _Memset(_Prepared):
    """A fill node's parameters; its one slot is its destination."""

    __slots__ = ()
    _FIELDS = _MEMSET_FIELDS

    def __init__(self, node: Any, params: Any):
        super().__init__(node, params)
        self.slots = ["dst"]

    @classmethod
    def of(cls, node: Any, source: Any) -> "_Memset":
        return cls(node, check("cuGraphMemsetNodeGetParams",
                               cu.cuGraphMemsetNodeGetParams(source)))

    def twin(self, node: Any) -> "_Memset":
        return _Memset(node, self.params)

    def read(self, slot: str) -> int:
        return int(self.params.dst)

    def write(self, slot: str, value: int) -> None:
        self._own().dst = cu.CUdeviceptr(value)

    def pointers(self) -> tuple:
        raw = self.raw
        if raw is None:
            raw = self.raw = (int(self.params.dst),)
        return raw

    def put(self, values: tuple) -> None:
        self._own().dst = cu.CUdeviceptr(values[0])
        self.raw = (values[0],)

    def state(self) -> tuple:
        """(target, bytes) of a one-row fill of bytes."""
        return int(self.params.dst), int(self.params.width)

    def state_for(self, item: tuple, i: int) -> tuple | str:
        p = self.params
        if (item[0] != "fill" or int(p.elementSize) != 1 or int(p.value) != item[2]
                or int(p.height) > 1):
            return (f"the call made {_made(item)} where the graph's node {i} is another "
                    "kind of node or fill")
        return item[1], item[3]

    def assign(self, state: tuple) -> None:
        p = self._own()
        p.dst = cu.CUdeviceptr(state[0])
        p.width = state[1]

    def set_on(self, graph_exec: Any, ctx: Any) -> None:
        err, = _set_memset(graph_exec, self.node, self.params, ctx)
        if err:
            raise DriverError("cuGraphExecMemsetNodeSetParams", err)


_READERS: dict[Any, Any] = {_KERNEL: _Kernel.of, _MEMCPY: _Memcpy.of, _MEMSET: _Memset.of}


class Change:
    """What a rebinding did to an index's nodes, to be done again
    (:meth:`NodeIndex.redo`) while they are as it found them: each changed
    node's pointers before and after (as its ``pointers()`` gives them),
    each pointer value that moved and how many slots held it. It holds no
    array, and names its index weakly."""

    __slots__ = ("index", "generation", "nodes", "moved", "held", "prepared")

    def __init__(self, index: "NodeIndex", nodes: list[tuple[Any, Any, Any]],
                 moved: list[tuple[int, int]], held: list[int]):
        self.index, self.generation = weakref.ref(index), index.generation
        self.nodes = nodes          # (entry, pointers before, pointers after)
        self.moved = moved          # (old value, new value)
        self.held = held            # slots holding each old value
        # Per node, a copy or fill's parameters after the change, made
        # ready the first time it is made again (None: not yet, or a kernel).
        self.prepared: list[Any] = [None] * len(nodes)


def _set_back(entries: Sequence[Any], graph_exec: Any, ctx: Any) -> None:
    """Set ``entries``, holding their parameters of before again, on the
    executable, as far as the driver lets: a node whose setting back it
    refuses goes on running the parameters it was set to last."""
    for entry in entries:
        try:
            entry.set_on(graph_exec, ctx)
        except DriverError:  # noqa: PERF203  restore what can be restored
            pass


def _move_holders(holders: dict[int, list[tuple[Any, Any]]],
                  moved: Sequence[tuple[int, int]]) -> None:
    """Every moved value's holders now hold the new one."""
    taken = [(new, holders.pop(old)) for old, new in moved]
    for new, refs in taken:
        there = holders.get(new)
        if there is None:
            holders[new] = refs
        else:
            there.extend(refs)


class _Plan:
    """The changes a rebinding makes, worked out before any is made: for
    each pointer value held by some node, where it moves."""

    __slots__ = ("used", "_index", "_moved", "change")

    def __init__(self, index: "NodeIndex", moves: Sequence[Move]):
        self._index = index
        self.change: Change | None = None
        self.used = [False] * len(moves)
        # (old value, new value)
        self._moved: list[tuple[int, int]] = []
        for value in index.holders:
            for i, move in enumerate(moves):
                if move.start <= value < move.end:
                    self.used[i] = True
                    # A move onto the same memory changes no node.
                    if move.shift:
                        self._moved.append((value, value + move.shift))
                    break

    def apply(self) -> None:
        """Set the changed nodes on the executable, in its context; if the
        driver refuses one, every node is set back as it was and the error
        raised."""
        in_context(self._index.ctx, self._apply)

    def _apply(self) -> None:
        index = self._index
        holders = index.holders
        changed: dict[int, tuple[Any, Any]] = {}
        for old, new in self._moved:
            for entry, slot in holders[old]:
                if id(entry) not in changed:
                    changed[id(entry)] = (entry, entry.pointers())
                entry.write(slot, new)
        back = list(changed.values())
        index._set(back)
        held = [len(holders[old]) for old, _ in self._moved]
        _move_holders(holders, self._moved)
        self.change = Change(index, [(entry, before, entry.pointers()) for entry, before in back],
                             self._moved, held)


class NodeIndex:
    """The pointers an executable's nodes hold now.

    ``nodes`` are the executable's own definition's nodes (what node updates
    name); ``sources`` the same nodes of the definition whose parameters the
    executable runs (its own, or that of the graph it was last updated from).
    """

    def __init__(self, graph_exec: Any, ctx: Any, nodes: list[Any], sources: list[Any]):
        self.graph_exec, self.ctx = graph_exec, ctx
        self.entries: list[Any] = []
        # Position of each entry among the nodes, to pair it with another
        # executable's node at the same position.
        self.positions: list[int] = []
        if len(nodes) != len(sources):
            raise RebindError(
                f"the graph has {len(nodes)} nodes and the graph whose parameters it "
                f"runs {len(sources)}; capture the work again to rebind it")
        for position, (node, source) in enumerate(zip(nodes, sources)):
            kind = check("cuGraphNodeGetType", cu.cuGraphNodeGetType(source))
            reader = _READERS.get(kind)
            if reader is None:
                continue
            entry = reader(node, source)
            if node is not source:
                _check_pair(node, kind, entry)
            self.entries.append(entry)
            self.positions.append(position)
        self._holders: dict[int, list[tuple[Any, Any]]] | None = None
        # Moves on when nodes are set other than by rebindings (new sizes):
        # the Changes made before no longer apply.
        self.generation = 0

    @property
    def holders(self) -> dict[int, list[tuple[Any, Any]]]:
        """Each pointer value the nodes hold, and the ``(entry, slot)``
        pairs holding it; worked out when first asked after the nodes'
        parameters were set whole."""
        if self._holders is None:
            self._holders = _holders(self.entries)
        return self._holders

    def plan(self, moves: Sequence[Move]) -> _Plan:
        return _Plan(self, moves)

    def redo(self, change: Change) -> bool:
        """Make ``change`` again: set each node it changed to the pointers it
        left. False, changing nothing, unless the index holds what the change
        found: the same pointers in the nodes it changed, and each value it
        moved in as many slots. A node the driver refuses sets every node
        back and raises DriverError."""
        if change.index() is not self or change.generation != self.generation:
            return False
        holders = self._holders
        if holders is None:
            holders = self.holders
        for (old, _), count in zip(change.moved, change.held):
            if len(holders.get(old, ())) != count:
                return False
        nodes = change.nodes
        for entry, before, _ in nodes:
            # An entry's pointers, where it knows them, as pointers() gives them.
            if (entry.raw or entry.pointers()) != before:
                return False
        graph_exec, ctx = self.graph_exec, self.ctx
        prepared = change.prepared
        set_kernel = _set_kernel
        done = 0
        try:
            for entry, _, after in nodes:
                if type(entry) is _Kernel:
                    # Inline: kernel nodes are most of a rebinding.
                    entry._bytes[:len(after)] = after
                    entry.raw = after
                    err, = set_kernel(graph_exec, entry.node, entry.params)
                    if err:
                        raise DriverError("cuGraphExecKernelNodeSetParams", err)
                elif isinstance(entry, _Prepared):
                    # Copies and fills are set with their parameters made
                    # ready once, which the entry holds until it writes.
                    params = prepared[done]
                    if params is None:
                        entry.put(after)
                        params = prepared[done] = entry.prepared()
                    entry.hold(params, after)
                    entry.set_on(graph_exec, ctx)
                else:
                    entry.put(after)
                    entry.set_on(graph_exec, ctx)
                done += 1
        except DriverError:
            self._set_back([(entry, before) for entry, before, _ in nodes], done)
            raise
        _move_holders(holders, change.moved)
        return True

    def _set(self, back: list[tuple[Any, Any]]) -> None:
        """Set the entries of ``back`` (``(entry, pointers before)``), holding
        their new pointers, on the executable; if the driver refuses one,
        every entry gets its pointers of before back, those set are set
        back, no Change made before applies any more, and the error is
        raised."""
        graph_exec, ctx = self.graph_exec, self.ctx
        done = 0
        try:
            for entry, _ in back:
                entry.set_on(graph_exec, ctx)
                done += 1
        except DriverError:
            self._set_back(back, done)
            raise

    def _set_back(self, back: list[tuple[Any, Any]], done: int) -> None:
        """After the driver refused the node after the first ``done`` of
        ``back``: every entry gets its pointers of before back, the ``done``
        set are set back, and no Change made before applies any more."""
        for entry, before in back:
            entry.put(before)
        _set_back([entry for entry, _ in back[:done]], self.graph_exec, self.ctx)
        self.generation += 1

    def reparameterise(self, taken: Sequence[Any], num_nodes: int) -> str | None:
        """Give each kernel, copy and fill node, in the order the capture
        made them, the work at its place among ``taken``
        (``driver_divert``): a kernel its launch's function, dimensions and
        packed parameters, a copy or fill its pointers and bytes, where
        they differ; or, before anything is set, the first reason that
        cannot be done. A node the driver refuses sets every node back and
        raises RebindError."""
        entries = self.entries
        if len(entries) != num_nodes:
            return ("the graph holds a node other than kernels, copies and fills (an "
                    "event, memory or library node)")
        if len(taken) != len(entries):
            return (f"the call made {len(taken)} kernel launches, copies and fills in all, "
                    f"where the graph holds {len(entries)}")
        changes = []
        found = []
        for i, (entry, item) in enumerate(zip(entries, taken)):
            if type(entry) is not _Kernel:
                state = entry.state_for(item, i)
                if type(state) is str:
                    return state
                if state != entry.state():
                    changes.append((entry, state))
                continue
            plan = item[0]
            if type(plan) is str:
                return f"the call made {_made(item)} where the graph's node {i} is a kernel launch"
            if entry.plan is not plan:
                if not _same_function(entry.runs, plan):
                    return (f"launch {i} runs {_name_of(plan)}, and the graph's node {i} "
                            "another kernel or overload of it (other argument types)")
                if entry.offsets is None:
                    entry.offsets = [offset for offset, _ in entry.layout]
                if entry.offsets != plan.offsets:
                    return f"launch {i} packs its parameters unlike the graph's node {i}"
                found.append((entry, plan))
            state = (item[1], item[2])
            if state[0] != entry.dims or state[1] != entry.raw:
                changes.append((entry, state))
        for entry, plan in found:
            entry.plan = plan
        if changes:
            self._set_whole(changes)
        return None

    def _set_whole(self, changes: list[tuple[Any, tuple]]) -> None:
        graph_exec, ctx = self.graph_exec, self.ctx
        # What each node ran, taken as it is set: kernel nodes, most of a
        # re-sizing, are set inline.
        before: list[tuple[Any, tuple]] = []
        try:
            for entry, state in changes:
                if type(entry) is _Kernel:
                    raw = entry.raw or entry.buffer.raw[:entry.length]
                    before.append((entry, (entry.dims, raw)))
                    entry.assign(state)
                    err, = _set_kernel(graph_exec, entry.node, entry.params)
                    if err:
                        raise DriverError("cuGraphExecKernelNodeSetParams", err)
                else:
                    before.append((entry, entry.state()))
                    entry.assign(state)
                    entry.set_on(graph_exec, ctx)
        except DriverError as exc:
            for entry, state in before:
                entry.assign(state)
            # The last was refused: nothing to set back.
            _set_back([entry for entry, _ in before[:-1]], graph_exec, ctx)
            raise RebindError(
                f"the driver refused new parameters for a node ({exc}); the graph is "
                "unchanged") from exc
        finally:
            self._holders = None
            self.generation += 1

    def copy_onto(self, graph_exec: Any, ctx: Any, nodes: list[Any]) -> "NodeIndex":
        """This index's parameters, set on ``graph_exec`` (whose definition's
        nodes are ``nodes``, in the same order) and indexed for it."""
        copy = NodeIndex.__new__(NodeIndex)
        copy.graph_exec, copy.ctx, copy.positions = graph_exec, ctx, list(self.positions)
        copy.entries = [entry.twin(nodes[position])
                        for entry, position in zip(self.entries, self.positions)]
        for entry in copy.entries:
            _check_pair(entry.node, _KIND_OF[type(entry)], entry)
        copy._holders = None
        copy.generation = 0
        for entry in copy.entries:
            entry.set_on(graph_exec, ctx)
        return copy


def _holders(entries: list[Any]) -> dict[int, list[tuple[Any, Any]]]:
    """Each value held in a pointer slot, and the ``(entry, slot)`` holding
    it: a rebinding looks at each value once, however many nodes hold it."""
    holders: dict[int, list[tuple[Any, Any]]] = {}
    for entry in entries:
        for slot in entry.slots:
            holders.setdefault(entry.read(slot), []).append((entry, slot))
    return holders


_KIND_OF: dict[type, Any] = {_Kernel: _KERNEL, _Memcpy: _MEMCPY, _Memset: _MEMSET}


# A library kernel's handle (numba's kernels are a library's, CUkernel) ->
# the function handles kernel nodes running it were found to hold: the
# function it is in each context it was resolved in.
_functions: dict[int, set[int]] = {}


def _same_function(runs: tuple[int, int], plan: Any) -> bool:
    """Whether a kernel node running the (function, kernel) handles ``runs``
    runs the kernel of ``plan``: the function the plan launches, or another
    the plan's library kernel is in (a node is read in its graph's context,
    current here)."""
    if int(plan.function) in runs:
        return True
    try:
        handle = int(plan.kernel._codelibrary.get_cufunc().handle)
    except Exception:  # noqa: BLE001  a kernel that cannot load runs no node
        return False
    handles = _functions.get(handle)
    if handles is None:
        if len(_functions) > 4096:
            _functions.clear()
        handles = _functions[handle] = {handle}
    if runs[0] in handles or runs[1] in handles:
        return True
    err, resolved = cu.cuKernelGetFunction(cu.CUkernel(handle))
    if err != cu.CUresult.CUDA_SUCCESS:
        return False
    handles.add(int(resolved))
    return int(resolved) in runs


_MADE = {"copy": "a copy", "to host": "a copy into host memory", "fill": "a fill"}


def _made(item: tuple) -> str:
    """Taken work, in words (a kernel launch's first item is its plan)."""
    return _MADE.get(item[0], "a kernel launch")


def _name_of(plan: Any) -> str:
    function = getattr(plan.kernel, "entry_name", None) or "a kernel"
    return f"`{getattr(getattr(plan.kernel, 'py_func', None), '__name__', function)}`"


def _check_pair(node: Any, kind: Any, entry: Any) -> None:
    """Refuse to set ``entry``'s parameters on ``node``, paired with it by
    position in another graph, unless it is a node of the same kind (and, for
    a kernel, of the same function)."""
    found = check("cuGraphNodeGetType", cu.cuGraphNodeGetType(node))
    same = found == kind
    if same and kind == _KERNEL:
        params = check("cuGraphKernelNodeGetParams", cu.cuGraphKernelNodeGetParams(node))
        same = (int(params.func), int(params.kern)) == (
            int(entry.params.func), int(entry.params.kern))
    if not same:
        raise RebindError(
            "the graph's nodes do not pair with those of the graph whose parameters "
            "it runs (another kind or kernel at the same place); capture the work "
            "again to rebind it")
