"""Row ops against NumPy: take/put at a device index, matvec and matmul,
softmax and the norms."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng

FLOATS = [np.float16, np.float32, np.float64]


def host(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-9, 10, size=shape).astype(dtype)
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)


def close(dtype):
    return {2: dict(rtol=5e-3, atol=5e-3), 4: dict(rtol=1e-5, atol=1e-5),
            8: dict(rtol=1e-12, atol=1e-12)}[np.dtype(dtype).itemsize]


# ---------------------------------------------------------------- take / put

@pytest.fixture
def table():
    return host(np.float32, (6, 5))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint16], ids=str)
def test_take_copies_the_row_at_a_device_index(stream, table, index_dtype):
    index = ng.DeviceScalar(4, dtype=index_dtype, stream=stream)
    out = ng.empty(5, np.float32)
    ng.take_into(cuda.to_device(table), index, out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), table[4])


def test_take_copies_the_row_at_a_python_index(stream, table):
    out = ng.empty((1, 5), np.float32)
    ng.take_into(cuda.to_device(table), 2, out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream)[0], table[2])


def test_take_reads_an_element_of_a_1d_table(stream):
    tokens = np.array([11, 12, 13, 14], np.int32)
    pos = ng.DeviceScalar(2, dtype=np.int32, stream=stream)
    token = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    ng.take_into(cuda.to_device(tokens), pos, token, stream=stream)
    assert token.value == 13


@pytest.mark.parametrize("bad", [-1, 6, 1000])
def test_take_at_an_index_out_of_range_writes_nothing(stream, table, bad):
    index = ng.DeviceScalar(bad, dtype=np.int64, stream=stream)
    out = ng.zeros(5, np.float32, stream=stream)
    ng.take_into(cuda.to_device(table), index, out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 0.0)


def test_put_writes_the_row_at_a_device_index(stream, table):
    cache = cuda.to_device(table)
    row = host(np.float32, 5, seed=3)
    pos = ng.DeviceScalar(1, dtype=np.int32, stream=stream)
    ng.put_into(cuda.to_device(row), pos, cache, stream=stream)
    want = table.copy()
    want[1] = row
    np.testing.assert_array_equal(cache.copy_to_host(stream=stream), want)


@pytest.mark.parametrize("value", [0.5, "scalar"])
def test_put_fills_a_row_with_a_scalar(stream, table, value):
    cache = cuda.to_device(table)
    if value == "scalar":
        value = ng.DeviceScalar(0.5, dtype=np.float32, stream=stream)
    ng.put_into(value, 3, cache, stream=stream)
    want = table.copy()
    want[3] = 0.5
    np.testing.assert_array_equal(cache.copy_to_host(stream=stream), want)


def test_put_writes_an_element_of_a_1d_table(stream):
    log = ng.zeros(4, np.int64, stream=stream)
    pos = ng.DeviceScalar(3, dtype=np.int64, stream=stream)
    ng.put_into(ng.DeviceScalar(9, dtype=np.int64, stream=stream), pos, log, stream=stream)
    np.testing.assert_array_equal(log.copy_to_host(stream=stream), [0, 0, 0, 9])


@pytest.mark.parametrize("bad", [-3, 6])
def test_put_at_an_index_out_of_range_writes_nothing(stream, table, bad):
    cache = cuda.to_device(table)
    pos = ng.DeviceScalar(bad, dtype=np.int32, stream=stream)
    ng.put_into(ng.zeros(5, np.float32, stream=stream), pos, cache, stream=stream)
    np.testing.assert_array_equal(cache.copy_to_host(stream=stream), table)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s, t: ng.take_into(t, 6, ng.empty(5, np.float32), stream=s), "outside"),
        (lambda s, t: ng.take_into(t, 0, ng.empty(4, np.float32), stream=s), "shape"),
        (lambda s, t: ng.take_into(t, 0, ng.empty(5, np.float64), stream=s), "dtype"),
        (lambda s, t: ng.take_into(t, ng.DeviceScalar(1.0, stream=s), ng.empty(5, np.float32),
                                   stream=s), "integer"),
        (lambda s, t: ng.take_into(t, 0, t[0], stream=s), "overlaps"),
        (lambda s, t: ng.put_into(ng.empty(3, np.float32), 0, t, stream=s), "shape"),
        (lambda s, t: ng.put_into(1.0, True, t, stream=s), "bool"),
    ],
    ids=["python-index", "out-shape", "out-dtype", "float-index", "overlap", "src-shape",
         "bool-index"],
)
def test_take_and_put_refuse_bad_calls(stream, table, call, message):
    with pytest.raises(ng.OpError, match=message):
        call(stream, cuda.to_device(table))


# ---------------------------------------------------------------- linear algebra

@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64], ids=str)
def test_matvec_matches_numpy(stream, dtype):
    a, x = host(dtype, (5, 37), seed=1), host(dtype, 37, seed=2)
    out = ng.empty(5, dtype)
    ng.matvec_into(cuda.to_device(a), cuda.to_device(x), out, stream=stream)
    wide = np.float64 if np.dtype(dtype).kind == "f" else np.int64
    want = (a.astype(wide) @ x.astype(wide)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(out.copy_to_host(stream=stream), want, **close(dtype))
    else:
        np.testing.assert_array_equal(out.copy_to_host(stream=stream), want)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("m, k, n", [(5, 7, 6), (1, 9, 4), (3, 1, 2)], ids=str)
def test_matmul_matches_numpy(stream, dtype, m, k, n):
    a, b = host(dtype, (m, k), seed=1), host(dtype, (k, n), seed=2)
    out = ng.empty((m, n), dtype)
    ng.matmul_into(cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want, **close(dtype))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: ng.matvec_into(ng.empty((3, 4), np.float32), ng.empty(3, np.float32),
                                  ng.empty(3, np.float32), stream=s), "shape"),
        (lambda s: ng.matvec_into(ng.empty(4, np.float32), ng.empty(4, np.float32),
                                  ng.empty(1, np.float32), stream=s), "2-D"),
        (lambda s: ng.matmul_into(ng.empty((2, 3), np.float32), ng.empty((4, 2), np.float32),
                                  ng.empty((2, 2), np.float32), stream=s), "do not fit"),
        (lambda s: ng.matmul_into(ng.empty((2, 2), np.int32), ng.empty((2, 2), np.int32),
                                  ng.empty((2, 2), np.int32), stream=s), "int32"),
        (lambda s: ng.matmul_into(ng.empty((2, 2), np.float32), ng.empty((2, 2), np.float64),
                                  ng.empty((2, 2), np.float32), stream=s), "float64"),
    ],
    ids=["matvec-shape", "matvec-1d", "matmul-shapes", "matmul-int32", "matmul-mixed"],
)
def test_linear_algebra_refuses_bad_calls(stream, call, message):
    with pytest.raises(ng.OpError, match=message):
        call(stream)


def test_matmul_refuses_an_output_that_is_an_input(stream):
    a = ng.zeros((3, 3), np.float32, stream=stream)
    with pytest.raises(ng.OpError, match="overlaps"):
        ng.matmul_into(a, a, a, stream=stream)


# ---------------------------------------------------------------- softmax and norms

def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layernorm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * (1 if w is None else w)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", [(3, 37), (37,)], ids=str)
def test_softmax_over_rows(stream, dtype, shape):
    x = host(dtype, shape) * 3
    out = ng.empty(shape, dtype)
    ng.softmax_into(cuda.to_device(x), out, stream=stream)
    got = out.copy_to_host(stream=stream)
    np.testing.assert_allclose(got, softmax(x.astype(np.float64)), **close(dtype))


def test_softmax_ignores_minus_infinity(stream):
    x = np.array([[1.0, -np.inf, 2.0, -np.inf]], np.float32)
    out = ng.empty((1, 4), np.float32)
    ng.softmax_into(cuda.to_device(x), out, stream=stream)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), softmax(x), rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_layernorm_over_rows(stream, dtype, affine):
    x = host(dtype, (3, 37))
    w, b = (host(dtype, 37, seed=5), host(dtype, 37, seed=6)) if affine else (None, None)
    out = ng.empty((3, 37), dtype)
    ng.layernorm_into(cuda.to_device(x), None if w is None else cuda.to_device(w),
                      None if b is None else cuda.to_device(b), out, eps=1e-5, stream=stream)
    want = layernorm(x.astype(np.float64), w, b, 1e-5)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want, **close(dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("weighted", [True, False], ids=["weighted", "plain"])
def test_rmsnorm_over_rows(stream, dtype, weighted):
    x = host(dtype, (3, 37))
    w = host(dtype, 37, seed=5) if weighted else None
    out = ng.empty((3, 37), dtype)
    ng.rmsnorm_into(cuda.to_device(x), None if w is None else cuda.to_device(w), out,
                    eps=1e-6, stream=stream)
    want = rmsnorm(x.astype(np.float64), w, 1e-6)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want, **close(dtype))


def test_norms_may_write_over_their_input(stream):
    x = host(np.float32, (2, 37))
    inout = cuda.to_device(x)
    ng.rmsnorm_into(inout, None, inout, stream=stream)
    np.testing.assert_allclose(inout.copy_to_host(stream=stream), rmsnorm(x, None, 1e-6),
                               rtol=1e-5)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: ng.softmax_into(ng.empty((2, 3), np.int32), ng.empty((2, 3), np.int32),
                                   stream=s), "int32"),
        (lambda s: ng.softmax_into(ng.empty((2, 3), np.float32), ng.empty((3, 2), np.float32),
                                   stream=s), "shape"),
        (lambda s: ng.rmsnorm_into(ng.empty((2, 3), np.float32), ng.empty(2, np.float32),
                                   ng.empty((2, 3), np.float32), stream=s), "weight"),
        (lambda s: ng.layernorm_into(ng.empty((2, 3), np.float32), None,
                                     ng.empty(3, np.float64), ng.empty((2, 3), np.float32),
                                     stream=s), "bias"),
        (lambda s: ng.layernorm_into(ng.empty((2, 3), np.float32), None, None,
                                     ng.empty((2, 3), np.float32), eps=-1.0, stream=s), "eps"),
    ],
    ids=["int", "out-shape", "weight-shape", "bias-dtype", "negative-eps"],
)
def test_row_ops_refuse_bad_calls(stream, call, message):
    with pytest.raises(ng.OpError, match=message):
        call(stream)


def test_row_op_out_partly_over_x_is_refused(stream):
    x = cuda.to_device(np.random.default_rng(0).random((5, 8), np.float32), stream=stream)
    with pytest.raises(ng.OpError, match="shares memory with out"):
        ng.softmax_into(x[:4], x[1:], stream=stream)


def test_row_op_out_over_its_weight_is_refused(stream):
    x = cuda.to_device(np.ones((2, 8), np.float32), stream=stream)
    out = cuda.to_device(np.zeros((2, 8), np.float32), stream=stream)
    with pytest.raises(ng.OpError, match="overlaps weight"):
        ng.rmsnorm_into(x, out[0], out, stream=stream)


def test_row_op_may_compute_in_place(stream):
    a = np.random.default_rng(1).random((3, 8)).astype(np.float32)
    x = cuda.to_device(a, stream=stream)
    ng.softmax_into(x, x, stream=stream)
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(x.copy_to_host(stream=stream), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5)


# ---------------------------------------------------------------- long rows split over blocks

@pytest.fixture
def split(monkeypatch, stream):
    """Row ops cut every row into three parts, one block each, and the
    stream starts without scratch, so that ``took_split`` can tell."""
    from numbagraph.backend import active
    from numbagraph.ops import reduce as _reduce

    monkeypatch.setattr(_reduce, "force_row_parts", 3)
    key = (active.stream_handle(stream), active.current_device_id())
    _reduce._scratch.pop(key, None)

    def took_split(dtype):
        acc = np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)
        return (acc.str, False, 2) in _reduce._scratch.get(key, {})
    return took_split


ROW_OPS = {
    "softmax": (lambda x, w, b, out, s: ng.softmax_into(x, out, stream=s),
                lambda x, w, b: softmax(x)),
    "layernorm": (lambda x, w, b, out, s: ng.layernorm_into(x, w, b, out, eps=1e-5, stream=s),
                  lambda x, w, b: layernorm(x, w, b, 1e-5)),
    "rmsnorm": (lambda x, w, b, out, s: ng.rmsnorm_into(x, w, out, eps=1e-6, stream=s),
                lambda x, w, b: rmsnorm(x, w, 1e-6)),
}


def _row_case(op, dtype, shape, seed=0):
    x = host(dtype, shape, seed=seed) * (3 if op == "softmax" else 1)
    cols = shape[-1]
    w = host(dtype, cols, seed=seed + 5) if op != "softmax" else None
    b = host(dtype, cols, seed=seed + 6) if op == "layernorm" else None
    want = ROW_OPS[op][1](x.astype(np.float64), None if w is None else w.astype(np.float64),
                          None if b is None else b.astype(np.float64))
    return x, w, b, want


def _dev(a):
    return None if a is None else cuda.to_device(a)


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, 77), (3, 40), (2, 101), (77,)], ids=str)
def test_split_rows_match_numpy(stream, split, op, dtype, shape):
    x, w, b, want = _row_case(op, dtype, shape)
    out = ng.empty(shape, dtype)
    ROW_OPS[op][0](cuda.to_device(x), _dev(w), _dev(b), out, stream)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want, **close(dtype))
    assert split(dtype)


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_split_rows_match_one_block_per_row(stream, split, op, monkeypatch):
    from numbagraph.ops import reduce as _reduce

    x, w, b, _ = _row_case(op, np.float32, (2, 77), seed=3)
    got = []
    for parts in (3, 1):
        monkeypatch.setattr(_reduce, "force_row_parts", parts)
        out = ng.empty((2, 77), np.float32)
        ROW_OPS[op][0](cuda.to_device(x), _dev(w), _dev(b), out, stream)
        got.append(out.copy_to_host(stream=stream))
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6, atol=1e-7)


def test_split_softmax_of_large_values_and_minus_infinity(stream, split):
    x = host(np.float32, (2, 70)) * np.float32(1e4)
    x[0, :40] = -np.inf          # whole parts of -inf add nothing
    x[1, 5] = np.float32(3e38)   # one value far above the rest
    out = ng.empty((2, 70), np.float32)
    ng.softmax_into(cuda.to_device(x), out, stream=stream)
    got = out.copy_to_host(stream=stream)
    np.testing.assert_allclose(got, softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)
    assert np.all(np.isfinite(got))


def test_split_layernorm_of_constant_rows_is_zero_plus_bias(stream, split):
    x = np.full((2, 70), 123.25, np.float32)
    bias = host(np.float32, 70, seed=4)
    out = ng.empty((2, 70), np.float32)
    ng.layernorm_into(cuda.to_device(x), None, cuda.to_device(bias), out, stream=stream)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), np.broadcast_to(bias, (2, 70)),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_split_rows_with_a_nan_are_nan_as_with_one_block(stream, split, op, monkeypatch):
    from numbagraph.ops import reduce as _reduce

    x, w, b, _ = _row_case(op, np.float32, (2, 70))
    x[1, 60] = np.nan
    got = []
    for parts in (3, 1):
        monkeypatch.setattr(_reduce, "force_row_parts", parts)
        out = ng.empty((2, 70), np.float32)
        ROW_OPS[op][0](cuda.to_device(x), _dev(w), _dev(b), out, stream)
        got.append(out.copy_to_host(stream=stream))
    assert np.isnan(got[0][1]).all() and not np.isnan(got[0][0]).any()
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(got[1]))


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_split_rows_in_a_capture_replay_on_new_data(stream, split, op):
    x, w, b, _ = _row_case(op, np.float32, (2, 77))
    x_dev, w_dev, b_dev = cuda.to_device(x), _dev(w), _dev(b)
    out = ng.empty((2, 77), np.float32)
    with ng.capture(stream) as cap:
        ROW_OPS[op][0](x_dev, w_dev, b_dev, out, stream)
    for seed in (1, 2):
        x2 = host(np.float32, (2, 77), seed=seed) * 3
        x_dev.copy_to_device(x2, stream=stream)
        cap.graph.launch()
        want = ROW_OPS[op][1](x2.astype(np.float64), w, b)
        np.testing.assert_allclose(out.copy_to_host(stream=stream), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_split_rows_remembered_eager_call_reads_new_data(stream, split, op):
    x, w, b, want = _row_case(op, np.float32, (1, 77))
    x_dev, w_dev, b_dev, out = cuda.to_device(x), _dev(w), _dev(b), ng.empty((1, 77), np.float32)
    for _ in range(3):
        ROW_OPS[op][0](x_dev, w_dev, b_dev, out, stream)
        np.testing.assert_allclose(out.copy_to_host(stream=stream), want, rtol=1e-5, atol=1e-5)
    x2 = host(np.float32, (1, 77), seed=9) * 2
    x_dev.copy_to_device(x2, stream=stream)
    ROW_OPS[op][0](x_dev, w_dev, b_dev, out, stream)
    np.testing.assert_allclose(out.copy_to_host(stream=stream),
                               ROW_OPS[op][1](x2.astype(np.float64), w, b), rtol=1e-5, atol=1e-5)
    assert split(np.float32)


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_split_rows_into_a_graph_owned_output(stream, split, op):
    x, w, b, want = _row_case(op, np.float32, (2, 77))
    kept = ng.zeros((2, 77), np.float32, stream=stream)
    x_dev, w_dev, b_dev = cuda.to_device(x), _dev(w), _dev(b)
    with ng.capture(stream) as cap:
        out = ng.empty((2, 77), np.float32)
        ROW_OPS[op][0](x_dev, w_dev, b_dev, out, stream)
        ng.copy_into(out, kept, stream=stream)
        ng.free(out)
    for _ in range(2):
        cap.graph.launch()
        np.testing.assert_allclose(kept.copy_to_host(stream=stream), want, rtol=1e-5, atol=1e-5)


def test_rows_are_split_only_when_few_and_long():
    from numbagraph.backend import active
    from numbagraph.ops.reduce import SPLIT_BELOW_ROWS_PER_SM, _max_parts, row_parts

    sms, threads = active.launch_limits()
    long_row = 8 * threads * 5
    assert row_parts(1, long_row, 8) == min(5, _max_parts())
    assert row_parts(1, 8 * threads * 2 - 1, 8) == 1
    assert row_parts(sms * SPLIT_BELOW_ROWS_PER_SM, long_row, 8) == 1
    assert row_parts(2, 8 * threads * 10**6, 8) * 2 <= _max_parts()


# ---------------------------------------------------------------- rows held in registers

@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=str)
def test_rows_held_give_the_bits_of_rows_read_once_per_pass(stream, op, dtype, monkeypatch):
    from numbagraph.backend import active
    from numbagraph.ops import nn

    _, threads = active.launch_limits()
    # one element short of every held size, and one over the last
    shapes = [(3, 4 * threads - 1), (2, 8 * threads - 1), (1, 16 * threads - 1),
              (2, 16 * threads + 1), (4, 5)]
    for shape in shapes:
        x, w, b, want = _row_case(op, dtype, shape, seed=shape[1])
        got = []
        for most in (16, 0):
            monkeypatch.setattr(nn, "HELD_MOST", most)
            out = ng.empty(shape, dtype)
            ROW_OPS[op][0](cuda.to_device(x), _dev(w), _dev(b), out, stream)
            got.append(out.copy_to_host(stream=stream))
        np.testing.assert_array_equal(got[0], got[1])
        np.testing.assert_allclose(got[0], want, **close(dtype))


@pytest.mark.parametrize("most", [4, 16])
def test_row_length_decides_what_each_thread_holds(monkeypatch, most):
    from numbagraph.ops import nn

    monkeypatch.setattr(nn, "HELD_MOST", most)
    assert nn.held_per_thread(1, 32) == 4
    assert nn.held_per_thread(4 * 32, 32) == 4
    assert nn.held_per_thread(4 * 32 + 1, 32) == (8 if most > 4 else 0)
    assert nn.held_per_thread(most * 32, 32) == most
    assert nn.held_per_thread(most * 32 + 1, 32) == 0
    monkeypatch.setattr(nn, "HELD_MOST", 0)
    assert nn.held_per_thread(1, 32) == 0


def test_held_rows_may_be_computed_in_place(stream):
    x = host(np.float32, (3, 50))
    inout = cuda.to_device(x)
    ng.layernorm_into(inout, None, None, inout, stream=stream)
    np.testing.assert_allclose(inout.copy_to_host(stream=stream),
                               layernorm(x.astype(np.float64), None, None, 1e-5),
                               rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- float32 rows four at a time

def _offset(a, elements, stream):
    """``a`` on the device, starting ``elements`` float32 past an allocation
    (so 4 * elements bytes off a multiple of 16 for 1..3)."""
    if a is None:
        return None
    buf = ng.empty(a.size + elements, np.float32)
    dev = buf[elements:].reshape(a.shape)
    dev.copy_to_device(a, stream=stream)
    return dev


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_float32_rows_of_quads_are_the_same_bits_aligned_or_not(stream, op):
    from numbagraph.backend import active

    _, threads = active.launch_limits()
    # one quad; a group per thread, exactly; a quad short of two; four; a quad over
    _same_bits_aligned_or_not(stream, op, [(3, 4), (2, 4 * threads), (3, 8 * threads - 4),
                                           (1, 16 * threads), (2, 16 * threads + 4), (40,)])


@pytest.mark.parametrize("op", list(ROW_OPS))
def test_split_float32_rows_of_quads_are_the_same_bits_aligned_or_not(stream, split, op):
    # parts of whole quads: 40 in 3 parts of 16, 16 and 8; 1000 in 336, 336, 328
    _same_bits_aligned_or_not(stream, op, [(2, 40), (1, 1000), (3, 12)])
    assert split(np.float32)


def _same_bits_aligned_or_not(stream, op, shapes):
    for shape in shapes:
        x, w, b, want = _row_case(op, np.float32, shape, seed=shape[-1])
        got = []
        for elements in (0, 1, 3):
            out = _offset(np.zeros(shape, np.float32), elements, stream)
            ROW_OPS[op][0](_offset(x, elements, stream), _offset(w, elements, stream),
                           _offset(b, elements, stream), out, stream)
            got.append(out.copy_to_host(stream=stream))
        np.testing.assert_array_equal(got[1], got[0])
        np.testing.assert_array_equal(got[2], got[0])
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_float32_rows_of_a_multiple_of_four_move_in_quads():
    from numbagraph.ops import nn

    f32 = np.dtype(np.float32)
    assert nn.quads_per_thread(f32, 4, 32) == 1
    assert nn.quads_per_thread(f32, 4 * 32, 32) == 1
    assert nn.quads_per_thread(f32, 4 * 32 + 4, 32) == 2
    assert nn.quads_per_thread(f32, 16 * 32, 32) == 4
    assert nn.quads_per_thread(f32, 16 * 32 + 4, 32) == 0      # read once per pass
    assert nn.quads_per_thread(f32, 4 * 32 + 2, 32) == 0       # not a multiple of 4
    assert nn.quads_per_thread(np.dtype(np.float16), 64, 32) == 0


def test_a_captured_row_op_of_quads_rebinds_only_on_its_alignment(stream):
    x, w, b, want = _row_case("layernorm", np.float32, (3, 64), seed=1)
    x_dev, out = cuda.to_device(x), ng.empty((3, 64), np.float32)
    w_dev, b_dev = cuda.to_device(w), cuda.to_device(b)
    ng.layernorm_into(x_dev, w_dev, b_dev, out, stream=stream)
    with ng.capture(stream) as cap:
        ng.layernorm_into(x_dev, w_dev, b_dev, out, stream=stream)
    x2 = host(np.float32, (3, 64), seed=2)
    want2 = layernorm(x2.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1e-5)
    x2_dev = cuda.to_device(x2)
    cap.graph.rebind({x_dev: x2_dev})
    cap.graph.launch()
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want2, rtol=1e-5, atol=1e-5)
    # The graph reads x2_dev now, with 128-bit loads on the driver.
    off = _offset(x, 1, stream)
    with pytest.raises(ng.RebindError, match="16 bytes at a time.*4 bytes off"):
        cap.graph.rebind({x2_dev: off})
    cap.graph.launch()       # unchanged, still on x2
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want2, rtol=1e-5, atol=1e-5)


def test_a_graph_updated_from_another_keeps_its_own_alignment_record(stream):
    x, y = _offset(host(np.float32, (3, 64)), 0, stream), _offset(host(np.float32, (3, 64), 1),
                                                                  0, stream)
    out = ng.empty((3, 64), np.float32)
    ng.softmax_into(x, out, stream=stream)
    with ng.capture(stream) as first:
        ng.softmax_into(x, out, stream=stream)
    with ng.capture(stream) as second:
        ng.softmax_into(y, out, stream=stream)
    first.graph.update(second.graph)
    first.graph.rebind({y: _offset(host(np.float32, (3, 64), 2), 0, stream)})
    # second still reads y, and still may not move off alignment
    with pytest.raises(ng.RebindError, match="16 bytes at a time"):
        second.graph.rebind({y: _offset(host(np.float32, (3, 64), 3), 1, stream)})


def test_rebinding_a_view_leaves_the_alignment_record_of_the_whole_array(stream):
    x = _offset(host(np.float32, (2, 64)), 0, stream)
    out, out_row = ng.empty((2, 64), np.float32), ng.empty(64, np.float32)
    row = x[1]
    ng.softmax_into(x, out, stream=stream)
    ng.softmax_into(row, out_row, stream=stream)
    with ng.capture(stream) as cap:
        ng.softmax_into(x, out, stream=stream)
        ng.softmax_into(row, out_row, stream=stream)
    cap.graph.rebind({row: _offset(host(np.float32, 64, 5), 0, stream)})
    with pytest.raises(ng.RebindError, match="16 bytes at a time"):
        cap.graph.rebind({x: _offset(host(np.float32, (2, 64), 6), 1, stream)})


def test_a_rebound_quad_kernel_lets_its_old_array_go(stream):
    import gc
    import weakref

    x = cuda.to_device(host(np.float32, (3, 64)))
    out = ng.empty((3, 64), np.float32)
    ng.softmax_into(x, out, stream=stream)
    with ng.capture(stream) as cap:
        ng.softmax_into(x, out, stream=stream)
    gone = weakref.ref(x)
    cap.graph.rebind({x: cuda.to_device(host(np.float32, (3, 64), 1))})
    del x
    gc.collect()
    assert gone() is None
