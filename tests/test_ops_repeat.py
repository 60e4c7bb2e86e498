"""An eager op called again with the same objects launches what it launched
before without its checks; these tests pin down when that holds and when a
call is checked again."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.ops import _launch, elementwise


def _host(a, stream):
    return a.copy_to_host(stream=stream)


@pytest.fixture
def counted(monkeypatch):
    """How many times the checked path of elementwise ops ran."""
    calls = [0]
    real = elementwise._apply

    def apply(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(elementwise, "_apply", apply)
    _launch._seen.remembered.clear()
    _launch._seen.once.clear()
    return calls


def test_a_third_call_with_the_same_objects_skips_the_checks_and_reads_new_values(
        stream, counted):
    x = cuda.to_device(np.arange(8, dtype=np.float32), stream=stream)
    y = cuda.to_device(np.ones(8, np.float32), stream=stream)
    out = cuda.device_array(8, np.float32, stream=stream)
    for _ in range(3):
        ng.add_into(x, y, out, stream=stream)
    assert counted[0] == 2
    np.testing.assert_array_equal(_host(out, stream), np.arange(8) + 1)
    # The remembered launch reads the arrays' memory, so new contents count.
    x.copy_to_device(np.full(8, 10, np.float32), stream=stream)
    ng.add_into(x, y, out, stream=stream)
    assert counted[0] == 2
    np.testing.assert_array_equal(_host(out, stream), np.full(8, 11))


def test_a_different_number_or_array_is_checked_and_launched_as_given(stream, counted):
    x = cuda.to_device(np.arange(8, dtype=np.float32), stream=stream)
    out = cuda.device_array(8, np.float32, stream=stream)
    for value in (1.0, 1.0, 1.0, 2.0):
        ng.mul_into(x, value, out, stream=stream)
    np.testing.assert_array_equal(_host(out, stream), 2 * np.arange(8))
    other = cuda.to_device(np.ones(8, np.float32), stream=stream)
    ng.mul_into(other, 2.0, out, stream=stream)
    np.testing.assert_array_equal(_host(out, stream), np.full(8, 2))
    assert counted[0] == 4  # two for 1.0 (the second remembered), 2.0, other


def test_zeros_of_either_sign_are_different_calls(stream):
    x = cuda.to_device(np.ones(4, np.float32), stream=stream)
    out = cuda.device_array(4, np.float32, stream=stream)
    for _ in range(3):
        ng.mul_into(x, 0.0, out, stream=stream)
    ng.mul_into(x, -0.0, out, stream=stream)
    assert np.all(np.signbit(_host(out, stream)))


def test_bad_input_is_refused_every_time(stream):
    x = cuda.to_device(np.ones(4, np.float32), stream=stream)
    out = cuda.device_array(5, np.float32, stream=stream)
    for _ in range(3):
        with pytest.raises(ng.OpError):
            ng.add_into(x, x, out, stream=stream)


def test_a_remembered_call_is_forgotten_with_its_arrays(stream):
    x = cuda.to_device(np.ones(4, np.float32), stream=stream)
    out = cuda.device_array(4, np.float32, stream=stream)
    _launch._seen.remembered.clear()
    for _ in range(3):
        ng.add_into(x, x, out, stream=stream)
    assert len(_launch._seen.remembered) == 1
    del x
    gc.collect()
    assert len(_launch._seen.remembered) == 0


def test_a_device_scalar_is_read_when_the_remembered_call_runs(stream):
    x = cuda.to_device(np.ones(4, np.float32), stream=stream)
    out = cuda.device_array(4, np.float32, stream=stream)
    scale = ng.DeviceScalar(np.float32(2), stream=stream)
    for _ in range(3):
        ng.mul_into(x, scale, out, stream=stream)
    scale.update(5)
    ng.mul_into(x, scale, out, stream=stream)
    np.testing.assert_array_equal(_host(out, stream), np.full(4, 5))


def test_captures_record_every_call_checked(stream, counted):
    x = cuda.to_device(np.ones(4, np.float32), stream=stream)
    out = cuda.device_array(4, np.float32, stream=stream)
    for _ in range(3):
        ng.add_into(x, x, out, stream=stream)
    before = counted[0]
    with ng.capture(stream) as cap:
        ng.add_into(x, x, out, stream=stream)
        ng.add_into(out, x, out, stream=stream)
    assert counted[0] == before + 2
    cap.graph.launch()
    np.testing.assert_array_equal(_host(out, stream), np.full(4, 3))


def test_a_whole_array_copy_is_remembered_too(stream):
    x = cuda.to_device(np.arange(6, dtype=np.int32), stream=stream)
    out = cuda.device_array(6, np.int32, stream=stream)
    for k in range(4):
        x.copy_to_device(np.arange(6, dtype=np.int32) + k, stream=stream)
        ng.copy_into(x, out, stream=stream)
        np.testing.assert_array_equal(_host(out, stream), np.arange(6) + k)


def test_reductions_repeat_with_their_scratch(stream):
    x = cuda.to_device(np.arange(1000, dtype=np.float32), stream=stream)
    total = ng.DeviceScalar(np.float32(0), stream=stream)
    for k in range(4):
        x.copy_to_device(np.arange(1000, dtype=np.float32) * (k + 1), stream=stream)
        ng.sum_into(x, total, stream=stream)
        assert total.value == pytest.approx(499500 * (k + 1))


def test_the_fast_path_switch_turns_remembered_calls_off():
    code = ("import numbagraph; from numbagraph.backend import active; "
            "print(active.repeatable_types() == (frozenset(), frozenset()))")
    env = {**os.environ, "NUMBAGRAPH_FAST_LAUNCH": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "True"
