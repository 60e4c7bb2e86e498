"""Capture safety: every operation a graph cannot record raises a clear
error, ends the capture it would have broken, and leaves everything usable."""

import dataclasses
import gc
import threading
import weakref
from typing import Callable

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import ON_SIMULATOR, device_zeros, records_nothing
from numbagraph import _registry

STRICT_MODES = ("thread_local", "global")


@pytest.fixture(autouse=True)
def no_capture_left_behind():
    yield
    left = _registry.active()
    for session in left:  # keep one failure from cascading into the next tests
        ng.capture.__exit__(ng.capture(session.stream), KeyError, KeyError(), None)
    assert not left, "a test left a capture active"


@dataclasses.dataclass
class Env:
    """Streams, arrays and scalars made before any capture begins."""

    s: object
    other: object
    x: object  # on s; captured launches add 1 to it
    y: object  # on other
    one: object  # DeviceScalar 1.0 on s
    one_other: object  # DeviceScalar 1.0 on other
    legacy_scalar: object  # DeviceScalar on the legacy default stream
    event: object
    add: object
    graph: object  # captured on other, adds 1 to y


@pytest.fixture
def env(stream, other_stream, kernels):
    x = device_zeros(32, stream=stream)
    y = device_zeros(32, stream=other_stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    one_other = ng.DeviceScalar(1.0, dtype=np.float32, stream=other_stream)
    legacy_scalar = ng.DeviceScalar(0, dtype=np.int32)
    kernels.add[1, 32, stream](x, one)  # compile outside any capture
    kernels.add[1, 32, other_stream](y, one_other)
    x.copy_to_device(np.zeros(32, np.float32), stream=stream)
    y.copy_to_device(np.zeros(32, np.float32), stream=other_stream)
    stream.synchronize()
    other_stream.synchronize()
    with ng.capture(other_stream) as cap:
        kernels.add[1, 32, other_stream](y, one_other)
    return Env(stream, other_stream, x, y, one, one_other, legacy_scalar,
               cuda.event(), kernels.add, cap.graph)


@dataclasses.dataclass
class Op:
    """An operation a capture refuses: how to call it, what it raises in a
    "thread_local" or "global" capture, what it raises in a "relaxed" one
    (None: allowed), and a phrase its message names it by."""

    name: str
    call: Callable[[Env], object]
    error: type
    relaxed_error: type | None
    names: str

    def __repr__(self):
        return self.name


def _host(n=32):
    return np.ones(n, np.float32)


def _record_then_sync(e):
    e.event.record(e.s)
    e.event.synchronize()


def _wait_on_another_capture(e):
    ng.begin_capture(e.other, mode="relaxed")
    e.event.record(e.other)
    e.event.wait(e.s)


def _write_element(e):
    e.x[0] = 5.0


OPS = [
    Op("to_device", lambda e: cuda.to_device(_host(), stream=e.other),
       ng.AllocationInCaptureError, None, "cuda.to_device()"),
    Op("to_device_on_capturing_stream", lambda e: cuda.to_device(_host(), stream=e.s),
       ng.AllocationInCaptureError, ng.HostCopyInCaptureError, "cuda.to_device()"),
    Op("device_array", lambda e: cuda.device_array(4, stream=e.other),
       ng.AllocationInCaptureError, None, "cuda.device_array()"),
    Op("device_array_like", lambda e: cuda.device_array_like(e.x, stream=e.other),
       ng.AllocationInCaptureError, None, "cuda.device_array_like()"),
    Op("pinned_array", lambda e: cuda.pinned_array(4),
       ng.AllocationInCaptureError, None, "cuda.pinned_array()"),
    Op("mapped_array", lambda e: cuda.mapped_array(4),
       ng.AllocationInCaptureError, None, "cuda.mapped_array()"),
    Op("new_device_scalar", lambda e: ng.DeviceScalar(1.0, stream=e.other),
       ng.AllocationInCaptureError, None, "ng.DeviceScalar()"),
    Op("host_array_to_kernel", lambda e: e.add[1, 32, e.s](np.zeros(32, np.float32), e.one),
       ng.HostArrayInCaptureError, ng.HostArrayInCaptureError, "host (NumPy) array"),
    Op("stream_synchronize", lambda e: e.s.synchronize(),
       ng.SyncInCaptureError, ng.SyncInCaptureError, ".synchronize()"),
    Op("device_synchronize", lambda e: cuda.synchronize(),
       ng.SyncInCaptureError, ng.SyncInCaptureError, "cuda.synchronize()"),
    Op("synchronize_another_stream", lambda e: e.other.synchronize(),
       ng.SyncInCaptureError, None, ".synchronize()"),
    Op("scalar_value_on_another_stream", lambda e: e.one_other.value,
       ng.SyncInCaptureError, None, "DeviceScalar.value"),
    Op("graph_upload_into_the_capture", lambda e: e.graph.upload(e.s),
       ng.UncapturableOperationError, ng.UncapturableOperationError,
       "graph.upload() on a capturing stream"),
    Op("graph_launch_on_legacy_stream", lambda e: e.graph.launch(cuda.default_stream()),
       ng.ForeignStreamInCaptureError, ng.ForeignStreamInCaptureError,
       "graph.launch() on the legacy default stream"),
    Op("event_synchronize", _record_then_sync,
       ng.SyncInCaptureError, ng.SyncInCaptureError, "event.synchronize()"),
    Op("copy_to_host", lambda e: e.x.copy_to_host(stream=e.s),
       ng.HostCopyInCaptureError, ng.HostCopyInCaptureError, "copy_to_host()"),
    Op("copy_to_host_on_array_stream", lambda e: e.x.copy_to_host(),
       ng.HostCopyInCaptureError, ng.HostCopyInCaptureError, "copy_to_host()"),
    Op("copy_to_device_from_host", lambda e: e.x.copy_to_device(_host(), stream=e.s),
       ng.HostCopyInCaptureError, ng.HostCopyInCaptureError, "copy_to_device()"),
    Op("read_element", lambda e: e.x[0],
       ng.HostCopyInCaptureError, ng.HostCopyInCaptureError, "x[i]"),
    Op("write_element", _write_element,
       ng.HostCopyInCaptureError, ng.HostCopyInCaptureError, "x[...] = value"),
    Op("scalar_value", lambda e: e.one.value,
       ng.HostCopyInCaptureError, ng.HostCopyInCaptureError, "DeviceScalar.value"),
    Op("launch_on_legacy_stream", lambda e: e.add[1, 32](e.y, e.one_other),
       ng.ForeignStreamInCaptureError, ng.ForeignStreamInCaptureError,
       "legacy default stream"),
    Op("copy_into_on_legacy_stream",
       lambda e: ng.copy_into(e.y, e.x, stream=cuda.default_stream()),
       ng.ForeignStreamInCaptureError, ng.ForeignStreamInCaptureError,
       "copy_into on the legacy default stream"),
    Op("scalar_update_on_legacy_stream", lambda e: e.legacy_scalar.update(3),
       ng.ForeignStreamInCaptureError, ng.ForeignStreamInCaptureError,
       "DeviceScalar.update()"),
    Op("event_of_another_capture", _wait_on_another_capture,
       ng.ForeignStreamInCaptureError, ng.ForeignStreamInCaptureError, "event.wait("),
    Op("nested_capture", lambda e: ng.begin_capture(e.s),
       ng.CaptureStateError, ng.CaptureStateError, "begin_capture("),
]
RELAXED_REFUSED = [op for op in OPS if op.relaxed_error is not None]
RELAXED_ALLOWED = [op for op in OPS if op.relaxed_error is None]


def _assert_usable_after(env, mode):
    """What must hold after a refusal ended the capture on env.s."""
    assert not ng.is_capturing(env.s)
    # The half-built graph was discarded: the launch recorded before the
    # refusal never runs, and ending the capture yields no graph.
    with pytest.raises(ng.CaptureInvalidatedError, match="already ended"):
        ng.end_capture(env.s)
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 0.0)
    # Other streams are unaffected.
    env.add[1, 32, env.other](env.y, env.one_other)
    np.testing.assert_array_equal(env.y.copy_to_host(stream=env.other), 1.0)
    # A new capture on the same stream works.
    with ng.capture(env.s, mode=mode) as cap:
        env.add[1, 32, env.s](env.x, env.one)
    cap.graph.launch()
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 2.0)


@pytest.mark.parametrize("mode", STRICT_MODES)
@pytest.mark.parametrize("op", OPS, ids=repr)
def test_refused_operation_ends_the_capture_and_leaves_all_usable(env, op, mode):
    ng.begin_capture(env.s, mode=mode)
    env.add[1, 32, env.s](env.x, env.one)
    with pytest.raises(op.error) as refused:
        op.call(env)
    assert isinstance(refused.value, ng.CaptureError)
    _assert_usable_after(env, mode)


@pytest.mark.parametrize("op", RELAXED_REFUSED, ids=repr)
def test_relaxed_capture_still_refuses_what_cuda_forbids_on_any_thread(env, op):
    ng.begin_capture(env.s, mode="relaxed")
    env.add[1, 32, env.s](env.x, env.one)
    with pytest.raises(op.relaxed_error):
        op.call(env)
    _assert_usable_after(env, "relaxed")


@pytest.mark.parametrize("op", RELAXED_ALLOWED, ids=repr)
def test_relaxed_capture_allows_allocation(env, op):
    with ng.capture(env.s, mode="relaxed") as cap:
        env.add[1, 32, env.s](env.x, env.one)
        op.call(env)  # runs now, outside the graph
        env.add[1, 32, env.s](env.x, env.one)
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 0.0)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 2.0)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_message_names_the_operation_why_and_what_instead(env, op):
    with pytest.raises(op.error) as refused:
        with ng.capture(env.s):
            op.call(env)
    message = str(refused.value)
    assert op.names in message
    assert "Instead" in message or "End the first capture" in message
    assert "was ended and its graph discarded" in message
    assert not ng.is_capturing(env.s)


def test_refused_operation_propagates_unchanged_from_the_with_block(env):
    with pytest.raises(ng.AllocationInCaptureError) as refused:
        with ng.capture(env.s) as cap:
            cuda.device_array(4, stream=env.other)
    assert isinstance(refused.value, ng.UncapturableOperationError)
    assert isinstance(refused.value, ng.NumbagraphError)
    with pytest.raises(ng.CaptureError, match="once the `with"):
        cap.graph


def test_catching_the_error_inside_the_block_still_yields_no_graph(env):
    with pytest.raises(ng.CaptureInvalidatedError, match="device_array"):
        with ng.capture(env.s):
            with pytest.raises(ng.AllocationInCaptureError):
                cuda.device_array(4, stream=env.other)
    assert not ng.is_capturing(env.s)


def test_end_without_begin_is_refused_and_leaves_the_stream_usable(env):
    with pytest.raises(ng.CaptureStateError, match="not capturing"):
        ng.end_capture(env.s)
    assert not ng.is_capturing(env.s)
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](env.x, env.one)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


@pytest.mark.parametrize(
    "legacy", [cuda.default_stream, cuda.legacy_default_stream, lambda: 0],
    ids=["default_stream", "legacy_default_stream", "zero"],
)
def test_capture_on_the_legacy_default_stream_is_refused(env, legacy):
    with pytest.raises(ng.CaptureStateError, match="legacy default stream") as refused:
        ng.begin_capture(legacy())
    assert "cuda.stream()" in str(refused.value)
    assert not _registry.active()
    env.add[1, 32, env.other](env.y, env.one_other)
    np.testing.assert_array_equal(env.y.copy_to_host(stream=env.other), 1.0)


def test_is_capturing_the_legacy_stream_is_false_and_harmless(env):
    with ng.capture(env.s) as cap:
        assert not ng.is_capturing(cuda.default_stream())
        env.add[1, 32, env.s](env.x, env.one)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


def test_stream_refusal_leaves_a_capture_on_another_stream_running(env):
    ng.begin_capture(env.other)
    env.add[1, 32, env.other](env.y, env.one_other)
    with pytest.raises(ng.SyncInCaptureError):
        with ng.capture(env.s):
            env.s.synchronize()
    assert ng.is_capturing(env.other)
    graph = ng.end_capture(env.other)
    graph.launch()
    np.testing.assert_array_equal(env.y.copy_to_host(stream=env.other), 1.0)


def test_allocation_refusal_ends_every_strict_capture_of_the_thread(env):
    """CUDA forbids the allocation because of each of them."""
    ng.begin_capture(env.s, mode="thread_local")
    ng.begin_capture(env.other, mode="relaxed")
    env.add[1, 32, env.other](env.y, env.one_other)
    with pytest.raises(ng.AllocationInCaptureError):
        cuda.device_array(4, stream=cuda.stream())  # for a stream that does not capture
    assert not ng.is_capturing(env.s)
    assert ng.is_capturing(env.other)  # relaxed: it did not forbid anything
    graph = ng.end_capture(env.other)
    graph.launch()
    np.testing.assert_array_equal(env.y.copy_to_host(stream=env.other), 1.0)


def test_scalar_update_inside_capture_is_still_recorded(env):
    with ng.capture(env.s, mode="global") as cap:
        env.one.update(3.0)
        env.add[1, 32, env.s](env.x, env.one)
    env.one.update(100.0)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 3.0)


def test_device_to_device_copy_is_recorded_and_keeps_both_arrays(env):
    source = device_zeros(32, stream=env.s)
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](source, env.one)
        env.x.copy_to_device(source, stream=env.s)
    source_ref = weakref.ref(source)
    del source
    gc.collect()
    assert source_ref() is not None  # the graph keeps it
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 0.0)
    cap.graph.launch()
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 2.0)


def test_work_on_another_stream_may_run_during_a_capture(env):
    z = device_zeros(32, stream=env.other)
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](env.x, env.one)
        env.add[1, 32, env.other](env.y, env.one_other)  # runs now
        z.copy_to_device(env.y, stream=env.other)
        early = z.copy_to_host(stream=env.other)  # asynchronous: allowed
    env.other.synchronize()
    np.testing.assert_array_equal(early, 1.0)
    np.testing.assert_array_equal(env.y.copy_to_host(stream=env.other), 1.0)
    np.testing.assert_array_equal(z.copy_to_host(stream=env.other), 1.0)
    assert env.y[0] == 1.0
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


def test_event_recorded_and_waited_on_the_capturing_stream_is_allowed(env):
    with ng.capture(env.s) as cap:
        env.event.record(env.s)
        env.event.wait(env.s)
        env.add[1, 32, env.s](env.x, env.one)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


def test_waiting_on_an_event_from_outside_the_capture_is_refused(env):
    env.event.record(env.other)
    with pytest.raises(ng.ForeignStreamInCaptureError, match="outside"):
        with ng.capture(env.s):
            env.event.wait(env.s)


# ---------------------------------------------------------------- first compile


def test_kernel_first_called_inside_a_capture_compiles_there_and_replays(env):
    @cuda.jit
    def triple(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = 3 * x[i] + 1

    with ng.capture(env.s) as cap:
        triple[1, 32, env.s](env.x)
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 0.0)
    cap.graph.launch()
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 4.0)


def test_kernel_specialised_inside_a_capture_for_new_argument_types_replays(env):
    @cuda.jit
    def scale_add(x, a, b):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = x[i] * a + b

    warm = device_zeros(32, np.float32, stream=env.s)
    scale_add[1, 32, env.s](warm, np.float32(2), np.float32(1))  # float32 warm-up
    ints = cuda.to_device(np.arange(32, dtype=np.int64), stream=env.s)
    with ng.capture(env.s) as cap:
        scale_add[1, 32, env.s](ints, 3, 2)  # int64 array, int64 scalars: new types
        scale_add[1, 32, env.s](warm, np.float32(2), np.float32(1))
    np.testing.assert_array_equal(ints.copy_to_host(stream=env.s), np.arange(32))
    cap.graph.launch()
    np.testing.assert_array_equal(ints.copy_to_host(stream=env.s), 3 * np.arange(32) + 2)
    np.testing.assert_array_equal(warm.copy_to_host(stream=env.s), 3.0)
    if not ON_SIMULATOR:  # the simulator does not compile
        assert len(scale_add.overloads) == 2


# ---------------------------------------------------------------- lifetime


def _graph_on(env, stream, array, scalar):
    with ng.capture(stream) as cap:
        env.add[1, 32, stream](array, scalar)
    return cap.graph


def test_closing_a_graph_during_another_capture_does_not_break_it(env):
    old = _graph_on(env, env.other, env.y, env.one_other)
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](env.x, env.one)
        old.close()
        env.add[1, 32, env.s](env.x, env.one)
    assert old.closed
    with pytest.raises(ng.GraphClosedError):
        old.launch()
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 2.0)


def test_a_graph_dropped_during_a_capture_is_freed_after_it(env):
    kept = device_zeros(32, stream=env.other)
    old = _graph_on(env, env.other, kept, env.one_other)
    kept_ref, old_ref = weakref.ref(kept), weakref.ref(old)
    del kept
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](env.x, env.one)
        del old
        gc.collect()
        assert old_ref() is None
        assert kept_ref() is not None  # freeing waits for the capture to end
        env.add[1, 32, env.s](env.x, env.one)
    gc.collect()
    assert kept_ref() is None
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 2.0)


def test_arrays_numba_frees_during_a_capture_do_not_break_it(env):
    # More dropped arrays than numba lets wait before it frees them: the
    # frees wait for the capture to end, since a free would invalidate it.
    temps = [device_zeros(32, stream=env.s) for _ in range(40)]
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](env.x, env.one)
        del temps[:]
        gc.collect()
        env.add[1, 32, env.s](env.x, env.one)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 2.0)


def test_a_graph_keeps_arrays_dropped_during_its_capture(env):
    temp = device_zeros(32, stream=env.s)
    temp_ref = weakref.ref(temp)
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](temp, env.one)
        del temp
        gc.collect()
    gc.collect()
    assert temp_ref() is not None
    cap.graph.launch()
    np.testing.assert_array_equal(temp_ref().copy_to_host(stream=env.s), 1.0)


def test_graph_captured_alongside_another_is_not_instantiated_inside_a_capture(env):
    ng.begin_capture(env.other)
    with ng.capture(env.s) as inner:
        env.add[1, 32, env.s](env.x, env.one)
    with pytest.raises(ng.UncapturableOperationError, match="instantiating"):
        inner.graph.launch()
    assert not ng.is_capturing(env.other)
    inner.graph.launch()  # instantiates now that no capture runs
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


# ---------------------------------------------------------------- threads


def _in_thread(fn):
    """Run fn on a new thread; return its result or raise its exception."""
    out = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001  re-raised on this thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    if "error" in out:
        raise out["error"]
    return out.get("result")


def test_two_threads_capture_their_own_streams_at_once(env):
    both_capturing = threading.Barrier(2, timeout=60)

    def capture_on(stream, array, scalar, times):
        with ng.capture(stream, mode="thread_local") as cap:
            both_capturing.wait()
            for _ in range(times):
                env.add[1, 32, stream](array, scalar)
            both_capturing.wait()
        return cap.graph

    results = {}

    def second():
        results["other"] = capture_on(env.other, env.y, env.one_other, 3)

    helper = threading.Thread(target=second)
    helper.start()
    graph = capture_on(env.s, env.x, env.one, 2)
    helper.join(timeout=120)
    assert (graph.num_nodes, results["other"].num_nodes) == (2, 3)
    graph.launch()
    results["other"].launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 2.0)
    np.testing.assert_array_equal(env.y.copy_to_host(stream=env.other), 3.0)


def test_thread_local_capture_lets_other_threads_allocate(env):
    with ng.capture(env.s, mode="thread_local") as cap:
        env.add[1, 32, env.s](env.x, env.one)
        made = _in_thread(lambda: cuda.device_array(4))
    assert made.shape == (4,)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


def test_global_capture_refuses_allocation_from_another_thread(env):
    ng.begin_capture(env.s, mode="global")
    env.add[1, 32, env.s](env.x, env.one)
    with pytest.raises(ng.AllocationInCaptureError, match="mode 'global'") as refused:
        _in_thread(lambda: cuda.device_array(4))
    assert "begun by another thread, was invalidated" in str(refused.value)
    # CUDA invalidates the capture; its own thread ends it.
    assert ng.is_capturing(env.s)
    with pytest.raises(ng.CaptureInvalidatedError, match="another thread"):
        ng.end_capture(env.s)
    assert not ng.is_capturing(env.s)
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 0.0)
    with ng.capture(env.s, mode="global") as cap:
        env.add[1, 32, env.s](env.x, env.one)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


def test_invalidated_capture_refuses_its_next_launch(env):
    ng.begin_capture(env.s, mode="global")
    with pytest.raises(ng.AllocationInCaptureError):
        _in_thread(lambda: cuda.pinned_array(4))
    with pytest.raises(ng.CaptureInvalidatedError):
        env.add[1, 32, env.s](env.x, env.one)
    assert not ng.is_capturing(env.s)


def test_a_relaxed_capture_may_be_aborted_on_another_thread(env):
    ng.begin_capture(env.s, mode="relaxed")
    env.add[1, 32, env.s](env.x, env.one)
    _in_thread(lambda: ng.abort_capture(env.s))
    assert not ng.is_capturing(env.s)
    env.add[1, 32, env.s](env.x, env.one)   # the stream is usable at once
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


def test_ending_another_threads_capture_is_refused(env):
    ng.begin_capture(env.s, mode="thread_local")
    with pytest.raises(ng.CaptureStateError, match="WRONG_THREAD"):
        _in_thread(lambda: ng.end_capture(env.s))
    with pytest.raises(ng.CaptureInvalidatedError):
        ng.end_capture(env.s)
    assert not ng.is_capturing(env.s)


def test_a_relaxed_capture_may_end_on_another_thread(env):
    ng.begin_capture(env.s, mode="relaxed")
    env.add[1, 32, env.s](env.x, env.one)
    # A thread that never used CUDA: on the GPU it has no context current.
    graph = _in_thread(lambda: ng.end_capture(env.s))
    graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


# ---------------------------------------------------------------- driver errors


class _FakeDriverError(RuntimeError):
    def __init__(self, code):
        super().__init__(f"[{code}] Call to cuSomething results in an error")
        self.code = code


@pytest.mark.parametrize(
    "code, error",
    [
        (900, ng.UncapturableOperationError),
        (901, ng.CaptureInvalidatedError),
        (904, ng.ForeignStreamInCaptureError),
        (906, ng.ForeignStreamInCaptureError),
        (907, ng.SyncInCaptureError),
        (908, ng.CaptureStateError),
    ],
)
def test_driver_capture_errors_raised_in_the_block_are_translated(env, code, error):
    raw = _FakeDriverError(code)
    with pytest.raises(error, match="CUDA_ERROR_STREAM_CAPTURE_") as translated:
        with ng.capture(env.s):
            env.add[1, 32, env.s](env.x, env.one)
            raise raw
    assert translated.value.__cause__ is raw
    assert not ng.is_capturing(env.s)


def test_translation_reads_error_names_in_messages():
    from numbagraph.errors import translate_driver_error

    named = RuntimeError("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: operation failed")
    assert isinstance(translate_driver_error(named, "s"), ng.CaptureInvalidatedError)
    assert translate_driver_error(RuntimeError("out of memory"), "s") is None


@pytest.mark.driver_only(reason="a raw driver allocation bypasses numba's entry points")
def test_driver_refusal_of_an_unchecked_call_is_translated_at_the_end(env):
    from cuda.bindings import driver as cu

    with pytest.raises(ng.CaptureInvalidatedError,
                       match="the CUDA driver invalidated the capture.*INVALIDATED"):
        with ng.capture(env.s, mode="thread_local"):
            env.add[1, 32, env.s](env.x, env.one)
            err, ptr = cu.cuMemAlloc(64)
            assert err == cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert not ng.is_capturing(env.s)
    _assert_new_capture_works(env)


@pytest.mark.driver_only(reason="checks the driver's own rule for global captures")
def test_driver_refuses_raw_allocation_from_another_thread_in_global_mode(env):
    from cuda.bindings import driver as cu

    ng.begin_capture(env.s, mode="global")
    env.add[1, 32, env.s](env.x, env.one)

    def raw_alloc():
        cuda.current_context()  # make the context current on this thread
        return cu.cuMemAlloc(64)

    err, ptr = _in_thread(raw_alloc)
    assert err == cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    with pytest.raises(ng.CaptureInvalidatedError, match="the CUDA driver invalidated"):
        ng.end_capture(env.s)
    assert not ng.is_capturing(env.s)
    _assert_new_capture_works(env)


def _assert_new_capture_works(env):
    env.x.copy_to_device(np.zeros(32, np.float32), stream=env.s)
    with ng.capture(env.s) as cap:
        env.add[1, 32, env.s](env.x, env.one)
    cap.graph.launch()
    np.testing.assert_array_equal(env.x.copy_to_host(stream=env.s), 1.0)


def test_a_kernel_on_another_stream_indexes_arrays_of_the_capturing_stream(
        stream, other_stream, kernels):
    x = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=other_stream)
    kernels.add[1, 32, other_stream](x, one)
    with records_nothing(), ng.capture(stream):
        kernels.add[1, 32, other_stream](x, one)  # runs now, on other_stream
    other_stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=other_stream), 2.0)


def test_a_graph_replays_on_another_thread_during_a_global_capture(stream, other_stream,
                                                                    kernels):
    import threading

    x = cuda.to_device(np.zeros(32, np.float32), stream=other_stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=other_stream)
    kernels.add[1, 32, other_stream](x, one)
    with ng.capture(other_stream) as cap:
        kernels.add[1, 32, other_stream](x, one)
    errors = []

    def replay():
        try:
            cap.graph.launch()
        except Exception as exc:  # noqa: BLE001  reported below
            errors.append(exc)

    with records_nothing(), ng.capture(stream, mode="global"):
        worker = threading.Thread(target=replay)
        worker.start()
        worker.join()
    assert not errors
    other_stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=other_stream), 2.0)
