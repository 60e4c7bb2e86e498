"""Graphs inside graphs: a captured graph launched inside a capture is
recorded as a child graph node, a copy of the graph as it runs then, and the
new graph keeps what it uses alive."""

import gc
import warnings
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph import _registry
from conftest import host

N = 32


@pytest.fixture(autouse=True)
def no_capture_left_behind():
    yield
    left = _registry.active()
    for session in left:
        ng.capture.__exit__(ng.capture(session.stream), KeyError, KeyError(), None)
    assert not left, "a test left a capture active"


@cuda.jit
def add(x, v):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += v


@cuda.jit
def add_scalar(x, v):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += v[0]


@cuda.jit
def count_down(counter, cond):
    if cuda.grid(1) == 0:
        counter[0] -= 1
        ng.set_condition(cond, counter[0] > 0)


@pytest.fixture
def x(stream):
    a = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    add[1, N, stream](a, np.float32(0.0))  # compile outside any capture
    return a


def adding(stream, array, v=1.0):
    """The graph of one launch adding ``v`` to ``array``."""
    with ng.capture(stream) as cap:
        add[1, N, stream](array, np.float32(v))
    return cap.graph


# ---------------------------------------------------------------- embedding


def test_a_graph_launched_n_times_into_a_capture_runs_n_times_per_replay(stream, x):
    child = adding(stream, x)
    with ng.capture(stream) as cap:
        for _ in range(3):
            child.launch(stream)
    np.testing.assert_array_equal(host(x, stream), 0.0)  # recorded, not run
    assert cap.graph.num_nodes == 3
    for replays in (1, 2, 3):
        cap.graph.launch()
        np.testing.assert_array_equal(host(x, stream), 3.0 * replays)
    child.launch()                                       # still a graph of its own
    np.testing.assert_array_equal(host(x, stream), 10.0)


def test_a_child_runs_in_order_with_the_work_around_it(stream, x):
    _scale[1, N, stream](x, np.float32(1.0))
    with ng.capture(stream) as c:
        add[1, N, stream](x, np.float32(1.0))
    child = c.graph
    with ng.capture(stream) as cap:
        add[1, N, stream](x, np.float32(1.0))  # 1
        child.launch(stream)                   # 2
        _scale[1, N, stream](x, np.float32(3.0))  # 6
        child.launch()                         # default stream: the child's own, capturing
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 7.0)


@cuda.jit
def _scale(x, k):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= k


def test_a_child_on_another_capture_stream_and_nested_children(stream, other_stream, x):
    inner = adding(other_stream, x)
    with ng.capture(other_stream) as mid:
        inner.launch(other_stream)
        inner.launch(other_stream)
    with ng.capture(stream) as outer:
        mid.graph.launch(stream)       # a child holding two children
        inner.launch(stream)
    outer.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 3.0)


def test_the_parent_keeps_what_the_child_uses_after_the_child_is_dropped(stream):
    y = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    only_child = cuda.to_device(np.ones(N, np.float32), stream=stream)
    with ng.capture(stream) as c:
        add_scalar[1, N, stream](y, only_child)
    child = c.graph
    with ng.capture(stream) as cap:
        child.launch(stream)
    parent = cap.graph
    array_ref, child_ref = weakref.ref(only_child), weakref.ref(child)
    del only_child, c
    child.close()
    del child
    gc.collect()
    assert child_ref() is None
    assert array_ref() is not None            # kept by the parent
    parent.launch()
    parent.launch()
    np.testing.assert_array_equal(host(y, stream), 2.0)
    parent.close()
    del parent, cap
    gc.collect()
    assert array_ref() is None


def test_later_changes_to_the_child_do_not_reach_the_embedded_copy(stream, x):
    y = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    child = adding(stream, x)
    with ng.capture(stream) as cap:
        child.launch(stream)
    child.rebind({x: y})
    child.launch()
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 1.0)
    np.testing.assert_array_equal(host(y, stream), 1.0)


def test_an_updated_child_is_embedded_as_it_runs(stream, x):
    child, source = adding(stream, x, 1.0), adding(stream, x, 5.0)
    child.update(source)   # the driver embeds source's definition: kept open
    with ng.capture(stream) as cap:
        child.launch(stream)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 5.0)


def test_a_child_on_a_forked_stream(stream, other_stream, x):
    y = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    child = adding(stream, y, 2.0)
    with ng.capture(stream) as cap:
        with ng.fork(other_stream):
            child.launch(other_stream)
        add[1, N, stream](x, np.float32(1.0))
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 2.0)
    np.testing.assert_array_equal(host(x, stream), 1.0)


def test_the_parent_cannot_rebind_what_only_a_child_uses(stream, x):
    y = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    child = adding(stream, x)
    with ng.capture(stream) as cap:
        child.launch(stream)
    with pytest.raises(ng.RebindError, match="no node"):
        cap.graph.rebind({x: y})


def test_scalars_ordered_on_another_stream_than_the_capture_s_warn(stream, other_stream, x):
    v = ng.DeviceScalar(1.0, dtype=np.float32, stream=other_stream)
    add_scalar[1, N, other_stream](x, v)
    other_stream.synchronize()
    with ng.capture(other_stream) as c:
        add_scalar[1, N, other_stream](x, v)
    with pytest.warns(ng.CaptureWarning, match="ordered on"):
        with ng.capture(stream):
            c.graph.launch(stream)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.CaptureWarning)
        with ng.capture(other_stream):
            c.graph.launch(other_stream)


# ---------------------------------------------------------------- refusals


def _refused_and_the_capture_goes_on(stream, x, call, error, match):
    with ng.capture(stream) as cap:
        add[1, N, stream](x, np.float32(1.0))
        with pytest.raises(error, match=match) as refused:
            call()
        assert "Nothing was recorded" in str(refused.value) or error is ng.GraphClosedError
        add[1, N, stream](x, np.float32(1.0))
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 2.0)
    return refused.value


def test_a_closed_graph_is_refused(stream, other_stream, x):
    child = adding(other_stream, cuda.to_device(np.zeros(N, np.float32), stream=other_stream))
    child.close()
    _refused_and_the_capture_goes_on(
        stream, x, lambda: child.launch(stream), ng.GraphClosedError, "closed")


def test_a_graph_that_owns_memory_is_refused(stream, other_stream, x):
    with ng.capture(other_stream) as c:
        tmp = ng.empty(N, np.float32, stream=other_stream)
        add[1, N, other_stream](tmp, np.float32(1.0))
    _refused_and_the_capture_goes_on(
        stream, x, lambda: c.graph.launch(stream), ng.GraphMemoryError, "memory nodes")


def test_a_graph_with_a_conditional_node_is_refused(stream, other_stream, x):
    counter = cuda.to_device(np.array([2], np.int32), stream=other_stream)
    with ng.capture(other_stream) as c:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_down[1, 1, other_stream](counter, more)
    _refused_and_the_capture_goes_on(
        stream, x, lambda: c.graph.launch(stream), ng.ConditionalError, "conditional node")


def test_a_rebound_graph_is_refused(stream, other_stream, x):
    y = cuda.to_device(np.zeros(N, np.float32), stream=other_stream)
    z = cuda.to_device(np.zeros(N, np.float32), stream=other_stream)
    child = adding(other_stream, y)
    child.rebind({y: z})
    error = _refused_and_the_capture_goes_on(
        stream, x, lambda: child.launch(stream), ng.NumbagraphError, "rebound")
    assert type(error) is ng.NumbagraphError


def test_upload_on_a_capturing_stream_stays_refused(stream, x):
    child = adding(stream, x)
    with pytest.raises(ng.UncapturableOperationError, match="graph.upload"):
        with ng.capture(stream):
            child.upload(stream)
    assert not ng.is_capturing(stream)


# ---------------------------------------------------------------- graphs as bodies


def test_a_graph_as_a_repeat_body_runs_at_every_pass(stream, x):
    child = adding(stream, x)
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=5, body=child):
            pass
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 5.0)
    pos.update(3)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 7.0)


def test_a_graph_as_a_while_loop_body_with_the_kernel_that_ends_it(stream, x):
    child = adding(stream, x, 2.0)
    counter = cuda.to_device(np.array([4], np.int32), stream=stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more, body=child):
            count_down[1, 1, stream](counter, more)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 8.0)


def test_a_graph_launched_inside_a_body_is_a_child_of_the_body(stream, x):
    child = adding(stream, x)
    counter = cuda.to_device(np.array([3], np.int32), stream=stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            child.launch(stream)
            child.launch(stream)
            count_down[1, 1, stream](counter, more)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 6.0)


def test_graphs_as_branch_bodies(stream, x):
    y = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    to_x, to_y = adding(stream, x), adding(stream, y)
    flag = ng.DeviceScalar(1, dtype=np.int32, stream=stream)
    with ng.capture(stream) as cap:
        taken = ng.Condition(default=0)
        _set_from[1, 1, stream](taken, flag)
        with ng.if_then(taken, body=to_x):
            pass
    cap.graph.launch()
    flag.update(0)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 1.0)
    with ng.capture(stream) as cap:
        branch = ng.Condition(default=0)
        _set_from[1, 1, stream](branch, flag)
        then, orelse = ng.if_else(branch, body=(to_x, None))
        with then:
            pass
        with orelse:
            to_y.launch(stream)
            to_y.launch(stream)
    cap.graph.launch()                 # flag 0: the else block
    flag.update(1)
    cap.graph.launch()                 # flag 1: the then block
    np.testing.assert_array_equal(host(x, stream), 2.0)
    np.testing.assert_array_equal(host(y, stream), 2.0)


@cuda.jit
def _set_from(cond, value):
    if cuda.grid(1) == 0:
        ng.set_condition(cond, value[0])


def test_a_bad_body_is_refused_before_anything_is_recorded(stream, other_stream, x):
    counter = cuda.to_device(np.array([1], np.int32), stream=stream)
    closed = adding(other_stream, cuda.to_device(np.zeros(N, np.float32), stream=other_stream))
    closed.close()
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with pytest.raises(TypeError, match="captured graph"):
            ng.while_loop(more, body=add)
        with pytest.raises(ng.GraphClosedError):
            ng.while_loop(more, body=closed)
        with pytest.raises(ValueError, match="2 blocks"):
            ng.if_else(more, body=(closed,))
        with pytest.raises(ng.GraphClosedError):
            ng.repeat(pos, until=3, body=closed)
        with ng.while_loop(more):      # the Condition is still unused
            add[1, N, stream](x, np.float32(1.0))
            count_down[1, 1, stream](counter, more)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 1.0)
