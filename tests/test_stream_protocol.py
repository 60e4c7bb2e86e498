"""A stream given as another library gives it, an object with only
``__cuda_stream__``, is taken wherever numbagraph takes a stream: numbagraph
hands numba a numba stream over its handle (``backend.as_numba_stream``)."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active

N = 32


class StreamLike:
    """A stream with nothing but ``__cuda_stream__``, giving the handle of a
    real stream (on the simulator, the handle numbagraph gives its streams)."""

    def __init__(self, stream):
        self._handle = active.stream_handle(stream)

    def __cuda_stream__(self):
        return (0, self._handle)


@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@cuda.jit
def add_scalar(x, v):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += v[0]


@pytest.fixture
def like(stream):
    return StreamLike(stream)


@pytest.fixture
def x(stream):
    """N float32 zeros, ``add_one`` compiled for them outside any capture."""
    x = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    add_one[1, N, stream](x)
    x.copy_to_device(np.zeros(N, np.float32), stream=stream)
    return x


def host(dev, stream):
    return dev.copy_to_host(stream=stream)


# ---------------------------------------------------------------- the backend member

def test_a_numba_stream_is_given_to_numba_as_it_is(stream):
    assert active.as_numba_stream(stream) is stream


def test_a_stream_like_becomes_a_numba_stream_of_its_handle(stream, like):
    made = active.as_numba_stream(like)
    assert isinstance(made, active.STREAM_TYPE)
    assert active.stream_handle(made) == active.stream_handle(stream)


def test_one_numba_stream_is_made_per_handle(like, stream):
    assert active.as_numba_stream(like) is active.as_numba_stream(StreamLike(stream))


def test_the_default_stream_is_zero_to_numba():
    assert active.as_numba_stream(0) == 0


def test_what_is_not_a_stream_is_refused():
    with pytest.raises(TypeError, match="bare integer"):
        active.as_numba_stream(12345)


# ---------------------------------------------------------------- entry points

def test_a_device_scalar_is_made_and_read_on_it(like):
    assert ng.DeviceScalar(3.5, np.float32, stream=like).value == 3.5


def test_a_device_scalar_updates_on_it(like):
    scalar = ng.DeviceScalar(0, np.int32, stream=like)
    scalar.update(7)
    assert scalar.value == 7


def test_a_device_scalar_on_it_is_updated_inside_a_capture(stream, like, x):
    v = ng.DeviceScalar(1.0, np.float32, stream=like)
    add_scalar[1, N, stream](x, v)
    with ng.capture(like) as cap:
        v.update(2.0)
        add_scalar[1, N, stream](x, v)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 3.0)


def test_a_graph_launches_on_it(stream, like, x):
    with ng.capture(stream) as cap:
        add_one[1, N, stream](x)
    cap.graph.launch(like)
    cap.graph.launch(like)
    np.testing.assert_array_equal(host(x, stream), 2.0)


def test_a_stream_forks_into_a_capture_as_it(stream, other_stream, x):
    y = cuda.to_device(np.zeros(N, np.float32), stream=other_stream)
    other_stream.synchronize()
    with ng.capture(StreamLike(stream)) as cap:
        with ng.fork(StreamLike(other_stream)):
            add_one[1, N, other_stream](y)
        add_one[1, N, stream](x)
    cap.graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(host(y, stream), 1.0)
    np.testing.assert_array_equal(host(x, stream), 1.0)


def test_an_op_launches_on_it(stream, like):
    out = ng.zeros(N, np.float32, stream=stream)
    total = ng.DeviceScalar(0.0, np.float32, stream=stream)
    ng.fill_into(out, 2.0, stream=like)
    ng.sum_into(out, total, stream=like)
    assert total.value == 2.0 * N


def test_a_host_callback_runs_on_it(stream, like):
    seen = []
    ng.on_host(seen.append, 1, stream=like)
    stream.synchronize()
    assert seen == [1]


def test_a_launch_record_launches_on_it(stream, like, x):
    rec = ng.launch_record(add_one, 1, N, like, x)
    rec.launch()
    rec.launch()
    np.testing.assert_array_equal(host(x, stream), 2.0)


def test_a_graphed_function_runs_on_it(stream, like, x):
    @ng.graphed(stream=like, warmup=0)
    def twice(a):
        add_one[1, N, stream](a)
        add_one[1, N, stream](a)

    twice(x)
    twice(x)
    np.testing.assert_array_equal(host(x, stream), 4.0)


def test_a_graphed_function_takes_it_per_call(stream, like, x):
    @ng.graphed(warmup=0)
    def fill(a, *, stream):
        ng.fill_into(a, 5.0, stream=stream)

    fill(x, stream=like)
    np.testing.assert_array_equal(host(x, stream), 5.0)


@pytest.mark.parametrize("make", [ng.empty, ng.zeros])
def test_an_array_made_for_it_copies_on_it(make, like):
    a = make(N, np.float32, stream=like)
    a.copy_to_device(np.ones(N, np.float32))
    np.testing.assert_array_equal(a.copy_to_host(), 1.0)


def test_graph_memory_made_for_it_copies_on_it(stream, like):
    with ng.capture(like) as cap:
        a = ng.zeros(N, np.float32, stream=like)
        add_one[1, N, stream](a)
        out = ng.empty(N, np.float32, stream=like)
        ng.copy_into(a, out, stream=like)
    cap.graph.launch()
    np.testing.assert_array_equal(out.copy_to_host(), 1.0)


def test_a_counter_on_it_is_incremented(like):
    counter = ng.DeviceScalar(1, np.int32, stream=like)
    ng.increment(counter, by=2)
    assert counter.value == 3


def test_a_loop_repeats_on_it(stream, like, x):
    pos = ng.DeviceScalar(0, np.int32, stream=like)
    with ng.capture(like) as cap:
        with ng.repeat(pos, until=3):
            add_one[1, N, stream](x)
    cap.graph.launch()
    assert pos.value == 3
    np.testing.assert_array_equal(host(x, stream), 3.0)


def test_a_loop_on_it_stops_when_a_value_passes_its_limit(stream, like, x):
    pos = ng.DeviceScalar(0, np.int32, stream=like)
    count = cuda.to_device(np.zeros(1, np.float32), stream=stream)
    with ng.capture(like) as cap:
        with ng.repeat(pos, until=10) as loop:
            add_one[1, 1, stream](count)
            ng.stop_when(loop.cond, count, above=2.5)
    cap.graph.launch()
    assert host(count, stream)[0] == 3.0
