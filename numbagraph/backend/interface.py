"""What a backend provides: the one interface both backends implement.

Everything above :mod:`numbagraph.backend` reaches the backend in use through
``numbagraph.backend.active``, which holds exactly the members of
:class:`Backend`, taken from the backend's modules by :func:`bind`. A backend
that lacks a member, or defines it twice, fails at import with the names.

Handles are integers: a stream's raw ``CUstream`` address on the driver, the
integer numbagraph gives each simulated stream on the simulator.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple, Protocol, Sequence

import numpy as np

__all__ = ["Backend", "Recording", "Executable", "RebindPlan", "Move", "ConditionalNode", "Patch",
           "LaunchHook", "NodeInfo", "MEMBERS", "bind", "fast_launch_off"]

def fast_launch_off() -> bool:
    """Whether ``NUMBAGRAPH_FAST_LAUNCH`` turns the fast launch path off
    (``0``, ``false``, ``no`` or ``off``), on either backend."""
    return os.environ.get("NUMBAGRAPH_FAST_LAUNCH", "1").strip().lower() in (
        "0", "false", "no", "off")


LaunchHook = Callable[[int, Any, tuple], tuple]
"""``args = hook(stream_handle, kernel, args)``: called before a kernel
launch, it may refuse the launch by raising, and returns the arguments the
kernel is launched with."""


@dataclass(frozen=True)
class Patch:
    """One change numbagraph makes to numba: ``owner.name`` becomes
    ``make(original)``.

    ``owner`` is a module or a class of numba's, ``why`` says what the change
    is for, and ``checked`` the numba-cuda versions whose ``original`` the
    replacement was checked against.
    """

    owner: Any
    name: str
    make: Callable[[Any], Any]
    why: str
    checked: tuple[str, ...] = ("0.30.4",)

    @property
    def target(self) -> str:
        """``module.Class.name`` or ``module.name``, for tables and errors."""
        owner = self.owner
        if isinstance(owner, types.ModuleType):
            return f"{owner.__name__}.{self.name}"
        return f"{owner.__module__}.{owner.__qualname__}.{self.name}"


class Recording(Protocol):
    """One capture in progress on one stream.

    Made by ``Recording(handle, mode)``, which begins the capture. From then
    until :meth:`release_frees`, numba frees nothing (a free would break the
    capture).
    """

    handle: int
    finish_checks: list[Callable[[], None]]
    """Checks run, in order, before the capture may end; one that raises
    aborts the capture."""
    open_bodies: list
    """Conditional bodies being recorded, innermost last."""

    def finish(self, instantiate: bool = True) -> "Executable":
        """End the capture and return its graph, instantiated now or, with
        ``instantiate=False``, on first use (CUDA refuses to instantiate
        during some other captures). On failure the capture is aborted
        before the error propagates."""

    def abort(self) -> None:
        """End the capture without a graph; the stream, and every stream
        forked into the capture, stops capturing (forks joined back first)."""

    def release_frees(self) -> None:
        """Let numba free again; calling it again does nothing."""

    def strand(self) -> None:
        """Drop what the host holds of the recorded work without ending the
        capture, for a capture that no thread may end any more."""


class Move(NamedTuple):
    """A rebinding of one array: pointers in ``[start, end)`` move by
    ``shift`` bytes, into ``target``, the device array that now holds them."""

    start: int
    end: int
    shift: int
    target: Any


class RebindPlan(Protocol):
    """The changes a rebinding makes, worked out before any is made."""

    used: list[bool]
    """Per move: whether any node holds a pointer it moves."""

    change: Any
    """What the plan does to the nodes, holding no array: once the plan is
    applied, ``Executable.redo_rebind`` does it again."""

    def apply(self) -> None:
        """Make the changes; a failure leaves the graph as it was."""


class Executable(Protocol):
    """A captured graph, instantiated on first use if not already."""

    num_nodes: int
    instantiated: bool

    def instantiate(self) -> Any:
        """Instantiate the graph now, if it is not yet, on its own device
        whichever is current."""

    def launcher(self, handle: int) -> Callable[[], None]:
        """A call that replays the graph on the stream, with every argument
        of the launch converted once, on the graph's device whichever is
        current."""

    def upload(self, handle: int) -> None:
        """Upload the graph on the stream ahead of its first launch, on the
        graph's device whichever is current."""

    def update(self, other: "Executable") -> None:
        """Take the node parameters ``other`` runs now (those it took at its
        own last update, if any); raises if its shape differs, and
        GraphClosedError if the graph those came from was closed."""

    def plan_rebind(self, moves: Sequence[Move]) -> RebindPlan:
        """Work out which recorded pointers ``moves`` re-point (in kernel
        arguments, copies, fills and conditional bodies alike), changing
        nothing until the plan is applied. The graph is instantiated first."""

    def redo_rebind(self, change: Any, targets: Callable[[], Sequence[Any]]) -> bool:
        """Make ``change`` (an applied plan's ``change``) again, the graph's
        nodes being as that plan found them, ``targets()`` giving the device
        arrays its moves went to, in their order (asked only by a backend
        that needs them): the nodes point where the plan left them. False, changing nothing, where the nodes were set
        since by anything but rebindings (new sizes, an update), or, where
        the backend keeps the nodes' pointers (the driver), they are not
        those the plan found. Where the driver refuses a node, every node
        is set back and the backend's error raised."""

    def reparameterise(self, launches: Sequence[Any]) -> str | None:
        """Give each of the graph's nodes, kernel launches, copies and fills
        in the order the capture made them, the work at its place among
        ``launches`` (taken by ``divert_launches``): a kernel node its
        launch's grid, block, shared memory and arguments, a copy or fill
        its pointers and bytes. Where an item is of another kind, kernel or
        overload than its node, or the counts differ, or the graph holds a
        node of another kind, nothing changes and the first such
        difference is returned, in words; None once done. The graph is
        instantiated first; RebindError, the graph unchanged, where the
        driver refuses a node."""

    def close(self) -> None:
        """Free the graph."""


class NodeInfo(NamedTuple):
    """One node of a captured graph as a backend reads it, for
    :mod:`numbagraph.nodes` to make its record from.

    ``kind`` is one of ``"kernel"``, ``"memset"``, ``"memcpy"``,
    ``"conditional"``, ``"child"``, ``"host"``, ``"event"``, ``"memory"``,
    ``"empty"``, ``"other"``; ``depends`` are the positions, in the same
    tuple, of the nodes it depends on. A kernel node names the kernel it
    runs (``kernel``, None when unknown) and its launch dimensions; a
    memset its bytes, the value of each element and the element's size; a
    memcpy its bytes and ``direction`` (``"device to host"``, ...); a
    memory node its ``action`` (``"alloc"`` or ``"free"``) and bytes; an
    event node its ``action`` (``"record"`` or ``"wait"``); a conditional
    node its kind (``"while"``, ``"if"``, ``"switch"``), its ``condition``
    as a kernel is given it, and its bodies; a child node its one graph as
    ``bodies[0]``."""

    kind: str
    depends: tuple[int, ...] = ()
    kernel: Any = None
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    shared: int | None = None
    nbytes: int | None = None
    value: int | None = None
    element_size: int | None = None
    direction: str | None = None
    action: str | None = None
    conditional: str | None = None
    condition: Any = None
    bodies: tuple[tuple["NodeInfo", ...], ...] = ()


class ConditionalNode(Protocol):
    """A conditional node added where the stream's capture stands now, made
    by ``ConditionalNode(recording, condition, kind, size, mode)`` with
    ``kind`` one of ``"while"``, ``"if"``, ``"switch"``."""

    def begin_branch(self, index: int) -> None:
        """Make the stream record into body ``index``."""

    def end_branch(self) -> None:
        """Go back to the enclosing graph, after the node."""

    def abandon_branch(self, resume: bool) -> None:
        """Stop recording the body after a failure; resume the enclosing
        capture only when ``resume`` (it still exists)."""


class Backend(Protocol):
    """The members of ``numbagraph.backend.active``."""

    NAME: ClassVar[str]
    """``"cuda"`` or ``"simulator"``."""

    # ------------------------------------------------------------ streams

    def stream_handle(self, stream: Any) -> int:
        """The handle of a numba, cuda.core or foreign stream (an object with
        ``__cuda_stream__``), or of an int; TypeError for anything else."""

    def as_numba_stream(self, stream: Any) -> Any:
        """``stream``, any stream :meth:`stream_handle` takes, as numba's own
        calls take a stream (``cuda.to_device(stream=)``, ``kernel[grid,
        block, stream]``, ``copy_to_host(stream=)``): itself when numba takes
        it (a numba or cuda.core stream), 0 for the default stream, else a
        numba stream over its handle, made once per handle; TypeError for
        anything else."""

    def is_capturing(self, handle: int) -> bool:
        """Whether the stream captures, by numbagraph or anyone else."""

    def synchronize(self, handle: int) -> None:
        """Wait for the stream's work."""

    def argument_types(self, dispatcher: Any, args: tuple) -> tuple:
        """The numba types a launch of the kernel gives ``args``; TypeError,
        naming the problem, when it is not a kernel or an argument cannot
        be passed to one."""

    def prepared_launch(self, dispatcher: Any, grid: Any, block: Any, shared: int,
                        handle: int, args: tuple,
                        trusted: bool = False) -> Callable[[], None] | None:
        """A call that launches the kernel with ``args`` (no wrappers; checked
        by the caller) without working them out again, or None where there
        is no faster path than a checked launch. ``trusted``: an op's kernel
        of one explicit signature, whose operands the op checked, takes
        ``args`` as numba would convert them to that signature."""

    def repeatable_types(self) -> tuple[frozenset, frozenset]:
        """(array types, stream types) whose instances never change what a
        launch packs for them: numba's device arrays (memory, dtype, shape
        and strides are fixed) and streams (the handle is fixed). An eager op
        called again with the same arrays and a stream of the same handle may
        launch what it launched before, already packed. Both empty when fast
        launches are off."""

    def compile_kernel(self, dispatcher: Any, args: tuple) -> None:
        """Compile the ``@cuda.jit`` kernel for arguments of the types of
        ``args``, without launching it; TypeError, naming the problem, when
        ``dispatcher`` is not a kernel or an argument cannot be passed to one."""

    def frees_wait_for_device(self) -> bool:
        """Whether freeing device memory waits for the device work that may
        use it: true of numba's own memory manager (cuMemFree waits for the
        device), not of a stream-ordered one plugged into numba (RMM)."""

    def joins_legacy_stream(self, handle: int) -> bool:
        """Whether work on the legacy default stream waits on this stream."""

    def in_kernel(self) -> bool:
        """Whether the caller runs inside a kernel, where indexing a device
        array reads device memory, not the host's (the simulator runs
        kernels as Python threads; host code on the driver never does)."""

    # ------------------------------------------------------------ capture

    Recording: ClassVar[Callable[..., Recording]]
    Executable: ClassVar[type[Executable]]

    DEVICE_ARRAY_TYPES: ClassVar[tuple[type, ...]]
    """numba's device array classes, whose host-facing methods are guarded."""
    STREAM_TYPE: ClassVar[type]
    """numba's stream class."""
    EVENT_TYPE: ClassVar[type]
    """numba's event class."""
    LIBRARY_KERNELS: ClassVar[bool]
    """Whether kernels a library launches itself on a stream handle (cuBLAS,
    through nvmath-python) run, and are recorded by a capture, as numba's
    launches are: True on the driver; the simulator runs Python kernels
    only."""

    def numba_patches(self, on_launch: LaunchHook) -> Sequence[Patch]:
        """The changes this backend makes to numba, every kernel launch
        passing through ``on_launch``; installed by ``numbagraph._patches``."""

    # ------------------------------------------------------------ launches

    def launch(self, dispatcher: Any, grid: Any, block: Any, handle: int,
               args: tuple, on_launch: LaunchHook) -> None:
        """``dispatcher[grid, block, stream](*args)`` for a kernel of one
        explicit signature, with its argument layout worked out once;
        ``on_launch`` applies as to every launch."""

    def type_launch(self, dispatcher: Any, args: tuple) -> None:
        """Refuse a launch of the kernel with ``args`` (no wrappers) that
        numba cannot type, before a capture records it: KernelArgumentError
        naming the argument (a number the kernel indexes, which a
        DeviceScalar replaces). The driver compiles what numba's launch
        would; the simulator, which types nothing, refuses what the kernel's
        source shows."""

    # ------------------------------------------------------------ scalars

    def scalar_store(self, dev: Any, dtype: np.dtype, handle: int) -> Callable[[Any], None]:
        """A call ``store(value)`` that enqueues "set ``dev`` to ``value``"
        on the stream; ``value`` has been checked to fit ``dtype``."""

    def scalar_store_recorded(self, dev: Any, value: Any, dtype: np.dtype,
                              handle: int) -> None:
        """Record "set the scalar to ``value``" into the stream's capture,
        with nothing on the host that must outlive the call."""

    def device_pointer(self, dev: Any) -> int:
        """The address of a device array's first element (0 when empty)."""

    def array_interface(self, dev: Any) -> dict:
        """``__cuda_array_interface__`` of a device array, naming no stream."""

    # ------------------------------------------------------------ ops

    def as_device_array(self, obj: Any) -> Any:
        """``obj`` as a numba device array without synchronising, or None
        when it is not device memory. Raises OpError, naming the problem,
        when its ``__cuda_array_interface__`` gives a pointer a kernel
        cannot use: NULL, not memory CUDA knows, or an extent past its
        allocation. With several devices, a foreign array's view belongs
        to the device its memory is on (``pointer_device_id``), whichever
        is current, so ``array_device_id`` names it."""

    def current_device_id(self) -> int:
        """The ordinal of the calling thread's current device."""

    load4: ClassVar[Callable[..., tuple]]
    """A device function, ``load4(a, i)``: ``(a[i], a[i+1], a[i+2],
    a[i+3])`` of a 1-D float32 array, as one 128-bit load on the driver,
    where the address of ``a[i]`` must be a multiple of 16 bytes."""
    store4: ClassVar[Callable[..., None]]
    """A device function, ``store4(a, i, v0, v1, v2, v3)``: ``a[i:i+4] =
    v0..v3`` of a 1-D float32 array, as one 128-bit store on the driver
    (``a[i]`` 16-byte aligned, as for ``load4``)."""
    device_math: ClassVar[Any]
    """The math functions op kernels call, as attributes: ``exp``, ``log``,
    ``sqrt``, ``tanh`` and ``erf`` of a float, each giving the device's IEEE
    result for every input (``log(-1.0)`` is NaN, ``log(0.0)`` is -inf,
    ``exp(1000.0)`` is inf) in its argument's float type. On the driver,
    Python's ``math``, which numba compiles to the device's own functions."""

    def convert(self, dtype: np.dtype) -> Callable[[Any], Any]:
        """A device function, ``convert(v)``: the value to store into an
        array of ``dtype`` so that it holds ``v`` converted as the device
        converts it (docs/ops.md, Conversions): integers wrap to ``dtype``'s
        width; floats become integers truncated toward zero, NaN as 0 and
        values out of range saturated (8-bit integers take the low byte of
        the 16-bit result); floats round to nearest, overflowing to inf;
        anything nonzero, NaN included, is True. On the driver, ``v``
        itself: the store converts it with numba's cast."""

    # ------------------------------------------------------------ devices

    def device_count(self) -> int:
        """How many devices the process may use (ordinals ``0..n-1``)."""

    def stream_device_id(self, stream: Any) -> int:
        """The ordinal of the device ``stream`` (a stream object or a raw
        handle) belongs to, asked of the driver once per stream object. The
        default, legacy default and per-thread default streams belong to
        the current device."""

    def array_device_id(self, dev: Any) -> int | None:
        """The ordinal of the device a numba device array's memory lives on,
        read from what numba keeps with it (no driver call), or None when
        ``dev`` is not a numba device array."""

    def pointer_device_id(self, pointer: int) -> int:
        """The ordinal of the device the memory at ``pointer`` (an address
        in device memory, not NULL) is on, asked of the driver each time:
        the address space is shared by every device, so an address freed on
        one may next be memory of another."""

    def use_device(self, ordinal: int) -> Any:
        """A context manager making device ``ordinal`` current on the calling
        thread for its block, and the device current before it afterwards."""

    def launch_limits(self) -> tuple[int, int]:
        """(multiprocessors, threads per block) to size ops' grids from."""

    def device_memory_used(self) -> int | None:
        """Bytes of the current device's memory in use, by every process, or
        None where there is no device memory to count."""

    def memset_zero(self, dev: Any, handle: int) -> None:
        """Enqueue "set every byte of ``dev`` to zero" on the stream."""

    def copy_device(self, dst: Any, src: Any, handle: int) -> None:
        """Enqueue "copy ``src`` into ``dst``" (device arrays of one size and
        dtype) on the stream: a copy node in a capture."""

    def mapped_host_array(self, size: int, dtype: np.dtype) -> np.ndarray:
        """``size`` elements of page-locked host memory mapped into the
        address space of every device: what a copy inside a conditional
        body, or a kernel, may write to."""

    def mapped_device_view(self, host: np.ndarray) -> Any:
        """A device array over the memory of ``host`` (from
        ``mapped_host_array``), which a kernel stores into and the host
        reads without a copy."""

    def copy_to_host_async(self, host: np.ndarray, dev: Any, handle: int) -> None:
        """Enqueue "copy ``dev`` into ``host``" (pinned memory of the same
        size) on the stream, without waiting: a copy node in a capture."""

    def pinned_host_array(self, obj: Any) -> np.ndarray | None:
        """The NumPy array over ``obj``'s memory when ``obj`` is a contiguous
        array in host memory CUDA allocated page-locked (``cuda.pinned_array``,
        ``cuda.mapped_array``, another library's pinned allocation), which a
        copy writes without staging and a capture records as a copy node;
        None for pageable memory, memory pinned only for a while
        (``cuda.pinned``), an empty array or anything else."""

    # ------------------------------------------------------------ host callbacks

    def host_call(self, handle: int, call: Callable[[], None]) -> None:
        """Enqueue ``call()`` on the stream: run on the host once the work
        before it is done, and before the work after it starts; a host node
        while the stream captures, run at that point of every launch of the
        graph. ``call`` raises nothing and calls no CUDA; the backend keeps
        it alive until it has run, or for as long as a graph made from the
        capture (or updated from one) may still run it."""

    # ------------------------------------------------------------ graph memory

    def graph_allocate(self, handle: int, shape: tuple[int, ...], dtype: np.dtype,
                       stream: Any, allocation: Any, order: str) -> Any:
        """Record an allocation of ``allocation.nbytes`` bytes into the
        stream's capture and return a device array of ``shape`` and
        ``dtype`` over it, contiguous in ``order`` ("C" or "F"), made for
        ``stream``, which :meth:`graph_memory_of` knows as
        ``allocation``'s."""

    def graph_free(self, handle: int, dev: Any, allocation: Any) -> None:
        """Record the free of ``allocation`` (``dev`` is its array) into the
        stream's capture."""

    def graph_memory_of(self, value: Any) -> tuple[Any, Any] | None:
        """``(allocation, output)`` of a device array over graph-owned memory
        (output: the graphed call that returned it, or None), or None for
        anything else; cheap for values that are not device arrays."""

    def graph_output(self, dev: Any, allocation: Any, output: Any) -> Any:
        """A new device array over the memory of ``dev`` (graph-owned),
        known by :meth:`graph_memory_of` as ``(allocation, output)``."""

    def release_graph_memory(self, allocations: Sequence[Any], handle: int | None,
                             device: int) -> None:
        """Free the allocations a closed graph's last launch left allocated,
        in the order of the stream ``handle`` it last ran on, in the context
        of the graph's device ``device`` whichever device is current (a
        finalizer may run it anywhere, inside one of numba's calls too)."""

    def graph_memory_info(self) -> tuple[int, int, int, int]:
        """The current device's graph memory: bytes in use now and at most,
        bytes reserved from the system now and at most."""

    def trim_graph_memory(self) -> None:
        """Give the graph memory no graph holds back to the system."""

    # ------------------------------------------------------------ inspection

    def describe_graph(self, executable: Executable,
                       kernels: Sequence[Any]) -> tuple[NodeInfo, ...]:
        """The nodes of the graph ``executable`` runs (that of the graph it
        was last updated from, if any), in a stable topological order, a
        conditional's bodies nested in its node. ``kernels`` are the
        ``@cuda.jit`` kernels launched in the capture: a kernel node names
        the one it runs, or None when it runs none of them."""

    # ------------------------------------------------------------ conditionals

    ConditionalNode: ClassVar[Callable[..., ConditionalNode]]

    def conditional_version(self) -> tuple[int, int]:
        """The CUDA version whose conditional nodes can be used."""

    def condition_create(self, recording: Recording, default: int | None) -> Any:
        """A condition of the graph the recording's stream captures into."""

    def condition_argument(self, state: Any) -> Any:
        """What a kernel is given for a condition."""

    def set_condition(self, cond: Any, value: Any) -> None:
        """Device function: set ``cond`` to ``value`` from a kernel; a pass
        tag (``pass_condition``) ends its unrolled loop after its pass."""

    def pass_condition(self, state: Any, index: int) -> Any:
        """What a kernel recorded into pass ``index`` (from 1) of an unrolled
        loop is given for the loop's condition: a tag that, set to 0, lowers
        ``state[0]`` (an int32 device array: the last pass of the iteration
        that may run) to ``index`` and sets ``state[1]`` (stopped)."""

    def loop_memory(self, size: int, dtype: Any,
                    release: Callable[[Callable[[], None]], None]) -> Any:
        """A device array of ``size`` elements for a loop's own state, made
        even while the thread captures (no graph holds it); once collected
        its memory is freed through ``release``."""

    def capture_node_count(self, handle: int) -> int:
        """How many nodes the graph the stream captures into holds now (the
        open body's, inside a conditional block)."""

    def set_launch_guard(self, hook: Any) -> None:
        """Install ``hook(handle, kernel, args)`` (or None) in front of every
        kernel launch: where it returns ``(kernel2, args2)``, the launch is
        ``kernel2`` with ``args2``, in the same configuration, instead."""

    def divert_launches(self, handle: int, early: bool = False) -> list:
        """From now on, kernel launches on the stream ``handle`` (this
        thread's, for the per-thread default stream), once ``on_launch``
        has passed them, and the copies and fills numbagraph makes there
        (``copy_device``, ``copy_to_host_async``, ``memset_zero``) are
        listed in order in the list returned instead of made, as
        ``Executable.reparameterise`` takes them, each a tuple: a copy or
        fill named by its first item (``"copy"``, ``"to host"``,
        ``"fill"``); a launch the backend cannot list so (on the driver,
        one its fast path cannot pack) is made as before. With ``early``, the caller vouching that
        ``on_launch`` would pass launches whose arguments are device arrays
        and numbers alone and keep nothing for them, such a launch may be
        taken before it, listed with ``kernel, args`` at its end, and no
        capture keeps it."""

    def stop_diverting(self, handle: int) -> None:
        """Launches on the stream are made again."""

    # ------------------------------------------------------------ device-updatable nodes

    def device_node_create(self, recording: Recording,
                           release: Callable[[Callable[[], None]], None]) -> Any:
        """The state of a new device node of the capture ``recording``, to be
        attached to a kernel node later in the capture (anything it holds in
        device memory is freed through ``release`` once collected)."""

    def device_node_argument(self, state: Any) -> Any:
        """What a kernel is given for a device node."""

    def device_node_attach(self, recording: Recording, state: Any, handle: int) -> None:
        """Make the node the stream ``handle`` recorded last, a kernel node,
        the device node of ``state``: kernels calling ``set_grid`` and
        ``set_enabled`` with it update that node in the executable, from the
        GPU. TypeError where the stream's work does not stand after exactly
        one kernel node."""

    def device_node_count(self, executable: Executable) -> int:
        """How many device-updatable kernel nodes the graph ``executable``
        runs holds (none may be in a graph updated from or into another, or
        recorded into another capture as a child graph)."""

    def set_grid(self, node: Any, x: Any, y: Any = 1, z: Any = 1) -> int:
        """Device function: set the grid of the device node ``node`` to
        ``(x, y, z)`` (each taken as a uint32); CUDA's error code: 0, or 1
        (cudaErrorInvalidValue, nothing changed) for a dimension of 0 or
        beyond the device's limits."""

    def set_enabled(self, node: Any, enabled: Any) -> int:
        """Device function: enable (non-zero) or disable the device node
        ``node``; CUDA's error code, 0."""

    # ------------------------------------------------------------ several streams

    def wait_stream(self, waiter: int, waited: int) -> None:
        """Make the stream ``waiter`` wait for the work enqueued so far on
        ``waited``, as an event recorded on ``waited`` and waited on by
        ``waiter`` does: inside a capture, this forks ``waiter`` into it or
        joins it back."""

    def capture_id(self, handle: int) -> int | None:
        """The id of the capture the stream ``handle`` records into, the
        same for every stream of one capture, whoever began it; None when
        it records into none. Not for the legacy default stream, which
        never captures."""

    def capture_frontier(self, handle: int) -> Any:
        """What the stream's capture stands after now: the nodes its next
        work will depend on, as a value that changes whenever work is
        recorded on the stream or it waits on other work of the capture
        (compare with ``==``); None when the stream does not capture."""

    def stream_waited(self, recording: Recording, handle: int, frontier: Any) -> None:
        """The stream ``handle`` waited on work of the capture ``recording``
        that stood at ``frontier``: it is in that capture from now on, its
        next work after that work (the driver's own event wait did this on
        the device; the backend keeps track of the stream)."""

    def leave_capture(self, recording: Recording, handle: int) -> None:
        """The stream ``handle``, forked into the capture ``recording`` and
        joined back, is in it no more: a conditional block ended the
        capture and began it again, on the capture's own stream alone."""

    def embed_graph(self, executable: Executable, handle: int) -> None:
        """Record the graph ``executable`` runs now (that of the graph it was
        last updated from, if any) into the capture on the stream ``handle``
        as one child graph node, after the stream's work so far and before
        its next; later changes to ``executable`` do not reach the node."""

    def has_conditionals(self, executable: Executable) -> bool:
        """Whether the graph ``executable`` runs holds a conditional node,
        which CUDA forbids in a child graph."""

    # ------------------------------------------------------------ collectives

    def dist_unavailable(self, size: int) -> str | None:
        """Why a communicator of ``size`` ranks cannot be made here (NCCL,
        through nccl4py, not installed or not loading; more than one rank
        where processes cannot reach each other), or None when it can."""

    def dist_unique_id(self) -> bytes:
        """A new unique id (128 bytes) that every rank of one communicator
        is given."""

    def dist_communicator(self, unique_id: bytes, size: int, rank: int) -> Any:
        """The communicator of ``size`` ranks named by ``unique_id``, this
        process being ``rank``, on the current device; returns once every
        rank has called it."""

    def dist_collective(self, comm: Any, kind: str, send: Any, recv: Any, count: int,
                        datatype: int, op: int, root: int, handle: int) -> None:
        """Enqueue the collective ``kind`` (``"all_reduce"``,
        ``"broadcast"``, ``"reduce_scatter"``, ``"all_gather"``) of
        ``count`` elements per rank (NCCL's count: of ``recv`` for a
        reduce-scatter, of ``send`` for the others) of NCCL's ``datatype``
        from ``send`` into ``recv`` (contiguous device arrays, checked by
        the caller) on the stream: recorded into its capture, the library's
        own nodes, while it captures."""

    def dist_close(self, comm: Any) -> None:
        """Finish the communicator's work and free it (every rank calls it)."""


def _members() -> tuple[str, ...]:
    names = [name for name in vars(Backend) if not name.startswith("_")]
    names += [name for name in getattr(Backend, "__annotations__", {})
              if not name.startswith("_") and name not in names]
    return tuple(sorted(names))


MEMBERS: tuple[str, ...] = _members()
"""Every name a backend provides."""


def bind(name: str, *modules: types.ModuleType) -> Backend:
    """The backend ``name``: a namespace holding exactly :data:`MEMBERS`,
    each found in ``modules`` once (or as the same object, imported)."""
    found: dict[str, Any] = {}
    twice, missing = [], []
    for member in MEMBERS:
        owners = [m for m in modules if member in vars(m)]
        values = {id(vars(m)[member]): vars(m)[member] for m in owners}
        if len(values) > 1:
            twice.append(f"{member} ({', '.join(m.__name__ for m in owners)})")
        elif not values:
            missing.append(member)
        else:
            found[member] = next(iter(values.values()))
    if twice or missing:
        raise ImportError(
            f"the {name} backend does not implement numbagraph.backend.interface."
            f"Backend: missing {missing or 'nothing'}; defined twice {twice or 'nowhere'}"
        )
    backend = types.SimpleNamespace(**found)
    backend.__name__ = f"numbagraph.backend ({name})"
    return backend  # type: ignore[return-value]
