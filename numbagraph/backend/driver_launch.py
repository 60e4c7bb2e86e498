"""Kernel launches on the driver without numba's per-launch work.

numba works out every argument's type and layout again at each launch. Here
a launch is keyed by what decides the compiled signature (per argument: its
Python type, and for a device array its dtype, rank and layout); the first
launch of a key looks up the overload compiled for exactly those numba
types, and every later one packs the arguments as numba's own launch would
(``Kernel.launch`` / ``_prepare_args`` of numba-cuda) and calls cuda.core's
launch directly. What this does not cover goes through numba unchanged: a
signature not compiled yet (numba compiles it, and the next launch is fast),
an argument kind not listed below, kernels with extensions, debug or
cooperative kernels, launch-config-sensitive kernels, pre-launch callbacks.

Covered argument kinds: numba device arrays (any dtype numba types, rank
1 and up, any strides), Python ``int`` (as int64), ``float``, ``bool``,
``complex``, and NumPy scalars of the integer, float, complex and bool
types. DeviceScalars and Conditions arrive here unwrapped (device arrays,
uint64).

``kernel[griddim, blockdim, stream, sharedmem](*args)`` takes this path once
numbagraph is imported, unless ``NUMBAGRAPH_FAST_LAUNCH=0`` or the installed
numba-cuda is not one this layout was checked against (``CHECKED``).
"""

from __future__ import annotations

import ctypes
import operator
import importlib.metadata
import struct
import threading
import warnings
from typing import Any, Callable

import numpy as np
from cuda.bindings import driver as cu
from cuda.core import Stream as _CoreStream
from numba.cuda import types as numba_types
from numba.cuda.dispatcher import CUDADispatcher, _DispatcherBase, _Kernel
from numba.core import errors as _core_errors
from numba.cuda.core import errors as _cuda_errors

from numba import cuda
from numba.cuda.cudadrv import devicearray as _devicearray
from numba.cuda.cudadrv import driver as _driver

from ._streams import capture_key, stream_handle
from .driver_divert import Taken, diverted as _diverted
from .driver import _context_key
from .driver import argument_types
from ._arguments import untyped_launch
from .driver_base import DriverError
from .interface import LaunchHook, Patch, fast_launch_off

# numba-cuda versions whose argument layout and dispatch the fast path
# follows.
CHECKED = ("0.30.4",)


def _version() -> str:
    try:
        return importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _enabled() -> bool:
    if fast_launch_off():
        return False
    version = _version()
    if version not in CHECKED:
        warnings.warn(
            f"numbagraph's fast kernel launch was checked against numba-cuda "
            f"{', '.join(CHECKED)}, not {version}: kernels launch through numba's own "
            "path. Install a checked numba-cuda for the fast path",
            RuntimeWarning, stacklevel=2)
        return False
    return True


FAST = _enabled()


# ---------------------------------------------------------------- packing

# Each kernel parameter numba passes, as a struct code: an array is meminfo,
# parent, size, itemsize, data, shape, strides (numba's _prepare_args); a
# scalar is its value (a float16 as its bits, a complex as two floats).

def _array_values(value: Any, out: list) -> None:
    entry = value.__dict__.get(_ENTRY)
    out += (entry if entry is not None else _array_entry(value))[1]


def _plain(convert: Callable[[Any], Any]) -> Callable[[Any, list], None]:
    return lambda value, out: out.append(convert(value))


def _complex(value: Any, out: list) -> None:
    value = complex(value)
    out += (value.real, value.imag)


def _half_bits(value: Any) -> int:
    return int(np.float16(value).view(np.uint16))


_SCALARS: dict[Any, tuple[str, Callable[[Any, list], None]]] = {
    **{getattr(numba_types, name): (code, _plain(int)) for name, code in (
        ("int8", "b"), ("int16", "h"), ("int32", "i"), ("int64", "q"),
        ("uint8", "B"), ("uint16", "H"), ("uint32", "I"), ("uint64", "Q"))},
    numba_types.float16: ("H", _plain(_half_bits)),
    numba_types.float32: ("f", _plain(float)),
    numba_types.float64: ("d", _plain(float)),
    numba_types.boolean: ("?", _plain(bool)),
    numba_types.complex64: ("ff", _complex),
    numba_types.complex128: ("dd", _complex),
}


def layout_of(ty: Any) -> tuple[str, Callable[[Any, list], None]] | None:
    """(struct codes of its parameters, packer) of a value of the numba type
    ``ty``, or None when it is not a kind the fast path packs."""
    if isinstance(ty, numba_types.Array):
        return ("qqqqQ" + "q" * (2 * ty.ndim), _array_values) if ty.ndim > 0 else None
    return _SCALARS.get(ty)


class Plan:
    """How a kernel's arguments of one key are launched: the function, the
    packers, and the parameter buffer's layout (each parameter at its own
    alignment, as the driver reads ``kernelParams``). Each thread packs into
    its own buffer, which lives as long as the thread; the driver copies the
    parameters before the launch call returns."""

    __slots__ = ("kernel", "function", "packers", "_struct", "_offsets", "_local")

    def __init__(self, kernel: Any, function: Any, layouts: list[tuple[str, Callable]]):
        self.kernel, self.function = kernel, function
        self.packers = [pack for _, pack in layouts]
        codes = "".join(code for code, _ in layouts)
        self._struct = struct.Struct("@" + codes)
        offsets, offset = [], 0
        for code in codes:
            size = struct.calcsize(code)
            offset = -(-offset // size) * size
            offsets.append(offset)
            offset += size
        self._offsets = offsets
        self._local = threading.local()

    def buffer(self) -> tuple[Any, Any, int]:
        """A new parameter buffer: (bytes, pointer array, its address)."""
        buffer = ctypes.create_string_buffer(max(self._struct.size, 1))
        base = ctypes.addressof(buffer)
        pointers = (ctypes.c_void_p * max(len(self._offsets), 1))(
            *[base + offset for offset in self._offsets])
        return buffer, pointers, ctypes.addressof(pointers)

    def pack(self, args: tuple, into: tuple | None = None) -> tuple[Any, Any, int]:
        """Pack ``args`` into ``into`` (a :meth:`buffer`), or this thread's
        buffer; returns the buffer, which the caller holds until the launch
        call has returned."""
        values: list = []
        for pack, value in zip(self.packers, args):
            pack(value, values)
        if into is None:
            local = self._local
            into = getattr(local, "entry", None)
            if into is None:
                into = local.entry = self.buffer()
        self._struct.pack_into(into[0], 0, *values)
        return into

    def packed(self, args: tuple) -> bytes:
        """``args`` packed as a launch packs them, as bytes."""
        values: list = []
        for pack, value in zip(self.packers, args):
            pack(value, values)
        return self._struct.pack(*values)

    @property
    def offsets(self) -> list[int]:
        """Each parameter's offset in the packed bytes."""
        return self._offsets


# ---------------------------------------------------------------- keys

_INT64 = (-(1 << 63), 1 << 63)
# Scalar types whose numba type the Python type alone decides (an int only
# within int64, checked in key_of).
_SCALAR_KINDS = frozenset({
    float, bool, complex, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
    np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
    np.bool_})
# numba's device array classes whose numba type is worked out as below.
_ARRAY_TYPES = {_devicearray.DeviceNDArray}


# A numba device array never changes its memory, dtype, shape or strides, so
# what a launch needs of it is worked out once and kept on the array: its key
# and the values numba packs for it.
_ENTRY = "_numbagraph_launch"


def _array_entry(value: Any) -> tuple[tuple, tuple]:
    dummy = value._dummy
    broadcast = value.size != 0 and 0 in value.strides
    dtype = value.dtype
    # Equal record dtypes may differ in alignment, which numba's type keeps.
    key = (type(value), dtype, dtype.isalignedstruct, value.ndim,
           dummy.is_c_contig and not broadcast, dummy.is_f_contig and not broadcast)
    values = (0, 0, value.size, dtype.itemsize, value.device_ctypes_pointer.value or 0,
              *value.shape, *value.strides)
    entry = value.__dict__[_ENTRY] = (key, values)
    return entry


def key_of(args: tuple) -> tuple | None:
    """What decides the compiled signature of a launch with ``args``, or None
    when an argument is not a kind the fast path covers."""
    key = []
    for value in args:
        kind = type(value)
        if kind in _ARRAY_TYPES:
            entry = value.__dict__.get(_ENTRY)
            key.append((entry if entry is not None else _array_entry(value))[0])
        elif kind is int:
            if not _INT64[0] <= value < _INT64[1]:
                return None
            key.append(int)
        elif kind in _SCALAR_KINDS:
            key.append(kind)
        else:
            return None
    return tuple(key)


# ---------------------------------------------------------------- plans

# (dispatcher, context handle) -> {key: its Plan, or, when there is none,
# how many overloads the kernel had when that was found}
_plans: dict[tuple[Any, int], dict[tuple, Plan | int]] = {}


def _plan(dispatcher: Any, args: tuple, trusted: bool) -> Plan | None:
    """The plan of the overload compiled for exactly the numba types of
    ``args`` (or, when ``trusted``, an op whose operands were checked, of
    its one overload), or None."""
    if dispatcher.extensions or getattr(dispatcher, "_launch_config_sensitive", False):
        return None
    try:
        types = tuple(dispatcher.typeof_pyval(value) for value in args)
    except Exception:  # noqa: BLE001  numba reports untypeable arguments itself
        return None
    kernel = dispatcher.overloads.get(types)
    if kernel is None and trusted and getattr(dispatcher, "specialized", False):
        kernel = next(iter(dispatcher.overloads.values()), None)  # numba's choice too
    if (not isinstance(kernel, _Kernel) or kernel.debug or kernel.cooperative
            or getattr(kernel, "launch_config_sensitive", False)):
        return None
    layouts = [layout_of(ty) for ty in kernel.argument_types]
    if None in layouts or len(layouts) != len(args):
        return None
    handle = int(kernel._codelibrary.get_cufunc().handle)
    # numba loads kernels from libraries (a CUkernel, which cuLaunchKernel
    # takes as a function and looks up in the current context at each
    # launch): plans are per context, so each launches the function the
    # kernel is in its own.
    err, function = cu.cuKernelGetFunction(cu.CUkernel(handle))
    if err != cu.CUresult.CUDA_SUCCESS:
        function = cu.CUfunction(handle)
    return Plan(kernel, function, layouts)


def plan_for(dispatcher: Any, args: tuple, ctx_key: int, trusted: bool = False,
             key: tuple | None = None) -> Plan | None:
    """The launch plan for ``args`` (whose :func:`key_of` is ``key``, when
    the caller has it), worked out once per key; None when numba must launch
    it (a signature not compiled yet is looked up again)."""
    if key is None:
        key = key_of(args)
    if key is None or getattr(dispatcher, "_launch_config_sensitive", False):
        return None
    plans = _plans.get((dispatcher, ctx_key))
    if plans is None:
        if len(_plans) > 4096:
            _plans.clear()
        plans = _plans[(dispatcher, ctx_key)] = {}
    plan = plans.get(key)
    if type(plan) is Plan:
        return plan
    # Looked up before: look again only once numba has compiled another
    # overload (a launch through numba compiles one for these types).
    if plan is not None and plan == len(dispatcher.overloads):
        return None
    found = _plan(dispatcher, args, trusted)
    plans[key] = found if found is not None else len(dispatcher.overloads)
    return found


def _dim3(dim: Any) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in dim) if isinstance(dim, tuple) else (int(dim),)
    return (dims + (1, 1, 1))[:3]  # type: ignore[return-value]


_dims: dict[tuple, tuple] = {}


def dims_for(grid: Any, block: Any, shared: int) -> tuple:
    """(grid x, y, z, block x, y, z, shared bytes) for cuLaunchKernel."""
    key = (grid, block, shared)
    dims = _dims.get(key)
    if dims is None:
        dims = (*_dim3(grid), *_dim3(block), int(shared))
        if min(dims[:6]) < 1 or dims[6] < 0:
            raise ValueError(
                f"grid {grid} and block {block} need every dimension >= 1, and shared "
                f"memory {shared} bytes >= 0")
        if len(_dims) > 4096:
            _dims.clear()
        _dims[key] = dims
    return dims


_streams: dict[int, Any] = {}


def _stream(handle: int) -> Any:
    stream = _streams.get(handle)
    if stream is None:
        if len(_streams) > 1024:
            _streams.clear()
        stream = _streams[handle] = cu.CUstream(handle)
    return stream


def launch_packed(plan: Plan, args: tuple, handle: int, dims: tuple) -> None:
    packed = plan.pack(args)
    err, = _launch_kernel(plan.function, *dims, _stream(handle), packed[2], 0)
    if err:
        raise DriverError("cuLaunchKernel", err)


_launch_kernel = cu.cuLaunchKernel


# ---------------------------------------------------------------- diverted launches

def _divert(handle: int, dispatcher: Any, args: tuple, dims: tuple,
            trusted: bool = False) -> bool:
    taken = _diverted.get(capture_key(handle))
    if taken is None or not FAST:
        return False
    plan = plan_for(dispatcher, args, _context_key(), trusted)
    if plan is None:
        return False
    taken.append((plan, dims, plan.packed(args)))
    return True


# ---------------------------------------------------------------- kernel[...]

class FastConfiguration:
    """``kernel[griddim, blockdim, stream, sharedmem]``: a launch
    configuration whose call packs the arguments and launches through the
    driver where it can, and through numba otherwise.

    One is made per kernel and configuration, from numba's own configuration
    (its checks and warnings ran), and kept: it remembers the plan of its
    last launch, which the next launch with arguments of the same key and in
    the same context takes without looking it up."""

    __slots__ = ("dispatcher", "numba", "handle", "cu_stream", "dims", "_last", "_packed")

    def __init__(self, dispatcher: Any, numba: Any):
        self.dispatcher, self.numba = dispatcher, numba
        self.handle = int(numba.stream.handle)
        self.dims = dims_for(tuple(numba.griddim), tuple(numba.blockdim), int(numba.sharedmem))
        self.cu_stream = _stream(self.handle)
        # (context key, argument key, plan) of the last fast launch, and this
        # thread's packing.
        self._last: tuple | None = None
        self._packed = _Packed()

    # numba's _LaunchConfiguration attributes, for code that reads them.
    griddim = property(lambda self: self.numba.griddim)
    blockdim = property(lambda self: self.numba.blockdim)
    stream = property(lambda self: self.numba.stream)
    sharedmem = property(lambda self: self.numba.sharedmem)

    @property
    def pre_launch_callbacks(self) -> list:
        """numba's own configuration's callbacks (numba shares one
        configuration among equal ``kernel[...]``); while any is set, the
        launch is numba's, which runs them."""
        return self.numba.pre_launch_callbacks

    def forget(self) -> None:
        """Drop the plan and the packings it remembers (the kernel was
        compiled again)."""
        self._last = None
        self._packed = _Packed()

    def _take(self, taken: Taken, args: tuple, ctx: int, early: bool) -> bool:
        """List the launch with ``args`` in ``taken``, where the fast path
        packs it."""
        key = key_of(args)
        if key is None:
            return False
        memo = self._last
        if memo is not None and memo[1] == key and memo[0] == ctx:
            plan = memo[2]
        else:
            plan = plan_for(self.dispatcher, args, ctx, key=key)
            if plan is None:
                return False
            self._last = (ctx, key, plan)
        if early:
            taken.append((plan, self.dims, plan.packed(args), self.dispatcher, args))
        else:
            taken.append((plan, self.dims, plan.packed(args)))
        return True

    def __call__(self, *args: Any) -> Any:
        dispatcher = self.dispatcher
        if _diverted and _guard[0] is None and not self.numba.pre_launch_callbacks:
            taken = _diverted.get(capture_key(self.handle))
            if taken is not None and taken.early and self._take(taken, args, _context_key(),
                                                                True):
                return None
        if _guard[0] is not None:
            numba = self.numba
            if _launch_guarded(self.handle, dispatcher, args, numba.griddim,
                               numba.blockdim, numba.stream, numba.sharedmem):
                return None
        args = _on_launch[0](self.handle, dispatcher, args)
        if self.numba.pre_launch_callbacks:
            return _numba_call[0](dispatcher, args, self.numba)
        ctx = _context_key()
        if _diverted:
            taken = _diverted.get(capture_key(self.handle))
            if taken is not None and self._take(taken, args, ctx, False):
                return None
        packed = self._packed
        last = packed.last
        marks = _marks(args)
        if last is not None and last[0] == ctx and len(marks) == len(last[1]) and all(
                map(operator.is_, marks, last[1])):
            # The same arrays and number objects as this thread's last
            # launch of this configuration: its packing holds.
            err, = _launch_kernel(last[2], *self.dims, self.cu_stream, last[3][2], 0)
            if err:
                raise DriverError("cuLaunchKernel", err)
            return None
        key = key_of(args)
        memo = self._last
        if memo is not None and memo[1] == key and memo[0] == ctx:
            plan = memo[2]
        else:
            plan = plan_for(dispatcher, args, ctx, key=key)
            if plan is None:
                return _numba_call[0](dispatcher, args, self.numba)
            self._last = (ctx, key, plan)
        buffer = packed.buffer
        if buffer is None or packed.plan is not plan:
            buffer, packed.plan = plan.buffer(), plan
            packed.buffer = buffer
        plan.pack(args, buffer)
        err, = _launch_kernel(plan.function, *self.dims, self.cu_stream, buffer[2], 0)
        if err:
            packed.last = None
            raise DriverError("cuLaunchKernel", err)
        # Array marks are computed now that key_of has made every entry.
        packed.last = (ctx, _marks(args), plan.function, buffer)
        return None


def _marks(args: tuple) -> tuple:
    """What identifies the packing of ``args``: an array's cached entry (so
    the marks hold no array, and a new array at a reused address has a new
    mark), any other argument itself."""
    return tuple([value.__dict__.get(_ENTRY) if type(value) in _ARRAY_TYPES else value
                  for value in args])


class _Packed(threading.local):
    """A configuration's packing on one thread: its own parameter buffer, the
    plan it was made for, and (context, argument marks (:func:`_marks`),
    function, buffer) of the last launch."""

    last: tuple | None = None
    buffer: tuple | None = None
    plan: Plan | None = None


# The launch hook and numba's own CUDADispatcher.call, set as the patches
# are made; the launch guard, set while a guarded pass records.
_on_launch: list[Any] = [None]
_guard: list[Any] = [None]
_numba_call: list[Any] = [None]
# dispatcher -> {configuration arguments: its FastConfiguration}
_configurations: dict[Any, dict[tuple, FastConfiguration]] = {}


def set_launch_guard(hook: Any) -> None:
    _guard[0] = hook


def _launch_guarded(handle: int, dispatcher: Any, args: tuple, grid: Any, block: Any,
                    stream: Any, shared: int) -> bool:
    """Launch, in the kernel's place, the guard the hook gives for it, with the
    kernel's own configuration; False where the hook leaves the launch as it is."""
    swapped = _guard[0](handle, dispatcher, args)
    if swapped is None:
        return False
    swapped[0][grid, block, stream, shared](*swapped[1])
    return True


def _exact(dim: Any) -> bool:
    """Whether a launch dimension is an int or a tuple of ints, which numba
    takes as they are (anything else it converts or refuses each time)."""
    return type(dim) is int or (type(dim) is tuple and all(type(d) is int for d in dim))


def _fast_getitem(original: Callable) -> Callable:
    def getitem(self: Any, args: Any) -> Any:
        if (type(args) is not tuple or len(args) not in (2, 3, 4)
                or not (_exact(args[0]) and _exact(args[1]))
                or (len(args) == 4 and type(args[3]) is not int)):
            return original(self, args)
        per_kernel = _configurations.get(self)
        if per_kernel is None:
            if len(_configurations) > 4096:
                _configurations.clear()
            per_kernel = _configurations[self] = {}
        try:
            configuration = per_kernel.get(args)
        except TypeError:  # an unhashable configuration: numba's path
            return original(self, args)
        if configuration is None:
            numba = original(self, args)  # validates, normalises, warns
            if len(per_kernel) > 256:
                per_kernel.clear()
            configuration = per_kernel[args] = FastConfiguration(self, numba)
        return configuration

    return getitem


def _hooked_call(original: Callable, on_launch: LaunchHook) -> Callable:
    _numba_call[0], _on_launch[0] = original, on_launch

    def call(self, args, launch_config):
        handle = int(launch_config.stream.handle)
        c = launch_config
        if _guard[0] is not None and _launch_guarded(
                handle, self, args, c.griddim, c.blockdim, c.stream, c.sharedmem):
            return None
        args = on_launch(handle, self, args)
        if _diverted and not c.pre_launch_callbacks and _divert(
                handle, self, args, dims_for(tuple(c.griddim), tuple(c.blockdim),
                                             int(c.sharedmem))):
            return None
        return original(self, args, launch_config)

    return call


# numba's typing failures: numba-cuda's own class, and numba's.
_TYPING_ERRORS = tuple({_cuda_errors.TypingError, _core_errors.TypingError})


def type_launch(dispatcher: Any, args: tuple) -> None:
    """Compile ``dispatcher`` for ``args`` where numba's launch would (a
    signature not compiled yet), before a capture records the launch: a
    kernel numba cannot type with them is refused with the error that names
    the argument. A kernel of explicit signatures compiles nothing (numba's
    launch converts to one of them or refuses); any other failure is left
    to numba's launch to raise."""
    if (not isinstance(dispatcher, CUDADispatcher) or getattr(dispatcher, "specialized", False)
            or not dispatcher._can_compile):
        return
    marks = _typing_marks(args)
    if marks is not None and _same_marks(marks, _typed.get(dispatcher)):
        return  # arguments that type as those it was last typed for
    if not (FAST and plan_for(dispatcher, args, _context_key()) is not None):
        types = argument_types(dispatcher, args)
        if types not in dispatcher.overloads:
            try:
                dispatcher.compile(types)
            except _TYPING_ERRORS as exc:
                name = dispatcher.py_func.__name__
                raise untyped_launch(name, dispatcher.py_func, args, types, str(exc)) from exc
            except Exception:  # noqa: BLE001  numba's launch raises its own error
                return
    if marks is not None:
        if len(_typed) > 4096:
            _typed.clear()
        _typed[dispatcher] = marks


# dispatcher -> the marks (:func:`_typing_marks`) of the arguments it was
# last typed for by :func:`type_launch`.
_typed: dict[Any, tuple] = {}
_NUMBERS = (int, float, bool, complex)


def _typing_marks(args: tuple) -> tuple | None:
    """What shows, without typing them, that arguments type as others did:
    a numba device array's launch entry (its type never changes, and the
    entry holds no array), a Python number itself; None where any argument
    is of another kind, or an array not launched yet."""
    marks = []
    for value in args:
        kind = type(value)
        if kind in _ARRAY_TYPES:
            entry = value.__dict__.get(_ENTRY)
            if entry is None:
                return None
            marks.append(entry)
        elif kind in _NUMBERS:
            marks.append(value)
        else:
            return None
    return tuple(marks)


def _same_marks(marks: tuple, last: tuple | None) -> bool:
    """Whether arguments of ``marks`` type as those of ``last`` did: the same
    arrays, and equal Python numbers of one type."""
    if last is None or len(marks) != len(last):
        return False
    for a, b in zip(marks, last):
        if a is not b and not (type(a) is type(b) and type(a) in _NUMBERS and a == b):
            return False
    return True


def _forgetting_plans(original: Callable) -> Callable:
    def reset_overloads(self: Any) -> None:
        # The kernels are compiled again (recompile): plans of the old ones go,
        # with the configurations that remember one.
        for key in [k for k in _plans if k[0] is self]:
            del _plans[key]
        for configuration in _configurations.pop(self, {}).values():
            configuration.forget()
        _typed.pop(self, None)
        original(self)

    return reset_overloads


def numba_patches(on_launch: LaunchHook) -> tuple[Patch, ...]:
    """The driver's changes to numba: every kernel launch passes through
    ``on_launch``; and, unless the fast path is off, ``kernel[...]`` returns
    a configuration that launches through it."""
    rows = [
        Patch(CUDADispatcher, "call", lambda original: _hooked_call(original, on_launch),
              "every kernel launch passes through numbagraph's launch check, which "
              "keeps a capture's arguments alive and unwraps DeviceScalars and "
              "Conditions"),
    ]
    if FAST:
        rows.append(Patch(
            _DispatcherBase, "_reset_overloads", _forgetting_plans,
            "a kernel compiled again (recompile) drops the fast path's plans of the "
            "kernels it replaces"))
        rows.append(Patch(
            CUDADispatcher, "__getitem__", _fast_getitem,
            "kernel[griddim, blockdim, stream, sharedmem] launches with the arguments "
            "packed as numba packs them, through cuda.core, where the signature is "
            "compiled and every argument is a kind it packs; otherwise through numba"))
    return tuple(rows)


# ---------------------------------------------------------------- ops

_fallback_streams: dict[int, Any] = {}


def launch(dispatcher: Any, grid: Any, block: Any, handle: int, args: tuple,
           on_launch: LaunchHook) -> None:
    """``dispatcher[grid, block, stream](*args)`` for an op's kernel, with
    ``on_launch`` applied as to every launch."""
    if _guard[0] is not None and _launch_guarded(
            handle, dispatcher, args, grid, block, _numba_stream(handle), 0):
        return
    args = on_launch(handle, dispatcher, args)
    if _diverted and _divert(handle, dispatcher, args, dims_for(grid, block, 0), trusted=True):
        return
    plan = plan_for(dispatcher, args, _context_key(), trusted=True) if FAST else None
    if plan is not None:
        launch_packed(plan, args, handle, dims_for(grid, block, 0))
        return
    _numba_call[0](dispatcher, args, dispatcher.configure(grid, block, _numba_stream(handle)))


def _numba_stream(handle: int) -> Any:
    stream = _fallback_streams.get(handle)
    if stream is None:
        if len(_fallback_streams) > 1024:
            _fallback_streams.clear()
        stream = _fallback_streams[handle] = cuda.external_stream(handle)
    return stream


# The streams numba's calls take as they are; any other stream is passed to
# numba as an external stream over its handle.
_NUMBA_STREAMS = (_driver.Stream, _CoreStream)


def as_numba_stream(stream: Any) -> Any:
    """``stream`` as numba's calls take it: itself for a numba or cuda.core
    stream, 0 for the default stream, else ``cuda.external_stream`` of its
    handle, made once per handle."""
    if isinstance(stream, _NUMBA_STREAMS):
        return stream
    handle = stream_handle(stream)
    return 0 if handle == 0 else _numba_stream(handle)


def repeatable_types() -> tuple[frozenset, frozenset]:
    """numba's device arrays and streams, while fast launches are on."""
    if not FAST:
        return frozenset(), frozenset()
    return frozenset({_devicearray.DeviceNDArray}), frozenset({_driver.Stream})


def prepared_launch(dispatcher: Any, grid: Any, block: Any, shared: int, handle: int,
                    args: tuple, trusted: bool = False) -> Callable[[], None] | None:
    plan = plan_for(dispatcher, args, _context_key(), trusted) if FAST else None
    if plan is None:
        return None
    # The record's own packing, made once: the driver reads it at each launch.
    packed = plan.pack(args, plan.buffer())
    call = (plan.function, *dims_for(grid, block, shared), _stream(handle), packed[2], 0)
    launch_kernel = _launch_kernel

    def launch() -> None:
        err, = launch_kernel(*call)
        if err:
            raise DriverError("cuLaunchKernel", err)

    launch.keep = packed  # type: ignore[attr-defined]
    return launch
