"""Typed device scalars: one value in device memory the host changes cheaply.

A kernel captured into a graph bakes in its arguments, so a value that must
change between replays has to live in device memory. ``DeviceScalar`` is that
value: kernels read ``s[0]``, and ``update`` enqueues a small write of it
(a memset, or an 8-byte copy) on the scalar's stream, ordered before the
next replay on that stream.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import warnings
from typing import Any, Callable

import numpy as np
from numba import cuda, types
from numba.cuda.np.numpy_support import from_dtype

from . import _hostcalls, _registry
from ._hostcalls import attention as _host_attention
from ._registry import LEGACY_DEFAULT_HANDLES, register_device_wrapper
from ._registry import sessions as _sessions
from .backend import active as _backend
from .errors import CaptureWarning, ScalarValueError
from .safety import (
    guard_allocation, guard_device_to_host, guard_host_to_device, guard_host_wait,
    guard_legacy_work, on_launch, refuse_other_device,
)

__all__ = ["DeviceScalar", "HostScalar", "SCALAR_DTYPES"]

SCALAR_DTYPES = tuple(
    np.dtype(t)
    for t in (
        np.bool_, np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64,
        np.float16, np.float32, np.float64,
    )
)


def _infer_dtype(value: Any) -> np.dtype:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.dtype
    if isinstance(value, bool):
        return np.dtype(np.bool_)
    if isinstance(value, int):
        return np.dtype(np.int64)
    if isinstance(value, float):
        return np.dtype(np.float64)
    raise TypeError(
        f"cannot infer a DeviceScalar dtype from {type(value).__name__}; "
        "pass dtype= (one of bool, int8..int64, uint8..uint64, float16..float64)"
    )


# NumPy's time types are integers to isinstance, but not numbers to store.
_NOT_NUMBERS = (np.timedelta64, np.datetime64)


def _checker(dtype: np.dtype) -> Callable[[Any], Any]:
    """A function that validates a Python value for ``dtype`` and returns it
    in a form numpy stores exactly."""
    if dtype.kind == "b":
        def check(value):
            if isinstance(value, (bool, np.bool_)) or value in (0, 1):
                if isinstance(value, float) and math.isnan(value):
                    raise ScalarValueError("NaN is not a bool")
                return bool(value)
            raise ScalarValueError(
                f"{value!r} is not a bool; a bool scalar takes True/False or 0/1"
            )
        return check

    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = int(info.min), int(info.max)

        def check(value):
            if type(value) is int and lo <= value <= hi:
                return value  # the common case, kept short for replay loops
            if isinstance(value, (float, np.floating)):
                if not math.isfinite(value) or value != math.floor(value):
                    raise ScalarValueError(
                        f"{value!r} is not an integer, so it cannot be stored in "
                        f"{dtype.name}; round it first if that is what you mean"
                    )
            elif not isinstance(value, (int, np.integer)) or isinstance(value, _NOT_NUMBERS):
                raise ScalarValueError(
                    f"{type(value).__name__} {value!r} cannot be stored in {dtype.name}"
                )
            ivalue = int(value)
            if not lo <= ivalue <= hi:
                raise ScalarValueError(
                    f"{value!r} does not fit {dtype.name} (range {lo}..{hi}); "
                    "use a wider dtype"
                )
            return ivalue
        return check

    finfo = np.finfo(dtype)
    big = float(finfo.max)

    def check(value):
        if type(value) is float and -big <= value <= big:
            return value  # the common case, kept short for replay loops
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(
            value, (bool, *_NOT_NUMBERS)
        ):
            raise ScalarValueError(
                f"{type(value).__name__} {value!r} cannot be stored in {dtype.name}"
            )
        try:
            fvalue = float(value)
        except OverflowError:
            fvalue = math.inf  # an int beyond any float: reported below
        if not math.isfinite(fvalue) and isinstance(value, (int, np.integer)) \
                or math.isfinite(fvalue) and abs(fvalue) > big:
            raise ScalarValueError(
                f"{value!r} overflows {dtype.name} (largest {big:g}); "
                "use a wider dtype"
            )
        return fvalue
    return check


class DeviceScalar:
    """One typed value in device memory, updated from the host between replays.

    Pass the scalar itself to a kernel (it has ``__cuda_array_interface__``,
    shape ``(1,)``) and read ``s[0]`` there. ``update`` is ordered on the
    scalar's stream: work enqueued on that stream afterwards, graph replays
    included, sees the new value; updates are never lost or reordered.

    Inside a capture on the scalar's stream, ``update`` is recorded instead:
    every replay then sets the scalar to that value at that point.

    Parameters
    ----------
    value
        The initial value.
    dtype
        bool, int8..int64, uint8..uint64, float16, float32 or float64
        ([SCALAR_DTYPES][numbagraph.SCALAR_DTYPES]); inferred from ``value``
        when omitted: a Python int makes an int64, a float a float64, a bool
        a bool, a NumPy scalar keeps its dtype. So ``DeviceScalar(0)`` and
        ``DeviceScalar(0.5)`` are 64-bit, and an 8-byte scalar's ``update``
        is a slower driver call than the memset that sets one of up to 4
        bytes (2.65 µs against 1.33 on an H200, as the benchmarks measured):
        pass ``dtype=np.int32`` or ``np.float32`` where 32 bits hold the
        value.
    stream
        The stream updates are ordered on, which cannot change; the default
        stream if omitted. A scalar updated inside a capture on ``s`` is made
        with ``stream=s``. The value lives on that stream's device
        ([device][numbagraph.DeviceScalar.device]), whichever device is
        current; ``update`` and ``value`` work from any current device.
    name
        What to call the scalar where a graph's nodes are described
        ([CapturedGraph.nodes][numbagraph.CapturedGraph.nodes],
        ``summary()``, ``to_dot()``); unnamed if omitted.

    Raises
    ------
    TypeError
        ``dtype`` is omitted and cannot be inferred from ``value``,
        ``stream`` is not a stream, or ``name`` is not a str.
    ScalarValueError
        ``dtype`` is not one of [SCALAR_DTYPES][numbagraph.SCALAR_DTYPES],
        or ``value`` does not fit it.
    AllocationInCaptureError
        A capture forbids this thread to allocate now: make the scalar
        before the capture begins.
    HostCopyInCaptureError
        ``stream`` captures, so the first value could not be copied to the
        device.
    CudaInHostCallbackError
        Made inside a host callback.

    Examples
    --------
    ```python
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=s)
    for t in range(n_tokens):
        pos.update(t)
        graph.launch()
    ```
    """

    __slots__ = (
        "_dtype", "_check", "_dev", "_stream", "_handle", "_store", "_name", "_device",
        "_stream_given", "__weakref__",
    )

    def __init__(self, value: Any, dtype: Any = None, *, stream: Any = None,
                 name: str | None = None):
        if _host_attention[0]:
            _hostcalls.refuse_here("ng.DeviceScalar()")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a DeviceScalar's name is a str, not {type(name).__name__}")
        self._name = name
        dtype = _infer_dtype(value) if dtype is None else np.dtype(dtype)
        if dtype not in SCALAR_DTYPES:
            raise ScalarValueError(
                f"DeviceScalar does not support dtype {dtype}; use one of "
                + ", ".join(d.name for d in SCALAR_DTYPES)
            )
        self._dtype = dtype
        self._check = _checker(dtype)
        self._stream = cuda.default_stream() if stream is None else stream
        self._stream_given = stream is not None
        self._handle = _backend.stream_handle(self._stream)
        initial = np.array([self._check(value)], dtype)
        if _sessions:
            guard_allocation("ng.DeviceScalar()", self._handle)
            guard_host_to_device(
                "ng.DeviceScalar() on a capturing stream (it copies its first value "
                "to the device)", self._handle,
                "create the DeviceScalar before the capture begins, then record "
                "the value it must have at each replay with scalar.update(value) "
                "inside the capture")
        self._device = _backend.stream_device_id(self._stream)
        with _on_device(self._device):
            self._dev = cuda.to_device(initial, stream=_backend.as_numba_stream(self._stream))
            self._store = _backend.scalar_store(self._dev, dtype, self._handle)

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the value."""
        return self._dtype

    @property
    def stream(self) -> Any:
        """The stream updates are ordered on."""
        return self._stream

    @property
    def name(self) -> str | None:
        """The name given when the scalar was made, or None."""
        return self._name

    @property
    def device(self) -> int:
        """The ordinal of the device the value lives on: its stream's."""
        return self._device

    def update(self, value: Any) -> None:
        """Set the device value, ordered on the scalar's stream.

        Parameters
        ----------
        value
            The new value, a Python or NumPy number that fits the dtype.

        Raises
        ------
        ScalarValueError
            Leaving the device value unchanged, when ``value`` does not fit
            the dtype.
        ForeignStreamInCaptureError
            The scalar's stream is the legacy default stream while a stream
            captures.
        CudaInHostCallbackError
            Called from inside a host callback.

        Warns
        -----
        CaptureWarning
            The update ran at once, on the scalar's stream, while this
            thread captures on another stream: the graph does not hold it.

        Examples
        --------
        ```python
        pos.update(t)
        graph.launch()      # reads t
        ```
        """
        value = self._check(value)
        if _host_attention[0]:
            _hostcalls.refuse_here("DeviceScalar.update()")
        if not _sessions:
            self._store(value)
            return
        session = _registry.on(self._handle)
        if session is None:
            if self._handle in LEGACY_DEFAULT_HANDLES:
                guard_legacy_work(
                    self._handle, "DeviceScalar.update() on the legacy default stream",
                    self._make_it_on())
            self._store(value)
            self._warn_if_meant_for_a_capture(f"DeviceScalar.update({value!r})", self._stream,
                                              takes_stream=False)
        else:
            session.keep(self)
            _backend.scalar_store_recorded(self._dev, value, self._dtype, self._handle)

    @property
    def value(self) -> Any:
        """The device value, read back after the stream's pending work.

        Raises
        ------
        HostCopyInCaptureError
            The scalar's stream captures, so nothing would be read now.
        SyncInCaptureError
            A capture forbids blocking the host on this thread.
        HostCallbackError
            A host callback ([on_host][numbagraph.on_host]) raised since the
            last report (raised once the value is read).
        CudaInHostCallbackError
            Read inside a host callback (a HostScalar is what a callback
            reads).
        """
        if _host_attention[0]:
            _hostcalls.refuse_here("DeviceScalar.value")
        # Checked and read as one call that a "global" capture forbids.
        with _registry.unsafe_call:
            if _sessions:
                guard_device_to_host(
                    "DeviceScalar.value", self._handle,
                    "read scalar.value after the graph has run, or record "
                    "scalar.update(value) in the capture to set it")
                guard_host_wait(self._handle, "DeviceScalar.value")
            with _on_device(self._device):
                host = self._dev.copy_to_host(stream=_backend.as_numba_stream(self._stream))
                _backend.synchronize(self._handle)
        if _host_attention[0]:
            _hostcalls.report("DeviceScalar.value")
        return host[0].item()

    def _warn_if_meant_for_a_capture(self, operation: str, stream: Any, *,
                                     takes_stream: bool = True) -> None:
        """``operation`` on the scalar ran at once on ``stream`` while this
        thread captures on another stream: the graph being captured does not
        hold it. ``takes_stream``: the operation has a ``stream=`` of its
        own (an update has none: it runs on the scalar's stream)."""
        me = threading.current_thread()
        mine = [s for s in _registry.active() if s.thread is me]
        if not mine:
            return
        capturing = repr(mine[0].stream)
        call = "pass stream=s to this call, or " if takes_stream else ""
        warnings.warn(
            f"{operation} ran at once on {stream!r} and is not recorded into the "
            f"capture on {capturing} that this thread is making: replays of that "
            f"graph will not do it. To record it, {call}{self._make_it_on(capturing)}. "
            "To run it at once, do it outside the capture",
            CaptureWarning, stacklevel=3,
        )

    def _make_it_on(self, capturing: str = "") -> str:
        """How to have the scalar's updates recorded by a capture on another
        stream than its own: make it again, on that stream."""
        made = ("this one was made without stream=, so its stream is the default "
                "stream" if not self._stream_given
                else f"this one was made with stream={self._stream!r}")
        return (
            f"make the scalar with stream=s, s being the capturing stream"
            f"{' ' + capturing if capturing else ''}: ng.DeviceScalar(..., "
            f"dtype=np.{self._dtype.name}, stream=s), before the capture begins. A "
            f"DeviceScalar's updates run on the stream it was made with, which cannot "
            f"change, and {made}")

    def read_async(self, into: "HostScalar", *, stream: Any = None) -> None:
        """Copy the device value into ``into``, pinned host memory, in stream
        order, without waiting for it: one thread of a kernel stores it into
        that memory, mapped into the device's (a kernel node in a graph,
        cheaper to replay than a copy node).

        Inside a capture on ``stream`` the copy is recorded: every launch of
        the graph (every pass of a loop, if recorded in its body) writes the
        value there, and the host reads ``into.value`` when it likes, with
        no synchronisation; the value read is the latest the GPU has written.
        The copy is ordered after the scalar's updates only on the scalar's
        own stream (the default). Run at once, it needs ``into`` kept alive
        until it has run.

        Parameters
        ----------
        into
            A [HostScalar][numbagraph.HostScalar] of the same dtype.
        stream
            The stream to copy (or record the copy) on; the scalar's by default.

        Raises
        ------
        TypeError
            ``into`` is not a HostScalar, or ``stream`` is not a stream.
        ScalarValueError
            ``into`` has another dtype.
        ForeignStreamInCaptureError
            ``stream`` is the legacy default stream while a stream captures.
        CudaInHostCallbackError
            Called from inside a host callback.

        Examples
        --------
        ```python
        seen = ng.HostScalar(np.int32)
        with ng.capture(s) as cap:
            with ng.repeat(pos, until=1000):
                step[1, 32, s](x, pos)
                pos.read_async(seen)      # progress, visible to the host
        ```
        """
        if not isinstance(into, HostScalar):
            raise TypeError(f"read_async() copies into a HostScalar, not {type(into).__name__}")
        if into.dtype != self._dtype:
            raise ScalarValueError(
                f"read_async(): the HostScalar holds {into.dtype.name}, the DeviceScalar "
                f"{self._dtype.name}; make a HostScalar of {self._dtype.name}")
        handle = self._handle if stream is None else _backend.stream_handle(stream)
        if _host_attention[0]:
            _hostcalls.refuse_here("DeviceScalar.read_async()")
        session = _registry.on(handle) if _sessions else None
        if _sessions:
            if session is None:
                guard_legacy_work(handle, "DeviceScalar.read_async() on the legacy default stream")
            else:
                _registry.raise_if_invalidated(session)
                refuse_other_device(self, session, "DeviceScalar.read_async()")
                session.keep((self, into))
        _backend.launch(into._kernel, 1, 1, handle, (into._device, self._dev), on_launch)
        if _sessions and session is None:
            self._warn_if_meant_for_a_capture(
                "DeviceScalar.read_async()", self._stream if stream is None else stream)

    def inner(self):
        """The numba device array behind the scalar, shape ``(1,)``."""
        return self._dev

    @property
    def __cuda_array_interface__(self) -> dict:
        return _backend.array_interface(self._dev)

    def __repr__(self) -> str:
        named = "" if self._name is None else f"name={self._name!r}, "
        return f"DeviceScalar({named}dtype={self._dtype.name}, stream={self._stream!r})"


register_device_wrapper(DeviceScalar, DeviceScalar.inner)


def _on_device(device: int) -> Any:
    """A block with ``device`` current: the scalar's memory is allocated,
    and read back, on its own device whichever device is current."""
    if _backend.device_count() < 2 or _backend.current_device_id() == device:
        return contextlib.nullcontext()
    return _backend.use_device(device)


@functools.cache
def _read_back(dtype: np.dtype) -> Any:
    """read_async's kernel for ``dtype``: one thread stores the device value
    into the HostScalar's mapped memory, in one store, which the host never
    sees half made."""
    array = from_dtype(dtype)[::1]

    @cuda.jit(types.void(array, array))
    def read_back(into: Any, value: Any) -> None:
        into[0] = value[0]

    return read_back


class HostScalar:
    """One value in pinned host memory, written by the GPU in stream order
    ([DeviceScalar.read_async][numbagraph.DeviceScalar.read_async]) and read
    by the host without synchronising: a replay loop, or a loop running on
    the GPU, shows its progress (a counter, a residual) as it goes.

    Made outside a capture (it allocates pinned memory), starting at zero.

    Parameters
    ----------
    dtype
        Any dtype a DeviceScalar takes.

    Raises
    ------
    ScalarValueError
        ``dtype`` is not one a DeviceScalar takes.
    AllocationInCaptureError
        Made where a capture forbids allocating.
    CudaInHostCallbackError
        Made inside a host callback (it allocates pinned memory).

    Examples
    --------
    ```python
    seen = ng.HostScalar(np.float32)
    residual.read_async(seen)
    print(seen.value)        # whatever the GPU has written so far
    ```
    """

    __slots__ = ("_host", "_device", "_kernel", "_dtype")

    def __init__(self, dtype: Any = np.float64):
        if _host_attention[0]:
            _hostcalls.refuse_here("ng.HostScalar()")
        dtype = np.dtype(dtype)
        if dtype not in SCALAR_DTYPES:
            raise ScalarValueError(
                f"HostScalar does not support dtype {dtype}; use one of "
                + ", ".join(d.name for d in SCALAR_DTYPES))
        if _sessions:
            guard_allocation("ng.HostScalar() (pinned memory)")
        self._host = _backend.mapped_host_array(1, dtype)
        self._host[0] = 0
        # The device's view of the same memory, which read_async's kernel
        # (compiled here, where a capture is not running) stores into.
        self._device = _backend.mapped_device_view(self._host)
        self._kernel = _read_back(dtype)
        self._dtype = dtype

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the value."""
        return self._dtype

    @property
    def value(self) -> Any:
        """The value the GPU wrote last (zero before any), read at once."""
        return self._host[0].item()

    def __repr__(self) -> str:
        return f"HostScalar(dtype={self._dtype.name}, value={self.value!r})"
