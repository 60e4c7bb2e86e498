"""A graphed function's rebindings made again: a call bringing back arrays
a graph was bound to before sets the nodes that rebinding changed, with no
moves worked out, and holds the graph as a rebinding would. The functions
here hold one graph a signature (``max_graphs``), so that arrays that come
back rebind it rather than get a graph of their own (test_graphed_twins)."""

import gc
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active as backend
from numbagraph.errors import GraphedWarning
from numbagraph.graph import CapturedGraph
from conftest import axpy, dev, host


@cuda.jit
def shift_add(x, out):
    """out[i] += x[i] for the elements both have."""
    i = cuda.grid(1)
    if i < out.size and i < x.size:
        out[i] += x[i]


@pytest.fixture
def moves(monkeypatch):
    """How many rebindings worked out their moves."""
    made = [0]
    original = CapturedGraph._move

    def counted(self, *args, **kwargs):
        made[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CapturedGraph, "_move", counted)
    return made


def test_arrays_brought_back_are_bound_again_without_working_out_moves(stream, moves):
    sets = [tuple(dev(np.arange(16) * (k + 1) + j, stream) for j in range(3)) for k in range(3)]
    two = ng.DeviceScalar(2.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, max_graphs=1)
    def step(x, y, out):
        axpy[1, 16, stream](x, y, out, two)
        return out

    worked_out = []
    for call in range(12):
        x, y, out = sets[call % 3]
        assert step(x, y, out) is out
        np.testing.assert_array_equal(host(out, stream), 2 * host(x, stream) + host(y, stream))
        worked_out.append(moves[0])
    # Calls 0 and 1 run and capture; 2 to 5 rebind from one set to the next
    # for the first time (2 to arrays never seen, so its rebinding is not
    # kept); every later call makes one of those kept again.
    assert worked_out[5] == worked_out[-1] == 4
    info = step.cache_info()
    assert (info.captures, info.rebinds) == (1, 10)


def test_views_and_scalars_move_with_their_arrays(stream, moves):
    n = 12
    xs = [dev(np.arange(n) + 100 * k, stream) for k in range(2)]
    outs = [dev(np.zeros(n), stream) for _ in range(2)]
    scales = [ng.DeviceScalar(s, np.float32, stream=stream) for s in (2.0, 3.0)]

    @ng.graphed(stream=stream, max_graphs=1)
    def step(x, out, a):
        axpy[1, n, stream](x, x, out, a)
        shift_add[1, n, stream](x[2:], out[:-2])
        return out

    for call in range(8):
        k = call % 2
        step(xs[k], outs[k], scales[k])
        x = host(xs[k], stream)
        want = (scales[k].value + 1) * x
        want[:-2] += x[2:]
        np.testing.assert_array_equal(host(outs[k], stream), want)
    assert moves[0] == 2
    scales[1].update(5.0)
    step(xs[1], outs[1], scales[1])
    np.testing.assert_array_equal(host(outs[1], stream)[-2:], 6 * host(xs[1], stream)[-2:])


def test_a_rebinding_kept_to_be_made_again_keeps_no_array_alive(stream):
    x = dev(np.arange(8), stream)

    @ng.graphed(stream=stream, max_graphs=1)
    def step(out):
        shift_add[1, 8, stream](x, out)
        return out

    first, second = dev(np.zeros(8), stream), dev(np.zeros(8), stream)
    for k in range(6):
        step((first, second)[k % 2])
    gone = weakref.ref(second)
    third = dev(np.zeros(8), stream)
    step(third)
    del second
    gc.collect()
    stream.synchronize()
    assert gone() is None
    step(first)
    np.testing.assert_array_equal(host(first, stream), 4 * np.arange(8))
    np.testing.assert_array_equal(host(third, stream), np.arange(8))


def test_a_graph_given_new_sizes_works_its_moves_out_again(stream, moves):
    @ng.graphed(stream=stream, sizes="update", max_graphs=1)
    def step(x, out):
        shift_add[4, 16, stream](x, out)
        return out

    def arrays(n):
        return [(dev(np.arange(n) + k, stream), dev(np.zeros(n), stream)) for k in range(2)]

    small, large = arrays(16), arrays(48)
    calls = [small] * 6 + [large] * 6 + [small] * 6
    worked_out = []
    for k, pair in enumerate(calls):
        x, out = pair[k % 2]
        before = host(out, stream)
        step(x, out)
        np.testing.assert_array_equal(host(out, stream), before + host(x, stream))
        worked_out.append(moves[0])
    assert step.cache_info().captures == 1
    # A new size forgets the rebindings kept: each size's first changes of
    # arrays are worked out again, then made again.
    assert worked_out[3] == worked_out[5] == 2
    assert worked_out[9] - worked_out[5] == 3 and worked_out[11] == worked_out[9]
    assert worked_out[14] - worked_out[11] == 2 and worked_out[17] == worked_out[14]


def test_a_change_of_the_graph_between_calls_is_not_undone(stream):
    xs = [dev(np.arange(8) + k, stream) for k in range(2)]
    out = dev(np.zeros(8), stream)

    @ng.graphed(stream=stream, max_graphs=1)
    def step(x):
        shift_add[1, 8, stream](x, out)

    for k in range(4):
        step(xs[k % 2])
    graph = step._caches[next(iter(step._caches))].last_entry.graph
    with ng.capture(stream) as cap:
        shift_add[1, 8, stream](xs[0], out)
    graph.update(cap.graph)          # the graph now runs on xs[0]
    cap.graph.close()
    before = host(out, stream)
    step(xs[0])
    np.testing.assert_array_equal(host(out, stream), before + host(xs[0], stream))
    before = host(out, stream)
    step(xs[1])
    np.testing.assert_array_equal(host(out, stream), before + host(xs[1], stream))


def _leaves(value):
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif hasattr(value, "__slots__") and not isinstance(value, ng.DeviceScalar):
        for name in value.__slots__:
            yield from _leaves(getattr(value, name, None))
    else:
        yield value


def test_what_a_graph_keeps_of_its_rebindings_names_no_array(stream):
    x = dev(np.arange(8), stream)
    scales = [ng.DeviceScalar(s, np.float32, stream=stream) for s in (2.0, 3.0)]
    outs = [dev(np.zeros(8), stream) for _ in range(2)]

    @ng.graphed(stream=stream, max_graphs=1)
    def step(out, a):
        axpy[1, 8, stream](x, x, out, a)
        shift_add[1, 8, stream](x[1:], out)
        return out

    for k in range(6):
        step(outs[k % 2], scales[k % 2])
    entry = step._caches[next(iter(step._caches))].last_entry
    assert len(entry.transitions) == 2
    kept = list(_leaves([transition for _, transition in entry.transitions.values()]))
    arrays = (*type(x).__mro__[:1], ng.DeviceScalar)
    assert not [leaf for leaf in kept if isinstance(leaf, arrays)]


def triples(stream, count, n=16, base=10):
    """``count`` sets of three arrays of ``n`` float32, each its own values."""
    return [tuple(dev(np.arange(n) + base * k + j, stream) for j in range(3))
            for k in range(count)]


def axpy_step(stream, **options):
    """``step(x, y, out)``: out = 2 x + y, graphed on ``stream`` (holding one
    graph unless ``options`` say otherwise)."""
    two = ng.DeviceScalar(2.0, np.float32, stream=stream)
    options.setdefault("max_graphs", 1)

    @ng.graphed(stream=stream, **options)
    def step(x, y, out):
        axpy[1, 16, stream](x, y, out, two)

    return step


def called(step, arrays, stream):
    """Call ``step`` with ``arrays`` and check what it wrote."""
    x, y, out = arrays
    step(x, y, out)
    np.testing.assert_array_equal(host(out, stream), 2 * host(x, stream) + host(y, stream))


def test_two_signatures_taking_turns_each_make_their_own_rebindings_again(stream, moves):
    small, large = triples(stream, 2, n=8), triples(stream, 2, base=100)
    step = axpy_step(stream, max_graphs=2)
    worked_out = []
    for call in range(16):
        # The signatures alternate: no call finds its arrays in the call before.
        called(step, (small if call % 2 == 0 else large)[(call // 2) % 2], stream)
        worked_out.append(moves[0])
    assert worked_out[-1] == worked_out[7]
    info = step.cache_info()
    assert (info.captures, info.graphs, info.evictions) == (2, 2, 0)


def test_a_graph_evicted_between_calls_is_captured_again_not_made_again(stream, moves):
    small, (large,) = triples(stream, 2, n=8), triples(stream, 1)
    step = axpy_step(stream, max_graphs=1, warmup=0)
    for call in range(4):
        step(*small[call % 2])
    with pytest.warns(GraphedWarning, match="closed the least recently used"):
        step(*large)             # evicts the graph of the small arrays
    with pytest.warns(GraphedWarning, match="closed the least recently used"):
        called(step, small[0], stream)
    for call in range(1, 4):
        called(step, small[call % 2], stream)
    info = step.cache_info()
    assert info.evictions == 2 and info.captures == 3 and info.graphs == 1


def test_arrays_brought_back_take_the_short_way_past_the_full_call(stream, monkeypatch):
    from numbagraph.graphed import GraphedFunction
    sets, step = triples(stream, 2), axpy_step(stream)
    for call in range(4):
        step(*sets[call % 2])
    full = [0]
    original = GraphedFunction._call

    def counted(self, *args):
        full[0] += 1
        return original(self, *args)

    monkeypatch.setattr(GraphedFunction, "_call", counted)
    for call in range(6):
        called(step, sets[call % 2], stream)
    assert full[0] == 0
    info = step.cache_info()
    assert (info.captures, info.rebinds, info.hits) == (1, 8, 8)
    # Arrays in a combination no call gave before: the call is worked out.
    step(sets[0][0], sets[0][1], sets[1][2])
    assert full[0] == 1


def test_a_rebinding_made_again_that_raises_leaves_the_function_usable(stream, monkeypatch):
    from numbagraph.errors import RebindError
    sets, step = triples(stream, 2), axpy_step(stream)
    for call in range(4):
        step(*sets[call % 2])
    original = CapturedGraph._redo

    def refused(self, *args):
        raise RebindError("refused by the driver, the graph unchanged")

    monkeypatch.setattr(CapturedGraph, "_redo", refused)
    with pytest.raises(RebindError, match="refused"):
        step(*sets[0])
    monkeypatch.setattr(CapturedGraph, "_redo", original)
    for k in (1, 1, 0, 1):      # the graph is bound to sets[1] still
        sets[k][2].copy_to_device(np.zeros(16, np.float32), stream=stream)
        called(step, sets[k], stream)


def test_a_new_view_of_the_bound_memory_moves_nothing(stream, moves):
    n = 16
    buf = dev(np.zeros(2 * n), stream)
    other = dev(np.zeros(n), stream)
    x = dev(np.arange(n), stream)
    y = dev(np.ones(n), stream)
    two = ng.DeviceScalar(2.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, max_graphs=1)
    def step(x, y, out):
        axpy[1, n, stream](x, y, out, two)
        return out

    expected = 2 * np.arange(n) + 1
    for call in range(4):
        # A new view of the same memory at each call: nothing to move.
        out = buf[:n]
        assert step(x, y, out) is out
        np.testing.assert_array_equal(host(buf, stream)[:n], expected)
    info = step.cache_info()
    assert (info.captures, info.rebinds, moves[0]) == (1, 0, 0)
    # The graph still moves from the memory to another array, and back to a
    # view of it made after the graph was captured.
    step(x, y, other)
    np.testing.assert_array_equal(host(other, stream), expected)
    buf.copy_to_device(np.zeros(2 * n, np.float32), stream=stream)
    step(x, y, buf[:n])
    np.testing.assert_array_equal(host(buf, stream), np.r_[expected, np.zeros(n)])
    assert step.cache_info().rebinds == 2


def test_a_plain_value_where_the_latest_call_had_an_array_since_freed(stream):
    n = 8
    y = dev(np.ones(n), stream)
    out = dev(np.zeros(n), stream)
    two = ng.DeviceScalar(2.0, np.float32, stream=stream)

    @ng.graphed(stream=stream)
    def step(x, y, out):
        axpy[1, n, stream](y if x is None else x, y, out, two)
        return out

    x = dev(np.arange(n), stream)
    step(x, y, out)  # run as written: the call is remembered, its arrays weakly
    del x
    gc.collect()
    step(None, y, out)
    np.testing.assert_array_equal(host(out, stream), np.full(n, 3.0))
    step(None, y, out)
    np.testing.assert_array_equal(host(out, stream), np.full(n, 3.0))
    # An array there again is another signature, whose launches read it.
    x = dev(np.arange(n), stream)
    for _ in range(3):
        step(x, y, out)
        np.testing.assert_array_equal(host(out, stream), 2 * np.arange(n) + 1)


class Swappable:
    """Another library's array whose memory changes under the same object
    (a tensor given new storage)."""

    def __init__(self, array):
        self.array = array

    @property
    def __cuda_array_interface__(self):
        return backend.array_interface(self.array)


def test_an_array_whose_memory_moved_under_the_same_object_is_moved(stream):
    n = 8
    x = Swappable(dev(np.arange(n), stream))
    y = dev(np.ones(n), stream)
    outs = [dev(np.zeros(n), stream) for _ in range(2)]
    two = ng.DeviceScalar(2.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, max_graphs=1)
    def step(x, y, out):
        axpy[1, n, stream](x.array, y, out, two)     # the memory x stands for
        return out

    step(x, y, outs[0])
    step(x, y, outs[1])
    x.array = dev(np.arange(n) * 10, stream)    # new memory, the same object
    step(x, y, outs[0])
    np.testing.assert_array_equal(host(outs[0], stream), 20 * np.arange(n) + 1)
