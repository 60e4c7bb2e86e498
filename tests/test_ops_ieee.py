"""The same answers on both backends: where IEEE arithmetic gives NaN or inf,
where integers wrap, and where a float converted to an integer is NaN or
out of range, the simulator gives what the GPU gives (docs/ops.md,
Conversions). Expected values come from NumPy with its warnings off, or
from the conversion rule written out, and are compared exactly."""

import math

import numpy as np
import pytest

import numbagraph as ng

from conftest import to_device, to_host

# NumPy warns as it makes the NaN, inf and wrapped values wanted here, and the
# simulator computes through NumPy scalars; the device never warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FLOATS = [np.float16, np.float32, np.float64]
INTEGERS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
INF, NAN = np.inf, np.nan


def name(value):
    """A test id: a dtype by its name, anything else as written."""
    return np.dtype(value).name if isinstance(value, type) else str(value)


def compute(dtype):
    """The type the device computes a float ``dtype`` in: float16 in float32."""
    return np.float32 if np.dtype(dtype).itemsize == 2 else np.dtype(dtype).type


def array(values, dtype):
    """Floats ``values`` rounded to ``dtype`` (to inf beyond its range)."""
    with np.errstate(all="ignore"):
        return np.array(values, np.float64).astype(dtype)


def assert_same(got, want):
    """The same dtype and values: NaN where NaN (of either sign), zeros of
    one sign."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(g[~nan], w[~nan])
    np.testing.assert_array_equal(np.signbit(g[~nan]), np.signbit(w[~nan]))


def run(op, inputs, out_dtype, stream, shape=None, **kwargs):
    """``ng.<op>_into`` of host ``inputs`` into a new ``out`` of ``shape``
    (the first input's by default), read back."""
    out = ng.empty(inputs[0].shape if shape is None else shape, out_dtype)
    getattr(ng, f"{op}_into")(*[to_device(x) for x in inputs], out, stream=stream, **kwargs)
    return to_host(out, stream)


# ---------------------------------------------------------------- float math

def _erf(u):
    return np.vectorize(math.erf, otypes=[u.dtype])(u)


# Each op's inputs, chosen so that the IEEE result is exact (the device's
# exp of 1.0 may differ from NumPy's in the last bit; its exp of 1000.0 is
# inf on both), and its NumPy reference in the compute type.
UNARY = {
    "exp": ([0.0, -0.0, 1000.0, -1000.0, INF, -INF, NAN], np.exp),
    "log": ([-1.0, -0.0, 0.0, 1.0, INF, -INF, NAN], np.log),
    "sqrt": ([-1.0, -0.0, 0.0, 4.0, INF, -INF, NAN], np.sqrt),
    "rsqrt": ([-1.0, -0.0, 0.0, 4.0, INF, -INF, NAN], lambda u: u.dtype.type(1) / np.sqrt(u)),
    "tanh": ([0.0, -0.0, 1000.0, -1000.0, INF, -INF, NAN], np.tanh),
    "sigmoid": ([0.0, 1000.0, -1000.0, INF, -INF, NAN],
                lambda u: u.dtype.type(1) / (u.dtype.type(1) + np.exp(-u))),
    "gelu": ([0.0, -0.0, 1000.0, -1000.0, INF, -INF, NAN],
             lambda u: u.dtype.type(0.5) * u * (u.dtype.type(1) +
                                                _erf(u * u.dtype.type(0.7071067811865476)))),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_ops_give_ieee_nan_and_inf(stream, op, dtype):
    values, reference = UNARY[op]
    x = array(values, dtype)
    with np.errstate(all="ignore"):
        want = reference(x.astype(compute(dtype))).astype(dtype)
    assert_same(run(op, [x], dtype, stream), want)


POW_CASES = [(-8.0, 1 / 3), (0.0, -1.0), (-0.0, -1.0), (10.0, 1000.0), (NAN, 0.0),
             (1.0, NAN), (INF, -1.0), (-2.0, 2.0), (-INF, 3.0)]


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_pow_gives_ieee_nan_and_inf(stream, dtype):
    a = array([c[0] for c in POW_CASES], dtype)
    b = array([c[1] for c in POW_CASES], dtype)
    ct = compute(dtype)
    with np.errstate(all="ignore"):
        want = np.power(a.astype(ct), b.astype(ct)).astype(dtype)
    assert_same(run("pow", [a, b], dtype, stream), want)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_division_by_zero_gives_ieee_inf_and_nan(stream, dtype):
    a = array([1.0, -1.0, 0.0, 1.0, INF, NAN], dtype)
    b = array([0.0, 0.0, 0.0, -0.0, INF, 0.0], dtype)
    ct = compute(dtype)
    with np.errstate(all="ignore"):
        want = (a.astype(ct) / b.astype(ct)).astype(dtype)
    assert_same(run("div", [a, b], dtype, stream), want)


# ---------------------------------------------------------------- integer arithmetic

def _limits(dtype):
    info = np.iinfo(dtype)
    return np.array([info.max, info.min, info.max - 1, info.min + 1, -1, 1], dtype)


INTEGER_OPS = {
    "add": (2, np.add),
    "sub": (2, np.subtract),
    "mul": (2, np.multiply),
    "neg": (1, np.negative),
    "abs": (1, np.abs),
}


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=name)
@pytest.mark.parametrize("op", list(INTEGER_OPS))
def test_integer_arithmetic_wraps(stream, op, dtype):
    arity, reference = INTEGER_OPS[op]
    a = _limits(dtype)
    inputs = [a, np.roll(a, 1)][:arity]
    assert_same(run(op, inputs, dtype, stream), reference(*inputs))  # arrays wrap


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=name)
def test_integer_axpy_wraps(stream, dtype):
    alpha = int(np.iinfo(dtype).max // 2 + 3)
    x, y = _limits(dtype), np.roll(_limits(dtype), 1)
    out = ng.empty(x.shape, dtype)
    ng.axpy_into(alpha, to_device(x), to_device(y), out, stream=stream)
    assert_same(to_host(out, stream), np.dtype(dtype).type(alpha) * x + y)


# ---------------------------------------------------------------- astype

# Integers of every width, each kept where it fits the source dtype.
INTEGER_VALUES = [0, 1, -1, 127, -128, 129, -129, 300, -300, 40000, -40000, 70000,
                  2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**32 - 1, 2**40 + 5, -2**33 - 1,
                  2**63 - 1, -2**63, 2**63, 2**64 - 1]


def integers_of(dtype):
    info = np.iinfo(dtype)
    return np.array([v for v in INTEGER_VALUES if info.min <= v <= info.max], dtype)


@pytest.mark.parametrize("source, target", [
    (s, t) for s in (np.int32, np.int64, np.uint32, np.uint64)
    for t in INTEGERS + [np.bool_] if s != t], ids=name)
def test_astype_between_integers_wraps(stream, source, target):
    x = integers_of(source)
    assert_same(run("astype", [x], target, stream), x.astype(target))  # NumPy wraps


# Floats a conversion to integers meets: NaN, infinities, fractions (which
# truncate toward zero) and values beyond each integer width.
FLOAT_VALUES = [NAN, INF, -INF, 2.7, -2.7, 0.5, -0.5, 127.0, -128.0, 300.0, -300.0,
                40000.0, -40000.0, 70000.0, 3e9, -3e9, 5e9, 1e19, -1e19, 1e20, -1e20]


def device_int(value, dtype, source=np.float32):
    """The device's float-to-integer conversion (PTX ``cvt.rzi``, which
    saturates): NaN gives 0 from float16 and float32 into 16 and 32 bits,
    the top bit of the conversion alone from float64 or into 64 bits (as on
    the H200),
    other values truncate toward zero and stop at
    the limits of ``dtype``, or of 16 bits for an 8-bit ``dtype``, whose
    low byte is stored."""
    info = np.iinfo(dtype)
    bits = max(info.bits, 16)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if info.min else (0, (1 << bits) - 1)
    if math.isnan(value):
        n = 1 << (bits - 1) if bits == 64 or np.dtype(source) == np.float64 else 0
    else:
        n = high if value >= high else low if value <= low else int(value)
    return np.array(n % (1 << info.bits), np.uint64).astype(dtype)  # keeps the low bits


@pytest.mark.parametrize("target", INTEGERS, ids=name)
@pytest.mark.parametrize("source", FLOATS, ids=name)
def test_astype_float_to_integer_saturates_and_takes_nan_to_zero(stream, source, target):
    x = array(FLOAT_VALUES, source)
    want = np.array([device_int(float(v), target, source) for v in x], target)
    assert_same(run("astype", [x], target, stream), want)


# The rule above, spelt out for a few targets.
SATURATED = {
    np.int32: {NAN: 0, INF: 2**31 - 1, -INF: -2**31, 1e20: 2**31 - 1, -1e20: -2**31,
               3e9: 2**31 - 1, 2.7: 2, -2.7: -2},
    np.uint32: {NAN: 0, INF: 2**32 - 1, -INF: 0, -1.0: 0, 5e9: 2**32 - 1, 2.7: 2},
    np.int64: {NAN: -2**63, INF: 2**63 - 1, -INF: -2**63, 1e20: 2**63 - 1, -1e20: -2**63},
    np.int8: {NAN: 0, 300.0: 44, 40000.0: -1, -40000.0: 0, INF: -1, -INF: 0},
    np.uint8: {NAN: 0, 300.0: 44, -1.0: 0, 70000.0: 255, INF: 255},
}


@pytest.mark.parametrize("target", list(SATURATED), ids=name)
def test_astype_float32_to_integer_gives_the_devices_values(stream, target):
    x = np.array(list(SATURATED[target]), np.float32)
    want = np.array(list(SATURATED[target].values()), target)
    assert_same(run("astype", [x], target, stream), want)


@pytest.mark.parametrize("source, target", [
    (np.float64, np.float32), (np.float64, np.float16), (np.float32, np.float16),
    (np.float16, np.float64)], ids=name)
def test_astype_between_floats_rounds_and_overflows_to_inf(stream, source, target):
    x = array([1e300, -1e300, 1e10, -1e10, 65520.0, 65504.0, 1e-300, NAN, INF, -0.0],
              source)
    with np.errstate(all="ignore"):
        want = x.astype(target)
    assert_same(run("astype", [x], target, stream), want)


@pytest.mark.parametrize("target", [np.float16, np.float32, np.float64], ids=name)
@pytest.mark.parametrize("source", [np.int64, np.uint64], ids=name)
def test_astype_integer_to_float_rounds_to_nearest(stream, source, target):
    x = integers_of(source)
    with np.errstate(all="ignore"):
        want = x.astype(target)
    assert_same(run("astype", [x], target, stream), want)


@pytest.mark.parametrize("source", FLOATS, ids=name)
def test_astype_float_to_bool_is_true_for_nan(stream, source):
    x = array([0.0, -0.0, NAN, INF, 0.5], source)
    assert_same(run("astype", [x], np.bool_, stream), np.array([0, 0, 1, 1, 1], np.bool_))


# ---------------------------------------------------------------- sums

def wrapped(total, dtype):
    """A Python integer wrapped to ``dtype``, as the device's integers wrap."""
    bits = np.iinfo(dtype).bits
    return np.array(total % (1 << bits), np.uint64).astype(dtype)


def row_sums(x, y, axis):
    """The exact sums of ``x * y``, whole (``axis`` None) or per row, as
    Python integers."""
    rows = (lambda a: a.reshape(1, -1)) if axis is None else (lambda a: a)
    return [sum(int(u) * int(v) for u, v in zip(rx, ry)) for rx, ry in zip(rows(x), rows(y))]


# Whole arrays: one block, and (on the simulator, 32 threads a block) parts
# and a finishing block; rows: a block per row, and rows cut into parts.
SHAPES = [((7,), None, 0), ((600,), None, 0), ((3, 7), -1, 0), ((2, 600), -1, 3)]


@pytest.fixture
def row_parts(monkeypatch):
    from numbagraph.ops import reduce as _reduce

    return lambda parts: monkeypatch.setattr(_reduce, "force_row_parts", parts)


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=name)
@pytest.mark.parametrize("shape, axis, parts", SHAPES, ids=name)
def test_integer_sum_wraps_in_the_output_dtype(stream, row_parts, dtype, shape, axis, parts):
    row_parts(parts)
    x = np.full(shape, np.iinfo(dtype).max // 3 + 7, dtype)  # any 4 overflow
    x.flat[::5] = np.iinfo(dtype).max - 3
    want = np.array([wrapped(total, dtype) for total in row_sums(x, np.ones_like(x), axis)], dtype)
    out_shape = (1,) if axis is None else shape[:1]
    assert_same(run("sum", [x], dtype, stream, out_shape, axis=axis), want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=name)
@pytest.mark.parametrize("shape, axis, parts", SHAPES, ids=name)
def test_integer_dot_wraps_in_the_output_dtype(stream, row_parts, dtype, shape, axis, parts):
    row_parts(parts)
    a = np.full(shape, 1 << (np.iinfo(dtype).bits - 4), dtype)
    b = np.full(shape, 3, dtype)  # every product overflows
    b.flat[::4] = 5
    want = np.array([wrapped(total, dtype) for total in row_sums(a, b, axis)], dtype)
    out_shape = (1,) if axis is None else shape[:1]
    assert_same(run("dot", [a, b], dtype, stream, out_shape, axis=axis), want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=name)
@pytest.mark.parametrize("m, k", [(3, 5), (2, 200)], ids=name)
def test_integer_matvec_wraps_in_the_output_dtype(stream, dtype, m, k):
    a = np.full((m, k), 1 << (np.iinfo(dtype).bits - 4), dtype)  # any 8 products overflow
    a[:, ::3] = 1 << (np.iinfo(dtype).bits - 5)
    x = np.arange(1, k + 1, dtype=dtype)
    want = np.array([wrapped(total, dtype) for total in row_sums(a, np.tile(x, (m, 1)), -1)],
                    dtype)
    assert_same(run("matvec", [a, x], dtype, stream, (m,)), want)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_float_sum_overflows_to_inf(stream, dtype):
    x = array([np.finfo(dtype).max] * 3, dtype)  # float16 sums in float32, stored as inf
    assert_same(run("sum", [x], dtype, stream, (1,)), np.array([INF], dtype))
