"""Several devices in one process: each graph, capture and DeviceScalar
remembers its device, and work given a stream, array or scalar of another
device is refused before anything is launched or recorded.

The simulator has one device; the tests that model a second one replace the
backend's answers about devices (which device a stream or array belongs to,
which is current, how many there are) and check numbagraph's bookkeeping
and refusals. The tests marked driver_only that need two GPUs run them on
two real devices.
"""

import gc
import threading

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active as backend
from numbagraph.ops import _launch
from conftest import device_zeros

@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@pytest.fixture
def two_devices(monkeypatch):
    """A model of two devices: device 0 current, the streams and arrays named
    in ``on_one`` on device 1, everything else on device 0. Returns the
    model, whose ``current`` and ``on_one`` a test may change."""

    class Model:
        current = 0
        on_one: list = []
        arrays = 0  # the device of the arrays not named in on_one

        def stream_device(self, stream):
            handle = backend.stream_handle(stream)
            return 1 if any(backend.stream_handle(s) == handle for s in self.on_one
                            if not _is_array(s)) else 0

        def array_device(self, dev):
            # Memory named in on_one, seen through any view of it (a foreign
            # array's included), is device 1's.
            if not getattr(dev, "__cuda_ndarray__", False):
                return None
            ptr = backend.device_pointer(dev)
            return 1 if any(_is_array(a) and backend.device_pointer(a) == ptr
                            for a in self.on_one) else self.arrays

    model = Model()
    model.on_one = []
    monkeypatch.setattr(backend, "device_count", lambda: 2)
    monkeypatch.setattr(backend, "current_device_id", lambda: model.current)
    monkeypatch.setattr(backend, "stream_device_id", model.stream_device)
    monkeypatch.setattr(backend, "array_device_id", model.array_device)
    monkeypatch.setattr(backend, "use_device", lambda ordinal: _Switch(model, ordinal))
    yield model
    _launch._stream_devices.clear()  # the devices of the modelled streams


def _is_array(obj):
    return getattr(obj, "__cuda_ndarray__", False) or hasattr(obj, "__cuda_array_interface__")


class _Switch:
    """The model's device ``ordinal`` made current for a block."""

    def __init__(self, model, ordinal):
        self.model, self.ordinal = model, ordinal

    def __enter__(self):
        self.before, self.model.current = self.model.current, self.ordinal

    def __exit__(self, *exc):
        self.model.current = self.before


@pytest.fixture
def captured(stream):
    """A graph adding one to ``x`` on ``stream``, and ``x``."""
    x = device_zeros(32, stream=stream)
    add_one[1, 32, stream](x)
    stream.synchronize()
    with ng.capture(stream) as cap:
        add_one[1, 32, stream](x)
    return cap.graph, x


# ---------------------------------------------------------------- one device

def test_a_graph_remembers_the_device_it_was_captured_on(captured):
    graph, _ = captured
    assert graph.device == backend.current_device_id()
    assert isinstance(graph.device, int)


def test_a_scalar_remembers_its_streams_device(stream):
    pos = ng.DeviceScalar(3, dtype=np.int32, stream=stream)
    assert pos.device == backend.stream_device_id(stream) == backend.current_device_id()


def test_the_backend_counts_at_least_one_device():
    assert backend.device_count() >= 1
    assert 0 <= backend.current_device_id() < backend.device_count()


def test_a_graph_launches_after_its_device_is_selected_again(captured, stream):
    graph, x = captured
    cuda.select_device(graph.device)
    graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2)


# ---------------------------------------------------------------- captures

def test_a_capture_on_a_stream_of_a_device_not_current_is_refused(two_devices, stream):
    two_devices.on_one = [stream]
    with pytest.raises(ng.DeviceMismatchError,
                       match=r"device 1, while device 0 is current.*cuda\.gpus\[1\]"):
        with ng.capture(stream):
            pass
    assert not ng.is_capturing(stream)


def test_a_capture_records_the_device_it_is_on(two_devices, stream):
    x = device_zeros(32, stream=stream)
    add_one[1, 32, stream](x)
    two_devices.on_one, two_devices.current = [stream], 1
    with ng.capture(stream) as cap:
        add_one[1, 32, stream](x)
    assert cap.graph.device == 1


# ---------------------------------------------------------------- graphs

def test_a_launch_on_a_stream_of_another_device_is_refused_before_it_runs(
        captured, two_devices, stream, other_stream):
    graph, x = captured
    two_devices.on_one = [other_stream]
    with pytest.raises(ng.DeviceMismatchError,
                       match=r"captured on device 0.*stream of device 1.*cuda\.gpus\[0\]"):
        graph.launch(other_stream)
    other_stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 1)
    graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2)


def test_an_upload_on_a_stream_of_another_device_is_refused(captured, two_devices, other_stream):
    graph, _ = captured
    two_devices.on_one = [other_stream]
    with pytest.raises(ng.DeviceMismatchError, match="graph.upload"):
        graph.upload(other_stream)


def test_a_launch_on_a_stream_of_its_own_device_runs_whatever_device_is_current(
        captured, two_devices, stream, other_stream):
    graph, x = captured
    two_devices.current = 1
    graph.launch(stream)
    graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 3)


def test_a_graph_recorded_into_a_capture_on_another_device_is_refused(
        captured, two_devices, other_stream):
    graph, _ = captured
    two_devices.on_one, two_devices.current = [other_stream], 1
    with pytest.raises(ng.DeviceMismatchError, match="captured on device 0.*records on device 1"):
        with ng.capture(other_stream):
            graph.launch(other_stream)
    assert not ng.is_capturing(other_stream)


def test_a_graph_of_another_device_as_a_conditional_body_is_refused(
        captured, two_devices, other_stream):
    graph, _ = captured
    two_devices.on_one, two_devices.current = [other_stream], 1
    with pytest.raises(ng.DeviceMismatchError, match=r"body=.*captured on device 0"):
        with ng.capture(other_stream):
            taken = ng.Condition(default=1)
            with ng.if_then(taken, body=graph):
                pass
    assert not ng.is_capturing(other_stream)


def test_an_update_from_a_graph_of_another_device_is_refused(captured, two_devices, stream,
                                                             other_stream):
    graph, x = captured
    y = device_zeros(32, stream=other_stream)
    two_devices.on_one, two_devices.current = [other_stream, y], 1
    with ng.capture(other_stream) as cap:
        add_one[1, 32, other_stream](y)
    two_devices.current = 0
    assert cap.graph.device == 1
    with pytest.raises(ng.DeviceMismatchError,
                       match=r"captured on device 0.*captured on device 1.*cuda\.gpus\[0\]"):
        graph.update(cap.graph)
    graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2)
    np.testing.assert_array_equal(y.copy_to_host(), 0)


def test_a_rebinding_to_an_array_of_another_device_is_refused(captured, two_devices, stream):
    graph, x = captured
    y = device_zeros(32, stream=stream)
    two_devices.on_one = [y]
    with pytest.raises(ng.DeviceMismatchError,
                       match=r"rebind pair 0: .* lives on device 1.*captured on device 0"):
        graph.rebind({x: y})
    graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2)
    np.testing.assert_array_equal(y.copy_to_host(), 0)


def test_a_rebinding_to_a_scalar_of_another_device_is_refused(
        two_devices, stream, other_stream, kernels):
    x = device_zeros(32, stream=stream)
    pos = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    kernels.add[1, 32, stream](x, pos)
    with ng.capture(stream) as cap:
        kernels.add[1, 32, stream](x, pos)
    two_devices.on_one = [other_stream]
    elsewhere = ng.DeviceScalar(5.0, dtype=np.float32, stream=other_stream)
    with pytest.raises(ng.DeviceMismatchError, match="DeviceScalar lives on device 1"):
        cap.graph.rebind({pos: elsewhere})
    cap.graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2.0)


def test_a_rebinding_on_one_device_asks_no_device(captured, stream, monkeypatch):
    graph, x = captured
    y = device_zeros(32, stream=stream)
    monkeypatch.setattr(backend, "array_device_id", lambda dev: 1)  # never asked
    graph.rebind({x: y})
    graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(y.copy_to_host(), 1)


@pytest.mark.parametrize("how", ["closed", "collected"])
def test_graph_memory_is_freed_on_the_graphs_device_with_another_current(
        two_devices, stream, monkeypatch, how):
    out = device_zeros(32, stream=stream)
    ng.add_into(out, 1.0, out, stream=stream)
    with ng.capture(stream) as cap:
        tmp = ng.empty(32, np.float32, stream=stream)
        ng.fill_into(tmp, 2.0, stream=stream)
        ng.add_into(out, tmp, out, stream=stream)
    graph = cap.graph
    graph.launch()
    stream.synchronize()
    freed = []
    release = backend.release_graph_memory

    def recorded(allocations, handle, device):
        freed.append((len(allocations), device, two_devices.current))
        release(allocations, handle, device)

    monkeypatch.setattr(backend, "release_graph_memory", recorded)
    two_devices.current = 1
    del tmp
    if how == "closed":
        graph.close()
    else:
        del cap, graph
        gc.collect()
    assert freed == [(1, 0, 1)]  # one allocation, device 0's, with device 1 current


def test_graph_memory_is_freed_when_destroying_the_executable_fails(stream, monkeypatch):
    with ng.capture(stream) as cap:
        tmp = ng.empty(32, np.float32, stream=stream)
        ng.fill_into(tmp, 2.0, stream=stream)
    graph = cap.graph
    graph.launch()
    stream.synchronize()
    executable = graph._res.executable
    close = executable.close

    def failed():
        close()
        raise RuntimeError("the driver refused")

    monkeypatch.setattr(executable, "close", failed)
    freed = []
    release = backend.release_graph_memory
    monkeypatch.setattr(backend, "release_graph_memory",
                        lambda owned, *rest: freed.append(len(owned)) or release(owned, *rest))
    del tmp
    graph.close()
    stream.synchronize()
    assert freed == [1]


# ---------------------------------------------------------------- forks

def test_a_fork_of_a_stream_of_another_device_is_refused(two_devices, stream, other_stream):
    x = device_zeros(32, stream=stream)
    add_one[1, 32, stream](x)
    two_devices.on_one = [other_stream]
    with ng.capture(stream) as cap:
        with pytest.raises(ng.DeviceMismatchError,
                           match=r"device 1.*records on device 0.*cuda\.gpus\[0\]"):
            with ng.fork(other_stream):
                pass
        assert not ng.is_capturing(other_stream)
        add_one[1, 32, stream](x)  # the capture goes on
    cap.graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2)


def test_a_fork_of_a_stream_of_the_captures_device_runs(two_devices, stream, other_stream):
    x = device_zeros(32, stream=stream)
    add_one[1, 32, stream](x)
    two_devices.on_one, two_devices.current = [stream, other_stream], 1
    with ng.capture(stream) as cap:
        with ng.fork(other_stream):
            add_one[1, 32, other_stream](x)
    cap.graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), 2)


# ---------------------------------------------------------------- scalars

def test_a_scalar_of_another_device_given_to_a_capture_is_refused(
        two_devices, stream, other_stream, kernels):
    x = device_zeros(32, stream=stream)
    two_devices.on_one = [other_stream]
    pos = ng.DeviceScalar(1.0, dtype=np.float32, stream=other_stream)
    assert pos.device == 1
    kernels.add[1, 32, stream](x, ng.DeviceScalar(1.0, dtype=np.float32, stream=stream))
    stream.synchronize()
    with pytest.raises(ng.DeviceMismatchError,
                       match=r"lives on device 1.*records on device 0.*cuda\.gpus\[0\]"):
        with ng.capture(stream):
            kernels.add[1, 32, stream](x, pos)
    assert not ng.is_capturing(stream)


def test_a_scalar_of_another_device_read_into_a_capture_is_refused(
        two_devices, stream, other_stream):
    two_devices.on_one = [other_stream]
    pos = ng.DeviceScalar(1, dtype=np.int32, stream=other_stream)
    seen = ng.HostScalar(np.int32)
    with pytest.raises(ng.DeviceMismatchError, match="read_async"):
        with ng.capture(stream):
            pos.read_async(seen, stream=stream)


def test_a_scalar_is_made_updated_and_read_on_its_own_device(
        two_devices, other_stream, monkeypatch):
    two_devices.on_one = [other_stream]
    made_on = []
    real_to_device = cuda.to_device

    def to_device(*args, **kwargs):
        made_on.append(two_devices.current)
        return real_to_device(*args, **kwargs)

    monkeypatch.setattr(cuda, "to_device", to_device)
    pos = ng.DeviceScalar(5, dtype=np.int32, stream=other_stream)
    monkeypatch.setattr(cuda, "to_device", real_to_device)
    assert made_on == [1] and two_devices.current == 0
    pos.update(7)
    assert pos.value == 7
    assert two_devices.current == 0


# ---------------------------------------------------------------- ops

def test_an_op_given_arrays_of_another_device_than_its_stream_is_refused(
        two_devices, stream, other_stream):
    a = device_zeros(16, stream=stream)
    out = device_zeros(16, stream=stream)
    ng.add_into(a, 1.0, out, stream=stream)
    stream.synchronize()
    two_devices.on_one = [other_stream]
    with pytest.raises(ng.DeviceMismatchError, match=r"device 0.*stream of device 1"):
        ng.add_into(a, 2.0, out, stream=other_stream)
    other_stream.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), 1.0)


def test_an_op_on_arrays_and_a_stream_of_one_device_runs(two_devices, stream):
    a = device_zeros(16, stream=stream)
    out = device_zeros(16, stream=stream)
    two_devices.on_one, two_devices.arrays, two_devices.current = [stream], 1, 1
    for _ in range(3):  # checked, then remembered
        ng.add_into(a, 2.0, out, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), 2.0)


def test_ops_on_a_default_stream_check_the_device_current_on_their_own_thread(
        two_devices, monkeypatch):
    # A default stream's handle names the stream of the device current on
    # the calling thread: each thread's call is checked against its own.
    current = threading.local()
    monkeypatch.setattr(backend, "current_device_id", lambda: getattr(current, "device", 0))
    # Each thread's arrays live on its own device.
    monkeypatch.setattr(backend, "array_device_id", lambda dev: backend.current_device_id())
    default = cuda.default_stream()
    a, out = device_zeros(16), device_zeros(16)
    other_a, other_out = device_zeros(16), device_zeros(16)
    errors = []

    def other_thread():
        current.device = 1
        try:
            ng.add_into(other_a, 1.0, other_out, stream=default)
        except Exception as exc:  # noqa: BLE001  reported by the main thread
            errors.append(exc)

    limits = backend.launch_limits

    def launch_limits():
        if threading.current_thread() is threading.main_thread():
            # The other thread's call runs between this call's look at its
            # stream and its launch.
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
        return limits()

    monkeypatch.setattr(backend, "stream_device_id", lambda stream: backend.current_device_id())
    monkeypatch.setattr(backend, "launch_limits", launch_limits)
    ng.add_into(a, 2.0, out, stream=default)
    default.synchronize()
    assert errors == []
    np.testing.assert_array_equal(out.copy_to_host(), 2.0)
    np.testing.assert_array_equal(other_out.copy_to_host(), 1.0)


class _Foreign:
    """Another library's array: only ``__cuda_array_interface__``, over the
    memory of a numba array."""

    def __init__(self, dev):
        self.__cuda_array_interface__ = dict(backend.array_interface(dev), stream=None)


@pytest.fixture
def launches(monkeypatch):
    """The kernel launches ops make, counted."""
    made = []
    launch = backend.launch

    def counted(*args, **kwargs):
        made.append(args[0])
        return launch(*args, **kwargs)

    monkeypatch.setattr(backend, "launch", counted)
    return made


def test_a_foreign_array_of_another_device_given_to_an_op_is_refused(
        two_devices, stream, launches):
    a = device_zeros(16, stream=stream)
    memory = device_zeros(16, stream=stream)
    out = device_zeros(16, stream=stream)
    stream.synchronize()
    two_devices.on_one = [memory]  # the other library's memory is on device 1
    with pytest.raises(ng.DeviceMismatchError,
                       match=r"ng\.add_into\(\): b lives on device 1.*a stream of device 0"):
        ng.add_into(a, _Foreign(memory), out, stream=stream)
    assert launches == []
    ng.add_into(a, _Foreign(out), out, stream=stream)  # device 0's memory runs
    stream.synchronize()


def test_a_foreign_array_of_another_device_is_refused_inside_a_capture(
        two_devices, stream, launches):
    a = device_zeros(16, stream=stream)
    memory = device_zeros(16, stream=stream)
    ng.add_into(a, 1.0, a, stream=stream)
    stream.synchronize()
    two_devices.on_one = [memory]
    launches.clear()
    with pytest.raises(ng.DeviceMismatchError, match="out lives on device 1"):
        with ng.capture(stream):
            ng.add_into(a, 1.0, _Foreign(memory), stream=stream)
    assert launches == [] and not ng.is_capturing(stream)


def test_an_op_of_several_kernels_is_refused_before_its_first(two_devices, stream, launches):
    x = cuda.to_device(np.arange(4096, dtype=np.float32), stream=stream)
    out = device_zeros(1, stream=stream)
    ng.sum_into(x, out, stream=stream)
    stream.synchronize()
    two_devices.on_one = [out]
    launches.clear()
    with pytest.raises(ng.DeviceMismatchError, match=r"ng\.sum_into\(\): out lives on device 1"):
        ng.sum_into(x, out, stream=stream)
    assert launches == []


def test_a_device_copy_to_another_device_is_refused(two_devices, stream):
    # copy_into copies whole arrays with the driver's copy, not a kernel.
    x = cuda.to_device(np.full(16, 3.0, np.float32), stream=stream)
    out = device_zeros(16, stream=stream)
    two_devices.on_one = [out]
    with pytest.raises(ng.DeviceMismatchError, match="out lives on device 1"):
        ng.copy_into(x, out, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), 0.0)


def test_a_matrix_product_with_an_operand_of_another_device_is_refused(
        two_devices, stream, launches):
    a = cuda.to_device(np.ones((4, 4), np.float32), stream=stream)
    b = cuda.to_device(np.ones((4, 4), np.float32), stream=stream)
    out = device_zeros((4, 4), stream=stream)
    two_devices.on_one = [b]
    with pytest.raises(ng.DeviceMismatchError,
                       match=r"ng\.matmul_into\(\): b lives on device 1.*cuda\.gpus\[1\]"):
        ng.matmul_into(a, b, out, stream=stream)
    assert launches == []


def test_a_remembered_op_call_asks_no_device_again(two_devices, stream, monkeypatch):
    a = device_zeros(16, stream=stream)
    out = device_zeros(16, stream=stream)
    for _ in range(2):  # checked, then remembered
        ng.add_into(a, 1.0, out, stream=stream)
    asked = []
    monkeypatch.setattr(backend, "array_device_id", lambda dev: asked.append(dev) or 0)
    ng.add_into(a, 1.0, out, stream=stream)
    stream.synchronize()
    assert asked == []
    np.testing.assert_array_equal(out.copy_to_host(), 1.0)


def test_with_one_device_an_op_asks_no_device(stream, monkeypatch):
    def refused(*args):
        raise AssertionError("asked with one device")

    monkeypatch.setattr(backend, "device_count", lambda: 1)
    for name in ("stream_device_id", "array_device_id", "current_device_id",
                 "pointer_device_id"):
        monkeypatch.setattr(backend, name, refused)
    a = device_zeros(16, stream=stream)
    out = device_zeros(16, stream=stream)
    ng.add_into(_Foreign(a), 2.0, out, stream=stream)
    ng.copy_into(a, out, stream=stream)
    stream.synchronize()


# ---------------------------------------------------------------- two GPUs

@pytest.mark.driver_only(reason="two real devices")
@pytest.mark.skipif(len(cuda.gpus) < 2, reason="needs two GPUs")
def test_a_graph_of_device_one_runs_with_device_zero_current():
    with cuda.gpus[1]:
        s1 = cuda.stream()
        x = cuda.to_device(np.zeros(32, np.int32), stream=s1)
        add_one[1, 32, s1](x)
        pos = ng.DeviceScalar(0, dtype=np.int32, stream=s1)
        with ng.capture(s1) as cap:
            add_one[1, 32, s1](x)
        s1.synchronize()
    graph = cap.graph
    assert graph.device == 1 and pos.device == 1
    cuda.select_device(0)
    graph.launch()
    graph.launch(s1)
    pos.update(9)
    assert pos.value == 9
    s1.synchronize()
    with cuda.gpus[1]:
        np.testing.assert_array_equal(x.copy_to_host(), 3)


@pytest.mark.driver_only(reason="two real devices")
@pytest.mark.skipif(len(cuda.gpus) < 2, reason="needs two GPUs")
def test_two_real_devices_refuse_what_crosses_them():
    with cuda.gpus[1]:
        s1 = cuda.stream()
        x1 = cuda.to_device(np.zeros(32, np.float32), stream=s1)
        pos1 = ng.DeviceScalar(1.0, dtype=np.float32, stream=s1)
        add_one[1, 32, s1](x1)
        with ng.capture(s1) as cap:
            add_one[1, 32, s1](x1)
        s1.synchronize()
    with cuda.gpus[0]:
        s0 = cuda.stream()
        x0 = cuda.to_device(np.zeros(32, np.float32), stream=s0)
        with pytest.raises(ng.DeviceMismatchError, match="device 1"):
            cap.graph.launch(s0)
        with pytest.raises(ng.DeviceMismatchError, match="device 1, while device 0"):
            with ng.capture(s1):
                pass
        with pytest.raises(ng.DeviceMismatchError, match="a lives on device 1"):
            ng.add_into(x1, 1.0, x0, stream=s0)
        # Another library's array is known by where its memory is.
        with pytest.raises(ng.DeviceMismatchError, match="b lives on device 1"):
            ng.add_into(x0, _Foreign(x1), x0, stream=s0)
        with pytest.raises(ng.DeviceMismatchError, match="lives on device 1"):
            with ng.capture(s0):
                ng.add_into(x0, pos1, x0, stream=s0)
        with pytest.raises(ng.DeviceMismatchError, match="belongs to device 1"):
            with ng.capture(s0):
                with ng.fork(s1):
                    pass
        with pytest.raises(ng.DeviceMismatchError, match="rebind pair 0"):
            cap.graph.rebind({x1: x0})
        add_one[1, 32, s0](x0)
        with ng.capture(s0) as cap0:
            add_one[1, 32, s0](x0)
        with pytest.raises(ng.DeviceMismatchError, match="captured on device 1"):
            cap.graph.update(cap0.graph)
        s0.synchronize()


def _captured_alongside_another_on_device_one():
    """A graph of device 1, captured while another capture of device 1 was
    active, so not instantiated yet, and the array it adds one to."""
    with cuda.gpus[1]:
        s1, other = cuda.stream(), cuda.stream()
        x = cuda.to_device(np.zeros(32, np.int32), stream=s1)
        add_one[1, 32, s1](x)
        ng.begin_capture(other)
        try:
            with ng.capture(s1) as cap:
                add_one[1, 32, s1](x)
        finally:
            ng.abort_capture(other)
        s1.synchronize()
    return cap.graph, x, s1


@pytest.mark.driver_only(reason="two real devices")
@pytest.mark.skipif(len(cuda.gpus) < 2, reason="needs two GPUs")
@pytest.mark.parametrize("first", ["upload", "launch"])
def test_a_graph_of_device_one_is_instantiated_with_device_zero_current(first):
    graph, x, s1 = _captured_alongside_another_on_device_one()
    cuda.select_device(0)
    if first == "upload":
        graph.upload()
    graph.launch()
    graph.upload(s1)
    graph.launch(s1)
    s1.synchronize()
    with cuda.gpus[1]:
        np.testing.assert_array_equal(x.copy_to_host(), 3)


@pytest.mark.driver_only(reason="two real devices")
@pytest.mark.skipif(len(cuda.gpus) < 2, reason="needs two GPUs")
def test_graph_memory_of_device_one_is_freed_inside_a_numba_call_on_device_zero(monkeypatch):
    from cuda.bindings import driver as cu
    from numba.cuda.cudadrv import devices

    with cuda.gpus[1]:
        s1 = cuda.stream()
        out = cuda.to_device(np.zeros(32, np.float32), stream=s1)
        ng.add_into(out, 1.0, out, stream=s1)
        with ng.capture(s1) as cap:
            tmp = ng.empty(32, np.float32, stream=s1)
            ng.fill_into(tmp, 2.0, stream=s1)
            ng.add_into(out, tmp, out, stream=s1)
        cap.graph.launch()
        s1.synchronize()
    graph = cap.graph
    del cap, tmp
    freed = []
    free = cu.cuMemFreeAsync
    monkeypatch.setattr(cu, "cuMemFreeAsync", lambda *args: freed.append(free(*args)) or freed[-1])
    cuda.select_device(0)
    # A graph dropped while numba holds device 0's context for one of its
    # calls: numba refuses to switch contexts there.
    with devices._runtime.ensure_context():
        graph.close()
    assert [result[0] for result in freed] == [cu.CUresult.CUDA_SUCCESS]
    with cuda.gpus[1]:
        s1.synchronize()
        np.testing.assert_array_equal(out.copy_to_host(), 3.0)
