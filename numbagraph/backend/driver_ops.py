"""What numbagraph.ops needs from the CUDA driver: device views of foreign
arrays, the device's size for launch grids, zero fills and device copies;
which device a stream, an array or an address belongs to; the math and
conversions op kernels compile."""

from __future__ import annotations

import functools
import math
import weakref
from typing import Any

import numpy as np

from cuda.bindings import driver as cu
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic
from numba.cuda.cudadrv.devicearray import is_cuda_ndarray
from numba.cuda.cudadrv import devicearray as _devicearray

from ..errors import OpError
from ._streams import NAMED_HANDLES, stream_handle
from .driver_base import check, raise_for
from .driver_divert import diverted as _diverted, take as _take

THREADS_PER_BLOCK = 256

# Libraries' own kernels (cuBLAS) run on these streams and are captured with
# them.
LIBRARY_KERNELS = True


def as_device_array(obj: Any) -> Any:
    """``obj`` as a numba device array, or None if it is not device memory.

    Foreign arrays (CuPy, PyTorch, anything with ``__cuda_array_interface__``)
    become views without synchronising the stream they name: inside a capture
    that synchronisation would end it.
    """
    if is_cuda_ndarray(obj):
        return obj
    try:
        described = getattr(obj, "__cuda_array_interface__", None)
    except (TypeError, KeyError, ValueError, NotImplementedError):
        # A dtype the interface cannot name (PyTorch's bfloat16 has no
        # typestr): DLPack names it.
        if getattr(obj, "__dlpack__", None) is None:
            raise
        make = _from_dlpack
    else:
        if described is None:
            return None
        typestr = described.get("typestr") if isinstance(described, dict) else None
        # Raw bytes to the interface (bfloat16, as CuPy exports it): DLPack
        # names the dtype.
        raw = isinstance(typestr, str) and typestr[1:2] == "V"
        make = _from_dlpack if raw and getattr(obj, "__dlpack__", None) is not None \
            else _from_interface
    dev = make(obj)
    if dev is None:
        return None
    _check_memory(dev, obj)
    if device_count() > 1 and dev.size:
        # numba makes the view in the current context; memory of another
        # device gets a view made in that device's, so that the view
        # names the device it is on (array_device_id).
        ordinal = pointer_device_id(dev.device_ctypes_pointer.value)
        if ordinal != array_device_id(dev):
            with use_device(ordinal):
                dev = make(obj)
    return dev


def _from_interface(obj: Any) -> Any:
    """A numba view of ``obj`` through ``__cuda_array_interface__``, without
    synchronising the stream it names."""
    return cuda.as_cuda_array(obj, sync=False)


def _from_dlpack(obj: Any) -> Any:
    """A numba view of ``obj`` read through ``__dlpack__`` with no stream
    ordering (as ``sync=False`` does for the array interface), or None for
    host memory. A dtype NumPy cannot name is an OpError."""
    name = type(obj).__name__
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError as exc:
        raise OpError(
            f"a {name} has a dtype the CUDA array interface cannot name, and reading it "
            f"through DLPack needs cuda-core's StridedMemoryView ({exc}); "
            "`pip install -U cuda-core`") from None
    try:
        view = StridedMemoryView.from_dlpack(obj, stream_ptr=-1)
        dtype = view.dtype
    except NotImplementedError as exc:
        raise OpError(
            f"a {name}'s dtype has no NumPy dtype here ({exc}); bfloat16 arrays need "
            "ml_dtypes: `pip install -e \".[bfloat16]\"` from numbagraph's repository "
            "root") from None
    except Exception as exc:  # noqa: BLE001  the exporter's own error says why
        raise OpError(
            f"a {name} has a dtype the CUDA array interface cannot name, and its "
            f"__dlpack__ export failed ({type(exc).__name__}: {exc})") from None
    if not view.is_device_accessible or view.device_id < 0:
        return None
    strides = view.strides
    described = {
        "shape": tuple(view.shape),
        "strides": None if strides is None else tuple(s * dtype.itemsize for s in strides),
        "typestr": dtype,
        "data": (view.ptr, view.readonly),
        "version": 3,
    }
    return cuda.from_cuda_array_interface(described, owner=obj, sync=False)


_MEMORY_TYPE = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
_RANGE_START = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
_RANGE_SIZE = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE


def _check_memory(dev: Any, obj: Any) -> None:
    """Refuse a foreign array whose pointer is not memory CUDA knows, or
    whose extent runs past its allocation: a kernel given it would fault
    with an illegal address, which ends the process's CUDA context."""
    if dev.size == 0:
        return
    # The bytes the elements span, from the lowest to the highest: strides
    # of 0 (broadcasts) and below 0 read less, or before the pointer.
    low = high = 0
    for extent, stride in zip(dev.shape, dev.strides):
        if stride > 0:
            high += (extent - 1) * stride
        else:
            low += (extent - 1) * stride
    nbytes = high - low + dev.dtype.itemsize
    base = dev.device_ctypes_pointer.value or 0
    ptr = base + low
    name = type(obj).__name__
    if not base:
        raise OpError(
            f"a {name}'s __cuda_array_interface__ gives a NULL data pointer for "
            f"{nbytes} bytes; pass an array whose memory is allocated"
        )
    err, _kind = cu.cuPointerGetAttribute(_MEMORY_TYPE, ptr)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise OpError(
            f"a {name}'s __cuda_array_interface__ gives the pointer {ptr:#x}, "
            "which is not memory CUDA knows (not device, managed or registered "
            "host memory); pass a device array"
        )
    err_start, start = cu.cuPointerGetAttribute(_RANGE_START, ptr)
    err_size, size = cu.cuPointerGetAttribute(_RANGE_SIZE, ptr)
    if err_start == err_size == cu.CUresult.CUDA_SUCCESS and int(size):
        end = int(start) + int(size)
        if ptr + nbytes > end:
            raise OpError(
                f"a {name}'s __cuda_array_interface__ describes {nbytes} bytes "
                f"from {ptr:#x}, past the end of its allocation at {end:#x} "
                f"({ptr + nbytes - end} bytes over): its shape or strides do not "
                "match its memory"
            )


# ------------------------------------------------------------ 128-bit loads and stores

# numba loads and stores one element at a time; four float32 in one
# instruction halve the instructions a bandwidth-bound kernel issues, and
# keep four times the bytes in flight per load.
_FLOAT4 = ir.VectorType(ir.FloatType(), 4)
_LANE = [ir.Constant(ir.IntType(32), e) for e in range(4)]


def _float4_pointer(context: Any, builder: Any, array_type: Any, array: Any, index: Any,
                    index_type: Any) -> Any:
    data = context.make_array(array_type)(context, builder, array).data
    at = context.cast(builder, index, index_type, types.int64)
    return builder.bitcast(builder.gep(data, [at]), ir.PointerType(_FLOAT4))


@intrinsic
def load4(typingctx: Any, a: Any, i: Any) -> Any:
    """``(a[i], a[i+1], a[i+2], a[i+3])`` of a float32 array in one 128-bit
    load; ``a[i]`` must lie at a multiple of 16 bytes."""
    signature = types.UniTuple(types.float32, 4)(a, i)

    def codegen(context, builder, sig, args):
        pointer = _float4_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        loaded = builder.load(pointer, align=16)
        return context.make_tuple(builder, sig.return_type,
                                  [builder.extract_element(loaded, e) for e in _LANE])

    return signature, codegen


@intrinsic
def store4(typingctx: Any, a: Any, i: Any, v0: Any, v1: Any, v2: Any, v3: Any) -> Any:
    """``a[i:i+4] = v0, v1, v2, v3`` of a float32 array in one 128-bit store;
    ``a[i]`` must lie at a multiple of 16 bytes."""
    signature = types.void(a, i, v0, v1, v2, v3)

    def codegen(context, builder, sig, args):
        pointer = _float4_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        packed = ir.Constant(_FLOAT4, ir.Undefined)
        for e, (value, kind) in enumerate(zip(args[2:], sig.args[2:])):
            packed = builder.insert_element(
                packed, context.cast(builder, value, kind, types.float32), _LANE[e])
        builder.store(packed, pointer, align=16)
        return context.get_dummy_value()

    return signature, codegen


# ------------------------------------------------------------ math and conversions

# numba compiles Python's math functions to the device's own (libdevice), and
# a store converts with numba's cast (fptosi and kin, which NVVM lowers to
# cvt): both already give the device's results, so op kernels compile as
# they would without this seam.
device_math = math


@cuda.jit(device=True, inline="always")
def _as_stored(value):
    return value


def convert(dtype: np.dtype) -> Any:
    """The value itself, for any ``dtype``: the store into the array
    converts it, with numba's cast."""
    return _as_stored


def device_memory_used() -> int:
    """Total minus free memory of the current device (cuMemGetInfo), made
    current if no context is."""
    cuda.current_context()
    free, total = check("cuMemGetInfo", cu.cuMemGetInfo())
    return int(total) - int(free)


def current_device_id() -> int:
    """The ordinal of the calling thread's current device (its context's
    device; numba's current device when no context is current yet)."""
    err, device = cu.cuCtxGetDevice()
    if err != cu.CUresult.CUDA_SUCCESS:
        return cuda.get_current_device().id
    return int(device)


_multiprocessors: dict[int, int] = {}


def launch_limits() -> tuple[int, int]:
    """(multiprocessors of the current device, threads per block) to size
    ops' grids from."""
    device_id = current_device_id()
    count = _multiprocessors.get(device_id)
    if count is None:
        count = _multiprocessors[device_id] = int(
            cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return count, THREADS_PER_BLOCK


def memset_zero(dev: Any, handle: int) -> None:
    """Enqueue "set every byte of ``dev`` to zero" on the stream."""
    nbytes = dev.size * dev.dtype.itemsize
    if nbytes == 0:
        return
    ptr = dev.device_ctypes_pointer.value
    if _diverted and _take(handle, ("fill", ptr, 0, nbytes)):
        return
    err, = cu.cuMemsetD8Async(ptr, 0, nbytes, handle)
    raise_for("cuMemsetD8Async", err)


def copy_device(dst: Any, src: Any, handle: int) -> None:
    """Enqueue "copy ``src`` into ``dst``" (device arrays of one size and
    dtype) on the stream: the driver's own copy, a memcpy node in a capture."""
    nbytes = dst.size * dst.dtype.itemsize
    if nbytes == 0:
        return
    target, source = dst.device_ctypes_pointer.value, src.device_ctypes_pointer.value
    if _diverted and _take(handle, ("copy", target, source, nbytes)):
        return
    err, = cu.cuMemcpyDtoDAsync(target, source, nbytes, handle)
    raise_for("cuMemcpyDtoDAsync", err)


def copy_to_host_async(host: np.ndarray, dev: Any, handle: int) -> None:
    """Copy ``dev`` into ``host``, pinned memory, on the stream, without
    waiting (a copy node while the stream captures)."""
    source = dev.device_ctypes_pointer.value
    if _diverted and _take(handle, ("to host", host.ctypes.data, source, host.nbytes)):
        return
    err, = cu.cuMemcpyDtoHAsync(host.ctypes.data, source, host.nbytes, handle)
    raise_for("cuMemcpyDtoHAsync", err)


def pinned_host_array(obj: Any) -> np.ndarray | None:
    """``obj`` (as a plain NumPy array: numba's mapped arrays are device
    arrays too) when it is a contiguous NumPy array whose first and last
    bytes lie in memory ``cuMemHostAlloc`` made, which ``cuMemHostGetFlags``
    answers for, and refuses for pageable memory and memory
    ``cuMemHostRegister`` pinned for a while; else None."""
    if not isinstance(obj, np.ndarray) or not _numba_page_locked(obj):
        return None
    host = obj if type(obj) is np.ndarray else np.ndarray.view(obj, np.ndarray)
    if not host.nbytes or not (host.flags.c_contiguous or host.flags.f_contiguous):
        return None
    start = host.ctypes.data
    for address in (start, start + host.nbytes - 1):
        err, _ = cu.cuMemHostGetFlags(address)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
    return host


def _numba_page_locked(obj: Any) -> bool:
    """Whether ``obj``'s memory is owned by numba's page-locked allocation
    (``cuda.pinned_array``, ``cuda.mapped_array`` and views of them): the
    driver answers ``cuMemHostGetFlags`` for memory ``cuda.pinned`` registers
    for a block too, which a graph would outlive."""
    from numba.cuda.cudadrv.driver import MappedMemory, PinnedMemory

    if isinstance(obj, _devicearray.MappedNDArray):
        return True  # cuda.mapped_array's own type: always page-locked by numba
    owner = obj
    for _ in range(8):
        if isinstance(owner, (PinnedMemory, MappedMemory)):
            return True
        inner = getattr(owner, "obj", None) if isinstance(owner, memoryview) else None
        owner = inner if inner is not None else getattr(owner, "base", None)
        if owner is None:
            return False
    return False


def mapped_host_array(size: int, dtype: np.dtype) -> np.ndarray:
    """Page-locked host memory mapped into the address space of every
    device (portable: a kernel on any device may store into it)."""
    return cuda.mapped_array(size, dtype, portable=True)


def mapped_device_view(host: Any) -> Any:
    """A plain device array over a mapped array's memory, which kernels are
    given as any device array."""
    return _devicearray.from_array_like(host, gpu_data=host.gpu_data)


# ---------------------------------------------------------------- devices

@functools.cache
def device_count() -> int:
    """How many devices the process may use; fixed once CUDA is initialised."""
    return len(cuda.gpus)


# stream object -> the ordinal of its device: a stream never changes device,
# and an entry goes with its stream, so a later stream at the same address
# is asked again.
_stream_devices: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def stream_device_id(stream: Any) -> int:
    """The ordinal of the device ``stream`` belongs to (asked of the driver
    once per stream object); the named default streams belong to the
    current device. With one device nothing is asked or kept: every stream
    is on device 0."""
    if device_count() == 1:
        return 0
    if not isinstance(stream, int):
        try:
            return _stream_devices[stream]
        except (KeyError, TypeError):
            pass
    handle = stream_handle(stream)
    if handle in NAMED_HANDLES:
        return current_device_id()
    ctx = check("cuStreamGetCtx", cu.cuStreamGetCtx(handle))
    err, current = cu.cuCtxGetCurrent()
    if not err and int(current) == int(ctx):
        device = current_device_id()
    else:
        check("cuCtxPushCurrent", cu.cuCtxPushCurrent(ctx))
        try:
            device = int(check("cuCtxGetDevice", cu.cuCtxGetDevice()))
        finally:
            cu.cuCtxPopCurrent()
    if not isinstance(stream, int):
        try:
            _stream_devices[stream] = device
        except TypeError:
            pass  # an object that takes no weak reference is asked each time
    return device


def array_device_id(dev: Any) -> int | None:
    """The ordinal of the device whose context numba allocated ``dev`` in
    (a foreign array's view names the device current when it was made), or
    None for anything but a numba device array."""
    context = getattr(getattr(dev, "gpu_data", None), "context", None)
    device = getattr(context, "device", None)
    return None if device is None else int(device.id)


_DEVICE_ORDINAL = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL


def pointer_device_id(pointer: int) -> int:
    """The ordinal the driver gives the device of the memory at ``pointer``
    (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)."""
    return int(check("cuPointerGetAttribute", cu.cuPointerGetAttribute(_DEVICE_ORDINAL, pointer)))


def use_device(ordinal: int) -> Any:
    """numba's own ``cuda.gpus[ordinal]``: the device's primary context made
    current for the block."""
    return cuda.gpus[ordinal]
