"""Graph-owned memory: arrays allocated inside a capture live with its graph.

Made by ng.empty and its kin, or numba's device_array on the capturing
thread, they exist from the graph's first launch until its next one, which
makes them again; ng.free frees them inside the graph; closing the graph
frees everything. Every use where the memory does not exist is refused with
a numbagraph error before anything runs.
"""

import gc
import threading

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import host

N = 64


@cuda.jit
def fill(a, v):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = v + i


@cuda.jit
def add(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]


@cuda.jit
def fill_from(a, pos):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = pos[0] + i


@pytest.fixture
def out(stream):
    """N float32 zeros on ``stream``, with the kernels compiled."""
    x = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    fill[2, 32, stream](x, 0.0)
    add[2, 32, stream](x, x, x)
    return x


ALLOCATORS = {
    "ng.empty": lambda s: ng.empty(N, np.float32, stream=s),
    "ng.empty, no stream": lambda s: ng.empty(N, np.float32),
    "ng.zeros": lambda s: ng.zeros(N, np.float32, stream=s),
    "ng.empty_like": lambda s: ng.empty_like(np.zeros(N, np.float32), stream=s),
    "ng.zeros_like": lambda s: ng.zeros_like(np.zeros(N, np.float32)),
    "cuda.device_array": lambda s: cuda.device_array(N, np.float32, stream=s),
    "cuda.device_array, no stream": lambda s: cuda.device_array(N, np.float32),
    "cuda.device_array_like": lambda s: cuda.device_array_like(np.zeros(N, np.float32),
                                                               stream=s),
}


@pytest.mark.parametrize("allocate", ALLOCATORS, ids=str)
def test_each_allocation_inside_a_capture_is_memory_of_the_graph(stream, out, allocate):
    with ng.capture(stream) as cap:
        tmp = ALLOCATORS[allocate](stream)
        fill[2, 32, stream](tmp, 1.0)
        add[2, 32, stream](tmp, tmp, out)
    graph = cap.graph
    assert graph.memory_bytes == N * 4
    assert ng.backend() == "simulator" or graph.num_nodes >= 3  # allocation node included
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * (1.0 + np.arange(N)))
    np.testing.assert_array_equal(host(tmp, stream), 1.0 + np.arange(N))
    graph.close()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_every_capture_mode_records_the_allocation(stream, out, mode):
    with ng.capture(stream, mode=mode) as cap:
        tmp = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](tmp, 3.0)
    with pytest.raises(ng.GraphMemoryError, match="not been launched"):
        host(tmp, stream)
    cap.graph.launch()
    np.testing.assert_array_equal(host(tmp, stream), 3.0 + np.arange(N))


def test_a_result_lives_until_the_next_launch_which_makes_it_again(stream, out):
    pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    fill_from[2, 32, stream](out, pos)
    with ng.capture(stream) as cap:
        result = ng.empty(N, np.float32, stream=stream)
        fill_from[2, 32, stream](result, pos)
    graph = cap.graph
    pointer = ng.backend() == "cuda" and result.device_ctypes_pointer.value
    for t in (5.0, 7.0, 11.0):
        pos.update(t)
        graph.launch()
        np.testing.assert_array_equal(host(result, stream), t + np.arange(N))
        if pointer:
            assert result.device_ctypes_pointer.value == pointer
    graph.close()


def test_zeros_inside_a_capture_are_zeroed_at_every_launch(stream, out):
    with ng.capture(stream) as cap:
        acc = ng.zeros(N, np.float32, stream=stream)
        add[2, 32, stream](acc, out, acc)
        add[2, 32, stream](acc, out, out)
    fill[2, 32, stream](out, 1.0)
    cap.graph.launch()
    cap.graph.launch()  # acc starts from zero again: out = 4 (1 + i)
    np.testing.assert_array_equal(host(out, stream), 4 * (1.0 + np.arange(N)))


def test_free_lets_later_allocations_of_the_graph_run_and_forbids_later_use(stream, out):
    with ng.capture(stream) as cap:
        a = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](a, 1.0)
        add[2, 32, stream](a, a, out)
        ng.free(a)
        with pytest.raises(ng.GraphMemoryError, match="freed with ng.free earlier"):
            fill[2, 32, stream](a, 0.0)
        with pytest.raises(ng.GraphMemoryError, match="freed already"):
            ng.free(a)
        b = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](b, 5.0)
        add[2, 32, stream](out, b, out)
    graph = cap.graph
    assert graph.memory_bytes == 2 * N * 4
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * (1.0 + np.arange(N)) + 5.0
                                  + np.arange(N))
    with pytest.raises(ng.GraphMemoryError, match="freed inside its graph"):
        host(a, stream)
    with pytest.raises(ng.GraphMemoryError, match="freed inside its graph"):
        fill[2, 32, stream](a, 0.0)
    np.testing.assert_array_equal(host(b, stream), 5.0 + np.arange(N))


def test_free_refuses_what_is_not_the_capture_s_to_free(stream, out):
    ng.free(out)  # outside a capture: left to numba
    np.testing.assert_array_equal(host(out, stream), 2 * np.arange(N))
    with ng.capture(stream) as cap:
        a = ng.empty((4, N // 4), np.float32, stream=stream)
        fill[2, 32, stream](a.reshape(N), 1.0)
        with pytest.raises(ng.GraphMemoryError, match="not a view"):
            ng.free(a[1:])
        with pytest.raises(ng.GraphMemoryError, match="not graph memory"):
            ng.free(out)
    with pytest.raises(ng.GraphMemoryError, match="capture is not running"):
        ng.free(a)
    cap.graph.launch()
    np.testing.assert_array_equal(host(a, stream).reshape(N), 1.0 + np.arange(N))


def test_before_the_first_launch_nothing_may_use_the_memory(stream, out):
    with ng.capture(stream) as cap:
        tmp = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](tmp, 1.0)
    for use in (lambda: host(tmp, stream),
                lambda: fill[2, 32, stream](tmp, 0.0),
                lambda: tmp[0],
                lambda: ng.copy_into(tmp, out, stream=stream),
                lambda: out.copy_to_device(tmp, stream=stream)):
        with pytest.raises(ng.GraphMemoryError, match="has not been launched yet"):
            use()
    cap.graph.launch()
    fill[2, 32, stream](tmp, 2.0)  # now it exists: any work may use it
    np.testing.assert_array_equal(host(tmp, stream), 2.0 + np.arange(N))
    ng.copy_into(tmp, out, stream=stream)
    np.testing.assert_array_equal(host(out, stream), 2.0 + np.arange(N))


def test_during_its_capture_only_that_capture_may_use_it(stream, other_stream, out):
    with ng.capture(stream) as cap:
        tmp = ng.empty(N, np.float32, stream=stream)
        with pytest.raises(ng.GraphMemoryError, match="being captured"):
            fill[2, 32, other_stream](tmp, 0.0)
        with pytest.raises(ng.GraphMemoryError, match="being captured"):
            tmp.copy_to_host(stream=other_stream)
        fill[2, 32, stream](tmp, 4.0)
        ng.copy_into(tmp, out, stream=stream)
    cap.graph.launch()
    np.testing.assert_array_equal(host(out, stream), 4.0 + np.arange(N))


def test_another_graph_s_capture_may_not_use_it(stream, out):
    with ng.capture(stream) as first:
        tmp = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](tmp, 1.0)
    first.graph.launch()
    with ng.capture(stream) as second:
        with pytest.raises(ng.GraphMemoryError, match="another graph"):
            add[2, 32, stream](tmp, tmp, out)
        fill[2, 32, stream](out, 9.0)
    second.graph.launch()
    np.testing.assert_array_equal(host(out, stream), 9.0 + np.arange(N))


def test_closing_the_graph_frees_its_memory(stream, out):
    with ng.capture(stream) as cap:
        tmp = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](tmp, 1.0)
    cap.graph.launch()
    stream.synchronize()
    used = ng.graph_memory_info().used
    assert used >= N * 4
    cap.graph.close()
    stream.synchronize()
    with pytest.raises(ng.GraphMemoryError, match="has been closed"):
        host(tmp, stream)
    with pytest.raises(ng.GraphClosedError):
        cap.graph.memory_bytes
    ng.trim_graph_memory()
    info = ng.graph_memory_info()
    assert info.used <= used - N * 4 or ng.backend() == "cuda"
    assert info.reserved >= info.used and info.used_high >= N * 4


def test_dropping_the_graph_frees_its_memory(stream, out):
    with ng.capture(stream) as cap:
        tmp = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](tmp, 1.0)
    cap.graph.launch()
    del cap
    gc.collect()
    with pytest.raises(ng.GraphMemoryError, match="has been closed"):
        host(tmp, stream)


def test_a_discarded_capture_allocated_nothing(stream, out):
    with pytest.raises(RuntimeError, match="boom"):
        with ng.capture(stream):
            tmp = ng.empty(N, np.float32, stream=stream)
            raise RuntimeError("boom")
    with pytest.raises(ng.GraphMemoryError, match="discarded"):
        fill[2, 32, stream](tmp, 0.0)


def test_a_conditional_body_may_not_allocate_and_the_capture_goes_on(stream, out):
    counter = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    with ng.capture(stream) as cap:
        before = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](before, 1.0)
        with ng.repeat(counter, 3):
            with pytest.raises(ng.GraphMemoryError, match="conditional body"):
                ng.empty(N, np.float32, stream=stream)
            with pytest.raises(ng.GraphMemoryError, match="conditional body"):
                ng.free(before)
            add[2, 32, stream](out, before, out)
        ng.free(before)
    fill[2, 32, stream](out, 0.0)
    cap.graph.launch()
    np.testing.assert_array_equal(host(out, stream), np.arange(N) + 3 * (1.0 + np.arange(N)))


def test_to_device_stays_refused_and_names_the_graph_owned_way(stream):
    with pytest.raises(ng.AllocationInCaptureError, match="ng.empty"):
        with ng.capture(stream):
            cuda.to_device(np.zeros(N, np.float32), stream=stream)


def test_an_allocation_for_another_stream_keeps_today_s_rule(stream, other_stream, out):
    with pytest.raises(ng.AllocationInCaptureError):
        with ng.capture(stream):
            ng.empty(N, np.float32, stream=other_stream)
    with ng.capture(stream, mode="relaxed") as cap:
        at_once = ng.empty(N, np.float32, stream=other_stream)
        fill[2, 32, stream](out, 1.0)
    assert cap.graph.memory_bytes == 0
    fill[2, 32, other_stream](at_once, 2.0)  # made at once: usable now
    np.testing.assert_array_equal(host(at_once, other_stream), 2.0 + np.arange(N))


def test_no_stream_named_while_capturing_on_two_is_refused(stream, other_stream):
    ng.begin_capture(stream, mode="relaxed")
    ng.begin_capture(other_stream, mode="relaxed")
    try:
        with pytest.raises(ng.AllocationInCaptureError, match="name the stream"):
            ng.empty(N, np.float32)
        tmp = ng.empty(N, np.float32, stream=other_stream)
        fill[2, 32, other_stream](tmp, 1.0)
    finally:
        ng.abort_capture(stream)
        graph = ng.end_capture(other_stream)
    assert graph.memory_bytes == N * 4


def test_another_thread_s_allocation_is_not_recorded(stream, out):
    made = []
    with ng.capture(stream, mode="relaxed") as cap:
        worker = threading.Thread(target=lambda: made.append(ng.empty(N, np.float32)))
        worker.start()
        worker.join()
        fill[2, 32, stream](out, 1.0)
    assert cap.graph.memory_bytes == 0
    fill[2, 32, stream](made[0], 2.0)
    np.testing.assert_array_equal(host(made[0], stream), 2.0 + np.arange(N))


def test_a_graph_that_owns_memory_is_neither_updated_nor_rebound(stream, out):
    def capture():
        with ng.capture(stream) as cap:
            tmp = ng.empty(N, np.float32, stream=stream)
            fill[2, 32, stream](tmp, 1.0)
            add[2, 32, stream](tmp, tmp, out)
        return cap.graph, tmp

    (first, tmp), (second, _) = capture(), capture()
    with pytest.raises(ng.NumbagraphError, match="allocates memory"):
        first.update(second)
    with pytest.raises(ng.RebindError, match="memory a graph allocated"):
        first.rebind({tmp: cuda.to_device(np.zeros(N, np.float32))})
    other = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    first.rebind({out: other})  # arrays made outside any capture move as before
    first.launch()
    np.testing.assert_array_equal(host(other, stream), 2 * (1.0 + np.arange(N)))


def test_a_reduction_inside_a_capture_gets_graph_owned_scratch(stream):
    from numbagraph.backend import active
    from numbagraph.ops import _reduce_kernels, reduce as _reduce

    many = 4 * _reduce_kernels.ADDITIVE_UNROLL * active.launch_limits()[1]
    x = cuda.to_device(np.arange(many, dtype=np.float32) % 7, stream=stream)
    out = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    _reduce._scratch.pop((active.stream_handle(stream), active.current_device_id()), None)
    with ng.capture(stream) as cap:
        ng.sum_into(x, out, stream=stream)
    assert cap.graph.memory_bytes > 0
    cap.graph.launch()
    assert out.value == float((np.arange(many) % 7).sum())


# ---------------------------------------------------------------- graphed functions

def test_a_graphed_function_returns_what_it_allocates_new_at_each_call(stream, out):
    pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)

    @ng.graphed(stream=stream)
    def step(x, pos):
        tmp = ng.empty(N, np.float32, stream=stream)
        fill_from[2, 32, stream](tmp, pos)
        result = ng.empty(N, np.float32, stream=stream)
        add[2, 32, stream](tmp, x, result)
        ng.free(tmp)
        return result

    fill[2, 32, stream](out, 0.0)
    results = []
    for t in range(4):
        pos.update(float(t))
        results.append(step(out, pos))
        np.testing.assert_array_equal(host(results[-1], stream), t + 2.0 * np.arange(N))
    info = step.cache_info()
    assert info.captures == 1 and info.eager == 1
    assert results[2] is not results[3]
    # Call 1 ran as written; the capture's result (call 2) and every replay's
    # before the last are stale, each named as the user counts calls.
    with pytest.raises(ng.StaleOutputError, match=r"call 3 of step\(\).*call 4 of step\(\)"):
        host(results[2], stream)
    with pytest.raises(ng.StaleOutputError, match="overwrote"):
        fill[2, 32, stream](results[1], 0.0)
    with pytest.raises(ng.StaleOutputError):
        results[2][:8].copy_to_host(stream=stream)  # a view of a stale result is stale
    kept = cuda.device_array(N, np.float32, stream=stream)
    ng.copy_into(results[3], kept, stream=stream)   # the newest one is fine
    step.clear()
    with pytest.raises(ng.GraphMemoryError, match="closed"):
        host(results[3], stream)
    np.testing.assert_array_equal(host(kept, stream), 3.0 + 2.0 * np.arange(N))


def test_a_stale_result_given_to_an_op_is_refused_naming_the_op(stream, out):
    @ng.graphed(stream=stream, warmup=0)
    def double(x):
        result = ng.empty(N, np.float32, stream=stream)
        ng.add_into(x, x, result, stream=stream)
        return result

    first, second = double(out), double(out)
    with pytest.raises(ng.StaleOutputError,
                       match=r"^ng\.add_into\(\): .*call 1 of double\(\).*call 2 of double\(\)"):
        ng.add_into(first, first, out, stream=stream)
    ng.add_into(second, second, out, stream=stream)   # the newest result is fine
    double.clear()


def test_a_graphed_function_may_not_return_memory_it_freed(stream, out):
    @ng.graphed(stream=stream, warmup=0)
    def step(x):
        tmp = ng.empty(N, np.float32, stream=stream)
        add[2, 32, stream](x, x, tmp)
        ng.free(tmp)
        return tmp

    with pytest.raises(ng.GraphedError, match="did not free"):
        step(out)


def test_a_graphed_function_refuses_graph_memory_as_an_argument(stream, out):
    @ng.graphed(stream=stream, warmup=0)
    def make(x):
        result = ng.empty(N, np.float32, stream=stream)
        add[2, 32, stream](x, x, result)
        return result

    @ng.graphed(stream=stream, warmup=0)
    def use(y, o):
        add[2, 32, stream](y, y, o)

    y = make(out)
    other = cuda.device_array(N, np.float32, stream=stream)
    use(other, out)
    for given in (y, y[:N], (y,)[0]):
        with pytest.raises(ng.GraphMemoryError, match="argument 0 of use"):
            use(given, out)
    with pytest.raises(ng.GraphMemoryError, match="argument 0 of make"):
        make(y)
    kept = cuda.device_array(N, np.float32, stream=stream)
    ng.copy_into(y, kept, stream=stream)
    use(kept, out)            # a copy made outside any capture is fine
    make.clear()
    with pytest.raises(ng.GraphMemoryError, match="clear"):
        host(y, stream)


@cuda.jit
def add_pair(pair, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = pair[0][i] + pair[1][i]


def test_arrays_inside_tuple_arguments_are_checked(stream, out):
    with ng.capture(stream) as cap:
        tmp = ng.empty(N, np.float32, stream=stream)
        fill[2, 32, stream](tmp, 1.0)
    with pytest.raises(ng.GraphMemoryError, match="not been launched"):
        add_pair[2, 32, stream]((tmp, tmp), out)
    cap.graph.launch()
    add_pair[2, 32, stream]((tmp, tmp), out)
    np.testing.assert_array_equal(host(out, stream), 2 * (1.0 + np.arange(N)))


def test_device_array_like_keeps_a_fortran_layout_and_bad_shapes_are_refused(stream, out):
    like = np.asfortranarray(np.zeros((4, 8), np.float32))
    with ng.capture(stream) as cap:
        made = cuda.device_array_like(like, stream=stream)
        with pytest.raises(ValueError, match="negative"):
            cuda.device_array(-5, np.float32, stream=stream)
        fill[2, 32, stream](out, 0.0)
    assert made.strides == cuda.device_array_like(like, stream=stream).strides
    assert cap.graph.memory_bytes == 4 * 8 * 4


@pytest.mark.parametrize("shape", [1.5, "8", None, (2, 1.5), (True, 4), (-1,)])
@pytest.mark.parametrize("make", [ng.empty, ng.zeros])
def test_a_shape_that_is_not_whole_numbers_is_an_op_error_naming_it(make, shape):
    with pytest.raises(ng.OpError, match="shape"):
        make(shape, np.float32)


@pytest.mark.parametrize("make", [ng.empty, ng.zeros])
def test_a_shape_larger_than_any_device_is_refused_before_the_driver_is_asked(make, stream):
    with pytest.raises(ng.OpError, match="more than any device holds"):
        make((2**62, 4), np.float32, stream=stream)
    with ng.capture(stream) as cap:
        with pytest.raises(ng.OpError, match="more than any device holds"):
            make((2**62, 4), np.float32, stream=stream)
        fill[1, 32, stream](make(N, np.float32, stream=stream), 1.0)
    cap.graph.launch()          # the capture went on after the refusal
