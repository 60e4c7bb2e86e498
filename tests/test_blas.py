"""matmul_into's two paths: cuBLAS through nvmath-python on the driver, the
numba kernel elsewhere. Which one runs, and why; the cuBLAS product each
layout is given, checked against NumPy by running it as cuBLAS reads memory;
results of both paths, batches, views and transposes; captures, replays,
remembered eager calls, threads; what a graph holding cuBLAS nodes refuses.

The tests marked driver_only run cuBLAS itself: they need the CUDA driver
and nvmath-python (``pip install -e ".[blas]"``). On the simulator, the
cuBLAS path runs with a stand-in for nvmath's cuBLAS that computes as cuBLAS
does on the simulator's memory: the handles, workspaces, arguments and
capture bookkeeping are numbagraph's own, checked on both backends."""

import subprocess
import sys
import threading
import types
import warnings

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph import _rebind, _registry
from numbagraph.backend import active
from numbagraph.ops import _blas, _launch, linalg

from conftest import BF16, ON_SIMULATOR, ml_dtypes, to_device, to_host

RNG = np.random.default_rng(7)



def host(shape, dtype=np.float32, seed=None):
    rng = RNG if seed is None else np.random.default_rng(seed)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def want(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def close(dtype):
    if np.dtype(dtype).name == "bfloat16":    # 8 bits of mantissa in the output
        return dict(rtol=1e-2, atol=3e-2)
    return {2: dict(rtol=1e-2, atol=1e-2), 4: dict(rtol=1e-5, atol=1e-5),
            8: dict(rtol=1e-12, atol=1e-12)}[np.dtype(dtype).itemsize]


@pytest.fixture(autouse=True)
def settings():
    """Each test starts from the default settings and leaves them so."""
    choice, tf32 = _blas.settings.choice, _blas.settings.tf32
    _blas.settings.choice, _blas.settings.tf32 = "auto", False
    yield
    _blas.settings.choice, _blas.settings.tf32 = choice, tf32
    _launch.forget_remembered()


@pytest.fixture
def library(monkeypatch):
    """nvmath loaded afresh: the cache of the first load is set aside."""
    monkeypatch.setattr(_blas, "_loaded", [])
    monkeypatch.setattr(_blas, "_enums", [])
    return monkeypatch


@pytest.fixture
def cublas(stream):
    """cuBLAS on ``stream``, made ready from this thread (nvmath needed)."""
    pytest.importorskip("nvmath")
    assert ng.prepare_matmul(stream=stream) == "cublas"
    return stream


# ---------------------------------------------------------------- the layouts cuBLAS is given

def _in_buffer(shape, strides, dtype, seed):
    """A NumPy array of ``shape`` with element ``strides`` (possibly
    negative), filled with values, inside a padded buffer of its own."""
    itemsize = np.dtype(dtype).itemsize
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    size = high - low + 1
    buffer = np.zeros(size + 64, dtype)
    view = np.ndarray(shape, dtype, buffer=buffer, offset=(-low + 32) * itemsize,
                      strides=tuple(s * itemsize for s in strides))
    view[...] = host(shape, dtype, seed)
    return buffer, view


def _as_cublas_reads(buffer, view, offset, rows, cols, ld):
    """The column-major (rows x cols) matrix cuBLAS reads at ``offset``
    elements past ``view``'s first element, with leading dimension ``ld``;
    NumPy refuses one reaching outside ``buffer``."""
    itemsize = buffer.itemsize
    start = view.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]
    return np.ndarray((rows, cols), buffer.dtype, buffer=buffer,
                      offset=start + offset * itemsize, strides=(itemsize, ld * itemsize))


def _run_as_cublas(gemm, operands):
    """``gemm`` run as cuBLAS runs it, on the NumPy operands
    ``[(buffer, view)]`` for a, b and out."""
    (a_buf, a), (b_buf, b), (out_buf, out) = operands
    first, second = ((b_buf, b), (a_buf, a)) if gemm.swap else ((a_buf, a), (b_buf, b))
    for z in range(gemm.batches):
        rows, cols = (gemm.k, gemm.m) if gemm.transa else (gemm.m, gemm.k)
        op_a = _as_cublas_reads(*first, z * gemm.stride_a, rows, cols, gemm.lda)
        rows, cols = (gemm.n, gemm.k) if gemm.transb else (gemm.k, gemm.n)
        op_b = _as_cublas_reads(*second, z * gemm.stride_b, rows, cols, gemm.ldb)
        c = _as_cublas_reads(out_buf, out, z * gemm.stride_c, gemm.m, gemm.n, gemm.ldc)
        c[...] = (op_a.T if gemm.transa else op_a) @ (op_b.T if gemm.transb else op_b)


M, K, N = 3, 4, 5
# Element strides of a (rows, cols) matrix, by name; None where cuBLAS cannot
# read the layout.
LAYOUTS = {
    "rows": lambda r, c: ((c, 1), True),
    "columns": lambda r, c: ((1, r), True),                 # a transpose's layout
    "padded rows": lambda r, c: ((c + 3, 1), True),         # a slice of wider rows
    "padded columns": lambda r, c: ((1, r + 2), True),
    "strided both": lambda r, c: ((2 * c, 2), False),       # x[:, ::2]
    "reversed rows": lambda r, c: ((-c, 1), False),         # x[::-1]
}


@pytest.mark.parametrize("out_layout", ["rows", "columns", "padded rows", "strided both"])
@pytest.mark.parametrize("b_layout", list(LAYOUTS))
@pytest.mark.parametrize("a_layout", list(LAYOUTS))
def test_the_cublas_product_of_each_layout_computes_a_at_b(a_layout, b_layout, out_layout):
    operands, takes = [], True
    for name, layout, (r, c) in (("a", a_layout, (M, K)), ("b", b_layout, (K, N)),
                                 ("out", out_layout, (M, N))):
        strides, ok = LAYOUTS[layout](r, c)
        takes = takes and ok
        operands.append(_in_buffer((r, c), strides, np.float64, seed=len(operands)))
    (_, a), (_, b), (_, out) = operands
    expected = a @ b
    gemm = _blas.plan(a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, 8)
    if not takes:
        assert gemm is None
        return
    assert gemm is not None
    _run_as_cublas(gemm, operands)
    np.testing.assert_allclose(out, expected, rtol=1e-12)


@pytest.mark.parametrize("a_batched, b_batched", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("out_layout", ["rows", "columns"])
def test_a_batch_is_one_strided_batched_product(a_batched, b_batched, out_layout):
    batches = 4
    operands = []
    for (r, c), batched, layout in (((M, K), a_batched, "columns"), ((K, N), b_batched, "rows"),
                                    ((M, N), True, out_layout)):
        (s0, s1), _ = LAYOUTS[layout](r, c)
        shape, strides = (r, c), (s0, s1)
        if batched:
            shape, strides = (batches, r, c), (r * c + 7, s0, s1)
        operands.append(_in_buffer(shape, strides, np.float64, seed=len(operands)))
    (_, a), (_, b), (_, out) = operands
    expected = np.matmul(a, b)
    gemm = _blas.plan(a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, 8)
    assert gemm.batches == batches
    _run_as_cublas(gemm, operands)
    np.testing.assert_allclose(out, expected, rtol=1e-12)


@pytest.mark.parametrize("shape_a, strides_a", [((1, K), (99, 3)), ((M, 1), (5, 77))],
                         ids=["one row, strided", "one column, strided"])
def test_a_dimension_of_one_element_has_no_stride_that_matters(shape_a, strides_a):
    k = shape_a[1]
    operands = [_in_buffer(shape_a, strides_a, np.float64, 0),
                _in_buffer((k, N), (N, 1), np.float64, 1),
                _in_buffer((shape_a[0], N), (N, 1), np.float64, 2)]
    (_, a), (_, b), (_, out) = operands
    gemm = _blas.plan(a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, 8)
    assert gemm is not None
    _run_as_cublas(gemm, operands)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)


def test_what_cublas_cannot_take_is_left_to_the_numba_kernel():
    c = (K * 8, 8)
    assert _blas.plan((M, 0), (0, 8), (0, N), (N * 8, 8), (M, N), (N * 8, 8), 8) is None  # K 0
    assert _blas.plan((M, K), (K * 8 + 4, 8), (K, N), (N * 8, 8), (M, N), (N * 8, 8), 8) is None
    big = 2**31
    assert _blas.plan((big, K), c, (K, N), (N * 8, 8), (big, N), (N * 8, 8), 8) is None
    # A batch stepping backwards.
    assert _blas.plan((2, M, K), (-M * K * 8, *c), (K, N), (N * 8, 8), (2, M, N),
                      (M * N * 8, N * 8, 8), 8) is None


# ---------------------------------------------------------------- which path runs

@pytest.mark.skipif(not ON_SIMULATOR, reason="the simulator runs the numba kernel only")
def test_the_simulator_runs_the_numba_kernel_and_refuses_cublas_by_name(stream):
    assert ng.matmul_backend() == "numba"
    assert _blas.unavailable() == (
        "cuBLAS runs only on the CUDA driver, and numbagraph runs on Numba's CUDA "
        "simulator here")
    with pytest.raises(ng.OpError, match="only on the CUDA driver"):
        ng.set_matmul_backend("cublas")
    assert _blas.settings.choice == "auto"
    assert ng.prepare_matmul(stream=stream) == "numba"


def test_import_numbagraph_does_not_import_nvmath():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, numbagraph; print('nvmath' in sys.modules)"],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_without_nvmath_matmul_runs_the_numba_kernel_and_cublas_by_name_says_what_to_install(
        library, stream):
    library.setattr(active, "LIBRARY_KERNELS", True)
    for name in ("nvmath", "nvmath.bindings", "nvmath.bindings.cublas"):
        library.setitem(sys.modules, name, None)     # import nvmath fails
    assert ng.matmul_backend() == "numba"
    with pytest.raises(ng.OpError, match=r'pip install -e "\.\[blas\]"'):
        ng.set_matmul_backend("cublas")
    assert _blas.settings.choice == "auto"
    a, b = host((M, K)), host((K, N))
    out = ng.empty((M, N), np.float32)
    ng.matmul_into(cuda.to_device(a), cuda.to_device(b), out, stream=stream)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want(a, b), **close(np.float32))


def test_a_libcublas_that_does_not_load_is_named_with_the_loader_s_error(library):
    library.setattr(active, "LIBRARY_KERNELS", True)

    def get_property(kind):
        raise RuntimeError("libcublas.so.13: cannot open shared object file")

    cublas = types.ModuleType("nvmath.bindings.cublas")
    cublas.get_property = get_property
    bindings = types.ModuleType("nvmath.bindings")
    bindings.cublas = cublas
    nvmath = types.ModuleType("nvmath")
    nvmath.bindings = bindings
    for name, module in (("nvmath", nvmath), ("nvmath.bindings", bindings),
                         ("nvmath.bindings.cublas", cublas)):
        library.setitem(sys.modules, name, module)
    assert ng.matmul_backend() == "numba"
    with pytest.raises(ng.OpError, match="could not load libcublas.*cannot open shared object"):
        ng.set_matmul_backend("cublas")


def test_settings_are_checked_and_return_what_they_replace():
    with pytest.raises(ValueError, match="'auto', 'cublas', 'numba'"):
        ng.set_matmul_backend("cutlass")
    assert ng.set_matmul_backend("numba") == "auto"
    assert ng.matmul_backend() == "numba"
    assert ng.set_matmul_backend("auto") == "numba"
    with pytest.raises(TypeError, match="True or False"):
        ng.set_tf32(1)
    assert ng.set_tf32(True) is False
    assert ng.set_tf32(False) is True


def test_a_remembered_call_is_checked_again_once_a_setting_changes(stream, monkeypatch):
    asked = []
    enabled = _blas.enabled
    monkeypatch.setattr(_blas, "enabled", lambda: asked.append(1) or enabled())
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    out = ng.empty((M, N), np.float32)
    for _ in range(4):
        ng.matmul_into(a, b, out, stream=stream)
    # Checked twice (once, then remembered as it ran); then repeated as remembered.
    assert len(asked) == 2
    ng.set_tf32(False)
    ng.matmul_into(a, b, out, stream=stream)
    assert len(asked) == 3


# ---------------------------------------------------------------- results, either path

@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32, np.float64], ids=str)
@pytest.mark.parametrize("m, k, n", [(5, 7, 6), (1, 33, 17), (40, 3, 1), (3, 1, 2)], ids=str)
def test_matmul_matches_numpy(stream, dtype, m, k, n):
    a, b = host((m, k), dtype), host((k, n), dtype)
    out = ng.empty((m, n), dtype)
    ng.matmul_into(to_device(a), to_device(b), out, stream=stream)
    np.testing.assert_allclose(to_host(out, stream).astype(np.float64), want(a, b),
                               **close(dtype))


class _Transposed:
    """A 2-D device array's transpose as a view, through its array interface
    (numba's own ``.T`` of a device array copies it with a kernel)."""

    def __init__(self, dev):
        self.dev = dev
        interface = dict(active.array_interface(dev))
        interface.update(shape=tuple(dev.shape)[::-1], strides=tuple(dev.strides)[::-1])
        self.__cuda_array_interface__ = interface


def test_views_and_transposes_are_read_where_they_lie(stream):
    a_t = cuda.to_device(host((K, M)))              # a is its transpose
    wide = cuda.to_device(host((K, 2 * N + 1)))
    out_t = ng.zeros((N, M), np.float32)
    # columns, strided both, columns
    a, b, out = _Transposed(a_t), wide[:, 1::2], _Transposed(out_t)
    ng.matmul_into(a, b, out, stream=stream)
    expected = want(a_t.copy_to_host().T, wide.copy_to_host()[:, 1::2])
    np.testing.assert_allclose(out_t.copy_to_host(stream=stream).T, expected,
                               **close(np.float32))
    padded = cuda.to_device(host((M, K + 3)))
    ng.matmul_into(padded[:, :K], wide[:, :N], out, stream=stream)
    expected = want(padded.copy_to_host()[:, :K], wide.copy_to_host()[:, :N])
    np.testing.assert_allclose(out_t.copy_to_host(stream=stream).T, expected,
                               **close(np.float32))


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32], ids=str)
@pytest.mark.parametrize("a_batched, b_batched", [(True, True), (True, False), (False, True)])
def test_a_batch_of_products_matches_numpy(stream, dtype, a_batched, b_batched):
    a = host((4, M, K) if a_batched else (M, K), dtype)
    b = host((4, K, N) if b_batched else (K, N), dtype)
    out = ng.empty((4, M, N), dtype)
    ng.matmul_into(to_device(a), to_device(b), out, stream=stream)
    np.testing.assert_allclose(to_host(out, stream).astype(np.float64), want(a, b),
                               **close(dtype))


def test_an_empty_inner_dimension_gives_zeros(stream):
    out = ng.empty((M, N), np.float32)
    ng.fill_into(out, 5.0, stream=stream)
    ng.matmul_into(ng.empty((M, 0), np.float32), ng.empty((0, N), np.float32), out,
                   stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), 0.0)


class _Overlapping:
    """A device array's memory as (M, N) with every row at the same place."""

    def __init__(self, dev):
        self.dev = dev
        interface = dict(active.array_interface(dev))
        interface.update(shape=(M, N), strides=(0, dev.dtype.itemsize))
        self.__cuda_array_interface__ = interface


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (ng.empty((2, M, K), np.float32), ng.empty((3, K, N), np.float32),
                  ng.empty((2, M, N), np.float32)), "do not fit"),
        (lambda: (ng.empty((2, M, K), np.float32), ng.empty((K, N), np.float32),
                  ng.empty((M, N), np.float32)), "do not fit"),
        (lambda: (ng.empty((M, K), np.float32), ng.empty((K, N), np.float32),
                  ng.empty((2, M, N), np.float32)), "do not fit"),
        (lambda: (ng.empty((M, K), np.int32), ng.empty((K, N), np.int32),
                  ng.empty((M, N), np.int32)), "int32"),
        (lambda: (ng.empty((1, 1, M, K), np.float32), ng.empty((K, N), np.float32),
                  ng.empty((M, N), np.float32)), "2-D or 3-D"),
        (lambda: (ng.empty((M, K), np.float32), ng.empty((K, N), np.float32),
                  _Overlapping(ng.empty(N, np.float32))), "share memory"),
    ],
    ids=["batches differ", "3-D into 2-D", "2-D into 3-D", "int32", "4-D", "out overlaps itself"],
)
def test_bad_calls_are_refused_before_anything_runs(stream, make, message):
    a, b, out = make()
    with pytest.raises(ng.OpError, match=message):
        ng.matmul_into(a, b, out, stream=stream)


def test_an_output_overlapping_a_strided_input_is_refused(stream):
    x = ng.zeros((M, 2 * M), np.float32, stream=stream)
    with pytest.raises(ng.OpError, match="overlaps a"):
        ng.matmul_into(x[:, ::2], ng.zeros((M, M), np.float32, stream=stream), x[:, 1::2],
                       stream=stream)


# ---------------------------------------------------------------- captures, either path

def test_a_captured_product_replays_on_new_inputs(stream):
    a, b = host((M, K), seed=1), host((K, N), seed=2)
    a_dev, b_dev = cuda.to_device(a), cuda.to_device(b)
    out = ng.empty((M, N), np.float32)
    ng.matmul_into(a_dev, b_dev, out, stream=stream)
    with ng.capture(stream) as cap:
        ng.matmul_into(a_dev, b_dev, out, stream=stream)
    for step in range(3):
        a = host((M, K), seed=10 + step)
        a_dev.copy_to_device(a, stream=stream)
        cap.graph.launch()
        np.testing.assert_allclose(out.copy_to_host(stream=stream), want(a, b),
                                   **close(np.float32))


def test_a_layout_cublas_cannot_take_records_the_numba_kernel(stream):
    wide = cuda.to_device(host((K, 2 * N)))
    a = cuda.to_device(host((M, K)))
    out = ng.empty((M, N), np.float32)
    ng.prepare_matmul(stream=stream)
    with ng.capture(stream) as cap:
        ng.matmul_into(a, wide[:, ::2], out, stream=stream)
    assert [(n.kind, n.name) for n in cap.graph.nodes] == [("kernel", "matmul_tiles")]
    cap.graph.launch()
    np.testing.assert_allclose(out.copy_to_host(stream=stream),
                               want(a.copy_to_host(), wide.copy_to_host()[:, ::2]),
                               **close(np.float32))


def test_a_graph_whose_nodes_cannot_move_an_array_refuses_to_rebind_it(stream):
    """The rule cuBLAS's nodes follow (Fixed), on nodes of the numba kernel."""
    ng.set_matmul_backend("numba")
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    other = cuda.to_device(host((M, K)))
    out = ng.empty((M, N), np.float32)
    with ng.capture(stream) as cap:
        ng.matmul_into(a, b, out, stream=stream)
        _registry.on(active.stream_handle(stream)).keep(
            _rebind.Fixed("library product", (a,), "Capture again."))
    with pytest.raises(ng.RebindError, match="library product uses this array.*Capture again"):
        cap.graph.rebind({a: other})
    cap.graph.rebind({b: cuda.to_device(host((K, N)))})     # b is not fixed


def test_a_graphed_function_captures_again_for_arrays_its_graph_cannot_move(stream):
    ng.set_matmul_backend("numba")

    def step(a, b, out):
        ng.matmul_into(a, b, out, stream=stream)
        session = _registry.on(active.stream_handle(stream))
        if session is not None:
            session.keep(_rebind.Fixed("library product", (a,), "Capture again."))

    graphed = ng.graphed(step, stream=stream, warmup=0)
    b = cuda.to_device(host((K, N), seed=3))
    out = ng.empty((M, N), np.float32)
    inputs = [host((M, K), seed=s) for s in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for a in inputs:
            graphed(cuda.to_device(a), b, out)
            np.testing.assert_allclose(out.copy_to_host(stream=stream),
                                       want(a, b.copy_to_host()), **close(np.float32))
    assert graphed.cache_info().captures == 3
    assert sum(issubclass(w.category, ng.GraphedWarning) for w in caught) == 1


# ---------------------------------------------------------------- cuBLAS itself (driver)

@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_the_driver_with_nvmath_calls_cublas(cublas):
    assert ng.matmul_backend() == "cublas"
    assert ng.set_matmul_backend("cublas") == "auto"
    assert ng.matmul_backend() == "cublas"


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_cublas_float32_is_float32_unless_tf32_is_allowed(cublas):
    n = 512
    a, b = host((n, n), seed=1), host((n, n), seed=2)
    a_dev, b_dev = cuda.to_device(a), cuda.to_device(b)
    out = ng.empty((n, n), np.float32)
    exact = want(a, b)
    ng.matmul_into(a_dev, b_dev, out, stream=cublas)
    plain = np.abs(out.copy_to_host(stream=cublas) - exact).max()
    assert plain < 5e-4
    ng.set_tf32(True)
    ng.matmul_into(a_dev, b_dev, out, stream=cublas)
    tf32 = np.abs(out.copy_to_host(stream=cublas) - exact).max()
    # TF32 keeps 10 bits of mantissa: a 512-term sum is off by about 1e-2.
    assert tf32 < 0.1
    assert tf32 > 10 * plain


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_a_captured_cublas_product_is_cublas_kernel_nodes_replayed_on_new_inputs(cublas):
    stream = cublas
    b = host((64, 48), np.float16, seed=2)
    a_dev, b_dev = cuda.to_device(host((32, 64), np.float16)), cuda.to_device(b)
    out = ng.empty((32, 48), np.float16)
    z, doubled = cuda.to_device(host(8, seed=3)), ng.empty(8, np.float32)
    ng.matmul_into(a_dev, b_dev, out, stream=stream)
    ng.mul_into(z, 2.0, doubled, stream=stream)
    with ng.capture(stream) as cap:
        ng.matmul_into(a_dev, b_dev, out, stream=stream)
        ng.mul_into(z, 2.0, doubled, stream=stream)
    nodes = cap.graph.nodes
    kernels = [n.name for n in nodes if n.kind == "kernel"]
    assert len(kernels) >= 2 and kernels[-1] is not None
    assert set(kernels[:-1]) == {None}      # cuBLAS's: no Python kernel runs them
    assert cap.graph.memory_bytes == 0      # its workspace was made outside the capture
    for step in range(5):
        a = host((32, 64), np.float16, seed=20 + step)
        a_dev.copy_to_device(a, stream=stream)
        cap.graph.launch()
        np.testing.assert_allclose(out.copy_to_host(stream=stream), want(a, b),
                                   **close(np.float16))
    with pytest.raises(ng.RebindError, match="cuBLAS matrix product"):
        cap.graph.rebind({a_dev: cuda.to_device(host((32, 64), np.float16))})
    # Arrays cuBLAS does not use rebind as ever.
    z_new = host(8, seed=4)
    cap.graph.rebind({z: cuda.to_device(z_new)})
    cap.graph.launch()
    np.testing.assert_array_equal(doubled.copy_to_host(stream=stream), 2 * z_new)
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want(a, b), **close(np.float16))


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_a_remembered_eager_cublas_call_repeats_with_the_arrays_current_values(cublas):
    stream = cublas
    b = host((K, N), seed=2)
    a_dev, b_dev = cuda.to_device(host((M, K))), cuda.to_device(b)
    out = ng.empty((M, N), np.float32)
    for step in range(5):
        a = host((M, K), seed=30 + step)
        a_dev.copy_to_device(a, stream=stream)
        ng.matmul_into(a_dev, b_dev, out, stream=stream)
        np.testing.assert_allclose(out.copy_to_host(stream=stream), want(a, b),
                                   **close(np.float32))
    assert any(id(a_dev) in key for key in _launch._seen.remembered)


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_threads_each_with_a_stream_call_cublas_at_once(cublas):
    errors = []

    def work(seed):
        try:
            s = cuda.stream()
            a, b = host((64, 96), seed=seed), host((96, 80), seed=seed + 1)
            a_dev, b_dev = cuda.to_device(a, stream=s), cuda.to_device(b, stream=s)
            out = ng.empty((64, 80), np.float32)
            for _ in range(50):
                ng.matmul_into(a_dev, b_dev, out, stream=s)
            np.testing.assert_allclose(out.copy_to_host(stream=s), want(a, b),
                                       **close(np.float32))
        except BaseException as exc:  # noqa: BLE001  reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(10 * i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_cublas_in_a_loop_body_repeats_with_the_loop(cublas):
    stream = cublas
    w = (0.5 * np.eye(16) + 0.01 * host((16, 16), np.float64, seed=4)).astype(np.float32)
    x0 = host((4, 16), seed=5)
    x, w_dev = cuda.to_device(x0), cuda.to_device(w)
    y = ng.empty((4, 16), np.float32)
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    ng.matmul_into(x, w_dev, y, stream=stream)   # eagerly: a spare workspace for the capture
    with ng.capture(stream) as cap:
        pos.update(0)
        with ng.repeat(pos, until=3):
            ng.matmul_into(x, w_dev, y, stream=stream)
            ng.copy_into(y, x, stream=stream)
    cap.graph.launch()
    expected = x0.astype(np.float64) @ np.linalg.matrix_power(w.astype(np.float64), 3)
    np.testing.assert_allclose(x.copy_to_host(stream=stream), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_a_capture_without_a_spare_workspace_allocates_one_in_its_graph(cublas, monkeypatch):
    stream = cublas
    monkeypatch.setattr(_blas, "_spare_workspaces", {})
    a, b = host((M, K)), host((K, N))
    a_dev, b_dev = cuda.to_device(a), cuda.to_device(b)
    out = ng.empty((M, N), np.float32)
    with ng.capture(stream) as cap:
        ng.matmul_into(a_dev, b_dev, out, stream=stream)
    assert cap.graph.memory_bytes > 0
    assert [n.kind for n in cap.graph.nodes if n.kind == "memory"] == ["memory", "memory"]
    cap.graph.launch()
    np.testing.assert_allclose(out.copy_to_host(stream=stream), want(a, b), **close(np.float32))


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_a_thread_s_first_call_inside_a_capture_records_the_numba_kernel_or_refuses(
        cublas, monkeypatch):
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    ng.set_matmul_backend("numba")
    ng.matmul_into(a, b, ng.empty((M, N), np.float32), stream=cublas)   # compiled beforehand
    ng.set_matmul_backend("auto")
    monkeypatch.setattr(_blas, "_spare_handles", {})
    found = {}

    def first_call():
        try:
            s = cuda.stream()
            out = ng.empty((M, N), np.float32)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with ng.capture(s) as cap:
                    ng.matmul_into(a, b, out, stream=s)
            found["warned"] = [str(w.message) for w in caught
                               if issubclass(w.category, ng.CaptureWarning)]
            found["nodes"] = [n.name for n in cap.graph.nodes]
            ng.set_matmul_backend("cublas")
            with ng.capture(s):
                try:
                    ng.matmul_into(a, b, out, stream=s)
                except ng.OpError as exc:
                    found["refused"] = str(exc)
                ng.fill_into(out, 0.0, stream=s)    # the capture goes on
        except BaseException as exc:  # noqa: BLE001  reported by the main thread
            found["error"] = exc

    thread = threading.Thread(target=first_call)
    thread.start()
    thread.join()
    assert "error" not in found, found["error"]
    assert any("prepare_matmul" in w for w in found["warned"])
    assert found["nodes"] == ["matmul_tiles"]
    assert "no cuBLAS handle" in found["refused"]


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_prepare_matmul_inside_a_capture_is_refused(cublas):
    with ng.capture(cublas):
        with pytest.raises(ng.OpError, match="before the capture begins"):
            ng.prepare_matmul(stream=cublas)


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
def test_a_graphed_function_with_cublas_captures_again_for_other_arrays(cublas):
    stream = cublas

    def step(a, b, out):
        ng.matmul_into(a, b, out, stream=stream)

    graphed = ng.graphed(step, stream=stream, warmup=1)
    b = cuda.to_device(host((K, N), seed=3))
    out = ng.empty((M, N), np.float32)
    with pytest.warns(ng.GraphedWarning, match="captures the function again"):
        for seed in range(4):
            a = host((M, K), seed=seed)
            graphed(cuda.to_device(a), b, out)
            np.testing.assert_allclose(out.copy_to_host(stream=stream),
                                       want(a, b.copy_to_host()), **close(np.float32))


# ---------------------------------------------------------------- the cuBLAS path, simulated

class _StandInCublas(types.ModuleType):
    """nvmath.bindings.cublas as the simulator can run it: each call does what
    cuBLAS documents, on the simulator's device memory (host memory, so the
    pointers given can be read), and is logged."""

    class cuBLASError(Exception):
        pass

    class Operation:
        N, T = 0, 1

    class ComputeType:
        COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77

    class GemmAlgo:
        DEFAULT = -1

    class Math:
        DEFAULT_MATH, DISALLOW_REDUCED_PRECISION_REDUCTION = 0, 16

    TYPES = {2: np.float16, 0: np.float32, 1: np.float64,
             14: ml_dtypes.bfloat16 if ml_dtypes is not None else None}

    def __init__(self):
        super().__init__("nvmath.bindings.cublas")
        self.log = []
        self.handles = 0

    def get_property(self, kind):
        return (13, 0, 0)[kind]

    def create(self):
        self.handles += 1
        self.log.append(("create", self.handles))
        return 1000 + self.handles

    def set_math_mode(self, handle, mode):
        self.log.append(("math", handle, mode))

    def set_stream(self, handle, stream):
        self.log.append(("stream", handle, stream))

    def set_workspace(self, handle, pointer, nbytes):
        assert pointer % 256 == 0 and nbytes >= 16 * 1024
        self.log.append(("workspace", handle, pointer, nbytes))

    @staticmethod
    def _matrix(pointer, dtype, rows, cols, ld):
        """The column-major (rows x cols) matrix at ``pointer``, as cuBLAS reads it."""
        import ctypes

        itemsize = np.dtype(dtype).itemsize
        assert ld >= max(1, rows), (ld, rows)
        count = (cols - 1) * ld + rows
        memory = (ctypes.c_char * (count * itemsize)).from_address(pointer)
        flat = np.frombuffer(memory, dtype)
        return np.lib.stride_tricks.as_strided(flat, (rows, cols), (itemsize, ld * itemsize))

    def _product(self, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta,
                 c, ctype, ldc, compute):
        dtype = self.TYPES[atype]
        assert atype == btype == ctype
        scale = np.float64 if compute == self.ComputeType.COMPUTE_64F else np.float32
        assert self._matrix(alpha, scale, 1, 1, 1)[0, 0] == 1
        assert self._matrix(beta, scale, 1, 1, 1)[0, 0] == 0
        op_a = self._matrix(a, dtype, *((k, m) if transa else (m, k)), lda)
        op_b = self._matrix(b, dtype, *((n, k) if transb else (k, n)), ldb)
        out = self._matrix(c, dtype, m, n, ldc)
        out[...] = ((op_a.T if transa else op_a).astype(np.float64)
                    @ (op_b.T if transb else op_b).astype(np.float64))

    def gemm_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb,
                beta, c, ctype, ldc, compute, algo):
        self.log.append(("gemm", handle, compute, 1))
        self._product(transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c,
                      ctype, ldc, compute)

    def gemm_strided_batched_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda,
                                stride_a, b, btype, ldb, stride_b, beta, c, ctype, ldc,
                                stride_c, batches, compute, algo):
        self.log.append(("gemm", handle, compute, batches))
        size = np.dtype(self.TYPES[atype]).itemsize
        for z in range(batches):
            self._product(transa, transb, m, n, k, alpha, a + z * stride_a * size, atype, lda,
                          b + z * stride_b * size, btype, ldb, beta, c + z * stride_c * size,
                          ctype, ldc, compute)

    def gemms(self):
        return [entry for entry in self.log if entry[0] == "gemm"]


@pytest.fixture
def standin(library):
    """On the simulator: matmul_into's cuBLAS path, with nvmath's cuBLAS
    replaced by a stand-in computing as cuBLAS does; every handle, spare and
    workspace made afresh."""
    if not ON_SIMULATOR:
        pytest.skip("the CUDA driver runs cuBLAS itself (the tests above)")
    cublas = _StandInCublas()
    bindings = types.ModuleType("nvmath.bindings")
    bindings.cublas = cublas
    nvmath = types.ModuleType("nvmath")
    nvmath.bindings = bindings
    nvmath.CudaDataType = types.SimpleNamespace(CUDA_R_16F=2, CUDA_R_32F=0, CUDA_R_64F=1,
                                                CUDA_R_16BF=14)
    for name, module in (("nvmath", nvmath), ("nvmath.bindings", bindings),
                         ("nvmath.bindings.cublas", cublas)):
        library.setitem(sys.modules, name, module)
    library.setattr(active, "LIBRARY_KERNELS", True)
    library.setattr(_blas, "_local", threading.local())
    for name in ("_spare_handles", "_spare_workspaces", "_sizes"):
        library.setattr(_blas, name, {})
    library.setattr(_blas, "_eager", type(_blas._eager)())
    _launch.forget_remembered()
    yield cublas
    _launch.forget_remembered()


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32, np.float64], ids=str)
def test_the_cublas_path_computes_every_layout_and_batch(standin, stream, dtype):
    assert ng.matmul_backend() == "cublas"
    a_t = cuda.to_device(host((K, M), dtype))
    wide = cuda.to_device(host((K, 2 * N + 3), dtype))
    batch = cuda.to_device(host((3, M, K), dtype))
    out_t = ng.zeros((N, M), dtype)
    out3 = ng.zeros((3, M, N), dtype)
    cases = [(a_t.T, wide[:, :N], out_t.T), (batch, wide[:, 3:3 + N], out3)]
    for a, b, out in cases:
        ng.matmul_into(a, b, out, stream=stream)
        expected = want(a.copy_to_host(), b.copy_to_host())
        np.testing.assert_allclose(out.copy_to_host(), expected, **close(dtype))
    assert [batches for *_, batches in standin.gemms()] == [1, 3]
    # A layout cuBLAS does not take runs the numba kernel, and is right too.
    out = ng.zeros((M, N), dtype)
    ng.matmul_into(a_t.T, wide[:, ::2][:, :N], out, stream=stream)
    assert len(standin.gemms()) == 2
    np.testing.assert_allclose(out.copy_to_host(),
                               want(a_t.copy_to_host().T, wide.copy_to_host()[:, ::2][:, :N]),
                               **close(dtype))


def test_the_cublas_path_computes_float32_in_float32_unless_tf32_is_allowed(standin, stream):
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    out = ng.empty((M, N), np.float32)
    ng.matmul_into(a, b, out, stream=stream)
    ng.set_tf32(True)
    ng.matmul_into(a, b, out, stream=stream)
    ng.matmul_into(cuda.to_device(host((M, K), np.float16)),
                   cuda.to_device(host((K, N), np.float16)), ng.empty((M, N), np.float16),
                   stream=stream)
    ng.matmul_into(cuda.to_device(host((M, K), np.float64)),
                   cuda.to_device(host((K, N), np.float64)), ng.empty((M, N), np.float64),
                   stream=stream)
    assert [compute for _, _, compute, _ in standin.gemms()] == [68, 77, 68, 70]
    if ml_dtypes is not None:
        bf16 = ml_dtypes.bfloat16
        ng.matmul_into(to_device(host((M, K), bf16)), to_device(host((K, N), bf16)),
                       ng.empty((M, N), bf16), stream=stream)
        assert standin.gemms()[-1][2] == 68     # bfloat16 in float32, TF32 or not
    # Reductions in float32 for float16 too.
    assert {entry[2] for entry in standin.log if entry[0] == "math"} == {16}


def test_one_handle_per_thread_set_to_each_stream_with_its_workspace(standin, stream,
                                                                    other_stream):
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    out = ng.empty((M, N), np.float32)
    ng.matmul_into(a, b, out, stream=stream)
    ng.matmul_into(a, b, out, stream=stream)
    ng.matmul_into(a, b, out, stream=other_stream)
    made = [entry for entry in standin.log if entry[0] == "create"]
    assert len(made) == 2                         # this thread's, and a spare
    settings = [entry for entry in standin.log if entry[0] in ("stream", "workspace")]
    # Set once per change of stream, the workspace after the stream (which
    # resets it), a workspace of each stream's own.
    assert [entry[0] for entry in settings] == ["stream", "workspace"] * 2
    assert settings[0][2] != settings[2][2] and settings[1][2] != settings[3][2]

    handles = []

    def other_thread():
        ng.matmul_into(a, b, ng.empty((M, N), np.float32), stream=cuda.stream())
        handles.append(standin.gemms()[-1][1])

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    mine = standin.gemms()[0][1]
    assert handles and handles[0] != mine         # the spare, not this thread's


def test_a_remembered_call_repeats_the_cublas_call(standin, stream):
    b = host((K, N), seed=2)
    a_dev, b_dev = cuda.to_device(host((M, K))), cuda.to_device(b)
    out = ng.empty((M, N), np.float32)
    for step in range(4):
        a = host((M, K), seed=40 + step)
        a_dev.copy_to_device(a, stream=stream)
        ng.matmul_into(a_dev, b_dev, out, stream=stream)
        np.testing.assert_allclose(out.copy_to_host(stream=stream), want(a, b),
                                   **close(np.float32))
    assert len(standin.gemms()) == 4
    assert any(id(a_dev) in key for key in _launch._seen.remembered)


def test_a_capture_gives_its_graph_a_workspace_of_its_own_and_keeps_it(standin, stream):
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    out = ng.empty((M, N), np.float32)
    assert ng.prepare_matmul(stream=stream) == "cublas"
    spare = _blas._spare_workspaces[0][-1]
    eager = _blas._eager[(_registry.key_of(active.stream_handle(stream)), 0)]
    with ng.capture(stream) as cap:
        ng.matmul_into(a, b, out, stream=stream)
        ng.matmul_into(a, b, out, stream=stream)
    used = [entry[2] for entry in standin.log if entry[0] == "workspace"]
    assert used == [spare.pointer]                # the spare, once, not the eager one
    assert spare.pointer != eager.pointer
    kept = cap.graph._res.keepalive
    assert spare in kept
    assert sum(type(entry) is _rebind.Fixed for entry in kept) == 2
    assert not _blas._spare_workspaces[0]         # taken; made again outside a capture
    ng.matmul_into(a, b, out, stream=stream)
    assert len(_blas._spare_workspaces[0]) == 1
    with pytest.raises(ng.RebindError, match="cuBLAS matrix product"):
        cap.graph.rebind({b: cuda.to_device(host((K, N)))})


def test_a_capture_without_a_spare_allocates_the_workspace_in_its_graph(standin, stream):
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    out = ng.empty((M, N), np.float32)
    ng.prepare_matmul(stream=stream)
    _blas._spare_workspaces[0].clear()
    with ng.capture(stream) as cap:
        ng.matmul_into(a, b, out, stream=stream)
    assert cap.graph.memory_bytes >= 8 * 2**20
    assert [(n.kind, n.action) for n in cap.graph.nodes] == [("memory", "alloc"),
                                                             ("memory", "free")]


def test_a_conditional_body_without_a_workspace_records_the_numba_kernel(standin, stream):
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    out = ng.empty((M, N), np.float32)
    ng.set_matmul_backend("numba")
    ng.matmul_into(a, b, out, stream=stream)       # compiled beforehand
    ng.set_matmul_backend("auto")
    ng.prepare_matmul(stream=stream)
    _blas._spare_workspaces[0].clear()
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=stream)
    with pytest.warns(ng.CaptureWarning, match="conditional|while"):
        with ng.capture(stream) as cap:
            with ng.repeat(pos, until=2):
                ng.matmul_into(a, b, out, stream=stream)
    (loop,) = [n for n in cap.graph.nodes if n.kind == "conditional"]
    assert "matmul_tiles" in [n.name for n in loop.body if n.kind == "kernel"]
    assert not standin.gemms()


def test_a_thread_s_first_call_inside_a_capture_warns_or_refuses(standin):
    a, b = cuda.to_device(host((M, K))), cuda.to_device(host((K, N)))
    ng.set_matmul_backend("numba")
    ng.matmul_into(a, b, ng.empty((M, N), np.float32), stream=cuda.stream())
    ng.set_matmul_backend("auto")
    s = cuda.stream()
    out = ng.empty((M, N), np.float32)
    with pytest.warns(ng.CaptureWarning, match="no cuBLAS handle.*prepare_matmul"):
        with ng.capture(s) as cap:
            ng.matmul_into(a, b, out, stream=s)
    assert [n.name for n in cap.graph.nodes] == ["matmul_tiles"]
    ng.set_matmul_backend("cublas")
    with ng.capture(s) as cap:
        with pytest.raises(ng.OpError, match="no cuBLAS handle.*Nothing was launched"):
            ng.matmul_into(a, b, out, stream=s)
        ng.fill_into(out, 1.0, stream=s)           # the capture goes on
    assert not standin.gemms()
    with pytest.raises(ng.OpError, match="before the capture begins"):
        with ng.capture(s):
            ng.prepare_matmul(stream=s)
    assert ng.prepare_matmul(stream=s) == "cublas"
    with ng.capture(s) as cap:
        ng.matmul_into(a, b, out, stream=s)
    assert len(standin.gemms()) == 1


# ---------------------------------------------------------------- bfloat16

@pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 needs ml_dtypes")
def test_bfloat16_products_agree_on_both_paths(stream):
    bf16 = ml_dtypes.bfloat16
    a, b = host((33, 70), bf16, seed=11), host((70, 20), bf16, seed=12)
    a_dev, b_dev = to_device(a), to_device(b)
    results = []
    for choice in ("auto", "numba"):
        ng.set_matmul_backend(choice)
        out = ng.empty((33, 20), bf16)
        ng.matmul_into(a_dev, b_dev, out, stream=stream)
        got = to_host(out, stream)
        assert got.dtype == np.dtype(bf16)
        np.testing.assert_allclose(got.astype(np.float64), want(a, b), **close(bf16))
        results.append(got.astype(np.float32))
    # Both sum in float32 and round once: they differ by at most one bfloat16 step.
    np.testing.assert_allclose(results[0], results[1], rtol=2 ** -7, atol=1e-6)


@pytest.mark.driver_only(reason="cuBLAS kernels run on the CUDA driver only")
@pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 needs ml_dtypes")
def test_a_captured_bfloat16_cublas_product_replays_on_new_inputs(cublas):
    bf16 = ml_dtypes.bfloat16
    b = host((256, 128), bf16, seed=2)
    a_dev, b_dev = to_device(host((64, 256), bf16)), to_device(b)
    out = ng.empty((64, 128), bf16)
    ng.matmul_into(a_dev, b_dev, out, stream=cublas)
    with ng.capture(cublas) as cap:
        ng.matmul_into(a_dev, b_dev, out, stream=cublas)
    assert {n.name for n in cap.graph.nodes if n.kind == "kernel"} == {None}
    for step in range(3):
        a = host((64, 256), bf16, seed=30 + step)
        a_dev.view(np.uint16).copy_to_device(a.view(np.uint16), stream=cublas)
        cap.graph.launch()
        np.testing.assert_allclose(to_host(out, cublas).astype(np.float64),
                                   want(a, b), **close(bf16))


@pytest.mark.driver_only(reason="PyTorch tensors live on the CUDA driver")
@pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 needs ml_dtypes")
def test_pytorch_bfloat16_tensors_are_read_through_dlpack(stream):
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand((48, 64), device="cuda", generator=gen, dtype=torch.float32)
    b = torch.rand((96, 64), device="cuda", generator=gen, dtype=torch.float32)
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    out = torch.empty((48, 96), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    ng.matmul_into(a16, b16.T, out, stream=stream)     # b16.T: a view, read in place
    stream.synchronize()
    expected = a16.float() @ b16.float().T
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=3e-2)
    x, y = a16[:, 0].contiguous(), torch.empty(96, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    ng.matvec_into(b16[:, :48].contiguous(), x, y, stream=stream)
    stream.synchronize()
    torch.testing.assert_close(y.float(), b16[:, :48].float() @ x.float(), rtol=1e-2,
                               atol=3e-2)
