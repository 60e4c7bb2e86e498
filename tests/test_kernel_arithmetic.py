"""Arithmetic inside kernels, on each backend.

On the GPU numba types a kernel: an operation on integers narrower than 64
bits is computed in 64 bits, and float32 with a Python float in float64.
Numba's simulator runs the kernel as Python on NumPy scalars of the array's
dtype, and NumPy keeps that dtype (integers wrap around). Where the two
differ, each test states what each backend gives; docs/troubleshooting.md
("Integer arithmetic differs on the simulator") says how to write kernels
that agree on both.
"""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng

SIMULATOR_OVERFLOW = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@cuda.jit
def times_three(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] * 3


@cuda.jit
def times_three_in_int64(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = np.int64(x[i]) * 3


def _run(kernel, values, dtype, out_dtype, stream):
    x = cuda.to_device(np.array(values, dtype), stream=stream)
    out = cuda.to_device(np.zeros(len(values), out_dtype), stream=stream)
    kernel[1, len(values), stream](x, out)
    return out.copy_to_host(stream=stream).tolist()


# (dtype, element, element * 3 computed in 64 bits, element * 3 wrapped to dtype)
NARROW = [
    (np.uint8, 200, 600, 88),
    (np.int8, 100, 300, 44),
    (np.uint16, 30000, 90000, 24464),
    (np.int16, 20000, 60000, -5536),
]


@SIMULATOR_OVERFLOW
@pytest.mark.parametrize("dtype, value, wide, wrapped", NARROW)
def test_narrow_integer_times_a_number_is_wide_on_the_gpu_and_wraps_on_the_simulator(
        stream, dtype, value, wide, wrapped):
    expected = {"cuda": wide, "simulator": wrapped}[ng.backend()]
    assert _run(times_three, [value], dtype, np.int32, stream) == [expected]


@pytest.mark.parametrize("dtype, value, wide, wrapped", NARROW)
def test_a_cast_to_int64_gives_the_wide_result_on_both(stream, dtype, value, wide, wrapped):
    assert _run(times_three_in_int64, [value], dtype, np.int32, stream) == [wide]


def test_a_wide_result_stored_into_a_narrow_array_wraps_on_both(stream):
    assert _run(times_three_in_int64, [200, 100], np.uint8, np.uint8, stream) == [88, 44]


@cuda.jit
def times_a_tenth(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] * 0.1


@cuda.jit
def times_a_float32_tenth(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] * np.float32(0.1)


def test_float32_times_a_python_float_is_float64_on_the_gpu_and_float32_on_the_simulator(stream):
    expected = {"cuda": 3.0 * 0.1, "simulator": float(np.float32(3.0) * np.float32(0.1))}
    assert _run(times_a_tenth, [3.0], np.float32, np.float64, stream) == [expected[ng.backend()]]


def test_a_float32_constant_keeps_float32_on_both(stream):
    expected = float(np.float32(3.0) * np.float32(0.1))
    assert _run(times_a_float32_tenth, [3.0], np.float32, np.float64, stream) == [expected]
