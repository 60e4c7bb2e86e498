"""Reading a captured graph's nodes on the driver, for its description.

The definition an executable runs is walked graph by graph: its nodes (as
:func:`~numbagraph.backend.driver_rebind.graph_nodes` lists them), each
node's dependencies, and the parameters of kernels, fills, copies and
memory nodes. A conditional node's bodies are the graphs its capture
recorded for it (``driver.Recording.conditionals``). A kernel node is named
by its function handle, matched against every compiled overload of the
kernels the capture launched.
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

from cuda.bindings import driver as cu

from .driver_base import check
from .driver_conditional import condition_argument
from .driver_rebind import graph_nodes
from .interface import NodeInfo

__all__ = ["describe_graph"]

_TYPES = cu.CUgraphNodeType
_KINDS = {
    _TYPES.CU_GRAPH_NODE_TYPE_KERNEL: "kernel",
    _TYPES.CU_GRAPH_NODE_TYPE_MEMSET: "memset",
    _TYPES.CU_GRAPH_NODE_TYPE_MEMCPY: "memcpy",
    _TYPES.CU_GRAPH_NODE_TYPE_CONDITIONAL: "conditional",
    _TYPES.CU_GRAPH_NODE_TYPE_GRAPH: "child",
    _TYPES.CU_GRAPH_NODE_TYPE_HOST: "host",
    _TYPES.CU_GRAPH_NODE_TYPE_EVENT_RECORD: "event",
    _TYPES.CU_GRAPH_NODE_TYPE_WAIT_EVENT: "event",
    _TYPES.CU_GRAPH_NODE_TYPE_MEM_ALLOC: "memory",
    _TYPES.CU_GRAPH_NODE_TYPE_MEM_FREE: "memory",
    _TYPES.CU_GRAPH_NODE_TYPE_EMPTY: "empty",
}
_ACTIONS = {
    _TYPES.CU_GRAPH_NODE_TYPE_EVENT_RECORD: "record",
    _TYPES.CU_GRAPH_NODE_TYPE_WAIT_EVENT: "wait",
    _TYPES.CU_GRAPH_NODE_TYPE_MEM_ALLOC: "alloc",
    _TYPES.CU_GRAPH_NODE_TYPE_MEM_FREE: "free",
}
_CONDITIONAL_KINDS = {"while", "if", "switch"}

_MEMORY = cu.CUmemorytype
_POINTER_TYPE = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE


def describe_graph(executable: Any, kernels: Sequence[Any]) -> tuple[NodeInfo, ...]:
    definition, conditionals = executable.definition()
    names = _Kernels(kernels)
    return _Graph(conditionals, names, executable.node_params()).describe(definition)


class _Kernels:
    """The kernels a capture launched, by every handle a kernel node of
    theirs may hold: the library kernel numba loads, the function it is in
    the current context, and the symbol's name."""

    def __init__(self, kernels: Sequence[Any]):
        self.by_handle: dict[int, Any] = {}
        self.by_symbol: dict[bytes, Any] = {}
        for dispatcher in kernels:
            for overload in list(getattr(dispatcher, "overloads", {}).values()):
                self._add(dispatcher, getattr(overload, "_codelibrary", None))

    def _add(self, dispatcher: Any, library: Any) -> None:
        if library is None:
            return
        entry = getattr(library, "_entry_name", None)
        if isinstance(entry, str):
            self.by_symbol[entry.encode()] = dispatcher
        try:
            handle = library.get_cufunc().handle
        except Exception:  # noqa: BLE001  an overload that cannot load names no node
            return
        self.by_handle[int(handle)] = dispatcher
        # numba loads kernels from libraries: the handle is a CUkernel, which
        # a node may hold as the function it is in the graph's context.
        err, function = cu.cuKernelGetFunction(cu.CUkernel(int(handle)))
        if err == cu.CUresult.CUDA_SUCCESS:
            self.by_handle[int(function)] = dispatcher

    def of(self, params: Any) -> Any:
        """The kernel a kernel node's parameters run, or None."""
        for handle in (int(params.func), int(params.kern)):
            if handle and handle in self.by_handle:
                return self.by_handle[handle]
        if int(params.func) and self.by_symbol:
            err, symbol = cu.cuFuncGetName(params.func)
            if err == cu.CUresult.CUDA_SUCCESS:
                return self.by_symbol.get(bytes(symbol))
        return None


def _dependencies(node: Any) -> list[Any]:
    """The nodes ``node`` depends on. cuda-bindings 13 returns edge data
    beside them: the nodes come first and the count last either way."""
    found = check("cuGraphNodeGetDependencies", cu.cuGraphNodeGetDependencies(node))
    count = int(found[-1])
    if not count:
        return []
    found = check("cuGraphNodeGetDependencies", cu.cuGraphNodeGetDependencies(node, count))
    return list(found[0][:int(found[-1])])


def _topological(depends: list[list[int]]) -> list[int]:
    """The positions in an order where each node follows those it depends
    on, taking the first ready position in the driver's order at each step:
    the same graph gives the same order."""
    waiting = [len(d) for d in depends]
    followers: list[list[int]] = [[] for _ in depends]
    for node, deps in enumerate(depends):
        for dep in deps:
            followers[dep].append(node)
    ready = [node for node, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for follower in followers[node]:
            waiting[follower] -= 1
            if waiting[follower] == 0:
                heapq.heappush(ready, follower)
    return order


def _dim3(x: Any, y: Any, z: Any) -> tuple[int, int, int]:
    return int(x), int(y), int(z)


def _side(memory_type: Any, device: Any) -> str:
    """Where one end of a copy is: "host" or "device". A unified address is
    asked of the driver (pinned host memory is host memory)."""
    if memory_type == _MEMORY.CU_MEMORYTYPE_HOST:
        return "host"
    if memory_type == _MEMORY.CU_MEMORYTYPE_UNIFIED:
        err, kind = cu.cuPointerGetAttribute(_POINTER_TYPE, int(device))
        if err == cu.CUresult.CUDA_SUCCESS and int(kind) == int(_MEMORY.CU_MEMORYTYPE_HOST):
            return "host"
    return "device"


class _Graph:
    """Describes graphs of one definition: its conditional nodes' bodies,
    and the kernels its kernel nodes may run."""

    def __init__(self, conditionals: dict[int, tuple], kernels: _Kernels,
                 params: dict[int, Any] | None = None):
        self._conditionals = conditionals
        self._kernels = kernels
        # The parameters kernel, copy and fill nodes run with, by node
        # handle, where set on the executable since its capture.
        self._params = params or {}

    def describe(self, graph: Any) -> tuple[NodeInfo, ...]:
        nodes = graph_nodes(graph, ())
        position = {int(node): i for i, node in enumerate(nodes)}
        depends = [sorted(position[int(dep)] for dep in _dependencies(node)
                          if int(dep) in position) for node in nodes]
        order = _topological(depends)
        place = {old: new for new, old in enumerate(order)}
        # Allocation addresses, to give a free node its bytes.
        allocated: dict[int, int] = {}
        described = []
        for old in order:
            node = nodes[old]
            info = self._node(node, allocated)
            described.append(info._replace(depends=tuple(sorted(place[d] for d in depends[old]))))
        return tuple(described)

    def _node(self, node: Any, allocated: dict[int, int]) -> NodeInfo:
        kind_of = check("cuGraphNodeGetType", cu.cuGraphNodeGetType(node))
        kind = _KINDS.get(kind_of, "other")
        action = _ACTIONS.get(kind_of)
        if kind == "kernel":
            params = self._params.get(int(node))
            if params is None:
                params = check("cuGraphKernelNodeGetParams", cu.cuGraphKernelNodeGetParams(node))
            return NodeInfo(
                kind, kernel=self._kernels.of(params),
                grid=_dim3(params.gridDimX, params.gridDimY, params.gridDimZ),
                block=_dim3(params.blockDimX, params.blockDimY, params.blockDimZ),
                shared=int(params.sharedMemBytes))
        if kind == "memset":
            params = self._params.get(int(node))
            if params is None:
                params = check("cuGraphMemsetNodeGetParams", cu.cuGraphMemsetNodeGetParams(node))
            element = int(params.elementSize)
            return NodeInfo(kind, nbytes=element * int(params.width) * max(int(params.height), 1),
                            value=int(params.value), element_size=element)
        if kind == "memcpy":
            params = self._params.get(int(node))
            if params is None:
                params = check("cuGraphMemcpyNodeGetParams", cu.cuGraphMemcpyNodeGetParams(node))
            nbytes = (int(params.WidthInBytes) * max(int(params.Height), 1)
                      * max(int(params.Depth), 1))
            source = _side(params.srcMemoryType, params.srcDevice)
            target = _side(params.dstMemoryType, params.dstDevice)
            return NodeInfo(kind, nbytes=nbytes, direction=f"{source} to {target}")
        if kind == "memory" and action == "alloc":
            params = check("cuGraphMemAllocNodeGetParams",
                           cu.cuGraphMemAllocNodeGetParams(node))
            allocated[int(params.dptr)] = int(params.bytesize)
            return NodeInfo(kind, nbytes=int(params.bytesize), action=action)
        if kind == "memory":
            pointer = check("cuGraphMemFreeNodeGetParams", cu.cuGraphMemFreeNodeGetParams(node))
            return NodeInfo(kind, nbytes=allocated.get(int(pointer)), action=action)
        if kind == "conditional":
            return self._conditional(node)
        if kind == "child":
            child = check("cuGraphChildGraphNodeGetGraph", cu.cuGraphChildGraphNodeGetGraph(node))
            return NodeInfo(kind, bodies=(self.describe(child),))
        return NodeInfo(kind, action=action)

    def _conditional(self, node: Any) -> NodeInfo:
        recorded = self._conditionals.get(int(node))
        if recorded is None:
            return NodeInfo("conditional")  # made outside numbagraph: its bodies are unknown
        kind, bodies, condition = recorded
        return NodeInfo(
            "conditional", conditional=kind if kind in _CONDITIONAL_KINDS else None,
            condition=condition_argument(condition),
            bodies=tuple(self.describe(body) for body in bodies))
