"""ng.graphed(sizes="update"): one graph given each call's shapes by node
updates, and the calls it captures instead, each with the warning that
names why."""

import warnings

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import dev

BLOCK = 8


@cuda.jit
def scale(x, y, a):
    """y = a * x."""
    i = cuda.grid(1)
    if i < y.size:
        y[i] = a * x[i]


@cuda.jit
def shift(y, b):
    """y += b[0]."""
    i = cuda.grid(1)
    if i < y.size:
        y[i] += b[0]


@cuda.jit
def scale_rows(x, y, a):
    """y[r, c] = a * x[r, c] over a 2-d grid."""
    r, c = cuda.grid(2)
    if r < y.shape[0] and c < y.shape[1]:
        y[r, c] = a * x[r, c]


@cuda.jit
def negate(y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = -y[i]


def blocks(n):
    return max(1, (n + BLOCK - 1) // BLOCK)


@pytest.fixture
def big(stream):
    return dev(np.arange(64) + 1, stream), dev(np.zeros(64), stream)


def two_kernels(stream):
    @ng.graphed(stream=stream, sizes="update")
    def step(x, y, b):
        scale[blocks(x.size), BLOCK, stream](x, y, 2.0)
        shift[blocks(y.size), BLOCK, stream](y, b)
        return y

    return step


def test_sizes_up_and_down_keep_one_graph(stream, big):
    x, y = big
    b = ng.DeviceScalar(0.5, np.float32, stream=stream)
    step = two_kernels(stream)
    for n in (16, 16, 8, 40, 3, 64, 16, 1, 33):
        y.copy_to_device(np.zeros(64, np.float32), stream=stream)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ng.GraphedWarning)
            warnings.simplefilter("error", ng.CaptureWarning)
            out = step(x[:n], y[:n], b)
        assert out.shape == (n,)
        got = y.copy_to_host(stream=stream)
        want = np.zeros(64, np.float32)
        want[:n] = 2 * (np.arange(n) + 1) + 0.5
        np.testing.assert_array_equal(got, want, err_msg=f"n={n}")
    info = step.cache_info()
    assert (info.graphs, info.captures) == (1, 1)
    # 8, 40, 3, 64, 16 (again), 1, 33: every new shape after the capture
    assert info.resizes == 7


def test_a_resize_moves_to_the_call_arrays_and_replays_the_same_after(stream, big):
    x, y = big
    other = dev(np.zeros(64), stream)
    b = ng.DeviceScalar(1.0, np.float32, stream=stream)
    step = two_kernels(stream)
    step(x[:8], y[:8], b)
    step(x[:8], y[:8], b)  # captured
    step(x[:24], other[:24], b)  # resized, onto another output array
    np.testing.assert_array_equal(other.copy_to_host(stream=stream)[:24],
                                  2 * (np.arange(24) + 1) + 1)
    b.update(3.0)
    step(x[:24], other[:24], b)  # the same shape and arrays: replayed
    np.testing.assert_array_equal(other.copy_to_host(stream=stream)[:24],
                                  2 * (np.arange(24) + 1) + 3)
    assert step.cache_info().resizes == 1
    nodes = step._caches[next(iter(step._caches))].entries
    (entry,) = nodes.values()
    nodes = entry.graph.nodes
    assert [n.grid for n in nodes] == [(3, 1, 1), (3, 1, 1)]
    # described as the call's launches: the new shapes, the scalar by kind
    assert [[a.shape for a in n.args if a.kind == "array"] for n in nodes] == [
        [(24,), (24,)], [(24,)]]
    assert nodes[1].args[1].kind == "DeviceScalar"


def test_views_with_strides_and_two_dimensions(stream):
    base = dev(np.arange(64 * 4).reshape(64, 4), stream)
    out = dev(np.zeros((64, 4)), stream)

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y):
        rows, cols = y.shape
        scale_rows[(blocks(rows), cols), (BLOCK, 1), stream](x, y, 3.0)

    for rows in (4, 4, 10, 2, 17):
        out.copy_to_device(np.zeros((64, 4), np.float32), stream=stream)
        # every other row: strided views of one layout ("A") at each size
        step(base[::2][:rows], out[::2][:rows])
        got = out.copy_to_host(stream=stream)
        want = np.zeros((64, 4), np.float32)
        want[::2][:rows] = 3 * np.arange(64 * 4).reshape(64, 4)[::2][:rows]
        np.testing.assert_array_equal(got, want, err_msg=f"rows={rows}")
    info = step.cache_info()
    assert (info.graphs, info.resizes) == (1, 3)


def test_another_dtype_is_another_family_captured_without_warning(stream, big):
    x, y = big
    b = ng.DeviceScalar(0.0, np.float32, stream=stream)
    step = two_kernels(stream)
    step(x[:8], y[:8], b)
    step(x[:8], y[:8], b)
    x64, y64 = dev(np.arange(16), stream, np.float64), dev(np.zeros(16), stream, np.float64)
    b64 = ng.DeviceScalar(0.0, np.float64, stream=stream)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.GraphedWarning)
        step(x64, y64, b64)
        step(x64, y64, b64)
    np.testing.assert_array_equal(y64.copy_to_host(stream=stream), 2 * np.arange(16))
    info = step.cache_info()
    assert (info.graphs, info.resizes) == (2, 0)


def test_another_number_of_launches_captures_with_a_warning(stream, big):
    x, y = big

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y):
        for start in range(0, y.size, 16):  # one launch per chunk of 16
            end = min(start + 16, y.size)
            scale[blocks(end - start), BLOCK, stream](x[start:end], y[start:end], 2.0)

    step(x[:16], y[:16])
    step(x[:16], y[:16])
    step(x[:12], y[:12])  # one launch still: resized
    with pytest.warns(ng.GraphedWarning,
                      match="made 2 kernel launches, copies and fills in all, where the "
                            "graph holds 1"):
        step(x[:20], y[:20])
    np.testing.assert_array_equal(y.copy_to_host(stream=stream)[:20], 2 * (np.arange(20) + 1))
    info = step.cache_info()
    assert (info.captures, info.resizes, info.graphs) == (2, 1, 2)
    step(x[:30], y[:30])  # two launches: the graph captured for 20 takes it
    np.testing.assert_array_equal(y.copy_to_host(stream=stream)[:30], 2 * (np.arange(30) + 1))
    assert step.cache_info().resizes == 2


def test_another_kernel_captures_with_a_warning_naming_it(stream, big):
    x, y = big

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y):
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)
        if y.size > 16:
            negate[blocks(y.size), BLOCK, stream](y)
        else:
            scale[blocks(y.size), BLOCK, stream](y, y, 1.0)

    step(x[:8], y[:8])
    step(x[:8], y[:8])
    with pytest.warns(ng.GraphedWarning, match="launch 1 runs `negate`"):
        step(x[:32], y[:32])
    np.testing.assert_array_equal(y.copy_to_host(stream=stream)[:32], -2 * (np.arange(32) + 1))


@pytest.mark.parametrize("work, reason", [
    ("host", "recorded a host call"),
    ("memory", "graph memory"),
    ("loop", "device loop"),
])
def test_work_other_than_kernels_captures_with_a_warning(stream, big, work, reason):
    x, y = big
    calls = []
    counter = ng.DeviceScalar(0, np.int32, stream=stream)

    # A device loop records only inside a capture: no call runs as written.
    @ng.graphed(stream=stream, sizes="update", warmup=0)
    def step(x, y):
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)
        if work == "host":
            ng.on_host(calls.append, y.size, stream=stream)
        elif work == "memory":
            scratch = ng.empty(y.size, np.float32, stream=stream)
            scale[blocks(y.size), BLOCK, stream](y, scratch, 1.0)
        else:
            with ng.repeat(counter, 2, stream=stream):
                scale[blocks(y.size), BLOCK, stream](y, y, 1.0)

    step(x[:8], y[:8])
    step(x[:8], y[:8])
    with pytest.warns(ng.GraphedWarning, match=reason):
        step(x[:16], y[:16])
    got = y.copy_to_host(stream=stream)[:16]
    want = 2 * (np.arange(16) + 1.0)
    np.testing.assert_array_equal(got, want)
    info = step.cache_info()
    assert (info.captures, info.resizes) == (2, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.GraphedWarning)  # each reason is given once
        step(x[:24], y[:24])


def test_own_ops_take_new_sizes(stream, big):
    x, y = big
    out = dev(np.zeros(64), stream)

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y, out):
        ng.add_into(x, y, out, stream=stream)
        ng.mul_into(out, x, out, stream=stream)

    y.copy_to_device(np.full(64, 2, np.float32), stream=stream)
    for n in (8, 8, 50, 5):
        step(x[:n], y[:n], out[:n])
        a = np.arange(n) + 1.0
        np.testing.assert_array_equal(out.copy_to_host(stream=stream)[:n], (a + 2) * a)
    assert step.cache_info().resizes == 2


def test_an_error_in_the_function_leaves_the_graph_as_it_was(stream, big):
    x, y = big
    b = ng.DeviceScalar(0.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y, b):
        if y.size == 13:
            raise RuntimeError("no 13")
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)
        shift[blocks(y.size), BLOCK, stream](y, b)

    step(x[:8], y[:8], b)
    step(x[:8], y[:8], b)
    with pytest.raises(RuntimeError, match="no 13"):
        step(x[:13], y[:13], b)
    assert not ng.is_capturing(stream)
    y.copy_to_device(np.zeros(64, np.float32), stream=stream)
    step(x[:8], y[:8], b)
    got = y.copy_to_host(stream=stream)
    np.testing.assert_array_equal(got[:8], 2 * (np.arange(8) + 1))
    assert not got[8:].any()


def test_a_view_made_inside_cannot_be_the_result(stream, big):
    x, y = big

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y):
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)
        return y if y.size < 20 else y[1:]

    step(x[:8], y[:8])
    step(x[:8], y[:8])
    with pytest.raises(ng.GraphedError, match="neither one of its arguments"):
        step(x[:24], y[:24])
    y.copy_to_device(np.zeros(64, np.float32), stream=stream)
    step(x[:8], y[:8])  # the graph still runs the 8 it ran
    got = y.copy_to_host(stream=stream)
    np.testing.assert_array_equal(got[:8], 2 * (np.arange(8) + 1))
    assert not got[8:].any()
    assert step.cache_info().resizes == 0


def test_sizes_takes_capture_or_update(stream):
    with pytest.raises(ValueError, match="sizes must be 'capture'"):
        ng.graphed(lambda: None, stream=stream, sizes="grow")
    assert ng.graphed(lambda: None, stream=stream).sizes == "capture"
    assert ng.graphed(lambda: None, stream=stream, sizes="update").sizes == "update"


def test_without_sizes_update_each_shape_is_a_graph(stream, big):
    x, y = big
    b = ng.DeviceScalar(0.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, warmup=0)
    def step(x, y, b):
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)

    for n in (4, 8, 12):
        step(x[:n], y[:n], b)
    info = step.cache_info()
    assert (info.graphs, info.resizes) == (3, 0)


def test_rebinding_and_resizing_take_turns(stream):
    # a ping-pong whose size changes now and then: same-shape calls rebind,
    # new shapes re-size, in any order
    a = dev(np.arange(64) + 1, stream)
    b = dev(np.zeros(64), stream)

    @ng.graphed(stream=stream, sizes="update")
    def step(src, dst):
        scale[blocks(dst.size), BLOCK, stream](src, dst, 2.0)

    want_a = np.arange(64, dtype=np.float32) + 1
    want_b = np.zeros(64, np.float32)
    for k, n in enumerate((8, 8, 8, 24, 24, 5, 5, 24, 64, 64)):
        src, dst, want_src, want_dst = (a, b, want_a, want_b) if k % 2 == 0 else (
            b, a, want_b, want_a)
        step(src[:n], dst[:n])
        want_dst[:n] = 2 * want_src[:n]
        np.testing.assert_array_equal(a.copy_to_host(stream=stream), want_a, err_msg=f"{k}")
        np.testing.assert_array_equal(b.copy_to_host(stream=stream), want_b, err_msg=f"{k}")
    info = step.cache_info()
    assert (info.graphs, info.captures) == (1, 1)
    assert info.resizes == 4 and info.rebinds >= 4


def test_copies_and_reads_into_host_memory_take_new_sizes(stream, big):
    x, y = big
    out = dev(np.zeros(64), stream)
    total = ng.DeviceScalar(0.0, np.float32, stream=stream)
    seen = ng.HostScalar(np.float32)

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y, out):
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)
        ng.copy_into(y, out, stream=stream)         # a copy node of the call's bytes
        ng.sum_into(out, total, stream=stream)
        total.read_async(seen, stream=stream)     # a copy into pinned memory

    # sizes of whole 16-byte groups: sum_into reads float32 16 bytes at a
    # time where it can, another kernel than for other sizes
    for n in (8, 8, 24, 12, 40):
        out.copy_to_device(np.zeros(64, np.float32), stream=stream)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ng.GraphedWarning)
            step(x[:n], y[:n], out[:n])
        stream.synchronize()
        want = 2 * (np.arange(n) + 1.0)
        got = out.copy_to_host(stream=stream)
        np.testing.assert_array_equal(got[:n], want, err_msg=f"n={n}")
        assert not got[n:].any()
        assert seen.value == want.sum()
    info = step.cache_info()
    assert (info.graphs, info.captures, info.resizes) == (1, 1, 3)


def test_a_copy_where_the_graph_launched_a_kernel_is_captured(stream, big):
    x, y = big

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y):
        if y.size > 16:
            ng.copy_into(x, y, stream=stream)
        else:
            scale[blocks(y.size), BLOCK, stream](x, y, 1.0)

    step(x[:8], y[:8])
    step(x[:8], y[:8])
    with pytest.warns(ng.GraphedWarning, match="made a copy where the graph's node 0 is a "
                                               "kernel launch"):
        step(x[:32], y[:32])
    np.testing.assert_array_equal(y.copy_to_host(stream=stream)[:32], np.arange(32) + 1)


def test_sizes_that_never_repeat_are_warmed_up_by_family(stream, big):
    x, y = big

    @ng.graphed(stream=stream, sizes="update")
    def step(x, y):
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)

    for n in (3, 4, 5, 6, 7):  # the first call runs as written, the next captures
        with warnings.catch_warnings():
            warnings.simplefilter("error", ng.CaptureWarning)  # a re-size records no node
            step(x[:n], y[:n])
        np.testing.assert_array_equal(y.copy_to_host(stream=stream)[:n], 2 * (np.arange(n) + 1))
    info = step.cache_info()
    assert (info.eager, info.captures, info.resizes) == (1, 1, 3)


def test_two_shapes_of_work_keep_a_graph_each(stream, big):
    x, y = big

    @ng.graphed(stream=stream, sizes="update", warmup=0)
    def step(x, y):
        scale[blocks(y.size), BLOCK, stream](x, y, 2.0)
        if y.size > 16:  # a second kernel for large sizes
            negate[blocks(y.size), BLOCK, stream](y)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ng.GraphedWarning)  # the second shape's capture
        for n in (8, 32, 12, 40, 4, 20):
            step(x[:n], y[:n])
            sign = -1 if n > 16 else 1
            np.testing.assert_array_equal(y.copy_to_host(stream=stream)[:n],
                                          sign * 2 * (np.arange(n) + 1), err_msg=f"n={n}")
    info = step.cache_info()
    assert (info.captures, info.graphs, info.resizes) == (2, 2, 4)


def test_threads_re_size_their_own_streams_side_by_side():
    # each thread's stream has its own cache and its own taken work: a
    # re-size on one never takes another thread's launches
    import threading

    errors = []

    def work(seed, s, x, y):
        try:

            @ng.graphed(stream=s, sizes="update")
            def step(x, y):
                scale[blocks(y.size), BLOCK, s](x, y, 2.0)

            rng = np.random.default_rng(seed)
            for n in [8, 8, *rng.integers(1, 64, 6)]:
                n = int(n)
                y.copy_to_device(np.zeros(64, np.float32), stream=s)
                step(x[:n], y[:n])
                got = y.copy_to_host(stream=s)
                want = np.zeros(64, np.float32)
                want[:n] = 2 * (np.arange(n) + seed)
                np.testing.assert_array_equal(got, want, err_msg=f"thread {seed}, n={n}")
            assert step.cache_info().captures == 1
        except BaseException as exc:  # noqa: BLE001  reported by the main thread
            errors.append(exc)

    # streams and arrays made here: while a kernel of this module runs, the
    # simulator puts its own module in place of this module's `cuda`
    made = []
    for k in range(4):
        s = cuda.stream()
        made.append((k, s, dev(np.arange(64) + k, s), dev(np.zeros(64), s)))
    threads = [threading.Thread(target=work, args=args) for args in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
