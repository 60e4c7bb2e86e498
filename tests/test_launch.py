"""The launch fast path and launch records, against numba's own launch.

Every launch here is made twice from the same inputs: through numba's own
configuration (``kernel.configure(...)``, numba's argument packing) and
through ``kernel[...]`` (numbagraph's path wherever it applies) or a launch
record; the outputs must be equal bit for bit.
"""

import functools

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active

ON_DRIVER = ng.backend() == "cuda"


def both(kernel, grid, block, s, make, shared=0):
    """(numba's output, the fast path's output) of ``kernel`` on fresh
    inputs from ``make()``; ``make`` returns (args, output array)."""
    results = []
    # The simulator has one path: numba's simulated launch.
    numba = (kernel.configure(grid, block, s, shared) if ON_DRIVER
             else kernel[grid, block, s, shared])
    for launch in (lambda args: numba(*args),
                   lambda args: kernel[grid, block, s, shared](*args)):
        args, out = make()
        launch(args)
        results.append(out.copy_to_host(stream=s))
        s.synchronize()
    return results


@cuda.jit
def scale_into(x, a, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * a


DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_arrays_and_scalars_of_each_dtype(stream, dtype):
    def make():
        x = cuda.to_device(np.arange(1, 33).astype(dtype), stream=stream)
        out = cuda.to_device(np.zeros(32, dtype), stream=stream)
        return (x, dtype(3), out), out

    numba_out, fast_out = both(scale_into, 1, 32, stream, make)
    np.testing.assert_array_equal(fast_out, numba_out)


@cuda.jit
def sum3(x, out):
    i, j, k = cuda.grid(3)
    if i < x.shape[0] and j < x.shape[1] and k < x.shape[2]:
        cuda.atomic.add(out, 0, x[i, j, k] * (1 + i + 10 * j + 100 * k))


@cuda.jit
def sum2(x, out):
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        cuda.atomic.add(out, 0, x[i, j] * (1 + i + 10 * j))


@pytest.mark.parametrize("view", ["C", "F", "strided", "transposed", "broadcast"])
def test_layouts_of_two_and_three_dimensional_arrays(stream, view):
    base = np.arange(6 * 4 * 3, dtype=np.float64).reshape(6, 4, 3)

    def make():
        out = cuda.to_device(np.zeros(1), stream=stream)
        if view == "C":
            return (cuda.to_device(base, stream=stream), out), out
        if view == "F":
            return (cuda.to_device(np.asfortranarray(base), stream=stream), out), out
        if view == "strided":
            return (cuda.to_device(base, stream=stream)[::2, 1:, ::2], out), out
        if view == "transposed":
            return (cuda.to_device(np.ascontiguousarray(base[:, :, 0]), stream=stream).T,
                    out), out
        return (cuda.to_device(np.broadcast_to(base[0, :, 0], (6, 4)).copy(),
                               stream=stream), out), out

    kernel = sum2 if view in ("transposed", "broadcast") else sum3
    grid, block = ((2, 2), (4, 4)) if kernel is sum2 else ((2, 2, 2), (4, 4, 4))
    numba_out, fast_out = both(kernel, grid, block, stream, make)
    np.testing.assert_array_equal(fast_out, numba_out)
    assert numba_out[0] != 0


@cuda.jit
def mixed(out, b, i, u, f, c, z):
    if cuda.grid(1) == 0:
        out[0] = 1.0 if b else 0.0
        out[1] = i
        out[2] = u
        out[3] = f
        out[4] = c.real
        out[5] = c.imag
        out[6] = z.real
        out[7] = z.imag


@pytest.mark.parametrize("values", [
    (True, -7, np.uint32(9), 2.5, 1 + 2j, np.complex64(3 - 4j)),
    (np.bool_(False), np.int16(-3), np.uint64(2**40), np.float32(0.25), np.complex128(-1j),
     np.complex64(0.5)),
])
def test_every_scalar_kind(stream, values):
    def make():
        out = cuda.to_device(np.zeros(8), stream=stream)
        return (out, *values), out

    numba_out, fast_out = both(mixed, 1, 1, stream, make)
    np.testing.assert_array_equal(fast_out, numba_out)


@cuda.jit
def from_record_and_tuple(rec, pair, out):
    if cuda.grid(1) == 0:
        out[0] = rec[0]["a"] + pair[0] + pair[1]


def test_kinds_the_fast_path_leaves_to_numba_give_the_same_result(stream):
    dtype = np.dtype([("a", np.float64), ("b", np.int32)])

    def make():
        rec = cuda.to_device(np.array([(1.5, 2)], dtype=dtype), stream=stream)
        out = cuda.to_device(np.zeros(1), stream=stream)
        return (rec, (2.0, 3.0), out), out

    numba_out, fast_out = both(from_record_and_tuple, 1, 1, stream, make)
    np.testing.assert_array_equal(fast_out, numba_out)
    assert fast_out[0] == 6.5


class _Interface:
    """Only __cuda_array_interface__, as a foreign array has it."""

    def __init__(self, dev):
        self._dev = dev
        self.__cuda_array_interface__ = dev.__cuda_array_interface__


@pytest.mark.driver_only(reason="simulated device arrays have no __cuda_array_interface__")
def test_objects_with_only_the_array_interface(stream):
    def make():
        x = cuda.to_device(np.arange(32, dtype=np.float32), stream=stream)
        out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
        return (_Interface(x), np.float32(2), out), out

    numba_out, fast_out = both(scale_into, 1, 32, stream, make)
    np.testing.assert_array_equal(fast_out, numba_out)


@cuda.jit("void(float32[::1], float32, float32[::1])")
def explicit(x, a, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + a


def test_explicit_signatures_and_several_overloads(stream):
    def make(dtype, scalar):
        def inner():
            x = cuda.to_device(np.arange(32).astype(dtype), stream=stream)
            out = cuda.to_device(np.zeros(32, dtype), stream=stream)
            return (x, scalar, out), out
        return inner

    numba_out, fast_out = both(explicit, 1, 32, stream, make(np.float32, np.float32(1)))
    np.testing.assert_array_equal(fast_out, numba_out)
    for dtype, scalar in ((np.float32, 2.0), (np.int32, 3), (np.float64, np.float64(4))):
        numba_out, fast_out = both(scale_into, 1, 32, stream, make(dtype, scalar))
        np.testing.assert_array_equal(fast_out, numba_out)


@cuda.jit
def reverse_block(x, out):
    tile = cuda.shared.array(0, np.float32)
    i = cuda.threadIdx.x
    tile[i] = x[i]
    cuda.syncthreads()
    out[i] = tile[cuda.blockDim.x - 1 - i]


@pytest.mark.driver_only(reason="Numba's simulator cannot size a dynamic shared array "
                                  "of a NumPy scalar type")
def test_dynamic_shared_memory(stream):
    def make():
        x = cuda.to_device(np.arange(32, dtype=np.float32), stream=stream)
        out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
        return (x, out), out

    numba_out, fast_out = both(reverse_block, 1, 32, stream, make, shared=32 * 4)
    np.testing.assert_array_equal(fast_out, numba_out)
    np.testing.assert_array_equal(fast_out, np.arange(32)[::-1])


def test_device_scalars_conditions_and_captures_keep_working(stream):
    x = cuda.to_device(np.ones(32, np.float32), stream=stream)
    out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    a = ng.DeviceScalar(3.0, dtype=np.float32, stream=stream)

    @cuda.jit
    def scale_by(x, a, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] * a[0]

    scale_by[1, 32, stream](x, a, out)
    with ng.capture(stream) as cap:
        scale_by[1, 32, stream](out, a, out)
    a.update(2.0)
    cap.graph.launch()
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 6.0)
    with pytest.raises(ng.HostArrayInCaptureError):
        with ng.capture(stream):
            scale_by[1, 32, stream](np.ones(32, np.float32), a, out)


def test_a_launch_record_launches_and_rebinds_its_arguments(stream):
    x = cuda.to_device(np.arange(32, dtype=np.float32), stream=stream)
    y = cuda.to_device(np.full(32, 10, np.float32), stream=stream)
    out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    rec = ng.launch_record(scale_into, 1, 32, stream, x, np.float32(2), out)
    rec.launch()
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 2 * np.arange(32))
    rec.set_arg(0, y)
    rec.set_arg(-2, np.float32(0.5))
    rec.launch()
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 5.0)
    with pytest.raises(TypeError, match="compiled for float32"):
        rec.set_arg(1, 0.5)
    with pytest.raises(TypeError, match="compiled for array"):
        rec.set_arg(0, cuda.to_device(np.zeros(32, np.float64)))
    with pytest.raises(IndexError):
        rec.set_arg(3, y)
    assert rec.args[0] is y  # refused calls changed nothing
    with ng.capture(stream) as cap:
        rec.launch()
    rec.set_arg(0, x)        # the graph keeps the arrays it was captured with
    cap.graph.launch()
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 5.0)


def test_a_launch_record_refuses_a_bad_configuration(stream):
    x = cuda.to_device(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="sharedmem"):
        ng.launch_record(scale_into, 1, 4, stream, x, 1.0, x, sharedmem=-1)
    with pytest.raises(TypeError):
        ng.launch_record(lambda: None, 1, 4, stream)


def test_a_launch_record_refuses_a_host_array_naming_it_and_the_fix(stream):
    out = cuda.to_device(np.zeros(4, np.float32), stream=stream)
    with pytest.raises(ng.KernelArgumentError, match=r"argument 0 .*host array.*cuda\.to_device"):
        ng.launch_record(scale_into, 1, 4, stream, np.ones(4, np.float32), 1.0, out)


def test_set_arg_refuses_a_host_array_and_keeps_the_arguments(stream):
    x = cuda.to_device(np.ones(4, np.float32), stream=stream)
    rec = ng.launch_record(scale_into, 1, 4, stream, x, np.float32(1), x)
    with pytest.raises(ng.KernelArgumentError, match=r"argument 2 .*cuda\.to_device"):
        rec.set_arg(2, np.zeros(4, np.float32))
    assert rec.args[2] is x


@functools.cache
def add_explicit(*signatures):
    """``x += v``, compiled (when first asked for) for ``signatures`` only."""
    @cuda.jit(list(signatures))
    def add(x, v):
        i = cuda.grid(1)
        if i < x.size:
            x[i] += v

    return add


INT_OR_FLOAT = ("void(int32[::1], int32)", "void(float64[::1], float64)")
INT_OR_UNSIGNED = ("void(int32[::1], int32)", "void(int32[::1], uint32)")


@pytest.mark.parametrize("dtype", [np.int32, np.float64], ids=["int32", "float64"])
def test_a_python_int_takes_the_explicit_signature_numba_picks(stream, dtype):
    x = cuda.to_device(np.ones(4, dtype), stream=stream)
    rec = ng.launch_record(add_explicit(*INT_OR_FLOAT), 1, 4, stream, x, 5)
    rec.launch()
    got = x.copy_to_host(stream=stream)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, 6)


def test_precompile_takes_what_an_explicit_signature_converts(stream):
    x = cuda.to_device(np.ones(4, np.int32), stream=stream)
    ng.precompile(add_explicit(*INT_OR_FLOAT), x, 5)


@pytest.mark.driver_only(reason="the simulator runs kernels as Python, of any signature")
@pytest.mark.parametrize("dtype, how", [
    (np.int32, "convert equally well to"),
    (np.float32, "convert to none of them"),
], ids=["several", "none"])
def test_arguments_no_one_signature_takes_are_refused_naming_them(stream, dtype, how):
    x = cuda.to_device(np.ones(4, dtype), stream=stream)
    with pytest.raises(ng.KernelArgumentError, match=how) as err:
        ng.launch_record(add_explicit(*INT_OR_UNSIGNED), 1, 4, stream, x, 5)
    assert "(array(int32, 1d, C), int32); (array(int32, 1d, C), uint32)" in str(err.value)


@pytest.mark.driver_only(reason="the fast path exists only on the driver")
def test_the_fast_path_is_taken_for_covered_arguments(stream):
    from numbagraph.backend import driver_launch

    x = cuda.to_device(np.arange(32, dtype=np.float32), stream=stream)
    out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    scale_into[1, 32, stream](x, np.float32(2), out)   # numba compiles it
    scale_into[1, 32, stream](x, np.float32(2), out)
    plans = driver_launch._plans[(scale_into, driver_launch._context_key())]
    assert any(isinstance(plan, driver_launch.Plan) for plan in plans.values())
    assert active.prepared_launch(scale_into, 1, 32, 0, int(stream.handle),
                                  (x, np.float32(2), out)) is not None


@pytest.mark.driver_only(reason="pre-launch callbacks belong to numba's driver configuration")
def test_pre_launch_callbacks_run_once_per_launch_as_numba_runs_them(stream):
    x = cuda.to_device(np.arange(32, dtype=np.float32), stream=stream)
    out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    seen = []
    scale_into[1, 32, stream](x, np.float32(1), out)
    scale_into.configure(1, 32, stream).pre_launch_callbacks.append(
        lambda kernel, config: seen.append(1))
    try:
        for _ in range(3):
            scale_into[1, 32, stream](x, np.float32(1), out)
        assert len(seen) == 3
    finally:
        scale_into.configure(1, 32, stream).pre_launch_callbacks.clear()
    scale_into[1, 32, stream](x, np.float32(1), out)
    assert len(seen) == 3


OFFSET = 1.0


@cuda.jit
def add_offset(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = OFFSET


@pytest.mark.driver_only(reason="recompile() belongs to numba's driver dispatcher")
def test_a_recompiled_kernel_is_the_one_launched(stream):
    global OFFSET
    out = cuda.to_device(np.zeros(8, np.float32), stream=stream)
    add_offset[1, 8, stream](out)
    add_offset[1, 8, stream](out)
    assert out.copy_to_host(stream=stream)[0] == 1.0
    try:
        OFFSET = 5.0
        add_offset.recompile()
        add_offset[1, 8, stream](out)
        assert out.copy_to_host(stream=stream)[0] == 5.0
    finally:
        OFFSET = 1.0
        add_offset.recompile()


@pytest.mark.driver_only(reason="recompile() belongs to numba's driver dispatcher")
def test_a_configuration_kept_across_a_recompile_launches_the_new_kernel(stream):
    global OFFSET
    out = cuda.to_device(np.zeros(8, np.float32), stream=stream)
    configured = add_offset[1, 8, stream]
    configured(out)
    configured(out)
    try:
        OFFSET = 7.0
        add_offset.recompile()
        configured(out)
        assert out.copy_to_host(stream=stream)[0] == 7.0
    finally:
        OFFSET = 1.0
        add_offset.recompile()


def test_repeated_launches_pack_each_new_argument(stream):
    x = cuda.to_device(np.arange(32, dtype=np.float32), stream=stream)
    out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    three = np.float32(3)
    for _ in range(3):
        scale_into[1, 32, stream](x, three, out)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 3 * np.arange(32))
    # Another array, another number: each launch packs what it is given.
    y = cuda.to_device(np.ones(32, np.float32), stream=stream)
    scale_into[1, 32, stream](y, three, out)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.full(32, 3))
    scale_into[1, 32, stream](y, np.float32(-0.0), out)
    assert np.all(np.signbit(out.copy_to_host(stream=stream)))
    # An array made where a freed one was gets its own packing.
    for k in range(4):
        z = cuda.to_device(np.full(32, k, np.float32), stream=stream)
        scale_into[1, 32, stream](z, three, out)
        np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.full(32, 3 * k))
        del z


def test_launch_records_take_dimensions_as_numba_does(stream):
    x = cuda.to_device(np.arange(32, dtype=np.float32), stream=stream)
    out = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    rec = ng.launch_record(scale_into, [1], (32,), stream, x, np.float32(3), out)
    rec.launch()
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 3 * np.arange(32))


@pytest.mark.driver_only(reason="the simulator runs a thread per GPU thread: too slow here")
def test_threads_launching_one_kernel_at_once_each_get_their_own_arguments(stream):
    import threading

    streams = [cuda.stream() for _ in range(8)]
    outs = [cuda.to_device(np.zeros(256, np.float32), stream=s) for s in streams]
    xs = [cuda.to_device(np.full(256, k, np.float32), stream=s) for k, s in enumerate(streams)]
    scale_into[1, 256, streams[0]](xs[0], np.float32(1), outs[0])
    errors = []

    def worker(k):
        try:
            for j in range(200):
                scale_into[1, 256, streams[k]](xs[k], np.float32(j), outs[k])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, s in enumerate(streams):
        np.testing.assert_array_equal(outs[k].copy_to_host(stream=s), np.full(256, 199.0 * k))


@pytest.mark.driver_only(reason="the simulator checks dimensions its own way")
def test_a_zero_dimension_is_refused_before_anything_is_launched(stream):
    x = cuda.to_device(np.zeros(4, np.float32), stream=stream)
    with pytest.raises(ValueError):
        scale_into[0, 4, stream](x, np.float32(1), x)
