"""ng.on_host: host callbacks in stream order, run eagerly or recorded into
graphs, and read-backs into pinned memory (HostScalar) that they read."""

import gc
import time
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng


@cuda.jit
def tenfold(out, pos):
    """out = 10 * pos: the value a callback after the kernel must see."""
    if cuda.grid(1) == 0:
        out[0] = pos[0] * 10


@cuda.jit
def count(total):
    if cuda.grid(1) == 0:
        total[0] += 1


@cuda.jit
def fill_from(d, pos):
    """d[i] = pos + i: what a read-back must see."""
    i = cuda.grid(1)
    if i < d.size:
        d[i] = pos[0] + i


# Pinned host memory numba makes, which a capture records a copy into.
PINNED = [pytest.param(lambda n: cuda.pinned_array(n, np.float32), id="pinned_array"),
          pytest.param(lambda n: cuda.mapped_array(n, np.float32), id="mapped_array")]


@pytest.fixture(autouse=True)
def no_error_left_behind():
    """Each test reports every error its callbacks raised."""
    yield
    try:
        cuda.synchronize()
    except ng.HostCallbackError as exc:
        pytest.fail(f"the test left a host callback's error unreported: {exc}")


def gone(alive):
    """Whether the object ``alive`` (a weak reference) refers to is freed."""
    gc.collect()
    return alive() is None


def wait_until(predicate, what, seconds=20.0):
    """Poll ``predicate`` without synchronising any stream."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {seconds} s")
        time.sleep(0.001)


@pytest.fixture
def total(stream):
    """An int32 counter at zero, ``count`` compiled outside any capture."""
    total = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    count[1, 1, stream](total)
    total.copy_to_device(np.zeros(1, np.int32), stream=stream)
    return total


def counted(total, stream):
    return int(total.copy_to_host(stream=stream)[0])


class Box:
    """A weakly referable argument."""

    def __init__(self, value):
        self.value = value


# ---------------------------------------------------------------- order

def test_each_replay_calls_back_after_its_kernel_and_read_back(stream):
    pos = ng.DeviceScalar(1, np.int64, stream=stream)
    value = ng.DeviceScalar(0, np.int64, stream=stream)
    seen = ng.HostScalar(np.int64)
    tenfold[1, 1, stream](value, pos)
    log = []

    def record(host, into):
        into.append(host.value)

    with ng.capture(stream) as cap:
        tenfold[1, 1, stream](value, pos)   # writes 10 * pos on the device
        value.read_async(seen)               # copied into pinned host memory
        ng.on_host(record, seen, log, stream=stream)
        ng.increment(pos)
    assert log == []                         # recorded, not run
    for _ in range(5):
        cap.graph.launch()
    stream.synchronize()
    assert log == [10, 20, 30, 40, 50]


def test_replaying_n_times_calls_n_times_with_the_arguments_given(stream):
    calls = []
    key = ("step", 3)
    with ng.capture(stream) as cap:
        ng.on_host(calls.append, key, stream=stream)
        ng.on_host(lambda a, b: calls.append(a + b), 2, 5, stream=stream)
    for _ in range(4):
        cap.graph.launch()
    stream.synchronize()
    assert calls == [key, 7] * 4
    assert all(entry is key for entry in calls[::2])   # held as given, not copied


def test_callbacks_and_kernels_of_a_replay_keep_their_order(stream, total):
    seen = []
    with ng.capture(stream) as cap:
        ng.on_host(seen.append, "first", stream=stream)
        count[1, 1, stream](total)
        ng.on_host(seen.append, "second", stream=stream)
    cap.graph.launch()
    cap.graph.launch()
    stream.synchronize()
    assert seen == ["first", "second"] * 2
    assert counted(total, stream) == 2


# ---------------------------------------------------------------- eager

def test_outside_a_capture_it_runs_once_in_stream_order(stream):
    pos = ng.DeviceScalar(4, np.int32, stream=stream)
    value = ng.DeviceScalar(0, np.int32, stream=stream)
    seen = ng.HostScalar(np.int32)
    log = []
    tenfold[1, 1, stream](value, pos)
    value.read_async(seen)
    ng.on_host(lambda: log.append(seen.value), stream=stream)
    ng.on_host(log.append, "then", stream=stream)
    stream.synchronize()
    assert log == [40, "then"]
    stream.synchronize()
    assert log == [40, "then"]                # once, not again


def test_an_eager_callback_is_not_part_of_a_later_graph(stream):
    calls = []
    ng.on_host(calls.append, "eager", stream=stream)
    with ng.capture(stream) as cap:
        ng.on_host(calls.append, "recorded", stream=stream)
    cap.graph.launch()
    stream.synchronize()
    assert calls == ["eager", "recorded"]


# ---------------------------------------------------------------- read-back

def test_a_replay_loop_watches_a_recorded_read_back_without_synchronising(stream):
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    seen = ng.HostScalar(np.int32)
    with ng.capture(stream) as cap:
        ng.increment(pos)
        pos.read_async(seen)                 # a kernel storing into mapped memory
    for step in range(1, 6):
        cap.graph.launch()
        wait_until(lambda: seen.value == step, f"replay {step}'s read-back")
    assert pos.value == 5


@pytest.mark.parametrize("make", PINNED)
def test_copy_to_host_into_pinned_memory_is_a_copy_node_each_launch_runs(stream, make):
    pos = ng.DeviceScalar(0, np.float32, stream=stream)
    d = cuda.device_array(4, np.float32, stream=stream)
    fill_from[1, 4, stream](d, pos)
    pinned = make(4)
    with ng.capture(stream) as cap:
        fill_from[1, 4, stream](d, pos)
        assert d.copy_to_host(pinned, stream=stream) is pinned
    assert [(n.kind, n.direction) for n in cap.graph.nodes] == [
        ("kernel", None), ("memcpy", "device to host")]
    for value in (3, 7):
        pos.update(value)
        cap.graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(np.asarray(pinned), [7, 8, 9, 10])


def test_the_graph_keeps_the_pinned_array_it_copies_into_alive(stream):
    pos = ng.DeviceScalar(5, np.float32, stream=stream)
    d = cuda.device_array(4, np.float32, stream=stream)
    fill_from[1, 4, stream](d, pos)
    pinned = cuda.pinned_array(4, np.float32)
    memory = pinned
    while isinstance(memory, np.ndarray):
        memory = memory.base                 # the page-locked allocation
    alive = weakref.ref(memory)
    with ng.capture(stream) as cap:
        fill_from[1, 4, stream](d, pos)
        d.copy_to_host(pinned, stream=stream)
    graph = cap.graph
    del pinned, memory, cap
    gc.collect()
    assert alive() is not None
    graph.launch()
    stream.synchronize()
    graph.close()
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("make", PINNED)
def test_copy_to_host_into_pinned_memory_is_recorded_in_a_conditional_body(stream, make):
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    d = cuda.device_array(4, np.float32, stream=stream)
    fill_from[1, 4, stream](d, pos)
    pinned = make(4)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=3):
            fill_from[1, 4, stream](d, pos)
            d.copy_to_host(pinned, stream=stream)    # each pass: where the loop is
    (loop,) = [n for n in cap.graph.nodes if n.kind == "conditional"]
    assert ("memcpy", "device to host") in [(n.kind, n.direction) for n in loop.body]
    cap.graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(np.asarray(pinned), [2, 3, 4, 5])


def test_a_copy_into_pageable_memory_stays_refused_in_a_capture(stream):
    pos = ng.DeviceScalar(3, np.int32, stream=stream)
    pageable = np.zeros(1, np.int32)
    with pytest.raises(ng.CaptureInvalidatedError):
        with ng.capture(stream):
            with pytest.raises(ng.HostCopyInCaptureError,
                               match=r"copy_to_host\(\).*not memory CUDA allocated page-locked"
                                     r".*pageable.*cuda\.pinned_array"):
                pos.inner().copy_to_host(pageable, stream=stream)
    with ng.capture(stream):
        with pytest.raises(TypeError, match="copies into a HostScalar"):
            pos.read_async(pageable)
        ng.increment(pos)
    assert not ng.is_capturing(stream)
    assert pageable[0] == 0


def test_memory_pinned_for_a_block_by_cuda_pinned_is_refused_in_a_capture(stream):
    d = cuda.device_array(4, np.float32, stream=stream)
    registered = np.zeros(4, np.float32)
    with cuda.pinned(registered):
        with pytest.raises(ng.CaptureInvalidatedError):
            with ng.capture(stream):
                with pytest.raises(ng.HostCopyInCaptureError, match="cuda.pinned"):
                    d.copy_to_host(registered, stream=stream)
    assert not ng.is_capturing(stream)


# ---------------------------------------------------------------- errors

def fail(ran, message):
    ran.append(message)
    raise ValueError(message)


def test_an_error_in_a_replay_is_raised_by_the_next_launch(stream, total):
    ran = []
    with ng.capture(stream) as cap:
        count[1, 1, stream](total)
        ng.on_host(fail, ran, "boom", stream=stream)
        count[1, 1, stream](total)
    graph = cap.graph
    graph.launch()
    wait_until(lambda: ran, "the callback")
    with pytest.raises(ng.HostCallbackError, match="fail.. raised ValueError: boom") as raised:
        graph.launch()                       # raises instead of launching
    assert isinstance(raised.value.__cause__, ValueError)
    assert "graph.launch()" in str(raised.value)
    assert counted(total, stream) == 2       # the replay ran on; nothing more launched
    graph.launch()                           # reported once: launches again
    with pytest.raises(ng.HostCallbackError, match="boom"):
        stream.synchronize()
    assert counted(total, stream) == 4
    assert ran == ["boom", "boom"]


WAITS = ["stream.synchronize", "cuda.synchronize", "event.synchronize", "DeviceScalar.value"]


@pytest.mark.parametrize("wait", WAITS)
def test_each_wait_for_the_device_raises_the_kept_error_once(stream, wait):
    scalar = ng.DeviceScalar(1, np.int32, stream=stream)
    ran = []
    ng.on_host(fail, ran, "waited", stream=stream)
    event = cuda.event()
    event.record(stream)
    call = {
        "stream.synchronize": stream.synchronize,
        "cuda.synchronize": cuda.synchronize,
        "event.synchronize": event.synchronize,
        "DeviceScalar.value": lambda: scalar.value,
    }[wait]
    with pytest.raises(ng.HostCallbackError, match="waited") as raised:
        call()
    assert isinstance(raised.value.__cause__, ValueError)
    assert wait.split(".")[-1] in str(raised.value)
    call()                                   # nothing kept any more
    assert ran == ["waited"]


def test_the_first_error_is_kept_and_later_ones_counted(stream):
    ran = []
    for n in (1, 2, 3):
        ng.on_host(fail, ran, f"boom {n}", stream=stream)
    with pytest.raises(ng.HostCallbackError, match="boom 1") as raised:
        stream.synchronize()
    assert "2 later callback error(s)" in str(raised.value)
    assert str(raised.value.__cause__) == "boom 1"
    assert ran == ["boom 1", "boom 2", "boom 3"]


def test_cuda_calls_inside_a_callback_are_refused(stream, other_stream, total):
    pos = ng.DeviceScalar(1, np.int32, stream=stream)
    seen = ng.HostScalar(np.int32)
    with ng.capture(stream) as cap:
        count[1, 1, stream](total)
    graph = cap.graph
    a = cuda.to_device(np.ones(4, np.float32), stream=stream)
    b = cuda.to_device(np.zeros(4, np.float32), stream=stream)
    for _ in range(3):                       # an eager op the thread remembers
        ng.add_into(a, a, b, stream=stream)
    record = ng.launch_record(count, 1, 1, stream, total)
    attempts = {
        "kernel launch": lambda: count[1, 1, stream](total),
        "launch record": record.launch,
        "ng.add_into": lambda: ng.add_into(a, a, b, stream=stream),
        "ng.copy_into": lambda: ng.copy_into(a, b, stream=stream),
        "DeviceScalar.update": lambda: pos.update(7),
        "DeviceScalar.value": lambda: pos.value,
        "read_async": lambda: pos.read_async(seen),
        "graph.launch": graph.launch,
        "graph.upload": graph.upload,
        "begin_capture": lambda: ng.begin_capture(other_stream),
        "on_host": lambda: ng.on_host(print, stream=stream),
        "DeviceScalar()": lambda: ng.DeviceScalar(1, np.int32, stream=stream),
        "HostScalar()": lambda: ng.HostScalar(np.int32),
        "to_device": lambda: cuda.to_device(np.zeros(1), stream=stream),
        "device_array": lambda: cuda.device_array(1),
        "copy_to_host": lambda: total.copy_to_host(stream=stream),
        "stream.synchronize": stream.synchronize,
        "cuda.synchronize": cuda.synchronize,
    }
    outcomes = {}

    def attempt_each():
        for name, attempt in attempts.items():
            try:
                attempt()
            except ng.CudaInHostCallbackError as exc:
                outcomes[name] = str(exc)
            else:
                outcomes[name] = None

    with ng.capture(stream) as cap:
        ng.on_host(attempt_each, stream=stream)
    cap.graph.launch()
    stream.synchronize()
    ran = {name for name, message in outcomes.items() if message is None}
    assert not ran, f"ran inside a host callback: {sorted(ran)}"
    assert set(outcomes) == set(attempts)
    assert all("attempt_each" in message and "CUDA forbids" in message
               for message in outcomes.values())
    assert not ng.is_capturing(other_stream)
    # Outside the callback the same calls run.
    pos.update(7)
    assert pos.value == 7
    assert counted(total, stream) == 0
    assert (b.copy_to_host(stream=stream) == 2).all()


def test_an_uncaught_refusal_is_the_error_kept(stream):
    pos = ng.DeviceScalar(1, np.int32, stream=stream)
    ng.on_host(pos.update, 5, stream=stream)
    with pytest.raises(ng.HostCallbackError, match="DeviceScalar.update") as raised:
        stream.synchronize()
    assert isinstance(raised.value.__cause__, ng.CudaInHostCallbackError)
    assert pos.value == 1


# ---------------------------------------------------------------- bad input

def test_bad_input_is_refused_before_anything_is_recorded(stream, total):
    calls = []
    with pytest.raises(TypeError, match="fn must be callable, not int 42"):
        ng.on_host(42, stream=stream)
    with pytest.raises(TypeError, match=r"on_host\(stream=...\).*not a CUDA stream"):
        ng.on_host(calls.append, 1, stream="s")
    with pytest.raises(TypeError, match="stream"):
        ng.on_host(calls.append, 1)
    with ng.capture(stream) as cap:
        count[1, 1, stream](total)
        with pytest.raises(TypeError, match="must be callable"):
            ng.on_host(None, stream=stream)
        with pytest.raises(TypeError, match="bare integer"):
            ng.on_host(calls.append, 1, stream=12345)
        count[1, 1, stream](total)
    assert cap.graph.num_nodes == 2
    cap.graph.launch()
    assert counted(total, stream) == 2
    assert calls == []


def test_a_conditional_body_refuses_a_callback_and_the_capture_goes_on(stream, total):
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    calls = []
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=3):
            count[1, 1, stream](total)
            with pytest.raises(ng.ConditionalError, match="conditional body on the device"):
                ng.on_host(calls.append, "body", stream=stream)
        ng.on_host(calls.append, "after", stream=stream)
    cap.graph.launch()
    stream.synchronize()
    assert calls == ["after"]
    assert counted(total, stream) == 3


def test_the_legacy_default_stream_is_refused_while_a_stream_captures(stream):
    calls = []
    with pytest.raises(ng.CaptureInvalidatedError):
        with ng.capture(stream):
            with pytest.raises(ng.ForeignStreamInCaptureError, match="on_host"):
                ng.on_host(calls.append, 1, stream=cuda.default_stream())
    cuda.synchronize()
    assert calls == []


def test_another_stream_runs_it_once_and_warns_while_this_thread_captures(
        stream, other_stream, total):
    calls = []
    with ng.capture(stream) as cap:
        count[1, 1, stream](total)
        with pytest.warns(ng.CaptureWarning, match="enqueued to run once"):
            ng.on_host(calls.append, "now", stream=other_stream)
    other_stream.synchronize()
    assert calls == ["now"]
    cap.graph.launch()
    stream.synchronize()
    assert calls == ["now"]


# ---------------------------------------------------------------- lifetime

def test_the_graph_keeps_fn_and_its_arguments_alive(stream):
    seen = []

    def make():
        def remember(box):
            seen.append(box.value)
        return remember

    fn, box = make(), Box(7)
    fn_alive, box_alive = weakref.ref(fn), weakref.ref(box)
    with ng.capture(stream) as cap:
        ng.on_host(fn, box, stream=stream)
    graph = cap.graph
    del fn, box, cap
    gc.collect()
    assert fn_alive() is not None and box_alive() is not None
    graph.launch()
    graph.launch()
    stream.synchronize()
    assert seen == [7, 7]
    graph.close()


def remember(into, box):
    into.append(box.value)


def test_a_closed_graph_lets_go_of_fn_and_its_arguments(stream):
    seen, box = [], Box(7)
    box_alive = weakref.ref(box)
    with ng.capture(stream) as cap:
        ng.on_host(remember, seen, box, stream=stream)
    graph = cap.graph
    del box, cap
    graph.launch()
    graph.close()
    stream.synchronize()
    gc.collect()
    # On the driver, once the driver has called the destructor of the user
    # object the graph owned, which it does on a thread of its own.
    wait_until(lambda: gone(box_alive), "the release of a closed graph's callback", 10)
    assert seen == [7]


def test_a_callback_run_once_lets_go_of_its_arguments(stream):
    seen, box = [], Box(3)
    box_alive = weakref.ref(box)
    ng.on_host(remember, seen, box, stream=stream)
    del box
    stream.synchronize()
    wait_until(lambda: gone(box_alive), "the release of a callback that ran", 10)
    assert seen == [3]


def test_closing_a_graph_right_after_launching_it_still_calls_back(stream):
    calls = []
    with ng.capture(stream) as cap:
        ng.on_host(calls.append, "replayed", stream=stream)
    with cap.graph as graph:
        graph.launch()
    stream.synchronize()
    assert calls == ["replayed"]


def test_an_eager_callback_outlives_the_caller_dropping_it(stream):
    seen = []
    box = Box(3)

    def remember(b):
        seen.append(b.value)

    ng.on_host(remember, box, stream=stream)
    del remember, box
    gc.collect()
    stream.synchronize()
    assert seen == [3]


def test_a_callback_reads_and_writes_a_mapped_array_as_host_memory(stream):
    mapped = cuda.mapped_array(4, np.float32)
    pos = ng.DeviceScalar(1.0, np.float32, stream=stream)
    seen = []

    def look():
        seen.append([float(mapped[i]) for i in range(4)])
        mapped[0] = -1.0

    fill_from[1, 4, stream](mapped, pos)
    with ng.capture(stream) as cap:
        fill_from[1, 4, stream](mapped, pos)
        ng.on_host(look, stream=stream)
    pos.update(10.0)
    cap.graph.launch()
    stream.synchronize()                 # raises what the callback raised
    assert seen == [[10.0, 11.0, 12.0, 13.0]]
    assert float(mapped[0]) == -1.0
