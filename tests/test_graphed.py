"""ng.graphed: a plain function of launches, run, captured, or replayed
rebound to the arrays of each call."""

import threading
import warnings

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import axpy, dev, host


@cuda.jit
def halve(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] / 2


@pytest.fixture
def buffers(stream):
    return [dev(np.arange(8) + 10 * k, stream) for k in range(4)]


@pytest.fixture
def two(stream):
    return ng.DeviceScalar(2.0, np.float32, stream=stream)


def make_step(stream, **options):
    @ng.graphed(stream=stream, **options)
    def step(x, y, out, a):
        axpy[1, 8, stream](x, y, out, a)
        halve[1, 8, stream](out)
        return out

    return step


def expected(x, y, a, stream):
    return (a * host(x, stream) + host(y, stream)) / 2


def test_calls_run_then_capture_then_replay(stream, buffers, two):
    step = make_step(stream)
    x, y, out, _ = buffers
    for calls in range(1, 4):
        assert step(x, y, out, two) is out
        np.testing.assert_array_equal(host(out, stream), expected(x, y, 2, stream))
    info = step.cache_info()
    assert (info.eager, info.captures, info.hits, info.rebinds, info.graphs) == (1, 1, 1, 0, 1)


def test_new_arrays_of_a_known_signature_are_rebound_not_captured(stream, buffers, two):
    step = make_step(stream)
    a, b, c, d = buffers
    for x, y, out in [(a, b, c), (a, b, c), (b, a, d), (c, b, a), (d, c, b)]:
        step(x, y, out, two)
        np.testing.assert_array_equal(host(out, stream), expected(x, y, 2, stream))
    info = step.cache_info()
    assert (info.captures, info.rebinds, info.hits) == (1, 3, 3)


def test_ping_pong_matches_the_function_run_as_written(stream, two):
    state = [dev(np.linspace(0, 1, 8), stream), dev(np.zeros(8), stream)]
    eager_state = [dev(np.linspace(0, 1, 8), stream), dev(np.zeros(8), stream)]
    bias = dev(np.full(8, 0.25), stream)

    def advance(y, y_next, a):
        axpy[1, 8, stream](y, bias, y_next, a)
        halve[1, 8, stream](y_next)
        return y_next

    step = ng.graphed(advance, stream=stream)
    for i in range(10):
        src, dst = state[i % 2], state[(i + 1) % 2]
        assert step(src, dst, two) is dst
        advance(eager_state[i % 2], eager_state[(i + 1) % 2], two)
    np.testing.assert_array_equal(host(state[0], stream), host(eager_state[0], stream))
    # The first call runs, the second captures; the third brings the first
    # pair back, which gets a graph of its own: no call rebinds.
    info = step.cache_info()
    assert (info.captures, info.rebinds, info.graphs) == (2, 0, 2)


def test_a_device_scalar_argument_is_rebound_to_another_scalar(stream, buffers, two):
    step = make_step(stream)
    x, y, out, _ = buffers
    three = ng.DeviceScalar(3.0, np.float32, stream=stream)
    step(x, y, out, two)
    step(x, y, out, two)
    step(x, y, out, three)
    np.testing.assert_array_equal(host(out, stream), expected(x, y, 3, stream))
    three.update(5.0)
    step(x, y, out, three)
    np.testing.assert_array_equal(host(out, stream), expected(x, y, 5, stream))


def test_another_layout_is_another_signature(stream, buffers, two):
    step = make_step(stream, warmup=0)
    x, y, out, _ = buffers
    step(x, y, out, two)
    wide = [dev(np.arange(16), stream) for _ in range(3)]
    step(*wide, two)
    np.testing.assert_array_equal(host(wide[2], stream)[:8], expected(wide[0], wide[1], 2, stream)[:8])
    assert step.cache_info().captures == 2


def test_results_follow_the_arguments_of_each_call(stream, buffers):
    @ng.graphed(stream=stream, warmup=0)
    def both(x, y):
        halve[1, 8, stream](x)
        halve[1, 8, stream](y)
        return y, x

    @ng.graphed(stream=stream, warmup=0)
    def nothing(x):
        halve[1, 8, stream](x)

    a, b, c, d = buffers
    assert both(a, b) == (b, a)
    assert both(c, d) == (d, c)
    assert nothing(a) is None and nothing(b) is None


def test_a_result_that_is_not_an_argument_is_refused(stream, buffers):
    @ng.graphed(stream=stream, warmup=0)
    def made(x):
        halve[1, 8, stream](x)
        return 3

    with pytest.raises(ng.GraphedError, match="neither one of its arguments"):
        made(buffers[0])
    assert made.cache_info().graphs == 0
    assert not ng.is_capturing(stream)


def test_unused_array_arguments_can_change(stream, buffers):
    @ng.graphed(stream=stream, warmup=0)
    def one_of(x, spare):
        halve[1, 8, stream](x)
        return x

    a, b, c, d = buffers
    one_of(a, b)
    one_of(a, c)   # spare is not in the graph: nothing to rebind for it
    np.testing.assert_array_equal(host(a, stream), (np.arange(8) / 4).astype(np.float32))


def test_the_cache_keeps_max_graphs_and_warns_when_it_evicts(stream, two):
    step = make_step(stream, warmup=0, max_graphs=2)
    sizes = [8, 9, 10]
    sets = {n: [dev(np.arange(n), stream) for _ in range(3)] for n in sizes}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in sizes:
            step(*sets[n], two)
    evicting = [w for w in caught if issubclass(w.category, ng.GraphedWarning)]
    assert len(evicting) == 1
    assert "max_graphs=2" in str(evicting[0].message)
    assert "argument 0 differs: an array of shape (8,)" in str(evicting[0].message)
    info = step.cache_info()
    assert (info.graphs, info.evictions, info.captures) == (2, 1, 3)


def test_a_plain_value_that_keeps_changing_is_warned_about(stream, buffers):
    @ng.graphed(stream=stream)
    def scale(x, times):
        for _ in range(times):
            halve[1, 8, stream](x)

    x = buffers[0]
    with pytest.warns(ng.GraphedWarning, match=r"argument 1 changed from 1 to 2.*DeviceScalar"):
        scale(x, 1)
        scale(x, 2)


def test_arguments_that_cannot_be_in_a_signature_are_refused(stream, buffers, two):
    step = make_step(stream)
    x, y, out, _ = buffers
    with pytest.raises(ng.GraphedError, match="not hashable"):
        step(x, y, out, [2.0])
    with pytest.raises(ng.GraphedError, match="host"):
        step(x, np.zeros(8, np.float32), out, two)
    with pytest.raises(ng.GraphedError, match="same memory"):
        step(x, x[0:8], out, two)
    assert step.cache_info().eager == 0


def test_without_a_stream_each_call_names_one_and_gets_its_own_cache(buffers, two):
    @ng.graphed(warmup=0)
    def step(x, stream):
        halve[1, 8, stream](x)
        return x

    with pytest.raises(ng.GraphedError, match="stream=s"):
        step(buffers[0])
    s1, s2 = cuda.stream(), cuda.stream()
    x = dev(np.full(8, 8.0), s1)
    step(x, stream=s1)
    s1.synchronize()  # the two streams are not ordered with each other
    step(x, stream=s2)
    s2.synchronize()
    np.testing.assert_array_equal(host(x, s1), np.full(8, 2.0))
    assert step.cache_info().graphs == 2
    step.clear()
    assert step.cache_info() == ng.GraphedCacheInfo(0, 0, 0, 0, 0, 0, 16)


def test_called_inside_a_capture_of_its_stream_it_joins_that_capture(stream, buffers, two):
    step = make_step(stream)
    x, y, out, _ = buffers
    step(x, y, out, two)
    with ng.capture(stream) as cap:
        step(x, y, out, two)
    assert cap.graph.num_nodes == 2
    assert step.cache_info().captures == 0


def test_a_function_that_allocates_for_another_stream_is_refused_at_capture(
        stream, other_stream, buffers):
    @ng.graphed(stream=stream, warmup=0)
    def temporary(x):
        scratch = cuda.device_array(8, np.float32, stream=other_stream)
        halve[1, 8, stream](scratch)

    with pytest.raises(ng.AllocationInCaptureError, match="pass it as an argument"):
        temporary(buffers[0])
    assert not ng.is_capturing(stream)


def test_threads_on_their_own_streams_get_their_own_results(two):
    step_by_stream = {}
    errors = []

    # Streams and arrays are made here: simulated kernels running on other
    # threads swap this module's `cuda` for the simulator's kernel module.
    streams = [cuda.stream() for _ in range(4)]
    states = [[dev(np.full(8, float(k)), s), dev(np.zeros(8), s)] for k, s in enumerate(streams)]
    bias = dev(np.full(8, 1.0), streams[0])
    streams[0].synchronize()

    def worker(k):
        try:
            s, state = streams[k], states[k]

            @ng.graphed(stream=s)
            def step(y, y_next):
                axpy[1, 8, s](y, bias, y_next, two)
                return y_next

            step_by_stream[k] = step
            value = float(k)
            for i in range(12):
                step(state[i % 2], state[(i + 1) % 2])
                value = 2 * value + 1
            got = host(state[0], s)
            if not np.array_equal(got, np.full(8, value, np.float32)):
                errors.append((k, got[0], value))
        except Exception as exc:  # noqa: BLE001  reported below
            errors.append((k, exc))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_one_function_shared_by_threads_on_one_stream_takes_turns(stream, two):
    x = dev(np.zeros(8), stream)
    one = dev(np.ones(8), stream)
    a = ng.DeviceScalar(1.0, np.float32, stream=stream)

    @ng.graphed(stream=stream)
    def add_one(x):
        axpy[1, 8, stream](one, x, x, a)
        return x

    def worker():
        for _ in range(25):
            add_one(x)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(host(x, stream), np.full(8, 100.0))


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="warmup"):
        ng.graphed(lambda: None, stream=cuda.stream(), warmup=-1)
    with pytest.raises(ValueError, match="max_graphs"):
        ng.graphed(lambda: None, stream=cuda.stream(), max_graphs=0)
    with pytest.raises(TypeError, match="function"):
        ng.graphed(5, stream=cuda.stream())


@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


def test_keyword_names_are_part_of_the_signature(stream, buffers):
    @ng.graphed(stream=stream, warmup=0)
    def either(x, y=None, z=None):
        add_one[1, 8, stream](y if y is not None else z)
        if z is not None:
            add_one[1, 8, stream](z)

    a, b = buffers[0], dev(np.zeros(8), stream)
    either(a, y=b)
    either(a, z=b)   # the same values under another name: another graph
    np.testing.assert_array_equal(host(b, stream), np.full(8, 3.0))
    assert either.cache_info().captures == 2


def test_the_same_array_in_two_places_is_rebound_in_both(stream, buffers):
    scale = ng.DeviceScalar(2.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, warmup=0)
    def twice(x, y, out):
        axpy[1, 8, stream](x, y, out, scale)
    a, b, out, _ = buffers
    twice(a, a, out)
    twice(b, b, out)
    np.testing.assert_array_equal(host(out, stream), 3 * host(b, stream))
    assert twice.cache_info().rebinds == 1


def test_a_launch_that_fails_after_a_rebinding_leaves_no_stale_shortcut(
        stream, buffers, monkeypatch):
    @ng.graphed(stream=stream, warmup=0)
    def bump(x):
        add_one[1, 8, stream](x)

    a, b = (dev(np.zeros(8), stream) for _ in range(2))
    bump(a)
    launch = ng.CapturedGraph.launch

    def failing(self, stream=None):
        monkeypatch.setattr(ng.CapturedGraph, "launch", launch)
        raise RuntimeError("the launch failed")

    monkeypatch.setattr(ng.CapturedGraph, "launch", failing)
    with pytest.raises(RuntimeError, match="launch failed"):
        bump(b)          # rebound to b, then not launched
    bump(a)              # must rebind back to a, not replay on b
    np.testing.assert_array_equal(host(a, stream), np.full(8, 2.0))
    np.testing.assert_array_equal(host(b, stream), np.zeros(8))


def test_the_stream_a_call_names_is_not_part_of_the_signature(buffers):
    @ng.graphed(warmup=0)
    def bump(x, stream):
        add_one[1, 8, stream](x)

    s = cuda.stream()
    x = dev(np.zeros(8), s)
    for _ in range(3):
        bump(x, stream=cuda.external_stream(int(s.handle)) if ng.backend() == "cuda" else s)
    np.testing.assert_array_equal(host(x, s), np.full(8, 3.0))
    assert bump.cache_info().captures == 1


def test_minus_zero_and_zero_are_different_values(stream, buffers):
    @ng.graphed(stream=stream, warmup=0)
    def signed(x, value):
        ng.fill_into(x, value, stream=stream)

    x = buffers[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ng.GraphedWarning)
        signed(x, 0.0)
        signed(x, -0.0)
    assert np.signbit(host(x, stream)).all()
    assert signed.cache_info().captures == 2


def test_an_argument_the_function_also_reaches_is_captured_again_not_rebound(stream, buffers,
                                                                             two):
    w, other, out, _ = buffers

    @ng.graphed(stream=stream)
    def step(x, out):
        axpy[1, 8, stream](x, w, out, two)      # w: the function's own, from its closure

    for _ in range(2):
        step(w, out)
        np.testing.assert_array_equal(host(out, stream), 3 * host(w, stream))
    with pytest.warns(ng.GraphedWarning, match=r"argument 0 of step\(\) was bound to memory "
                                            r"the function also reaches as 'w' \(its closure\)"):
        step(other, out)
    np.testing.assert_array_equal(host(out, stream), 2 * host(other, stream) + host(w, stream))
    for x in (w, other, w):
        step(x, out)
        np.testing.assert_array_equal(host(out, stream), 2 * host(x, stream) + host(w, stream))
    # w came back to the graph captured again for other: it got a graph of
    # its own, captured with w, which no call rebinds.
    info = step.cache_info()
    assert (info.captures, info.graphs, info.rebinds) == (3, 2, 0)


def test_what_a_function_reaches_besides_its_arguments(stream, buffers, two):
    import functools

    from numbagraph._reached import reached
    a, b, c, d = buffers
    module = {"a": a, "d": d, "axpy": axpy, "np": np}
    exec("def fn(x, y=None, *, z=None):\n"
         "    return [a for _ in x], axpy, np, x.d\n", module)
    fn = module["fn"]
    fn.__defaults__, fn.__kwdefaults__ = (b,), {"z": c}

    def names(found):
        return sorted(how for _, _, how in found)

    # 'd' is an attribute name here, not a global the function loads.
    assert names(reached(fn, 1)) == ["'a' (a global)", "'y' (a default)", "'z' (a default)"]
    assert names(reached(fn, 2, ["z"])) == ["'a' (a global)"]

    pair, table = [b, 1], {"k": c}

    def closure(x):
        return two, pair, table, x

    assert names(reached(closure)) == ["'pair'[0] (its closure)", "'table'['k'] (its closure)",
                                       "'two' (its closure)"]
    start, end, _ = next(r for r in reached(closure) if "two" in r[2])
    assert end - start == 4
    assert names(reached(functools.partial(closure, d))) == [
        "'pair'[0] (its closure)", "'table'['k'] (its closure)", "'two' (its closure)",
        "argument 0 (bound by a partial)"]

    @functools.wraps(closure)
    def decorated(*args):
        return closure(*args)

    assert "'two' (its closure)" in names(reached(decorated))

    class Holder:
        def __init__(self):
            self.w, self.ping, self.pong = a, b, c

        def step(self, x, y=b):
            return x, self.w   # ping and pong: passed as arguments, never read here

    assert names(reached(Holder().step, 1)) == ["'y' (a default)", "self.w"]
    assert names(reached(Holder().step, 2)) == ["self.w"]
    assert reached(len) == [] and reached(axpy) == []


def test_names_the_function_does_not_load_and_defaults_a_call_replaces_never_refuse(
        stream, buffers, two):
    w, other, out, _ = buffers
    three = ng.DeviceScalar(3.0, np.float32, stream=stream)
    cfg = type("Config", (), {"y": dev(np.ones(8), stream)})()
    # A global 'w' and an attribute '.y': only the attribute is used.
    module = {"axpy": axpy, "stream": stream, "cfg": cfg, "w": w, "y": w, "two": two}
    exec("def step(x, out, a=two):\n"
         "    axpy[1, 8, stream](x, cfg.y, out, a)\n", module)
    # One graph: the arrays taking turns rebind it.
    step = ng.graphed(module["step"], stream=stream, max_graphs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.GraphedWarning)
        for k in range(6):
            x, a, value = (w, two, 2) if k % 2 == 0 else (other, three, 3)
            step(x, out, a)
            np.testing.assert_array_equal(host(out, stream), value * host(x, stream) + 1)
    info = step.cache_info()
    assert (info.captures, info.rebinds) == (1, 4)


def test_an_eviction_by_a_signature_of_other_arity_names_the_difference(stream, buffers, two):
    x, y, out, _ = buffers

    @ng.graphed(stream=stream, max_graphs=1, warmup=0)
    def step(x, *rest):
        axpy[1, 8, stream](x, x, out, two)

    step(x)
    with pytest.warns(ng.GraphedWarning, match="differ in number, keywords or sharing"):
        step(x, 3)
    assert step.cache_info().evictions == 1


def test_structured_dtypes_of_one_size_are_different_signatures(stream):
    pair = np.dtype([("a", np.float32), ("b", np.float32)])
    wide = np.dtype([("c", np.int64)])
    assert pair.str == wide.str          # '|V8': the type string alone cannot tell them
    made = {dt: cuda.to_device(np.zeros(4, dt), stream=stream) for dt in (pair, wide)}
    x, y, out = (dev(np.arange(4) + k, stream) for k in range(3))
    two = ng.DeviceScalar(2.0, np.float32, stream=stream)

    @ng.graphed(stream=stream, warmup=0)
    def step(records, out):
        # A kernel typed for the records would be compiled for each dtype.
        axpy[1, 4, stream](x, y, out, two)

    for dt in (pair, wide):
        step(made[dt], out)
    info = step.cache_info()
    assert (info.captures, info.graphs, info.rebinds) == (2, 2, 0)
