import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import device_zeros


def test_launches_inside_capture_are_recorded_not_run(stream, kernels, warm_add):
    x, one = warm_add
    with ng.capture(stream) as cap:
        for _ in range(3):
            kernels.add[1, 32, stream](x, one)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 1.0)
    assert cap.graph.num_nodes == 3


def test_replay_runs_every_recorded_launch(stream, kernels, warm_add):
    x, one = warm_add
    with ng.capture(stream) as cap:
        for _ in range(3):
            kernels.add[1, 32, stream](x, one)
    cap.graph.launch()
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 7.0)


def test_update_between_replays_is_seen(stream, kernels):
    x = device_zeros(32, stream=stream)
    pos = ng.DeviceScalar(0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, pos)
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, pos)
        kernels.add[1, 32, stream](x, pos)
    for i in range(5):
        pos.update(i)
        cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2 * sum(range(5)))


def test_begin_and_end_capture_in_two_calls(stream, kernels, warm_add):
    x, one = warm_add
    ng.begin_capture(stream)
    assert ng.is_capturing(stream)
    kernels.add[1, 32, stream](x, one)
    graph = ng.end_capture(stream)
    assert not ng.is_capturing(stream)
    assert isinstance(graph, ng.CapturedGraph)
    graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


@pytest.mark.parametrize("mode", ng.CAPTURE_MODES)
def test_every_capture_mode_records(stream, kernels, mode, warm_add):
    x, one = warm_add
    with ng.capture(stream, mode=mode) as cap:
        kernels.add[1, 32, stream](x, one)
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_unknown_mode_is_refused(stream):
    with pytest.raises(ValueError, match="global, thread_local, relaxed"):
        ng.begin_capture(stream, mode="loose")
    assert not ng.is_capturing(stream)


def test_exception_in_block_aborts_and_propagates(stream, kernels, warm_add):
    x, one = warm_add
    with pytest.raises(KeyError, match="boom"):
        with ng.capture(stream) as cap:
            kernels.add[1, 32, stream](x, one)
            raise KeyError("boom")
    assert not ng.is_capturing(stream)
    with pytest.raises(ng.CaptureError):
        cap.graph
    kernels.add[1, 32, stream](x, one)  # the stream still runs work
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)
    with ng.capture(stream) as again:  # and captures again
        kernels.add[1, 32, stream](x, one)
    again.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 3.0)


def test_a_capture_never_entered_says_so_at_its_graph(stream, kernels, warm_add):
    x, one = warm_add
    cap = ng.capture(stream)                   # no `with`: nothing begins
    kernels.add[1, 32, stream](x, one)         # so this runs at once
    assert not ng.is_capturing(stream)
    with pytest.raises(ng.CaptureStateError,
                       match=r"never entered.*`with ng.capture\(s\) as cap:`.*ran eagerly"):
        cap.graph
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_default_stream_is_refused():
    for s in (cuda.default_stream(), cuda.legacy_default_stream(), 0):
        with pytest.raises(ng.CaptureError, match="legacy default stream"):
            ng.begin_capture(s)


def test_end_without_begin_is_refused(stream):
    with pytest.raises(ng.CaptureError, match="not capturing"):
        ng.end_capture(stream)


def test_stream_given_as_cuda_stream_protocol(stream, kernels, warm_add):
    class Foreign:
        def __cuda_stream__(self):
            return (0, int(stream.handle))

    x, one = warm_add
    with ng.capture(Foreign()) as cap:
        assert ng.is_capturing(stream)
        kernels.add[1, 32, stream](x, one)
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_external_stream_captures(stream, kernels):
    ext = cuda.external_stream(int(stream.handle))
    x = device_zeros(32, stream=stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, ext](x, one)
    with ng.capture(ext) as cap:
        kernels.add[1, 32, ext](x, one)
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_two_streams_capture_independently(stream, other_stream, kernels):
    x = device_zeros(32, stream=stream)
    y = device_zeros(32, stream=other_stream)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, one)
    stream.synchronize()
    with ng.capture(stream) as a, ng.capture(other_stream) as b:
        kernels.add[1, 32, stream](x, one)
        kernels.add[1, 32, other_stream](y, one)
        kernels.add[1, 32, other_stream](y, one)
    assert (a.graph.num_nodes, b.graph.num_nodes) == (1, 2)
    b.graph.launch()
    other_stream.synchronize()
    np.testing.assert_array_equal(y.copy_to_host(stream=other_stream), 2.0)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 1.0)


def test_backend_is_named():
    assert ng.backend() in ("cuda", "simulator")


@pytest.mark.driver_only(reason="the cache of numba contexts belongs to the driver backend")
def test_a_context_replaced_by_a_device_reset_is_never_held(stream, kernels, warm_add):
    from types import SimpleNamespace

    from numbagraph.backend import driver

    current = cuda.current_context()
    # What a reset (cuda.close()) leaves: a Context its device no longer uses.
    stale = SimpleNamespace(device=SimpleNamespace(primary_context=None))
    driver._numba_contexts[int(current.handle)] = stale
    assert driver._numba_context() is current
    x, one = warm_add
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, one)
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)
    cap.graph.close()


@pytest.mark.driver_only(reason="numba's pending frees exist only with the real driver")
def test_numba_frees_wait_exactly_as_long_as_the_capture(stream, kernels, warm_add):
    ctx = cuda.current_context()
    queues = (ctx.deallocations, ctx.memory_manager.deallocations)
    assert not any(q.is_disabled for q in queues)
    x, one = warm_add
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, one)
        assert all(q.is_disabled for q in queues)
    assert not any(q.is_disabled for q in queues)
    with pytest.raises(RuntimeError):
        with ng.capture(stream):
            assert all(q.is_disabled for q in queues)
            raise RuntimeError("the block fails")
    assert not any(q.is_disabled for q in queues)
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)
    cap.graph.close()


def test_a_refused_capture_keeps_its_reason_without_its_frames(stream):
    from numbagraph import _registry

    ng.begin_capture(stream)
    with pytest.raises(ng.UncapturableOperationError):
        stream.synchronize()
    # The reason end_capture gives is kept, but not the traceback that pins
    # every frame it passed through.
    reasons = list(_registry._ended.values())
    assert reasons and reasons[-1].__traceback__ is None
    with pytest.raises(ng.CaptureInvalidatedError, match="synchronize"):
        ng.end_capture(stream)


# Run in a process of its own: on the GPU, a "thread_local" capture whose
# thread ended goes on capturing on its (blocking) stream, and CUDA then
# refuses every later call on the legacy default stream in that process.
_ORPHAN_SCENARIO = """
import gc, sys, threading, weakref
import numbagraph as ng
import numpy as np
from numba import cuda
from numbagraph import _registry

mode = sys.argv[1]

@cuda.jit
def add(x, v):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += v[0]

s, orphaned = cuda.stream(), cuda.stream()
x = cuda.to_device(np.zeros(32, np.float32), stream=s)
one = ng.DeviceScalar(1.0, dtype=np.float32, stream=s)
add[1, 32, s](x, one)
held = cuda.to_device(np.zeros(32, np.float32), stream=s)
held_ref = weakref.ref(held)
s.synchronize()

def orphan():
    ng.begin_capture(orphaned, mode=mode)
    add[1, 32, orphaned](held, one)

worker = threading.Thread(target=orphan)
worker.start()
worker.join()
del held
with ng.capture(s) as cap:
    add[1, 32, s](x, one)
graph_ref = weakref.ref(cap.graph)
cap.graph.close()
del cap
gc.collect()
print("released", graph_ref() is None and held_ref() is None)
print("forgotten", not [t for t in _registry.active() if t.handle == int(orphaned.handle)])
print("deferred", len(_registry._deferred))
print("capturing", ng.is_capturing(orphaned))
try:
    ng.begin_capture(orphaned)
    ng.abort_capture(orphaned)
    print("begin", "ok")
except ng.CaptureStateError as exc:
    print("begin", "refused", "ended without ending it" in str(exc))
"""


@pytest.mark.parametrize("mode", ["thread_local", "relaxed"])
def test_a_capture_whose_thread_ended_holds_nothing_forever(mode):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ORPHAN_SCENARIO, mode],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert seen["released"] == "True"
    assert seen["forgotten"] == "True"
    assert seen["deferred"] == "0", "releases still wait for the dead thread's capture"
    # CUDA lets no other thread end a "thread_local" capture: its stream goes
    # on capturing, and a new capture there says why.
    strict = mode == "thread_local"
    assert seen["capturing"] == str(strict)
    assert seen["begin"] == ("refused True" if strict else "ok")


def test_abort_capture_is_public_and_leaves_the_stream_usable(stream, kernels, warm_add):
    x, one = warm_add
    ng.begin_capture(stream)
    kernels.add[1, 32, stream](x, one)
    ng.abort_capture(stream)
    assert not ng.is_capturing(stream)
    kernels.add[1, 32, stream](x, one)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)
    with pytest.raises(ng.CaptureStateError, match="not capturing"):
        ng.abort_capture(stream)


def test_another_thread_may_not_abort_a_strict_capture(stream):
    import threading

    ng.begin_capture(stream)
    refused = []
    worker = threading.Thread(target=lambda: refused.append(
        pytest.raises(ng.CaptureStateError, ng.abort_capture, stream)))
    worker.start()
    worker.join()
    assert refused and ng.is_capturing(stream)
    ng.abort_capture(stream)


@pytest.mark.parametrize("mode", ng.CAPTURE_MODES)
def test_threads_capture_their_own_per_thread_default_streams_at_once(kernels, mode):
    # One handle (CU_STREAM_PER_THREAD) names a different stream on each
    # thread, and each may capture on its own.
    import threading

    together = threading.Barrier(2)
    seen = {}

    def work(launches):
        try:
            s = cuda.per_thread_default_stream()
            # Not conftest's device_zeros: the simulator swaps the `cuda` of
            # a kernel's module while the kernel runs, on every thread.
            x = cuda.to_device(np.zeros(32, np.float32), stream=s)
            one = ng.DeviceScalar(1.0, dtype=np.float32, stream=s)
            kernels.add[1, 32, s](x, one)
            s.synchronize()
            together.wait(timeout=60)
            with ng.capture(s, mode=mode) as cap:
                together.wait(timeout=60)  # both threads capture now
                for _ in range(launches):
                    kernels.add[1, 32, s](x, one)
                together.wait(timeout=60)
            # Instantiation waits for no "global" capture to be active.
            together.wait(timeout=60)
            cap.graph.launch()
            seen[launches] = x.copy_to_host(stream=s)
            assert not ng.is_capturing(s)
        except BaseException as exc:  # reported below, with the other thread's result
            together.abort()
            seen[launches] = exc

    threads = [threading.Thread(target=work, args=(n,)) for n in (2, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for launches, result in seen.items():
        assert not isinstance(result, BaseException), result
        np.testing.assert_array_equal(result, 1.0 + launches)
    assert len(seen) == 2


@pytest.mark.parametrize("call", [
    lambda: ng.capture(12345).__enter__(),
    lambda: ng.begin_capture(0x7F0000001000),
    lambda: ng.DeviceScalar(1, np.int32, stream=12345),
    lambda: ng.add_into(ng.zeros(4, np.float32), 1.0, ng.zeros(4, np.float32), stream=12345),
])
def test_a_bare_integer_is_not_taken_as_a_stream(call):
    # The driver ends the process when given a number that is not a stream.
    with pytest.raises((TypeError, ng.OpError), match=r"cuda.external_stream\(0x"):
        call()


def test_the_named_default_streams_may_be_given_as_integers(kernels):
    x = device_zeros(32, stream=0)
    one = ng.DeviceScalar(1.0, dtype=np.float32, stream=0)
    kernels.add[1, 32, 0](x, one)
    ng.add_into(x, 1.0, x, stream=0)
    np.testing.assert_array_equal(x.copy_to_host(stream=0), 2.0)


@pytest.mark.driver_only(reason="numba's pending frees live in each device's driver context")
def test_a_capture_holds_the_frees_of_its_streams_device():
    if len(cuda.gpus) < 2:
        pytest.skip("needs two GPUs")
    with cuda.gpus[1]:
        s1 = cuda.stream()
        ctx1 = cuda.current_context()
    with cuda.gpus[0]:
        ctx0 = cuda.current_context()
        before = (ctx0.deallocations._disable_count, ctx1.deallocations._disable_count)
        ng.begin_capture(s1, mode="relaxed")
        try:
            held = (ctx0.deallocations._disable_count, ctx1.deallocations._disable_count)
        finally:
            ng.abort_capture(s1)
    assert held == (before[0], before[1] + 1)
    assert (ctx0.deallocations._disable_count, ctx1.deallocations._disable_count) == before


def test_a_capture_that_recorded_nothing_warns(stream, other_stream, kernels, warm_add):
    x, one = warm_add
    with pytest.warns(ng.CaptureWarning, match="recorded nothing.*another stream"):
        with ng.capture(stream) as cap:
            kernels.add[1, 32, other_stream](x, one)  # the wrong stream: runs at once
    assert cap.graph.num_nodes == 0
    other_stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


def test_a_scalar_of_another_stream_updated_during_a_capture_warns(stream, other_stream, kernels):
    import warnings

    x = device_zeros(32, stream=stream)
    pos = ng.DeviceScalar(0.0, dtype=np.float32, stream=other_stream)
    kernels.add[1, 32, stream](x, pos)
    with ng.capture(stream) as cap:
        with pytest.warns(ng.CaptureWarning, match=r"update\(5.0\) ran at once .*not recorded"):
            pos.update(5.0)
        kernels.add[1, 32, stream](x, pos)
    assert pos.value == 5.0  # it ran at once
    # Outside a capture, or on the capturing stream, nothing is said.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pos.update(1.0)
        own = ng.DeviceScalar(0.0, dtype=np.float32, stream=stream)
        with ng.capture(stream):
            own.update(2.0)


def test_a_global_capture_begins_only_once_no_unsafe_call_is_in_flight(stream):
    # A call CUDA forbids during a "global" capture (a synchronize, an
    # allocation) is checked and made as one: the capture waits for it, so it
    # cannot begin between the check and the driver's call.
    import threading

    from numbagraph import _registry

    in_call, finish = threading.Event(), threading.Event()

    def unsafe_call_in_flight():
        with _registry.unsafe_call:
            in_call.set()
            finish.wait(timeout=60)

    caller = threading.Thread(target=unsafe_call_in_flight)
    caller.start()
    assert in_call.wait(timeout=60)
    begun, end_now, seen = threading.Event(), threading.Event(), []

    def begin_then_abort():
        # CUDA lets only this thread end its "global" capture.
        ng.begin_capture(stream, mode="global")
        begun.set()
        end_now.wait(timeout=60)
        seen.append(ng.is_capturing(stream))
        ng.abort_capture(stream)

    beginner = threading.Thread(target=begin_then_abort)
    beginner.start()
    try:
        assert not begun.wait(timeout=0.2)  # still waiting for the call
        assert not ng.is_capturing(stream)
    finally:
        finish.set()
        caller.join()
    assert begun.wait(timeout=60)
    end_now.set()
    beginner.join()
    assert seen == [True]


def test_a_global_capture_begins_while_another_thread_makes_unsafe_calls_back_to_back(stream):
    # A beginning global capture goes first: calls made back to back on
    # another thread cannot hold it off.
    import threading

    host = np.zeros(4, np.float32)
    stop = threading.Event()

    def loader():
        loader_stream = cuda.stream()
        while not stop.is_set():
            try:
                cuda.to_device(host, stream=loader_stream).copy_to_host(stream=loader_stream)
            except ng.UncapturableOperationError:
                pass  # refused while the global capture runs, as documented

    worker = threading.Thread(target=loader)
    worker.start()
    begun = []
    try:
        beginner = threading.Thread(target=lambda: (
            ng.begin_capture(stream, mode="global"), begun.append(True),
            ng.abort_capture(stream)))
        beginner.start()
        beginner.join(timeout=60)
    finally:
        stop.set()
        worker.join()
    assert begun == [True]


def test_an_interrupted_wait_for_unsafe_calls_lets_them_go(monkeypatch):
    from numbagraph import _registry

    def interrupted(timeout=None):
        raise KeyboardInterrupt

    with _registry.unsafe_call:  # one call in flight, so the beginning waits
        monkeypatch.setattr(_registry._unsafe, "wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            with _registry.no_unsafe_calls:
                pass
        monkeypatch.undo()
    assert _registry._beginning == 0 and _registry._unsafe_in_flight == 0
    with _registry.unsafe_call:  # nothing held back
        pass


def test_a_capture_being_ended_still_counts_as_running(stream, kernels, warm_add, monkeypatch):
    # Until the driver has ended it, other threads' checks see it.
    import threading

    from numbagraph import _registry

    x, one = warm_add
    ng.begin_capture(stream, mode="global")
    kernels.add[1, 32, stream](x, one)
    from numbagraph.backend import active as backend

    session = _registry.on(backend.stream_handle(stream))
    seen = []
    abort = session.recording.abort

    def slow_abort():
        worker = threading.Thread(target=lambda: seen.append(
            (session in _registry.active(), _registry.sessions.get(session.key) is session)))
        worker.start()
        worker.join()
        abort()

    monkeypatch.setattr(session.recording, "abort", slow_abort)
    ng.abort_capture(stream)
    assert seen == [(True, True)]
    assert not ng.is_capturing(stream) and session not in _registry.active()


# ---------------------------------------------------------------- kernels numba cannot type

def test_a_number_where_a_kernel_indexes_one_is_refused_at_the_launch(stream, kernels, warm_add):
    x, one = warm_add
    with ng.capture(stream) as cap:
        with pytest.raises(ng.KernelArgumentError,
                           match=r"argument 1 \(pos\) given to add_scalar is a float.*DeviceScalar"):
            kernels.add[1, 32, stream](x, 1.0)
        kernels.add[1, 32, stream](x, one)         # the capture goes on
    assert [node.args[1].kind for node in cap.graph.nodes] == ["DeviceScalar"]
    cap.graph.launch()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), 2.0)


@cuda.jit
def takes_a_length(x, n):
    x[0] = len(n)


@pytest.mark.driver_only("the simulator runs kernels as Python and types none")
def test_a_kernel_numba_cannot_type_is_refused_at_the_launch_naming_its_arguments(
        stream, kernels, warm_add):
    x, one = warm_add
    with ng.capture(stream) as cap:
        with pytest.raises(ng.KernelArgumentError,
                           match=r"takes_a_length\(x: array\(float32, 1d, C\), n: float64\)"):
            takes_a_length[1, 1, stream](x, 1.5)
        kernels.add[1, 32, stream](x, one)
    assert cap.graph.num_nodes == 1


# ---------------------------------------------------------------- a program that ends capturing

_ENDS_CAPTURING = """\
import numbagraph as ng
from numba import cuda

s = cuda.stream()
print(repr(s))
ng.begin_capture(s)
"""


def test_a_program_that_ends_while_capturing_warns_naming_the_stream_and_line(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "ends_capturing.py"
    script.write_text(_ENDS_CAPTURING)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    stream = done.stdout.strip()
    assert "CaptureWarning" in done.stderr
    assert f"the capture on {stream}, begun at {script}:6, was open" in done.stderr
    assert "recorded, not run" in done.stderr


def test_a_capture_remembers_the_line_that_began_it(stream, kernels, warm_add):
    import inspect

    from numbagraph import _registry
    from numbagraph.backend import active

    with ng.capture(stream):
        line = inspect.currentframe().f_lineno - 1
        session = _registry.on(active.stream_handle(stream))
        kernels.add[1, 32, stream](*warm_add)
    assert session.begun_at == (__file__, line)


def test_no_warning_at_exit_when_every_capture_has_ended(stream, kernels, warm_add):
    import importlib
    import warnings

    capture = importlib.import_module("numbagraph.capture")  # the module, not ng.capture
    with ng.capture(stream):
        kernels.add[1, 32, stream](*warm_add)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        capture._warn_of_open_captures()
