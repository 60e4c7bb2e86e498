"""The driver's own entry points called through ctypes (backend/driver_raw):
which one is asked for, what happens where there is none, and, on the
driver, that launches, fills and node updates made through them and
through cuda.bindings give the same results."""

import numpy as np
import pytest
from cuda.bindings import driver as cu
from numba import cuda

import numbagraph as ng
from conftest import add_scalar
from numbagraph.backend import driver_raw

_PTDS = "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"


def test_calls_on_a_stream_take_the_default_stream_as_cuda_bindings_does(monkeypatch):
    flags = cu.CUdriverProcAddress_flags
    monkeypatch.delenv(_PTDS, raising=False)
    assert driver_raw._flags("cuGraphLaunch") == flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    monkeypatch.setenv(_PTDS, "1")
    for name in ("cuLaunchKernel", "cuGraphLaunch", "cuMemsetD32Async"):
        assert driver_raw._flags(name) == flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    # A call on no stream has one entry point.
    assert driver_raw._flags("cuCtxGetCurrent") == flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    assert driver_raw._flags("cuGraphExecKernelNodeSetParams") == \
        flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM


@pytest.mark.parametrize("answer", ["refused", "null", "no driver"])
def test_an_entry_point_the_driver_does_not_give_is_none_and_asked_once(monkeypatch, answer):
    asked = []

    def get(symbol, version, flags):
        asked.append((symbol, version))
        if answer == "no driver":
            raise RuntimeError("no driver library")
        if answer == "refused":
            return cu.CUresult.CUDA_ERROR_INVALID_VALUE, 0, None
        return cu.CUresult.CUDA_SUCCESS, 0, None

    monkeypatch.setattr(driver_raw.cu, "cuGetProcAddress", get)
    monkeypatch.setattr(driver_raw, "_entries", {})
    assert driver_raw.entry("cuGraphLaunch") is None
    assert driver_raw.entry("cuGraphLaunch") is None
    # Asked for the ABI of cuda.bindings' structs, once.
    assert asked == [(b"cuGraphLaunch", 12000)]


@pytest.mark.driver_only(reason="the entry points are the CUDA driver's")
def test_the_driver_gives_every_entry_point_and_the_current_context():
    for name in driver_raw._PROTOTYPES:
        assert driver_raw.entry(name) is not None, name
    cuda.current_context()
    err, ctx = cu.cuCtxGetCurrent()
    assert not err and driver_raw.current_context() == int(ctx) != 0


@cuda.jit
def scaled(x, y, a):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = a * x[i] + 1


def _through_bindings(monkeypatch):
    """Every call made through cuda.bindings, as where the driver gives no
    entry point of the ABI."""
    from numbagraph.backend import driver_launch, driver_rebind

    monkeypatch.setattr(driver_raw, "_entries", {name: None for name in driver_raw._PROTOTYPES})
    monkeypatch.setattr(driver_rebind, "_raw", [None] * len(driver_rebind._RAW_SETS))
    monkeypatch.setattr(driver_launch, "_launch_kernel", driver_launch._through_bindings)


@pytest.mark.driver_only(reason="compares the driver's entry points with cuda.bindings' calls")
@pytest.mark.parametrize("path", ["driver entry points", "cuda.bindings"])
def test_launches_fills_and_rebindings_give_the_same_results_either_way(
        monkeypatch, stream, path):
    if path == "cuda.bindings":
        _through_bindings(monkeypatch)
    n = 256
    x = cuda.to_device(np.arange(n, dtype=np.float32), stream=stream)
    x2 = cuda.to_device(np.arange(n, dtype=np.float32) * 3, stream=stream)
    y = cuda.device_array(n, np.float32, stream=stream)
    # An eager launch, twice: the second takes the packing of the first.
    for a in (2.0, 2.0):
        scaled[2, 128, stream](x, y, np.float32(a))
    assert np.array_equal(y.copy_to_host(stream=stream), 2 * np.arange(n) + 1)
    # A scalar's fill, then a graph launch reading it.
    pos = ng.DeviceScalar(0, dtype=np.float32, stream=stream)
    with ng.capture(stream) as cap:
        add_scalar[2, 128, stream](y, pos)
    for step in (1, 2, 3):
        pos.update(step)
        cap.graph.launch()
    assert np.array_equal(y.copy_to_host(stream=stream), 2 * np.arange(n) + 7)
    cap.graph.close()

    # A rebinding made, then made again, as two inputs take turns.
    def step(x, y):
        scaled[2, 128, stream](x, y, np.float32(0.5))

    f = ng.graphed(step, stream=stream, max_graphs=1)
    for _ in range(3):
        for src, scale in ((x, 1), (x2, 3)):
            f(src, y)
            assert np.array_equal(y.copy_to_host(stream=stream),
                                  0.5 * scale * np.arange(n) + 1)
    info = f.cache_info()
    assert info.graphs == 1 and info.rebinds >= 4
    f.clear()

