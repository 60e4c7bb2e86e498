"""Arrays that take turns get graphs of their own: a remembered call's arrays
that come back to a graph bound to others are captured into a graph of
their signature bound to them for good (a twin), launched whenever they come
back, while the function holds fewer than ``max_graphs`` graphs and while
the call is remembered."""

import functools
import gc
import sys
import warnings
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.graph import CapturedGraph
from numbagraph.graphed import GraphedFunction
from conftest import axpy, dev, host


@cuda.jit
def add_into(x, out):
    """out[i] += x[i]."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] += x[i]


def sets_of(stream, count, n=16):
    """``count`` sets of (x, y, out), each with values of its own."""
    return [tuple(dev(np.arange(n) * (k + 1) + 10 * j, stream) for j in range(3))
            for k in range(count)]


def axpy_step(stream, **options):
    two = ng.DeviceScalar(2.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, **options)
    def step(x, y, out):
        axpy[1, 16, stream](x, y, out, two)
        return out

    return step


def called(step, arrays, stream):
    x, y, out = arrays
    out.copy_to_device(np.full(out.size, np.nan, np.float32), stream=stream)
    assert step(x, y, out) is out
    np.testing.assert_array_equal(host(out, stream), 2 * host(x, stream) + host(y, stream))


@pytest.fixture
def counted(monkeypatch):
    """Calls worked out in full, rebindings made again, and moves worked out."""
    made = {"_call": 0, "_redo": 0, "_move": 0}
    for owner, name in ((GraphedFunction, "_call"), (CapturedGraph, "_redo"),
                        (CapturedGraph, "_move")):
        original = getattr(owner, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            made[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
    return made


@pytest.mark.parametrize("turns", [2, 3, 4])
def test_sets_taking_turns_each_get_a_graph_and_nothing_is_rebound(stream, counted, turns):
    sets, step = sets_of(stream, turns), axpy_step(stream)
    for call in range(2 * turns + 1):
        called(step, sets[call % turns], stream)
    # The first call runs, the second captures and the first rebinding is
    # worked out; each set that comes back then gets its graph.
    info = step.cache_info()
    assert (info.captures, info.graphs, info.evictions) == (turns, turns, 0)
    before = dict(counted)
    for call in range(3 * turns):
        called(step, sets[call % turns], stream)
    assert counted == before        # launched: no call worked out, nothing rebound
    assert step.cache_info().rebinds == info.rebinds


def test_two_sets_in_turn_are_launched_without_searching_the_remembered_calls(
        stream, monkeypatch):
    import numbagraph.graphed  # noqa: F401  the module, which the package's name hides
    module = sys.modules["numbagraph.graphed"]
    sets, step = sets_of(stream, 2), axpy_step(stream)
    for call in range(4):
        called(step, sets[call % 2], stream)
    searched = [0]
    original = module._recent

    def counted(*args):
        searched[0] += 1
        return original(*args)

    monkeypatch.setattr(module, "_recent", counted)
    for call in range(6):
        called(step, sets[call % 2], stream)
    assert searched[0] == 0
    # A third set is searched for and rebinds the signature's graph; the
    # first set's graph is found by searching, then the second set, whose
    # graph that was, gets one of its own; after that neither is searched.
    called(step, sets_of(stream, 1)[0], stream)
    assert searched[0] == 1
    for call in range(2):
        called(step, sets[call % 2], stream)
    assert searched[0] == 3
    for call in range(6):
        called(step, sets[call % 2], stream)
    assert searched[0] == 3
    info = step.cache_info()
    assert (info.graphs, info.captures) == (3, 3)


def test_more_sets_in_turn_than_calls_remembered_rebind_one_graph(stream):
    sets, step = sets_of(stream, 7), axpy_step(stream)
    for call in range(20):
        called(step, sets[call % 7], stream)
    info = step.cache_info()
    assert (info.captures, info.graphs) == (1, 1)
    assert info.rebinds == 20 - 2


def test_max_graphs_bounds_the_twins(stream):
    sets, step = sets_of(stream, 3), axpy_step(stream, max_graphs=2)
    for call in range(12):
        called(step, sets[call % 3], stream)
    info = step.cache_info()
    assert info.graphs == 2 and info.captures == 2 and info.evictions == 0
    # The third set rebinds the graph of the signature from and to it.
    assert info.rebinds > 0


def test_a_new_signature_closes_twins_before_it_evicts_a_signature(stream):
    sets, step = sets_of(stream, 2), axpy_step(stream, max_graphs=2, warmup=0)
    for call in range(4):
        called(step, sets[call % 2], stream)
    assert step.cache_info().graphs == 2
    shorter = sets_of(stream, 1, n=8)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.GraphedWarning)   # no signature evicted
        called(step, shorter, stream)
    info = step.cache_info()
    assert (info.graphs, info.evictions) == (2, 0)
    for arrays in (*sets, shorter, *sets):
        called(step, arrays, stream)


def test_a_twin_whose_arrays_stop_coming_back_is_closed_and_lets_them_go(stream):
    step = axpy_step(stream)
    first, second = sets_of(stream, 2)
    for call in range(3):
        called(step, (first, second)[call % 2], stream)
    assert step.cache_info().graphs == 2          # first's twin
    graph = step._caches[next(iter(step._caches))].last_entry.graph
    gone = weakref.ref(first[0])
    for arrays in sets_of(stream, 6):             # six new calls: first is forgotten
        called(step, arrays, stream)
    assert step.cache_info().graphs == 1
    assert graph.closed
    del first
    gc.collect()
    stream.synchronize()
    assert gone() is None
    called(step, second, stream)


def test_twins_follow_their_scalars_and_return_their_own_arrays(stream):
    outs = [dev(np.zeros(8), stream) for _ in range(2)]
    scales = [ng.DeviceScalar(s, np.float32, stream=stream) for s in (2.0, 3.0)]
    x = dev(np.arange(8), stream)

    @ng.graphed(stream=stream)
    def step(out, a):
        axpy[1, 8, stream](x, x, out, a)
        return out

    for call in range(8):
        k = call % 2
        scales[k].update(float(call))
        assert step(outs[k], scales[k]) is outs[k]
        np.testing.assert_array_equal(host(outs[k], stream), (call + 1) * host(x, stream))
    info = step.cache_info()
    assert (info.captures, info.graphs, info.rebinds) == (2, 2, 0)


def test_clear_closes_the_twins(stream):
    sets, step = sets_of(stream, 2), axpy_step(stream)
    for call in range(4):
        called(step, sets[call % 2], stream)
    cache = step._caches[next(iter(step._caches))]
    graphs = [e.graph for e in (*cache.entries.values(), *cache.entries[next(iter(
        cache.entries))].twins)]
    assert len(graphs) == 2
    step.clear()
    assert all(graph.closed for graph in graphs)
    assert step.cache_info().graphs == 0
    for call in range(4):
        called(step, sets[call % 2], stream)


def test_a_function_given_new_sizes_keeps_one_graph_for_arrays_that_take_turns(stream):
    @ng.graphed(stream=stream, sizes="update")
    def step(x, out):
        add_into[4, 16, stream](x, out)
        return out

    def pair(n):
        return [(dev(np.arange(n) + k, stream), dev(np.zeros(n), stream)) for k in range(2)]

    for n in (16, 48, 16):
        sets = pair(n)
        for call in range(5):
            x, out = sets[call % 2]
            before = host(out, stream)
            step(x, out)
            np.testing.assert_array_equal(host(out, stream), before + host(x, stream))
        assert step.cache_info().graphs == 1
    info = step.cache_info()
    assert (info.captures, info.resizes) == (1, 2)


def test_a_ring_of_four_keeps_its_graphs_past_a_call_with_other_arrays(stream):
    sets, step = sets_of(stream, 4), axpy_step(stream)
    for call in range(12):
        called(step, sets[call % 4], stream)
    assert step.cache_info().graphs == 4
    called(step, sets_of(stream, 1)[0], stream)
    for call in range(12):
        called(step, sets[call % 4], stream)
    info = step.cache_info()
    assert (info.graphs, info.captures) == (4, 4)


def test_a_function_that_allocates_graph_memory_gets_no_twin(stream):
    one = ng.DeviceScalar(1.0, np.float32, stream=stream)

    @ng.graphed(stream=stream)
    def step(x, out):
        tmp = ng.empty(16, np.float32, stream=stream)
        axpy[1, 16, stream](x, x, tmp, one)
        add_into[1, 16, stream](tmp, out)
        ng.free(tmp)
        return out

    xs = [dev(np.arange(16) * (k + 1), stream) for k in range(2)]
    out = dev(np.zeros(16), stream)
    total = np.zeros(16, np.float32)
    for call in range(6):
        x = xs[call % 2]
        step(x, out)
        total += 2 * host(x, stream)
        np.testing.assert_array_equal(host(out, stream), total)
    info = step.cache_info()
    assert (info.captures, info.graphs) == (1, 1)


def fixed_x_step(stream):
    """``step(x, out)``: out += x, graphed on ``stream`` (no warm-up), whose
    graph cannot move ``x``, as cuBLAS's nodes cannot move their arrays."""
    from numbagraph import _rebind, _registry
    from numbagraph.backend import active

    @ng.graphed(stream=stream, warmup=0)
    def step(x, out):
        add_into[1, 16, stream](x, out)
        session = _registry.on(active.stream_handle(stream))
        if session is not None:
            session.keep(_rebind.Fixed("library product", (x,), "Capture again."))

    return step


def test_arrays_a_graph_cannot_move_that_take_turns_stop_capturing_at_each_call(stream):
    step = fixed_x_step(stream)
    xs = [dev(np.arange(16) * (k + 1), stream) for k in range(2)]
    out = dev(np.zeros(16), stream)
    total = np.zeros(16, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ng.GraphedWarning)
        for call in range(8):
            step(xs[call % 2], out)
            total += host(xs[call % 2], stream)
            np.testing.assert_array_equal(host(out, stream), total)
    # x's first graph is captured again for the second x, then the first x
    # comes back and gets a graph of its own: no capture after the third.
    info = step.cache_info()
    assert (info.captures, info.graphs, info.rebinds) == (3, 2, 0)



def test_a_twin_that_fails_to_capture_leaves_the_call_to_a_rebinding(stream):
    failing = [False]
    runs = [0]

    @ng.graphed(stream=stream)
    def step(x, out):
        runs[0] += 1
        if failing[0]:
            raise RuntimeError("refused while captured")
        add_into[1, 16, stream](x, out)

    xs = [dev(np.arange(16) * (k + 1), stream) for k in range(2)]
    out = dev(np.zeros(16), stream)
    step(xs[0], out)
    step(xs[1], out)                  # captured
    failing[0] = True
    with pytest.warns(ng.GraphedWarning, match=r"could not capture a graph of its own "
                                               r"for arrays that came back \(RuntimeError"):
        step(xs[0], out)
    assert runs[0] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.GraphedWarning)
        for call in range(1, 7):
            step(xs[call % 2], out)
    assert runs[0] == 3               # no capture tried again: the graph is rebound
    total = 5 * host(xs[0], stream) + 4 * host(xs[1], stream)
    np.testing.assert_array_equal(host(out, stream), total)
    info = step.cache_info()
    assert (info.captures, info.graphs, info.rebinds) == (1, 1, 7)


@pytest.mark.parametrize("turns, graphs", [
    (3, (2, 1)),     # the first set's graph, forgotten after 2 launches: no more
    (40, (3, 2)),    # forgotten after 20: the first set gets a graph again
])
def test_arrays_that_come_back_too_seldom_stop_getting_graphs(stream, turns, graphs):
    step = axpy_step(stream)
    first, second = sets_of(stream, 2)
    for call in range(turns):
        called(step, (first, second)[call % 2], stream)
    assert step.cache_info().captures == 2
    for arrays in sets_of(stream, 6):            # the first set is forgotten
        called(step, arrays, stream)
    for call in range(12):
        called(step, (first, second)[call % 2], stream)
    info = step.cache_info()
    assert (info.captures, info.graphs) == graphs


def test_a_new_signature_closes_only_the_twins_it_needs_room_for(stream):
    sets, step = sets_of(stream, 3), axpy_step(stream, max_graphs=3, warmup=0)
    for call in range(6):
        called(step, sets[call % 3], stream)
    assert step.cache_info().graphs == 3
    called(step, sets_of(stream, 1, n=8)[0], stream)
    info = step.cache_info()
    assert (info.graphs, info.evictions) == (3, 0)


def test_a_capture_again_that_raises_closes_the_twins_of_the_graph_it_replaced(stream):
    step = fixed_x_step(stream)
    x, other = dev(np.arange(16), stream), dev(np.ones(16), stream)
    outs = [dev(np.zeros(16), stream) for _ in range(2)]
    for call in range(4):                  # out takes turns, which rebinds
        step(x, outs[call % 2])
    assert step.cache_info().graphs == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.GraphedWarning)
        with pytest.raises(ng.GraphedWarning, match="captures the function again"):
            step(other, outs[0])           # x moved: captured again, its warning raised
    cache = step._caches[next(iter(step._caches))]
    assert cache.twins == sum(len(e.twins) for e in cache.entries.values()) == 0
    assert step.cache_info().graphs == 0
    before = [host(out, stream) for out in outs]
    for call in range(4):
        step(x, outs[call % 2])
    for k in range(2):
        np.testing.assert_array_equal(host(outs[k], stream), before[k] + 2 * host(x, stream))


@pytest.mark.parametrize("how", ["evicted", "captured again"])
def test_a_graph_closed_for_the_next_call_lets_its_arrays_go(stream, how):
    if how == "evicted":
        step = axpy_step(stream, max_graphs=1, warmup=0)
        first, then = sets_of(stream, 1)[0], sets_of(stream, 1, n=8)[0]
        call = functools.partial(called, step, stream=stream)
    else:
        step = fixed_x_step(stream)
        first, then = (dev(np.arange(16), stream),), (dev(np.ones(16), stream),)
        out = dev(np.zeros(16), stream)

        def call(arrays):
            step(arrays[0], out)

    for _ in range(2):
        call(first)
    gone = weakref.ref(first[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ng.GraphedWarning)
        for _ in range(3):              # the first closes first's graph; then the hot path
            call(then)
    del first
    gc.collect()
    stream.synchronize()
    assert gone() is None
