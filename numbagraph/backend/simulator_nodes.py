"""Reading a simulated graph's nodes, for its description.

A simulated graph is the list of calls its capture recorded (a conditional
node holding its bodies as lists of calls). Each call is described as the
node, or nodes, the driver records for the same work: a launch as a kernel
node, a DeviceScalar update as the memset nodes that set it (two 4-byte
ones for an 8-byte scalar), a zero fill as a one-byte memset, a copy as a
memcpy node, an allocation and a free as memory nodes. Each recorded call
keeps the calls it depends on, as the driver's capture made them (see
:mod:`.simulator_streams`): its first node depends on the last nodes of
those calls, and a call described as several nodes chains them, as the
driver records them one after another on the stream. Calls are recorded in
the order the driver makes their nodes, which the driver's description
keeps for a capture's graphs (the first ready node in that order comes
first), so the nodes are listed in the order of their calls.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .interface import NodeInfo
from .simulator_devnodes import Updatable
from .simulator import _copy_to_device, _device_to_device, _device_to_host, _run, _store_scalar
from .simulator_conditional import _Node
from .simulator_dist import _one_rank
from .simulator_memory import _make, _unmake
from .simulator_streams import ChildGraph

__all__ = ["describe_graph"]

# The driver's memset of a scalar: elements of up to 4 bytes at once.
_MEMSET_LARGEST = 4


def describe_graph(executable: Any, kernels: Sequence[Any]) -> tuple[NodeInfo, ...]:
    """Simulated kernel nodes hold the kernel they launch: ``kernels`` is
    not needed to name them."""
    return _describe(executable._nodes, executable._links)


def _describe(calls: Sequence[Callable[[], None]],
              links: Sequence[tuple[int, Any]]) -> tuple[NodeInfo, ...]:
    """The nodes of one graph's ``calls``, given each call's id and what it
    depends on (``links``, in step with ``calls``: the frontier of the
    call's stream as it was recorded, None for no work)."""
    described: list[NodeInfo] = []
    # Call id -> the positions of its last nodes: those work after it
    # depends on (a call described as no node passes on its dependencies).
    last: dict[int, tuple[int, ...]] = {}
    for call, (ident, after) in zip(calls, links, strict=True):
        if after is None:
            depends: tuple[int, ...] = ()
        elif isinstance(after, int):
            depends = last.get(after, ())
        else:
            depends = tuple(sorted({p for dep in after for p in last.get(dep, ())}))
        for info in _infos(call):
            described.append(info._replace(depends=depends))
            depends = (len(described) - 1,)
        last[ident] = depends
    return tuple(described)


def _dim3(dim: Any) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in dim) if isinstance(dim, (tuple, list)) else (int(dim),)
    return (dims + (1, 1, 1))[:3]  # type: ignore[return-value]


def _host_array(value: Any) -> np.ndarray:
    """The NumPy array behind a simulated device array (or the array itself)."""
    return getattr(value, "_ary", value)


def _scalar_memsets(held: np.ndarray) -> Iterator[NodeInfo]:
    """The memsets the driver records to set a scalar to ``held[0]``: one of
    the scalar's size, or 4-byte words, low first, for a larger one."""
    size = held.dtype.itemsize
    if size <= _MEMSET_LARGEST:
        bits = int(held.view(f"u{size}")[0])
        yield NodeInfo("memset", nbytes=size, value=bits, element_size=size)
        return
    for word in held.view("u4"):
        yield NodeInfo("memset", nbytes=4, value=int(word), element_size=4)


def _infos(call: Any) -> Iterator[NodeInfo]:
    if isinstance(call, Updatable):
        call = call.call  # a device node: the kernel node as captured
    if isinstance(call, _Node):
        yield NodeInfo("conditional", conditional=call.kind, condition=call.cell,
                       bodies=tuple(_describe(body, links)
                                    for body, links in zip(call.bodies, call.links)))
        return
    if isinstance(call, ChildGraph):
        yield NodeInfo("child", bodies=(_describe(call.calls, call.links),))
        return
    if not isinstance(call, functools.partial):
        yield NodeInfo("host")  # a Python call the capture recorded
        return
    func, args = call.func, call.args
    if func is _run:
        kernel, grid, block, shared = args[:4]
        yield NodeInfo("kernel", kernel=kernel, grid=_dim3(grid), block=_dim3(block),
                       shared=int(shared))
    elif func is _store_scalar:
        yield from _scalar_memsets(args[1])
    elif func is _copy_to_device:
        # numba's device-to-device copy_to_device(self, ary): a copy of ary.
        yield NodeInfo("memcpy", nbytes=_host_array(args[1]).nbytes,
                       direction="device to device")
    elif func is _device_to_device:
        yield NodeInfo("memcpy", nbytes=args[0].nbytes, direction="device to device")
    elif func is _device_to_host:
        yield NodeInfo("memcpy", nbytes=args[0].nbytes, direction="device to host")
    elif func is _one_rank:
        # NCCL's collective of one rank: a copy of its input into its output.
        yield NodeInfo("memcpy", nbytes=int(args[2]) * args[0].itemsize,
                       direction="device to device")
    elif func is _make or func is _unmake:
        yield NodeInfo("memory", nbytes=args[1].nbytes,
                       action="alloc" if func is _make else "free")
    elif (getattr(func, "__name__", None) == "fill"
          and isinstance(getattr(func, "__self__", None), np.ndarray)):
        # A zero fill: the driver's cuMemsetD8Async over every byte.
        yield NodeInfo("memset", nbytes=func.__self__.nbytes, value=int(args[0]),
                       element_size=1)
    else:
        yield NodeInfo("host")
