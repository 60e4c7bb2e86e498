import numpy as np
import pytest

import numbagraph as ng
from conftest import device_zeros, records_nothing

INTEGER_AND_FLOAT = [d for d in ng.SCALAR_DTYPES if d.kind != "b"]


@pytest.mark.parametrize("dtype", ng.SCALAR_DTYPES, ids=str)
def test_round_trips_every_dtype(stream, dtype):
    s = ng.DeviceScalar(1, dtype=dtype, stream=stream)
    assert s.dtype == dtype
    assert s.value == 1
    s.update(0)
    assert s.value == 0


@pytest.mark.parametrize(
    "value, dtype",
    [(3, np.int64), (2.5, np.float64), (True, np.bool_), (np.float32(1.5), np.float32)],
)
def test_dtype_is_inferred(value, dtype):
    s = ng.DeviceScalar(value)
    assert s.dtype == np.dtype(dtype)
    assert s.value == value


@pytest.mark.parametrize(
    "value, dtype",
    [
        (300, np.uint8),
        (-1, np.uint32),
        (1.5, np.int32),
        (float("nan"), np.int64),
        (float("inf"), np.int16),
        (2**63, np.int64),
        (1e6, np.float16),
        (2, np.bool_),
        ("3", np.float32),
    ],
)
def test_value_that_does_not_fit_raises_and_keeps_device_value(stream, value, dtype):
    s = ng.DeviceScalar(1, dtype=dtype, stream=stream)
    with pytest.raises(ng.ScalarValueError):
        s.update(value)
    assert s.value == 1


def test_unsupported_dtype_is_refused():
    with pytest.raises(ng.ScalarValueError, match="does not support"):
        ng.DeviceScalar(1, dtype=np.complex64)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=str)
def test_float_scalars_take_nan_and_inf(stream, dtype):
    s = ng.DeviceScalar(0.0, dtype=dtype, stream=stream)
    s.update(float("inf"))
    assert s.value == float("inf")
    s.update(float("nan"))
    assert np.isnan(s.value)


@pytest.mark.parametrize("dtype", [np.uint64, np.int64, np.float64], ids=str)
def test_eight_byte_extremes_round_trip(stream, dtype):
    big = np.iinfo(dtype).max if dtype != np.float64 else 1.2345678901234567e300
    s = ng.DeviceScalar(big, dtype=dtype, stream=stream)
    assert s.value == big


def test_inner_is_a_one_element_device_array(stream):
    s = ng.DeviceScalar(7, dtype=np.int32, stream=stream)
    inner = s.inner()
    assert inner.shape == (1,)
    assert inner.copy_to_host(stream=stream)[0] == 7


def test_exposes_cuda_array_interface():
    s = ng.DeviceScalar(7, dtype=np.int32)
    cai = s.__cuda_array_interface__
    assert cai["shape"] == (1,)
    assert np.dtype(cai["typestr"]) == np.int32
    assert cai["stream"] is None  # consumers must not synchronise on capture


def test_back_to_back_updates_are_never_lost(stream, kernels):
    """update(i); launch() for i in 0..999 leaves log == 0..999."""
    n = 1000
    log = device_zeros(n, np.int32, stream=stream)
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    kernels.log[1, 1, stream](log, pos)
    with ng.capture(stream) as cap:
        kernels.log[1, 1, stream](log, pos)
    for i in range(n):
        pos.update(i)
        cap.graph.launch()
    np.testing.assert_array_equal(log.copy_to_host(stream=stream), np.arange(n))


def test_update_inside_capture_is_replayed(stream, kernels):
    x = device_zeros(32, stream=stream)
    step = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, step)
    with ng.capture(stream) as cap:
        step.update(2.0)  # every replay sets step to 2 first
        kernels.add[1, 32, stream](x, step)
    assert step.value == 0.0  # recorded, not run
    step.update(100.0)
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)
    assert step.value == 2.0


def test_a_scalar_made_without_stream_updated_in_a_capture_says_to_make_it_with_stream(stream):
    pos = ng.DeviceScalar(0.0, dtype=np.float32)   # its stream: the legacy default stream
    with pytest.raises(ng.ForeignStreamInCaptureError,
                       match=r"make the scalar with stream=s.*dtype=np\.float32, stream=s.*"
                             r"cannot change.*made without stream="):
        with ng.capture(stream):
            pos.update(1.0)


def test_a_scalar_of_another_stream_updated_in_a_capture_warns_to_make_it_with_stream(
        stream, other_stream):
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=other_stream)
    with records_nothing(), ng.capture(stream):
        with pytest.warns(ng.CaptureWarning, match=r"To record it, make the scalar with "
                          r"stream=s, s being the capturing stream .*cannot change") as seen:
            pos.update(1)
    assert "pass stream=s to this call" not in str(seen[0].message)  # update takes none


@pytest.mark.parametrize("dtype", INTEGER_AND_FLOAT + [np.dtype(np.bool_)], ids=str)
def test_recorded_update_sets_every_width(stream, dtype):
    s = ng.DeviceScalar(0, dtype=dtype, stream=stream)
    with ng.capture(stream) as cap:
        s.update(1)
    cap.graph.launch()
    assert s.value == 1


def _awkward_values(dtype):
    """Values whose bits are easy to get wrong: extremes, negatives, -0.0,
    floats that must round."""
    if dtype.kind == "b":
        return [True, False, 1]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return [int(info.min), int(info.max), int(info.min) + 1, int(info.max) // 3, 0]
    big = float(np.finfo(dtype).max)
    return [0.1, -2.5e-3, big, -big, float(np.finfo(dtype).tiny), -0.0, 1 / 3]


def _bits(value, dtype):
    return np.array([value], dtype).tobytes()


@pytest.mark.parametrize("dtype", ng.SCALAR_DTYPES, ids=str)
def test_update_stores_the_exact_bits_numpy_would(stream, dtype):
    s = ng.DeviceScalar(0, dtype=dtype, stream=stream)
    for value in _awkward_values(dtype):
        s.update(value)
        assert _bits(s.value, dtype) == _bits(value, dtype), value


@pytest.mark.parametrize("dtype", ng.SCALAR_DTYPES, ids=str)
def test_recorded_update_stores_the_exact_bits_numpy_would(stream, dtype):
    s = ng.DeviceScalar(0, dtype=dtype, stream=stream)
    for value in _awkward_values(dtype):
        with ng.capture(stream) as cap:
            s.update(value)
        s.update(0)
        cap.graph.launch()
        assert _bits(s.value, dtype) == _bits(value, dtype), value
        cap.graph.close()


@pytest.mark.parametrize("value, dtype", [
    (10**400, np.float64), (-(10**400), np.float32),
    (np.timedelta64(1, "s"), np.int32), (np.timedelta64(1, "s"), np.float32),
    (np.datetime64(1, "s"), np.int64),
])
def test_values_numpy_or_python_cannot_store_raise_scalar_value_error(value, dtype):
    with pytest.raises(ng.ScalarValueError):
        ng.DeviceScalar(value, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_threads_updating_their_own_eight_byte_scalars_lose_nothing(dtype):
    # Each scalar stores through its own host buffer.
    import threading

    from numba import cuda

    rounds = 200
    together = threading.Barrier(4)
    seen = {}

    def work(tag):
        s = cuda.stream()
        scalar = ng.DeviceScalar(0, dtype=dtype, stream=s)
        log = np.empty(rounds, dtype)
        together.wait(timeout=60)
        for i in range(rounds):
            value = tag * 1_000_000 + i
            scalar.update(value)
            log[i] = scalar.value
        seen[tag] = log

    threads = [threading.Thread(target=work, args=(tag,)) for tag in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == [1, 2, 3, 4]
    for tag, log in seen.items():
        np.testing.assert_array_equal(log, tag * 1_000_000 + np.arange(rounds, dtype=dtype))
