"""Shared fixtures. numbagraph is imported first so that, on a machine without
a GPU, it can select Numba's simulator before numba.cuda loads."""

import numbagraph as ng  # noqa: I001  (must precede numba.cuda)

import numpy as np
import pytest
from numba import cuda

ON_SIMULATOR = ng.backend() == "simulator"

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

# bfloat16 arrays are ml_dtypes' (pip install -e ".[bfloat16]"); a dtype
# parameter for the ops that take it.
BF16 = pytest.param(
    ml_dtypes.bfloat16 if ml_dtypes is not None else None, id="bfloat16",
    marks=pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 needs ml_dtypes"))


def to_device(a, stream=0):
    """``cuda.to_device(a)``; bfloat16 travels as its bits: numba copies
    through the buffer protocol, which has no bfloat16."""
    if a.dtype.name == "bfloat16":
        return cuda.to_device(a.view(np.uint16), stream=stream).view(a.dtype)
    return cuda.to_device(a, stream=stream)


def to_host(dev, stream=0):
    """``dev.copy_to_host()``, bfloat16 as its bits (see to_device)."""
    if np.dtype(dev.dtype).name == "bfloat16":
        return dev.view(np.uint16).copy_to_host(stream=stream).view(dev.dtype)
    return dev.copy_to_host(stream=stream)


def dev(values, stream, dtype=np.float32):
    """``values`` as a device array of ``dtype`` on ``stream``."""
    return cuda.to_device(np.asarray(values, dtype=dtype), stream=stream)


@cuda.jit
def axpy(x, y, out, a):
    """out = a * x + y, ``a`` a one-element array or DeviceScalar."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[0] * x[i] + y[i]


def host(array, stream):
    """``array`` copied to the host on ``stream``, the stream synchronised."""
    out = array.copy_to_host(stream=stream)
    stream.synchronize()
    return out


def records_nothing():
    """The warning of a capture a test leaves empty on purpose (the work it
    refuses, or runs elsewhere), expected rather than reported."""
    return pytest.warns(ng.CaptureWarning, match="recorded nothing")


def pytest_report_header(config):
    return f"numbagraph backend: {ng.backend()}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("driver_only")
        if marker is not None and ON_SIMULATOR:
            reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            item.add_marker(pytest.mark.skip(reason=f"needs the CUDA driver: {reason}"))


@pytest.fixture
def stream():
    s = cuda.stream()
    yield s
    s.synchronize()
    assert not ng.is_capturing(s), "a test left its stream capturing"


@pytest.fixture
def other_stream():
    return cuda.stream()


@cuda.jit
def add_scalar(x, pos):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += pos[0]


@cuda.jit
def log_scalar(log, pos):
    """Write pos[0] into slot pos[0] of log."""
    if cuda.grid(1) == 0:
        log[int(pos[0])] = pos[0]


@pytest.fixture
def kernels():
    """Small kernels used across the suite."""

    class K:
        add = add_scalar
        log = log_scalar

    return K


def device_zeros(n, dtype=np.float32, stream=0):
    return cuda.to_device(np.zeros(n, dtype), stream=stream)


@pytest.fixture
def warm_add(stream, kernels):
    """``(x, one)``: 32 zeros and a float32 scalar 1.0 on ``stream``, with
    ``kernels.add`` already compiled and run once (x is 1.0 everywhere)."""
    x = device_zeros(32, stream=stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, one)
    return x, one
