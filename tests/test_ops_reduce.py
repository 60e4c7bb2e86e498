"""Reductions against NumPy, whole arrays and rows, and their determinism."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active

ARITHMETIC = [np.float16, np.float32, np.float64, np.int32, np.int64]
FLOATS = [np.float16, np.float32, np.float64]
THREADS = active.launch_limits()[1]
# Long enough that the reduction is split over several blocks.
MANY = 4 * THREADS + 5


def host(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 51, size=shape).astype(dtype)
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)


def wide(x):
    return x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64)


REFERENCE = {
    "sum": lambda x, axis: wide(x).sum(axis=axis),
    "mean": lambda x, axis: wide(x).mean(axis=axis),
    "max": lambda x, axis: x.max(axis=axis),
    "min": lambda x, axis: x.min(axis=axis),
    "norm2": lambda x, axis: np.sqrt((wide(x) ** 2).sum(axis=axis)),
    "argmax": lambda x, axis: x.argmax(axis=axis),
    "argmin": lambda x, axis: x.argmin(axis=axis),
}
FLOAT_ONLY = {"mean", "norm2"}


def cases(sizes):
    for op in REFERENCE:
        for dtype in FLOATS if op in FLOAT_ONLY else ARITHMETIC:
            for n in sizes:
                yield pytest.param(op, np.dtype(dtype), n, id=f"{op}-{np.dtype(dtype).name}-{n}")


def out_dtype(op, dtype):
    return np.int64 if op.startswith("arg") else dtype


def check(got, want, dtype):
    if np.dtype(dtype).kind == "f":
        rtol = {2: 5e-3, 4: 1e-5, 8: 1e-12}[np.dtype(dtype).itemsize]
        np.testing.assert_allclose(np.float64(got), np.float64(want), rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(got, np.asarray(want).astype(dtype))


@pytest.mark.parametrize("op, dtype, n", list(cases([1, 37])))
def test_whole_array_into_a_device_scalar(stream, op, dtype, n):
    x = host(dtype, n)
    out = ng.DeviceScalar(0, dtype=out_dtype(op, dtype), stream=stream)
    getattr(ng, f"{op}_into")(cuda.to_device(x), out, stream=stream)
    check(out.value, REFERENCE[op](x, None), out_dtype(op, dtype))


@pytest.mark.parametrize(
    "op, dtype, n",
    [c for c in cases([MANY]) if c.values[1] in (np.float32, np.int32, np.float16)],
)
def test_long_arrays_reduce_over_many_blocks(stream, op, dtype, n):
    x = host(dtype, n)
    out = ng.zeros(1, out_dtype(op, dtype), stream=stream)
    getattr(ng, f"{op}_into")(cuda.to_device(x), out, stream=stream)
    check(out.copy_to_host(stream=stream)[0], REFERENCE[op](x, None), out_dtype(op, dtype))


def _long_enough_for_every_part_to_loop():
    """Every part takes two whole tiles, one part a third, partial one."""
    from numbagraph.ops import _reduce_kernels
    from numbagraph.ops.reduce import _max_parts

    tile = _reduce_kernels.ADDITIVE_UNROLL * active.launch_limits()[1]
    return 2 * _max_parts() * tile + tile // 2 + 5


LONGEST = _long_enough_for_every_part_to_loop()


@pytest.mark.parametrize("op", ["sum", "dot", "argmax", "min"])
def test_longest_arrays_loop_within_every_part(stream, op):
    x, y = host(np.float32, LONGEST, seed=1), host(np.float32, LONGEST, seed=2)
    out = ng.DeviceScalar(0, dtype=out_dtype(op, np.float32), stream=stream)
    if op == "dot":
        ng.dot_into(cuda.to_device(x), cuda.to_device(y), out, stream=stream)
        want = (wide(x) * wide(y)).sum()
    else:
        getattr(ng, f"{op}_into")(cuda.to_device(x), out, stream=stream)
        want = REFERENCE[op](x, None)
    check(out.value, want, out_dtype(op, np.float32))


@pytest.mark.parametrize("op", ["sum", "norm2", "dot", "max", "argmin"])
def test_long_rows_loop_within_the_block(stream, op, monkeypatch):
    from numbagraph.ops import reduce as _reduce

    monkeypatch.setattr(_reduce, "force_row_parts", 1)  # one block per row
    cols = 8 * THREADS + 37
    x, y = host(np.float64, (2, cols), seed=1), host(np.float64, (2, cols), seed=2)
    out = ng.empty(2, out_dtype(op, np.float64))
    if op == "dot":
        ng.dot_into(cuda.to_device(x), cuda.to_device(y), out, axis=-1, stream=stream)
        want = (x * y).sum(axis=1)
    else:
        getattr(ng, f"{op}_into")(cuda.to_device(x), out, axis=-1, stream=stream)
        want = REFERENCE[op](x, 1)
    check(out.copy_to_host(stream=stream), want, out_dtype(op, np.float64))


@pytest.mark.parametrize("op, dtype, n", list(cases([3])))
def test_each_row_into_a_vector(stream, op, dtype, n):
    x = host(dtype, (n, 37))
    out = ng.empty(n, out_dtype(op, dtype))
    getattr(ng, f"{op}_into")(cuda.to_device(x), out, axis=-1, stream=stream)
    check(out.copy_to_host(stream=stream), REFERENCE[op](x, 1), out_dtype(op, dtype))


@pytest.mark.parametrize("dtype", ARITHMETIC, ids=str)
@pytest.mark.parametrize("axis", [None, -1])
def test_dot(stream, dtype, axis):
    a, b = host(dtype, (3, 21), seed=1), host(dtype, (3, 21), seed=2)
    out = ng.empty(3 if axis == -1 else 1, dtype)
    ng.dot_into(cuda.to_device(a), cuda.to_device(b), out, axis=axis, stream=stream)
    want = (wide(a) * wide(b)).sum(axis=axis)
    check(out.copy_to_host(stream=stream) if axis else out.copy_to_host(stream=stream)[0],
          want, dtype)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint32], ids=str)
def test_argmax_takes_the_first_of_equal_maxima(stream, index_dtype):
    x = np.array([1, 5, 2, 5, 5, 0], np.float32)
    out = ng.DeviceScalar(0, dtype=index_dtype, stream=stream)
    ng.argmax_into(cuda.to_device(x), out, stream=stream)
    assert out.value == 1


@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin"])
def test_nan_wins_max_and_min_as_in_numpy(stream, op):
    x = np.array([1.0, np.nan, 3.0, np.nan, -1.0], np.float64)
    out = ng.DeviceScalar(0, dtype=out_dtype(op, np.float64), stream=stream)
    getattr(ng, f"{op}_into")(cuda.to_device(x), out, stream=stream)
    want = REFERENCE[op](x, None)
    assert (np.isnan(out.value) if not op.startswith("arg") else out.value == want)


def test_sum_of_nothing_is_zero(stream):
    out = ng.DeviceScalar(7.0, dtype=np.float32, stream=stream)
    ng.sum_into(ng.empty(0, np.float32), out, stream=stream)
    assert out.value == 0.0


def test_one_element_array_as_output(stream):
    x = host(np.float64, 37)
    out = ng.empty((1, 1), np.float64)
    ng.sum_into(cuda.to_device(x), out, stream=stream)
    np.testing.assert_allclose(out.copy_to_host(stream=stream)[0, 0], x.sum(), rtol=1e-12)


@pytest.mark.parametrize("n", [37, MANY])
def test_same_input_gives_the_same_bits_every_time(stream, n):
    x = cuda.to_device(host(np.float32, n) * np.float32(1e3))
    out = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    results = set()
    for _ in range(3):
        ng.sum_into(x, out, stream=stream)
        results.add(np.float32(out.value).tobytes())
    assert len(results) == 1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: ng.max_into(ng.empty(0, np.float32), ng.empty(1, np.float32), stream=s),
         "empty"),
        (lambda s: ng.mean_into(ng.empty(4, np.int32), ng.empty(1, np.int32), stream=s),
         "int32"),
        (lambda s: ng.sum_into(ng.empty(4, np.float32), ng.empty(2, np.float32), stream=s),
         "one-element"),
        (lambda s: ng.sum_into(ng.empty(4, np.float32), ng.empty(1, np.float64), stream=s),
         "float64"),
        (lambda s: ng.argmax_into(ng.empty(4, np.float32), ng.empty(1, np.float32), stream=s),
         "float32"),
        (lambda s: ng.sum_into(ng.empty((2, 3), np.float32), ng.empty(3, np.float32), axis=0,
                               stream=s), "axis"),
        (lambda s: ng.sum_into(ng.empty((2, 3), np.float32), ng.empty(3, np.float32), axis=-1,
                               stream=s), "one element per row"),
        (lambda s: ng.dot_into(ng.empty(4, np.float32), ng.empty(5, np.float32),
                               ng.empty(1, np.float32), stream=s), "shape"),
    ],
    ids=["max-of-empty", "mean-of-ints", "out-too-big", "out-dtype", "argmax-into-float",
         "axis-0", "rows-out-shape", "dot-shapes"],
)
def test_refuses_bad_calls(stream, call, message):
    with pytest.raises(ng.OpError, match=message):
        call(stream)


# ---------------------------------------------------------------- long rows split over blocks

@pytest.fixture
def split(monkeypatch, stream):
    """Row reductions cut every row into three parts, one block each; the
    stream starts without scratch, so that ``took_split`` can tell."""
    from numbagraph.ops import reduce as _reduce

    monkeypatch.setattr(_reduce, "force_row_parts", 3)
    key = (active.stream_handle(stream), active.current_device_id())
    _reduce._scratch.pop(key, None)
    return lambda: bool(_reduce._scratch.get(key))


# Over two tiles of a sum's part, and not a multiple of the block.
SPLIT_COLS = 2 * 8 * THREADS + 37


def split_cases():
    for op in REFERENCE:
        for dtype in FLOATS[:2] if op in FLOAT_ONLY else [np.float16, np.float32, np.int32]:
            for rows in (1, 3):
                yield pytest.param(op, np.dtype(dtype), rows,
                                   id=f"{op}-{np.dtype(dtype).name}-{rows}")


@pytest.mark.parametrize("op, dtype, rows", list(split_cases()))
def test_split_rows_reduce_as_numpy(stream, split, op, dtype, rows):
    x = host(dtype, (rows, SPLIT_COLS), seed=rows)
    out = ng.empty(rows, out_dtype(op, dtype))
    getattr(ng, f"{op}_into")(cuda.to_device(x), out, axis=-1, stream=stream)
    check(out.copy_to_host(stream=stream), REFERENCE[op](x, 1), out_dtype(op, dtype))
    assert split()


def test_split_row_dot_as_numpy(stream, split):
    a, b = host(np.float32, (2, SPLIT_COLS), seed=1), host(np.float32, (2, SPLIT_COLS), seed=2)
    out = ng.empty(2, np.float32)
    ng.dot_into(cuda.to_device(a), cuda.to_device(b), out, axis=-1, stream=stream)
    check(out.copy_to_host(stream=stream), (wide(a) * wide(b)).sum(axis=1), np.float32)
    assert split()


@pytest.mark.parametrize("op", ["max", "argmin", "argmax"])
def test_split_rows_keep_nan_and_the_first_extreme(stream, split, op):
    x = np.zeros((2, SPLIT_COLS), np.float32)
    x[0, [40, SPLIT_COLS - 3]] = np.nan
    x[1, [7, SPLIT_COLS - 1]] = 5.0 if op != "argmin" else -5.0
    out = ng.empty(2, out_dtype(op, np.float32))
    getattr(ng, f"{op}_into")(cuda.to_device(x), out, axis=-1, stream=stream)
    got = out.copy_to_host(stream=stream)
    if op == "max":
        assert np.isnan(got[0]) and got[1] == 5.0
    else:
        np.testing.assert_array_equal(got, [40, 7])


@pytest.mark.parametrize("op", ["sum", "mean", "argmax"])
def test_split_rows_match_one_block_per_row(stream, split, op, monkeypatch):
    from numbagraph.ops import reduce as _reduce

    # positive, so that the sums do not cancel below float32 rounding
    x = cuda.to_device((host(np.float32, (2, SPLIT_COLS), seed=4) + np.float32(3)) * 100)
    got = []
    for parts in (3, 1):
        monkeypatch.setattr(_reduce, "force_row_parts", parts)
        out = ng.empty(2, out_dtype(op, np.float32))
        getattr(ng, f"{op}_into")(x, out, axis=-1, stream=stream)
        got.append(out.copy_to_host(stream=stream))
    check(got[0], got[1], out_dtype(op, np.float32))


@pytest.mark.parametrize("op", ["sum", "norm2", "argmax", "min"])
def test_split_rows_in_a_capture_replay_on_new_data(stream, split, op):
    x = cuda.to_device(host(np.float32, (2, SPLIT_COLS)))
    out = ng.empty(2, out_dtype(op, np.float32))
    with ng.capture(stream) as cap:
        getattr(ng, f"{op}_into")(x, out, axis=-1, stream=stream)
    for seed in (1, 2):
        new = host(np.float32, (2, SPLIT_COLS), seed=seed)
        x.copy_to_device(new, stream=stream)
        cap.graph.launch()
        check(out.copy_to_host(stream=stream), REFERENCE[op](new, 1), out_dtype(op, np.float32))


@pytest.mark.parametrize("op", ["mean", "argmin"])
def test_split_rows_remembered_eager_call_reads_new_data(stream, split, op):
    x = cuda.to_device(host(np.float32, (1, SPLIT_COLS)))
    out = ng.empty(1, out_dtype(op, np.float32))
    fn = getattr(ng, f"{op}_into")
    for _ in range(3):
        fn(x, out, axis=-1, stream=stream)
    new = host(np.float32, (1, SPLIT_COLS), seed=5)
    x.copy_to_device(new, stream=stream)
    fn(x, out, axis=-1, stream=stream)
    check(out.copy_to_host(stream=stream), REFERENCE[op](new, 1), out_dtype(op, np.float32))
    assert split()


@pytest.mark.parametrize("op", ["sum", "max"])
def test_split_rows_into_a_graph_owned_output(stream, split, op):
    data = host(np.float32, (3, SPLIT_COLS))
    x = cuda.to_device(data)
    kept = ng.zeros(3, np.float32, stream=stream)
    with ng.capture(stream) as cap:
        out = ng.empty(3, np.float32)
        getattr(ng, f"{op}_into")(x, out, axis=-1, stream=stream)
        ng.copy_into(out, kept, stream=stream)
        ng.free(out)
    for _ in range(2):
        cap.graph.launch()
        check(kept.copy_to_host(stream=stream), REFERENCE[op](data, 1), np.float32)


def test_long_rows_split_only_when_few():
    from numbagraph.ops import _reduce_kernels
    from numbagraph.ops.reduce import SPLIT_BELOW_ROWS_PER_SM, row_parts

    sms = active.launch_limits()[0]
    tile = _reduce_kernels.ADDITIVE_UNROLL * THREADS
    assert row_parts(1, 3 * tile, _reduce_kernels.ADDITIVE_UNROLL) == 3
    assert row_parts(1, tile + 1, _reduce_kernels.ADDITIVE_UNROLL) == 1
    assert row_parts(sms * SPLIT_BELOW_ROWS_PER_SM, 3 * tile,
                     _reduce_kernels.ADDITIVE_UNROLL) == 1
