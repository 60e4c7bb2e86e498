"""Launch records: one kernel launch, its configuration and arguments fixed
once, launched again and again at the cost of the driver's call.

A record compiles the kernel for its arguments when it is made, packs them
as numba would, and keeps the packing: ``rec.launch()`` hands it to the
driver. ``rec.set_arg(i, value)`` replaces one argument by another of the
same numba type (another array of the same dtype, rank and layout; a new
number). Inside a capture, or while graph-owned memory exists, a launch
takes the checked path every launch takes (the launch hook, then the fast
path), so capture rules and graph memory rules hold for records too.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numba.cuda.args import ArgHint

from . import _foreign, _registry
from ._graphmem import held as _graph_memory_held
from ._hostcalls import attention as _host_attention
from ._registry import sessions as _sessions
from .backend import active as _backend
from .errors import KernelArgumentError
from .precompile import _stand_in

__all__ = ["launch_record", "LaunchRecord"]


class LaunchRecord:
    """A kernel launch kept ready; made by
    [launch_record][numbagraph.launch_record]."""

    __slots__ = ("_kernel", "_grid", "_block", "_stream", "_shared", "_handle", "_args",
                 "_types", "_wrapped", "_fast", "_configured", "_lock")

    def __init__(self, kernel: Any, griddim: Any, blockdim: Any, stream: Any,
                 args: tuple, sharedmem: int):
        if isinstance(sharedmem, bool) or not isinstance(sharedmem, int) or sharedmem < 0:
            raise ValueError(f"sharedmem must be an int >= 0 (bytes), not {sharedmem!r}")
        # numba's kernel[...] takes ints and tuples; a list is read as a tuple.
        griddim = tuple(griddim) if isinstance(griddim, list) else griddim
        blockdim = tuple(blockdim) if isinstance(blockdim, list) else blockdim
        self._handle = _backend.stream_handle(stream)
        for i, arg in enumerate(args):
            _refuse_host(kernel, i, arg)
        stand_ins = tuple(_stand_in(a) for a in args)
        _backend.compile_kernel(kernel, stand_ins)
        self._kernel, self._grid, self._block = kernel, griddim, blockdim
        self._stream, self._shared = stream, sharedmem
        self._types = _backend.argument_types(kernel, stand_ins)
        # Validates the configuration as numba does, once; its normalised
        # dimensions are the ones launched.
        self._configured = kernel[griddim, blockdim, _backend.as_numba_stream(stream),
                                  sharedmem]
        self._grid = getattr(self._configured, "griddim", griddim)
        self._block = getattr(self._configured, "blockdim", blockdim)
        # Held while set_arg replaces the arguments: threads setting
        # arguments of one record take turns, and none is lost.
        self._lock = threading.Lock()
        self._prepare(tuple(args))

    def _prepare(self, args: tuple) -> None:
        """Take ``args`` as the arguments, with their packing made once."""
        wrapped = any(type(a) in _registry.device_wrappers for a in args)
        fast = None if wrapped else _backend.prepared_launch(
            self._kernel, self._grid, self._block, self._shared, self._handle, args)
        # A launch reads _fast, or _args where there is none: each is whole.
        self._wrapped, self._fast, self._args = wrapped, fast, args

    @property
    def args(self) -> tuple:
        """The arguments the next launch passes."""
        return self._args

    def launch(self) -> None:
        """Launch the kernel with the record's arguments, on its stream.

        Raises
        ------
        UncapturableOperationError
            As any launch: one that would break a capture in progress.
        GraphMemoryError
            An argument is graph-owned memory that does not exist now.
        CudaInHostCallbackError
            Launched from inside a host callback.
        """
        fast = self._fast
        if fast is not None and not _sessions and not _graph_memory_held[0] \
                and not _host_attention[0]:
            fast()
            return
        self._configured(*self._args)

    def set_arg(self, index: int, value: Any) -> None:
        """Replace argument ``index`` with ``value`` of the same numba type.

        Raises
        ------
        IndexError
            ``index`` is not an argument's position.
        TypeError
            ``value`` is not of the type the kernel was compiled for at
            ``index`` (say which, and what was given). The record keeps its
            arguments.
        KernelArgumentError
            ``value`` is a host array (NumPy): copy it to the device with
            ``cuda.to_device``. The record keeps its arguments.
        """
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"set_arg takes an argument position (int), not {index!r}")
        if not -len(self._args) <= index < len(self._args):
            raise IndexError(
                f"set_arg({index}): the record has {len(self._args)} arguments")
        index %= len(self._args)
        _refuse_host(self._kernel, index, value)
        expected = self._types[index]
        try:
            given = _backend.argument_types(self._kernel, (_stand_in(value),))[0]
        except TypeError:
            given = None
        if given != expected:
            raise TypeError(
                f"set_arg({index}): the kernel was compiled for {expected} there, and the "
                f"{type(value).__name__} given is {given or 'of no type numba passes'}; pass a "
                "value of the same type (an array of the same dtype, rank and layout), "
                "or make a new record for other types")
        with self._lock:
            args = list(self._args)
            args[index] = value
            self._prepare(tuple(args))

    def __repr__(self) -> str:
        name = getattr(getattr(self._kernel, "py_func", None), "__name__", "kernel")
        return (f"<LaunchRecord {name}[{self._grid}, {self._block}] with "
                f"{len(self._args)} arguments>")


def _refuse_host(kernel: Any, index: int, value: Any) -> None:
    """A record passes the same memory at every launch: a host array, which
    numba would copy to the device and back at each launch (a copy no
    capture records), is refused, naming the fix."""
    if getattr(value, "__cuda_ndarray__", False) or type(value) in _registry.device_wrappers:
        return
    if isinstance(value, (np.ndarray, ArgHint)) or _foreign.on_host(value):
        name = getattr(getattr(kernel, "py_func", kernel), "__name__", "the kernel")
        raise KernelArgumentError(
            f"argument {index} given to {name} is a host array ({type(value).__name__}): "
            "a launch record passes device memory, the same at every launch. Copy it "
            "to the device once (cuda.to_device(a, stream=s)), pass that, and copy "
            "results back with copy_to_host")


def launch_record(kernel: Any, griddim: Any, blockdim: Any, stream: Any, *args: Any,
                  sharedmem: int = 0) -> LaunchRecord:
    """A kernel launch kept ready for a hot loop: ``rec.launch()`` launches
    ``kernel[griddim, blockdim, stream, sharedmem](*args)`` without working
    out the arguments again.

    The kernel is compiled for ``args`` now if it is not yet. Usable at once
    and inside captures (each ``launch()`` is recorded as a launch is).

    Parameters
    ----------
    kernel
        A ``@cuda.jit`` kernel.
    griddim, blockdim
        As in ``kernel[griddim, blockdim]``: an int, or a tuple (or list) of
        up to three ints.
    stream
        The stream it launches on: a numba or cuda.core stream, or any
        object with ``__cuda_stream__``.
    *args
        The kernel's arguments: device arrays, numbers, DeviceScalars,
        Conditions.
    sharedmem
        Bytes of dynamic shared memory.

    Returns
    -------
    LaunchRecord
        ``launch()``, ``set_arg(i, value)``, ``args``.

    Raises
    ------
    TypeError
        ``kernel`` is not a ``@cuda.jit`` kernel, ``stream`` is not a
        stream, or an argument is of no type numba passes to a kernel.
    KernelArgumentError
        An argument is a host array (NumPy), which a record cannot copy to
        the device at each launch: copy it once with ``cuda.to_device``. Or
        the kernel was compiled for explicit signatures and the arguments
        convert to none of them, or to several equally well (a number that
        converts, as a Python int to ``int32``, launches the one numba's
        own launch picks).
    ValueError
        ``sharedmem`` is not a byte count, or the launch configuration is
        one numba refuses.

    Examples
    --------
    ```python
    rec = ng.launch_record(step, 4, 256, s, x, 0.5)
    for t in range(100):
        rec.set_arg(1, 0.5 * t)
        rec.launch()
    ```
    """
    return LaunchRecord(kernel, griddim, blockdim, stream, args, sharedmem)
