"""Elementwise ops against NumPy: every op, every dtype it takes, the
broadcasting rules, and the calls it refuses."""

import math

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng

ARITHMETIC = [np.float16, np.float32, np.float64, np.int32, np.int64]
FLOATS = [np.float16, np.float32, np.float64]
N = 37  # not a multiple of any block size


def host(dtype, shape, *, low=-3.0, high=3.0, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(int(low * 10), int(high * 10) + 1, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.uniform(low, high, size=shape).astype(dtype)


def tolerance(dtype):
    return {
        np.dtype(np.float16): dict(rtol=2e-3, atol=2e-3),
        np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
        np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12),
    }.get(np.dtype(dtype), dict(rtol=0, atol=0))


def compute(dtype):
    """NumPy reference computed as the device does: float16 in float32."""
    return np.float32 if np.dtype(dtype) == np.float16 else dtype


def assert_matches(got, want, dtype):
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want).astype(np.float64),
                               **tolerance(dtype))


def int_div(a, b):
    q = np.floor_divide(a, np.where(b == 0, 1, b))
    return np.where(b == 0, 0, q)


BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": None,  # true division for floats, floor for integers
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
}


def binary_reference(op, a, b, dtype):
    ct = compute(dtype)
    a, b = np.asarray(a).astype(ct), np.asarray(b).astype(ct)
    if op == "div":
        return (int_div(a, b) if np.dtype(dtype).kind in "iu" else a / b).astype(dtype)
    return BINARY[op](a, b).astype(dtype)


def binary_cases():
    for op in BINARY:
        for dtype in FLOATS if op == "pow" else ARITHMETIC:
            yield pytest.param(op, np.dtype(dtype), id=f"{op}-{np.dtype(dtype).name}")


def operands(op, dtype, shape):
    low = 0.5 if op == "pow" else -3.0
    a = host(dtype, shape, low=low, seed=1)
    b = host(dtype, shape, low=-2.0 if op == "pow" else -3.0, high=2.0, seed=2)
    return a, b


@pytest.mark.parametrize("op, dtype", list(binary_cases()))
def test_binary_matches_numpy(stream, op, dtype):
    a, b = operands(op, dtype, N)
    out = ng.empty(N, dtype)
    getattr(ng, f"{op}_into")(cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    assert_matches(out.copy_to_host(stream=stream), binary_reference(op, a, b, dtype), dtype)


@pytest.mark.parametrize("op, dtype", list(binary_cases()))
@pytest.mark.parametrize("side", ["left", "right"])
def test_binary_takes_a_number_on_either_side(stream, op, dtype, side):
    a, _ = operands(op, dtype, N)
    number = 2 if np.dtype(dtype).kind in "iu" else 1.5
    out = ng.empty(N, dtype)
    fn = getattr(ng, f"{op}_into")
    if side == "left":
        fn(number, cuda.to_device(a), out, stream=stream)
        want = binary_reference(op, np.full(N, number, dtype), a, dtype)
    else:
        fn(cuda.to_device(a), number, out, stream=stream)
        want = binary_reference(op, a, np.full(N, number, dtype), dtype)
    assert_matches(out.copy_to_host(stream=stream), want, dtype)


@pytest.mark.parametrize("dtype", ARITHMETIC, ids=str)
def test_binary_reads_a_device_scalar_on_the_device(stream, dtype):
    a = host(dtype, N)
    scalar = ng.DeviceScalar(3, dtype=dtype, stream=stream)
    out = ng.empty(N, dtype)
    ng.mul_into(cuda.to_device(a), scalar, out, stream=stream)
    assert_matches(out.copy_to_host(stream=stream), binary_reference("mul", a, 3, dtype), dtype)


@pytest.mark.parametrize(
    "b_shape",
    [(4, 5), (5,), (1, 5), (3, 1), (1,), (1, 1), ()],
    ids=["same", "row", "row-2d", "column", "one", "one-2d", "number"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=str)
def test_broadcasting_rows_columns_and_scalars(stream, b_shape, dtype):
    out_shape = (3, 5) if b_shape != (4, 5) else (4, 5)
    a = host(dtype, out_shape, seed=3)
    b = host(dtype, b_shape, seed=4)
    out = ng.empty(out_shape, dtype)
    b_arg = b.item() if b_shape == () else cuda.to_device(b)
    ng.sub_into(cuda.to_device(a), b_arg, out, stream=stream)
    assert_matches(out.copy_to_host(stream=stream), (a - b).astype(dtype), dtype)


def test_broadcast_input_on_the_left(stream):
    a = host(np.float32, (1, 5), seed=5)
    b = host(np.float32, (3, 5), seed=6)
    out = ng.empty((3, 5), np.float32)
    ng.div_into(cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    assert_matches(out.copy_to_host(stream=stream), a / b, np.float32)


@pytest.mark.parametrize("shape", [(2, 3, 4), (0,), (1,)], ids=str)
def test_same_shape_inputs_of_any_shape(stream, shape):
    a, b = host(np.float64, shape, seed=7), host(np.float64, shape, seed=8)
    out = ng.empty(shape, np.float64)
    ng.add_into(cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    assert_matches(out.copy_to_host(stream=stream), a + b, np.float64)


def _tiled_lengths():
    """Lengths of several whole tiles of a flat kernel (4 elements per thread
    of a block), then a last tile that is empty, or cut inside or between
    the threads' four elements."""
    from numbagraph.backend import active
    from numbagraph.ops._map import TILE_ITEMS

    threads = active.launch_limits()[1]
    tile = TILE_ITEMS * threads
    return [3 * tile + tail for tail in (0, 1, threads - 1, threads + 1, tile - 1)]


@pytest.mark.parametrize("length", _tiled_lengths())
@pytest.mark.parametrize("op", ["add", "mul-scalar", "axpy", "copy"])
def test_every_element_of_every_tile_is_written(stream, op, length):
    a, b = host(np.float32, length, seed=1), host(np.float32, length, seed=2)
    x, y, out = cuda.to_device(a), cuda.to_device(b), ng.empty(length, np.float32)
    ng.fill_into(out, np.nan, stream=stream)
    three = ng.DeviceScalar(3.0, dtype=np.float32, stream=stream)
    call, want = {
        "add": (lambda: ng.add_into(x, y, out, stream=stream), a + b),
        "mul-scalar": (lambda: ng.mul_into(x, three, out, stream=stream), a * 3),
        "axpy": (lambda: ng.axpy_into(three, x, y, out, stream=stream), 3 * a + b),
        "copy": (lambda: ng.copy_into(x, out, stream=stream), a),
    }[op]
    call()
    assert_matches(out.copy_to_host(stream=stream), want, np.float32)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("shape", [(N,), (3, 7), (1,)])
def test_copy_of_a_whole_array_matches_numpy(stream, dtype, shape):
    a = (host(np.float32, int(np.prod(shape)), seed=3).reshape(shape) * 50).astype(dtype)
    out = ng.empty(shape, dtype)
    ng.fill_into(out, 1, stream=stream)
    ng.copy_into(cuda.to_device(a), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), a)


def test_copy_broadcasts_rows_scalars_and_numbers(stream):
    row = host(np.float32, 7, seed=4)
    out = ng.empty((3, 7), np.float32)
    ng.copy_into(cuda.to_device(row), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.tile(row, (3, 1)))
    ng.copy_into(ng.DeviceScalar(2.5, dtype=np.float32, stream=stream), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 2.5)
    ng.copy_into(-1.0, out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), -1.0)


def test_copy_onto_itself_leaves_the_array_as_it_was(stream):
    a = host(np.float32, N, seed=5)
    x = cuda.to_device(a)
    ng.copy_into(x, x, stream=stream)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), a)


def test_output_may_be_an_input(stream):
    a = host(np.float32, N)
    x = cuda.to_device(a)
    ng.mul_into(x, x, x, stream=stream)
    assert_matches(x.copy_to_host(stream=stream), a * a, np.float32)


def test_integer_division_floors_and_gives_zero_for_zero_divisor(stream):
    a = np.array([7, -7, 7, -7, 5], np.int32)
    b = np.array([2, 2, -2, -2, 0], np.int32)
    out = ng.empty(5, np.int32)
    ng.div_into(cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), [3, -4, -4, 3, 0])


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_and_minimum_propagate_nan(stream, op):
    a = np.array([np.nan, 1.0, 2.0, np.nan], np.float32)
    b = np.array([1.0, np.nan, 1.0, np.nan], np.float32)
    out = ng.empty(4, np.float32)
    getattr(ng, f"{op}_into")(cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), getattr(np, op)(a, b))


def _gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


UNARY = {
    "neg": (np.negative, ARITHMETIC),
    "abs": (np.abs, ARITHMETIC),
    "relu": (lambda x: np.maximum(x, 0), ARITHMETIC),
    "copy": (lambda x: x, ARITHMETIC + [np.bool_, np.uint8]),
    "exp": (np.exp, FLOATS),
    "log": (np.log, FLOATS),
    "sqrt": (np.sqrt, FLOATS),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), FLOATS),
    "tanh": (np.tanh, FLOATS),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), FLOATS),
    "gelu": (_gelu, FLOATS),
}


def unary_cases():
    for op, (_, dtypes) in UNARY.items():
        for dtype in dtypes:
            yield pytest.param(op, np.dtype(dtype), id=f"{op}-{np.dtype(dtype).name}")


@pytest.mark.parametrize("op, dtype", list(unary_cases()))
def test_unary_matches_numpy(stream, op, dtype):
    positive = op in ("log", "sqrt", "rsqrt")
    x = host(dtype, N, low=0.25 if positive else -3.0)
    out = ng.empty(N, dtype)
    getattr(ng, f"{op}_into")(cuda.to_device(x), out, stream=stream)
    reference, _ = UNARY[op]
    want = reference(x.astype(compute(dtype)) if dtype.kind == "f" else x)
    assert_matches(out.copy_to_host(stream=stream), np.asarray(want).astype(dtype), dtype)


@pytest.mark.parametrize("dtype", ARITHMETIC + [np.bool_], ids=str)
def test_fill_with_a_number(stream, dtype):
    out = ng.empty((3, 4), dtype)
    value = True if dtype == np.bool_ else 3
    ng.fill_into(out, value, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.full((3, 4), value, dtype))


def test_fill_with_a_device_scalar(stream):
    out = ng.empty(N, np.float64)
    value = ng.DeviceScalar(2.5, dtype=np.float64, stream=stream)
    ng.fill_into(out, value, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 2.5)


@pytest.mark.parametrize("dtype", ARITHMETIC, ids=str)
def test_axpy_with_a_number(stream, dtype):
    x, y = host(dtype, N, seed=1), host(dtype, N, seed=2)
    out = ng.empty(N, dtype)
    ng.axpy_into(2, cuda.to_device(x), cuda.to_device(y), out, stream=stream)
    ct = compute(dtype)
    want = (2 * x.astype(ct) + y.astype(ct)).astype(dtype)
    assert_matches(out.copy_to_host(stream=stream), want, dtype)


def test_axpy_with_a_device_scalar_alpha(stream):
    x, y = host(np.float32, N, seed=1), host(np.float32, N, seed=2)
    alpha = ng.DeviceScalar(-0.5, dtype=np.float32, stream=stream)
    out = ng.empty(N, np.float32)
    ng.axpy_into(alpha, cuda.to_device(x), cuda.to_device(y), out, stream=stream)
    assert_matches(out.copy_to_host(stream=stream), -0.5 * x + y, np.float32)


@pytest.mark.parametrize("cond_dtype", [np.bool_, np.int32, np.float32], ids=str)
def test_where_selects_by_nonzero_condition(stream, cond_dtype):
    cond = (host(np.int32, N, seed=9) % 2).astype(cond_dtype)
    a, b = host(np.float32, N, seed=1), host(np.float32, N, seed=2)
    out = ng.empty(N, np.float32)
    ng.where_into(cuda.to_device(cond), cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.where(cond != 0, a, b))


def test_where_broadcasts_a_number_and_a_scalar_condition(stream):
    a = host(np.float64, N)
    flag = ng.DeviceScalar(False, dtype=np.bool_, stream=stream)
    out = ng.empty(N, np.float64)
    ng.where_into(flag, cuda.to_device(a), -1.0, out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), -1.0)
    ng.where_into(True, cuda.to_device(a), -1.0, out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), a)


@pytest.mark.parametrize(
    "source, target",
    [(np.float32, np.float16), (np.float16, np.float64), (np.float64, np.int32),
     (np.int64, np.float32), (np.float32, np.bool_), (np.bool_, np.float32),
     (np.int32, np.uint8)],
    ids=lambda d: np.dtype(d).name,
)
def test_astype_converts_as_numpy(stream, source, target):
    x = host(source, N, low=-3.0 if np.dtype(target).kind != "u" else 0.0)
    out = ng.empty(N, target)
    ng.astype_into(cuda.to_device(x), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), x.astype(target))


def test_accepts_arrays_through_cuda_array_interface(stream):
    from numbagraph.backend import active

    class Foreign:
        """Any library's array: only __cuda_array_interface__, naming a stream."""

        def __init__(self, dev):
            self.dev = dev
            self.__cuda_array_interface__ = dict(active.array_interface(dev),
                                                 stream=active.stream_handle(stream))

    a, b = host(np.float32, N, seed=1), host(np.float32, N, seed=2)
    out = ng.empty(N, np.float32)
    ng.add_into(Foreign(cuda.to_device(a)), Foreign(cuda.to_device(b)), Foreign(out),
                stream=stream)
    assert_matches(out.copy_to_host(stream=stream), a + b, np.float32)


def test_launches_on_any_stream_object(stream):
    from numbagraph.backend import active

    class ForeignStream:
        def __cuda_stream__(self):
            return (0, active.stream_handle(stream))

    out = ng.empty(N, np.float32)
    ng.fill_into(out, 4.0, stream=ForeignStream())
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 4.0)


# ---------------------------------------------------------------- refusals

@pytest.fixture
def f32():
    return cuda.to_device(np.ones(N, np.float32))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s, x: ng.add_into(x, cuda.to_device(np.ones(N, np.float64)), x, stream=s),
         "dtype float64"),
        (lambda s, x: ng.add_into(x, cuda.to_device(np.ones(5, np.float32)), x, stream=s),
         "does not broadcast"),
        (lambda s, x: ng.add_into(x, np.ones(N, np.float32), x, stream=s), "host"),
        (lambda s, x: ng.add_into(x, [1.0] * N, x, stream=s), "list"),
        (lambda s, x: ng.add_into(x, 1.0, x, stream=None), "stream"),
        (lambda s, x: ng.add_into(x, 1.0, x, stream="fast"), "not a CUDA stream"),
        (lambda s, x: ng.exp_into(cuda.to_device(np.ones(N, np.int32)),
                                  cuda.to_device(np.ones(N, np.int32)), stream=s), "int32"),
        (lambda s, x: ng.pow_into(cuda.to_device(np.ones(N, np.int64)), 2,
                                  cuda.to_device(np.ones(N, np.int64)), stream=s), "int64"),
        (lambda s, x: ng.add_into(cuda.to_device(np.ones(N, np.int32)), 1.5,
                                  cuda.to_device(np.ones(N, np.int32)), stream=s),
         "not an integer"),
        (lambda s, x: ng.add_into(x, ng.DeviceScalar(1, dtype=np.int32, stream=s), x, stream=s),
         "DeviceScalar with dtype=float32"),
        (lambda s, x: ng.axpy_into(x, x, x, x, stream=s), "alpha"),
        (lambda s, x: ng.add_into(cuda.to_device(np.ones((4, 6), np.float32))[:, :3], 1.0,
                                  cuda.to_device(np.ones((4, 3), np.float32)), stream=s),
         "C-contiguous"),
    ],
    ids=["dtype", "shape", "host-array", "list", "no-stream", "bad-stream", "float-only-op",
         "pow-of-ints", "value-does-not-fit", "scalar-dtype", "alpha-array", "strided"],
)
def test_refuses_bad_calls_before_launching(stream, f32, call, message):
    before = f32.copy_to_host(stream=stream)
    with pytest.raises(ng.OpError, match=message):
        call(stream, f32)
    np.testing.assert_array_equal(f32.copy_to_host(stream=stream), before)


def test_op_error_is_a_value_error_and_a_type_error():
    assert issubclass(ng.OpError, ValueError)
    assert issubclass(ng.OpError, TypeError)
    assert issubclass(ng.OpError, ng.NumbagraphError)


def test_out_may_be_an_input_itself(stream):
    a = np.arange(64, dtype=np.float32)
    x = cuda.to_device(a, stream=stream)
    ng.add_into(x, x, x, stream=stream)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2 * a)


PARTIAL_OVERLAPS = {
    "shifted by one": lambda x, m: (x[1:], 0.0, x[:-1]),
    "row broadcast from out": lambda x, m: (m, m[0], m),
    "one element of out": lambda x, m: (x[:-1], x[3:4], x[:-1]),
}


@pytest.mark.parametrize("case", list(PARTIAL_OVERLAPS))
def test_an_input_partly_overlapping_out_is_refused_before_launch(stream, case):
    x = cuda.to_device(np.arange(4097, dtype=np.float32), stream=stream)
    m = cuda.to_device(np.arange(12, dtype=np.float32).reshape(4, 3), stream=stream)
    before_x, before_m = x.copy_to_host(stream=stream), m.copy_to_host(stream=stream)
    a, b, out = PARTIAL_OVERLAPS[case](x, m)
    with pytest.raises(ng.OpError, match="shares memory with out"):
        ng.add_into(a, b, out, stream=stream)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), before_x)
    np.testing.assert_array_equal(m.copy_to_host(stream=stream), before_m)


def test_a_malformed_foreign_array_interface_is_named(stream):
    class NoData:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "version": 3}

    with pytest.raises(ng.OpError, match="__cuda_array_interface__"):
        ng.add_into(NoData(), 1.0, ng.empty(4, np.float32), stream=stream)


class _Interface:
    """A foreign array that is nothing but the interface it was given."""

    def __init__(self, **interface):
        self.__cuda_array_interface__ = {"typestr": "<f4", "version": 3, **interface}


def test_a_foreign_array_with_a_null_pointer_is_refused_before_any_launch(stream):
    out = cuda.to_device(np.zeros(4, np.float32), stream=stream)
    with pytest.raises(ng.OpError, match="NULL"):
        ng.add_into(_Interface(shape=(4,), data=(0, False)), 1.0, out, stream=stream)
    # An empty array may have no memory at all.
    ng.add_into(_Interface(shape=(0,), data=(0, False)), 1.0,
                _Interface(shape=(0,), data=(0, False)), stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 0.0)


@pytest.mark.driver_only(reason="the simulator's device pointers are host pointers, "
                                "which it cannot tell from garbage")
def test_a_foreign_pointer_cuda_does_not_know_is_refused(stream):
    out = cuda.to_device(np.zeros(4, np.float32), stream=stream)
    with pytest.raises(ng.OpError, match="not memory CUDA knows"):
        ng.add_into(_Interface(shape=(4,), data=(0x1234000, False)), 1.0, out, stream=stream)
    host = np.zeros(4, np.float32)  # pageable host memory: unknown to CUDA
    with pytest.raises(ng.OpError, match="not memory CUDA knows"):
        ng.add_into(_Interface(shape=(4,), data=(host.ctypes.data, False)), 1.0, out,
                    stream=stream)


@pytest.mark.driver_only(reason="the extent is checked against the driver's allocation")
def test_a_foreign_array_larger_than_its_allocation_is_refused(stream):
    small = cuda.to_device(np.zeros(4, np.float32), stream=stream)
    pointer = small.device_ctypes_pointer.value
    out = cuda.to_device(np.zeros(1 << 20, np.float32), stream=stream)
    with pytest.raises(ng.OpError, match="past the end of its allocation"):
        ng.add_into(_Interface(shape=(1 << 20,), data=(pointer, False)), 1.0, out,
                    stream=stream)
