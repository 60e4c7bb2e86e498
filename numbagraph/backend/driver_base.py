"""What every driver module shares: the error a failed driver call raises,
the one checker every call goes through, and the capture status of a stream."""

from __future__ import annotations

from typing import Any, Callable

from cuda.bindings import driver as cu

__all__ = ["DriverError", "check", "raise_for", "in_context", "capture_status", "is_capturing",
           "CAPTURE_ACTIVE", "CAPTURE_NONE", "CAPTURE_INVALIDATED", "CAPTURE_MODES"]

CAPTURE_ACTIVE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
CAPTURE_NONE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
CAPTURE_INVALIDATED = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED

CAPTURE_MODES = {
    "global": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}


class DriverError(RuntimeError):
    """A driver call failed; ``result`` is the ``CUresult``."""

    def __init__(self, call: str, result: Any):
        _, name = cu.cuGetErrorName(result)
        _, text = cu.cuGetErrorString(result)
        self.result = result
        name = name.decode() if isinstance(name, bytes) else name
        text = text.decode() if isinstance(text, bytes) else text
        super().__init__(f"{call} failed: {name}: {text}")


def check(call: str, ret: tuple) -> Any:
    """The value(s) a cuda.bindings call returned after its ``CUresult``;
    raises :class:`DriverError` when the call failed."""
    err = ret[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DriverError(call, err)
    return ret[1] if len(ret) == 2 else ret[1:]


def raise_for(call: str, err: Any) -> None:
    """Raise :class:`DriverError` when ``err``, a bare ``CUresult``, is not
    success; for calls that return nothing else."""
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DriverError(call, err)


def in_context(ctx: Any, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``'s result, the call made with ``ctx`` current where
    another context, or none (a thread that never used CUDA), is current;
    with ``ctx`` unknown, as it is. For calls on a graph's executable, which
    the driver makes in the current context: with none current, some of them
    fault instead of failing."""
    if ctx is None:
        return call(*args)
    failed, current = cu.cuCtxGetCurrent()
    if not failed and int(current) == int(ctx):
        return call(*args)
    check("cuCtxPushCurrent", cu.cuCtxPushCurrent(ctx))
    try:
        return call(*args)
    finally:
        cu.cuCtxPopCurrent()


def capture_status(handle: int) -> Any:
    """The stream's ``CUstreamCaptureStatus``, or None when the driver cannot
    say (a broken context)."""
    err, status = cu.cuStreamIsCapturing(handle)
    return status if err == cu.CUresult.CUDA_SUCCESS else None


def is_capturing(handle: int) -> bool:
    """Whether the stream captures, by numbagraph or anyone else."""
    return check("cuStreamIsCapturing", cu.cuStreamIsCapturing(handle)) != CAPTURE_NONE
