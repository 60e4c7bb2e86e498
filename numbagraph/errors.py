"""The exceptions numbagraph raises.

Everything derives from :class:`NumbagraphError`, so ``except
ng.NumbagraphError`` catches any of them. Each also derives from the builtin
exception a Python user would expect (``ValueError`` for a bad value,
``RuntimeError`` for a bad state), so existing handlers keep working.
"""

from __future__ import annotations

import re

__all__ = [
    "NumbagraphError",
    "CaptureError",
    "CaptureStateError",
    "CaptureInvalidatedError",
    "UncapturableOperationError",
    "AllocationInCaptureError",
    "HostArrayInCaptureError",
    "HostCopyInCaptureError",
    "SyncInCaptureError",
    "ForeignStreamInCaptureError",
    "GraphClosedError",
    "ScalarValueError",
    "OpError",
    "ConditionalError",
    "DeviceNodeError",
    "RebindError",
    "GraphedError",
    "DistError",
    "GraphMemoryError",
    "StaleOutputError",
    "HostCallbackError",
    "CudaInHostCallbackError",
    "DeviceMismatchError",
    "KernelArgumentError",
    "NumbagraphWarning",
    "CaptureWarning",
    "GraphedWarning",
]


class NumbagraphError(Exception):
    """Base class of every numbagraph error."""


class CaptureError(NumbagraphError, RuntimeError):
    """A capture was started, ended or used in a way CUDA does not allow.

    The message names the operation, why it cannot be captured, and what to
    do instead. When numbagraph raises it, the capture has been ended and the
    stream is usable again.
    """


class CaptureStateError(CaptureError):
    """A capture was begun or ended in the wrong state: on a stream that
    already captures, on the legacy default stream, on a stream that does not
    capture, or from a thread that did not begin it."""


class CaptureInvalidatedError(CaptureError):
    """The capture was ended earlier, when an operation that cannot be
    captured was refused; its graph was discarded. Raised by ``end_capture``
    (or the end of the ``with`` block) and by further work on the stream."""


class UncapturableOperationError(CaptureError):
    """An operation that a CUDA graph cannot record was attempted while a
    capture was active. The operation did not run; the capture it would have
    broken was ended and its graph discarded."""


class AllocationInCaptureError(UncapturableOperationError):
    """Device, pinned or mapped memory was to be allocated where a capture
    forbids it (by numba, ``ng.empty`` and its kin, or any other numba
    allocator): refused before anything was allocated."""


class HostArrayInCaptureError(UncapturableOperationError):
    """A host (NumPy) array was passed to a kernel during a capture."""


class HostCopyInCaptureError(UncapturableOperationError):
    """A copy between host and device was enqueued on a capturing stream, or
    on the legacy default stream while a capture was active."""


class SyncInCaptureError(UncapturableOperationError):
    """The host waited on a capturing stream, on the device, or on an event
    recorded inside a capture."""


class ForeignStreamInCaptureError(UncapturableOperationError):
    """Work on another stream would have joined the capture: the legacy
    default stream (which waits on every blocking stream), or a stream made
    to wait on an event recorded inside the capture."""


class GraphClosedError(NumbagraphError, RuntimeError):
    """A graph was used after
    [CapturedGraph.close][numbagraph.CapturedGraph.close]."""


class ScalarValueError(NumbagraphError, ValueError):
    """A value does not fit a [DeviceScalar][numbagraph.DeviceScalar]'s dtype.

    The device value is left unchanged.
    """


class OpError(NumbagraphError, ValueError, TypeError):
    """A [numbagraph.ops][] call was given operands it cannot take: a
    shape, dtype or layout that does not fit, a host array, a bad stream.

    Raised in Python before anything is launched or recorded, so a wrong call
    inside a capture leaves the capture as it was. It is both a ``ValueError``
    and a ``TypeError``, so either handler catches it.
    """


class ConditionalError(NumbagraphError, RuntimeError):
    """A condition or conditional block was used in a way CUDA graphs do not
    allow, or the CUDA in use has no conditional nodes.

    Raised as a condition is made, a block opens or a kernel is launched, it
    leaves the capture as it was: nothing was recorded. Raised as a block or
    the capture ends, the capture is discarded.
    """


class DeviceNodeError(NumbagraphError, RuntimeError):
    """A [DeviceNode][numbagraph.DeviceNode] was made or attached where CUDA
    cannot update a kernel node from the GPU, or a graph holding one was
    used as CUDA forbids for such a graph: updated from or into another
    graph ([CapturedGraph.update][numbagraph.CapturedGraph.update]), or
    recorded into another capture as a child graph.

    Raised as a node is made or its block opens, or by a graph's call, it
    changes nothing and the capture goes on. Raised as the block ends, the
    kernels launched in it stay recorded as ordinary kernel nodes and the
    capture goes on; raised as the capture ends, the capture is discarded.
    """


class RebindError(NumbagraphError, ValueError):
    """[CapturedGraph.rebind][numbagraph.CapturedGraph.rebind] was given
    arrays it cannot rebind: one the graph does not use, a layout (shape,
    dtype, strides) other than the old array's, or old arrays that overlap.
    The graph is left unchanged."""


class GraphedError(NumbagraphError, TypeError):
    """A [graphed][numbagraph.graphed.graphed] function was called or written in a way
    it cannot replay: an argument that cannot be part of a signature (not
    hashable), or a return value that is not one of its array arguments."""


class DistError(NumbagraphError, ValueError, RuntimeError):
    """A collective ([numbagraph.dist][]) cannot run as asked: NCCL (the
    ``nccl4py`` extra) is missing or refused, the launcher's environment
    does not say how to reach the other ranks, the communicator is closed
    or still used by a graph, or a collective's operands do not fit (a
    dtype NCCL has no type for, sizes that do not match the world size, a
    layout that is not contiguous, overlapping arrays). Operands are checked
    before anything is launched or recorded; a stream or array of another
    device than the communicator's raises DeviceMismatchError."""


class GraphMemoryError(NumbagraphError, RuntimeError):
    """An array a graph allocated was used where its memory does not exist:
    before the graph's first launch, after ``ng.free`` freed it inside the
    graph, after the graph was closed, outside the capture that allocates it
    while that capture runs, or in another graph's capture. Also raised for
    an allocation a capture cannot record (inside a conditional body) and
    for ``ng.free`` of memory that is not the capture's to free. Nothing was
    launched, copied or recorded."""


class StaleOutputError(GraphMemoryError):
    """An array returned by an earlier call of a
    [graphed][numbagraph.graphed.graphed] function was used after a later
    call launched the same graph again, which overwrote it. Copy the data
    out (``ng.copy_into`` or ``copy_to_host``) before the next call."""


class HostCallbackError(NumbagraphError, RuntimeError):
    """A host callback ([on_host][numbagraph.on_host]) raised. The callback
    ran on a thread that cannot take the exception (the driver's, or a
    replay's), so it was kept, the first one of them, and is raised from
    here (its ``__cause__``) by the next graph launch or wait for the
    device: ``graph.launch()``, ``stream.synchronize()``,
    ``cuda.synchronize()``, ``event.synchronize()`` or
    ``DeviceScalar.value``. The work around the callback ran as recorded."""


class CudaInHostCallbackError(NumbagraphError, RuntimeError):
    """A host callback ([on_host][numbagraph.on_host]) asked for CUDA work:
    a kernel launch, a capture, a graph launch, a scalar update or read, a
    copy, an allocation or a wait. CUDA forbids any of its calls in a host
    function (the driver may deadlock), so numbagraph refuses it before the
    driver sees it. The exception is kept like any other the callback
    raises."""


class DeviceMismatchError(NumbagraphError, ValueError):
    """Work was given a stream, array or scalar of one device where another
    device's is needed (a graph launched on a stream of another device, a
    DeviceScalar of another device passed into a capture, a capture begun
    on a stream whose device is not current), or an op's arrays live on
    another device than its stream. Raised before anything is launched or
    recorded; the message names both devices and the fix."""


class KernelArgumentError(NumbagraphError, TypeError):
    """A kernel launch kept by [launch_record][numbagraph.launch_record], or
    compiled by [precompile][numbagraph.precompile.precompile], was given
    arguments it cannot take: a host array (NumPy), which a kept launch cannot
    copy to the device at each launch; or, for a kernel compiled for explicit
    signatures, arguments that convert to none of them, or to several equally
    well. The message names the argument or the signatures and the
    fix. Raised before anything is compiled or launched.

    Also raised by a launch inside a capture of a kernel that numba cannot
    compile for its arguments (a number where the kernel indexes its
    parameter, ``n[0]``: pass a DeviceScalar), before anything is recorded;
    the capture goes on. The simulator, which compiles nothing, refuses only
    a number the kernel's source indexes (docs/capture.md)."""


class NumbagraphWarning(UserWarning):
    """Base class of every numbagraph warning: something that runs, but most
    likely not as meant. Turn them into errors with
    ``warnings.simplefilter("error", ng.NumbagraphWarning)``."""


class CaptureWarning(NumbagraphWarning):
    """Work that ran at once, or a graph that came out empty, while a capture
    was meant to record it; or a replay not ordered after the updates of the
    scalars it reads."""


class GraphedWarning(NumbagraphWarning):
    """A [graphed][numbagraph.graphed.graphed] function keeps capturing new graphs:
    a plain value that changes from call to call (it belongs in a
    DeviceScalar), or more signatures than its cache holds."""


# What the driver's stream-capture errors mean, in the terms of this module:
# (class, what happened, what to do).
_DRIVER_CAPTURE_ERRORS = {
    "UNSUPPORTED": (
        UncapturableOperationError,
        "a CUDA call that cannot run during capture (an allocation, a "
        "synchronisation or a synchronous copy) was made through a path "
        "numbagraph does not check, such as another library or a raw driver call",
        "do that work before the capture begins or after it ends",
    ),
    "INVALIDATED": (
        CaptureInvalidatedError,
        "the CUDA driver invalidated the capture: an earlier call that cannot "
        "be captured (an allocation, a synchronisation or a host copy) was made "
        "through a path numbagraph does not check, such as another library or "
        "a raw driver call",
        "find that call and move it before the capture or after it",
    ),
    "MERGE": (
        ForeignStreamInCaptureError,
        "work joined two separate captures",
        "keep each capture's work on its own stream",
    ),
    "UNMATCHED": (
        CaptureStateError,
        "the capture was ended on a stream other than the one that began it",
        "end the capture on the stream it began on",
    ),
    "UNJOINED": (
        ForeignStreamInCaptureError,
        "another stream joined the capture and was not joined back",
        "join every stream forked into the capture back into it before it ends: "
        "leave its `with ng.fork(...)` block, or make the capturing stream wait on "
        "an event recorded on it after its last work",
    ),
    "ISOLATION": (
        ForeignStreamInCaptureError,
        "the capture was made to wait on work outside it (by you, or by another "
        "library ordering its work after its own current stream)",
        "wait on that work before the capture begins; for PyTorch or CuPy, make "
        "their current stream the capturing one while they work (PyTorch: "
        "with torch.cuda.stream(torch.cuda.ExternalStream(s.handle)); CuPy: "
        "with cupy.cuda.ExternalStream(int(s.handle)))",
    ),
    "IMPLICIT": (
        ForeignStreamInCaptureError,
        "work on the legacy default stream would have waited on the capturing "
        "stream, a blocking stream (cuda.stream() makes blocking streams); PyTorch "
        "and CuPy work on the legacy default stream unless told otherwise",
        "enqueue that work on the capturing stream (numba: kernel[grid, block, s]; "
        "PyTorch: with torch.cuda.stream(torch.cuda.ExternalStream(s.handle)); CuPy: "
        "with cupy.cuda.ExternalStream(int(s.handle))), or capture on a non-blocking "
        "stream (torch.cuda.Stream(), cupy.cuda.Stream(non_blocking=True), or "
        "cuda.core's Device().create_stream()), which the legacy default stream "
        "does not wait on",
    ),
    "CAPTURED_EVENT": (
        SyncInCaptureError,
        "an event recorded inside the capture was queried or waited on",
        "wait on it after the graph has been launched",
    ),
    "WRONG_THREAD": (
        CaptureStateError,
        "a capture begun in mode 'global' or 'thread_local' was ended from "
        "another thread",
        "end it on the thread that began it, or capture with mode='relaxed'",
    ),
}
# The driver's and the runtime's codes agree (900 to 908). Other libraries
# raise them as the runtime's names (cudaErrorStreamCaptureImplicit: CuPy,
# whose errors also carry the code as ``status``) or as the runtime's
# descriptions (PyTorch's "CUDA error: ..."), read here too.
_DRIVER_CODES = dict(zip(range(900, 909), _DRIVER_CAPTURE_ERRORS))
_DRIVER_NAME = re.compile(r"CUDA_ERROR_STREAM_CAPTURE_([A-Z_]+)")
_RUNTIME_NAME = re.compile(r"cudaErrorStreamCapture([A-Z][A-Za-z]*)")
_RUNTIME_TEXT = {
    "operation not permitted when stream is capturing": "UNSUPPORTED",
    "operation failed due to a previous error during capture": "INVALIDATED",
    "merge of separate capture sequences": "MERGE",
    "capture was not initiated in this stream": "UNMATCHED",
    "capturing stream has unjoined work": "UNJOINED",
    "dependency created on uncaptured work in another stream": "ISOLATION",
    "legacy stream depend on a capturing blocking stream": "IMPLICIT",
    "event last recorded in a capturing stream": "CAPTURED_EVENT",
    "thread-local capture sequence from another thread": "WRONG_THREAD",
}


def _named_code(text: str) -> str | None:
    """The capture error a message names, by the driver's or the runtime's
    name, or by the runtime's description."""
    match = _DRIVER_NAME.search(text)
    if match is not None and match.group(1) in _DRIVER_CAPTURE_ERRORS:
        return match.group(1)
    match = _RUNTIME_NAME.search(text)
    if match is not None:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).upper()
        if name in _DRIVER_CAPTURE_ERRORS:
            return name
    return next((name for words, name in _RUNTIME_TEXT.items() if words in text), None)


def _driver_capture_code(exc: BaseException | None) -> str | None:
    seen = 0
    while exc is not None and seen < 8:
        for attr in ("code", "result", "status"):
            try:
                name = _DRIVER_CODES.get(int(getattr(exc, attr)))
            except (AttributeError, TypeError, ValueError):
                name = None
            if name is not None:
                return name
        name = _named_code(str(exc))
        if name is not None:
            return name
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def translate_driver_error(exc: BaseException, stream: str) -> CaptureError | None:
    """The :class:`CaptureError` that says what a driver stream-capture error
    (``CUDA_ERROR_STREAM_CAPTURE_*``) raised while ``stream`` captured means,
    or None when ``exc`` is not one."""
    if isinstance(exc, CaptureError):
        return None
    name = _driver_capture_code(exc)
    if name is None:
        return None
    cls, what, instead = _DRIVER_CAPTURE_ERRORS[name]
    return cls(
        f"the capture on {stream} failed: {what} "
        f"(CUDA_ERROR_STREAM_CAPTURE_{name}). Instead, {instead}. The capture "
        "was ended and its graph discarded; the stream is usable and a new "
        "capture may begin"
    )
