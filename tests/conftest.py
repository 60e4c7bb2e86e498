"""Shared fixtures. numbagraph is imported first so that, on a machine without
a GPU, it can select Numba's simulator before numba.cuda loads."""

import numbagraph as ng  # noqa: I001  (must precede numba.cuda)

import numpy as np
import pytest
from numba import cuda

ON_SIMULATOR = ng.backend() == "simulator"


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
