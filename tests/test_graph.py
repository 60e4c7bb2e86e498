import gc
import warnings
import weakref

import numpy as np
import pytest

import numbagraph as ng
from conftest import device_zeros


@pytest.fixture
def graph_and_array(stream, kernels, warm_add):
    x, one = warm_add
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, one)
    return cap.graph, x


def test_graph_reports_nodes_and_stream(graph_and_array, stream):
    graph, _ = graph_and_array
    assert graph.num_nodes == 1
    assert graph.stream is stream
    assert not graph.closed
    assert "1 nodes" in repr(graph)


def test_launch_on_another_stream(graph_and_array, other_stream, stream):
    graph, x = graph_and_array
    stream.synchronize()
    graph.upload(other_stream)
    with pytest.warns(ng.CaptureWarning):  # its scalar is ordered on `stream`
        graph.launch(other_stream)
    other_stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2.0)


def test_a_launch_on_another_stream_than_its_scalars_warns_once(stream, other_stream, kernels):
    x = device_zeros(32, stream=stream)
    pos = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, pos)
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, pos)
    stream.synchronize()
    with pytest.warns(ng.CaptureWarning, match="updates are ordered on .*Launch on the scalars"):
        cap.graph.launch(other_stream)
    other_stream.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cap.graph.launch(other_stream)  # said once per stream
        cap.graph.launch()  # the scalars' own stream
    stream.synchronize()
    other_stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 4.0)


def test_closed_graph_refuses_launch(graph_and_array):
    graph, _ = graph_and_array
    graph.close()
    assert graph.closed
    with pytest.raises(ng.GraphClosedError, match="closed"):
        graph.launch()
    graph.close()  # closing twice is harmless


def test_context_manager_closes(graph_and_array, stream):
    graph, x = graph_and_array
    with graph as g:
        g.launch()
    assert graph.closed
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_graph_keeps_its_arrays_alive(stream, kernels):
    # Built here, not by a fixture: a fixture would keep the arrays alive.
    x = device_zeros(32, stream=stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, one)
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, one)
    graph = cap.graph
    x_ref, one_ref = weakref.ref(x), weakref.ref(one)
    host = x.copy_to_host(stream=stream)
    del x, one, cap
    gc.collect()
    assert x_ref() is not None and one_ref() is not None
    graph.launch()
    np.testing.assert_array_equal(x_ref().copy_to_host(stream=stream), host + 1.0)
    graph.close()
    gc.collect()
    assert x_ref() is None and one_ref() is None


@pytest.mark.parametrize("frees_wait", [True, False])
def test_closing_orders_the_release_after_replays_when_frees_do_not_wait(
        stream, kernels, monkeypatch, frees_wait):
    # A stream-ordered memory manager (RMM plugged into numba) frees without
    # waiting for the device: the arrays of a closed graph are dropped only
    # once the streams it ran on have finished.
    from numbagraph.backend import active as backend

    x = device_zeros(32, stream=stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, one)
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, one)
    cap.graph.launch()
    x_ref = weakref.ref(x)
    del x, one
    events = []
    synchronize = backend.synchronize
    monkeypatch.setattr(backend, "frees_wait_for_device", lambda: frees_wait)
    monkeypatch.setattr(backend, "synchronize", lambda handle: (
        events.append(("synchronize", handle, x_ref() is not None)), synchronize(handle)))
    cap.graph.close()
    gc.collect()
    assert x_ref() is None
    expected = [] if frees_wait else [("synchronize", backend.stream_handle(stream), True)]
    assert events == expected


def test_dropped_graph_is_freed(stream, kernels):
    # Built here, not by a fixture: a fixture would keep the arrays alive.
    x = device_zeros(32, stream=stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, one)
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, one)
    graph_ref, x_ref = weakref.ref(cap.graph), weakref.ref(x)
    del cap, x
    gc.collect()
    assert graph_ref() is None and x_ref() is None


def add_graphs(stream, kernels, targets, one):
    """One captured graph of ``add(target, one)`` per target."""
    graphs = []
    for target in targets:
        with ng.capture(stream) as cap:
            kernels.add[1, 32, stream](target, one)
        graphs.append(cap.graph)
    return graphs


def test_update_takes_other_graphs_arguments(stream, kernels):
    x, y = device_zeros(32, stream=stream), device_zeros(32, stream=stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, one)
    graphs = add_graphs(stream, kernels, (x, y), one)
    graphs[0].update(graphs[1])
    graphs[0].launch()
    np.testing.assert_array_equal(y.copy_to_host(stream=stream), 1.0)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 1.0)


def test_update_with_other_topology_is_refused(stream, kernels, warm_add):
    x, one = warm_add
    with ng.capture(stream) as a:
        kernels.add[1, 32, stream](x, one)
    with ng.capture(stream) as b:
        kernels.add[1, 32, stream](x, one)
        kernels.add[1, 32, stream](x, one)
    with pytest.raises(ng.NumbagraphError, match="same"):
        a.graph.update(b.graph)
    a.graph.launch()  # still usable
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_update_keeps_only_what_the_graph_now_uses(stream, kernels, warm_add):
    _, one = warm_add
    start = device_zeros(32, stream=stream)
    with ng.capture(stream) as first:
        kernels.add[1, 32, stream](start, one)
    graph = first.graph
    superseded = []
    for _ in range(3):
        x = device_zeros(32, stream=stream)
        with ng.capture(stream) as other:
            kernels.add[1, 32, stream](x, one)
        graph.update(other.graph)
        other.graph.close()
        superseded.append(weakref.ref(x))
        del x, other
    gc.collect()
    del start
    gc.collect()
    assert [ref() is None for ref in superseded] == [True, True, False]
    graph.launch()
    np.testing.assert_array_equal(superseded[-1]().copy_to_host(stream=stream), 1.0)


def test_a_graph_updated_from_a_closed_graph_is_rebound_as_it_runs(stream, kernels, warm_add):
    _, one = warm_add
    x, y, z = (device_zeros(32, stream=stream) for _ in range(3))
    graphs = add_graphs(stream, kernels, (x, y), one)
    graph, source = graphs
    graph.update(source)
    source.close()
    graph.rebind({y: z})                 # y: what it runs since the update
    graph.launch()
    hosts = [a.copy_to_host(stream=stream) for a in (x, y, z)]
    np.testing.assert_array_equal(hosts, [np.zeros(32), np.zeros(32), np.ones(32)])


def test_an_update_from_a_graph_whose_source_was_closed_takes_what_it_runs(
        stream, kernels, warm_add):
    _, one = warm_add
    arrays = [device_zeros(32, stream=stream) for _ in range(3)]
    graphs = add_graphs(stream, kernels, arrays, one)
    g1, g2, g3 = graphs
    g1.update(g2)
    g2.close()
    g3.update(g1)                        # g1 runs g2's arguments
    g1.close()
    g3.launch()
    hosts = [a.copy_to_host(stream=stream) for a in arrays]
    np.testing.assert_array_equal(hosts, [np.zeros(32), np.ones(32), np.zeros(32)])


def test_another_thread_replays_a_graph_while_a_global_capture_runs(stream, other_stream, kernels):
    import threading

    x = device_zeros(32, stream=other_stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=other_stream)
    kernels.add[1, 32, other_stream](x, one)
    with ng.capture(other_stream) as cap:
        kernels.add[1, 32, other_stream](x, one)
    cap.graph.launch()  # instantiated before the global capture begins
    y = device_zeros(32, stream=stream)
    stream.synchronize()
    other_stream.synchronize()
    failures = []

    def replay():
        try:
            cap.graph.launch()
        except Exception as exc:  # reported below
            failures.append(exc)

    with ng.capture(stream, mode="global"):
        kernels.add[1, 32, stream](y, one)
        worker = threading.Thread(target=replay)
        worker.start()
        worker.join()
    assert not failures
    np.testing.assert_array_equal(x.copy_to_host(stream=other_stream), 3.0)


def test_a_scalar_whose_update_the_graph_records_does_not_warn_on_another_stream(
        stream, other_stream, kernels):
    x = device_zeros(32, stream=stream)
    pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, pos)
    with ng.capture(stream) as cap:
        pos.update(2.0)  # set inside the graph, in order
        kernels.add[1, 32, stream](x, pos)
    stream.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cap.graph.launch(other_stream)
    other_stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_an_update_from_an_updated_graph_takes_what_that_graph_runs_now(stream, kernels):
    # g1.update(g2); g3.update(g1): g3 runs g2's arguments, as g1 does.
    arrays = [device_zeros(32, stream=stream) for _ in range(3)]
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](arrays[0], one)
    stream.synchronize()
    for a in arrays:
        a.copy_to_device(np.zeros(32, np.float32), stream=stream)
    graphs = add_graphs(stream, kernels, arrays, one)
    g1, g2, g3 = graphs
    g1.update(g2)
    g3.update(g1)
    g3.launch()
    g1.launch()
    hosts = [a.copy_to_host(stream=stream) for a in arrays]
    np.testing.assert_array_equal(hosts[0], 0.0)
    np.testing.assert_array_equal(hosts[1], 2.0)
    np.testing.assert_array_equal(hosts[2], 0.0)
