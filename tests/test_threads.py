"""Graphs, graphed functions, scalars and launch records shared by threads:
what must take turns takes turns, a graph closed under another thread's
call raises GraphClosedError, and nothing else goes wrong (issue 33).

Each race is run many times on the GPU and a few times on the simulator,
which runs kernels one at a time in Python.
"""

import random
import sys
import threading
import time

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active as _backend
from conftest import ON_SIMULATOR

THREADS, CALLS = 4, 25
ROUNDS = 2 if ON_SIMULATOR else 40      # repeats of a race with kernels
RACES = 30 if ON_SIMULATOR else 400     # repeats of a race without them
N = 4


@cuda.jit
def add_one(src, dst):
    """dst = src + 1."""
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i] + 1


@cuda.jit
def bump_pair(p, q):
    """p += 1, q += 2."""
    i = cuda.grid(1)
    if i < p.size:
        p[i] += 1
        q[i] += 2


@pytest.fixture(autouse=True)
def switch_often():
    """Threads switched every few bytecodes, not every 5 ms: a race a check
    and a use of shared state could lose is lost often enough to be seen."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def zeros(stream):
    return cuda.to_device(np.zeros(N, np.int64), stream=stream)


def host(array, stream):
    return array.copy_to_host(stream=stream)


def in_threads(work, count=THREADS):
    """Run ``work(k)`` on ``count`` threads started together; return what
    each raised, or None."""
    errors = [None] * count
    start = threading.Barrier(count, timeout=60)

    def run(k):
        try:
            if not ON_SIMULATOR:
                cuda.current_context()  # the thread's CUDA context, as numba makes it
            start.wait()
            work(k)
        except BaseException as exc:  # noqa: BLE001  returned to the test
            errors[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def closed_or_none(errors):
    """Each error None or a GraphClosedError; anything else is re-raised."""
    for error in errors:
        if error is not None and not isinstance(error, ng.GraphClosedError):
            raise error


def swapped_values(launches):
    """``(a, b)`` after ``launches`` launches of ``bump_pair(a, b)``, each
    after a rebinding that swaps a and b: odd launches run bump_pair(b, a)."""
    odd = (launches + 1) // 2
    even = launches // 2
    return 2 * odd + even, odd + 2 * even


def make_pair_graph(stream):
    """``(graph, a, b)``: a graph of ``bump_pair(a, b)`` on ``stream``, the
    kernel compiled first and both arrays zero."""
    a, b = zeros(stream), zeros(stream)
    bump_pair[1, N, stream](a, b)
    a.copy_to_device(np.zeros(N, np.int64), stream=stream)
    b.copy_to_device(np.zeros(N, np.int64), stream=stream)
    with ng.capture(stream) as cap:
        bump_pair[1, N, stream](a, b)
    return cap.graph, a, b


@pytest.fixture
def pair_graph(stream):
    """``(graph, a, b)``: a graph of ``bump_pair(a, b)`` on ``stream``."""
    return make_pair_graph(stream)


# ---------------------------------------------------------------- graphed functions


@pytest.mark.parametrize("max_graphs", [1, 16])
def test_threads_sharing_a_graphed_function_on_one_stream_each_get_their_own_result(
        stream, max_graphs):
    add_one[1, N, stream](zeros(stream), zeros(stream))
    for _ in range(ROUNDS):
        @ng.graphed(stream=stream, max_graphs=max_graphs)
        def step(src, dst):
            add_one[1, N, stream](src, dst)
            return dst

        arrays = [[zeros(stream), zeros(stream)] for _ in range(THREADS)]
        stream.synchronize()

        def calls(k):
            src, dst = arrays[k]
            for _ in range(CALLS):
                src, dst = step(src, dst), src

        assert in_threads(calls) == [None] * THREADS
        for k in range(THREADS):
            np.testing.assert_array_equal(host(arrays[k][CALLS % 2], stream), CALLS)
        info = step.cache_info()
        if max_graphs == 1:
            # One graph, rebound from pair to pair.
            assert (info.captures, info.graphs) == (1, 1)
        else:
            # The signature's graph, and one for each pair that came back while
            # remembered, made and closed as the threads' calls interleave.
            assert info.evictions == 0 and 1 <= info.graphs <= 4
        step.clear()


def test_clearing_a_graphed_function_while_threads_call_it_keeps_every_result(stream):
    @ng.graphed(stream=stream)
    def step(src, dst):
        add_one[1, N, stream](src, dst)
        return dst

    arrays = [[zeros(stream), zeros(stream)] for _ in range(THREADS)]
    step(*arrays[0])
    arrays[0][1].copy_to_device(np.zeros(N, np.int64), stream=stream)
    stream.synchronize()

    def calls(k):
        if k == 0:
            for _ in range(5):
                step.clear()
            return
        src, dst = arrays[k]
        for _ in range(CALLS):
            src, dst = step(src, dst), src

    assert in_threads(calls) == [None] * THREADS
    for k in range(1, THREADS):
        np.testing.assert_array_equal(host(arrays[k][CALLS % 2], stream), CALLS)
    step.clear()
    assert step.cache_info().graphs == 0


# ---------------------------------------------------------------- one graph, several threads


def test_threads_launching_one_graph_run_every_launch(stream):
    x = zeros(stream)
    add_one[1, N, stream](x, x)
    x.copy_to_device(np.zeros(N, np.int64), stream=stream)
    with ng.capture(stream) as cap:
        add_one[1, N, stream](x, x)
    for _ in range(ROUNDS):
        assert in_threads(lambda k: [cap.graph.launch() for _ in range(CALLS)]) == \
            [None] * THREADS
    np.testing.assert_array_equal(host(x, stream), ROUNDS * THREADS * CALLS)


def test_threads_rebinding_and_launching_one_graph_lose_no_launch(stream, pair_graph):
    graph, a, b = pair_graph

    def swaps(k):
        for _ in range(CALLS):
            graph.rebind({a: b, b: a})
            graph.launch()

    for _ in range(ROUNDS):
        assert in_threads(swaps) == [None] * THREADS
    launches = ROUNDS * THREADS * CALLS
    np.testing.assert_array_equal(host(a, stream) + host(b, stream), 3 * launches)
    graph.rebind({a: b, b: a})  # the graph still knows what it holds


def test_a_graph_closed_while_another_thread_rebinds_and_launches_it_raises_graph_closed(
        stream):
    for _ in range(ROUNDS):
        graph, a, b = make_pair_graph(stream)
        launched = [0]
        going = threading.Event()
        wait = random.uniform(0, 0.003)

        def work(k):
            if k == 1:
                going.wait()
                time.sleep(wait)
                graph.close()
                return
            try:
                for _ in range(100_000):
                    graph.rebind({a: b, b: a})
                    graph.launch()
                    launched[0] += 1
                    going.set()
            finally:
                going.set()

        errors = in_threads(work, 2)
        assert isinstance(errors[0], ng.GraphClosedError), errors[0]
        assert errors[1] is None
        stream.synchronize()
        want_a, want_b = swapped_values(launched[0])
        np.testing.assert_array_equal(host(a, stream), want_a)
        np.testing.assert_array_equal(host(b, stream), want_b)


def test_a_graph_closed_while_threads_launch_it_stops_each_with_graph_closed(stream):
    x = zeros(stream)
    add_one[1, N, stream](x, x)
    x.copy_to_device(np.zeros(N, np.int64), stream=stream)
    with ng.capture(stream) as cap:
        add_one[1, N, stream](x, x)
    launched = [0] * THREADS
    going = threading.Event()

    def work(k):
        if k == 0:
            going.wait()
            cap.graph.close()
            return
        try:
            while True:
                cap.graph.launch()
                launched[k] += 1
                going.set()
        finally:
            going.set()

    errors = in_threads(work)
    assert errors[0] is None
    assert all(isinstance(e, ng.GraphClosedError) for e in errors[1:]), errors
    np.testing.assert_array_equal(host(x, stream), sum(launched))


class Pause:
    """The backend's ``Executable.<name>`` made to wait, once entered, until
    ``graph`` is closed by another thread or 0.3 s have passed, noting
    whether it was closed meanwhile; for ``launcher``, the launch it makes."""

    def __init__(self, monkeypatch, name):
        self.entered, self.closed, self.seen = threading.Event(), threading.Event(), []
        self.graph = None
        original = getattr(_backend.Executable, name)

        def wait():
            self.entered.set()
            self.closed.wait(0.3)
            self.seen.append(self.graph.closed)

        def paused(executable, *args):
            if name == "launcher":
                launch = original(executable, *args)
                return lambda: (wait(), launch())
            wait()
            return original(executable, *args)

        monkeypatch.setattr(_backend.Executable, name, paused)

    def close_during(self, graph, call):
        """Run ``call()`` on one thread and close ``graph`` on another once
        ``call`` waits; return what each raised."""
        self.graph = graph

        def work(k):
            if k == 0:
                call()
                return
            self.entered.wait(5)
            graph.close()
            self.closed.set()

        return in_threads(work, 2)


def test_close_waits_for_a_launch_in_progress(stream, pair_graph, monkeypatch):
    graph, a, b = pair_graph
    pause = Pause(monkeypatch, "launcher")
    assert pause.close_during(graph, graph.launch) == [None, None]
    assert pause.seen == [False]
    np.testing.assert_array_equal(host(a, stream), 1)


def test_close_waits_for_a_rebinding_in_progress(stream, pair_graph, monkeypatch):
    graph, a, b = pair_graph
    pause = Pause(monkeypatch, "plan_rebind")
    assert pause.close_during(graph, lambda: graph.rebind({a: b, b: a})) == [None, None]
    assert pause.seen == [False]


def test_closing_the_source_waits_for_an_update_in_progress(stream, pair_graph, monkeypatch):
    graph, a, b = pair_graph
    c, d = zeros(stream), zeros(stream)
    with ng.capture(stream) as cap:
        bump_pair[1, N, stream](c, d)
    pause = Pause(monkeypatch, "update")
    assert pause.close_during(cap.graph, lambda: graph.update(cap.graph)) == [None, None]
    assert pause.seen == [False]
    graph.launch()
    np.testing.assert_array_equal(host(c, stream), 1)


def _rebind(graph, a, b, other):
    graph.rebind({a: b, b: a})


def _launch(graph, a, b, other):
    graph.launch()


def _update(graph, a, b, other):
    graph.update(other)


def _update_from(graph, a, b, other):
    other.update(graph)


def _nodes(graph, a, b, other):
    assert len(graph.nodes) == 1


def _upload(graph, a, b, other):
    graph.upload()


@pytest.mark.parametrize("operation", [_rebind, _launch, _update, _update_from, _nodes,
                                       _upload], ids=lambda op: op.__name__.strip("_"))
def test_a_call_racing_close_succeeds_or_raises_graph_closed(stream, operation):
    a, b, c, d = (zeros(stream) for _ in range(4))
    bump_pair[1, N, stream](a, b)
    graphs = []
    for _ in range(RACES):
        with ng.capture(stream) as first:
            bump_pair[1, N, stream](a, b)
        with ng.capture(stream) as second:
            bump_pair[1, N, stream](c, d)
        graphs.append((first.graph, second.graph))
    for graph, other in graphs:
        def work(k):
            if k:
                graph.close()
            else:
                operation(graph, a, b, other)

        closed_or_none(in_threads(work, 2))
        assert graph.closed
        with pytest.raises(ng.GraphClosedError):
            graph.launch()
        with pytest.raises(ng.GraphClosedError):
            graph.rebind({a: b, b: a})
        other.launch()  # whatever it took from the closed graph, it runs
        other.close()
    stream.synchronize()


def test_an_update_racing_the_close_of_its_source_leaves_a_graph_that_runs(stream, pair_graph):
    graph, a, b = pair_graph
    c, d = zeros(stream), zeros(stream)
    for _ in range(RACES):
        with ng.capture(stream) as cap:
            bump_pair[1, N, stream](c, d)
        source = cap.graph

        def work(k):
            if k:
                source.close()
            else:
                graph.update(source)
                graph.rebind({c: d, d: c})

        closed_or_none(in_threads(work, 2))
        graph.launch()
    stream.synchronize()
    total = host(a, stream) + host(b, stream) + host(c, stream) + host(d, stream)
    np.testing.assert_array_equal(total, 3 * RACES)


# ---------------------------------------------------------------- scalars and launch records


@pytest.mark.parametrize("dtype", [np.int32, np.float64], ids=["4-byte", "8-byte"])
def test_threads_updating_one_scalar_leave_the_last_value_one_of_them_set(stream, dtype):
    scalar = ng.DeviceScalar(0, dtype=dtype, stream=stream)
    updates = 50 if ON_SIMULATOR else 2_000
    last = [dtype(1_000_000 * (k + 1) + updates - 1) for k in range(THREADS)]

    def work(k):
        for i in range(updates):
            scalar.update(dtype(1_000_000 * (k + 1) + i))

    assert in_threads(work) == [None] * THREADS
    assert scalar.value in last


def test_threads_setting_arguments_of_one_launch_record_lose_none(stream):
    p0, p1, q0, q1 = (zeros(stream) for _ in range(4))
    rec = ng.launch_record(bump_pair, 1, N, stream, p0, q0)
    settings = 50 if ON_SIMULATOR else 2_000

    def work(k):
        choices = (p0, p1) if k == 0 else (q0, q1)
        for i in range(settings):
            rec.set_arg(k, choices[i % 2])

    assert in_threads(work, 2) == [None, None]
    assert rec.args[0] is p1 and rec.args[1] is q1
    rec.launch()
    np.testing.assert_array_equal(host(p1, stream), 1)
    np.testing.assert_array_equal(host(q1, stream), 2)
    np.testing.assert_array_equal(host(p0, stream) + host(q0, stream), 0)


# ---------------------------------------------------------------- threads that never used CUDA


def in_a_new_thread(work):
    """``work()`` on a thread that has made no CUDA call, so no context is
    current there; what it raised, or None."""
    errors = [None]

    def run():
        try:
            work()
        except BaseException as exc:  # noqa: BLE001  returned to the test
            errors[0] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    return errors[0]


def _graphed_call_with_new_arrays(stream, graph, a, b):
    @ng.graphed(stream=stream)
    def step(src, dst):
        add_one[1, N, stream](src, dst)
        return dst

    step(a, b)                                  # captured on this thread
    c, d = zeros(stream), zeros(stream)
    stream.synchronize()
    assert in_a_new_thread(lambda: step(c, d)) is None   # a rebinding there
    np.testing.assert_array_equal(host(d, stream), 1)


def _rebind_and_launch(stream, graph, a, b):
    assert in_a_new_thread(lambda: (graph.rebind({a: b, b: a}), graph.launch())) is None
    np.testing.assert_array_equal(host(a, stream), 2)
    np.testing.assert_array_equal(host(b, stream), 1)


def _launch_upload_nodes(stream, graph, a, b):
    def work():
        graph.upload()
        assert len(graph.nodes) == 1
        graph.launch()
    assert in_a_new_thread(work) is None
    np.testing.assert_array_equal(host(a, stream), 1)


def _update_from_a_rebound_graph(stream, graph, a, b):
    other, c, d = make_pair_graph(stream)
    other.rebind({c: d, d: c})
    assert in_a_new_thread(lambda: (graph.update(other), graph.launch())) is None
    np.testing.assert_array_equal(host(d, stream), 1)
    np.testing.assert_array_equal(host(c, stream), 2)


def _scalar_and_launch_record(stream, graph, a, b):
    scalar = ng.DeviceScalar(0, dtype=np.int64, stream=stream)
    rec = ng.launch_record(bump_pair, 1, N, stream, a, b)

    def work():
        scalar.update(7)
        rec.set_arg(0, b)
        rec.set_arg(1, a)
        rec.launch()
    assert in_a_new_thread(work) is None
    assert scalar.value == 7
    np.testing.assert_array_equal(host(b, stream), 1)
    np.testing.assert_array_equal(host(a, stream), 2)


def _capture_op_and_close(stream, graph, a, b):
    def work():
        with ng.capture(stream) as cap:
            ng.add_into(a, 3, b, stream=stream)
        cap.graph.launch()
        cap.graph.close()
        graph.close()
    assert in_a_new_thread(work) is None
    assert graph.closed
    np.testing.assert_array_equal(host(b, stream), 3)


@pytest.mark.parametrize("calls", [
    _graphed_call_with_new_arrays, _rebind_and_launch, _launch_upload_nodes,
    _update_from_a_rebound_graph, _scalar_and_launch_record, _capture_op_and_close,
], ids=lambda calls: calls.__name__.strip("_"))
def test_a_thread_that_never_used_cuda_makes_every_call_on_a_graph(stream, pair_graph, calls):
    # A thread the user starts has no CUDA context current until numba makes
    # one; every numbagraph call made there works in the graph's own.
    graph, a, b = pair_graph
    stream.synchronize()
    calls(stream, graph, a, b)
