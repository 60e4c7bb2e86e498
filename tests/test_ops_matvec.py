"""matvec_into against NumPy: a warp per row, rows of any length, eager,
captured and remembered."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng

from conftest import BF16, to_device, to_host

FLOATS = [np.float16, BF16, np.float32, np.float64]


def host(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-9, 10, size=shape).astype(dtype)
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)


def want(a, x):
    """The product in float64 (int64 for integers), as the dtype of ``a``."""
    wide = np.int64 if a.dtype.kind in "iu" else np.float64
    return (a.astype(wide) @ x.astype(wide)).astype(a.dtype)


def check(got, a, x):
    expected = want(a, x)
    if a.dtype.kind in "iu":
        np.testing.assert_array_equal(got, expected)
        return
    # float16 and bfloat16 sum in float32 and are rounded once: within a few
    # of their ulps.
    tol = 1.6e-2 if a.dtype.name == "bfloat16" else {2: 4e-3, 4: 1e-5, 8: 1e-12}[
        a.dtype.itemsize]
    scale = np.abs(a.astype(np.float64)) @ np.abs(x.astype(np.float64))
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                               rtol=tol, atol=tol * (1 + scale.max(initial=0)))


def matvec(stream, a, x):
    out = ng.empty(a.shape[0], a.dtype)
    ng.matvec_into(to_device(a), to_device(x), out, stream=stream)
    return to_host(out, stream)


@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64], ids=str)
@pytest.mark.parametrize("m, k", [(3, 1), (2, 31), (2, 33), (3, 97), (2, 127), (2, 129),
                                  (1, 200), (4, 256), (20, 45)], ids=str)
def test_matvec_rows_of_any_length(stream, dtype, m, k):
    # K around a warp (32) and the unrolled step (128); 1 row; more rows
    # than the simulated grid has warps (8), so blocks step through rows.
    a, x = host(dtype, (m, k), seed=m + k), host(dtype, k, seed=k)
    check(matvec(stream, a, x), a, x)


def test_matvec_with_no_columns_writes_zeros(stream):
    out = cuda.to_device(np.full(3, 7.0, np.float32))
    ng.matvec_into(ng.empty((3, 0), np.float32), ng.empty(0, np.float32), out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.zeros(3, np.float32))


def test_matvec_with_no_rows_does_nothing(stream):
    ng.matvec_into(ng.empty((0, 5), np.float32), ng.empty(5, np.float32),
                   ng.empty(0, np.float32), stream=stream)


def test_matvec_float16_accumulates_in_float32(stream):
    # 1024 plus 0.25s: a float16 running sum would drop every 0.25 added to
    # 1024 (its spacing there is 1); float32 keeps them all, and only the
    # result is rounded to float16.
    k = 4096
    a = np.full((2, k), 0.25, np.float16)
    a[0, 0] = 1024
    x = np.ones(k, np.float16)
    exact = a.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_array_equal(matvec(stream, a, x), exact.astype(np.float16))


def test_matvec_is_deterministic(stream):
    a, x = host(np.float32, (5, 300), seed=3), host(np.float32, 300, seed=4)
    first = matvec(stream, a, x)
    np.testing.assert_array_equal(matvec(stream, a, x), first)


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=str)
def test_matvec_in_a_capture_replays_on_new_data(stream, dtype):
    m, k = 5, 70
    a, x = host(dtype, (m, k), seed=1), host(dtype, k, seed=2)
    a_dev, x_dev = cuda.to_device(a), cuda.to_device(x)
    out = ng.empty(m, dtype)
    with ng.capture(stream) as cap:
        ng.matvec_into(a_dev, x_dev, out, stream=stream)
    for seed in (5, 6):
        a2, x2 = host(dtype, (m, k), seed=seed), host(dtype, k, seed=seed + 10)
        a_dev.copy_to_device(a2, stream=stream)
        x_dev.copy_to_device(x2, stream=stream)
        cap.graph.launch()
        check(out.copy_to_host(stream=stream), a2, x2)


def test_matvec_remembered_eager_call_reads_new_data(stream):
    m, k = 4, 50
    a, x = host(np.float32, (m, k), seed=1), host(np.float32, k, seed=2)
    a_dev, x_dev, out = cuda.to_device(a), cuda.to_device(x), ng.empty(m, np.float32)
    for _ in range(3):
        out.copy_to_device(np.zeros(m, np.float32), stream=stream)
        ng.matvec_into(a_dev, x_dev, out, stream=stream)
        check(out.copy_to_host(stream=stream), a, x)
    a2, x2 = host(np.float32, (m, k), seed=7), host(np.float32, k, seed=8)
    a_dev.copy_to_device(a2, stream=stream)
    x_dev.copy_to_device(x2, stream=stream)
    ng.matvec_into(a_dev, x_dev, out, stream=stream)
    check(out.copy_to_host(stream=stream), a2, x2)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (ng.empty((3, 4), np.float32), ng.empty(4, np.float64),
                  ng.empty(3, np.float32)), "dtype float64"),
        (lambda: (ng.empty((3, 4), np.float32), ng.empty(4, np.float32),
                  ng.empty((3, 1), np.float32)), "1-D with one element per row"),
        (lambda: (ng.empty((3, 4), np.float32), ng.empty(4, np.float32),
                  ng.empty(4, np.float32)), r"per row of a \(3\)"),
        (lambda: (ng.empty((3, 4), np.float32), ng.empty(4, np.float32),
                  ng.empty(3, np.float64)), "out of dtype float64"),
        (lambda: (ng.empty((3, 4), np.bool_), ng.empty(4, np.bool_),
                  ng.empty(3, np.bool_)), "inputs of dtype bool"),
        (lambda: (cuda.to_device(np.zeros((3, 8), np.float32))[:, ::2], ng.empty(4, np.float32),
                  ng.empty(3, np.float32)), "C-contiguous"),
    ],
    ids=["x-dtype", "out-2d", "out-length", "out-dtype", "bool", "strided"],
)
def test_matvec_refuses_bad_operands_before_launching(stream, make, message):
    a, x, out = make()
    with pytest.raises(ng.OpError, match=message):
        ng.matvec_into(a, x, out, stream=stream)
    # The stream is still usable.
    good = host(np.float32, (2, 3), seed=1), host(np.float32, 3, seed=2)
    check(matvec(stream, *good), *good)


def test_matvec_refuses_an_output_inside_its_input(stream):
    a = ng.zeros((4, 4), np.float32, stream=stream)
    with pytest.raises(ng.OpError, match="overlaps a"):
        ng.matvec_into(a, ng.zeros(4, np.float32, stream=stream), a[0], stream=stream)


def test_matvec_refuses_a_missing_stream():
    with pytest.raises(ng.OpError, match="stream"):
        ng.matvec_into(ng.empty((2, 2), np.float32), ng.empty(2, np.float32),
                       ng.empty(2, np.float32), stream=None)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32], ids=str)
@pytest.mark.parametrize("m, k", [(37, 45), (9, 300), (64, 129)], ids=str)
def test_rows_read_together_give_the_bits_of_one_row_per_warp(stream, dtype, m, k,
                                                               monkeypatch):
    from numbagraph.ops import linalg

    a, x = host(dtype, (m, k), seed=m), host(dtype, k, seed=k)
    got = {}
    for together in (1, 2, 4):
        monkeypatch.setattr(linalg, "MATVEC_ROWS_PER_WARP", (together,))
        monkeypatch.setattr(linalg, "MATVEC_BLOCKS_PER_SM", 0)
        got[together] = matvec(stream, a, x)
    np.testing.assert_array_equal(got[2], got[1])
    np.testing.assert_array_equal(got[4], got[1])
    check(got[4], a, x)


def test_warps_read_more_rows_at_once_only_while_the_grid_stays_full():
    from numbagraph.ops.linalg import MATVEC_BLOCKS_PER_SM, matvec_rows_per_warp

    sms, warps = 132, 8
    full = MATVEC_BLOCKS_PER_SM * sms * warps          # rows that fill the grid one per warp
    assert matvec_rows_per_warp(full - 1, warps, sms) == 1
    assert matvec_rows_per_warp(2 * full, warps, sms) == 2
    assert matvec_rows_per_warp(4 * full, warps, sms) == 4
    assert matvec_rows_per_warp(32000, warps, sms) == 4
    assert matvec_rows_per_warp(4096, warps, sms) == 1


@pytest.mark.parametrize("threads", [32, 64, 128], ids=lambda t: f"{t} threads")
@pytest.mark.parametrize("m, k", [(1, 4), (5, 128), (9, 260), (3, 1028), (17, 64)], ids=str)
def test_float32_rows_of_quads_are_the_same_bits_aligned_or_not(stream, monkeypatch,
                                                                 threads, m, k):
    # Blocks of 2 and 4 warps split each row over 2 warps, as on the GPU.
    from numbagraph.ops import _launch

    sms, _ = _launch.limits()
    monkeypatch.setattr(_launch, "limits", lambda: (sms, threads))
    a, x = host(np.float32, (m, k), seed=m), host(np.float32, k, seed=k)
    got = []
    for elements in (0, 1, 2):      # 4 * elements bytes off a multiple of 16
        a_buf, x_buf = ng.empty(m * k + elements, np.float32), ng.empty(k + elements, np.float32)
        a_dev, x_dev = a_buf[elements:].reshape((m, k)), x_buf[elements:]
        a_dev.copy_to_device(a, stream=stream)
        x_dev.copy_to_device(x, stream=stream)
        out = ng.empty(m, np.float32)
        ng.matvec_into(a_dev, x_dev, out, stream=stream)
        got.append(out.copy_to_host(stream=stream))
    np.testing.assert_array_equal(got[1], got[0])
    np.testing.assert_array_equal(got[2], got[0])
    check(got[0], a, x)
