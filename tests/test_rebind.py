"""CapturedGraph.rebind: a graph pointed at other arrays of one layout,
without capturing or instantiating again."""

import gc
import threading
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import axpy, dev


@cuda.jit
def add_rows(m, out):
    """out[j] = m[0, j] + m[1, j]."""
    j = cuda.grid(1)
    if j < out.size:
        out[j] = m[0, j] + m[1, j]


@cuda.jit
def count_while_below(counter, limit, cond):
    if cuda.grid(1) == 0:
        counter[0] += 1
        ng.set_condition(cond, counter[0] < limit[0])


@cuda.jit
def bump(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@cuda.jit
def copy_pair(pair):
    """pair.dst = pair.src + 1."""
    i = cuda.grid(1)
    if i < pair.dst.size:
        pair.dst[i] = pair.src[i] + 1


def host(array, stream):
    return array.copy_to_host(stream=stream)


@pytest.fixture
def arrays(stream):
    """Four float32 arrays of 8 with distinct contents and a scalar 2.0."""
    x, y, z = (dev(np.arange(8) * k, stream) for k in (1, 10, 100))
    out = dev(np.zeros(8), stream)
    a = ng.DeviceScalar(2.0, np.float32, stream=stream)
    axpy[1, 8, stream](x, y, out, a)
    return x, y, z, out, a


def captured(stream, *launches):
    with ng.capture(stream) as cap:
        for launch in launches:
            launch()
    return cap.graph


def test_a_rebound_graph_reads_and_writes_the_new_arrays(stream, arrays):
    x, y, z, out, a = arrays
    other = dev(np.zeros(8), stream)
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    before = host(out, stream)
    graph.rebind({x: z, out: other})
    graph.launch()
    np.testing.assert_array_equal(host(other, stream), 2 * host(z, stream) + host(y, stream))
    np.testing.assert_array_equal(host(out, stream), before)  # not written any more
    graph.rebind([(z, x)])
    graph.launch()
    np.testing.assert_array_equal(host(other, stream), 2 * host(x, stream) + host(y, stream))


def test_views_move_with_their_array_to_the_same_offset(stream):
    m = dev(np.arange(16).reshape(2, 8), stream)
    n = dev(np.arange(16).reshape(2, 8) * 7, stream)
    flat = dev(np.zeros(16), stream)
    other_flat = dev(np.zeros(16), stream)
    add_rows[1, 8, stream](m, flat[:8])

    def work():
        add_rows[1, 8, stream](m, flat[:8])          # a slice of flat
        add_rows[1, 8, stream](m, flat.reshape(2, 8)[1])  # a row of a reshape

    graph = captured(stream, work)
    before = host(flat, stream)
    graph.rebind({m: n, flat: other_flat})
    graph.launch()
    rows = host(n, stream)
    expect = np.concatenate([rows[0] + rows[1]] * 2)
    np.testing.assert_array_equal(host(other_flat, stream), expect)
    np.testing.assert_array_equal(host(flat, stream), before)


def test_swapped_arrays_are_rebound_at_once(stream, arrays):
    x, y, z, out, a = arrays
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    graph.rebind({x: y, y: x})   # every pointer moves from where it was
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * host(y, stream) + host(x, stream))


def test_a_scalar_read_by_a_kernel_is_rebound_to_another_scalar(stream, arrays):
    x, y, z, out, a = arrays
    b = ng.DeviceScalar(-1.0, np.float32, stream=stream)
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    graph.rebind({a: b})
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), -host(x, stream) + host(y, stream))
    b.update(3.0)
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 3 * host(x, stream) + host(y, stream))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_a_scalar_update_recorded_in_the_graph_follows_the_rebinding(stream, dtype):
    x = dev(np.zeros(8), stream, dtype)
    pos = ng.DeviceScalar(0, dtype, stream=stream)
    other = ng.DeviceScalar(0, dtype, stream=stream)
    with ng.capture(stream) as cap:
        pos.update(5)                      # recorded: a fill node
    graph = cap.graph
    graph.rebind({pos: other})
    graph.launch()
    stream.synchronize()
    assert other.value == 5 and pos.value == 0


def test_a_device_copy_recorded_in_the_graph_follows_the_rebinding(stream, arrays):
    x, y, z, out, a = arrays
    target = dev(np.zeros(8), stream)
    ng.copy_into(x, out, stream=stream)
    graph = captured(stream, lambda: ng.copy_into(x, out, stream=stream))
    graph.rebind({x: z, out: target})
    graph.launch()
    np.testing.assert_array_equal(host(target, stream), host(z, stream))
    assert host(z, stream).any()


def test_nodes_inside_a_while_body_are_rebound(stream):
    counter = dev([0], stream, np.int32)
    other = dev([100], stream, np.int32)
    limit = ng.DeviceScalar(3, np.int32, stream=stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_while_below[1, 1, stream](counter, limit, more)
    graph = cap.graph
    graph.launch()
    assert host(counter, stream)[0] == 3
    graph.rebind({counter: other})
    graph.launch()
    assert host(other, stream)[0] == 101   # the body ran once: 101 >= 3
    assert host(counter, stream)[0] == 3


def test_the_graph_keeps_the_new_arrays_alive_and_drops_the_old(stream, arrays):
    x, y, z, out, a = arrays
    old = dev(np.arange(8), stream)
    new = dev(np.arange(8) * 3, stream)
    graph = captured(stream, lambda: axpy[1, 8, stream](old, y, out, a))
    old_ref, new_ref = weakref.ref(old), weakref.ref(new)
    expect = 2 * host(new, stream) + host(y, stream)
    graph.rebind({old: new})
    del old, new
    gc.collect()
    assert old_ref() is None
    assert new_ref() is not None
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), expect)
    graph.close()
    gc.collect()
    assert new_ref() is None


def test_an_update_from_a_rebound_graph_takes_its_new_arrays(stream, arrays):
    x, y, z, out, a = arrays
    first = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    second = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    first.rebind({x: z})
    second.update(first)
    second.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * host(z, stream) + host(y, stream))
    # Rebinding the updated graph starts from what it runs now.
    second.rebind({z: y})
    second.launch()
    np.testing.assert_array_equal(host(out, stream), 3 * host(y, stream))
    first.launch()   # first is untouched by second's rebinding
    np.testing.assert_array_equal(host(out, stream), 2 * host(z, stream) + host(y, stream))


def test_a_foreign_array_interface_object_can_be_rebound(stream, arrays):
    x, y, z, out, a = arrays

    from numbagraph.backend import active as backend

    class Foreign:
        """Another library's array over z's memory."""

        def __init__(self, array):
            self.array = array
            self.__cuda_array_interface__ = backend.array_interface(array)

    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    graph.rebind([(x, Foreign(z))])
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * host(z, stream) + host(y, stream))


# ---------------------------------------------------------------- refusals


def _unchanged(graph, stream, arrays):
    x, y, z, out, a = arrays
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * host(x, stream) + host(y, stream))


@pytest.mark.parametrize("mapping, match", [
    (lambda x, z: {z: x}, "does not use"),
    (lambda x, z: {x: dev(np.zeros(9), None)}, "layout"),
    (lambda x, z: {x: dev(np.zeros(8), None, np.float64)}, "layout"),
    (lambda x, z: {x: dev(np.zeros(16), None)[::2]}, "layout"),
    (lambda x, z: {x: ng.DeviceScalar(1.0, np.float32)}, "both DeviceScalars or both arrays"),
    (lambda x, z: {x: np.zeros(8, np.float32)}, "not a device array"),
    (lambda x, z: [(x, z), (x[2:], z[2:])], "overlap"),
    (lambda x, z: 5, "takes a dict"),
    (lambda x, z: [(x, z, z)], "pairs"),
])
def test_bad_mappings_are_refused_and_leave_the_graph_unchanged(stream, arrays, mapping, match):
    x, y, z, out, a = arrays
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    with pytest.raises(ng.RebindError, match=match):
        graph.rebind(mapping(x, z))
    _unchanged(graph, stream, arrays)


def test_a_refused_pair_changes_none_of_the_others(stream, arrays):
    x, y, z, out, a = arrays
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    with pytest.raises(ng.RebindError, match="pair 1"):
        graph.rebind([(x, z), (z, y)])   # z is not used by the graph
    _unchanged(graph, stream, arrays)


def test_a_closed_graph_cannot_be_rebound(stream, arrays):
    x, y, z, out, a = arrays
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    graph.close()
    with pytest.raises(ng.GraphClosedError):
        graph.rebind({x: z})


def test_rebinding_while_this_thread_captures_is_refused(stream, other_stream, arrays):
    x, y, z, out, a = arrays
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    with ng.capture(other_stream) as cap:
        with pytest.raises(ng.CaptureStateError, match="not recorded"):
            graph.rebind({x: z})
        bump[1, 8, other_stream](z)
    assert cap.graph.num_nodes == 1   # the capture went on
    _unchanged(graph, stream, arrays)


def test_rebinding_while_another_thread_captures_is_allowed(stream, other_stream, arrays):
    x, y, z, out, a = arrays
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    begun, done = threading.Event(), threading.Event()

    def capture_elsewhere():
        with ng.capture(other_stream):
            bump[1, 8, other_stream](z)
            begun.set()
            done.wait(10)

    bump[1, 8, other_stream](z)
    other_stream.synchronize()
    thread = threading.Thread(target=capture_elsewhere)
    thread.start()
    try:
        assert begun.wait(10)
        graph.rebind({x: z})
    finally:
        done.set()
        thread.join()
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * host(z, stream) + host(y, stream))


def test_a_change_the_driver_refuses_is_a_rebind_error_and_changes_nothing(
        stream, arrays, monkeypatch):
    x, y, z, out, a = arrays
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    executable = graph._executable()
    plan_rebind = type(executable).plan_rebind

    def refusing_plan(self, moves):
        plan = plan_rebind(self, moves)

        class Refused:
            used = plan.used

            def apply(self):
                raise RuntimeError("cuGraphExecKernelNodeSetParams failed")

        return Refused()

    monkeypatch.setattr(type(executable), "plan_rebind", refusing_plan)
    with pytest.raises(ng.RebindError, match="refused.*unchanged"):
        graph.rebind({x: z})
    monkeypatch.undo()
    _unchanged(graph, stream, arrays)
    graph.rebind({x: z})   # the graph still rebinds once the driver agrees
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), 2 * host(z, stream) + host(y, stream))


def test_a_view_of_an_array_the_graph_uses_whole_is_refused(stream, arrays):
    x, y, z, out, a = arrays
    big = dev(np.zeros(8), stream)
    graph = captured(stream, lambda: axpy[1, 8, stream](x, y, out, a))
    with pytest.raises(ng.RebindError, match="reaches past its end"):
        graph.rebind({out[:4]: big[:4]})
    _unchanged(graph, stream, arrays)


def test_a_strided_old_array_does_not_take_what_lies_between_its_elements(stream):
    m = dev(np.zeros((4, 3)), stream)
    n = dev(np.zeros((4, 3)), stream)
    def work():
        bump[1, 4, stream](m[:, 0])
        bump[1, 4, stream](m[:, 1])

    work()
    graph = captured(stream, work)
    with pytest.raises(ng.RebindError, match="gaps between its elements|reaches past"):
        graph.rebind({m[:, 0]: n[:, 0]})
    graph.rebind({m: n})      # the array that holds both moves them both
    graph.launch()
    np.testing.assert_array_equal(host(n, stream), [[1, 1, 0]] * 4)
    np.testing.assert_array_equal(host(m, stream), [[1, 1, 0]] * 4)


def test_namedtuple_and_structured_arguments_are_rebound(stream):
    from collections import namedtuple

    Pair = namedtuple("Pair", "src dst")
    record = np.dtype([("a", "f4"), ("b", "i8")], align=True)
    src = dev(np.full(8, 1.0), stream)
    dst, other = dev(np.zeros(8), stream), dev(np.zeros(8), stream)
    rec, rec_other = (cuda.to_device(np.array([(1.5, 7)] * 4, record), stream=stream),
                      cuda.to_device(np.zeros(4, record), stream=stream))
    rec_out = cuda.to_device(np.zeros(4, record), stream=stream)
    copy_pair[1, 8, stream](Pair(src, dst))

    def work():
        copy_pair[1, 8, stream](Pair(src, dst))
        ng.copy_into(rec, rec_out, stream=stream)

    graph = captured(stream, work)
    graph.rebind({dst: other, rec_out: rec_other})
    graph.launch()
    np.testing.assert_array_equal(host(other, stream), np.full(8, 2.0))
    assert rec_other.copy_to_host(stream=stream).tolist() == [(1.5, 7)] * 4


# ---------------------------------------------------------------- the rules of ops

def _rows(shape, stream, k=1):
    return dev(np.arange(np.prod(shape)).reshape(shape) % 7 * k, stream)


# Each op with its operands, and a rebinding that gives it operands it refuses
# when called: an input shifted over its output, or an output over an input
# a product reads from other threads.
def _add(stream):
    x, out, buf = _rows(256, stream), _rows(256, stream), _rows(257, stream)
    return ((lambda o: ng.add_into(x, 0.0, o, stream=stream)), out,
            {x: buf[1:], out: buf[:-1]}, "a of the graph's add_into would share memory")


def _softmax(stream):
    x, out, buf = _rows((4, 64), stream), _rows((4, 64), stream), _rows((5, 64), stream)
    return ((lambda o: ng.softmax_into(x, o, stream=stream)), out,
            {x: buf[1:], out: buf[:-1]}, "x of the graph's softmax_into would share memory")


def _matvec(stream):
    a, x, out, buf = _rows((4, 8), stream), _rows(8, stream), _rows(4, stream), _rows(8, stream)
    return ((lambda o: ng.matvec_into(a, x, o, stream=stream)), out,
            {x: buf, out: buf[:4]}, "out of the graph's matvec_into would overlap x")


def _copy(stream):
    x, out, buf = _rows(64, stream), _rows(64, stream), _rows(65, stream)
    return ((lambda o: ng.copy_into(x, o, stream=stream)), out,
            {x: buf[1:], out: buf[:-1]}, "out of the graph's copy_into would overlap x")


@pytest.mark.parametrize("case", [_add, _softmax, _matvec, _copy])
def test_a_rebinding_into_operands_an_op_refuses_is_refused_and_changes_nothing(stream, case):
    op, out, mapping, match = case(stream)
    expect = dev(np.zeros(out.shape), stream)
    op(expect)
    with ng.capture(stream) as cap:
        op(out)
    graph = cap.graph
    with pytest.raises(ng.RebindError, match=match) as refused:
        graph.rebind(mapping)
    assert "graph is unchanged" in str(refused.value)
    out.copy_to_device(np.zeros(out.shape, np.float32), stream=stream)
    graph.launch()
    np.testing.assert_array_equal(host(out, stream), host(expect, stream))


def test_an_op_rebound_onto_its_output_itself_computes_in_place(stream):
    x, out, y = dev(np.arange(8), stream), dev(np.zeros(8), stream), dev(np.arange(8), stream)
    with ng.capture(stream) as cap:
        ng.add_into(x, 1.0, out, stream=stream)
    graph = cap.graph
    graph.rebind({x: y, out: y})
    graph.launch()
    np.testing.assert_array_equal(host(y, stream), np.arange(8) + 1)


def test_an_ops_rule_applies_where_an_earlier_rebinding_put_its_operands(stream):
    x, out, buf = dev(np.arange(8), stream), dev(np.zeros(8), stream), dev(np.zeros(9), stream)
    with ng.capture(stream) as cap:
        ng.add_into(x, 1.0, out, stream=stream)
    graph = cap.graph
    graph.rebind({out: buf[:-1]})
    with pytest.raises(ng.RebindError, match="pair 0: after this rebinding, a of"):
        graph.rebind({x: buf[1:]})
    graph.launch()
    np.testing.assert_array_equal(host(buf, stream), [*(np.arange(8) + 1), 0])
