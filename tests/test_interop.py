"""Arrays and streams of other libraries inside captures, and numbagraph's
work inside other libraries' captures (docs/interop.md).

The first part runs on both backends with a stand-in for another library's
array: an object with only ``__cuda_array_interface__`` (version 3, naming a
stream) over a numba device array's memory, and, for a capture begun outside
numbagraph, the backend's own recording begun directly. The rest runs each
pattern of the page with PyTorch, CuPy and cuda.core, on the driver only,
where they are installed.
"""

import gc
import warnings
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph import safety
from numbagraph.backend import active
from conftest import host

N = 32


class Foreign:
    """Another library's device array: only ``__cuda_array_interface__``,
    naming ``stream`` (a raw handle, or None), over ``dev``'s memory."""

    def __init__(self, dev, stream=None):
        self.dev = dev
        self.__cuda_array_interface__ = dict(active.array_interface(dev), stream=stream)


@cuda.jit
def accumulate(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] += src[i]


@cuda.jit
def fill(dst, value):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = value


@cuda.jit
def accumulate_pair(pair, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] += pair[0][i] + pair[1][i]


def handle(stream):
    return active.stream_handle(stream)


def warm(stream):
    """Compile the kernels and the op the tests launch inside captures, for
    float32 arrays (numba's, and the views foreign arrays become)."""
    scratch = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    accumulate[1, N, stream](scratch, scratch)
    fill[1, N, stream](scratch, np.float32(0))
    ng.add_into(scratch, scratch, scratch, stream=stream)
    stream.synchronize()


@pytest.fixture
def arrays(stream):
    """``(x, y)``: x = 0, 1, ..., y = 10 everywhere; the kernels compiled."""
    x = cuda.to_device(np.arange(N, dtype=np.float32), stream=stream)
    y = cuda.to_device(np.full(N, 10, np.float32), stream=stream)
    warm(stream)
    return x, y


@pytest.fixture
def strict():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ng.CaptureWarning)
        yield


# ---------------------------------------------------------------- in a numbagraph capture

def test_a_kernel_reads_and_writes_foreign_arrays_inside_a_capture(stream, arrays, strict):
    x, y = arrays
    with ng.capture(stream) as cap:
        accumulate[1, N, stream](Foreign(x, handle(stream)), Foreign(y, handle(stream)))
    np.testing.assert_array_equal(host(y, stream), 10)      # recorded, not run
    cap.graph.launch()
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 10 + 2 * np.arange(N))


def test_an_op_on_foreign_arrays_inside_a_capture(stream, arrays, strict):
    x, y = arrays
    ng.add_into(x, x, y, stream=stream)                      # compiled outside
    ng.fill_into(y, 10.0, stream=stream)
    with ng.capture(stream) as cap:
        ng.add_into(Foreign(x, handle(stream)), Foreign(y, handle(stream)),
                    Foreign(y, handle(stream)), stream=stream)
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 10 + np.arange(N))


def test_a_replay_reads_the_foreign_memory_as_it_is_then(stream, arrays, strict):
    x, y = arrays
    with ng.capture(stream) as cap:
        accumulate[1, N, stream](Foreign(x), y)
    x.copy_to_device(np.ones(N, np.float32), stream=stream)
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 11)


def test_a_foreign_array_naming_the_legacy_stream_leaves_a_blocking_capture_whole(
        stream, arrays, strict):
    # Numba would synchronise the legacy default stream (and record an event
    # there), which breaks a capture on a blocking stream.
    x, y = arrays
    assert active.joins_legacy_stream(handle(stream))
    with ng.capture(stream) as cap:
        accumulate[1, N, stream](Foreign(x, 1), y)
        ng.add_into(Foreign(x, 1), y, y, stream=stream)
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 10 + 2 * np.arange(N))


def test_a_foreign_array_in_a_tuple_is_read_as_a_view(stream, arrays, strict):
    x, y = arrays
    accumulate_pair[1, N, stream]((x, x), y)                # compiled outside
    y.copy_to_device(np.full(N, 10, np.float32), stream=stream)
    with ng.capture(stream) as cap:
        accumulate_pair[1, N, stream]((Foreign(x, 1), x), y)
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 10 + 2 * np.arange(N))


def test_a_foreign_array_naming_a_stream_forked_into_the_capture_joins_it(
        stream, other_stream, arrays, strict):
    x, y = arrays
    with ng.capture(stream) as cap:
        forked = cuda.event()
        forked.record(stream)
        forked.wait(other_stream)                            # other_stream forked in
        fill[1, N, other_stream](x, np.float32(3))
        accumulate[1, N, stream](Foreign(x, handle(other_stream)), y)
        assert ng.is_capturing(other_stream)
    # Ending the capture checked that other_stream was joined back: the
    # launch on stream waited on it.
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 13)


def test_an_op_joins_the_forked_stream_its_foreign_operand_names(
        stream, other_stream, arrays, strict):
    x, y = arrays
    ng.add_into(x, y, y, stream=stream)
    y.copy_to_device(np.full(N, 10, np.float32), stream=stream)
    with ng.capture(stream) as cap:
        forked = cuda.event()
        forked.record(stream)
        forked.wait(other_stream)
        fill[1, N, other_stream](x, np.float32(3))
        ng.add_into(Foreign(x, handle(other_stream)), y, y, stream=stream)
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 13)


def test_without_a_stream_named_the_forked_stream_is_left_unjoined(
        stream, other_stream, arrays):
    x, y = arrays
    with pytest.raises(ng.ForeignStreamInCaptureError, match="not joined back"):
        with ng.capture(stream):
            forked = cuda.event()
            forked.record(stream)
            forked.wait(other_stream)
            fill[1, N, other_stream](x, np.float32(3))
            accumulate[1, N, stream](Foreign(x), y)
    assert not ng.is_capturing(stream) and not ng.is_capturing(other_stream)


@pytest.mark.parametrize("via", ["kernel", "op"])
def test_a_foreign_array_naming_a_stream_of_another_capture_is_refused(
        stream, other_stream, arrays, via):
    x, y = arrays
    ng.add_into(x, y, y, stream=stream)
    with ng.capture(other_stream) as other:
        fill[1, N, other_stream](x, np.float32(1))
        ng.begin_capture(stream)
        foreign = Foreign(x, handle(other_stream))
        with pytest.raises(ng.ForeignStreamInCaptureError) as refused:
            if via == "kernel":
                accumulate[1, N, stream](foreign, y)
            else:
                ng.add_into(foreign, y, y, stream=stream)
        assert "CUDA_ERROR_STREAM_CAPTURE_MERGE" in str(refused.value)
        assert "ng.fork" in str(refused.value)
        assert not ng.is_capturing(stream)       # its capture was ended
        assert ng.is_capturing(other_stream)     # the other goes on
    other.graph.launch()                         # on other_stream, where x is read
    np.testing.assert_array_equal(host(x, other_stream), 1)
    with ng.capture(stream) as again:            # the stream is usable
        accumulate[1, N, stream](x, y)
    again.graph.launch()


def test_a_foreign_array_naming_a_stream_outside_the_capture_warns(
        stream, other_stream, arrays):
    x, y = arrays
    with pytest.warns(ng.CaptureWarning, match="outside the capture"):
        with ng.capture(stream) as cap:
            accumulate[1, N, stream](Foreign(x, handle(other_stream)), y)
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 10 + np.arange(N))


def test_the_graph_keeps_the_foreign_array_alive(stream, arrays):
    x, y = arrays
    foreign = Foreign(x)
    kept = weakref.ref(foreign)
    with ng.capture(stream) as cap:
        accumulate[1, N, stream](foreign, y)
    del foreign
    gc.collect()
    assert kept() is not None
    cap.graph.close()
    del cap
    gc.collect()
    assert kept() is None


def test_outside_captures_a_launch_with_a_foreign_array_is_left_to_numba(stream, arrays):
    x, y = arrays
    args = (Foreign(x, 1), y)
    assert safety.on_launch(handle(stream), accumulate, args) is args


class _HostTensor:
    """A tensor in host memory, as PyTorch's CPU tensors are: the type has
    ``__cuda_array_interface__``, which raises AttributeError, and DLPack
    says the memory is the host's."""

    @property
    def __cuda_array_interface__(self):
        raise AttributeError("a host tensor has no __cuda_array_interface__")

    def __dlpack_device__(self):
        return (1, 0)


def test_a_host_tensor_is_refused_as_a_host_array(stream, arrays):
    x, y = arrays
    with pytest.raises(ng.HostArrayInCaptureError):
        with ng.capture(stream):
            accumulate[1, N, stream](_HostTensor(), y)
    assert not ng.is_capturing(stream)


# ---------------------------------------------------------------- work beside a capture

def test_an_eager_launch_ordered_after_the_legacy_stream_is_refused_during_a_blocking_capture(
        stream, other_stream, arrays):
    # Numba would record an event on (and synchronise) the legacy default
    # stream, which joins the blocking stream's capture implicitly.
    x, y = arrays
    ng.begin_capture(stream)
    accumulate[1, N, stream](x, y)
    with pytest.raises(ng.ForeignStreamInCaptureError, match="CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"):
        accumulate[1, N, other_stream](Foreign(x, 1), y)
    assert not ng.is_capturing(stream)


def test_an_eager_launch_ordered_after_a_capturing_stream_is_refused(
        stream, other_stream, arrays):
    x, y = arrays
    ng.begin_capture(stream)
    with pytest.raises(ng.ForeignStreamInCaptureError, match="fork the launch stream"):
        accumulate[1, N, other_stream](Foreign(x, handle(stream)), y)
    assert not ng.is_capturing(other_stream)
    assert not ng.is_capturing(stream)          # refused, as every uncapturable call


# ---------------------------------------------------------------- another library's capture

@pytest.fixture
def foreign_capture(stream, arrays):
    """A capture on ``stream`` begun outside numbagraph (the backend's own
    recording, as another library begins one), once the arrays are made and
    the kernels compiled (which synchronises the stream); yields a function
    that ends it and returns its graph's launcher."""
    recording = active.Recording(handle(stream), "relaxed")
    done = []

    def end():
        executable = recording.finish()
        recording.release_frees()
        done.append(executable)
        return executable.launcher(handle(stream))

    yield end
    if not done:
        recording.abort()
        recording.release_frees()
    for executable in done:
        executable.close()


def test_ng_capture_on_a_stream_another_library_captures_says_to_launch_directly(
        stream, foreign_capture, arrays):
    x, y = arrays
    with pytest.raises(ng.CaptureStateError, match="without ng.capture"):
        ng.begin_capture(stream)
    assert ng.is_capturing(stream)                       # the other capture goes on
    accumulate[1, N, stream](x, y)                       # recorded into it
    launch = foreign_capture()
    np.testing.assert_array_equal(host(y, stream), 10)
    launch()
    np.testing.assert_array_equal(host(y, stream), 10 + np.arange(N))


def test_kernels_and_ops_on_foreign_arrays_record_into_another_librarys_capture(
        stream, arrays, strict):
    x, y = arrays
    ng.add_into(x, y, y, stream=stream)                 # compiled outside
    y.copy_to_device(np.full(N, 10, np.float32), stream=stream)
    # Numba would synchronise the stream its arrays name, the capturing one
    # and the legacy one, and break the other library's capture.
    recording = active.Recording(handle(stream), "relaxed")
    try:
        accumulate[1, N, stream](Foreign(x, handle(stream)), Foreign(y, 1))
        ng.add_into(Foreign(x, handle(stream)), y, y, stream=stream)
        executable = recording.finish()
    except BaseException:
        recording.abort()
        raise
    finally:
        recording.release_frees()
    try:
        np.testing.assert_array_equal(host(y, stream), 10)
        executable.launcher(handle(stream))()
        np.testing.assert_array_equal(host(y, stream), 10 + 2 * np.arange(N))
    finally:
        executable.close()


def test_in_another_librarys_capture_an_array_of_a_numbagraph_capture_is_refused(
        stream, other_stream, foreign_capture, arrays):
    x, y = arrays
    with ng.capture(other_stream) as mine:
        fill[1, N, other_stream](x, np.float32(2))
        with pytest.raises(ng.ForeignStreamInCaptureError, match="the capture goes on"):
            accumulate[1, N, stream](Foreign(x, handle(other_stream)), y)
        assert ng.is_capturing(stream) and ng.is_capturing(other_stream)
    accumulate[1, N, stream](x, y)
    foreign_capture()()
    mine.graph.launch()
    np.testing.assert_array_equal(host(x, stream), 2)


# ---------------------------------------------------------------- streams of other libraries

class _TorchStyleStream:
    """A stream as a PyTorch without ``__cuda_stream__`` gives it."""

    def __init__(self, stream):
        self.cuda_stream = handle(stream)


_TorchStyleStream.__module__ = "torch.cuda.streams"


class _CupyStyleStream:
    """A stream as a CuPy without ``__cuda_stream__`` gives it."""

    def __init__(self, stream):
        self.ptr = handle(stream)


_CupyStyleStream.__module__ = "cupy.cuda.stream"


@pytest.mark.parametrize("kind", [_TorchStyleStream, _CupyStyleStream])
def test_streams_of_other_libraries_capture_by_their_handle(stream, arrays, kind):
    x, y = arrays
    theirs = kind(stream)
    assert active.stream_handle(theirs) == handle(stream)
    with ng.capture(theirs) as cap:
        assert ng.is_capturing(stream)
        accumulate[1, N, stream](x, y)                  # numba takes numba's stream
        ng.add_into(x, y, y, stream=theirs)             # ops take theirs
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, stream), 10 + 2 * np.arange(N))


def test_a_memory_pointer_with_ptr_is_not_taken_for_a_stream():
    class MemoryPointer:
        ptr = 0x1000

    with pytest.raises(TypeError, match="not a CUDA stream"):
        active.stream_handle(MemoryPointer())


# ---------------------------------------------------------------- errors other libraries raise

@pytest.mark.parametrize("raised, expected", [
    (RuntimeError("CUDA error: operation would make the legacy stream depend on a "
                  "capturing blocking stream"), ng.ForeignStreamInCaptureError),
    (RuntimeError("cudaErrorStreamCaptureImplicit: operation would make the legacy "
                  "stream depend on a capturing blocking stream"), ng.ForeignStreamInCaptureError),
    (RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when "
                  "stream is capturing"), ng.UncapturableOperationError),
    (RuntimeError("CUDA error: dependency created on uncaptured work in another stream"),
     ng.ForeignStreamInCaptureError),
])
def test_capture_errors_other_libraries_raise_are_translated(stream, raised, expected):
    with pytest.raises(expected) as translated:
        with ng.capture(stream):
            raise raised
    assert translated.value.__cause__ is raised
    assert not ng.is_capturing(stream)


def test_the_implicit_join_says_how_to_move_other_libraries_off_the_legacy_stream(stream):
    class CupyError(RuntimeError):
        status = 906

    with pytest.raises(ng.ForeignStreamInCaptureError) as translated:
        with ng.capture(stream):
            raise CupyError("a CUDA runtime error")
    text = str(translated.value)
    assert "torch.cuda.ExternalStream" in text and "cupy.cuda.ExternalStream" in text
    assert "non-blocking" in text


# ---------------------------------------------------------------- a non-blocking capture stream

@pytest.fixture
def nonblocking():
    """A non-blocking stream (numba's cuda.stream() makes blocking ones)."""
    from cuda.bindings import driver as cu

    err, raw = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
    assert err == cu.CUresult.CUDA_SUCCESS
    yield cuda.external_stream(int(raw))
    cu.cuStreamSynchronize(raw)
    cu.cuStreamDestroy(raw)


@pytest.mark.driver_only(reason="simulated streams are all blocking")
def test_a_foreign_array_of_the_legacy_stream_warns_on_a_nonblocking_capture(nonblocking, arrays):
    x, y = arrays
    s = nonblocking
    assert not active.joins_legacy_stream(handle(s))
    with pytest.warns(ng.CaptureWarning, match="non-blocking"):
        with ng.capture(s) as cap:
            accumulate[1, N, s](Foreign(x, 1), y)
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, s), 10 + np.arange(N))


# ---------------------------------------------------------------- PyTorch

@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if ng.backend() != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs the CUDA driver and a CUDA build of PyTorch")
    return torch


def _tensors(torch):
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    y = torch.full((N,), 10.0, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    return x, y


@pytest.mark.driver_only(reason="PyTorch needs a GPU")
def test_torch_tensors_passed_to_a_kernel_in_a_numbagraph_capture(torch, stream, strict):
    x, y = _tensors(torch)
    warm(stream)
    accumulate[1, N, stream](x, y)                      # compiled outside, y = 10 + x
    stream.synchronize()
    with ng.capture(stream) as cap:
        accumulate[1, N, stream](x, y)
        ng.add_into(x, y, y, stream=stream)
    cap.graph.launch()
    stream.synchronize()
    assert torch.equal(y, 10 + 3 * x)


@pytest.mark.driver_only(reason="PyTorch needs a GPU")
def test_torch_ops_inside_a_numbagraph_capture(torch, stream):
    x, y = _tensors(torch)
    warm(stream)
    with torch.cuda.stream(torch.cuda.ExternalStream(int(stream.handle))):
        y.add_(x)                                        # load every kernel first
        y.mul_(2)
    accumulate[1, N, stream](x, y)
    stream.synchronize()
    y.fill_(10.0)
    torch.cuda.synchronize()
    with ng.capture(stream) as cap:
        with torch.cuda.stream(torch.cuda.ExternalStream(int(stream.handle))):
            y.add_(x)                                    # in place: nothing allocated
            y.mul_(2)
        accumulate[1, N, stream](x, y)                   # after the torch ops
    assert torch.equal(y.cpu(), torch.full((N,), 10.0))  # recorded, not run
    cap.graph.launch()
    stream.synchronize()
    assert torch.equal(y, 2 * (10 + x) + x)


@pytest.mark.driver_only(reason="PyTorch needs a GPU")
def test_numbagraph_work_inside_a_torch_cuda_graph(torch, stream):
    x, y = _tensors(torch)
    accumulate[1, N, stream](x, y)                      # load every kernel first
    ng.add_into(x, y, y, stream=stream)
    stream.synchronize()
    y.mul_(2)
    y.fill_(10.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        theirs = torch.cuda.current_stream()
        s = cuda.external_stream(theirs.cuda_stream)
        with pytest.raises(ng.CaptureStateError, match="without ng.capture"):
            ng.begin_capture(s)
        accumulate[1, N, s](x, y)
        ng.add_into(x, y, y, stream=theirs)
        y.mul_(2)
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 10.0))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, 2 * (10 + 2 * x))


@pytest.mark.driver_only(reason="PyTorch needs a GPU")
def test_ng_capture_on_a_torch_stream(torch, strict):
    x, y = _tensors(torch)
    theirs = torch.cuda.Stream()
    s = cuda.external_stream(theirs.cuda_stream)
    warm(s)
    y.add_(1)                                            # load every kernel first
    y.fill_(10.0)
    accumulate[1, N, s](x, y)
    s.synchronize()
    with ng.capture(theirs) as cap:
        with torch.cuda.stream(theirs):                  # tensors ordered on it: no warning
            accumulate[1, N, s](x, y)
            y.add_(1)
    cap.graph.launch()
    theirs.synchronize()
    assert torch.equal(y, 10 + 2 * x + 1)


@pytest.mark.driver_only(reason="PyTorch needs a GPU")
def test_torch_tensors_of_the_default_stream_warn_on_a_torch_capture_stream(torch):
    x, y = _tensors(torch)
    theirs = torch.cuda.Stream()
    s = cuda.external_stream(theirs.cuda_stream)
    warm(s)
    accumulate[1, N, s](x, y)
    s.synchronize()
    with pytest.warns(ng.CaptureWarning, match="PyTorch's current stream"):
        with ng.capture(theirs) as cap:
            accumulate[1, N, s](x, y)
    torch.cuda.synchronize()
    cap.graph.launch()
    theirs.synchronize()
    assert torch.equal(y, 10 + 2 * x)


@pytest.mark.driver_only(reason="PyTorch needs a GPU")
def test_a_kernel_on_torch_tensors_beside_a_blocking_capture_is_refused(torch, stream,
                                                                       other_stream):
    x, y = _tensors(torch)
    accumulate[1, N, other_stream](x, y)
    other_stream.synchronize()
    ng.begin_capture(stream)
    with pytest.raises(ng.ForeignStreamInCaptureError, match="legacy default stream"):
        accumulate[1, N, other_stream](x, y)
    assert not ng.is_capturing(stream)


@pytest.mark.driver_only(reason="PyTorch needs a GPU")
def test_torch_work_on_its_default_stream_in_a_blocking_capture_is_translated(torch, stream):
    x, y = _tensors(torch)
    warm(stream)
    y.add_(x)                                            # load PyTorch's kernel first
    torch.cuda.synchronize()
    with pytest.raises(ng.ForeignStreamInCaptureError, match="torch.cuda.ExternalStream"):
        with ng.capture(stream):
            y.add_(x)                                    # on the legacy default stream
    torch.cuda.synchronize()
    with ng.capture(stream):                             # the stream is usable
        accumulate[1, N, stream](x, y)


# ---------------------------------------------------------------- CuPy

@pytest.fixture
def cupy():
    cupy = pytest.importorskip("cupy")
    if ng.backend() != "cuda":
        pytest.skip("needs the CUDA driver")
    return cupy


def _cupy_arrays(cupy):
    x = cupy.arange(N, dtype=cupy.float32)
    y = cupy.full(N, 10.0, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    return x, y


@pytest.mark.driver_only(reason="CuPy needs a GPU")
def test_cupy_arrays_passed_to_a_kernel_in_a_numbagraph_capture(cupy, stream, strict):
    x, y = _cupy_arrays(cupy)
    warm(stream)
    accumulate[1, N, stream](x, y)
    stream.synchronize()
    with ng.capture(stream) as cap:
        accumulate[1, N, stream](x, y)                  # CAI names the legacy stream
        ng.add_into(x, y, y, stream=stream)
    cap.graph.launch()
    stream.synchronize()
    assert bool((y == 10 + 3 * x).all())


@pytest.mark.driver_only(reason="CuPy needs a GPU")
def test_cupy_ops_inside_a_numbagraph_capture(cupy, stream):
    x, y = _cupy_arrays(cupy)
    warm(stream)
    with cupy.cuda.ExternalStream(int(stream.handle)):
        cupy.add(y, x, out=y)                            # compile CuPy's kernels first
        cupy.multiply(y, 2, out=y)
    stream.synchronize()
    y.fill(10.0)
    cupy.cuda.Device().synchronize()
    with ng.capture(stream) as cap:
        with cupy.cuda.ExternalStream(int(stream.handle)):
            cupy.add(y, x, out=y)
            cupy.multiply(y, 2, out=y)
        accumulate[1, N, stream](x, y)
    cap.graph.launch()
    stream.synchronize()
    assert bool((y == 2 * (10 + x) + x).all())


@pytest.mark.driver_only(reason="CuPy needs a GPU")
def test_numbagraph_work_inside_a_cupy_capture(cupy, stream):
    x, y = _cupy_arrays(cupy)
    accumulate[1, N, stream](x, y)
    ng.add_into(x, y, y, stream=stream)
    stream.synchronize()
    y.fill(10.0)
    theirs = cupy.cuda.Stream(non_blocking=True)
    s = cuda.external_stream(theirs.ptr)
    with theirs:
        theirs.begin_capture()
        with pytest.raises(ng.CaptureStateError, match="without ng.capture"):
            ng.begin_capture(s)
        accumulate[1, N, s](x, y)                        # CAI names the capturing stream
        ng.add_into(x, y, y, stream=theirs)
        graph = theirs.end_capture()
    cupy.cuda.Device().synchronize()
    assert bool((y == 10).all())
    graph.launch(theirs)
    theirs.synchronize()
    assert bool((y == 10 + 2 * x).all())


@pytest.mark.driver_only(reason="CuPy needs a GPU")
def test_ng_capture_on_a_cupy_stream(cupy, strict):
    x, y = _cupy_arrays(cupy)
    theirs = cupy.cuda.Stream(non_blocking=True)
    s = cuda.external_stream(theirs.ptr)
    warm(s)
    with theirs:
        cupy.add(y, 1, out=y)                            # compile CuPy's kernel first
        y.fill(10.0)
    accumulate[1, N, s](x, y)
    s.synchronize()
    with ng.capture(theirs) as cap:
        with theirs:                                     # CuPy's work and CAI on it
            accumulate[1, N, s](x, y)
            cupy.add(y, 1, out=y)
    cap.graph.launch()
    theirs.synchronize()
    assert bool((y == 10 + 2 * x + 1).all())


# ---------------------------------------------------------------- cuda.core

@pytest.fixture
def core_stream():
    if ng.backend() != "cuda":
        pytest.skip("needs the CUDA driver")
    from cuda.core import Device

    device = Device()
    device.set_current()
    stream = device.create_stream()
    yield stream
    stream.sync()
    stream.close()


@pytest.mark.driver_only(reason="cuda.core streams need a GPU")
def test_ng_capture_on_a_cuda_core_stream(core_stream, strict):
    s = core_stream
    x = cuda.to_device(np.arange(N, dtype=np.float32))
    y = cuda.to_device(np.full(N, 10, np.float32))
    cuda.synchronize()                                   # s does not wait on the default stream
    accumulate[1, N, s](x, y)                            # numba takes cuda.core streams
    s.sync()
    with ng.capture(s) as cap:
        accumulate[1, N, s](x, y)
        ng.add_into(x, y, y, stream=s)
    cap.graph.launch()
    s.sync()
    np.testing.assert_array_equal(y.copy_to_host(), 10 + 3 * np.arange(N))


@pytest.mark.driver_only(reason="cuda.core graphs need a GPU")
def test_numbagraph_work_inside_a_cuda_core_graph_builder(core_stream):
    s = core_stream
    x = cuda.to_device(np.arange(N, dtype=np.float32))
    y = cuda.to_device(np.full(N, 10, np.float32))
    cuda.synchronize()
    accumulate[1, N, s](x, y)
    ng.add_into(x, y, y, stream=s)
    s.sync()
    y.copy_to_device(np.full(N, 10, np.float32))
    cuda.synchronize()
    builder = s.create_graph_builder()
    builder.begin_building()
    theirs = builder.stream
    with pytest.raises(ng.CaptureStateError, match="without ng.capture"):
        ng.begin_capture(theirs)
    accumulate[1, N, theirs](x, y)
    ng.add_into(x, y, y, stream=theirs)
    graph = builder.end_building().complete()
    np.testing.assert_array_equal(y.copy_to_host(), 10)
    graph.launch(s)
    s.sync()
    np.testing.assert_array_equal(y.copy_to_host(), 10 + 2 * np.arange(N))
    graph.close()
    builder.close()
