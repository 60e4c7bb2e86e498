"""Arrays of other libraries passed to launches: PyTorch tensors, CuPy
arrays, anything else with ``__cuda_array_interface__``.

numba launches such an argument once the launch stream is ordered after the
stream the array names: numba-cuda reads a tensor through ``__dlpack__``
first, passing the launch stream, and the library records an event on its
current stream for the launch stream to wait on; for an object with only
``__cuda_array_interface__``, the event is recorded on the stream its
``"stream"`` entry names, and numba synchronises that stream as well. Inside
a capture none of that may run, so numbagraph passes a view of the array's
memory instead (:func:`view`) and keeps the order itself, by the rule in
:mod:`numbagraph.safety`. This module says which arguments are foreign
arrays, where their memory is, and which stream each names; it decides no
rule.
"""

from __future__ import annotations

import sys
from typing import Any

from .backend import active as _backend

__all__ = ["may_be_foreign", "interface", "producer", "on_host", "view"]

_CAI = "__cuda_array_interface__"
# DLPack's device type of host memory (kDLCPU).
_DLPACK_CPU = 1


def may_be_foreign(kind: type, obj: Any) -> bool:
    """Whether values of the type ``kind`` (``obj`` one of them) may be
    foreign device arrays: the type, or ``obj`` itself, has
    ``__cuda_array_interface__``, and it is not one of numba's device
    arrays. The caller leaves out the types numbagraph unwraps itself
    (DeviceScalar, Condition)."""
    if getattr(kind, "__cuda_ndarray__", False):
        return False
    return hasattr(kind, _CAI) or hasattr(obj, _CAI)


def interface(obj: Any) -> dict | None:
    """``obj.__cuda_array_interface__``, or None when it has none (a PyTorch
    tensor in host memory raises AttributeError for it). Other errors the
    library raises (a tensor that requires grad) propagate: they say what to
    do."""
    return getattr(obj, _CAI, None)


def _library(obj: Any) -> str:
    return type(obj).__module__.partition(".")[0]


def producer(obj: Any, described: dict) -> tuple[int | None, str]:
    """The stream whose work numba orders a launch with ``obj`` after, and
    what that stream is to ``obj``, for messages: the ``"stream"`` entry of its
    ``__cuda_array_interface__`` (``described``, version 3), or, for a
    PyTorch tensor (version 2, no stream; numba reads it through
    ``__dlpack__``, whose order is PyTorch's current stream), that current
    stream. None when it names none."""
    if "stream" in described:
        stream = described["stream"]
        return (None if stream is None else int(stream)), \
            "the stream its __cuda_array_interface__ names"
    if _library(obj) == "torch":
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                handle = torch.cuda.current_stream(obj.device).cuda_stream
            except (AttributeError, RuntimeError, TypeError, ValueError):
                return None, ""
            return int(handle), "PyTorch's current stream (numba reads tensors through " \
                "__dlpack__, which orders the reader after it)"
    return None, ""


def on_host(obj: Any) -> bool:
    """Whether ``obj``, of a type that may be a foreign device array, is in
    host memory (a PyTorch CPU tensor): numba copies such an argument to
    the device and back, as it does a NumPy array. DLPack says where the
    memory is; the array interface is not read (a tensor that requires
    grad raises for it, and numba's own error is the one to see)."""
    device = getattr(obj, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        return int(device()[0]) == _DLPACK_CPU
    except (TypeError, ValueError, IndexError, RuntimeError):
        return False


def view(obj: Any) -> Any:
    """A numba device array over ``obj``'s memory, made without
    synchronising anything (the backend's ``as_device_array``); OpError
    when its pointer is not memory a kernel can use."""
    return _backend.as_device_array(obj)
