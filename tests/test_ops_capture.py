"""Ops inside captures: recorded with user kernels, steered by device scalars
between replays, refusing bad calls without harming the capture, and
reducing to the same bits eagerly and on replay. Also the allocation
helpers that prepare their outputs."""

import gc
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active

N = 32
MANY = 4 * active.launch_limits()[1] + 5  # reduced over several blocks


def host(n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-2.0, 2.0, n).astype(dtype)


@cuda.jit
def double(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= 2


def test_ops_and_user_kernels_record_into_one_graph(stream):
    a, b = host(N, 1), host(N, 2)
    x, y = cuda.to_device(a), cuda.to_device(b)
    out = ng.empty(N, np.float32)
    total = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    ng.add_into(x, y, out, stream=stream)
    double[1, N, stream](out)
    ng.sum_into(out, total, stream=stream)
    ng.fill_into(out, 0.0, stream=stream)
    total.update(0.0)
    with ng.capture(stream) as cap:
        ng.add_into(x, y, out, stream=stream)
        double[1, N, stream](out)
        ng.sum_into(out, total, stream=stream)
    assert total.value == 0.0
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 0.0)
    cap.graph.launch()
    np.testing.assert_allclose(out.copy_to_host(stream=stream), 2 * (a + b), rtol=1e-6)
    np.testing.assert_allclose(total.value, (2 * (a + b)).sum(), rtol=1e-5)


def test_arrays_an_op_reads_and_writes_live_as_long_as_its_graph(stream):
    a, b = host(MANY, 1), host(MANY, 2)
    x, y = cuda.to_device(a), cuda.to_device(b)
    out = ng.empty(MANY, np.float32)
    total = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    kept = ng.empty(MANY, np.float32)
    ng.add_into(x, y, out, stream=stream)
    ng.sum_into(out, total, stream=stream)
    ng.copy_into(out, kept, stream=stream)
    with ng.capture(stream) as cap:
        ng.add_into(x, y, out, stream=stream)
        ng.sum_into(out, total, stream=stream)
        ng.copy_into(out, kept, stream=stream)
    graph = cap.graph
    refs = [weakref.ref(obj) for obj in (x, y, out, kept)]
    del x, y, out, kept, cap
    gc.collect()
    assert all(ref() is not None for ref in refs)
    total.update(0.0)
    graph.launch()
    np.testing.assert_allclose(refs[3]().copy_to_host(stream=stream), a + b, rtol=1e-6)
    np.testing.assert_allclose(total.value, (a + b).sum(), rtol=1e-5)
    graph.close()
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_captured_copy_of_a_whole_array_copies_its_current_contents(stream):
    x = cuda.to_device(host(N, 1))
    out = ng.empty(N, np.float32)
    ng.copy_into(x, out, stream=stream)
    ng.fill_into(out, 0.0, stream=stream)
    with ng.capture(stream) as cap:
        ng.add_into(x, 1.0, x, stream=stream)
        ng.copy_into(x, out, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 0.0)
    start = x.copy_to_host(stream=stream)
    for replay in (1, 2):
        cap.graph.launch()
        np.testing.assert_allclose(out.copy_to_host(stream=stream), start + replay, rtol=1e-6)


@pytest.mark.driver_only(reason="the layouts of ops' launches belong to the driver backend")
def test_ops_launch_through_their_planned_layout_and_other_kernels_through_numba(stream):
    from numba.cuda import types

    from numbagraph.backend import driver_launch
    from numbagraph.safety import on_launch

    x = cuda.to_device(host(N))
    out = ng.empty(N, np.float32)
    ng.add_into(x, 1.0, out, stream=stream)
    planned = [plans for plans in driver_launch._plans.values() if plans]
    assert planned, "an op's kernel was launched without its planned layout"

    # A kernel with an argument no packer handles (a tuple) launches through numba.
    @cuda.jit(types.void(types.complex64[::1], types.UniTuple(types.float32, 2)))
    def shift(z, by):
        i = cuda.grid(1)
        if i < z.size:
            z[i] += complex(by[0], by[1])

    z = cuda.to_device(np.zeros(N, np.complex64))
    by = (np.float32(1), np.float32(2))
    driver_launch.launch(shift, 1, N, int(stream.handle), (z, by), on_launch)
    np.testing.assert_array_equal(z.copy_to_host(stream=stream), np.complex64(1 + 2j))
    plans = driver_launch._plans.get((shift, int(cuda.current_context().handle)), {})
    assert not any(isinstance(plan, driver_launch.Plan) for plan in plans.values())


def test_device_scalar_operand_updated_between_replays_changes_the_result(stream):
    a = host(N)
    x = cuda.to_device(a)
    out = ng.empty(N, np.float32)
    shift = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    ng.add_into(x, shift, out, stream=stream)
    with ng.capture(stream) as cap:
        ng.add_into(x, shift, out, stream=stream)
    for value in (1.0, -4.0, 8.5):
        shift.update(value)
        cap.graph.launch()
        np.testing.assert_array_equal(out.copy_to_host(stream=stream), a + np.float32(value))


def test_scalar_alpha_and_fill_value_follow_updates(stream):
    x, y = host(N, 1), host(N, 2)
    out = ng.empty(N, np.float32)
    filled = ng.empty(N, np.float32)
    alpha = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    ng.axpy_into(alpha, dx, dy, out, stream=stream)
    ng.fill_into(filled, alpha, stream=stream)
    with ng.capture(stream) as cap:
        ng.axpy_into(alpha, dx, dy, out, stream=stream)
        ng.fill_into(filled, alpha, stream=stream)
    alpha.update(3.0)
    cap.graph.launch()
    np.testing.assert_allclose(out.copy_to_host(stream=stream), 3 * x + y, rtol=1e-6)
    np.testing.assert_array_equal(filled.copy_to_host(stream=stream), 3.0)


def test_take_and_put_follow_the_index_between_replays(stream):
    table = np.arange(24, dtype=np.float64).reshape(6, 4)
    src = cuda.to_device(table)
    cache = ng.zeros((6, 4), np.float64, stream=stream)
    row = ng.empty(4, np.float64)
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    ng.take_into(src, pos, row, stream=stream)
    ng.put_into(row, pos, cache, stream=stream)
    ng.fill_into(cache, 0.0, stream=stream)
    with ng.capture(stream) as cap:
        ng.take_into(src, pos, row, stream=stream)
        ng.put_into(row, pos, cache, stream=stream)
    for t in (4, 1, 5):
        pos.update(t)
        cap.graph.launch()
    want = np.zeros((6, 4))
    want[[1, 4, 5]] = table[[1, 4, 5]]
    np.testing.assert_array_equal(cache.copy_to_host(stream=stream), want)


def test_argmax_into_a_scalar_feeds_the_next_op_on_the_device(stream):
    scores = cuda.to_device(np.array([0.1, 0.7, 0.2], np.float32))
    table = cuda.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    best = ng.DeviceScalar(0, dtype=np.int64, stream=stream)
    row = ng.empty(4, np.float32)
    ng.argmax_into(scores, best, stream=stream)
    ng.take_into(table, best, row, stream=stream)
    with ng.capture(stream) as cap:
        ng.argmax_into(scores, best, stream=stream)
        ng.take_into(table, best, row, stream=stream)
    ng.fill_into(row, 0.0, stream=stream)
    cap.graph.launch()
    np.testing.assert_array_equal(row.copy_to_host(stream=stream), [4, 5, 6, 7])


BAD_CALLS = ["wrong-dtype", "wrong-shape", "host-array", "value-does-not-fit",
             "reduction-out", "index-out-of-range"]


@pytest.mark.parametrize("bad", BAD_CALLS)
def test_bad_call_inside_a_capture_leaves_it_recording(stream, bad):
    a = host(N)
    x = cuda.to_device(a)
    out = ng.empty(N, np.float32)
    wrong = {
        "wrong-dtype": ng.empty(N, np.float64),
        "wrong-shape": ng.empty(N + 1, np.float32),
        "host-array": np.ones(N, np.float32),
        "table": ng.empty((2, N), np.float32),
    }
    calls = {
        "wrong-dtype": lambda: ng.add_into(x, wrong["wrong-dtype"], out, stream=stream),
        "wrong-shape": lambda: ng.add_into(x, wrong["wrong-shape"], out, stream=stream),
        "host-array": lambda: ng.add_into(x, wrong["host-array"], out, stream=stream),
        "value-does-not-fit": lambda: ng.add_into(x, "2", out, stream=stream),
        "reduction-out": lambda: ng.sum_into(x, out, stream=stream),
        "index-out-of-range": lambda: ng.take_into(wrong["table"], 9, out, stream=stream),
    }
    ng.add_into(x, 1.0, out, stream=stream)
    ng.mul_into(out, 2.0, out, stream=stream)
    ng.fill_into(out, 0.0, stream=stream)
    with ng.capture(stream) as cap:
        ng.add_into(x, 1.0, out, stream=stream)
        with pytest.raises(ng.OpError):
            calls[bad]()
        assert ng.is_capturing(stream)
        ng.mul_into(out, 2.0, out, stream=stream)
    assert cap.graph.num_nodes == 2
    cap.graph.launch()
    np.testing.assert_allclose(out.copy_to_host(stream=stream), (a + 1) * 2, rtol=1e-6)


# Allocations for a stream other than the capturing one (s): not recorded
# into the capture, so they follow the allocation rule.
ALLOCATIONS = {
    "ng.empty": lambda s: ng.empty(N, np.float32, stream=s),
    "ng.zeros": lambda s: ng.zeros(N, np.float32, stream=s),
    "ng.empty_like": lambda s: ng.empty_like(np.zeros(N, np.float32), stream=s),
    "cuda.device_array": lambda s: cuda.device_array(N, np.float32, stream=s),
}


@pytest.mark.parametrize("allocate", list(ALLOCATIONS))
@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_every_allocation_for_another_stream_follows_one_rule_in_a_strict_capture(
        stream, other_stream, allocate, mode):
    with pytest.raises(ng.AllocationInCaptureError) as refused:
        with ng.capture(stream, mode=mode):
            ALLOCATIONS[allocate](other_stream)
    assert "allocat" in str(refused.value) and "Instead" in str(refused.value)
    assert not ng.is_capturing(stream)
    assert ALLOCATIONS[allocate](other_stream).size == N  # usable again afterwards


@pytest.mark.parametrize("allocate", list(ALLOCATIONS))
def test_every_allocation_for_another_stream_runs_at_once_in_a_relaxed_capture(
        stream, other_stream, allocate):
    x = cuda.to_device(host(N))
    ng.add_into(x, 1.0, x, stream=stream)
    with ng.capture(stream, mode="relaxed") as cap:
        made = ALLOCATIONS[allocate](other_stream)
        ng.add_into(x, 1.0, x, stream=stream)
    assert made.size == N
    assert cap.graph.num_nodes == 1 and cap.graph.memory_bytes == 0
    if allocate == "ng.zeros":
        np.testing.assert_array_equal(made.copy_to_host(stream=other_stream), 0.0)


def test_zeros_on_the_capturing_stream_are_the_graph_s_and_zeroed_at_each_launch(stream):
    x = cuda.to_device(host(N))
    ng.add_into(x, 1.0, x, stream=stream)
    with ng.capture(stream, mode="relaxed") as cap:
        acc = ng.zeros(N, np.float32, stream=stream)
        ng.add_into(acc, 1.0, acc, stream=stream)
    assert cap.graph.memory_bytes == N * 4
    for _ in range(2):
        cap.graph.launch()
        np.testing.assert_array_equal(acc.copy_to_host(stream=stream), 1.0)


def test_reduction_scratch_inside_a_capture_is_the_graph_s(stream, other_stream):
    """A reduction first run inside a capture, in any mode, reduces with
    many blocks into scratch its graph allocates and frees, and leaves the
    stream no scratch of its own; outside a capture it makes the stream's."""
    from numbagraph.ops import _reduce_kernels, reduce as _reduce

    x = cuda.to_device(host(4 * _reduce_kernels.ADDITIVE_UNROLL * active.launch_limits()[1]))
    out = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    for s, mode in ((stream, "thread_local"), (other_stream, "relaxed")):
        handle = active.stream_handle(s)
        _reduce._scratch.pop((handle, active.current_device_id()), None)
        target = ng.DeviceScalar(0.0, dtype=np.float32, stream=s)
        with ng.capture(s, mode=mode) as cap:
            ng.sum_into(x, target, stream=s)
        assert cap.graph.memory_bytes > 0
        cap.graph.launch(s)
        assert not _reduce._scratch.get((handle, active.current_device_id()))
        ng.sum_into(x, out, stream=stream)
        assert target.value == out.value
    assert _reduce._scratch.get((active.stream_handle(stream), active.current_device_id()))


@pytest.mark.parametrize("op", ["sum", "norm2", "argmax"])
def test_replays_reduce_to_the_same_bits(stream, op):
    x = cuda.to_device(host(MANY) * np.float32(100))
    out = ng.DeviceScalar(0, dtype=np.int64 if op == "argmax" else np.float32, stream=stream)
    fn = getattr(ng, f"{op}_into")
    fn(x, out, stream=stream)
    eager = out.value
    with ng.capture(stream) as cap:
        fn(x, out, stream=stream)
    seen = set()
    for _ in range(3):
        out.update(0)
        cap.graph.launch()
        seen.add(np.asarray(out.value, out.dtype).tobytes())
    assert seen == {np.asarray(eager, out.dtype).tobytes()}


def _every_part_busy():
    """A length dealt out to every part of a reduction, twice over."""
    from numbagraph.ops import _reduce_kernels
    from numbagraph.ops.reduce import _max_parts

    return 2 * _max_parts() * _reduce_kernels.ADDITIVE_UNROLL * active.launch_limits()[1] + 7


@pytest.mark.parametrize("op", ["sum", "dot", "argmax", "min"])
@pytest.mark.parametrize("n", [MANY, _every_part_busy()])
def test_reduction_captured_before_any_eager_run_gives_the_eager_bits(op, n):
    from numbagraph.ops import reduce as reductions

    s = cuda.stream()
    # No scratch for this stream (its handle may be a freed stream's).
    reductions._scratch.pop((active.stream_handle(s), id(cuda.get_current_device())), None)
    x = cuda.to_device(host(n, 3) * np.float32(100))
    index = op.startswith("arg")
    out = ng.DeviceScalar(0, dtype=np.int64 if index else np.float32, stream=s)

    def reduce():
        if op == "dot":
            ng.dot_into(x, x, out, stream=s)
        else:
            getattr(ng, f"{op}_into")(x, out, stream=s)

    with ng.capture(s) as cap:
        reduce()  # in one block, as no scratch can be allocated in a capture
    cap.graph.launch()
    captured = np.asarray(out.value, out.dtype).tobytes()
    reduce()  # over many blocks, the scratch allocated now
    assert np.asarray(out.value, out.dtype).tobytes() == captured


def test_foreign_array_naming_the_capturing_stream_is_not_synchronised(stream):
    class Foreign:
        def __init__(self, dev):
            self.dev = dev
            self.__cuda_array_interface__ = dict(active.array_interface(dev),
                                                 stream=active.stream_handle(stream))

    a = host(N)
    x, out = Foreign(cuda.to_device(a)), ng.empty(N, np.float32)
    ng.neg_into(x, out, stream=stream)
    with ng.capture(stream) as cap:
        ng.neg_into(x, out, stream=stream)
    ng.fill_into(out, 0.0, stream=stream)
    cap.graph.launch()
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), -a)


# ---------------------------------------------------------------- allocation helpers

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int64, np.bool_], ids=str)
@pytest.mark.parametrize("shape", [7, (3, 4), (0,)], ids=str)
def test_zeros_are_zero_with_the_asked_shape_and_dtype(stream, dtype, shape):
    z = ng.zeros(shape, dtype, stream=stream)
    want = np.zeros(shape, dtype)
    assert z.shape == want.shape and z.dtype == want.dtype
    np.testing.assert_array_equal(z.copy_to_host(stream=stream), want)


def test_like_helpers_copy_shape_and_dtype(stream):
    a = ng.empty((2, 5), np.int32)
    e, z = ng.empty_like(a), ng.zeros_like(a, stream=stream)
    assert e.shape == z.shape == (2, 5) and e.dtype == z.dtype == np.int32
    assert ng.empty_like(a, dtype=np.float64).dtype == np.float64
    np.testing.assert_array_equal(z.copy_to_host(stream=stream), 0)


def test_allocation_refuses_a_bad_shape():
    with pytest.raises(ng.OpError, match="non-negative"):
        ng.empty((2, -1), np.float32)
